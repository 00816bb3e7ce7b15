// FP8 / FP4 dequantization (io/quant.h) against torch: decode tables over every code, encoders
// over tie / saturation vectors, the raw kernels on all codes under extreme scales, fast vs scalar
// reference bit for bit, checkpoints in the V3 and V4 layouts (fixtures made by
// tests/data/quant/make_fixtures.py with the reference quantization; expected values are torch's
// own dequantization of the same bytes), the C++ quantizers byte-equal to the fixtures, every
// metadata mismatch as a UserError naming file, tensor, expected and actual, and GB/s.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "tests/unit/test_util.h"
#include "core/parallel.h"
#include "core/timer.h"
#include "io/quant.h"

namespace fs = std::filesystem;
using namespace trex;
using namespace trex::io;

namespace {

fs::path fixture_dir() { return test::data_dir("quant", "codes.safetensors"); }
std::string fixture(const std::string& name) { return (fixture_dir() / name).string(); }

using test::TmpDir;

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }

// Bitwise equality. Unless nan_bits, two NaNs count as equal: when both factors of a product are
// NaN, which payload survives depends on the operand order the compiler picked.
void expect_same(const float* a, const float* b, int64_t n, const std::string& what,
                 bool nan_bits = false) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool same =
        bits(a[i]) == bits(b[i]) || (!nan_bits && std::isnan(a[i]) && std::isnan(b[i]));
    if (!same && bad++ < 5)
      ADD_FAILURE() << what << " [" << i << "]: got " << a[i] << " (0x" << std::hex << bits(a[i])
                    << ") expected " << b[i] << " (0x" << bits(b[i]) << std::dec << ")";
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << n << " differ";
}

template <class T>
std::vector<T> read_raw(const SafetensorsFile& f, const std::string& name) {
  const TensorInfo* t = f.find(name);
  EXPECT_TRUE(t) << name;
  if (!t) return {};
  std::vector<T> v(t->nbytes / sizeof(T));
  std::memcpy(v.data(), f.data(*t), t->nbytes);
  return v;
}
Shape shape_of(const SafetensorsFile& f, const std::string& name) { return f.find(name)->shape; }

nlohmann::json read_json(const std::string& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

// Runs fn and returns the UserError message ("" and a failure if none was thrown).
template <class F>
std::string user_error(F&& fn) {
  try {
    fn();
  } catch (const UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a UserError";
  return "";
}

// ---------------------------------------------------------------------------------------------

TEST(QuantCodec, DecodeTablesMatchTorch) {
  auto f = SafetensorsFile::open(fixture("codes.safetensors"));
  auto e4 = read_raw<float>(f, "e4m3_decode"), e8 = read_raw<float>(f, "e8m0_decode");
  auto e2 = read_raw<float>(f, "e2m1_decode");
  ASSERT_EQ(e4.size(), 256u);
  ASSERT_EQ(e8.size(), 256u);
  ASSERT_EQ(e2.size(), 16u);
  for (int c = 0; c < 256; ++c) {
    EXPECT_EQ(bits(e4m3_to_f32(static_cast<uint8_t>(c))), bits(e4[c])) << "e4m3 code " << c;
    EXPECT_EQ(bits(ue8m0_to_f32(static_cast<uint8_t>(c))), bits(e8[c])) << "e8m0 code " << c;
  }
  for (int c = 0; c < 16; ++c)
    EXPECT_EQ(bits(e2m1_to_f32(static_cast<uint8_t>(c))), bits(e2[c])) << "e2m1 code " << c;
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.f, -9));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7f)) && std::isnan(e4m3_to_f32(0xff)));
  EXPECT_EQ(e2m1_to_f32(0x7), 6.f);
  EXPECT_EQ(ue8m0_to_f32(0), std::ldexp(1.f, -127));
}

TEST(QuantCodec, EncodersMatchTorchAndRoundTrip) {
  auto f = SafetensorsFile::open(fixture("codes.safetensors"));
  auto in = read_raw<float>(f, "e4m3_encode_in");
  auto out = read_raw<uint8_t>(f, "e4m3_encode_out");
  ASSERT_EQ(in.size(), out.size());
  ASSERT_GT(in.size(), 1000u);
  for (size_t i = 0; i < in.size(); ++i)
    EXPECT_EQ(f32_to_e4m3(in[i]), out[i])
        << "e4m3 encode of " << in[i] << " (0x" << std::hex << bits(in[i]) << ")";
  auto in2 = read_raw<float>(f, "e2m1_encode_in");
  auto out2 = read_raw<uint8_t>(f, "e2m1_encode_out");
  ASSERT_EQ(in2.size(), out2.size());
  for (size_t i = 0; i < in2.size(); ++i) EXPECT_EQ(f32_to_e2m1(in2[i]), out2[i]) << in2[i];
  for (int c = 0; c < 256; ++c)
    if ((c & 0x7f) != 0x7f) {
      EXPECT_EQ(f32_to_e4m3(e4m3_to_f32(static_cast<uint8_t>(c))), c);
    }
  for (int c = 0; c < 16; ++c) EXPECT_EQ(f32_to_e2m1(e2m1_to_f32(static_cast<uint8_t>(c))), c);
  EXPECT_EQ(f32_to_e4m3(std::nanf("")) & 0x7f, 0x7f);
}

// All 256 e4m3 codes / fp4 bytes under extreme scales (NaN, 2^-127, overflow to inf, negative
// and zero F32 scales), small blocks so every scale is used; fast path and reference.
TEST(QuantDequant, AllCodesUnderExtremeScalesMatchTorch) {
  auto f = SafetensorsFile::open(fixture("codes.safetensors"));
  auto w = read_raw<uint8_t>(f, "special_fp8_w");
  auto s = read_raw<float>(f, "special_fp8_s");
  auto e8 = read_raw<uint8_t>(f, "special_fp8_e8");
  const Shape ws{16, 16}, ss{4, 2};
  const Fp8Block blk{4, 8};
  std::vector<float> ref_out(256);
  auto want = read_raw<float>(f, "special_fp8_out");
  // No NaN scale here, so even the NaN payloads (0x7ff00000 | sign, torch's) must match.
  expect_same(dequant_fp8_block(w.data(), ws, s.data(), ss, blk).data(), want.data(), 256,
              "fp8 f32-scale", true);
  ref::dequant_fp8_block(w.data(), ws, s.data(), ss, blk, ref_out.data());
  expect_same(ref_out.data(), want.data(), 256, "ref fp8 f32-scale", true);
  want = read_raw<float>(f, "special_fp8_e8_out");
  expect_same(dequant_fp8_block(w.data(), ws, e8.data(), ss, blk).data(), want.data(), 256,
              "fp8 ue8m0");
  ref::dequant_fp8_block(w.data(), ws, e8.data(), ss, blk, ref_out.data());
  expect_same(ref_out.data(), want.data(), 256, "ref fp8 ue8m0");

  auto p = read_raw<uint8_t>(f, "special_fp4_w");
  auto e4 = read_raw<uint8_t>(f, "special_fp4_e8");
  want = read_raw<float>(f, "special_fp4_out");
  const Shape logical{4, 128}, s4{4, 4};
  ASSERT_EQ(want.size(), 512u);
  expect_same(dequant_fp4_e2m1(p.data(), logical, e4.data(), s4).data(), want.data(), 512, "fp4");
  ref_out.resize(512);
  ref::dequant_fp4_e2m1(p.data(), logical, e4.data(), s4, 32, ref_out.data());
  expect_same(ref_out.data(), want.data(), 512, "ref fp4");
}

// The dispatched (AVX-512 when present, threaded) kernels equal the scalar reference bit for bit
// on random bytes, odd shapes, batch dims, and block sizes that do and do not divide the dims.
TEST(QuantDequant, FastEqualsReference) {
  std::mt19937 rng(7);
  auto bytes = [&](int64_t n) {
    std::vector<uint8_t> v(static_cast<size_t>(n));
    for (auto& b : v) b = static_cast<uint8_t>(rng());
    return v;
  };
  const std::vector<Shape> shapes = {{1, 1},      {3, 37},     {129, 1000},
                                     {2, 5, 300}, {256, 4096}, {7, 17}};
  const std::vector<Fp8Block> blocks = {{128, 128}, {1, 7}, {3, 16}, {128, 33}, {1000, 1000}};
  for (const Shape& ws : shapes)
    for (Fp8Block b : blocks) {
      const Shape ss = fp8_scale_shape(ws, b);
      auto w = bytes(ws.numel()), e8 = bytes(ss.numel());
      std::vector<float> sf(static_cast<size_t>(ss.numel()));
      for (auto& x : sf)
        x = std::ldexp(static_cast<float>(rng() % 1000) / 7.f, static_cast<int>(rng() % 40) - 20);
      std::vector<float> got(static_cast<size_t>(ws.numel())), want(got.size());
      const std::string tag =
          ws.str() + " block " + std::to_string(b.rows) + "x" + std::to_string(b.cols);
      dequant_fp8_block(w.data(), ws, sf.data(), ss, b, got.data());
      ref::dequant_fp8_block(w.data(), ws, sf.data(), ss, b, want.data());
      expect_same(got.data(), want.data(), ws.numel(), "fp8 f32 " + tag);
      dequant_fp8_block(w.data(), ws, e8.data(), ss, b, got.data());
      ref::dequant_fp8_block(w.data(), ws, e8.data(), ss, b, want.data());
      expect_same(got.data(), want.data(), ws.numel(), "fp8 ue8m0 " + tag);
    }
  const std::vector<Shape> lshapes = {{1, 2}, {3, 38}, {65, 96}, {2, 3, 330}, {64, 7168}, {5, 64}};
  for (const Shape& ls : lshapes)
    for (int64_t block : {32, 64, 16, 6, 128}) {
      const Shape ss = fp4_scale_shape(ls, block);
      auto w = bytes(fp4_packed_shape(ls).numel()), e8 = bytes(ss.numel());
      std::vector<float> got(static_cast<size_t>(ls.numel())), want(got.size());
      dequant_fp4_e2m1(w.data(), ls, e8.data(), ss, block, got.data());
      ref::dequant_fp4_e2m1(w.data(), ls, e8.data(), ss, block, want.data());
      expect_same(got.data(), want.data(), ls.numel(),
                  "fp4 " + ls.str() + " block " + std::to_string(block));
    }
}

TEST(QuantDequant, RawShapeChecks) {
  std::vector<uint8_t> w(150 * 140);
  std::vector<float> s(4), out(w.size());
  // Truncated scale grid: [1, 2] where [2, 2] is needed.
  EXPECT_THROW(dequant_fp8_block(w.data(), Shape{150, 140}, s.data(), Shape{1, 2}, {}, out.data()),
               Error);
  EXPECT_THROW(dequant_fp8_block(w.data(), Shape{150, 140}, s.data(), Shape{4}, {}, out.data()),
               Error);
  EXPECT_THROW(dequant_fp8_block(w.data(), Shape{140}, s.data(), Shape{2}, {}, out.data()), Error);
  std::vector<uint8_t> e8(70 * 3);
  EXPECT_THROW(dequant_fp4_e2m1(w.data(), Shape{70, 96}, e8.data(), Shape{70, 2}, 32, out.data()),
               Error);
  EXPECT_THROW(dequant_fp4_e2m1(w.data(), Shape{70, 95}, e8.data(), Shape{70, 3}, 32, out.data()),
               Error);
}

// ---------------------------------------------------------------------------------------------
// Checkpoints

void check_against_expected(const std::string& dir, const std::string& prefix,
                            std::map<std::string, QuantFormat> formats) {
  auto sd = SafetensorsDir::open(fixture(dir));
  auto cfg =
      QuantConfig::from_hf_config(read_json(fixture(dir + "/config.json")), dir + "/config.json");
  QuantizedTensorReader rd(sd, cfg);
  auto ex = SafetensorsFile::open(fixture("expected.safetensors"));
  int n = 0;
  for (const TensorInfo& t : ex.tensors()) {
    if (t.name.rfind(prefix, 0) != 0) continue;
    const std::string name = t.name.substr(prefix.size());
    const QuantInfo q = rd.inspect(name);
    EXPECT_EQ(q.shape, t.shape) << name;
    if (formats.count(name)) {
      EXPECT_EQ(q.format, formats[name]) << name;
    }
    EXPECT_TRUE(rd.is_scale(q.scale)) << q.scale;
    auto want = read_raw<float>(ex, t.name);
    expect_same(rd.read_f32(name).data(), want.data(), t.shape.numel(), dir + ":" + name);
    ++n;
  }
  EXPECT_GE(n, 3);
  for (const std::string& w : rd.weight_names()) EXPECT_FALSE(rd.is_scale(w)) << w;
}

TEST(QuantCheckpoint, V3LayoutMatchesTorch) {
  check_against_expected(
      "v3", "v3/",
      {{"model.layers.0.mlp.down_proj.weight", QuantFormat::Fp8F32Scale},
       {"model.layers.1.mlp.experts.down_proj.weight", QuantFormat::Fp8F32Scale}});
  auto sd = SafetensorsDir::open(fixture("v3"));
  QuantizedTensorReader rd(sd);
  EXPECT_EQ(rd.inspect("model.norm.weight").format, QuantFormat::None);
  std::vector<float> a(140), b(140);
  rd.read_f32("model.norm.weight", a.data(), 140);
  sd.read_f32("model.norm.weight", b.data(), 140);
  expect_same(a.data(), b.data(), 140, "norm");
  EXPECT_EQ(rd.weight_names().size(), 4u);  // 3 weights + norm, no scales
}

TEST(QuantCheckpoint, V4LayoutMatchesTorch) {
  check_against_expected("v4", "v4/",
                         {{"layers.0.attn.wq_a.weight", QuantFormat::Fp8Ue8m0},
                          {"layers.0.ffn.experts.0.w1.weight", QuantFormat::Fp4Ue8m0}});
  auto sd = SafetensorsDir::open(fixture("v4"));
  QuantizedTensorReader rd(sd);
  EXPECT_EQ(rd.shape("layers.0.ffn.experts.0.w1.weight"), (Shape{70, 96}));  // I8 [70, 48] unpacked
  EXPECT_EQ(rd.inspect("layers.0.ffn.experts.0.w1.weight").scale,
            "layers.0.ffn.experts.0.w1.scale");
  // An integer tensor is not a weight.
  std::string m = user_error([&] { rd.read_f32("layers.0.ffn.gate.tid2eid"); });
  EXPECT_NE(m.find("layers.0.ffn.gate.tid2eid"), std::string::npos) << m;
  EXPECT_NE(m.find("not a float weight"), std::string::npos) << m;
}

// The release dtypes (F8_E8M0 scales, an F4 expert) once io/safetensors knows them.
TEST(QuantCheckpoint, V4ReleaseDtypes) {
  DType t;
  if (!parse_dtype("F8_E8M0", &t) || !parse_dtype("F4", &t))
    GTEST_SKIP() << "io/safetensors does not parse F8_E8M0 / F4 yet (see docs/QUANT.md)";
  check_against_expected("v4_e8m0", "v4/",
                         {{"layers.0.attn.wq_a.weight", QuantFormat::Fp8Ue8m0},
                          {"layers.0.ffn.experts.0.w2.weight", QuantFormat::Fp4Ue8m0}});
}

// The C++ quantizers reproduce the fixtures (made by the Python port of the references) byte
// for byte, and quantize_weight's tensors round-trip through a written checkpoint.
TEST(QuantQuantize, MatchesReferenceFixtures) {
  auto in = SafetensorsFile::open(fixture("inputs.safetensors"));
  auto v3 = SafetensorsFile::open(fixture("v3/model.safetensors"));
  auto v4 = SafetensorsFile::open(fixture("v4/model.safetensors"));
  for (auto [key, name] : std::vector<std::pair<std::string, std::string>>{
           {"fp8_a", "model.layers.0.mlp.down_proj.weight"},
           {"fp8_b", "model.layers.0.self_attn.kv_b_proj.weight"},
           {"fp8_c", "model.layers.1.mlp.experts.down_proj.weight"}}) {
    auto x = read_raw<float>(in, key);
    const Shape sh = shape_of(in, key), ss = fp8_scale_shape(sh);
    std::vector<uint8_t> w(x.size());
    std::vector<float> s(static_cast<size_t>(ss.numel()));
    quantize_fp8_block(x.data(), sh, {}, w.data(), s.data());
    EXPECT_EQ(w, read_raw<uint8_t>(v3, name)) << name;
    auto want = read_raw<float>(v3, name + "_scale_inv");
    expect_same(s.data(), want.data(), ss.numel(), name + " scale_inv");
  }
  for (auto [key, prefix] : std::vector<std::pair<std::string, std::string>>{
           {"fp8_a", "layers.0.attn.wq_a"}, {"fp8_b", "layers.0.attn.wkv"}}) {
    auto x = read_raw<float>(in, key);
    const Shape sh = shape_of(in, key);
    std::vector<uint8_t> w(x.size()), e8(static_cast<size_t>(fp8_scale_shape(sh).numel()));
    quantize_fp8_block_ue8m0(x.data(), sh, {}, w.data(), e8.data());
    EXPECT_EQ(w, read_raw<uint8_t>(v4, prefix + ".weight")) << prefix;
    EXPECT_EQ(e8, read_raw<uint8_t>(v4, prefix + ".scale")) << prefix;
  }
  for (auto [key, prefix] : std::vector<std::pair<std::string, std::string>>{
           {"fp4_a", "layers.0.ffn.experts.0.w1"}, {"fp4_b", "layers.0.ffn.experts.0.w2"}}) {
    auto x = read_raw<float>(in, key);
    const Shape sh = shape_of(in, key);
    std::vector<uint8_t> w(x.size() / 2), e8(static_cast<size_t>(fp4_scale_shape(sh).numel()));
    quantize_fp4_e2m1(x.data(), sh, kFp4Block, w.data(), e8.data());
    EXPECT_EQ(w, read_raw<uint8_t>(v4, prefix + ".weight")) << prefix;
    EXPECT_EQ(e8, read_raw<uint8_t>(v4, prefix + ".scale")) << prefix;
  }
  // quantize_weight -> write -> QuantizedTensorReader gives the raw dequantization.
  TmpDir tmp;
  auto x = read_raw<float>(in, "fp4_a");
  const Shape sh = shape_of(in, "fp4_a");
  std::vector<QuantizedTensor> all;
  for (auto scheme : {QuantScheme::Fp8V3, QuantScheme::Fp8V4, QuantScheme::Fp4V4}) {
    const std::string name = "s" + std::to_string(static_cast<int>(scheme)) + ".weight";
    for (auto& t : quantize_weight(name, x.data(), sh, scheme)) all.push_back(std::move(t));
  }
  std::vector<TensorToWrite> tw;
  for (auto& t : all) tw.push_back(t.to_write());
  write_safetensors_dir(tmp.path.string(), tw);
  auto sd = SafetensorsDir::open(tmp.path.string());
  QuantizedTensorReader rd(sd);
  EXPECT_EQ(all[1].name, "s0.weight_scale_inv");
  EXPECT_EQ(all[3].name, "s1.scale");
  EXPECT_EQ(rd.inspect("s0.weight").format, QuantFormat::Fp8F32Scale);
  EXPECT_EQ(rd.inspect("s1.weight").format, QuantFormat::Fp8Ue8m0);
  EXPECT_EQ(rd.inspect("s2.weight").format, QuantFormat::Fp4Ue8m0);
  for (int i = 0; i < 3; ++i) {
    auto got = rd.read_f32("s" + std::to_string(i) + ".weight");
    double err = 0, ref = 0;
    for (size_t k = 0; k < x.size(); ++k)
      err += std::pow(got[k] - x[k], 2), ref += std::pow(x[k], 2);
    EXPECT_LT(err / ref, i < 2 ? 2e-3 : 2e-2) << "quantization error of scheme " << i;
  }
}

// ---------------------------------------------------------------------------------------------
// Errors: each names the file, the tensor, and the expected and actual shape / dtype.

struct Ckpt {
  TmpDir tmp;
  std::vector<std::vector<uint8_t>> store;
  std::vector<TensorToWrite> t;
  void add(const std::string& name, DType d, Shape s) {
    store.emplace_back(static_cast<size_t>(s.numel()) * dtype_size(d), uint8_t{0x38});
    t.push_back({name, d, s, store.back().data()});
  }
  std::string write() {
    for (size_t i = 0; i < t.size(); ++i) t[i].data = store[i].data();
    write_safetensors_dir(tmp.path.string(), t);
    return (tmp.path / "model.safetensors").string();
  }
};

std::string read_error(Ckpt& c, const std::string& name, QuantConfig cfg = {}) {
  c.write();
  auto sd = SafetensorsDir::open(c.tmp.path.string());
  QuantizedTensorReader rd(sd, cfg);
  return user_error([&] { rd.read_f32(name); });
}

void expect_has(const std::string& msg, std::initializer_list<std::string> parts) {
  for (const auto& p : parts)
    EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

TEST(QuantErrors, ScaleShapeMismatchAndTruncation) {
  {
    Ckpt c;
    c.add("a.weight", DType::F8_E4M3, {150, 140});
    c.add("a.weight_scale_inv", DType::F32, {2, 1});  // truncated: [2, 2] needed
    std::string m = read_error(c, "a.weight");
    expect_has(m, {"model.safetensors", "a.weight_scale_inv", "a.weight", "[2, 2]", "[2, 1]",
                   "[150, 140]"});
  }
  {
    Ckpt c;
    c.add("a.weight", DType::F8_E4M3, {150, 140});
    c.add("a.scale", DType::U8, {4, 1});  // same element count, wrong grid
    expect_has(read_error(c, "a.weight"), {"a.scale", "[2, 2]", "[4, 1]"});
  }
  {
    Ckpt c;
    c.add("e.weight", DType::I8, {70, 48});
    c.add("e.scale", DType::U8, {70, 2});  // [70, 3] for 96 unpacked columns
    expect_has(read_error(c, "e.weight"),
               {"e.scale", "e.weight", "[70, 3]", "[70, 2]", "[70, 96]"});
  }
  {
    Ckpt c;  // the block size the config declares does not match the scale grid
    c.add("a.weight", DType::F8_E4M3, {150, 140});
    c.add("a.weight_scale_inv", DType::F32, {2, 2});
    QuantConfig cfg;
    cfg.fp8_block = {64, 64};
    expect_has(read_error(c, "a.weight", cfg), {"[3, 3]", "[2, 2]", "64x64"});
  }
}

TEST(QuantErrors, MetadataMismatches) {
  {
    Ckpt c;
    c.add("a.weight", DType::F8_E4M3, {8, 8});
    expect_has(read_error(c, "a.weight"),
               {"a.weight", "no scale tensor", "a.weight_scale_inv", "a.scale"});
  }
  {
    Ckpt c;
    c.add("a.weight", DType::BF16, {8, 8});
    c.add("a.scale", DType::U8, {1, 1});
    expect_has(read_error(c, "a.weight"), {"a.weight", "not quantized", "a.scale"});
  }
  {
    Ckpt c;
    c.add("a.weight", DType::F8_E4M3, {8, 8});
    c.add("a.scale", DType::U8, {1, 1});
    c.add("a.weight_scale_inv", DType::F32, {1, 1});
    expect_has(read_error(c, "a.weight"), {"two scale tensors"});
  }
  {
    Ckpt c;
    c.add("a.weight", DType::F8_E4M3, {8, 8});
    c.add("a.weight_scale_inv", DType::BF16, {1, 1});
    expect_has(read_error(c, "a.weight"), {"a.weight_scale_inv", "BF16", "F32"});
  }
  {
    Ckpt c;
    c.add("e.weight", DType::I8, {4, 16});
    c.add("e.scale", DType::F32, {4, 1});
    expect_has(read_error(c, "e.weight"), {"e.scale", "F32", "ue8m0"});
  }
  {
    Ckpt c;
    c.add("a.weight", DType::F8_E5M2, {8, 8});
    c.add("a.weight_scale_inv", DType::F32, {1, 1});
    expect_has(read_error(c, "a.weight"), {"F8_E5M2"});
  }
  {
    Ckpt c;
    c.add("a.weight", DType::F8_E4M3, {150, 140});
    c.add("a.weight_scale_inv", DType::F32, {2, 2});
    c.write();
    auto sd = SafetensorsDir::open(c.tmp.path.string());
    QuantizedTensorReader rd(sd);
    std::vector<float> out(100);
    expect_has(user_error([&] { rd.read_f32("a.weight", out.data(), 100); }),
               {"a.weight", "21000", "100"});
    expect_has(user_error([&] { rd.read_f32("nope.weight"); }), {"nope.weight"});
    EXPECT_TRUE(rd.is_scale("a.weight_scale_inv"));
    EXPECT_FALSE(rd.is_scale("a.weight"));
  }
}

TEST(QuantErrors, HfConfig) {
  using nlohmann::json;
  QuantConfig c = QuantConfig::from_hf_config(read_json(fixture("v4/config.json")), "config.json");
  EXPECT_EQ(c.fp8_block.rows, 128);
  c = QuantConfig::from_hf_config(
      json{{"quantization_config", {{"quant_method", "fp8"}, {"weight_block_size", {64, 32}}}}},
      "c");
  EXPECT_EQ(c.fp8_block.rows, 64);
  EXPECT_EQ(c.fp8_block.cols, 32);
  c = QuantConfig::from_hf_config(json{{"hidden_size", 8}}, "c");
  EXPECT_EQ(c.fp8_block.cols, 128);
  auto bad = [](json q) {
    return user_error([&] {
      QuantConfig::from_hf_config(json{{"quantization_config", q}}, "cfg.json");
    });
  };
  expect_has(bad({{"quant_method", "awq"}}), {"cfg.json", "quant_method", "awq"});
  expect_has(bad({{"quant_method", "fp8"}, {"fmt", "e5m2"}}), {"fmt", "e5m2"});
  expect_has(bad({{"scale_fmt", "e4m3"}}), {"scale_fmt"});
  expect_has(bad({{"weight_block_size", {128}}}), {"weight_block_size", "[128]"});
  expect_has(bad({{"weight_block_size", {0, 128}}}), {"weight_block_size"});
}

TEST(QuantErrors, QuantizerRejectsNonFinite) {
  std::vector<float> x(64, 1.f);
  x[17] = std::nanf("");
  std::vector<uint8_t> w(64), e8(2);
  std::vector<float> s(1);
  EXPECT_THROW(quantize_fp8_block(x.data(), Shape{8, 8}, {}, w.data(), s.data()), UserError);
  EXPECT_THROW(quantize_fp4_e2m1(x.data(), Shape{1, 64}, 32, w.data(), e8.data()), UserError);
  EXPECT_THROW(quantize_weight("x", x.data(), Shape{8, 8}, QuantScheme::Fp8V4),
               UserError);  // no ".weight"
}

// ---------------------------------------------------------------------------------------------

TEST(QuantPerf, GBps) {
  const Shape ws{2048, 7168};
  const int64_t n = ws.numel();
  std::mt19937 rng(1);
  std::vector<uint8_t> w(static_cast<size_t>(n));
  for (auto& b : w) b = static_cast<uint8_t>(rng() & 0x77);  // finite codes
  const Shape ss = fp8_scale_shape(ws), s4 = fp4_scale_shape(ws);
  std::vector<uint8_t> e8(static_cast<size_t>(std::max(ss.numel(), s4.numel())), 120);
  std::vector<float> sf(static_cast<size_t>(ss.numel()), 0.01f), out(static_cast<size_t>(n));
  // Mean over a ~150 ms window after one warm-up call (the VM clock can be coarse).
  auto best = [&](auto fn) {
    fn();
    const double t0 = now_ms();
    int k = 0;
    do {
      fn();
      ++k;
    } while (now_ms() - t0 < 150);
    return (now_ms() - t0) / k;
  };
  auto report = [&](const char* what, double ms, double in_bytes) {
    const double gb = (in_bytes + 4.0 * n) / 1e9;
    std::printf("[ perf ] %-30s %7.2f ms  %6.2f GB/s (in+out)  %6.2f Gelem/s  threads=%d\n", what,
                ms, gb / (ms / 1e3), n / (ms / 1e3) / 1e9, num_threads());
  };
  report("fp8 f32-scale fast",
         best([&] { dequant_fp8_block(w.data(), ws, sf.data(), ss, {}, out.data()); }), n);
  report("fp8 ue8m0 fast",
         best([&] { dequant_fp8_block(w.data(), ws, e8.data(), ss, {}, out.data()); }), n);
  report("fp8 ue8m0 ref (1 thread)",
         best([&] { ref::dequant_fp8_block(w.data(), ws, e8.data(), ss, {}, out.data()); }), n);
  report("fp4 ue8m0 fast",
         best([&] { dequant_fp4_e2m1(w.data(), ws, e8.data(), s4, 32, out.data()); }), n / 2.0);
  report("fp4 ue8m0 ref (1 thread)",
         best([&] { ref::dequant_fp4_e2m1(w.data(), ws, e8.data(), s4, 32, out.data()); }),
         n / 2.0);
  std::vector<float> src(static_cast<size_t>(n), 1.f);
  report("parallel memcpy f32 (baseline)", best([&] {
           parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) {
             std::memcpy(out.data() + b, src.data() + b, static_cast<size_t>(e - b) * 4);
           });
         }),
         4.0 * n);
}

}  // namespace
