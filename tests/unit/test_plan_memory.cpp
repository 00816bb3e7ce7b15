// Planner memory model: per-device parameters, gradients, optimizer state and activations on a
// tiny DeepSeek-V3-shaped config against hand computation, and the invariants of sharding and
// recompute.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include "core/error.h"
#include "model/config.h"
#include "plan/memory.h"
#include "plan/planner.h"

using namespace trex;
using namespace trex::plan;

namespace {

// d 40, 5 heads, q_lora 24, kv_lora 18, nope 6 + rope 4, v 7, dense I 52; 3 layers (first dense),
// 8 experts of I 11, 1 shared, top-3; vocab 101.
model::ModelConfig tiny() {
  nlohmann::json j = {{"vocab_size", 101}, {"hidden_size", 40}, {"num_hidden_layers", 3}, {"num_attention_heads", 5},
                      {"q_lora_rank", 24}, {"kv_lora_rank", 18}, {"qk_nope_head_dim", 6}, {"qk_rope_head_dim", 4},
                      {"v_head_dim", 7}, {"intermediate_size", 52}, {"moe_intermediate_size", 11},
                      {"n_routed_experts", 8}, {"n_shared_experts", 1}, {"num_experts_per_tok", 3},
                      {"first_k_dense_replace", 1}, {"n_group", 2}, {"topk_group", 1}};
  return model::parse_config(j, "tiny");
}

// A device big enough for everything, no reserve.
ClusterSpec big_device() {
  return parse_spec_toml(R"(
name = "test"
[device]
peak_bf16_tflops = 100
memory_gb = 1000
memory_bandwidth_gbs = 1000
[network]
devices_per_node = 8
intra_node_gbs = 100
inter_node_gbs = 10
)", "test");
}

Layout lay(const std::string& s) { return parse_layout(s, Layout{}); }

}  // namespace

TEST(PlanMemory, SavedBytesPerTokenByHand) {
  ArchModel a = arch_from_config(tiny(), "tiny");
  const double d = 40, ql = 24, kl = 18, rope = 4, H = 5, qk = 10, v = 7, I = 52, Im = 11, E = 8, k = 3;
  // Attention sublayer tensors (bf16 = 2 B; lse f32).
  const double attn = 2 * d + 2 * d + 2 * ql + 2 * ql + 2 * (kl + rope) + 2 * kl + 2 * H * qk + 2 * H * qk +
                      2 * H * v + 2 * H * v + 4 * H;
  const double attn_sel = attn - (2 * d + 2 * ql + 2 * kl + 2 * H * qk + 2 * H * qk + 2 * H * v);
  const double mlp_norms = 2 * d + 2 * d;
  const double dense = 2 * 2 * I + 2 * I;  // gate_up, act
  const double moe = 4 * E + 2 * k * d + 2 * k * 2 * Im + 2 * k * Im + 2 * k * d + 2 * 2 * Im + 2 * Im;
  EXPECT_DOUBLE_EQ(attn, 696);
  EXPECT_DOUBLE_EQ(saved_bytes_per_token(a.layers[0], Recompute::None, false), attn + mlp_norms + dense);
  EXPECT_DOUBLE_EQ(saved_bytes_per_token(a.layers[1], Recompute::None, false), attn + mlp_norms + moe);
  EXPECT_DOUBLE_EQ(saved_bytes_per_token(a.layers[0], Recompute::Selective, false),
                   attn_sel + 2 * d /*mlp.norm_in*/ + 2 * 2 * I /*gate_up*/);
  EXPECT_DOUBLE_EQ(saved_bytes_per_token(a.layers[1], Recompute::Selective, false),
                   attn_sel + 2 * d + 4 * E + 2 * k * d + 2 * k * 2 * Im + 2 * k * d + 2 * 2 * Im);
  EXPECT_DOUBLE_EQ(saved_bytes_per_token(a.layers[2], Recompute::Full, false), 2 * d);
  // fp8 caching: GEMM / SwiGLU inputs at 1 B + a 4 B scale per 128.
  const double f = 1 + 4.0 / 128;
  EXPECT_DOUBLE_EQ(saved_bytes_per_token(a.layers[0], Recompute::None, f),
                   attn + mlp_norms + dense - (2 * d + 2 * ql + 2 * kl + 2 * H * v + 2 * d + 2 * 2 * I + 2 * I) +
                       f * (d + ql + kl + H * v + d + 2 * I + I));
}

TEST(PlanMemory, PerDeviceBytesByHand) {
  model::ModelConfig c = tiny();
  ArchModel a = arch_from_config(c, "tiny");
  const double P = (double)c.num_params();
  ASSERT_NEAR(a.total_params(), P, 0.5);
  // One device, nothing sharded: 2 B weights, 4 B f32 gradients, 12 B (master + 2 moments).
  Layout l = lay("mbs=2,seq=16,gbs=2,zero=0");
  validate_layout(l, a, 1);
  MemoryReport m = plan_memory(a, big_device(), l);
  ASSERT_EQ(m.ranks.size(), 1u);
  const RankMemory& r = m.peak();
  EXPECT_NEAR(r.params, 2 * P, 1);
  EXPECT_NEAR(r.grads, 4 * P, 1);
  EXPECT_NEAR(r.optimizer, 12 * P, 1);
  const double tokens = 2 * 16;
  const double per_tok = 1168 + 2 * 1632;  // layer 0 dense, layers 1-2 MoE (SavedBytesPerTokenByHand)
  EXPECT_NEAR(r.activations, tokens * per_tok + tokens * 101 * 4 /* f32 logits */, 1e-6);
  EXPECT_EQ(r.buffers, 0);

  // ep = 2 over dp = 2, ZeRO-1: experts halve on each device; the optimizer shards over dp (dense)
  // and edp = dp*tp/ep = 1 (experts).
  const double experts = 2.0 * 8 * 3 * 40 * 11, dense = P - experts;
  l = lay("dp=2,ep=2,mbs=1,seq=16,gbs=2,zero=1");
  validate_layout(l, a, 2);
  EXPECT_EQ(l.edp(), 1);
  m = plan_memory(a, big_device(), l);
  EXPECT_NEAR(m.peak().params, 2 * (dense + experts / 2), 1);
  EXPECT_NEAR(m.peak().grads, 4 * (dense + experts / 2), 1);
  EXPECT_NEAR(m.peak().optimizer, 12 * (dense / 2 + experts / 2), 1);
  EXPECT_NEAR(m.peak().buffers, 2.0 * 16 * 3 * 40 * 2, 1e-9);  // all-to-all send + receive of one layer
}

TEST(PlanMemory, ShardingAndRecomputeInvariants) {
  ArchModel a = resolve_model("deepseek-v3");
  ClusterSpec s = load_spec("h800");
  auto peak = [&](const std::string& str, int64_t devices) {
    Layout l = lay(str);
    validate_layout(l, a, devices);
    return plan_memory(a, s, l).peak();
  };
  // More dp -> less optimizer state (ZeRO-1), gradients (ZeRO-2), parameters (ZeRO-3).
  for (int z = 1; z <= 3; ++z) {
    const std::string zs = ",zero=" + std::to_string(z) + ",gbs=4096";
    RankMemory small = peak("pp=1,ep=64" + zs, 256), large = peak("pp=1,ep=64" + zs, 1024);
    EXPECT_LT(large.optimizer, small.optimizer) << "zero " << z;
    if (z >= 2) EXPECT_LT(large.grads, small.grads) << "zero " << z;
    else EXPECT_DOUBLE_EQ(large.grads, small.grads);
    if (z >= 3) EXPECT_LT(large.params, small.params) << "zero " << z;
    else EXPECT_DOUBLE_EQ(large.params, small.params);
  }
  // Each ZeRO stage shards more.
  double prev = 1e300;
  for (int z = 0; z <= 3; ++z) {
    RankMemory r = peak("pp=1,ep=64,gbs=4096,zero=" + std::to_string(z), 512);
    EXPECT_LT(r.params + r.grads + r.optimizer, prev) << "zero " << z;
    prev = r.params + r.grads + r.optimizer;
  }
  // Recompute: none > selective > full activations; pipeline rank 0 holds pp micro-batches (1F1B).
  RankMemory none = peak("pp=8,ep=64,recompute=none", 2048), sel = peak("pp=8,ep=64,recompute=selective", 2048),
             full = peak("pp=8,ep=64,recompute=full", 2048);
  EXPECT_GT(none.activations, sel.activations);
  EXPECT_GT(sel.activations, full.activations);
  Layout l = lay("pp=8,ep=64");
  validate_layout(l, a, 2048);
  MemoryReport m = plan_memory(a, s, l);
  EXPECT_EQ(m.ranks[0].inflight, 8);
  EXPECT_EQ(m.ranks[7].inflight, 1);
  // Tensor parallel (sequence parallel) splits activations and dense parameters.
  RankMemory tp1 = peak("tp=1,pp=8,ep=64", 2048), tp4 = peak("tp=4,pp=8,ep=64", 2048);
  EXPECT_LT(tp4.activations, tp1.activations);
  EXPECT_LT(tp4.params, tp1.params);
}

TEST(PlanMemory, FitsDecidesOnUsableMemory) {
  ArchModel a = resolve_model("deepseek-v3");
  ClusterSpec s = load_spec("h800");
  Layout l = lay("pp=1,ep=8,zero=0");
  validate_layout(l, a, 8);
  MemoryReport m = plan_memory(a, s, l);
  EXPECT_FALSE(m.fits);  // 671B parameters on 8 GPUs
  EXPECT_DOUBLE_EQ(m.usable, s.mem_bytes - s.reserved_bytes);
  Plan p = evaluate(a, s, 8, lay("pp=1,ep=8,zero=0"));
  bool noted = false;
  for (auto& n : p.notes) noted = noted || n.find("DOES NOT FIT") != std::string::npos;
  EXPECT_TRUE(noted);
}

// recompute=mlp (Megatron-Core's `mlp moe_act`): the dense MLP's fc1 and SwiGLU outputs and the
// routed experts' SwiGLU output are not kept; the dense MLP is replayed in the backward.
TEST(PlanMemory, MlpRecompute) {
  const model::ModelConfig c = deepseek_v3_config();
  ArchModel a = resolve_model("deepseek-v3");
  const LayerCost& dense = a.layers[0];
  const LayerCost& moe = a.layers[5];
  ASSERT_FALSE(dense.moe);
  ASSERT_TRUE(moe.moe);
  const double I = (double)c.intermediate_size, Ie = (double)c.moe_intermediate_size, k = (double)c.num_experts_per_tok;
  EXPECT_DOUBLE_EQ(saved_bytes_per_token(dense, Recompute::None, 0) - saved_bytes_per_token(dense, Recompute::None, 0, 1, 0, true),
                   2 * (2 * I + I));
  EXPECT_DOUBLE_EQ(saved_bytes_per_token(moe, Recompute::None, 0, 1.5) - saved_bytes_per_token(moe, Recompute::None, 0, 1.5, 0, true),
                   2 * k * Ie * 1.5);
  // With selective (which already drops the SwiGLU outputs) it adds the dense fc1 output only.
  EXPECT_DOUBLE_EQ(saved_bytes_per_token(dense, Recompute::Selective, 0) -
                       saved_bytes_per_token(dense, Recompute::Selective, 0, 1, 0, true),
                   2 * 2 * I);
  EXPECT_DOUBLE_EQ(saved_bytes_per_token(dense, Recompute::Full, 0, 1, 0, true), saved_bytes_per_token(dense, Recompute::Full, 0));
  // Parsed, named and refused.
  Layout l = parse_layout("recompute=mlp", Layout{});
  EXPECT_EQ(l.recompute, Recompute::None);
  EXPECT_TRUE(l.recompute_mlp);
  EXPECT_EQ(recompute_label(l), "mlp");
  l = parse_layout("recompute=selective+mlp", Layout{});
  EXPECT_EQ(l.recompute, Recompute::Selective);
  EXPECT_EQ(recompute_label(l), "selective+mlp");
  EXPECT_NE(layout_string(l).find("recompute=selective+mlp"), std::string::npos);
  EXPECT_FALSE(parse_layout("recompute=selective+mlp,recompute=none", Layout{}).recompute_mlp);
  for (const char* bad : {"recompute=full+mlp", "recompute=mlp+act", "recompute=none+selective"}) {
    try {
      parse_layout(bad, Layout{});
      ADD_FAILURE() << bad << " accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(bad).substr(10)), std::string::npos) << e.what();
    }
  }
  // Time and memory of a plan: the three dense layers replay their MLPs (one stage: the split by
  // time would otherwise differ between the recompute modes).
  ClusterSpec s = load_spec("h800");
  const std::string base = "pp=1,ep=8,gbs=256,recompute=";
  Plan none = evaluate(a, s, 128, parse_layout(base + "none", Layout{}));
  Plan mlp = evaluate(a, s, 128, parse_layout(base + "mlp", Layout{}));
  Plan full = evaluate(a, s, 128, parse_layout(base + "full", Layout{}));
  EXPECT_GT(mlp.time.recompute, 0);
  EXPECT_LT(mlp.time.recompute, full.time.recompute);
  EXPECT_GT(mlp.time.step, none.time.step);
  EXPECT_LT(mlp.memory.peak().activations, none.memory.peak().activations);
  EXPECT_GT(mlp.memory.peak().activations, full.memory.peak().activations);
}
