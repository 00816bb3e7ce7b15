// Planner precision recipes (plan/precision.h), interleaved pipelines (vp), the new built-in
// cluster specs and the step-limit analysis (plan/limits.h).
#include <gtest/gtest.h>

#include <string>
#include "core/error.h"
#include "plan/gemm.h"
#include "plan/planner.h"
#include "plan/precision.h"

using namespace trex;
using namespace trex::plan;

namespace {

std::string error_of(const ClusterSpec& s, Precision p) {
  try {
    precision_model(s, p);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

Plan v3(const char* cluster, int64_t devices, const std::string& layout) {
  return evaluate(resolve_model("deepseek-v3"), load_spec(cluster), devices, parse_layout(layout, Layout{}));
}

}  // namespace

TEST(PlanPrecision, RecipesOnTheirDevices) {
  const ClusterSpec h100 = load_spec("h100"), b200 = load_spec("b200"), gb300 = load_spec("gb300-nvl72");
  PrecisionModel bf = precision_model(h100, Precision::BF16);
  EXPECT_FALSE(bf.low);
  EXPECT_DOUBLE_EQ(bf.gemm_peak, h100.peak_bf16);
  EXPECT_EQ(bf.quant_fwd + bf.quant_bwd + bf.quant_grad + bf.cached_bytes, 0);
  EXPECT_EQ(bf.swizzle_fwd + bf.swizzle_bwd + bf.swizzle_grad + bf.weight_swizzle + bf.align_rows, 0);
  EXPECT_EQ(expert_pad_rows(bf), 0);
  EXPECT_EQ(bf.dispatch_bytes, 2);

  PrecisionModel block = precision_model(h100, Precision::FP8);  // DeepSeek-V3's recipe
  EXPECT_DOUBLE_EQ(block.gemm_peak, h100.peak_fp8);
  EXPECT_DOUBLE_EQ(block.gemm_eff, h100.eff.gemm_fp8);
  EXPECT_DOUBLE_EQ(block.quant_fwd, 3 + 4.0 / 128);
  EXPECT_DOUBLE_EQ(block.quant_bwd, 2 + 4.0 / 128);   // the cached input, transposed
  EXPECT_DOUBLE_EQ(block.quant_grad, 4 + 8.0 / 128);  // the output gradient, row- and column-wise
  EXPECT_EQ(block.align_rows, 16);
  EXPECT_EQ(block.swizzle_fwd + block.weight_swizzle, 0);  // no hardware scale layout
  EXPECT_DOUBLE_EQ(block.cached_bytes, 1 + 4.0 / 128);
  EXPECT_DOUBLE_EQ(block.dispatch_bytes, 1 + 4.0 / 128);

  PrecisionModel cs = precision_model(h100, Precision::FP8Tensor);
  EXPECT_EQ(cs.quant_fwd, 6);  // amax pass + quantize to row- and column-wise copies
  EXPECT_EQ(cs.quant_bwd, 0);
  EXPECT_EQ(cs.quant_grad, 6);
  EXPECT_EQ(cs.dispatch_bytes, 2);

  PrecisionModel mx = precision_model(b200, Precision::MXFP8);
  EXPECT_DOUBLE_EQ(mx.gemm_peak, b200.peak_fp8);
  EXPECT_DOUBLE_EQ(mx.quant_fwd, 4 + 2.0 / 32);
  EXPECT_DOUBLE_EQ(mx.quant_bwd, 0);  // the column-wise copy is written in the forward
  EXPECT_DOUBLE_EQ(mx.quant_grad, 4 + 2.0 / 32);
  EXPECT_DOUBLE_EQ(mx.cached_bytes, 1 + 1.0 / 32);
  // Scales (1/32 B an element) read and written before each GEMM: one copy forward, the input's
  // column-wise one and the gradient's two backward; each weight's two copies every micro-batch.
  EXPECT_DOUBLE_EQ(mx.swizzle_fwd, 1.0 / 16);
  EXPECT_DOUBLE_EQ(mx.swizzle_bwd, 1.0 / 16);
  EXPECT_DOUBLE_EQ(mx.swizzle_grad, 2.0 / 16);
  EXPECT_DOUBLE_EQ(mx.weight_swizzle, 2.0 / 16);
  EXPECT_EQ(mx.align_rows, 32);
  EXPECT_DOUBLE_EQ(expert_pad_rows(mx), 15.5);

  PrecisionModel f4 = precision_model(gb300, Precision::MXFP4);
  EXPECT_DOUBLE_EQ(f4.gemm_peak, 15000e12);
  EXPECT_DOUBLE_EQ(f4.gemm_eff, gb300.eff.gemm_fp8);  // no gemm_fp4 key: the fp8 value
  EXPECT_LT(f4.cached_bytes, 1);
}

TEST(PlanPrecision, RefusedWhereTheHardwareLacksIt) {
  EXPECT_NE(error_of(load_spec("h100"), Precision::MXFP8).find("no hardware block-scaled"), std::string::npos);
  EXPECT_NE(error_of(load_spec("mi300x"), Precision::MXFP8).find("no hardware block-scaled"), std::string::npos);
  EXPECT_NE(error_of(load_spec("h800"), Precision::MXFP4).find("no fp4 matmul"), std::string::npos);
  EXPECT_NE(error_of(load_spec("ascend-910c"), Precision::FP8).find("peak_fp8 = 0"), std::string::npos);
  EXPECT_EQ(error_of(load_spec("mi355x"), Precision::MXFP4), "");
  EXPECT_EQ(error_of(load_spec("gb200-nvl72"), Precision::MXFP8), "");
}

TEST(PlanPrecision, LayoutNames) {
  EXPECT_EQ(parse_layout("precision=fp8-block", Layout{}).precision, Precision::FP8);
  EXPECT_EQ(parse_layout("precision=fp8-tensor", Layout{}).precision, Precision::FP8Tensor);
  EXPECT_EQ(parse_layout("precision=mxfp8", Layout{}).precision, Precision::MXFP8);
  EXPECT_EQ(parse_layout("precision=nvfp4", Layout{}).precision, Precision::MXFP4);
  Layout l = parse_layout("precision=mxfp4,vp=3", Layout{});
  EXPECT_EQ(parse_layout(layout_string([&] { l.dp = 1; l.gbs = 9; return l; }()), Layout{}).precision, Precision::MXFP4);
  EXPECT_EQ(parse_layout(layout_string(l), Layout{}).vp, 3);
  EXPECT_THROW(parse_layout("precision=fp6", Layout{}), UserError);
}

TEST(PlanPrecision, QuantizeTrafficAndTheMemoryBoundWork) {
  // pp=1: the same layers on the one rank under both recipes (fit in memory does not matter here).
  const std::string base = "ep=32,gbs=2048,mtp=1,recompute=selective,precision=";
  Plan bf = v3("gb200-nvl72", 256, base + "bf16"), mx = v3("gb200-nvl72", 256, base + "mxfp8");
  EXPECT_EQ(bf.time.quant_fwd, 0);
  EXPECT_GT(mx.time.quant_fwd, 0);
  // MXFP8 backward: the output gradients (more elements than the inputs in DeepSeek-V3: the MLA
  // up-projections' outputs are wide) and three scale swizzles to the forward's one.
  EXPECT_GT(mx.time.quant_bwd, 1.2 * mx.time.quant_fwd);
  EXPECT_LT(mx.time.quant_bwd, 2.0 * mx.time.quant_fwd);
  EXPECT_GT(mx.time.swizzle, 0);
  EXPECT_LT(mx.time.swizzle, 0.2 * (mx.time.quant_fwd + mx.time.quant_bwd));
  EXPECT_EQ(bf.time.swizzle, 0);
  // The GEMMs speed up, the attention core and the memory-bound work do not: well below 2x.
  EXPECT_LT(mx.time.gemm, 0.6 * bf.time.gemm);
  EXPECT_DOUBLE_EQ(mx.time.attention, bf.time.attention);
  EXPECT_GT(mx.time.memory_bound, bf.time.memory_bound);
  const double speedup = mx.time.tokens_per_s / bf.time.tokens_per_s;
  EXPECT_GT(speedup, 1.1);
  EXPECT_LT(speedup, 1.8);
  // Cached GEMM inputs at 1 B + a scale per 32: fewer activation bytes.
  EXPECT_LT(mx.memory.act_per_token_layer[0], bf.memory.act_per_token_layer[0]);

  // Hopper: per-tensor current scaling moves more bytes than 1x128 blocks (an amax pass, bf16
  // dispatch) at the same GEMM rate, so it is slower.
  const std::string h = "tp=2,ep=64,gbs=4096,mtp=1,recompute=selective,precision=";
  Plan cs = v3("h100", 1024, h + "fp8-tensor"), bl = v3("h100", 1024, h + "fp8");
  EXPECT_DOUBLE_EQ(cs.time.gemm, bl.time.gemm);
  EXPECT_GT(cs.time.memory_bound, bl.time.memory_bound);
  EXPECT_GT(cs.time.comm_ep, bl.time.comm_ep);
  EXPECT_LT(cs.time.tokens_per_s, bl.time.tokens_per_s);
  EXPECT_GT(bl.time.weight_cast, 0);
}

// The operands each recipe quantizes, per token of a DeepSeek-V3 MoE layer (plan/arch.h): the
// linear layers' inputs forward, their output gradients backward; router excluded (bf16).
TEST(PlanPrecision, QuantizedOperandsOfALayer) {
  const ArchModel a = resolve_model("deepseek-v3");
  const LayerCost& L = a.layers.back();  // MoE
  ASSERT_TRUE(L.moe);
  const double d = 7168, ql = 1536, kl = 512, rope = 64, H = 128, qk = 192, nope = 128, v = 128;
  const double Is = 2048, I = 2048, k = 8;
  EXPECT_DOUBLE_EQ(L.q_in, (d + ql) + d + kl + H * v + d + Is);
  EXPECT_DOUBLE_EQ(L.q_grad, (ql + H * qk) + (kl + rope) + H * (nope + v) + d + 2 * Is + d);
  EXPECT_DOUBLE_EQ(L.q_in_routed, k * (d + I));
  EXPECT_DOUBLE_EQ(L.q_grad_routed, k * (2 * I + d));
  const LayerCost& D = a.layers.front();  // dense MLP
  ASSERT_FALSE(D.moe);
  EXPECT_DOUBLE_EQ(D.q_in - L.q_in, (d + 18432) - (d + Is));
  EXPECT_EQ(D.q_in_routed + D.q_grad_routed, 0);
}

// Per-expert padding (plan/precision.h): rows added to every expert's GEMMs under a low-precision
// recipe; copies into and out of the padded buffer only without the flex dispatcher (dedup=0).
TEST(PlanPrecision, ExpertPaddingUnderLowPrecision) {
  const std::string base = "pp=16,ep=8,gbs=2048,mtp=1,recompute=selective,overlap=dp,precision=";
  Plan bf = v3("b200", 256, base + "bf16"), bf0 = v3("b200", 256, base + "bf16,dedup=0");
  Plan mx = v3("b200", 256, base + "mxfp8"), mx0 = v3("b200", 256, base + "mxfp8,dedup=0");
  EXPECT_EQ(bf0.time.pad_copies, 0);  // bf16: no alignment
  EXPECT_EQ(mx.time.pad_copies, 0);   // padded in the dispatch
  EXPECT_GT(mx0.time.pad_copies, 0);
  // 16 B per routed element per micro-batch (pad and unpad, each direction, read + write 2 B).
  const ClusterSpec s = load_spec("b200");
  const double tokens = 4096, layers_on_rank = 4;  // the slowest rank's MoE layers at pp 16
  const double want = tokens * 8 * 7168 * 16 / (s.mem_bw * s.eff.memory);
  EXPECT_GT(mx0.time.pad_copies, 0.9 * want);
  EXPECT_LT(mx0.time.pad_copies, 1.1 * (layers_on_rank + 1) * want);
  EXPECT_LT(mx0.time.tokens_per_s, mx.time.tokens_per_s);
  EXPECT_DOUBLE_EQ(bf0.time.experts, bf.time.experts);
  // The padded rows: 15.5 more per expert than the 1024 received, at the expert GEMMs' rate.
  Layout l = parse_layout(base + "mxfp8", Layout{});
  const ArchModel a = resolve_model("deepseek-v3");
  const GemmDevice dev = gemm_device(s, 1e15);
  const LayerCost& L = a.layers.back();
  const ExpertGemms x = expert_gemms(L, l, a.hidden, tokens, dev, 1.03);
  const ExpertGemms xp = expert_gemms(L, l, a.hidden, tokens, dev, 1.03, 15.5);
  EXPECT_DOUBLE_EQ(x.rows, 1024);
  EXPECT_DOUBLE_EQ(xp.rows, 1024);
  EXPECT_NEAR(xp.fwd / x.fwd, (1024 + 15.5) / 1024, 1e-9);
}

// Megatron-Bridge's December 2025 MXFP8 recipes for GB200 / GB300 turned the overlapped parameter
// all-gather off: `param_gather=exposed` puts it on the step.
TEST(PlanPrecision, ParamGatherExposed) {
  EXPECT_TRUE(parse_layout("", Layout{}).overlap_param_gather);
  Layout l = parse_layout("param_gather=exposed", Layout{});
  EXPECT_FALSE(l.overlap_param_gather);
  l.dp = 1, l.gbs = 4;  // layout_string writes every key
  EXPECT_FALSE(parse_layout(layout_string(l), Layout{}).overlap_param_gather);
  EXPECT_TRUE(parse_layout("param_gather=overlap", l).overlap_param_gather);
  EXPECT_THROW(parse_layout("param_gather=maybe", Layout{}), UserError);
  const std::string base = "pp=2,vp=4,ep=32,gbs=4096,precision=mxfp8,overlap=ep+dp";
  Plan on = v3("gb300-nvl72", 256, base), off = v3("gb300-nvl72", 256, base + ",param_gather=exposed");
  EXPECT_GT(off.time.dp_exposed, on.time.dp_exposed);
  EXPECT_LE(off.time.dp_exposed, off.time.dp_comm + 1e-12);
  EXPECT_LT(off.time.tokens_per_s, on.time.tokens_per_s);
}

TEST(PlanPrecision, InterleavedPipeline) {
  const std::string base = "pp=8,ep=32,gbs=2048,mtp=1,recompute=selective,precision=mxfp8,vp=";
  Plan one = v3("b200", 256, base + "1"), four = v3("b200", 256, base + "4");
  EXPECT_LT(four.time.bubble, 0.3 * one.time.bubble);    // (pp-1)/vp micro-batch times
  EXPECT_NEAR(four.time.comm_pp, 4 * one.time.comm_pp, 1e-9 * one.time.comm_pp);  // vp x the transfers
  EXPECT_GT(four.memory.peak().inflight, one.memory.peak().inflight);
  ArchModel a = resolve_model("deepseek-v3");
  Layout dual = parse_layout("pp=8,ep=32,gbs=2048,vp=2,schedule=dualpipe", Layout{});
  EXPECT_THROW(validate_layout(dual, a, 256), UserError);
  Layout odd = parse_layout("pp=8,ep=32,gbs=96,vp=2", Layout{});  // 3 micro-batches per rank, not a multiple of pp
  EXPECT_THROW(validate_layout(odd, a, 256), UserError);
}

TEST(PlanPrecision, NewSpecs) {
  ClusterSpec gb200 = load_spec("gb200-nvl72"), gb300 = load_spec("gb300-nvl72");
  EXPECT_EQ(gb200.devices_per_node, 72);
  EXPECT_EQ(gb300.devices_per_node, 72);
  EXPECT_TRUE(gb200.mx_formats && gb300.mx_formats && load_spec("b200").mx_formats && load_spec("mi355x").mx_formats);
  EXPECT_FALSE(load_spec("h100").mx_formats || load_spec("mi300x").mx_formats);
  EXPECT_GT(gb300.peak_fp4, gb200.peak_fp4);
  EXPECT_GT(gb300.inter_bw, gb200.inter_bw);  // ConnectX-8 against ConnectX-7
  EXPECT_DOUBLE_EQ(load_spec("mi300x").peak_bf16, 1307.4e12);
  ClusterSpec cm = load_spec("cloudmatrix384"), a3 = load_spec("ascend-910c");
  EXPECT_EQ(cm.devices_per_node, 768);
  EXPECT_DOUBLE_EQ(cm.peak_bf16, a3.peak_bf16);
  for (const std::string& n : builtin_spec_names()) EXPECT_FALSE(load_spec(n).source.empty()) << n;
  EXPECT_THROW(parse_spec_toml("[device]\npeak_bf16_tflops = 1\nmemory_gb = 1\nmemory_bandwidth_gbs = 1\n"
                               "mx_formats = 3\n[network]\ninter_node_gbs = 1\n", "x.toml"),
               UserError);
}

TEST(PlanPrecision, WhatLimitsTheStep) {
  // H100, ep=64 over 8 nodes, all-to-all not overlapped: the a2a on the inter-node network leads.
  Plan h = v3("h100", 1024, "tp=2,pp=8,vp=4,ep=64,gbs=8192,precision=fp8-tensor,mtp=1,recompute=selective,overlap=dp");
  ASSERT_FALSE(h.limits.empty());
  EXPECT_EQ(h.limits.front().phase, "expert all-to-all");
  EXPECT_NE(h.limits.front().bound_by.find("inter-node"), std::string::npos);
  EXPECT_NE(h.limits.front().helps.find("overlap=ep"), std::string::npos);
  for (size_t i = 1; i < h.limits.size(); ++i) EXPECT_GE(h.limits[i - 1].exposed, h.limits[i].exposed);
  // GB200, ep inside the NVLink domain and overlapped: the a2a runs on NVLink and mostly hides.
  Plan g = v3("gb200-nvl72", 256, "pp=4,vp=4,ep=64,gbs=4096,precision=mxfp8,mtp=1,recompute=selective");
  for (const Limit& l : g.limits)
    if (l.phase == "expert all-to-all") {
      EXPECT_NE(l.bound_by.find("scale-up"), std::string::npos);
      EXPECT_LT(l.exposed, 0.2 * l.busy);
    }
  EXPECT_NE(g.limits.front().phase, "expert all-to-all");
  // Why one layout beats another: the keys that differ and the step components.
  Plan slow = v3("gb200-nvl72", 256, "pp=4,vp=4,ep=64,gbs=4096,precision=mxfp8,mtp=1,recompute=selective,overlap=dp");
  const std::string why = why_faster(g.layout, g.time, slow.layout, slow.time);
  EXPECT_NE(why.find("a step faster"), std::string::npos) << why;
  EXPECT_NE(why.find("exposed communication"), std::string::npos) << why;
  EXPECT_NE(why_faster(g.layout, g.time, g.layout, g.time).find("as fast as the next"), std::string::npos);
}
