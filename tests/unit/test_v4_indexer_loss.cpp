// The DeepSeek-V4 CSA indexer's KL loss (model/v4_indexer.h, [train] indexer_loss_weight /
// indexer_stage): config errors; the indexer's gradients against a central finite difference of
// the loss (the difference taken in double), both stages, compress rates 3 and 5, an odd top-k,
// packed rows and full recompute; the detach (the sparse stage's model gradients equal the
// weight-0 run's bit for bit); the dense warm-up leaves every other tensor and the router biases
// bit-identical over optimizer steps; HCA / sliding layers have no indexer and stay as they are.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include "core/error.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "model/checkpoint.h"
#include "model/model.h"
#include "tests/tiny_configs.h"
#include "tests/unit/fd_check.h"
#include "train/activation_estimate.h"
#include "train/optimizer.h"
#include "train/preflight.h"
#include "train/run_config.h"
#include "train/trainer.h"

using namespace trex;
using nlohmann::json;

namespace {

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
bool is_indexer(const std::string& name) { return name.find(".compressor.indexer.") != std::string::npos; }
constexpr const char* kCsa = "compressed_sparse_attention";
constexpr const char* kHca = "heavily_compressed_attention";
constexpr const char* kSwa = "sliding_attention";

std::string run_error(json model, json train, json parallel = json::object()) {
  json j = {{"model", std::move(model)}, {"train", std::move(train)}};
  if (!parallel.empty()) j["parallel"] = parallel;
  try {
    train::parse_run_config(j, "run.toml");
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

// tiny_v4 with two CSA layers of rate m (index_topk 3) around an HCA layer.
json v4_json(int64_t m) {
  json j = trex::testing::tiny_v4();
  j["layer_types"] = {kCsa, kHca, kCsa};
  j["compress_rates"] = {{kCsa, m}, {kHca, 7}};
  j["index_topk"] = 3;
  return j;
}

model::TrainOptions opts(double w, model::IndexerStage st, model::Recompute rc = model::Recompute::None) {
  return {0.01, 0.0, rc, w, st};
}

TEST(V4IndexerLoss, ConfigErrors) {
  const train::RunConfig w = train::parse_run_config(
      {{"model", v4_json(3)}, {"train", {{"indexer_loss_weight", 0.5}, {"indexer_stage", "dense_warmup"}}}},
      "run.toml");
  EXPECT_EQ(w.train.indexer_loss_weight, 0.5);
  EXPECT_EQ(w.train.indexer_stage, model::IndexerStage::DenseWarmup);
  json no_csa = trex::testing::tiny_v4();
  no_csa["layer_types"] = {kHca, kSwa, kHca};
  std::string e = run_error(no_csa, {{"indexer_loss_weight", 1}});
  EXPECT_TRUE(has(e, "train.indexer_loss_weight") && has(e, "layer_types")) << e;
  e = run_error(v4_json(3), {{"indexer_loss_weight", 1}}, {{"tp", 3}});
  EXPECT_TRUE(has(e, "parallel.tp") && has(e, "indexer_loss_weight")) << e;
  try {  // the model refuses it on its own too
    model::Model m(model::parse_config(no_csa, "t"), kern::Prec::F32, opts(1.0, model::IndexerStage::Sparse));
    ADD_FAILURE() << "no error";
  } catch (const UserError& x) {
    EXPECT_TRUE(has(x.what(), "indexer_loss_weight")) << x.what();
  }
}

// The gradient along a random unit direction of each tensor against a central finite difference
// of the loss it belongs to: the indexer's tensors, weight x the indexer loss; every other tensor,
// the LM loss (the indexer reads the attention and its inputs detached). Dense warm-up: the other
// tensors' gradients are 0 and they are frozen.
void fd_check(model::IndexerStage stage, int64_t m, int64_t B, int64_t T, bool packed, model::Recompute rc) {
  init_threads();
  const model::ModelConfig cfg = model::parse_config(v4_json(m), "test config");
  const double w = 0.7;
  model::Model mod(cfg, kern::Prec::F32, opts(w, stage, rc));
  mod.init_random(17);
  trex::testing::perturb_vectors(mod, 4);
  const trex::testing::FdData data = trex::testing::fd_data(B, T, cfg.vocab_size, 11);
  const model::Batch b = data.batch(packed);
  mod.zero_grads();
  const model::LossParts lp = mod.forward_backward(b, 1.f);
  ASSERT_TRUE(std::isfinite(lp.loss));
  EXPECT_GT(lp.indexer, 0.0);
  EXPECT_NEAR(lp.loss, lp.ce + lp.aux + w * lp.indexer, 1e-12 * std::abs(lp.loss));
  EXPECT_GT(lp.indexer_recall, 0.0);
  EXPECT_LE(lp.indexer_recall, cfg.indexer_layers() * (1 + 1e-6));
  const bool dense = stage == model::IndexerStage::DenseWarmup;
  const trex::testing::IndexerFd f = trex::testing::fd_check_indexer_split(mod, b, w, dense, is_indexer);
  std::printf("[v4 indexer fd] %d tensors checked (%d indexer), %d at a kink checked one-sided\n", f.checked, f.indexer,
              f.kinks);
  EXPECT_GE(f.indexer, (int)(5 * cfg.indexer_layers()));  // of the 6 per layer
  EXPECT_LE(f.kinks, f.checked / 4);
}

TEST(V4IndexerLoss, FiniteDifferenceSparse) { fd_check(model::IndexerStage::Sparse, 3, 2, 29, false, model::Recompute::None); }
TEST(V4IndexerLoss, FiniteDifferenceSparsePackedRecompute) {
  fd_check(model::IndexerStage::Sparse, 5, 1, 47, true, model::Recompute::Full);
}
TEST(V4IndexerLoss, FiniteDifferenceDenseWarmup) {
  fd_check(model::IndexerStage::DenseWarmup, 5, 2, 31, false, model::Recompute::None);
}
TEST(V4IndexerLoss, FiniteDifferenceDenseWarmupPacked) {
  fd_check(model::IndexerStage::DenseWarmup, 3, 1, 37, true, model::Recompute::None);
}

// The sparse stage's LM loss and every non-indexer gradient are those of weight 0 bit for bit
// (the indexer's input and the attention it reads are detached); the indexer gets a gradient.
TEST(V4IndexerLoss, SparseStageDetachesTheModel) {
  init_threads();
  const model::ModelConfig cfg = model::parse_config(v4_json(3), "test config");
  model::Model off(cfg, kern::Prec::F32, opts(0, model::IndexerStage::Sparse));
  model::Model on(cfg, kern::Prec::F32, opts(0.9, model::IndexerStage::Sparse));
  off.init_random(3), on.init_random(3);
  trex::testing::perturb_vectors(off, 2), trex::testing::perturb_vectors(on, 2);
  const trex::testing::FdData data = trex::testing::fd_data(2, 34, cfg.vocab_size, 5);
  for (bool packed : {false, true}) {
    off.zero_grads(), on.zero_grads();
    const model::LossParts a = off.forward_backward(data.batch(packed), 0.6f);
    const model::LossParts c = on.forward_backward(data.batch(packed), 0.6f);
    EXPECT_EQ(a.indexer, 0.0);
    EXPECT_EQ(a.ce, c.ce);
    EXPECT_EQ(a.aux, c.aux);
    EXPECT_GT(c.indexer, 0.0);
    for (const model::ParamEntry& e : off.layout.entries) {
      const bool ix = is_indexer(e.name);
      EXPECT_EQ(e.frozen, ix) << e.name;
      double diff = 0, gsum = 0;
      for (int64_t i = e.offset; i < e.offset + e.shape.numel(); ++i) {
        diff += std::memcmp(off.G() + i, on.G() + i, sizeof(float)) != 0;
        gsum += std::abs(on.G()[i]);
      }
      if (ix) EXPECT_GT(gsum, 0.0) << e.name;
      else EXPECT_EQ(diff, 0.0) << e.name;
    }
  }
}

// The dense warm-up: after optimizer steps (weight decay on) every tensor but the indexer's and
// the router biases are bit-identical; the indexer moved and its loss went down.
TEST(V4IndexerLoss, DenseWarmupTrainsOnlyTheIndexer) {
  init_threads();
  const model::ModelConfig cfg = model::parse_config(v4_json(5), "test config");
  model::Model m(cfg, kern::Prec::F32, opts(1.0, model::IndexerStage::DenseWarmup));
  m.init_random(9);
  trex::testing::perturb_vectors(m, 6);
  const std::vector<float> p0(m.P(), m.P() + m.layout.total);
  const std::vector<float> b0 = m.buffers;
  train::AdamW opt(m, train::AdamWConfig{});
  const trex::testing::FdData data = trex::testing::fd_data(2, 41, cfg.vocab_size, 8);
  double first = 0, last = 0;
  for (int s = 0; s < 6; ++s) {
    const train::StepStats st = train::trainer_step(m, opt, {data.batch(s % 2 == 1)}, 3e-3f, 0.01f);
    ASSERT_FALSE(st.skipped);
    EXPECT_GT(st.indexer_recall, 0.0);
    EXPECT_LE(st.indexer_recall, 1.0 + 1e-9);
    if (s == 0) first = st.indexer;
    if (s == 4) last = st.indexer;  // the same (unpacked) batch as step 0
  }
  EXPECT_LT(last, first);
  EXPECT_EQ(m.buffers, b0);
  for (const model::ParamEntry& e : m.layout.entries) {
    const bool same = std::memcmp(m.P() + e.offset, p0.data() + e.offset, e.shape.numel() * sizeof(float)) == 0;
    EXPECT_EQ(same, !is_indexer(e.name)) << e.name;
  }
}

// The dense warm-up's attention: every visible compressed entry, so with index_topk >= every
// entry count the sparse and the dense stage attend the same keys and give the same LM loss.
TEST(V4IndexerLoss, DenseWarmupAttendsEveryVisibleEntry) {
  init_threads();
  json j = v4_json(3);
  j["index_topk"] = 64;
  const model::ModelConfig cfg = model::parse_config(j, "test config");
  model::Model a(cfg, kern::Prec::F32, opts(0.5, model::IndexerStage::Sparse));
  model::Model d(cfg, kern::Prec::F32, opts(0.5, model::IndexerStage::DenseWarmup));
  a.init_random(4), d.init_random(4);
  const trex::testing::FdData data = trex::testing::fd_data(2, 40, cfg.vocab_size, 3);
  for (bool packed : {false, true}) {
    const model::LossParts x = a.forward(data.batch(packed)), y = d.forward(data.batch(packed));
    EXPECT_EQ(x.ce, y.ce);
    EXPECT_EQ(x.indexer, y.indexer);
    EXPECT_NEAR(x.indexer_recall, (double)cfg.indexer_layers(), 1e-12);  // everything selected
  }
}

// [train] indexer_recall with weight 0: the indexer loss and recall are reported (the sparse
// stage's, as a run with the loss computes them), while the loss, every gradient and the frozen
// flags stay those of the run without it, bit for bit. DeepSeek-V3.2 and V4.
TEST(V4IndexerLoss, RecallWithoutTheLoss) {
  init_threads();
  json v32 = trex::testing::tiny_v32();
  v32["initializer_range"] = 0.3;
  for (const json& j : {v4_json(3), v32}) {
    const model::ModelConfig cfg = model::parse_config(j, "test config");
    model::TrainOptions plain = opts(0, model::IndexerStage::Sparse), rec = plain, with = opts(0.5, model::IndexerStage::Sparse);
    rec.indexer_recall = true;
    model::Model a(cfg, kern::Prec::F32, plain), r(cfg, kern::Prec::F32, rec), w(cfg, kern::Prec::F32, with);
    a.init_random(6), r.init_random(6), w.init_random(6);
    const trex::testing::FdData data = trex::testing::fd_data(2, 31, cfg.vocab_size, 2);
    for (bool packed : {false, true}) {
      a.zero_grads(), r.zero_grads();
      const model::LossParts x = a.forward_backward(data.batch(packed), 0.8f);
      const model::LossParts y = r.forward_backward(data.batch(packed), 0.8f);
      const model::LossParts z = w.forward(data.batch(packed));
      EXPECT_EQ(x.loss, y.loss);
      EXPECT_EQ(x.indexer, 0.0);
      EXPECT_EQ(y.indexer, z.indexer) << cfg.model_type;
      EXPECT_EQ(y.indexer_recall, z.indexer_recall) << cfg.model_type;
      EXPECT_GT(y.indexer_recall, 0.0);
      EXPECT_EQ(std::memcmp(a.G(), r.G(), a.layout.total * sizeof(float)), 0) << cfg.model_type;
    }
    for (size_t i = 0; i < a.layout.entries.size(); ++i) EXPECT_EQ(a.layout.entries[i].frozen, r.layout.entries[i].frozen);
  }
  EXPECT_EQ(train::parse_run_config({{"model", v4_json(3)}, {"train", {{"indexer_recall", true}}}}, "run.toml")
                .train.indexer_recall,
            true);
  json no_csa = trex::testing::tiny_v4();
  no_csa["layer_types"] = {kHca, kSwa, kHca};
  const std::string e = run_error(no_csa, {{"indexer_recall", true}});
  EXPECT_TRUE(has(e, "train.indexer_recall")) << e;
}

// The start-up memory estimate counts the indexer loss's state (the kept pairs, the recomputed
// projections of its forward and backward, the dense warm-up's attention over every visible
// entry): against the arena's measured peak, both stages and the recall alone, fp32 and bf16,
// without and with full recompute; the start-up check uses it.
TEST(V4IndexerLoss, MemoryEstimateCountsTheLoss) {
  init_threads();
  json j = v4_json(3);
  j["index_topk"] = 2;  // the dense warm-up attends many more entries than the top-k
  const model::ModelConfig cfg = model::parse_config(j, "test config");
  const int64_t B = 2, T = 61;
  const trex::testing::FdData data = trex::testing::fd_data(B, T, cfg.vocab_size, 3);
  model::TrainOptions recall = opts(0, model::IndexerStage::Sparse);
  recall.indexer_recall = true;
  for (kern::Prec prec : {kern::Prec::F32, kern::Prec::BF16})
    for (model::Recompute rc : {model::Recompute::None, model::Recompute::Full}) {
      const double plain = train::activation_peak_bytes(cfg, B, T, prec, rc);
      for (model::TrainOptions o : {opts(0.5, model::IndexerStage::Sparse), opts(0.5, model::IndexerStage::DenseWarmup),
                                    recall}) {
        o.recompute = rc;
        o.aux_loss_alpha = 0.01;
        model::Model m(cfg, prec, o);
        m.init_random(2);
        m.forward_backward(data.batch(false));
        const double est = train::activation_peak_bytes(cfg, B, T, prec, rc, 1, 1, false, {}, o);
        const double got = (double)m.peak_activation_bytes();
        std::printf("[v4 indexer memory] weight %.1f dense %d recall %d prec %d recompute %d: estimate %.0f measured "
                    "%.0f (without the loss %.0f)\n",
                    o.indexer_loss_weight, (int)o.dense_warmup(), (int)o.indexer_recall, (int)prec, (int)rc, est, got,
                    plain);
        EXPECT_NEAR(est, got, 0.02 * got);
        EXPECT_GT(est, plain);
        const json rj = {{"model", j},
                         {"data", {{"seq_len", T}}},
                         {"train",
                          {{"batch_size", B},
                           {"precision", prec == kern::Prec::BF16 ? "bf16" : "fp32"},
                           {"recompute", rc == model::Recompute::Full ? "full" : "none"},
                           {"aux_loss_alpha", 0.01},
                           {"indexer_loss_weight", o.indexer_loss_weight},
                           {"indexer_stage", o.dense_warmup() ? "dense_warmup" : "sparse"},
                           {"indexer_recall", o.indexer_recall}}}};
        EXPECT_EQ(train::estimate_train_memory(train::parse_run_config(rj, "run.toml"), 1).activations, est);
      }
    }
}

// The indexer loss and recall of the committed reference cases (make_dumps_v4idx.py), at step 0
// and over the 10 AdamW steps (Parity.* checks the total loss, every gradient and the steps' losses).
TEST(V4IndexerLoss, LossAndRecallMatchTheReference) {
  init_threads();
  for (const std::string name : {"v4idx_sparse_odd", "v4idx_dense_rate5"}) {
    const std::string dir = std::string("tests/reference/data/") + name;
    const json exp = json::parse(std::ifstream(dir + "/expected.json"));
    const json bj = json::parse(std::ifstream(dir + "/batch.json"));
    const json& t = exp["train"];
    const model::ModelConfig cfg = model::load_config_json(dir + "/model/config.json");
    const bool dense = t["indexer_stage"] == "dense_warmup";
    model::Model m(cfg, kern::Prec::F32,
                   {t["aux_loss_alpha"].get<double>(), 0.0, model::Recompute::None, t["indexer_loss_weight"].get<double>(),
                    dense ? model::IndexerStage::DenseWarmup : model::IndexerStage::Sparse});
    model::load_hf_weights(m, dir + "/model");
    const int64_t B = bj["input_ids"].size(), T = bj["input_ids"][0].size();
    std::vector<int32_t> ids, labels;
    for (const auto& r : bj["input_ids"])
      for (const auto& v : r) ids.push_back(v.get<int32_t>());
    for (const auto& r : bj["labels"])
      for (const auto& v : r) labels.push_back(v.get<int32_t>());
    const std::vector<int32_t> tg = model::shift_labels(labels, B, T);
    const model::Batch b{B, T, ids.data(), tg.data(), nullptr, nullptr};
    const double L = (double)cfg.indexer_layers();
    const model::LossParts lp = m.forward(b);
    EXPECT_NEAR(lp.indexer, exp["indexer_loss"].get<double>(), 1e-5 * exp["indexer_loss"].get<double>()) << name;
    EXPECT_NEAR(lp.indexer_recall / L, exp["indexer_recall"].get<double>(), 1e-5) << name;
    train::AdamW opt(m, {t["lr"].get<float>(), t["beta1"].get<float>(), t["beta2"].get<float>(), t["eps"].get<float>(),
                         t["weight_decay"].get<float>(), t["clip_grad_norm"].get<float>()});
    for (int s = 0; s < t["steps"].get<int>(); ++s) {
      const train::StepStats st =
          train::trainer_step(m, opt, {b}, t["lr"].get<float>(), t["bias_update_gamma"].get<float>());
      const double ri = exp["indexer_losses"][s].get<double>(), rr = exp["indexer_recalls"][s].get<double>();
      EXPECT_NEAR(st.indexer, ri, 1e-4 * ri) << name << " step " << s;
      // The dense warm-up's top-k feeds only the recall, and its near-ties are not screened.
      EXPECT_NEAR(st.indexer_recall, rr, dense && s > 0 ? 1e-2 : 1e-4) << name << " step " << s;
    }
  }
}

}  // namespace
