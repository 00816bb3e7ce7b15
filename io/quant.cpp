// FP8 / FP4 block dequantization and quantization; checkpoint detection. See io/quant.h and
// docs/QUANT.md for the formats and the reference code each function follows.
#include "io/quant.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/cpu.h"
#include "core/error.h"
#include "core/parallel.h"
#include "kernels/cpu/dequant_avx512.h"

namespace trex::io {
namespace {

float from_bits(uint32_t u) { return std::bit_cast<float>(u); }
uint32_t to_bits(float f) { return std::bit_cast<uint32_t>(f); }

const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> a{};
    for (int b = 0; b < 256; ++b) {
      const int e = (b >> 3) & 0xf, m = b & 7;
      float v;
      if (e == 15 && m == 7)
        v = from_bits(0x7ff00000u);  // NaN (torch's bits)
      else if (e == 0)
        v = std::ldexp(static_cast<float>(m), -9);  // subnormal m * 2^-9
      else
        v = std::ldexp(1.f + static_cast<float>(m) / 8.f, e - 7);  // normal, bias 7
      a[b] = (b & 0x80) ? from_bits(to_bits(v) | 0x80000000u) : v;
    }
    return a;
  }();
  return t;
}

constexpr float kE2m1[16] = {0.f,  0.5f,  1.f,  1.5f,  2.f,  3.f,  4.f,  6.f,
                             -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

// Leading (batch) dims folded: [B, R, C].
struct Dims3 {
  int64_t B = 1, R = 0, C = 0;
};
Dims3 dims3(const Shape& s) {
  Dims3 d;
  for (int i = 0; i + 2 < s.ndim; ++i) d.B *= s.d[i];
  d.R = s.d[s.ndim - 2];
  d.C = s.d[s.ndim - 1];
  return d;
}

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

void check_dims(const Shape& s, const char* what) {
  TREX_CHECK(s.ndim >= 2 && s.ndim <= kMaxDims, what, ": weight needs >= 2 dims, got ", s.str());
  for (int i = 0; i < s.ndim; ++i) TREX_CHECK(s.d[i] >= 0, what, ": negative dim in ", s.str());
}

void check_fp8(const Shape& w, const Shape& s, Fp8Block b, const char* what) {
  check_dims(w, what);
  TREX_CHECK(b.rows > 0 && b.cols > 0, what, ": block ", b.rows, "x", b.cols);
  TREX_CHECK(s == fp8_scale_shape(w, b), what, ": scale shape ", s.str(), " does not match weight ",
             w.str(), " with ", b.rows, "x", b.cols, " blocks (expected ",
             fp8_scale_shape(w, b).str(), ")");
}

void check_fp4(const Shape& logical, const Shape& s, int64_t block, const char* what) {
  check_dims(logical, what);
  TREX_CHECK(block > 0, what, ": block ", block);
  TREX_CHECK(logical.d[logical.ndim - 1] % 2 == 0, what,
             ": packed FP4 needs an even last dim, got ", logical.str());
  TREX_CHECK(s == fp4_scale_shape(logical, block), what, ": scale shape ", s.str(),
             " does not match weight ", logical.str(), " with blocks of ", block, " (expected ",
             fp4_scale_shape(logical, block).str(), ")");
}

// Rows of ~64K elements per task at least.
int64_t row_grain(int64_t C) {
  return std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(C, 1));
}

// ---- row kernels (scalar reference) ----
void e4m3_row_ref(const uint8_t* w, int64_t n, const float* s, int64_t block, float* out) {
  const auto& t = e4m3_table();
  for (int64_t j = 0; j < n; ++j) out[j] = t[w[j]] * s[j / block];
}
void e2m1_row_ref(const uint8_t* w, int64_t n, const float* s, int64_t block, float* out) {
  for (int64_t j = 0; j < n; ++j) out[j] = kE2m1[(w[j / 2] >> (4 * (j & 1))) & 0xf] * s[j / block];
}
using RowFn = void (*)(const uint8_t*, int64_t, const float*, int64_t, float*);

// Scale rows come as f32 (used in place) or ue8m0 bytes (decoded per row into a task buffer).
struct ScaleRows {
  const float* f32 = nullptr;
  const uint8_t* e8 = nullptr;
  int64_t cols = 0;
  const float* row(int64_t r, std::vector<float>& buf) const {
    if (f32) return f32 + r * cols;
    buf.resize(static_cast<size_t>(cols));
    for (int64_t j = 0; j < cols; ++j) buf[j] = ue8m0_to_f32(e8[r * cols + j]);
    return buf.data();
  }
};

void run_fp8(const uint8_t* w, const Shape& wshape, ScaleRows sc, Fp8Block b, float* out, RowFn fn,
             bool threaded) {
  const Dims3 d = dims3(wshape);
  const int64_t SR = cdiv(d.R, b.rows);
  auto body = [&](int64_t g0, int64_t g1) {
    std::vector<float> buf;
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t bi = g / std::max<int64_t>(d.R, 1), r = g % std::max<int64_t>(d.R, 1);
      fn(w + g * d.C, d.C, sc.row(bi * SR + r / b.rows, buf), b.cols, out + g * d.C);
    }
  };
  if (threaded)
    parallel_for(d.B * d.R, row_grain(d.C), body);
  else
    body(0, d.B * d.R);
}

void run_fp4(const uint8_t* w, const Shape& logical, const uint8_t* e8, int64_t block, float* out,
             RowFn fn, bool threaded) {
  const Dims3 d = dims3(logical);
  const ScaleRows sc{nullptr, e8, cdiv(d.C, block)};
  auto body = [&](int64_t g0, int64_t g1) {
    std::vector<float> buf;
    for (int64_t g = g0; g < g1; ++g)
      fn(w + g * (d.C / 2), d.C, sc.row(g, buf), block, out + g * d.C);
  };
  if (threaded)
    parallel_for(d.B * d.R, row_grain(d.C), body);
  else
    body(0, d.B * d.R);
}

RowFn fast_e4m3() {
  return cpu_isa() >= Isa::Avx512 ? kern::cpu::dequant_e4m3_row_avx512 : e4m3_row_ref;
}
RowFn fast_e2m1() {
  return cpu_isa() >= Isa::Avx512 ? kern::cpu::dequant_e2m1_row_avx512 : e2m1_row_ref;
}

// ---- quantizer helpers ----
// 2^ceil(log2(t)) by the reference's fast_log2_ceil / fast_pow2 bit trick; returns the exponent.
int pow2_ceil_exp(float t) {
  const uint32_t u = to_bits(t);
  return static_cast<int>((u >> 23) & 0xff) - 127 + ((u & 0x7fffffu) != 0 ? 1 : 0);
}
float pow2f(int k) { return from_bits(static_cast<uint32_t>(k + 127) << 23); }

void check_finite(const float* x, int64_t n, const char* what) {
  for (int64_t i = 0; i < n; ++i)
    TREX_USER_CHECK(std::isfinite(x[i]),
                    "the source weights contain NaN/Inf; fix them before quantizing", what,
                    ": element ", i, " is ", x[i]);
}

// FP8 block quantizer core: per (batch, block row), amax per column block, then scale(amax) and
// encode(x, scale). scale_of returns {s, stored byte or 0}.
template <class ScaleOf, class Store>
void quantize_fp8_impl(const float* x, const Shape& shape, Fp8Block b, uint8_t* w, ScaleOf scale_of,
                       Store store, const char* what) {
  check_dims(shape, what);
  TREX_CHECK(b.rows > 0 && b.cols > 0, what, ": block ", b.rows, "x", b.cols);
  check_finite(x, shape.numel(), what);
  const Dims3 d = dims3(shape);
  const int64_t SR = cdiv(d.R, b.rows), SC = cdiv(d.C, b.cols);
  parallel_dynamic(d.B * SR, [&](int64_t t) {
    const int64_t bi = t / SR, br = t % SR;
    const int64_t r0 = br * b.rows, r1 = std::min(d.R, r0 + b.rows);
    std::vector<float> amax(static_cast<size_t>(SC), 0.f), s(static_cast<size_t>(SC));
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + (bi * d.R + r) * d.C;
      for (int64_t j = 0; j < d.C; ++j)
        amax[j / b.cols] = std::max(amax[j / b.cols], std::fabs(xr[j]));
    }
    for (int64_t j = 0; j < SC; ++j) s[j] = scale_of(amax[j], (bi * SR + br) * SC + j);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t o = (bi * d.R + r) * d.C;
      for (int64_t j = 0; j < d.C; ++j) w[o + j] = store(x[o + j], s[j / b.cols]);
    }
  });
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Codecs

float e4m3_to_f32(uint8_t b) { return e4m3_table()[b]; }
float e2m1_to_f32(uint8_t nibble) { return kE2m1[nibble & 0xf]; }
float ue8m0_to_f32(uint8_t e) {
  if (e == 255) return from_bits(0x7f800001u);  // NaN, torch's bits
  if (e == 0) return from_bits(0x00400000u);    // 2^-127, an exact f32 subnormal
  return from_bits(static_cast<uint32_t>(e) << 23);
}

uint8_t f32_to_e4m3(float x) {
  const uint32_t u = to_bits(x), a = u & 0x7fffffffu;
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80);
  if (a > 0x7f800000u) return sign | 0x7f;  // NaN
  uint32_t code;
  if (a >= (121u << 23)) {  // |x| >= 2^-6: normal; round the mantissa to 3 bits, ties to even
    const uint32_t r = (a + 0x7ffffu + ((a >> 20) & 1u)) >> 20;
    code = r - (120u << 3);
    if (code > 0x7e) code = 0x7e;  // saturate to 448
  } else {  // subnormal: m * 2^-9, m = round-half-even(|x| * 512) in 0..8 (8 is 2^-6)
    code = static_cast<uint32_t>(std::nearbyint(std::fabs(x) * 512.f));
  }
  return static_cast<uint8_t>(sign | code);
}

uint8_t f32_to_e2m1(float x) {
  const float a = std::fabs(x);
  // Midpoints 0.25 0.75 1.25 1.75 2.5 3.5 5; a tie goes to the even code.
  uint8_t c = a <= 0.25f   ? 0
              : a < 0.75f  ? 1
              : a <= 1.25f ? 2
              : a < 1.75f  ? 3
              : a <= 2.5f  ? 4
              : a < 3.5f   ? 5
              : a <= 5.f   ? 6
                           : 7;
  return static_cast<uint8_t>(c | (std::signbit(x) ? 8 : 0));
}

// ---------------------------------------------------------------------------------------------
// Shapes

Shape fp8_scale_shape(const Shape& w, Fp8Block b) {
  TREX_CHECK(w.ndim >= 2 && b.rows > 0 && b.cols > 0, "fp8_scale_shape: ", w.str());
  Shape s = w;
  s.d[s.ndim - 2] = cdiv(w.d[w.ndim - 2], b.rows);
  s.d[s.ndim - 1] = cdiv(w.d[w.ndim - 1], b.cols);
  return s;
}
Shape fp4_scale_shape(const Shape& logical, int64_t block) {
  TREX_CHECK(logical.ndim >= 2 && block > 0, "fp4_scale_shape: ", logical.str());
  Shape s = logical;
  s.d[s.ndim - 1] = cdiv(logical.d[logical.ndim - 1], block);
  return s;
}
Shape fp4_packed_shape(const Shape& logical) {
  TREX_CHECK(logical.ndim >= 1 && logical.d[logical.ndim - 1] % 2 == 0,
             "fp4_packed_shape: last dim must be even, got ", logical.str());
  Shape s = logical;
  s.d[s.ndim - 1] /= 2;
  return s;
}

// ---------------------------------------------------------------------------------------------
// Dequantization

void dequant_fp8_block(const uint8_t* w, const Shape& wshape, const float* scale_inv,
                       const Shape& sshape, Fp8Block block, float* out) {
  check_fp8(wshape, sshape, block, "dequant_fp8_block");
  run_fp8(w, wshape, {scale_inv, nullptr, sshape.d[sshape.ndim - 1]}, block, out, fast_e4m3(),
          true);
}
void dequant_fp8_block(const uint8_t* w, const Shape& wshape, const uint8_t* ue8m0,
                       const Shape& sshape, Fp8Block block, float* out) {
  check_fp8(wshape, sshape, block, "dequant_fp8_block");
  run_fp8(w, wshape, {nullptr, ue8m0, sshape.d[sshape.ndim - 1]}, block, out, fast_e4m3(), true);
}
std::vector<float> dequant_fp8_block(const uint8_t* w, const Shape& wshape, const float* scale_inv,
                                     const Shape& sshape, Fp8Block block) {
  check_dims(wshape, "dequant_fp8_block");
  std::vector<float> out(static_cast<size_t>(wshape.numel()));
  dequant_fp8_block(w, wshape, scale_inv, sshape, block, out.data());
  return out;
}
std::vector<float> dequant_fp8_block(const uint8_t* w, const Shape& wshape, const uint8_t* ue8m0,
                                     const Shape& sshape, Fp8Block block) {
  check_dims(wshape, "dequant_fp8_block");
  std::vector<float> out(static_cast<size_t>(wshape.numel()));
  dequant_fp8_block(w, wshape, ue8m0, sshape, block, out.data());
  return out;
}

void dequant_fp4_e2m1(const uint8_t* w, const Shape& logical, const uint8_t* ue8m0,
                      const Shape& sshape, int64_t block, float* out) {
  check_fp4(logical, sshape, block, "dequant_fp4_e2m1");
  run_fp4(w, logical, ue8m0, block, out, fast_e2m1(), true);
}
std::vector<float> dequant_fp4_e2m1(const uint8_t* w, const Shape& logical, const uint8_t* ue8m0,
                                    const Shape& sshape, int64_t block) {
  check_dims(logical, "dequant_fp4_e2m1");
  std::vector<float> out(static_cast<size_t>(logical.numel()));
  dequant_fp4_e2m1(w, logical, ue8m0, sshape, block, out.data());
  return out;
}

namespace ref {
void dequant_fp8_block(const uint8_t* w, const Shape& wshape, const float* scale_inv,
                       const Shape& sshape, Fp8Block block, float* out) {
  check_fp8(wshape, sshape, block, "ref::dequant_fp8_block");
  run_fp8(w, wshape, {scale_inv, nullptr, sshape.d[sshape.ndim - 1]}, block, out, e4m3_row_ref,
          false);
}
void dequant_fp8_block(const uint8_t* w, const Shape& wshape, const uint8_t* ue8m0,
                       const Shape& sshape, Fp8Block block, float* out) {
  check_fp8(wshape, sshape, block, "ref::dequant_fp8_block");
  run_fp8(w, wshape, {nullptr, ue8m0, sshape.d[sshape.ndim - 1]}, block, out, e4m3_row_ref, false);
}
void dequant_fp4_e2m1(const uint8_t* w, const Shape& logical, const uint8_t* ue8m0,
                      const Shape& sshape, int64_t block, float* out) {
  check_fp4(logical, sshape, block, "ref::dequant_fp4_e2m1");
  run_fp4(w, logical, ue8m0, block, out, e2m1_row_ref, false);
}
}  // namespace ref

// ---------------------------------------------------------------------------------------------
// Quantization

void quantize_fp8_block(const float* x, const Shape& shape, Fp8Block block, uint8_t* w,
                        float* scale_inv) {
  quantize_fp8_impl(
      x, shape, block, w,
      [&](float amax, int64_t k) {
        const float s = amax == 0.f ? 1.f : amax / 448.f;
        scale_inv[k] = s;
        return s;
      },
      [](float v, float s) { return f32_to_e4m3(v / s); }, "quantize_fp8_block");
}

void quantize_fp8_block_ue8m0(const float* x, const Shape& shape, Fp8Block block, uint8_t* w,
                              uint8_t* ue8m0) {
  const float inv = static_cast<float>(1.0 / 448.0), floor_amax = static_cast<float>(1e-4);
  quantize_fp8_impl(
      x, shape, block, w,
      [&](float amax, int64_t k) {
        const int e = pow2_ceil_exp(std::max(amax, floor_amax) * inv);
        ue8m0[k] = static_cast<uint8_t>(e + 127);
        return pow2f(e);
      },
      [](float v, float s) { return f32_to_e4m3(std::clamp(v / s, -448.f, 448.f)); },
      "quantize_fp8_block_ue8m0");
}

void quantize_fp4_e2m1(const float* x, const Shape& shape, int64_t block, uint8_t* w,
                       uint8_t* ue8m0) {
  check_dims(shape, "quantize_fp4_e2m1");
  TREX_CHECK(block > 0, "quantize_fp4_e2m1: block ", block);
  TREX_CHECK(shape.d[shape.ndim - 1] % 2 == 0, "quantize_fp4_e2m1: last dim must be even, got ",
             shape.str());
  check_finite(x, shape.numel(), "quantize_fp4_e2m1");
  const Dims3 d = dims3(shape);
  const int64_t SC = cdiv(d.C, block);
  const float inv = static_cast<float>(1.0 / 6.0), floor_amax = std::ldexp(6.f, -126);
  parallel_for(d.B * d.R, row_grain(d.C), [&](int64_t g0, int64_t g1) {
    std::vector<uint8_t> code(static_cast<size_t>(d.C));
    for (int64_t g = g0; g < g1; ++g) {
      const float* xr = x + g * d.C;
      for (int64_t jb = 0; jb < SC; ++jb) {
        const int64_t j0 = jb * block, j1 = std::min(d.C, j0 + block);
        float amax = 0.f;
        for (int64_t j = j0; j < j1; ++j) amax = std::max(amax, std::fabs(xr[j]));
        const int e = pow2_ceil_exp(std::max(amax, floor_amax) * inv);
        const float s = pow2f(e);
        ue8m0[g * SC + jb] = static_cast<uint8_t>(e + 127);
        for (int64_t j = j0; j < j1; ++j) code[j] = f32_to_e2m1(std::clamp(xr[j] / s, -6.f, 6.f));
      }
      uint8_t* wr = w + g * (d.C / 2);
      for (int64_t k = 0; k < d.C / 2; ++k)
        wr[k] = static_cast<uint8_t>(code[2 * k] | (code[2 * k + 1] << 4));
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Checkpoint side

const char* quant_format_name(QuantFormat f) {
  switch (f) {
    case QuantFormat::None:
      return "none";
    case QuantFormat::Fp8F32Scale:
      return "fp8-e4m3 (f32 block scale)";
    case QuantFormat::Fp8Ue8m0:
      return "fp8-e4m3 (ue8m0 block scale)";
    case QuantFormat::Fp4Ue8m0:
      return "fp4-e2m1 (ue8m0 scale)";
  }
  return "?";
}

QuantConfig QuantConfig::from_hf_config(const nlohmann::json& config, const std::string& where) {
  QuantConfig c;
  if (!config.is_object()) return c;
  auto q = config.find("quantization_config");
  if (q == config.end() || q->is_null()) return c;
  const std::string w = where + ": quantization_config";
  const char* hint =
      "trex reads DeepSeek's fp8 block quantization (quant_method \"fp8\", fmt "
      "\"e4m3\", optional scale_fmt \"ue8m0\"); dequantize other checkpoints first";
  TREX_USER_CHECK(q->is_object(), hint, w, " is not an object");
  auto str = [&](const char* key) -> std::string {
    auto it = q->find(key);
    if (it == q->end() || it->is_null()) return "";
    TREX_USER_CHECK(it->is_string(), hint, w, ".", key, " is not a string: ", it->dump());
    return it->get<std::string>();
  };
  const std::string method = str("quant_method"), fmt = str("fmt"), sfmt = str("scale_fmt");
  TREX_USER_CHECK(method.empty() || method == "fp8", hint, w, ".quant_method is \"", method,
                  "\"; only \"fp8\" is supported");
  TREX_USER_CHECK(fmt.empty() || fmt == "e4m3", hint, w, ".fmt is \"", fmt,
                  "\"; only \"e4m3\" is supported");
  TREX_USER_CHECK(sfmt.empty() || sfmt == "ue8m0", hint, w, ".scale_fmt is \"", sfmt,
                  "\"; only \"ue8m0\" (or none) is supported");
  auto bs = q->find("weight_block_size");
  if (bs != q->end() && !bs->is_null()) {
    TREX_USER_CHECK(bs->is_array() && bs->size() == 2 && (*bs)[0].is_number_integer() &&
                        (*bs)[1].is_number_integer() && (*bs)[0].get<int64_t>() > 0 &&
                        (*bs)[1].get<int64_t>() > 0,
                    hint, w, ".weight_block_size must be [rows, cols] positive integers, got ",
                    bs->dump());
    c.fp8_block = {(*bs)[0].get<int64_t>(), (*bs)[1].get<int64_t>()};
  }
  return c;
}

namespace {

constexpr const char* kQuantHint =
    "the checkpoint's quantization metadata does not match its tensors; re-download or re-convert "
    "it (and check quantization_config.weight_block_size)";

bool is_float_dtype(DType t) {
  return t == DType::F32 || t == DType::BF16 || t == DType::F16 || t == DType::F64;
}
// ue8m0 scale bytes: F8_E8M0 (by name, so this compiles before core/dtype.h has the tag) or U8.
bool is_ue8m0_dtype(DType t) { return t == DType::U8 || dtype_name(t) == "F8_E8M0"; }
// "F4": packed e2m1 with a logical shape (safetensors' float4_e2m1fn_x2 convention).
bool is_f4_dtype(DType t) { return dtype_name(t) == "F4"; }
bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}
std::string v4_scale_name(const std::string& w) {
  return ends_with(w, ".weight") ? w.substr(0, w.size() - 7) + ".scale" : std::string();
}

}  // namespace

QuantizedTensorReader::QuantizedTensorReader(const SafetensorsDir& dir, QuantConfig cfg)
    : dir_(dir), cfg_(cfg) {
  TREX_CHECK(cfg_.fp8_block.rows > 0 && cfg_.fp8_block.cols > 0 && cfg_.fp4_block > 0,
             "QuantizedTensorReader: bad block sizes");
}

QuantInfo QuantizedTensorReader::inspect(const std::string& name) const {
  QuantInfo q;
  q.weight = name;
  q.weight_info = dir_.find(name, &q.weight_file);
  TREX_USER_CHECK(q.weight_info,
                  "check the tensor name against the checkpoint (model config mismatch?)",
                  "checkpoint '", dir_.dir(), "': no tensor '", name, "'");
  const TensorInfo& wi = *q.weight_info;
  const std::string wdesc = "checkpoint '" + dir_.dir() + "', file '" + q.weight_file->path() +
                            "': tensor '" + name + "' (" + std::string(dtype_name(wi.dtype)) + " " +
                            wi.shape.str() + ")";
  // Scale candidates: "<w>_scale_inv" (V3/HF) and "<prefix>.scale" (original layout).
  const SafetensorsFile *f1 = nullptr, *f2 = nullptr;
  const std::string n1 = name + "_scale_inv", n2 = v4_scale_name(name);
  const TensorInfo* s1 = dir_.find(n1, &f1);
  const TensorInfo* s2 = n2.empty() ? nullptr : dir_.find(n2, &f2);
  TREX_USER_CHECK(!(s1 && s2), kQuantHint, wdesc, " has two scale tensors, '", n1, "' and '", n2,
                  "'; it is ambiguous which applies");
  if (s1) q.scale = n1, q.scale_info = s1, q.scale_file = f1;
  if (s2) q.scale = n2, q.scale_info = s2, q.scale_file = f2;
  q.shape = wi.shape;

  if (is_float_dtype(wi.dtype)) {
    TREX_USER_CHECK(!q.scale_info, kQuantHint, wdesc, " is not quantized but has a scale tensor '",
                    q.scale, "' (", dtype_name(q.scale_info->dtype), " ", q.scale_info->shape.str(),
                    ")");
    q.scale.clear();
    return q;
  }
  const bool fp8 = wi.dtype == DType::F8_E4M3;
  const bool packed = wi.dtype == DType::I8 || wi.dtype == DType::U8 || is_f4_dtype(wi.dtype);
  TREX_USER_CHECK(fp8 || (packed && q.scale_info), kQuantHint, wdesc,
                  wi.dtype == DType::F8_E5M2
                      ? " is F8_E5M2, which no DeepSeek release uses; trex "
                        "dequantizes F8_E4M3 and packed FP4 weights"
                      : " is not a float weight (no scale tensor '" + n1 +
                            (n2.empty() ? "" : "' or '" + n2) + "' beside it)");
  TREX_USER_CHECK(q.scale_info, kQuantHint, wdesc, " is FP8 but has no scale tensor (looked for '",
                  n1, "'", n2.empty() ? "" : " and '" + n2 + "'", ")");
  const TensorInfo& si = *q.scale_info;
  const std::string sdesc =
      "checkpoint '" + dir_.dir() + "', file '" + q.scale_file->path() + "': scale tensor '" +
      q.scale + "' (" + std::string(dtype_name(si.dtype)) + " " + si.shape.str() + ") of weight '" +
      name + "' (" + std::string(dtype_name(wi.dtype)) + " " + wi.shape.str() + ")";
  TREX_USER_CHECK(wi.shape.ndim >= 2, kQuantHint, wdesc, " is quantized but has fewer than 2 dims");
  Shape expect;
  if (fp8) {
    TREX_USER_CHECK(si.dtype == DType::F32 || is_ue8m0_dtype(si.dtype), kQuantHint, sdesc,
                    ": an FP8 block scale must be F32 (scale_inv) or F8_E8M0/U8 (ue8m0)");
    q.format = si.dtype == DType::F32 ? QuantFormat::Fp8F32Scale : QuantFormat::Fp8Ue8m0;
    expect = fp8_scale_shape(wi.shape, cfg_.fp8_block);
    TREX_USER_CHECK(si.shape == expect, kQuantHint, sdesc, ": expected shape ", expect.str(),
                    " for ", cfg_.fp8_block.rows, "x", cfg_.fp8_block.cols, " blocks, got ",
                    si.shape.str());
  } else {
    TREX_USER_CHECK(is_ue8m0_dtype(si.dtype), kQuantHint, sdesc,
                    ": a packed FP4 weight needs an F8_E8M0/U8 (ue8m0) scale");
    q.format = QuantFormat::Fp4Ue8m0;
    if (is_f4_dtype(wi.dtype)) {
      TREX_USER_CHECK(wi.shape.d[wi.shape.ndim - 1] % 2 == 0 &&
                          wi.nbytes * 2 == static_cast<uint64_t>(wi.shape.numel()),
                      kQuantHint, wdesc,
                      ": F4 tensor must have an even last dim and numel/2 bytes");
    } else {
      q.shape.d[q.shape.ndim - 1] *= 2;  // two e2m1 per byte
    }
    expect = fp4_scale_shape(q.shape, cfg_.fp4_block);
    TREX_USER_CHECK(si.shape == expect, kQuantHint, sdesc, ": expected shape ", expect.str(),
                    " (one scale per ", cfg_.fp4_block, " of the ", q.shape.str(),
                    " unpacked elements), got ", si.shape.str());
  }
  return q;
}

void QuantizedTensorReader::read_f32(const std::string& name, float* out, int64_t n) const {
  const QuantInfo q = inspect(name);
  TREX_USER_CHECK(n == q.shape.numel(), "the model config does not match the checkpoint",
                  "checkpoint '", dir_.dir(), "': tensor '", name, "' has logical shape ",
                  q.shape.str(), " (", q.shape.numel(), " elements) but ", n, " were requested");
  if (q.format == QuantFormat::None) return dir_.read_f32(name, out, n);
  const auto* w = static_cast<const uint8_t*>(q.weight_file->data(*q.weight_info));
  const auto* s = static_cast<const uint8_t*>(q.scale_file->data(*q.scale_info));
  switch (q.format) {
    case QuantFormat::Fp8F32Scale: {
      std::vector<float> sf(static_cast<size_t>(q.scale_info->shape.numel()));
      std::memcpy(sf.data(), s, sf.size() * sizeof(float));  // the mapping may be unaligned
      return dequant_fp8_block(w, q.shape, sf.data(), q.scale_info->shape, cfg_.fp8_block, out);
    }
    case QuantFormat::Fp8Ue8m0:
      return dequant_fp8_block(w, q.shape, s, q.scale_info->shape, cfg_.fp8_block, out);
    case QuantFormat::Fp4Ue8m0:
      return dequant_fp4_e2m1(w, q.shape, s, q.scale_info->shape, cfg_.fp4_block, out);
    case QuantFormat::None:
      break;
  }
}

std::vector<float> QuantizedTensorReader::read_f32(const std::string& name) const {
  std::vector<float> out(static_cast<size_t>(inspect(name).shape.numel()));
  read_f32(name, out.data(), static_cast<int64_t>(out.size()));
  return out;
}

bool QuantizedTensorReader::is_scale(const std::string& name) const {
  std::string w;
  if (ends_with(name, "_scale_inv"))
    w = name.substr(0, name.size() - 10);
  else if (ends_with(name, ".scale"))
    w = name.substr(0, name.size() - 6) + ".weight";
  else
    return false;
  const TensorInfo* t = dir_.find(w);
  if (!t) return false;
  return t->dtype == DType::F8_E4M3 || t->dtype == DType::I8 || t->dtype == DType::U8 ||
         is_f4_dtype(t->dtype);
}

std::vector<std::string> QuantizedTensorReader::weight_names() const {
  std::vector<std::string> v;
  for (std::string& n : dir_.names())
    if (!is_scale(n)) v.push_back(std::move(n));
  return v;
}

std::vector<QuantizedTensor> quantize_weight(const std::string& name, const float* x,
                                             const Shape& shape, QuantScheme scheme,
                                             const QuantConfig& cfg) {
  std::vector<QuantizedTensor> r(2);
  QuantizedTensor &w = r[0], &s = r[1];
  w.name = name;
  if (scheme != QuantScheme::Fp8V3) {
    s.name = v4_scale_name(name);
    TREX_USER_CHECK(!s.name.empty(), "name the weight '<prefix>.weight'", "quantize_weight: '",
                    name, "' does not end in '.weight', so its '<prefix>.scale' cannot be named");
  }
  switch (scheme) {
    case QuantScheme::Fp8V3:
    case QuantScheme::Fp8V4: {
      w.dtype = DType::F8_E4M3;
      w.shape = shape;
      w.bytes.resize(static_cast<size_t>(shape.numel()));
      s.shape = fp8_scale_shape(shape, cfg.fp8_block);
      if (scheme == QuantScheme::Fp8V3) {
        s.name = name + "_scale_inv";
        s.dtype = DType::F32;
        std::vector<float> sf(static_cast<size_t>(s.shape.numel()));
        quantize_fp8_block(x, shape, cfg.fp8_block, w.bytes.data(), sf.data());
        s.bytes.resize(sf.size() * sizeof(float));
        std::memcpy(s.bytes.data(), sf.data(), s.bytes.size());
      } else {
        s.dtype = DType::U8;  // ue8m0 bytes; F8_E8M0 once core/dtype.h has it (docs/QUANT.md)
        s.bytes.resize(static_cast<size_t>(s.shape.numel()));
        quantize_fp8_block_ue8m0(x, shape, cfg.fp8_block, w.bytes.data(), s.bytes.data());
      }
      break;
    }
    case QuantScheme::Fp4V4: {
      w.dtype = DType::I8;
      w.shape = fp4_packed_shape(shape);
      w.bytes.resize(static_cast<size_t>(w.shape.numel()));
      s.dtype = DType::U8;
      s.shape = fp4_scale_shape(shape, cfg.fp4_block);
      s.bytes.resize(static_cast<size_t>(s.shape.numel()));
      quantize_fp4_e2m1(x, shape, cfg.fp4_block, w.bytes.data(), s.bytes.data());
      break;
    }
  }
  return r;
}

}  // namespace trex::io
