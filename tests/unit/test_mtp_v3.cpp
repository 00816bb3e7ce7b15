// DeepSeek-V3 MTP layers (model/mtp_v3.h) beyond the PyTorch dumps (tests/reference/data/v3_mtp_*):
// the layout under the release's names, the gradients of every tensor against a central finite
// difference of the loss (two depths, a dense and a MoE MTP layer, packed rows), mtp_loss_weight = 0
// keeping today's model bit for bit while the MTP tensors survive load -> save unchanged, and a
// checkpoint written after training holding every model.layers.<L>.* tensor and resuming; a
// checkpoint without shared_head.head loading with the MTP head tied to lm_head.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include "core/parallel.h"
#include "core/rng.h"
#include "io/safetensors.h"
#include "model/checkpoint.h"
#include "model/model.h"
#include "model/mtp_v3.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "tests/tiny_configs.h"
#include "tests/unit/fd_check.h"
#include "tests/unit/test_util.h"

using namespace trex;
using nlohmann::json;

namespace {

const char* kCase = "tests/reference/data/v3_mtp_softmax";

model::ModelConfig cfg_of(const json& j) { return model::parse_config(j, "test config"); }

using Data = trex::testing::FdData;
Data make_data(int64_t B, int64_t T, int64_t V, uint64_t seed) { return trex::testing::fd_data(B, T, V, seed); }

// Central difference of the loss along a random unit direction inside each tensor vs the gradient.
void fd_check(const json& j, int64_t B, int64_t T, bool packed, double aux, double w, bool tied_head = false) {
  init_threads();
  model::ModelConfig cfg = cfg_of(j);
  cfg.v3_mtp_head_tied = tied_head;
  model::Model m(cfg, kern::Prec::F32, {aux, w});
  m.init_random(7);
  trex::testing::perturb_vectors(m, 3);
  Data data = make_data(B, T, cfg.vocab_size, 11);
  model::Batch b = data.batch(packed);
  m.zero_grads();
  model::LossParts lp = m.forward_backward(b, 1.f);
  ASSERT_TRUE(std::isfinite(lp.loss));
  ASSERT_GT(lp.mtp, 0);
  int kinks = 0;
  const std::vector<const model::ParamEntry*> done = trex::testing::fd_check_tensors(m, b, &kinks);
  const int checked = (int)done.size();
  int mtp_tensors = 0;
  for (const model::ParamEntry* e : done) mtp_tensors += model::v3_layer_of(e->name) >= cfg.num_hidden_layers;
  std::printf("[v3 mtp fd] %d tensors checked (%d of the MTP layers), %d at a kink checked one-sided\n", checked,
              mtp_tensors, kinks);
  EXPECT_GT(mtp_tensors, 10);
  EXPECT_LE(kinks, checked / 4);
}

// Every tensor of a's checkpoint is in b's with the same dtype, shape and bytes.
void expect_same_tensors(const std::string& a_dir, const std::string& b_dir) {
  io::SafetensorsDir a = io::SafetensorsDir::open(a_dir), b = io::SafetensorsDir::open(b_dir);
  for (const std::string& n : a.names()) {
    const io::SafetensorsFile *fa, *fb;
    const io::TensorInfo* ta = a.find(n, &fa);
    const io::TensorInfo* tb = b.find(n, &fb);
    ASSERT_TRUE(tb) << n << " missing in " << b_dir;
    ASSERT_EQ(ta->dtype, tb->dtype) << n;
    ASSERT_TRUE(ta->shape == tb->shape) << n;
    EXPECT_EQ(0, std::memcmp(fa->data(*ta), fb->data(*tb), ta->nbytes)) << n;
  }
}

}  // namespace

TEST(MtpV3, LayoutUnderTheReleaseNames) {
  const model::ModelConfig cfg = cfg_of(trex::testing::tiny_v3_mtp());
  json j0 = trex::testing::tiny_v3();
  const model::Model plain(cfg_of(j0), kern::Prec::F32), off(cfg, kern::Prec::F32), on(cfg, kern::Prec::F32, {0, 0.3});
  // mtp_loss_weight = 0: the layout of the model without MTP layers, tensor for tensor.
  ASSERT_EQ(off.layout.entries.size(), plain.layout.entries.size());
  EXPECT_EQ(off.layout.total, plain.layout.total);
  for (size_t i = 0; i < off.layout.entries.size(); ++i) {
    EXPECT_EQ(off.layout.entries[i].name, plain.layout.entries[i].name);
    EXPECT_EQ(off.layout.entries[i].offset, plain.layout.entries[i].offset);
  }
  const int64_t d = cfg.hidden_size, V = cfg.vocab_size;
  ASSERT_EQ(on.layout.layers.size(), 4u);
  ASSERT_EQ(on.layout.mtp3.size(), 1u);
  for (auto [name, shape] : std::vector<std::pair<std::string, Shape>>{
           {"enorm.weight", {d}}, {"hnorm.weight", {d}}, {"eh_proj.weight", {d, 2 * d}},
           {"shared_head.norm.weight", {d}}, {"shared_head.head.weight", {V, d}},
           {"self_attn.kv_b_proj.weight", on.layout.find("model.layers.2.self_attn.kv_b_proj.weight")->shape},
           {"mlp.experts.4.down_proj.weight", {d, cfg.moe_intermediate_size}}}) {
    const model::ParamEntry* e = on.layout.find("model.layers.3." + name);
    ASSERT_TRUE(e) << name;
    EXPECT_TRUE(e->shape == shape) << name;
  }
  // The main model's tensors keep their offsets; the MTP layer comes after the head.
  for (const model::ParamEntry& e : off.layout.entries) EXPECT_EQ(on.layout.find(e.name)->offset, e.offset) << e.name;
  EXPECT_FALSE(on.layout.find("model.layers.3.embed_tokens.weight"));  // shared: model.embed_tokens
  EXPECT_EQ(model::v3_layer_of("model.layers.61.eh_proj.weight"), 61);
  EXPECT_TRUE(model::v3_mtp_embed_alias("model.layers.61.embed_tokens.weight", 61));
  EXPECT_FALSE(model::v3_mtp_embed_alias("model.embed_tokens.weight", 61));
}

// Two depths; first_k_dense_replace 4 makes MTP layer 3 dense and MTP layer 4 MoE.
TEST(MtpV3, FiniteDifferenceTwoDepthsPacked) {
  json j = trex::testing::tiny_v3_mtp(2);
  j["first_k_dense_replace"] = 4;
  fd_check(j, 2, 17, true, 0.01, 0.7);
}

// One depth with a tied LM head (shared_head.head stays a tensor of its own).
TEST(MtpV3, FiniteDifferenceOneDepthTiedHead) {
  json j = trex::testing::tiny_v3_mtp(1);
  j["tie_word_embeddings"] = true;
  fd_check(j, 2, 13, false, 0.0, 0.4);
}

// DeepSeek-V3.2 (the V3.2-Exp release ships one MTP layer): the MTP decoder layer has its own
// lightning indexer (frozen, zero gradient, as in the main layers); two depths, a MoE MTP layer,
// packed rows. (tests/reference/make_dumps_v32_mtp.py checks the same against transformers'
// DeepseekV32DecoderLayer.)
TEST(MtpV3, FiniteDifferenceV32WithIndexer) {
  json j = trex::testing::tiny_v32();
  j["num_nextn_predict_layers"] = 2;
  const model::Model m(cfg_of(j), kern::Prec::F32, {0, 0.5});
  for (const char* t : {"wq_b.weight", "wk.weight", "k_norm.weight", "k_norm.bias", "weights_proj.weight"}) {
    const model::ParamEntry* e = m.layout.find(std::string("model.layers.3.self_attn.indexer.") + t);
    ASSERT_TRUE(e) << t;
    EXPECT_TRUE(e->frozen) << t;
  }
  EXPECT_TRUE(m.layout.find("model.layers.4.mlp.gate.weight"));
  fd_check(j, 2, 13, true, 0.0, 0.5);
}

// save_pretrained's mlp_layer_types covers the main layers only: a first_k_dense_replace beyond it
// (every listed layer dense) decides whether an MTP layer is dense, as in DeepSeek's release.
TEST(MtpV3, V32MlpLayerTypesAndFirstKDenseForTheMtpLayer) {
  json j = trex::testing::tiny_v32();
  j["num_nextn_predict_layers"] = 2;
  j["mlp_layer_types"] = {"dense", "dense", "dense"};
  j["first_k_dense_replace"] = 4;
  model::ModelConfig c = cfg_of(j);
  EXPECT_FALSE(c.is_moe_layer(3));
  EXPECT_TRUE(c.is_moe_layer(4));
  j["first_k_dense_replace"] = 1;  // contradicts the list: the list decides (as transformers)
  c = cfg_of(j);
  EXPECT_EQ(c.first_k_dense_replace, 3);
  j["mlp_layer_types"] = {"dense", "sparse", "sparse"};
  j["first_k_dense_replace"] = 5;
  EXPECT_EQ(cfg_of(j).first_k_dense_replace, 1);
}

// mtp_loss_weight = 0 on a checkpoint with an MTP layer: the model, loss and gradients are those
// of the config without it, bit for bit; the MTP tensors come back unchanged from a save (f32 and
// the bf16 round trip), and `trex convert` goes through the same save.
TEST(MtpV3, WeightZeroKeepsTheLayersUnchanged) {
  init_threads();
  const model::ModelConfig cfg = model::load_config_json(std::string(kCase) + "/model/config.json");
  ASSERT_EQ(cfg.num_nextn_predict_layers, 1);
  model::ModelConfig c0 = cfg;
  c0.num_nextn_predict_layers = 0;
  model::Model m(cfg, kern::Prec::F32, {0.01, 0.0}), ref(c0, kern::Prec::F32, {0.01, 0.0});
  model::load_hf_weights(m, std::string(kCase) + "/model");
  model::load_hf_weights(ref, std::string(kCase) + "/model");
  EXPECT_TRUE(ref.kept.empty());
  EXPECT_GT(m.kept.size(), 20u);
  for (const model::KeptTensor& k : m.kept) EXPECT_EQ(model::v3_layer_of(k.name), 2) << k.name;
  std::vector<int32_t> ids(22), tg(22);
  for (int i = 0; i < 22; ++i) ids[i] = (i * 7 + 3) % 83, tg[i] = i % 6 == 5 ? -100 : (i * 5 + 1) % 83;
  const model::Batch b{2, 11, ids.data(), tg.data(), nullptr, nullptr};
  const model::LossParts a = m.forward_backward(b, 1.f), r = ref.forward_backward(b, 1.f);
  EXPECT_EQ(a.loss, r.loss);
  EXPECT_EQ(a.mtp, 0.0);
  ASSERT_EQ(m.layout.total, ref.layout.total);
  EXPECT_EQ(0, std::memcmp(m.G(), ref.G(), m.layout.total * sizeof(float)));
  test::TmpDir f32("trex_mtp_f32"), bf("trex_mtp_bf"), bf2("trex_mtp_bf2");
  model::save_hf_checkpoint(m, f32.str(), DType::F32);
  expect_same_tensors(std::string(kCase) + "/model", f32.str());
  EXPECT_EQ(model::load_config_json(f32.file("config.json")).num_nextn_predict_layers, 1);
  model::save_hf_checkpoint(m, bf.str(), DType::BF16, 20000);
  model::Model m2(cfg, kern::Prec::F32);
  model::load_hf_weights(m2, bf.str());
  model::save_hf_checkpoint(m2, bf2.str(), DType::BF16, 20000);
  expect_same_tensors(bf.str(), bf2.str());
  expect_same_tensors(bf2.str(), bf.str());
  // A run checkpoint of the weight-0 run resumes into a run that trains the MTP layer: the layer's
  // weights are the checkpoint's, its optimizer moments (absent from the file) start at 0.
  train::AdamW opt(m, {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f});
  test::TmpDir run("trex_mtp_run0");
  train::TrainState st;
  st.step = 1;
  const std::string dir = train::save_checkpoint(run.str(), m, opt, st);
  expect_same_tensors(std::string(kCase) + "/model", dir);
  model::Model on(cfg, kern::Prec::F32, {0.01, 0.3});
  train::AdamW opt_on(on, {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f});
  EXPECT_EQ(train::load_checkpoint(dir, on, opt_on).step, 1);
  for (const model::KeptTensor& k : m.kept) {
    const model::ParamEntry* e = on.layout.find(k.name);
    if (!e) continue;  // the router bias (a buffer), the embedding copy
    EXPECT_EQ(0, std::memcmp(on.P() + e->offset, k.v.data(), k.v.size() * sizeof(float))) << k.name;
  }
  EXPECT_GT(train::trainer_step(on, opt_on, {b}, 1e-2f, 0.f).mtp, 0.0);
}

// Training the MTP layer: a checkpoint written after the steps holds every tensor the release
// layout has (model.layers.<L>.* included, embed_tokens as a copy of the trained embedding), the
// MTP tensors moved, and the checkpoint resumes into a fresh model exactly.
TEST(MtpV3, TrainedCheckpointHoldsEveryMtpTensorAndResumes) {
  init_threads();
  const model::ModelConfig cfg = model::load_config_json(std::string(kCase) + "/model/config.json");
  model::Model m(cfg, kern::Prec::F32, {0.01, 0.3});
  model::load_hf_weights(m, std::string(kCase) + "/model");
  const std::vector<float> p0(m.P(), m.P() + m.layout.total);
  train::AdamW opt(m, {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f});
  std::vector<int32_t> ids(22), tg(22);
  for (int i = 0; i < 22; ++i) ids[i] = (i * 7 + 3) % 83, tg[i] = i % 6 == 5 ? -100 : (i * 5 + 1) % 83;
  const model::Batch b{2, 11, ids.data(), tg.data(), nullptr, nullptr};
  for (int s = 0; s < 2; ++s) EXPECT_GT(train::trainer_step(m, opt, {b}, 1e-2f, 0.f).mtp, 0.0);
  test::TmpDir run("trex_mtp_run");
  train::TrainState st;
  st.step = 2;
  const std::string dir = train::save_checkpoint(run.str(), m, opt, st);
  io::SafetensorsDir src = io::SafetensorsDir::open(std::string(kCase) + "/model"), out = io::SafetensorsDir::open(dir);
  int mtp_names = 0;
  for (const std::string& n : src.names()) {
    EXPECT_TRUE(out.find(n)) << n << " missing after training";
    mtp_names += model::v3_layer_of(n) == 2;
  }
  EXPECT_GT(mtp_names, 25);
  EXPECT_EQ(src.names().size(), out.names().size());
  for (const char* n : {"model.layers.2.eh_proj.weight", "model.layers.2.shared_head.head.weight",
                        "model.layers.2.self_attn.kv_a_proj_with_mqa.weight", "model.layers.2.enorm.weight"}) {
    const model::ParamEntry* e = m.layout.find(n);
    ASSERT_TRUE(e) << n;
    double moved = 0;
    for (int64_t i = 0; i < e->shape.numel(); ++i) moved = std::max(moved, (double)std::fabs(m.P()[e->offset + i] - p0[e->offset + i]));
    EXPECT_GT(moved, 1e-4) << n << " did not train";
  }
  std::vector<float> emb(cfg.vocab_size * cfg.hidden_size), alias(emb.size());
  out.read_f32("model.embed_tokens.weight", emb.data(), emb.size());
  out.read_f32("model.layers.2.embed_tokens.weight", alias.data(), alias.size());
  EXPECT_EQ(emb, alias);
  // Resume: weights, router biases and moments come back.
  model::Model m3(cfg, kern::Prec::F32, {0.01, 0.3});
  train::AdamW opt3(m3, {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f});
  EXPECT_EQ(train::load_checkpoint(dir, m3, opt3).step, 2);
  EXPECT_EQ(0, std::memcmp(m.P(), m3.P(), m.layout.total * sizeof(float)));
  EXPECT_EQ(m.buffers, m3.buffers);
  const double l1 = train::trainer_step(m, opt, {b}, 1e-2f, 0.f).loss, l3 = train::trainer_step(m3, opt3, {b}, 1e-2f, 0.f).loss;
  EXPECT_EQ(l1, l3);
}

// A checkpoint without the MTP layers (what transformers writes) trained with MTP: the layers
// start from random init, shared_head.head from lm_head, with a warning; and a weight > 0 on a
// config without MTP layers is refused naming the field.
TEST(MtpV3, FreshLayersFromACheckpointWithoutThem) {
  init_threads();
  const model::ModelConfig cfg = model::load_config_json(std::string(kCase) + "/model/config.json");
  model::ModelConfig c0 = cfg;
  c0.num_nextn_predict_layers = 0;
  model::Model plain(c0, kern::Prec::F32);
  model::load_hf_weights(plain, std::string(kCase) + "/model");
  test::TmpDir tmp("trex_mtp_fresh");
  model::save_hf_checkpoint(plain, tmp.str(), DType::F32);  // no model.layers.2.*
  model::Model m(cfg, kern::Prec::F32, {0.0, 0.5});
  model::load_hf_weights(m, tmp.str());
  const model::V3MtpParams& t = m.layout.mtp3[0];
  EXPECT_EQ(0, std::memcmp(m.P() + t.head, m.P() + m.layout.head, cfg.vocab_size * cfg.hidden_size * sizeof(float)));
  EXPECT_EQ(m.P()[t.enorm], 1.f);
  EXPECT_THROW(model::Model(c0, kern::Prec::F32, {0.0, 0.5}), UserError);
}

// A checkpoint whose MTP layer has no shared_head.head (some conversions omit it; vLLM reads it as
// lm_head): load_config_json sees that in the tensor names, the MTP head is lm_head's tensor (one
// tensor: the loss equals the untied model's with shared_head.head = lm_head, and lm_head's
// gradient is the sum of the two heads' gradients), a save writes it without shared_head.head, a
// run that keeps the MTP layer (weight 0) too, and the gradients pass a finite-difference check.
TEST(MtpV3, CheckpointWithoutSharedHeadTiesItToLmHead) {
  init_threads();
  const model::ModelConfig cfg = model::load_config_json(std::string(kCase) + "/model/config.json");
  EXPECT_FALSE(cfg.v3_mtp_head_tied);
  model::Model ref(cfg, kern::Prec::F32, {0.01, 0.3});
  model::load_hf_weights(ref, std::string(kCase) + "/model");
  const model::V3MtpParams& rt = ref.layout.mtp3[0];
  const int64_t Vd = cfg.vocab_size * cfg.hidden_size;
  std::memcpy(ref.P() + rt.head, ref.P() + ref.layout.head, Vd * sizeof(float));  // shared_head.head := lm_head
  ref.refresh_bf16();
  // The checkpoint without shared_head.head: a tied model with ref's tensors, saved.
  model::ModelConfig ct = cfg;
  ct.v3_mtp_head_tied = true;
  model::Model w(ct, kern::Prec::F32, {0.01, 0.3});
  for (const model::ParamEntry& e : w.layout.entries)
    std::memcpy(w.P() + e.offset, ref.P() + ref.layout.find(e.name)->offset, e.shape.numel() * sizeof(float));
  w.buffers = ref.buffers;
  EXPECT_GE(ref.layout.total - w.layout.total, Vd);  // (the layout aligns its tensors)
  test::TmpDir dir("trex_mtp_tied");
  model::save_hf_checkpoint(w, dir.str(), DType::F32);
  io::SafetensorsDir ck = io::SafetensorsDir::open(dir.str());
  EXPECT_FALSE(ck.find("model.layers.2.shared_head.head.weight"));
  EXPECT_TRUE(ck.find("model.layers.2.eh_proj.weight"));
  // Loading it.
  const model::ModelConfig cl = model::load_config_json(dir.file("config.json"));
  EXPECT_TRUE(cl.v3_mtp_head_tied);
  EXPECT_EQ(model::with_mtp(cl, 1).num_params() + Vd, model::with_mtp(cfg, 1).num_params());
  model::Model m(cl, kern::Prec::F32, {0.01, 0.3});
  model::load_hf_weights(m, dir.str());
  EXPECT_EQ(m.layout.mtp3[0].head, m.layout.head);
  EXPECT_FALSE(m.layout.find("model.layers.2.shared_head.head.weight"));
  std::vector<int32_t> ids(22), tg(22);
  for (int i = 0; i < 22; ++i) ids[i] = (i * 7 + 3) % 83, tg[i] = i % 6 == 5 ? -100 : (i * 5 + 1) % 83;
  const model::Batch b{2, 11, ids.data(), tg.data(), nullptr, nullptr};
  ref.zero_grads();
  m.zero_grads();
  const model::LossParts lr = ref.forward_backward(b, 1.f), lm = m.forward_backward(b, 1.f);
  EXPECT_NEAR(lm.loss, lr.loss, 1e-6 * std::abs(lr.loss));
  EXPECT_NEAR(lm.mtp, lr.mtp, 1e-6 * std::abs(lr.mtp));
  double num = 0, den = 0;
  for (int64_t i = 0; i < Vd; ++i) {
    const double want = (double)ref.G()[ref.layout.head + i] + ref.G()[rt.head + i];
    num += (m.G()[m.layout.head + i] - want) * (m.G()[m.layout.head + i] - want);
    den += want * want;
  }
  EXPECT_LT(std::sqrt(num / den), 1e-5);
  for (const model::ParamEntry& e : m.layout.entries) {  // every other tensor's gradient is ref's
    if (e.offset == m.layout.head) continue;
    const model::ParamEntry* r = ref.layout.find(e.name);
    double n2 = 0, d2 = 0;
    for (int64_t i = 0; i < e.shape.numel(); ++i) {
      const double a = m.G()[e.offset + i], c = ref.G()[r->offset + i];
      n2 += (a - c) * (a - c), d2 += c * c;
    }
    EXPECT_LE(std::sqrt(n2), 1e-5 * std::sqrt(d2) + 1e-12) << e.name;
  }
  // Saved back without it (a trained run's save and a weight-0 run's keep alike).
  test::TmpDir again("trex_mtp_tied2"), kept("trex_mtp_tied_kept");
  model::save_hf_checkpoint(m, again.str(), DType::F32);
  expect_same_tensors(dir.str(), again.str());
  expect_same_tensors(again.str(), dir.str());
  model::Model k(cl, kern::Prec::F32);
  model::load_hf_weights(k, dir.str());
  for (const model::KeptTensor& t : k.kept) EXPECT_EQ(t.name.find("shared_head.head"), std::string::npos);
  model::save_hf_checkpoint(k, kept.str(), DType::F32);
  expect_same_tensors(dir.str(), kept.str());
  expect_same_tensors(kept.str(), dir.str());
  // Finite differences through the tied head (and with a tied embedding as well).
  json j = trex::testing::tiny_v3_mtp(2);
  fd_check(j, 2, 13, false, 0.0, 0.6, true);
  j["tie_word_embeddings"] = true;
  fd_check(j, 2, 11, true, 0.0, 0.4, true);
}
