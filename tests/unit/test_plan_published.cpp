// Planner against published DeepSeek-V3 (and, last, DeepSeek-V4-Flash) training runs of
// Megatron-Bridge / Megatron-Core on H100, B200, GB200 NVL72 and GB300 NVL72 (docs/PLAN.md has the table, sources and the assumptions of
// each row). Tokens per second per GPU are compared (independent of how a run counts FLOPs).
// No efficiency was fitted to any row here: every row is held out of the fits (the only fitted
// figures are the Hopper fp8 efficiency and the H800 goodput, on the DeepSeek-V3 report). The
// Blackwell figures come from microbenchmarks (docs/PLAN.md, "Blackwell: GEMMs, clocks and
// quantization"): GEMM rates from published maximum-achievable-matmul measurements and torchao's
// MXFP8 grouped-GEMM kernels at DeepSeek-V3 shapes, the routed experts at their shapes (plan/gemm.h),
// the quantize kernels at their measured bandwidth, and the clock a long run sustains at the power
// limit (B200 measured; GB200 / GB300 extrapolated from it).
//
// Every row's error is pinned to within 4 points of the value docs/PLAN.md states, so that a
// change to the model that moves a row shows here; rows within 15% are also held to it. Two rows
// remain over-predicted, both B200 MXFP8 at pp 16 / ep 8 on Transformer Engine releases whose
// MXFP8 grouped GEMM was one cuBLAS GEMM per expert over 4 streams (25.11: TE 2.9, +35%; 26.02:
// TE 2.12, +18%); the same layout on TE 2.14, which added a single-launch MXFP8 grouped GEMM,
// reads +13% (26.04). DeepSeek-V4-Flash on 128 GB200 / GB300 (26.08) reads +8% and +23%
// (V4FlashOnBlackwell), its sparse attention priced as Megatron-Core's kernels run it. The planner prices grouped kernels; MXFP8's quantize, scale-swizzle and
// expert-padding kernels are priced from their bytes (plan/precision.h); the host, priced per
// launch from published per-op figures, adds about 1% (docs/PLAN.md, "The host").
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include "plan/planner.h"

using namespace trex;
using namespace trex::plan;

namespace {

struct Row {
  const char* what;
  const char* cluster;
  int64_t devices;
  const char* layout;
  double published;                  // tokens/s per GPU
  const char* model = "deepseek-v3";  // trex plan's built-in name
};

Plan plan_of(const Row& r) {
  ArchModel a = resolve_model(r.model);
  return evaluate(a, load_spec(r.cluster), r.devices, parse_layout(r.layout, Layout{}));
}

double error_of(const Row& r) {
  const Plan p = plan_of(r);
  return p.time.tokens_per_s / (double)r.devices / r.published - 1;
}

// Megatron-Bridge performance summary (25.09 and 25.11 containers; later B200 rows below),
// DeepSeek-V3, seq 4096, MBS 1;
// MTP as the 25.11 table says ("w/o MTP" on GB200 / GB300, "w/ MTP" on B200; on for the 25.09 H100
// rows); the 25.11 recipes' optimizer settings (scripts/performance/configs/deepseek/
// deepseek_llm_pretrain.py and recipes/deepseek/deepseek_v3.py as of December 2025: bf16 main
// gradients (grad_reduce_in_fp32 off, main_grads_dtype bf16) and bf16 moments); B200's dispatcher
// the all-to-all one (no flex backend in its workload config: dedup=0, the MXFP8 expert padding
// copied); GB200 / GB300 MXFP8 with the parameter all-gather not overlapped (the recipe turns
// overlap_param_gather off for fp8_mx); the all-to-all not overlapped on every 25.11 row
// (moe_a2a_overlap=False: B200 by Megatron-Bridge commit b098e90af, "b200 no a2a overlap"; GB300 in
// the config that matches its published layout, commit d19cb73c8; A2aOverlapSensitivity below);
// CUDA graphs as the recipes of December 2025 set them (scripts/performance/configs/deepseek/
// deepseek_workload_base_configs.py): H100 and B200 none; GB300 `attn moe_router moe_preprocess`
// (partial); GB200 `moe_router moe_preprocess` (taken as partial: the planner's partial also
// captures attention, so those rows' host is slightly under-counted).
const Row kH100Cs = {"H100 x1024 FP8 current scaling (25.09)", "h100", 1024,
                     "tp=2,pp=8,vp=4,ep=64,gbs=8192,precision=fp8-tensor,mtp=1,recompute=selective+mlp,overlap=dp,graphs=off", 1297};
const Row kH100Block = {"H100 x1024 FP8 1x128/128x128 blocks (25.09)", "h100", 1024,
                        "tp=2,pp=8,vp=4,ep=64,gbs=8192,precision=fp8,mtp=1,recompute=selective+mlp,overlap=dp,graphs=off",
                        1297.0 * 330 / 338};
const Row kGB300Bf16 = {"GB300 x256 BF16 (25.11)", "gb300-nvl72", 256,
                        "pp=2,vp=4,ep=32,gbs=4096,precision=bf16,mtp=0,recompute=selective,overlap=dp,graphs=partial,"
                        "grads=bf16,moments=bf16", 3848};
// Megatron-Bridge PR 4226: GB200 MXFP8 with full-iteration CUDA graphs, 12.94 s per 4096 x 4096 tokens.
const Row kGB200Graphs = {"GB200 x256 MXFP8, full CUDA graphs (PR 4226)", "gb200-nvl72", 256,
                          "pp=4,vp=4,ep=64,gbs=4096,precision=mxfp8,mtp=1,recompute=selective,overlap=ep+dp,graphs=full",
                          4096.0 * 4096 / 12.94 / 256};
// Published with partial or no CUDA graphs.
const Row kB200Mx = {"B200 x256 MXFP8 (25.11)", "b200", 256,
                     "pp=16,ep=8,gbs=2048,precision=mxfp8,mtp=1,recompute=selective,overlap=dp,graphs=off,"
                     "grads=bf16,moments=bf16,dedup=0", 2139};
const Row kGB200Bf16 = {"GB200 x256 BF16 (25.11)", "gb200-nvl72", 256,
                        "pp=4,vp=4,ep=64,gbs=4096,precision=bf16,mtp=0,recompute=selective,overlap=dp,graphs=partial,"
                        "grads=bf16,moments=bf16", 3139};
const Row kGB200Mx = {"GB200 x256 MXFP8 (25.11)", "gb200-nvl72", 256,
                      "pp=8,vp=4,ep=32,gbs=4096,precision=mxfp8,mtp=0,recompute=selective,overlap=dp,graphs=partial,"
                      "grads=bf16,moments=bf16,param_gather=exposed", 4018};
// Megatron-Core's GB200 guide, final: 970 TFLOP/s at 249.5 GFLOP per token (the 25.11 table's ratio);
// its `--recompute-modules mlp moe_act` is recompute=mlp. The H100 recipe's `mla_up_proj mlp` is
// selective+mlp.
const Row kGB200Guide = {"GB200 x256 MXFP8, Megatron-Core GB200 guide", "gb200-nvl72", 256,
                         "pp=8,vp=4,ep=32,gbs=2048,precision=mxfp8,mtp=0,recompute=mlp,overlap=dp,graphs=partial", 970e12 / 249.5e9};
const Row kGB300Mx = {"GB300 x256 MXFP8 (25.11)", "gb300-nvl72", 256,
                      "pp=2,vp=4,ep=32,gbs=4096,precision=mxfp8,mtp=0,recompute=none,overlap=dp,graphs=partial,"
                      "grads=bf16,moments=bf16,param_gather=exposed", 4357};
// Later releases, B200 MXFP8 (the recipes at the publishing commits, docs/PLAN.md): MTP 1, bf16 main
// gradients and moments, the parameter all-gather overlapped. 26.02 and 26.04: pp 16 / ep 8 as the
// 25.11 row but gbs 4096, HybridEP, no CUDA graphs, a2a not overlapped; TE 2.12, then TE 2.14 with
// the MXFP8 grouped GEMM. 26.04.01: pp 8 / vp 2 / ep 32, DeepEP, a2a overlapped, CUDA graphs on
// attention, router and preprocess, recompute mla_up_proj + mlp.
constexpr const char* kB200Pp16Gbs4096 =
    "pp=16,ep=8,gbs=4096,precision=mxfp8,mtp=1,recompute=selective,overlap=dp,graphs=off,grads=bf16,moments=bf16";
const Row kB200Mx2602 = {"B200 x256 MXFP8 (26.02)", "b200", 256, kB200Pp16Gbs4096, 2689};
const Row kB200Mx2604 = {"B200 x256 MXFP8 (26.04)", "b200", 256, kB200Pp16Gbs4096, 2815};
const Row kB200Mx260401 = {"B200 x256 MXFP8 (26.04.01)", "b200", 256,
                           "pp=8,vp=2,ep=32,gbs=4096,precision=mxfp8,mtp=1,recompute=selective+mlp,overlap=ep+dp,"
                           "graphs=partial,grads=bf16,moments=bf16", 3328};

// GB300 MXFP8 at 26.02 (c0b9a0003, TE 2.12) and 26.04 (74695a06d, TE 2.14): the GB300 workload
// config's default at both commits: pp 2 / vp 8 / ep 32, mbs 2, gbs 4096, MTP 1 (layout
// `Et*4|(t*4|)*14tmL`), recompute mla_up_proj, HybridEP, a2a not overlapped, no CUDA graphs, bf16
// main gradients and moments, the parameter all-gather overlapped.
constexpr const char* kGB300Pp2Vp8 =
    "pp=2,vp=8,ep=32,mbs=2,gbs=4096,precision=mxfp8,mtp=1,recompute=selective,overlap=dp,graphs=off,grads=bf16,"
    "moments=bf16";
const Row kGB300Mx2602 = {"GB300 x256 MXFP8 (26.02)", "gb300-nvl72", 256, kGB300Pp2Vp8, 4612};
const Row kGB300Mx2604 = {"GB300 x256 MXFP8 (26.04)", "gb300-nvl72", 256, kGB300Pp2Vp8, 4965};
// GB300 MXFP8 at 26.08 (4ab94dfad; perf_recipes/deepseek/gb300/deepseek_v3.py, the fp8mx config):
// the same parallel layout at mbs 1 without recompute, HybridEP with the all-to-all overlapped and
// the weight gradients delayed, a full-iteration CUDA graph with static MoE shapes (capacity factor
// 1.5, paged stashing). Its fp8 attention and output projection are not modelled (bf16 here).
const Row kGB300Mx2608 = {"GB300 x256 MXFP8 (26.08)", "gb300-nvl72", 256,
                          "pp=2,vp=8,ep=32,mbs=1,gbs=4096,precision=mxfp8,mtp=1,recompute=none,overlap=ep+dp,"
                          "graphs=full,grads=bf16,moments=bf16",
                          6288};
// DeepSeek-V4-Flash, 128 GPUs, 26.08 (4ab94dfad; src/megatron/bridge/perf_recipes/deepseek/
// {gb200,gb300}/deepseek_v4.py): dp 128 / ep 64, mbs 1, gbs 2048, MTP 1, recompute mla_up_proj,
// HybridEP, a2a not overlapped, full-iteration CUDA graph, f32 main gradients, bf16 moments, the
// indexer trained by its KL loss (dsa_indexer_loss_coeff 0.01, the sparse loss).
constexpr const char* kV4FlashLayout =
    "dp=128,ep=64,mbs=1,gbs=2048,precision=mxfp8,mtp=1,recompute=selective,overlap=dp,graphs=full,grads=f32,"
    "moments=bf16,indexer_loss=1";
const Row kV4FlashGB200 = {"DeepSeek-V4-Flash, GB200 x128 MXFP8 (26.08)", "gb200-nvl72", 128, kV4FlashLayout, 7776,
                           "deepseek-v4-flash"};
const Row kV4FlashGB300 = {"DeepSeek-V4-Flash, GB300 x128 MXFP8 (26.08)", "gb300-nvl72", 128, kV4FlashLayout, 8224,
                           "deepseek-v4-flash"};

struct Pinned {
  Row row;
  double error;  // the planner's error docs/PLAN.md states (prediction / published - 1)
};

// docs/PLAN.md, "Validation against published runs".
const Pinned kPinned[] = {
    {kH100Cs, -0.024},  {kH100Block, +0.123}, {kGB300Bf16, +0.021}, {kGB200Graphs, -0.076},
    {kGB200Bf16, +0.037}, {kGB200Mx, -0.009}, {kGB200Guide, +0.029}, {kB200Mx, +0.354}, {kGB300Mx, +0.120},
    {kB200Mx2602, +0.182}, {kB200Mx2604, +0.129}, {kB200Mx260401, +0.109}, {kGB300Mx2602, +0.024},
    {kGB300Mx2604, -0.049}, {kGB300Mx2608, -0.131}, {kV4FlashGB200, +0.083}, {kV4FlashGB300, +0.233},
};

}  // namespace

TEST(PlanPublished, ErrorsAsDocumented) {
  for (const Pinned& p : kPinned) {
    const double e = error_of(p.row);
    EXPECT_NEAR(e, p.error, 0.04) << p.row.what << ": planner error " << e << " (update docs/PLAN.md's table)";
  }
}

TEST(PlanPublished, WithinFifteenPercent) {
  for (const Row& r : {kH100Cs, kH100Block, kGB300Bf16, kGB200Graphs, kGB200Bf16, kGB200Mx, kGB200Guide, kGB300Mx,
                       kB200Mx2604, kB200Mx260401, kGB300Mx2602, kGB300Mx2604, kGB300Mx2608, kV4FlashGB200}) {
    const double e = error_of(r);
    EXPECT_LT(std::abs(e), 0.15) << r.what << ": planner error " << e;
  }
}

TEST(PlanPublished, B200Mxfp8BeforeTheGroupedGemmStillOverPredicted) {
  for (const Row& r : {kB200Mx, kB200Mx2602}) {
    const Plan p = plan_of(r);
    const double e = p.time.tokens_per_s / (double)r.devices / r.published - 1;
    EXPECT_GT(e, 0.15) << r.what << ": " << e << " (now within 15%: move the row to WithinFifteenPercent)";
    // The host is modelled on these specs and launches thousands of kernels per micro-batch, but at
    // the published per-launch costs it stays well behind the device: it does not explain the gap.
    EXPECT_GT(p.time.host_mb, 0) << r.what;
    EXPECT_LT(p.time.host_wait, 0.03 * p.time.step) << r.what;
    // MXFP8's own kernels (quantize by operand role, scale swizzle, expert padding, the weights'
    // quantization), priced from their bytes, are a small share of the step: not the gap either
    // (docs/PLAN.md: 4.5% of the 25.11 B200 row's step).
    const double m = (double)p.time.micro_batches;
    const double mx = m * (p.time.quant_fwd + p.time.quant_bwd) + p.time.weight_cast;
    EXPECT_GT(mx, 0.03 * p.time.step) << r.what;
    EXPECT_LT(mx, 0.15 * p.time.step) << r.what;
    EXPECT_GT(p.time.swizzle, 0) << r.what;
    EXPECT_LT(p.time.swizzle, 0.2 * (p.time.quant_fwd + p.time.quant_bwd)) << r.what;
  }
  // The same layout on TE 2.14 (26.04) reads 5 points closer than on TE 2.12 (26.02): the planner
  // predicts the same for both, the published figure rose.
  EXPECT_DOUBLE_EQ(plan_of(kB200Mx2602).time.tokens_per_s, plan_of(kB200Mx2604).time.tokens_per_s);
  EXPECT_LT(error_of(kB200Mx2604), 0.15);
  // The 25.11 B200 run's all-to-all dispatcher copies the experts' rows into a padded buffer;
  // HybridEP (GB300, and B200 from 26.02) pads in the dispatch.
  EXPECT_GT(plan_of(kB200Mx).time.pad_copies, 0);
  EXPECT_EQ(plan_of(kGB300Mx).time.pad_copies, 0);
  EXPECT_EQ(plan_of(kB200Mx2604).time.pad_copies, 0);
}

// What closed the GB200 rows: the sustained clock at the power limit. GB200's and GB300's are
// extrapolated from B200's measurement (docs/PLAN.md); without them (the spec's clock held) the
// GB200 rows read +7% to +28% again.
TEST(PlanPublished, SustainedClockSensitivity) {
  for (const Pinned& p : kPinned) {
    ClusterSpec s = load_spec(p.row.cluster);
    if (s.name != "gb200-nvl72") continue;
    const ArchModel a = resolve_model(p.row.model);
    EXPECT_NEAR(s.sustained_clock, 0.81, 1e-12);
    s.sustained_clock = 1;
    const double e = evaluate(a, s, p.row.devices, parse_layout(p.row.layout, Layout{})).time.tokens_per_s /
                         (double)p.row.devices / p.row.published - 1;
    EXPECT_GT(e, p.error + 0.08) << p.row.what;
  }
}

// The GB200 / GB300 MXFP8 rows ran with the all-to-all not overlapped (docs/PLAN.md, "The
// all-to-all overlap of the GB200 / GB300 MXFP8 rows": the config matching the GB300 row's layout
// has moe_a2a_overlap=False, and NVIDIA found the overlap's benefit negative on GB200 NVL72).
// Taken as overlapped, as the table did before, the rows read about +12% and +29%: the setting is
// worth more than every MXFP8 kernel the planner prices.
TEST(PlanPublished, A2aOverlapSensitivity) {
  for (const auto& [r, want] : {std::pair{kGB200Mx, +0.121}, std::pair{kGB300Mx, +0.287}}) {
    ArchModel a = resolve_model("deepseek-v3");
    const Layout l = parse_layout(std::string(r.layout) + ",overlap=ep+dp", Layout{});
    const double e = evaluate(a, load_spec(r.cluster), r.devices, l).time.tokens_per_s / (double)r.devices / r.published - 1;
    EXPECT_NEAR(e, want, 0.04) << r.what << ": " << e;
    EXPECT_GT(e, error_of(r) + 0.08) << r.what;
  }
}

// The same hardware and model: the published MXFP8 speed-up over BF16 on GB300 is 1.13x (between the
// two rows' layouts); the planner says 1.25x at one layout, short of the 2x of the peaks (attention,
// memory-bound work and MXFP8's quantize, swizzle and padding kernels do not speed up), still
// above the published ratio (docs/PLAN.md, "Validation against published runs").
TEST(PlanPublished, LowPrecisionSpeedupIsBelowThePeakRatio) {
  ArchModel a = resolve_model("deepseek-v3");
  ClusterSpec s = load_spec("gb300-nvl72");
  const std::string base = "pp=2,vp=4,ep=32,gbs=4096,mtp=1,recompute=selective,overlap=ep+dp,precision=";
  const double bf16 = evaluate(a, s, 256, parse_layout(base + "bf16", Layout{})).time.tokens_per_s;
  const double mx = evaluate(a, s, 256, parse_layout(base + "mxfp8", Layout{})).time.tokens_per_s;
  EXPECT_GT(mx / bf16, 1.15);
  EXPECT_LT(mx / bf16, 1.35);
}

// DeepSeek-V4-Flash on Blackwell (held out, docs/PLAN.md): GB200 within 15% (+8%), GB300 still
// over-predicted (+23%). Published, GB300 is 1.06x GB200 on the same layout; the planner gives it
// 1.21x (its sustained clock at the higher power limit, 0.93 against 0.81, and the doubled
// scale-out network for the data-parallel collectives across the two NVL72 domains). What closed
// most of the GB200 row is how the V4 attention runs on these GPUs (Megatron-Core's kernels, read
// in its code): every query over its full padded slot list (FlashMLA's sparse kernels), the sparse
// attention's measured rate at this shape (cuDNN's backward), the grouped o_a in bf16 and the
// indexer's KL loss; V4SparseAttentionSensitivity says how much each moves the row.
TEST(PlanPublished, V4FlashOnBlackwell) {
  const double e200 = error_of(kV4FlashGB200), e300 = error_of(kV4FlashGB300);
  EXPECT_LT(std::abs(e200), 0.15);
  EXPECT_GT(e300, 0.15) << "now within 15%: move the row to WithinFifteenPercent";
  const double ratio = plan_of(kV4FlashGB300).time.tokens_per_s / plan_of(kV4FlashGB200).time.tokens_per_s;
  EXPECT_NEAR(ratio, 1.205, 0.03);
  EXPECT_GT(ratio, 8224.0 / 7776.0 + 0.1);
  // The model's FLOPs per token are close to Megatron-Bridge's count for this run (748 TFLOP/s at
  // 8224 tokens/s: 90.95 GFLOP; its formula leaves out the hyper-connections and the router).
  const double f = plan_of(kV4FlashGB300).time.model_flops_per_token;
  EXPECT_GT(f, 0.85 * 90.95e9);
  EXPECT_LT(f, 1.05 * 90.95e9);
}

// Each V4 attention item of the GB200 row, taken out alone (the error it then reads, within 2
// points of docs/PLAN.md's table): the padded slot lists (sparse_attention_slot_pad 0: each
// query over its attended keys), the sparse attention's rate (sparse_attention unset: the dense
// attention's 0.50) and the indexer's KL loss (indexer_loss=0). The grouped o_a's bf16 is part of
// the model (plan/arch.cpp) and not toggled here.
TEST(PlanPublished, V4SparseAttentionSensitivity) {
  const ArchModel a = resolve_model("deepseek-v4-flash");
  const Layout l = parse_layout(kV4FlashGB200.layout, Layout{});
  auto err = [&](const ClusterSpec& s, const Layout& lay) {
    return evaluate(a, s, 128, lay).time.tokens_per_s / 128.0 / kV4FlashGB200.published - 1;
  };
  const ClusterSpec base = load_spec("gb200-nvl72");
  EXPECT_EQ(base.sparse_slot_pad, 64);
  EXPECT_NEAR(base.eff.sparse_attention, 0.26, 1e-12);
  ClusterSpec unpadded = base, dense_rate = base, neither = base;
  unpadded.sparse_slot_pad = 0;
  dense_rate.eff.sparse_attention = 0;
  neither.sparse_slot_pad = 0, neither.eff.sparse_attention = 0;
  Layout no_ix = l;
  no_ix.indexer_loss = false;
  const double e = err(base, l);
  std::printf("[v4 sensitivity] GB200: %+.3f; unpadded %+.3f, dense rate %+.3f, no indexer loss %+.3f, none %+.3f\n", e,
              err(unpadded, l), err(dense_rate, l), err(base, no_ix), err(neither, no_ix));
  EXPECT_NEAR(err(unpadded, l), +0.113, 0.02) << err(unpadded, l);
  EXPECT_NEAR(err(dense_rate, l), +0.147, 0.02) << err(dense_rate, l);
  EXPECT_NEAR(err(base, no_ix), +0.103, 0.02) << err(base, no_ix);
  EXPECT_NEAR(err(neither, no_ix), +0.179, 0.02) << err(neither, no_ix);
  for (double x : {err(unpadded, l), err(dense_rate, l), err(base, no_ix), err(neither, no_ix)}) EXPECT_GT(x, e);
}
