// GEMMs at their shapes (plan/gemm.h): the tile grid and the roofline against hand computation on
// odd sizes; the routed experts of a plan at their shapes (rows per expert, the memory-bound weight
// gradient, the tile grid of a small expert); the spec keys that carry the device's clock at the
// power limit (sustained_clock) and the quantize kernels' bandwidth (quantize), and their errors.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include "core/error.h"
#include "model/config.h"
#include "plan/gemm.h"
#include "plan/planner.h"

using namespace trex;
using namespace trex::plan;

namespace {

// d 45, 5 heads, q_lora 24, kv_lora 18, nope 6 + rope 4, v 7, dense I 52; 3 layers (first dense),
// 10 experts of I 13, 1 shared, top-3; vocab 101.
model::ModelConfig odd_moe() {
  nlohmann::json j = {{"vocab_size", 101}, {"hidden_size", 45}, {"num_hidden_layers", 3}, {"num_attention_heads", 5},
                      {"q_lora_rank", 24}, {"kv_lora_rank", 18}, {"qk_nope_head_dim", 6}, {"qk_rope_head_dim", 4},
                      {"v_head_dim", 7}, {"intermediate_size", 52}, {"moe_intermediate_size", 13},
                      {"n_routed_experts", 10}, {"n_shared_experts", 1}, {"num_experts_per_tok", 3},
                      {"first_k_dense_replace", 1}, {"n_group", 2}, {"topk_group", 1}};
  return model::parse_config(j, "odd-moe");
}

const char* kDevice = R"(
name = "test"
[device]
peak_bf16_tflops = 100
peak_fp8_tflops = 200
memory_gb = 1000
memory_bandwidth_gbs = 1000000000
%s
[network]
devices_per_node = 10
intra_node_gbs = 100
inter_node_gbs = 10
[efficiency]
gemm = 0.5
grouped_gemm = 0.5
memory = 0.5
%s
)";

ClusterSpec device(const std::string& dev_keys = "", const std::string& eff_keys = "") {
  char buf[2048];
  std::snprintf(buf, sizeof buf, kDevice, dev_keys.c_str(), eff_keys.c_str());
  return parse_spec_toml(buf, "test.toml");
}

std::string spec_error(const std::string& dev_keys, const std::string& eff_keys = "") {
  try {
    device(dev_keys, eff_keys);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(PlanGemm, TileGridByHand) {
  GemmDevice d;
  d.rate = 1e12;
  d.sm_count = 11, d.tile_m = 16, d.tile_n = 16, d.tile_sms = 2;  // 5 units of 16 x 16 tiles
  // 3 groups of 45 x 21: 3 x 2 tiles each, 18 tiles, 4 waves of 5 units.
  const GemmShape g{3, 45, 21, 33, 2, 2, 0};
  EXPECT_NEAR(tile_efficiency(g, d), 3.0 * 45 * 21 / (4.0 * 5 * 16 * 16), 1e-12);
  GemmTime t = gemm_time(g, d);
  EXPECT_NEAR(t.compute, 2.0 * 3 * 45 * 21 * 33 / (1e12 * t.tile_eff), 1e-20);
  d.sm_count = 0;  // no tile grid: the class rate
  EXPECT_DOUBLE_EQ(tile_efficiency(g, d), 1.0);
  // One wave that fills every unit exactly.
  d.sm_count = 10, d.tile_sms = 2;
  EXPECT_NEAR(tile_efficiency(GemmShape{5, 16, 16, 7, 2, 2, 0}, d), 1.0, 1e-12);
}

TEST(PlanGemm, RooflineByHand) {
  GemmDevice d;
  d.rate = 1e12, d.mem_bw = 1e9;
  const GemmShape fwd{1, 45, 21, 33, 2, 2, 0};
  GemmTime t = gemm_time(fwd, d);
  EXPECT_NEAR(t.compute, 2.0 * 45 * 21 * 33 / 1e12, 1e-20);
  EXPECT_NEAR(t.memory, ((45.0 * 33 + 21.0 * 33) * 2 + 45.0 * 21 * 2) / 1e9, 1e-18);
  EXPECT_DOUBLE_EQ(t.seconds, std::max(t.compute, t.memory));
  // A weight gradient accumulated into f32 main gradients: A and B read, the output read and written.
  t = gemm_time(GemmShape{1, 45, 21, 33, 1.03, 0, 4}, d);
  EXPECT_NEAR(t.memory, ((45.0 * 33 + 21.0 * 33) * 1.03 + 45.0 * 21 * 8) / 1e9, 1e-18);
  EXPECT_DOUBLE_EQ(gemm_time(GemmShape{1, 0, 21, 33}, d).seconds, 0);
}

// The routed experts of a plan: rows per local expert, their FLOPs and, on a device without a tile
// grid and with the memory out of the way, the class rate exactly.
TEST(PlanGemm, ExpertsAtTheirShapes) {
  const ArchModel a = arch_from_config(odd_moe(), "odd-moe");
  const LayerCost& L = a.layers[1];
  ASSERT_TRUE(L.moe);
  Layout l = parse_layout("ep=5,seq=77,mbs=1", Layout{});
  const double tokens = 77;
  GemmDevice fast;
  fast.rate = 1e12, fast.mem_bw = 1e30;
  const ExpertGemms x = expert_gemms(L, l, a.hidden, tokens, fast, 2);
  EXPECT_NEAR(x.rows, tokens * 3 * 5 / 10.0, 1e-12);  // tokens x top-k x ep / experts
  EXPECT_NEAR(x.fwd, tokens * L.expert_fwd / 1e12, 1e-9 * x.fwd);
  EXPECT_NEAR(x.dgrad, x.fwd, 1e-9 * x.fwd);
  EXPECT_NEAR(x.wgrad, x.fwd, 1e-9 * x.fwd);
  EXPECT_FALSE(x.memory_bound);
  // The busiest rank under skew receives more rows; expert tensor parallelism splits N, not M x N x K.
  l.expert_load = 1.7;
  EXPECT_NEAR(expert_gemms(L, l, a.hidden, tokens, fast, 2).fwd, 1.7 * x.fwd, 1e-9 * x.fwd);
  // At a device's bandwidth the weight gradient's accumulation binds first: its output is the
  // weight (N x K, read and written in f32) whatever the rows.
  GemmDevice slow = fast;
  slow.mem_bw = 1e9;
  l.expert_load = 1;
  const ExpertGemms y = expert_gemms(L, l, a.hidden, tokens, slow, 2);
  EXPECT_TRUE(y.memory_bound);
  const double I = 13, d = 45, local = 2;
  EXPECT_NEAR(y.wgrad, local * ((2 * I * y.rows + d * y.rows) * 2 + 2 * I * d * 8) / 1e9 +
                           local * ((d * y.rows + I * y.rows) * 2 + d * I * 8) / 1e9,
              1e-9 * y.wgrad);
}

// A plan on a device with a tile grid: few rows per expert leave tiles half empty, and the step's
// expert GEMMs slow down by the grid's efficiency.
TEST(PlanGemm, TileGridInAPlan) {
  const ArchModel a = arch_from_config(odd_moe(), "odd-moe");
  const std::string layout = "ep=5,seq=77,gbs=5,recompute=none";
  const Plan none = evaluate(a, device(), 5, parse_layout(layout, Layout{}));
  const Plan grid = evaluate(a, device("sm_count = 7\ntile_m = 64\ntile_n = 32\ntile_sms = 1"), 5,
                             parse_layout(layout, Layout{}));
  EXPECT_NEAR(none.time.expert_rows, 77 * 3 * 5 / 10.0, 1e-9);
  EXPECT_DOUBLE_EQ(none.time.expert_tile_eff, 1.0);
  EXPECT_LT(grid.time.expert_tile_eff, 0.5);
  EXPECT_GT(grid.time.experts, 1.5 * none.time.experts);
  EXPECT_DOUBLE_EQ(grid.time.attention, none.time.attention);
}

// sustained_clock scales the tensor rates (GEMMs, attention, head), not the memory-bound work;
// quantize prices the low-precision recipes' quantize kernels at their own bandwidth.
TEST(PlanGemm, SustainedClockAndQuantizeKeys) {
  const ArchModel a = arch_from_config(odd_moe(), "odd-moe");
  const Layout l = parse_layout("ep=5,seq=77,gbs=5,recompute=none,precision=fp8", Layout{});
  const Plan base = evaluate(a, device(), 5, l);
  const Plan slow = evaluate(a, device("sustained_clock = 0.8"), 5, l);
  EXPECT_NEAR(slow.time.gemm, base.time.gemm / 0.8, 1e-9 * slow.time.gemm);
  EXPECT_NEAR(slow.time.attention, base.time.attention / 0.8, 1e-9 * slow.time.attention);
  EXPECT_DOUBLE_EQ(slow.time.memory_bound, base.time.memory_bound);
  const Plan quant = evaluate(a, device("", "quantize = 0.25"), 5, l);
  ASSERT_GT(base.time.quant_fwd, 0);
  EXPECT_NEAR(quant.time.quant_fwd, 2 * base.time.quant_fwd, 1e-9 * quant.time.quant_fwd);  // 0.25 vs memory 0.5
  EXPECT_NEAR(quant.time.quant_bwd, 2 * base.time.quant_bwd, 1e-9 * quant.time.quant_bwd);
}

TEST(PlanGemm, SpecKeysAndErrors) {
  const ClusterSpec b = load_spec("b200");
  EXPECT_EQ(b.sm_count, 148);
  EXPECT_EQ(b.tile_sms, 2);
  EXPECT_DOUBLE_EQ(b.sustained_clock, 0.85);
  EXPECT_DOUBLE_EQ(b.eff.quantize, 0.57);
  EXPECT_EQ(load_spec("h800").tile_sms, 1);
  EXPECT_DOUBLE_EQ(load_spec("h800").sustained_clock, 1.0);  // inside the fitted fp8 efficiency
  EXPECT_DOUBLE_EQ(device().eff.quantize_or_memory(), 0.5);
  EXPECT_NE(spec_error("sustained_clock = 1.3").find("sustained_clock"), std::string::npos);
  EXPECT_NE(spec_error("sm_count = 1\ntile_sms = 2").find("sm_count"), std::string::npos);
  EXPECT_NE(spec_error("tile_m = 0").find("tile_m"), std::string::npos);
  EXPECT_NE(spec_error("", "quantize = 2").find("quantize"), std::string::npos);
}
