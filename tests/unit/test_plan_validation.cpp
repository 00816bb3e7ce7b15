// Planner validation against published runs (docs/PLAN.md has the derivations and sources):
//  1. DeepSeek-V3 pretraining on 2048 H800: 180K GPU-hours per trillion tokens (tech report,
//     Table 1) -> 1543 tokens/s/GPU; x the model's FLOPs per token at seq 4096 / 989.4 TFLOP/s
//     -> 39.1% MFU. Layout per the report: PP16 (DualPipe), EP64 over 8 nodes, ZeRO-1 DP, no TP,
//     FP8 GEMMs, selective recompute (RMSNorm + MLA up-projections), bf16 moments, MTP on,
//     15360 x 4096-token batches.
//  2. The reference system (SLAI T-Rex): 34.22% MFU post-training DeepSeek-V4-Pro on ~1000 Ascend
//     910C; assumed 1024 chips = 2048 dies, 6144 x 4096 tokens per step (27 s steps reported), the
//     planner's own best layout for that cluster.
// Each prediction must be within 15% of the figure.
#include <gtest/gtest.h>

#include <cmath>
#include "plan/planner.h"

using namespace trex;
using namespace trex::plan;

namespace {

const char* kV3Layout =
    "pp=16,ep=64,zero=1,gbs=15360,seq=4096,recompute=selective,schedule=dualpipe,precision=fp8,moments=bf16,mtp=1";
const char* kV4Layout = "dp=64,tp=8,pp=4,ep=128,zero=2,gbs=6144,seq=4096,recompute=none";

double rel(double x, double ref) { return std::fabs(x - ref) / ref; }

}  // namespace

TEST(PlanValidation, ArchitectureCounts) {
  // V3 from the real config.json: the planner counts what model/ counts.
  model::ModelConfig c = deepseek_v3_config();
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.num_hidden_layers, 61);
  EXPECT_EQ(c.n_routed_experts, 256);
  ArchModel v3 = arch_from_config(c, "deepseek-v3");
  EXPECT_NEAR(v3.total_params(), (double)c.num_params(), 1.0);
  EXPECT_NEAR(v3.active_params(), (double)c.num_active_params(), 1.0);
  EXPECT_NEAR(v3.total_params() / 1e9, 671.0, 0.5);
  for (int64_t T : {1, 4096, 32768})
    EXPECT_NEAR(v3.model_flops_per_token(T) / c.train_flops_per_token(T), 1.0, 1e-12) << "T " << T;
  // V4 built-ins (parsed by model::parse_config) against DeepSeek's announced sizes.
  struct Published {
    const char* name;
    double total, active;
    int64_t layers;
  };
  for (const Published& v :
       {Published{"deepseek-v4-flash", 284e9, 13e9, 43}, Published{"deepseek-v4-pro", 1.6e12, 49e9, 61}}) {
    ArchModel a = resolve_model(v.name);
    EXPECT_LT(rel(a.total_params(), v.total), 0.03) << v.name << " total " << a.total_params();
    EXPECT_LT(rel(a.active_params(), v.active), 0.03) << v.name << " active " << a.active_params();
    EXPECT_EQ(a.n_layers(), v.layers);
  }
}

// DeepSeek-V2 family and V3.2 built-ins (their released config.json values) against the published
// sizes: V2 236B total / 21B activated, V2-Lite 15.7B / 2.4B (DeepSeek-V2 report, model cards),
// V3.2-Exp 671B / 37B as V3. Totals within 1%. The activated figures have two significant digits,
// so they are held to 2.5%: V2-Lite's per-token matmul parameters from its config are 2.451B
// (attention 0.372B, the dense layer's MLP 0.067B, 26 MoE layers x 69.3M, LM head 0.210B), which
// the published "2.4B" truncates; V3's and V3.2's trained ones are 36.6B.
TEST(PlanValidation, DeepSeekV2AndV32BuiltinCounts) {
  struct Published {
    const char* name;
    double total, active;
    int64_t layers;
  };
  for (const Published& v : {Published{"deepseek-v2", 236e9, 21e9, 60}, Published{"deepseek-v2-lite", 15.7e9, 2.4e9, 27},
                             Published{"deepseek-v3.2", 671e9, 37e9, 61}}) {
    ArchModel a = resolve_model(v.name);
    // (V3.2: the trained parameters; the planner's active count adds the indexer's forward-only
    // projections, below.)
    const double fwd_only = v.layers == 61 ? 61.0 * (64 * 128 * 1536 + 128 * 7168 + 64 * 7168) : 0.0;
    EXPECT_LT(rel(a.total_params(), v.total), 0.01) << v.name << " total " << a.total_params();
    EXPECT_LT(rel(a.active_params() - fwd_only, v.active), 0.025) << v.name << " active " << a.active_params();
    EXPECT_EQ(a.n_layers(), v.layers);
  }
  for (const model::ModelConfig& c : {deepseek_v2_config(), deepseek_v2_lite_config(), deepseek_v32_config()}) {
    ArchModel a = arch_from_config(c, c.model_type);
    const double d = (double)c.hidden_size, Hi = (double)c.v32.index_n_heads, di = (double)c.v32.index_head_dim;
    const double indexer = c.is_v32() ? c.num_hidden_layers * (Hi * di * c.q_lora_rank + di * d + Hi * d) : 0.0;
    EXPECT_NEAR(a.total_params(), (double)c.num_params(), 1.0) << c.model_type;
    EXPECT_NEAR(a.active_params(), (double)c.num_active_params() + indexer, 1.0) << c.model_type;
    for (int64_t T : {1, 4096, 32768})
      EXPECT_NEAR(a.model_flops_per_token(T) / c.train_flops_per_token(T), 1.0, 1e-12) << c.model_type << " T " << T;
  }
  EXPECT_EQ(deepseek_v2_config().model_type, "deepseek_v2");
  EXPECT_EQ(deepseek_v2_lite_config().q_lora_rank, 0);
  EXPECT_EQ(deepseek_v32_config().v32.index_topk, 2048);
}

TEST(PlanValidation, AttendedContext) {
  AttnShape mla{AttnKind::MLA, 128, 192, 128};
  EXPECT_DOUBLE_EQ(mean_attended_keys(mla, 4096), 4097 / 2.0);
  // V4 kinds against a direct sum over positions.
  for (AttnKind k : {AttnKind::SlidingWindow, AttnKind::CSA, AttnKind::HCA})
    for (int64_t T : {1, 100, 128, 129, 4096, 5000}) {
      AttnShape a{k, 64, 512, 512, 128, k == AttnKind::HCA ? 128 : 4, 512, 64, 128};
      if (k == AttnKind::SlidingWindow) a.compress_ratio = 0;
      double keys = 0, idx = 0;
      for (int64_t p = 1; p <= T; ++p) {
        keys += std::min<int64_t>(p, 128);
        if (k == AttnKind::CSA) keys += std::min<int64_t>(512, p / 4), idx += p / 4;
        if (k == AttnKind::HCA) keys += p / 128;
      }
      EXPECT_NEAR(mean_attended_keys(a, T), keys / T, 1e-9) << attn_kind_name(k) << " T " << T;
      EXPECT_NEAR(attn_core_fwd_flops(a, T), 2.0 * 64 * 1024 * keys / T + 2.0 * 64 * 128 * idx / T,
                  1e-6 * attn_core_fwd_flops(a, T));
      // Without padded slot lists the kernels compute the attended keys.
      EXPECT_DOUBLE_EQ(kernel_attended_keys(a, T, 0), mean_attended_keys(a, T));
      EXPECT_DOUBLE_EQ(indexer_kernel_flops(a, T, 0), indexer_fwd_flops(a, T));
    }
}

// FlashMLA-style sparse kernels (a spec's sparse_attention_slot_pad) run every query over the
// whole slot list, padded: at 4096 tokens, DeepSeek-V4-Flash's CSA (window 128, rate 4, top-512)
// computes 640 keys a query where the causal mean attends 510, HCA (rate 128) 160 -> 192 where it
// attends 142, the sliding window 128; DeepSeek-V3.2's top-2048 2048 where it attends 1536. The
// CSA indexer scores all 1024 entries of the row for every query. Dense MLA is unchanged.
TEST(PlanValidation, PaddedSparseSlots) {
  const int64_t T = 4096;
  AttnShape csa{AttnKind::CSA, 64, 512, 512, 128, 4, 512, 64, 128};
  AttnShape hca{AttnKind::HCA, 64, 512, 512, 128, 128};
  AttnShape swa{AttnKind::SlidingWindow, 64, 512, 512, 128};
  AttnShape v32{AttnKind::MLA, 128, 192, 128};
  v32.index_topk = 2048;
  AttnShape mla{AttnKind::MLA, 128, 192, 128};
  EXPECT_DOUBLE_EQ(kernel_attended_keys(csa, T, 64), 640);
  EXPECT_NEAR(mean_attended_keys(csa, T), 510, 1);
  EXPECT_DOUBLE_EQ(kernel_attended_keys(hca, T, 64), 192);
  EXPECT_NEAR(mean_attended_keys(hca, T), 142, 1);
  EXPECT_DOUBLE_EQ(kernel_attended_keys(swa, T, 64), 128);
  EXPECT_DOUBLE_EQ(kernel_attended_keys(v32, T, 64), 2048);
  EXPECT_NEAR(mean_attended_keys(v32, T), 1536, 1);
  EXPECT_DOUBLE_EQ(kernel_attended_keys(mla, T, 64), mean_attended_keys(mla, T));
  EXPECT_DOUBLE_EQ(indexer_kernel_flops(csa, T, 64), 2.0 * 64 * 128 * 1024);
  EXPECT_NEAR(indexer_kernel_flops(csa, T, 64) / indexer_fwd_flops(csa, T), 2.0, 0.01);
  // Short rows: the lists hold what exists (a window of 100 tokens, 25 entries), padded.
  EXPECT_DOUBLE_EQ(kernel_attended_keys(csa, 100, 64), 128);
  EXPECT_DOUBLE_EQ(kernel_attended_keys(hca, 100, 64), 128);
  EXPECT_DOUBLE_EQ(kernel_attended_keys(csa, 100, 7), 126);
}

TEST(PlanValidation, DeepSeekV3OnH800) {
  ArchModel a = resolve_model("deepseek-v3");
  const double tokens_per_gpu_s = 1e12 / (180e3 * 3600.0);
  const double derived_mfu = tokens_per_gpu_s * a.model_flops_per_token(4096) / 989.4e12;
  EXPECT_NEAR(derived_mfu, 0.391, 0.001);
  Plan p = evaluate(a, load_spec("h800"), 2048, parse_layout(kV3Layout, Layout{}));
  EXPECT_EQ(p.layout.dp, 128);
  EXPECT_EQ(p.layout.edp(), 2);
  EXPECT_LT(rel(p.time.mfu, derived_mfu), 0.15) << "planner " << p.time.mfu << " derived " << derived_mfu;
  EXPECT_LT(rel(p.time.tokens_per_s / 2048, tokens_per_gpu_s), 0.15);
}

TEST(PlanValidation, DeepSeekV4ProOnAscend910C) {
  ArchModel a = resolve_model("deepseek-v4-pro");
  ClusterSpec s = load_spec("ascend-910c");
  Plan p = evaluate(a, s, 2048, parse_layout(kV4Layout, Layout{}));
  EXPECT_TRUE(p.memory.fits);
  EXPECT_LT(rel(p.time.mfu, 0.3422), 0.15) << "planner " << p.time.mfu;
  // The assumed layout is the planner's best for this cluster and batch (within 1%).
  SearchOptions o;
  o.top = 1;
  SearchResult r = search(a, s, 2048, parse_layout("gbs=6144,seq=4096", Layout{}), 0, o);
  ASSERT_FALSE(r.by_speed.empty());
  EXPECT_LT(rel(p.time.tokens_per_s, r.by_speed.front().time.tokens_per_s), 0.01);
}
