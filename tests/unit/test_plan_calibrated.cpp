// The planner's calibrated op classes (issue 7): the DeepSeek-V4 attention core and the CSA
// indexer run at their own efficiencies (`sparse_attention`, `indexer`; unset = `attention`), the
// indexer has no backward, the optimizer step runs at the `optimizer` share of memory bandwidth,
// and on cpu-this every saved activation takes 4 bytes (trex's CPU engine keeps them in f32).
// Checked on a DeepSeek-V4 config with odd sizes and on an MLA model, against sums written here
// from the architecture's own per-layer figures.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include "plan/calibration.h"
#include "plan/memory.h"
#include "plan/planner.h"
#include "plan/spec.h"

using namespace trex;
using namespace trex::plan;

namespace {

// Odd sizes: CSA rate 3, HCA rate 7, window 11, 5 layers of every kind, 3 streams, no MTP.
model::ModelConfig odd_v4() {
  nlohmann::json j = {
      {"model_type", "deepseek_v4"}, {"vocab_size", 777}, {"hidden_size", 120}, {"num_hidden_layers", 5},
      {"num_attention_heads", 5}, {"head_dim", 24}, {"qk_rope_head_dim", 8}, {"q_lora_rank", 40},
      {"o_groups", 5}, {"o_lora_rank", 18}, {"n_routed_experts", 7}, {"n_shared_experts", 1},
      {"num_experts_per_tok", 3}, {"moe_intermediate_size", 30}, {"sliding_window", 11},
      {"compress_rates", {{"compressed_sparse_attention", 3}, {"heavily_compressed_attention", 7}}},
      {"layer_types", {"compressed_sparse_attention", "sliding_attention", "heavily_compressed_attention",
                       "compressed_sparse_attention", "heavily_compressed_attention"}},
      {"mlp_layer_types", {"moe", "hash_moe", "moe", "moe", "moe"}},
      {"index_n_heads", 3}, {"index_head_dim", 16}, {"index_topk", 5}, {"hc_mult", 3},
      {"num_nextn_predict_layers", 0}};
  return model::parse_config(j, "odd-v4");
}

Calibration calibration(nlohmann::json eff) {
  nlohmann::json j = {{"version", 1},
                      {"peak", {{"bf16_gflops", 150.0}}},
                      {"memory", {{"gb", 64.0}, {"bandwidth_gbs", 20.0}}},
                      {"efficiency", eff}};
  return parse_calibration(j, "cal.json");
}

Layout one_device(int64_t seq) {
  Layout l;
  l.dp = 1;
  l.mbs = 1;
  l.gbs = 1;
  l.seq = seq;
  return l;
}

}  // namespace

TEST(PlanCalibrated, V4AttentionClassesRunAtTheirOwnEfficiencies) {
  const ArchModel a = arch_from_config(odd_v4(), "odd-v4");
  const int64_t T = 97;
  const ClusterSpec s = cpu_spec_from_calibration(
      calibration({{"gemm", 0.5}, {"attention", 0.4}, {"sparse_attention", 0.07}, {"indexer", 0.03}}));
  ASSERT_DOUBLE_EQ(s.eff.sparse_attention, 0.07);
  ASSERT_DOUBLE_EQ(s.eff.indexer, 0.03);
  double core = 0, idx = 0, fwd_only = 0;
  for (const LayerCost& L : a.layers) {
    const double i = indexer_fwd_flops(L.attn, T);
    core += attn_core_fwd_flops(L.attn, T) - i;
    idx += i;
    fwd_only += i / (s.peak_bf16 * 0.03) + 2 * L.fwd_only_matmul_params / (s.peak_bf16 * 0.5);
  }
  ASSERT_GT(idx, 0);
  const StepTime t = plan_time(a, s, one_device(T));
  const double want = T * (core / (s.peak_bf16 * 0.07) + idx / (s.peak_bf16 * 0.03));
  EXPECT_NEAR(t.attention, want, 1e-9 * want);
  // The indexer's scoring and projections run forward only: the backward is twice the rest, the
  // routed experts' GEMMs charged at their own backward shapes (plan/gemm.h).
  EXPECT_NEAR(t.bwd, 2 * (t.fwd - T * fwd_only) + t.experts_bwd - 2 * t.experts, 1e-9 * t.bwd);

  // Unset keys fall back to `attention` (the GPU specs carry none).
  const ClusterSpec d = cpu_spec_from_calibration(calibration({{"gemm", 0.5}, {"attention", 0.4}}));
  const StepTime td = plan_time(a, d, one_device(T));
  const double want_d = T * (core + idx) / (d.peak_bf16 * 0.4);
  EXPECT_NEAR(td.attention, want_d, 1e-9 * want_d);
}

TEST(PlanCalibrated, MlaIgnoresTheSparseKeys) {
  const ArchModel a = arch_from_config(deepseek_v3_config(), "deepseek-v3");
  const ClusterSpec s1 = cpu_spec_from_calibration(calibration({{"attention", 0.4}}));
  const ClusterSpec s2 = cpu_spec_from_calibration(calibration({{"attention", 0.4}, {"sparse_attention", 0.01}, {"indexer", 0.01}}));
  const StepTime t1 = plan_time(a, s1, one_device(1000)), t2 = plan_time(a, s2, one_device(1000));
  EXPECT_DOUBLE_EQ(t1.attention, t2.attention);
  EXPECT_DOUBLE_EQ(t1.bwd, 2 * t1.fwd);  // no forward-only work in V3
}

TEST(PlanCalibrated, OptimizerRunsAtItsShareOfBandwidth) {
  const ArchModel a = arch_from_config(odd_v4(), "odd-v4");
  const ClusterSpec s = cpu_spec_from_calibration(calibration({{"memory", 0.8}, {"optimizer", 0.2}}));
  const StepTime t = plan_time(a, s, one_device(64));
  // f32 grad, master, 2 moments read; master, 2 moments, bf16 copy written: 30 bytes a parameter;
  // and the f32 gradient zeroed for the next step: 4 more.
  EXPECT_NEAR(t.optimizer, a.total_params() * 34 / (20e9 * 0.2), 1e-9 * t.optimizer);
  const ClusterSpec m = cpu_spec_from_calibration(calibration({{"memory", 0.8}}));
  EXPECT_NEAR(plan_time(a, m, one_device(64)).optimizer, a.total_params() * 34 / (20e9 * 0.8), 1e-9 * t.optimizer);
}

TEST(PlanCalibrated, GradientZeroingCoversTheWholeBufferUpToZero2) {
  // dp 4: AdamW runs on a quarter from ZeRO-1 on; the zeroing writes every local gradient up to
  // ZeRO-2 (the backward writes all of them) and only the shard under ZeRO-3.
  const ArchModel a = arch_from_config(odd_v4(), "odd-v4");
  const ClusterSpec s = cpu_spec_from_calibration(calibration({{"memory", 0.8}, {"optimizer", 0.5}}));
  const double P = (double)a.total_params(), bw = 20e9 * 0.5;
  for (int zero : {1, 2, 3}) {
    Layout l = one_device(64);
    l.dp = 4, l.gbs = 4, l.zero = zero;
    validate_layout(l, a, 4);
    const double zeroed = zero >= 3 ? P / 4 : P;
    EXPECT_NEAR(plan_time(a, s, l).optimizer, (P / 4 * 30 + zeroed * 4) / bw, 1e-6 * P * 34 / bw) << "zero " << zero;
  }
}

TEST(PlanCalibrated, CpuThisActivationsAreF32) {
  const ArchModel a = arch_from_config(odd_v4(), "odd-v4");
  const ClusterSpec s = cpu_spec_from_calibration(calibration(nlohmann::json::object()));
  EXPECT_DOUBLE_EQ(s.activation_bytes, 4);
  const LayerCost& L = a.layers[0];
  double elems = 0, bf16_run = 0;
  for (const SavedTensor& t : L.saved) {
    elems += t.elems;
    bf16_run += t.elems * t.bytes;
  }
  EXPECT_DOUBLE_EQ(saved_bytes_per_token(L, Recompute::None, false, 1.0, 4), 4 * elems);
  EXPECT_DOUBLE_EQ(saved_bytes_per_token(L, Recompute::None, false), bf16_run);
  EXPECT_DOUBLE_EQ(saved_bytes_per_token(L, Recompute::Full, false, 1.0, 4), 4 * L.input_elems);
  const MemoryReport r = plan_memory(a, s, one_device(53));
  EXPECT_DOUBLE_EQ(r.act_per_token_layer[0], saved_bytes_per_token(a.layers[0], Recompute::None, false, 1.0, 4));
}

TEST(PlanCalibrated, FusedHeadIncludesItsLogitTraffic) {
  const ArchModel a = arch_from_config(odd_v4(), "odd-v4");
  const int64_t T = 61;
  const ClusterSpec unfused = cpu_spec_from_calibration(calibration({{"gemm", 0.5}, {"memory", 0.5}}));
  const ClusterSpec fused = cpu_spec_from_calibration(calibration({{"gemm", 0.5}, {"memory", 0.5}, {"head", 0.25}}));
  const StepTime u = plan_time(a, unfused, one_device(T)), f = plan_time(a, fused, one_device(T));
  const double V = (double)a.vocab, d = (double)a.hidden, peak = unfused.peak_bf16;
  const double dg = T * 2 * V * d * (1 / (peak * 0.25) - 1 / (peak * 0.5));
  EXPECT_NEAR(f.gemm - u.gemm, dg, 1e-9 * u.gemm);
  EXPECT_NEAR(u.memory_bound - f.memory_bound, T * 12 * V / (20e9 * 0.5), 1e-9 * u.memory_bound);
}

TEST(PlanCalibrated, CpuThisKeepsTheF32MasterOnEveryRank) {
  const ArchModel a = arch_from_config(odd_v4(), "odd-v4");
  const double P = a.total_params();
  ClusterSpec s = cpu_spec_from_calibration(calibration(nlohmann::json::object()));
  ASSERT_TRUE(s.replicated_f32_master);
  Layout l = one_device(64);
  l.dp = 2;
  l.gbs = 2;
  const MemoryReport rt = plan_memory(a, s, l);
  const RankMemory& t = rt.peak();
  EXPECT_NEAR(t.params, 6 * P, 1e-9 * P);     // f32 master + bf16 copy, replicated
  EXPECT_NEAR(t.grads, 4 * P, 1e-9 * P);
  EXPECT_NEAR(t.optimizer, 8 * P / 2, 1e-9 * P);  // ZeRO-1: the two moments sharded
  // OpenMPI's temporaries of the in-flight reduce-scatters: (dp-1)/dp of the f32 gradient.
  EXPECT_NEAR(t.buffers, 4 * P / 2, 1e-9 * P);
  Layout one = one_device(64);
  EXPECT_DOUBLE_EQ(plan_memory(a, s, one).peak().buffers, 0);
  s.replicated_f32_master = false;  // Megatron-Core's distributed optimizer: master sharded too
  const MemoryReport rm = plan_memory(a, s, l);
  const RankMemory& m = rm.peak();
  EXPECT_NEAR(m.params, 2 * P, 1e-9 * P);
  EXPECT_NEAR(m.optimizer, 12 * P / 2, 1e-9 * P);
}

TEST(PlanCalibrated, ParameterGatherNotOverlappedIsExposed) {
  const ArchModel a = arch_from_config(odd_v4(), "odd-v4");
  const double P = a.total_params();
  nlohmann::json j = {{"version", 1},
                      {"ranks_per_node", 2},
                      {"peak", {{"bf16_gflops", 0.05}}},  // slow compute: the gradients' reduce-scatter hides
                      {"memory", {{"gb", 64.0}, {"bandwidth_gbs", 20.0}}},
                      {"efficiency", {{"net_intra", 1.0}, {"overlap", 1.0}}},
                      {"network", {{"intra_node_gbs", 2.0}, {"intra_node_latency_us", 3.0}}}};
  const ClusterSpec s = cpu_spec_from_calibration(parse_calibration(j, "cal.json"));
  Layout l = one_device(64);
  l.dp = 2;
  l.gbs = 2;
  const StepTime hidden = plan_time(a, s, l);
  l.overlap_param_gather = false;
  const StepTime exposed = plan_time(a, s, l);
  EXPECT_DOUBLE_EQ(hidden.dp_exposed, 0);
  // The all-gather of the f32 master (cpu-this): (n-1)/n x 4 P bytes over the link, plus a hop,
  // for the dense and the expert parameters (two groups of 2).
  EXPECT_NEAR(exposed.dp_exposed, 0.5 * 4 * P / 2e9 + 2 * 3e-6, 1e-9 * exposed.dp_exposed);
  EXPECT_NEAR(exposed.step - hidden.step, exposed.dp_exposed, 1e-9 * exposed.step);
}
