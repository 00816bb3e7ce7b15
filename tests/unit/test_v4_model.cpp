// DeepSeek-V4 beyond the PyTorch dumps (tests/reference/data/v4_*): config parsing and its
// errors, packed rows (seg ids) and odd shapes checked against a central finite difference of
// the loss per parameter tensor, the original release layout (names mirror transformers'
// conversion mapping; HF -> original -> HF is lossless), and a quantized original-layout
// checkpoint (FP8 ue8m0 + FP4) against its dequantized twin.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include "core/error.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "io/quant.h"
#include "io/safetensors.h"
#include "model/checkpoint.h"
#include "model/generate.h"
#include "model/model.h"
#include "tests/tiny_configs.h"
#include "tests/unit/fd_check.h"
#include "tests/unit/test_util.h"

using namespace trex;
using nlohmann::json;

namespace {

json base() { return trex::testing::tiny_v4(); }

model::ModelConfig cfg_of(const json& j) { return model::parse_config(j, "test config"); }


using trex::testing::perturb_vectors;

using Data = trex::testing::FdData;
Data make_data(int64_t B, int64_t T, int64_t V, uint64_t seed) { return trex::testing::fd_data(B, T, V, seed); }

void fd_check(const json& j, int64_t B, int64_t T, bool packed, double mtp_weight = 0) {
  init_threads();
  model::ModelConfig cfg = cfg_of(j);
  model::Model m(cfg, kern::Prec::F32, {0.0, mtp_weight});
  m.init_random(7);
  perturb_vectors(m, 3);
  Data data = make_data(B, T, cfg.vocab_size, 11);
  model::Batch b = data.batch(packed);
  m.zero_grads();
  model::LossParts lp = m.forward_backward(b, 1.f);
  ASSERT_TRUE(std::isfinite(lp.loss));
  int kinks = 0;
  const std::vector<const model::ParamEntry*> done = trex::testing::fd_check_tensors(m, b, &kinks);
  const int checked = (int)done.size();
  std::printf("[v4 fd] %d tensors checked, %d at a kink checked one-sided\n", checked, kinks);
  EXPECT_LE(kinks, checked / 4);
}

TEST(V4Model, FiniteDifferenceOddShapes) { fd_check(base(), 2, 23, false); }

TEST(V4Model, FiniteDifferencePackedRows) { fd_check(base(), 1, 31, true); }

TEST(V4Model, FiniteDifferenceTwoMtpDepthsPacked) {
  json j = base();
  j["num_nextn_predict_layers"] = 2;
  fd_check(j, 2, 17, true, 0.7);
}

TEST(V4Model, MtpLossAndLayout) {
  init_threads();
  json j = base();
  j["num_nextn_predict_layers"] = 1;
  model::ModelConfig cfg = cfg_of(j);
  model::Model off(cfg, kern::Prec::F32), on(cfg, kern::Prec::F32, {0.0, 0.5});
  EXPECT_EQ(off.layout.mtp.size(), 0u);
  ASSERT_EQ(on.layout.mtp.size(), 1u);
  EXPECT_TRUE(on.layout.find("mtp.0.e_proj.weight"));
  EXPECT_TRUE(on.layout.find("mtp.0.self_attn.q_a_proj.weight"));
  EXPECT_EQ(model::v4_original_name("mtp.0.self_attn.q_a_proj.weight"), "mtp.0.attn.wq_a.weight");
  EXPECT_EQ(model::v4_original_name("mtp.0.hc_head.hc_fn"), "mtp.0.hc_head_fn");
  for (const auto& e : on.layout.entries)
    if (e.name.rfind("mtp.", 0) == 0 && e.name.find(".mlp.experts.") == std::string::npos) {
      EXPECT_EQ(model::v4_hf_name(model::v4_original_name(e.name)), e.name);
    }
  on.init_random(3);
  // The main model's weights are shared: the MTP-off model on the same weights gives the same CE.
  for (const auto& e : off.layout.entries) {
    const auto* f = on.layout.find(e.name);
    ASSERT_TRUE(f) << e.name;
    std::memcpy(off.P() + e.offset, on.P() + f->offset, e.shape.numel() * sizeof(float));
  }
  for (const auto& b : off.layout.buffers)
    for (const auto& b2 : on.layout.buffers)
      if (b2.name == b.name) std::copy(on.buffers.begin() + b2.offset, on.buffers.begin() + b2.offset + b.size, off.buffers.begin() + b.offset);
  off.refresh_bf16();
  Data data = make_data(2, 13, cfg.vocab_size, 4);
  model::LossParts a = off.forward(data.batch(false)), b = on.forward(data.batch(false));
  EXPECT_EQ(a.ce, b.ce);
  EXPECT_GT(b.mtp, 0.0);
  EXPECT_NEAR(b.loss, b.ce + 0.5 * b.mtp, 1e-9);
  // Save with MTP, reload in both layouts.
  test::TmpDir hf("trex_v4_mtp_hf"), orig("trex_v4_mtp_orig");
  model::save_hf_checkpoint(on, hf.str(), DType::F32);
  model::save_v4_original(on, orig.str(), DType::F32, false);
  EXPECT_TRUE(io::SafetensorsDir::open(orig.str()).find("mtp.0.ffn.experts.1.w2.weight"));
  for (const std::string& dir : {hf.str(), orig.str()}) {
    model::Model r(model::load_config_json(dir + "/config.json"), kern::Prec::F32, {0.0, 0.5});
    model::load_hf_weights(r, dir);
    model::LossParts c = r.forward(data.batch(false));
    EXPECT_EQ(c.loss, b.loss) << dir;
  }
  // V3 configs and V4 configs without MTP blocks refuse an MTP weight.
  json k = base();
  k["num_nextn_predict_layers"] = 0;
  EXPECT_THROW(model::Model(cfg_of(k), kern::Prec::F32, {0.0, 0.3}), UserError);
}

TEST(V4Model, ConfigDefaultsAndLegacyKeys) {
  json j = base();
  j.erase("layer_types");
  j.erase("compress_rates");
  j.erase("mlp_layer_types");
  j.erase("partial_rotary_factor");
  j["compress_ratios"] = {4, 0, 9};
  j["num_hash_layers"] = 2;
  j["qk_rope_head_dim"] = 4;
  model::ModelConfig c = cfg_of(j);
  ASSERT_EQ(c.v4.attn.size(), 3u);
  EXPECT_EQ(c.v4.attn[0], model::AttnKind::CSA);
  EXPECT_EQ(c.v4.attn[1], model::AttnKind::Sliding);
  EXPECT_EQ(c.v4.attn[2], model::AttnKind::HCA);
  EXPECT_EQ(c.v4.hca_rate, 9);
  EXPECT_EQ(c.v4.csa_rate, 4);
  EXPECT_EQ(c.v4.hash[0] + c.v4.hash[1] + c.v4.hash[2], 2);
  EXPECT_EQ(c.qk_rope_head_dim, 4);
  // Flat rope_parameters: YaRN for the compressed layers with attention_factor 1, main plain.
  EXPECT_TRUE(c.v4.compress_rope.yarn);
  EXPECT_EQ(c.v4.compress_rope.attention_factor, 1.0);
  EXPECT_FALSE(c.rope_scaling.yarn);
  // HF's rotated dims: int(head_dim * factor) in double.
  json k = base();
  k["head_dim"] = 20;
  k["partial_rotary_factor"] = 0.3;
  EXPECT_EQ(cfg_of(k).qk_rope_head_dim, 6);
  EXPECT_GT(c.num_params(), c.num_active_params());
  EXPECT_GT(c.train_flops_per_token(100), 6.0 * (double)c.num_active_params());
}

TEST(V4Model, ConfigErrorsNameTheField) {
  auto expect_error = [](json j, const char* field) {
    try {
      cfg_of(j);
      ADD_FAILURE() << "accepted " << field;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  json j = base();
  j["num_key_value_heads"] = 2;
  expect_error(j, "num_key_value_heads");
  j = base();
  j["norm_topk_prob"] = false;
  expect_error(j, "normalizes");
  j = base();
  j["layer_types"][1] = "full_attention";
  expect_error(j, "layer_types[1]");
  j = base();
  j["swiglu_limit"] = 0;
  expect_error(j, "swiglu_limit");
  j = base();
  j["index_head_dim"] = 2;
  expect_error(j, "index_head_dim");
  j = base();
  j["o_groups"] = 4;
  expect_error(j, "o_groups");
  j = base();
  j["mlp_layer_types"] = {"moe", "moe"};
  expect_error(j, "mlp_layer_types");
}

TEST(V4Model, OriginalNamesMirrorTransformersRenames) {
  model::ModelConfig c = cfg_of(base());
  model::ParamLayout L = model::build_layout(c);
  int n = 0;
  for (const auto& e : L.entries) {
    if (e.name.find(".mlp.experts.") != std::string::npos) continue;
    EXPECT_EQ(model::v4_hf_name(model::v4_original_name(e.name)), e.name);
    ++n;
  }
  for (const auto& b : L.buffers) EXPECT_EQ(model::v4_hf_name(model::v4_original_name(b.name)), b.name);
  EXPECT_EQ(model::v4_original_name("model.layers.0.self_attn.compressor.indexer.scorer.weights_proj.weight"),
            "layers.0.attn.indexer.weights_proj.weight");
  EXPECT_EQ(model::v4_original_name("model.layers.2.self_attn.compressor.kv_norm.weight"),
            "layers.2.attn.compressor.norm.weight");
  EXPECT_EQ(model::v4_original_name("model.hc_head.hc_fn"), "hc_head_fn");
  EXPECT_GT(n, 40);
}

TEST(V4Model, OriginalLayoutRoundTripAndQuantizedTwin) {
  init_threads();
  json j = base();
  j["moe_intermediate_size"] = 6;  // FP4 packs two values per byte: expert input dims must be even
  model::ModelConfig cfg = cfg_of(j);
  model::Model m(cfg, kern::Prec::F32);
  m.init_random(21);
  perturb_vectors(m, 4);
  Data data = make_data(2, 19, cfg.vocab_size, 12);
  const double loss0 = m.forward(data.batch(false)).loss;
  test::TmpDir hf("trex_v4_hf"), orig("trex_v4_orig"), hf2("trex_v4_hf2"), quant("trex_v4_q");
  model::save_hf_checkpoint(m, hf.str(), DType::F32);
  model::save_v4_original(m, orig.str(), DType::F32, false);
  EXPECT_TRUE(io::SafetensorsDir::open(orig.str()).find("layers.0.ffn.experts.4.w3.weight"));
  model::Model m2(model::load_config_json(orig.file("config.json")), kern::Prec::F32);
  model::load_hf_weights(m2, orig.str());
  model::save_hf_checkpoint(m2, hf2.str(), DType::F32);
  io::SafetensorsDir a = io::SafetensorsDir::open(hf.str()), b = io::SafetensorsDir::open(hf2.str());
  ASSERT_EQ(a.names(), b.names());
  for (const std::string& n : a.names()) {
    const io::SafetensorsFile *fa, *fb;
    const io::TensorInfo* ta = a.find(n, &fa);
    const io::TensorInfo* tb = b.find(n, &fb);
    ASSERT_EQ(ta->nbytes, tb->nbytes) << n;
    EXPECT_EQ(0, std::memcmp(fa->data(*ta), fb->data(*tb), ta->nbytes)) << n;
  }
  EXPECT_EQ(m2.forward(data.batch(false)).loss, loss0);

  // Quantized release layout vs the twin dequantized in memory with the same quantizers.
  model::save_v4_original(m, quant.str(), DType::BF16, true);
  io::SafetensorsDir q = io::SafetensorsDir::open(quant.str());
  ASSERT_TRUE(q.find("layers.0.attn.wq_a.scale"));
  EXPECT_EQ(q.find("layers.0.attn.wq_a.weight")->dtype, DType::F8_E4M3);
  EXPECT_EQ(q.find("layers.1.ffn.experts.2.w2.weight")->dtype, DType::I8);
  EXPECT_EQ(q.find("layers.0.attn.compressor.wkv.weight")->dtype, DType::BF16);
  model::Model mq(model::load_config_json(quant.file("config.json")), kern::Prec::F32);
  model::load_hf_weights(mq, quant.str());
  model::Model twin(cfg, kern::Prec::F32);
  std::memcpy(twin.P(), m.P(), m.layout.total * sizeof(float));
  twin.buffers = m.buffers;
  for (const model::ParamEntry& e : twin.layout.entries) {
    float* w = twin.P() + e.offset;
    const std::string on = model::v4_original_name(e.name);
    const bool experts = e.name.find(".mlp.experts.") != std::string::npos;
    const bool fp8 = !experts && q.find(on) && q.find(on)->dtype == DType::F8_E4M3;
    if (!experts && !fp8) {  // bf16 storage
      for (int64_t i = 0; i < e.shape.numel(); ++i) w[i] = bf16_to_f32(f32_to_bf16(w[i]));
      continue;
    }
    // Per matrix (each expert separately): quantize then dequantize with the reference math.
    const int64_t rows = experts ? e.shape[1] : e.shape[0], cols = e.shape[e.shape.ndim - 1];
    const int64_t mats = experts ? e.shape[0] * (e.name.find("gate_up") != std::string::npos ? 2 : 1) : 1;
    const int64_t mr = experts && e.name.find("gate_up") != std::string::npos ? rows / 2 : rows;
    for (int64_t k = 0; k < mats; ++k) {
      float* x = w + k * mr * cols;
      auto qt = io::quantize_weight("x.weight", x, Shape{mr, cols},
                                    experts ? io::QuantScheme::Fp4V4 : io::QuantScheme::Fp8V4);
      ASSERT_EQ(qt.size(), 2u);
      const io::QuantizedTensor& wq = qt[0].name == "x.weight" ? qt[0] : qt[1];
      const io::QuantizedTensor& sq = qt[0].name == "x.weight" ? qt[1] : qt[0];
      std::vector<float> back =
          experts ? io::dequant_fp4_e2m1(wq.bytes.data(), Shape{mr, cols}, sq.bytes.data(), sq.shape)
                  : io::dequant_fp8_block(wq.bytes.data(), Shape{mr, cols}, sq.bytes.data(), sq.shape);
      std::memcpy(x, back.data(), back.size() * sizeof(float));
    }
  }
  twin.refresh_bf16();
  const double lq = mq.forward(data.batch(false)).loss, lt = twin.forward(data.batch(false)).loss;
  EXPECT_EQ(lq, lt);
  EXPECT_NE(lq, loss0);  // quantization really changed the weights
  std::printf("[v4 quant] loss f32 %.6f, quantized %.6f, twin %.6f\n", loss0, lq, lt);
}

}  // namespace

namespace {

// The generation path (Decoder -> Model::v4_last_logits) against the training forward: the CE of
// the last position computed from the decoder's logits equals the loss of a batch whose only
// target is that position; and generate() runs greedy decoding on a V4 model.
TEST(V4Model, DecoderLogitsMatchTrainingForward) {
  init_threads();
  model::ModelConfig cfg = cfg_of(base());
  for (kern::Prec prec : {kern::Prec::F32, kern::Prec::BF16}) {
    model::Model m(cfg, prec);
    m.init_random(8);
    perturb_vectors(m, 6);
    Data data = make_data(1, 26, cfg.vocab_size, 13);
    model::Decoder dec(m, 40);
    dec.feed(data.ids.data(), 20);                              // a prompt chunk
    const std::vector<float>& lg = dec.feed(data.ids.data() + 20, 6);  // then more tokens
    ASSERT_EQ(dec.len(), 26);
    const int32_t y = 5;
    double mx = -1e30, se = 0;
    for (float v : lg) mx = std::max(mx, (double)v);
    for (float v : lg) se += std::exp((double)v - mx);
    const double ce = mx + std::log(se) - lg[y];
    std::vector<int32_t> tg(26, -100);
    tg[25] = y;
    model::Batch b{1, 26, data.ids.data(), tg.data(), nullptr, nullptr};
    const double loss = m.forward(b).loss;
    EXPECT_NEAR(ce, loss, 2e-5 * std::abs(loss)) << (prec == kern::Prec::BF16 ? "bf16" : "f32");
  }
  model::Model m(cfg, kern::Prec::F32);
  m.init_random(9);
  model::Decoder dec(m, 30);
  model::SampleParams sp;
  sp.max_tokens = 7;
  std::vector<int32_t> prompt = {3, 14, 15, 9, 2};
  auto r = model::generate(dec, prompt, sp, [](const std::vector<int32_t>& t) { return std::string(t.size(), 'x'); }, {});
  EXPECT_EQ(r.tokens.size(), 7u);
  EXPECT_EQ(r.finish, "length");
}

}  // namespace
