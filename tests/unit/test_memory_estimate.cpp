// The activation-memory estimate (train::activation_peak_bytes, the figure `trex train` checks
// at start-up and `trex bench step` prints) against the activation arena's measured peak
// (Model::peak_activation_bytes) after one forward_backward: tiny DeepSeek-V3 (a dense first
// layer, MLA with and without q_lora, MoE) and DeepSeek-V4 (hash / top-k MoE, CSA / HCA /
// sliding attention, hyper-connection streams, an MTP block) models with odd sizes, in fp32 and
// bf16, without recompute, with full recompute and with selective recompute of the MoE blocks.
// The estimate replays the engine's allocations on sizes alone, so on one rank it agrees to the
// byte; the check allows the 10% that issue 8 asks for
// and needs no floor in bytes (no fixed overhead is left out), and 1% on shapes that fill more
// than one 64 MiB arena block (PastOneArenaBlock). Bench-sized shapes are checked with
// `trex bench step` (BENCHMARKS.md).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "core/rng.h"
#include "model/model.h"
#include "tests/tiny_configs.h"
#include "parallel/dims.h"
#include "train/activation_estimate.h"
#include "train/preflight.h"
#include "train/run_config.h"

using namespace trex;
using nlohmann::json;

namespace {

struct Shape {
  int64_t B, T;
  double mtp;  // mtp_loss_weight
};

// One forward_backward under the training options o; returns the measured arena peak. seg: two
// documents a row.
size_t measured_peak(const model::ModelConfig& cfg, kern::Prec prec, const model::TrainOptions& o, const Shape& s,
                     bool seg) {
  model::Model m(cfg, prec, o);
  m.init_random(11);
  const int64_t N = s.B * s.T;
  std::vector<int32_t> ids(N), tg(N), sg(N);
  Rng r(5);
  for (int64_t i = 0; i < N; ++i) {
    ids[i] = (int32_t)(r.next_u64() % cfg.vocab_size);
    tg[i] = i % 7 == 3 ? -100 : (int32_t)(r.next_u64() % cfg.vocab_size);
    sg[i] = (int32_t)((i % s.T) < s.T / 2 ? 0 : 1);
  }
  m.forward_backward({s.B, s.T, ids.data(), tg.data(), nullptr, seg ? sg.data() : nullptr});
  return m.peak_activation_bytes();
}
size_t measured_peak(const model::ModelConfig& cfg, kern::Prec prec, model::Recompute rc, const Shape& s, bool seg) {
  return measured_peak(cfg, prec, {0.01, s.mtp, rc}, s, seg);
}

const char* rc_name(model::Recompute rc) {
  return rc == model::Recompute::Full ? "full" : rc == model::Recompute::Selective ? "selective" : "none";
}

// The estimate as the start-up check computes it, from a run config.
double preflight_estimate(const json& mj, kern::Prec prec, model::Recompute rc, const Shape& s) {
  json j = {{"model", mj},
            {"data", {{"seq_len", s.T}}},
            {"train",
             {{"batch_size", s.B},
              {"precision", prec == kern::Prec::BF16 ? "bf16" : "fp32"},
              {"recompute", rc_name(rc)},
              {"mtp_loss_weight", s.mtp}}}};
  return train::estimate_train_memory(train::parse_run_config(j, "run.toml"), 1).activations;
}

struct Mode {
  kern::Prec prec;
  model::Recompute rc;  // Selective: recompute_modules = ["moe"] (the default)
};
const std::vector<Mode> kAllModes = {{kern::Prec::F32, model::Recompute::None},
                                     {kern::Prec::F32, model::Recompute::Full},
                                     {kern::Prec::F32, model::Recompute::Selective},
                                     {kern::Prec::BF16, model::Recompute::None},
                                     {kern::Prec::BF16, model::Recompute::Full},
                                     {kern::Prec::BF16, model::Recompute::Selective}};

// packed: also a run with two documents a row (V4).
// tol: allowed relative error (issue 8: 10%).
void expect_estimate_matches(const json& mj, const Shape& s, const std::vector<Mode>& modes = kAllModes,
                             bool packed = true, double tol = 0.10) {
  const model::ModelConfig base = model::parse_config(mj, "tiny");
  const model::ModelConfig cfg = model::with_mtp(base, s.mtp > 0 ? base.num_nextn_predict_layers : 0);
  for (const Mode& mode : modes) {
    const kern::Prec prec = mode.prec;
    const model::Recompute rc = mode.rc;
    const std::string what = mj["model_type"].get<std::string>() + (prec == kern::Prec::BF16 ? " bf16" : " fp32") +
                             " recompute=" + rc_name(rc) + " B=" +
                             std::to_string(s.B) + " T=" + std::to_string(s.T);
    const double est = train::activation_peak_bytes(cfg, s.B, s.T, prec, rc);
    const size_t peak = measured_peak(cfg, prec, rc, s, false);
    std::printf("[memory estimate] %s: estimate %.0f measured %zu bytes (%+.2f%%)\n", what.c_str(), est, peak,
                100.0 * (est - (double)peak) / (double)peak);
    EXPECT_NEAR(est, (double)peak, tol * (double)peak) << what;
    EXPECT_EQ(preflight_estimate(mj, prec, rc, s), est) << what << ": the start-up check must use this estimate";
    if (cfg.is_v4() && packed) {  // packed rows attend fewer keys: the estimate stays an upper bound, still within 10%
      const size_t pk = measured_peak(cfg, prec, rc, s, true);
      EXPECT_LE((double)pk, est) << what << " (packed rows)";
      EXPECT_NEAR(est, (double)pk, tol * (double)pk) << what << " (packed rows)";
    }
  }
}

// hidden 36, 3 heads, vocab 97, 5 experts top-2, a dense first layer, q_lora.
json v3_a() {
  json m = trex::testing::tiny_v3();
  m["hidden_size"] = 36;
  m["vocab_size"] = 97;
  m["num_hidden_layers"] = 3;
  return m;
}

// hidden 44, 5 heads, vocab 211, 7 experts top-3 (groups off), plain q_proj, 2 shared experts.
json v3_b() {
  json m = trex::testing::tiny_v3();
  m["hidden_size"] = 44;
  m["num_attention_heads"] = 5;
  m["vocab_size"] = 211;
  m["num_hidden_layers"] = 4;
  m.erase("q_lora_rank");
  m["n_routed_experts"] = 7;
  m["num_experts_per_tok"] = 3;
  m["n_shared_experts"] = 2;
  m["intermediate_size"] = 61;
  m["moe_intermediate_size"] = 11;
  return m;
}

// hidden 36, 3 heads, vocab 97, 5 experts top-2; CSA / HCA / sliding, hash routing first, MTP.
json v4_a() {
  json m = trex::testing::tiny_v4();
  m["hidden_size"] = 36;
  m["vocab_size"] = 97;
  return m;
}

// hidden 44, 5 heads in 5 output groups, vocab 211, 7 experts top-3, 4 layers, 4 streams.
json v4_b() {
  json m = trex::testing::tiny_v4();
  m["hidden_size"] = 44;
  m["num_attention_heads"] = 5;
  m["o_groups"] = 5;
  m["vocab_size"] = 211;
  m["n_routed_experts"] = 7;
  m["num_experts_per_tok"] = 3;
  m["num_hidden_layers"] = 4;
  m["hc_mult"] = 4;
  m["index_topk"] = 4;
  m["layer_types"] = {"compressed_sparse_attention", "sliding_attention", "heavily_compressed_attention",
                      "compressed_sparse_attention"};
  m["mlp_layer_types"] = {"hash_moe", "moe", "moe", "hash_moe"};
  return m;
}

// Shapes with allocations past the arena's 64 MiB growth step, and the LM head workspace near its
// 32 MiB cap.
json v3_blocks() {
  json m = v3_b();
  m["hidden_size"] = 260;
  m["vocab_size"] = 4099;
  m["num_hidden_layers"] = 3;
  m["q_lora_rank"] = 67;
  m["kv_lora_rank"] = 61;
  m["qk_nope_head_dim"] = 24;
  m["qk_rope_head_dim"] = 8;
  m["v_head_dim"] = 20;
  m["intermediate_size"] = 517;
  m["moe_intermediate_size"] = 131;
  m["n_shared_experts"] = 1;
  return m;
}

json v4_blocks() {
  json m = v4_b();
  m["hidden_size"] = 132;
  m["vocab_size"] = 2003;
  m["head_dim"] = 30;  // 12 rotated dims
  m["index_head_dim"] = 16;
  m["index_topk"] = 9;
  m["sliding_window"] = 33;
  m["moe_intermediate_size"] = 67;
  return m;
}

}  // namespace

TEST(MemoryEstimate, TinyV3) {
  expect_estimate_matches(v3_a(), {2, 13, 0});
  expect_estimate_matches(v3_b(), {3, 37, 0});
}

// DeepSeek-V3 MTP layers (model/mtp_v3.h): two depths, the second one's layer MoE.
TEST(MemoryEstimate, TinyV3WithMtp) {
  json m = v3_a();
  m["num_nextn_predict_layers"] = 2;
  expect_estimate_matches(m, {2, 13, 0.3});
  expect_estimate_matches(m, {3, 37, 0.3});
}

TEST(MemoryEstimate, TinyV4WithMtp) {
  expect_estimate_matches(v4_a(), {2, 13, 0.3});
  expect_estimate_matches(v4_b(), {3, 37, 0.3});
}

TEST(MemoryEstimate, TinyV4WithoutMtp) { expect_estimate_matches(v4_b(), {2, 37, 0}); }

// DeepSeek-V3.2 (the indexer's selection, the key lists, the sparse attention's padded rows), with
// an MTP layer, without and with the indexer loss (both stages) and recall only: to the byte on
// one document a row; packed rows (two documents a row) attend fewer keys, below the estimate.
TEST(MemoryEstimate, TinyV32) {
  json mj = trex::testing::tiny_v32();
  mj["num_nextn_predict_layers"] = 1;
  const model::ModelConfig cfg = model::with_mtp(model::parse_config(mj, "tiny"), 1);
  struct Ix {
    double w;
    model::IndexerStage st;
    bool recall;
  };
  for (const Ix& ix : {Ix{0, model::IndexerStage::Sparse, false}, Ix{0.5, model::IndexerStage::Sparse, false},
                       Ix{0.5, model::IndexerStage::DenseWarmup, false}, Ix{0, model::IndexerStage::Sparse, true}})
    for (const Mode& mode : kAllModes)
      for (bool seg : {false, true}) {
        const int64_t B = 2, T = 23;
        const double mtp = 0.3;
        const model::TrainOptions o{0.01, mtp, mode.rc, ix.w, ix.st, ix.recall};
        const double peak = (double)measured_peak(cfg, mode.prec, o, {B, T, mtp}, seg);
        const double est = train::activation_peak_bytes(cfg, B, T, mode.prec, mode.rc, 1, 1, false, {}, o);
        const std::string what = std::string(mode.prec == kern::Prec::BF16 ? "bf16" : "fp32") +
                                 " " + rc_name(mode.rc) + " ix " +
                                 std::to_string(ix.w) + (ix.st == model::IndexerStage::DenseWarmup ? " dense" : "") +
                                 (ix.recall ? " recall" : "") + (seg ? " packed" : "");
        if (seg) EXPECT_LE(peak, est) << what;
        else EXPECT_EQ(est, peak) << what;
      }
}

TEST(MemoryEstimate, PastOneArenaBlock) {
  // Two modes each to keep the test short; the tiny cases cover all six. The skipped block tails
  // are 0.6-4.5% of these peaks (an estimate without them passes 10%), so 1% here: at bench
  // shapes they reach 15% (BENCHMARKS.md).
  const std::vector<Mode> modes = {{kern::Prec::BF16, model::Recompute::None}, {kern::Prec::F32, model::Recompute::Full}};
  expect_estimate_matches(v3_blocks(), {3, 509, 0}, modes, false, 0.01);
  expect_estimate_matches(v4_blocks(), {2, 509, 0.3}, modes, false, 0.01);
}

// Recompute keeps one layer's working set instead of all of them: the estimate falls with it,
// and grows with the tokens of a micro-batch.
TEST(MemoryEstimate, Monotone) {
  const model::ModelConfig c = model::parse_config(v3_b(), "tiny");
  const double none = train::activation_peak_bytes(c, 3, 37, kern::Prec::BF16, model::Recompute::None);
  const double full = train::activation_peak_bytes(c, 3, 37, kern::Prec::BF16, model::Recompute::Full);
  const double selective = train::activation_peak_bytes(c, 3, 37, kern::Prec::BF16, model::Recompute::Selective);
  EXPECT_LT(full, none);
  EXPECT_LT(selective, none);
  EXPECT_GT(train::activation_peak_bytes(c, 3, 74, kern::Prec::BF16, model::Recompute::None), none);
}

// Pipeline stages: one stage_forward_backward of each stage of a model cut into stages of every
// kind (a first or last stage without layers, a middle one), each holding only its tensors as
// `trex train` builds it, against the estimate for that stage; and the start-up check takes the
// largest stage, below the whole model's figure.
TEST(MemoryEstimate, PipelineStages) {
  struct Case {
    json mj;
    int64_t B, T;
    double mtp;
  };
  for (const Case& k : {Case{v3_b(), 3, 37, 0}, Case{v4_b(), 2, 37, 0.3}}) {
    const model::ModelConfig base = model::parse_config(k.mj, "tiny");
    const model::ModelConfig cfg = model::with_mtp(base, k.mtp > 0 ? base.num_nextn_predict_layers : 0);
    const int64_t L = cfg.num_hidden_layers, N = k.B * k.T;
    for (const std::vector<std::pair<int64_t, int64_t>>& p :
         std::vector<std::vector<std::pair<int64_t, int64_t>>>{{{0, 1}, {1, L}}, {{0, 0}, {0, L}}, {{0, L}, {L, L}},
                                                                {{0, 1}, {1, 2}, {2, L}}})
      for (size_t si = 0; si < p.size(); ++si)
        for (const Mode& mode : {Mode{kern::Prec::BF16, model::Recompute::None},
                                 Mode{kern::Prec::F32, model::Recompute::Full},
                                 Mode{kern::Prec::BF16, model::Recompute::Selective}}) {
          const model::StageShard st{p[si].first, p[si].second, si == 0, si + 1 == p.size(), 16};
          const std::string what = cfg.model_type + " stage [" + std::to_string(st.l0) + ", " + std::to_string(st.l1) +
                                   ") of " + std::to_string(p.size()) + (mode.prec == kern::Prec::BF16 ? " bf16" : " fp32") +
                                   " recompute=" + rc_name(mode.rc);
          model::Model m(cfg, mode.prec, {0.01, k.mtp, mode.rc}, {}, st);
          m.init_random(11);
          m.set_pipeline_stage({st.l0, st.l1, st.first, st.last});
          std::vector<int32_t> ids(N), tg(N);
          Rng r(5);
          for (int64_t i = 0; i < N; ++i)
            ids[i] = (int32_t)(r.next_u64() % cfg.vocab_size), tg[i] = (int32_t)(r.next_u64() % cfg.vocab_size);
          std::vector<float> x_in(m.stage_io_floats(N), 0.25f), dy(m.stage_io_floats(N), 1e-3f),
              dx_in(m.stage_io_floats(N));
          model::StageIO io;
          if (!st.first) io.x_in = x_in.data(), io.dx_in = dx_in.data();
          if (!st.last) io.dy = dy.data();
          m.stage_forward_backward({k.B, k.T, ids.data(), tg.data(), nullptr, nullptr}, io, 1.f);
          const double peak = (double)m.peak_activation_bytes();
          const double est = train::activation_peak_bytes(cfg, k.B, k.T, mode.prec, mode.rc, 1, 1, false, st);
          std::printf("[memory estimate] %s: estimate %.0f measured %.0f bytes (%+.2f%%)\n", what.c_str(), est, peak,
                      100.0 * (est - peak) / peak);
          EXPECT_NEAR(est, peak, 0.10 * peak) << what;
        }
    // The start-up check under pp 2: the larger stage's figure, below the whole model's.
    json j = {{"model", k.mj},
              {"data", {{"seq_len", k.T}}},
              {"train", {{"batch_size", k.B}, {"precision", "bf16"}, {"mtp_loss_weight", k.mtp}}},
              {"parallel", {{"pp", 2}}}};
    const train::RunConfig rc = train::parse_run_config(j, "run.toml");
    parallel::ParallelDims d;
    d.pp = 2;
    double want = 0;
    for (int s = 0; s < 2; ++s) {
      const int64_t l0 = d.stage_first_layer(L, s);
      const model::StageShard st{l0, l0 + d.stage_layers(L)[(size_t)s], s == 0, s == 1, 16};
      want = std::max(want, train::activation_peak_bytes(cfg, k.B, k.T, kern::Prec::BF16, model::Recompute::None,
                                                         1, 1, false, st));
    }
    const double got = train::estimate_train_memory(rc, 2).activations;
    EXPECT_EQ(got, want) << cfg.model_type;
    EXPECT_LT(got, train::activation_peak_bytes(cfg, k.B, k.T, kern::Prec::BF16, model::Recompute::None))
        << cfg.model_type;
  }
}
