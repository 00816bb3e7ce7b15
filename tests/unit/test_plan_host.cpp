// The planner's host (plan/host.h): the kernels a layer launches, counted by phase for DeepSeek-V3
// and V4 layers (a dropped phase fails here), the [host] spec fields and the graphs= layout key,
// the host bound binding where the device is fast and the layers small, and not binding on the
// H800 DeepSeek-V3 run or on the CPU calibration (cpu-this has no separate launching host).
#include <gtest/gtest.h>

#include <string>
#include "core/error.h"
#include "plan/host.h"
#include "plan/limits.h"
#include "plan/planner.h"

using namespace trex;
using namespace trex::plan;

namespace {

struct Expect {
  HostPhase phase;
  double fwd_ops, fwd_inner, bwd_ops, bwd_inner;
};

void expect_counts(const LayerLaunches& k, std::initializer_list<Expect> want, const std::string& what) {
  for (const Expect& e : want) {
    const int i = (int)e.phase;
    EXPECT_EQ(k.fwd[i].ops, e.fwd_ops) << what << " " << host_phase_name(e.phase) << " fwd ops";
    EXPECT_EQ(k.fwd[i].inner, e.fwd_inner) << what << " " << host_phase_name(e.phase) << " fwd inner";
    EXPECT_EQ(k.bwd[i].ops, e.bwd_ops) << what << " " << host_phase_name(e.phase) << " bwd ops";
    EXPECT_EQ(k.bwd[i].inner, e.bwd_inner) << what << " " << host_phase_name(e.phase) << " bwd inner";
  }
}

const LayerCost& first_layer(const ArchModel& a, bool moe, AttnKind kind, bool hash = false) {
  for (const LayerCost& L : a.layers)
    if (L.moe == moe && L.attn.kind == kind && L.hash_routed == hash) return L;
  throw std::runtime_error("no such layer");
}

std::string spec_error(const std::string& host) {
  const std::string text = R"(
[device]
peak_bf16_tflops = 100
memory_gb = 10
memory_bandwidth_gbs = 1000
[network]
devices_per_node = 1
inter_node_gbs = 10
)" + host;
  try {
    parse_spec_toml(text, "x.toml");
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// DeepSeek-V3 MoE layer, 8 local experts (ep=32), by hand from the table in plan/host.h.
TEST(PlanHost, KernelCountsDeepSeekV3) {
  ArchModel a = resolve_model("deepseek-v3");
  const LayerCost& moe = first_layer(a, true, AttnKind::MLA);
  Layout l = parse_layout("ep=32,tp=2", Layout{});
  // bf16: attention 15 ops forward (norm, q down / norm / up, kv down / norm / up, 3 splits, 2 RoPE,
  // core, o, add); backward 15 ops + 3 norm reductions + 5 second GEMMs + the core's preprocessing.
  LayerLaunches k = layer_launches(moe, l, 256 / 32);
  expect_counts(k,
                {{HostPhase::Attention, 15, 0, 15, 9},
                 {HostPhase::Router, 17, 0, 4, 1},
                 {HostPhase::Dispatch, 4, 1, 4, 1},
                 {HostPhase::Experts, 3, 14, 3, 30},  // fc1, act, fc2; 7 + 7 more GEMMs, 15 + 15 backward
                 {HostPhase::Ffn, 6, 0, 6, 3},        // norm, shared fc1 / act / fc2, add, residual
                 {HostPhase::Collectives, 2, 0, 2, 0}},
                "v3 moe bf16");
  EXPECT_TRUE(k.sync);
  EXPECT_EQ(k.total_fwd().total(), 62);
  EXPECT_EQ(k.total_bwd().total(), 78);
  // mxfp8: each linear adds a quantize and a swizzle forward, a quantize and two swizzles backward;
  // each grouped GEMM a quantize per expert and one swizzle (two backward).
  l.precision = Precision::MXFP8;
  k = layer_launches(moe, l, 8);
  expect_counts(k,
                {{HostPhase::Attention, 15, 10, 15, 24},
                 {HostPhase::Router, 17, 0, 4, 1},
                 {HostPhase::Experts, 3, 14 + 2 * 9, 3, 30 + 2 * 10},
                 {HostPhase::Ffn, 6, 4, 6, 3 + 2 * 3}},
                "v3 moe mxfp8");
  EXPECT_EQ(k.total_fwd().total(), 94);
  EXPECT_EQ(k.total_bwd().total(), 119);
  EXPECT_EQ(k.after_sync.ops, 3);
  EXPECT_EQ(k.after_sync.inner, 1 + 8 + 1);
  // Dense layer: no router, dispatch or experts; fc1, act, fc2 in the FFN phase; no sync.
  const LayerCost& dense = first_layer(a, false, AttnKind::MLA);
  k = layer_launches(dense, parse_layout("ep=32", Layout{}), 8);
  expect_counts(k,
                {{HostPhase::Router, 0, 0, 0, 0},
                 {HostPhase::Experts, 0, 0, 0, 0},
                 {HostPhase::Ffn, 5, 0, 5, 3},
                 {HostPhase::Collectives, 0, 0, 0, 0}},
                "v3 dense");
  EXPECT_FALSE(k.sync);
  // Full CUDA graphs need a sync-free MoE.
  EXPECT_FALSE(layer_launches(moe, parse_layout("ep=32,graphs=full", Layout{}), 8).sync);
  // The alltoall dispatcher (dedup=0): the fused router alone is 31 kernels, 6 ops each way to move tokens.
  k = layer_launches(moe, parse_layout("ep=32,dedup=0", Layout{}), 8);
  expect_counts(k, {{HostPhase::Router, 31, 0, 4, 1}, {HostPhase::Dispatch, 6, 0, 6, 0}}, "v3 dedup=0");
}

// DeepSeek-V4-Flash CSA layer (learned routing): hyper-connections around both sublayers, the
// compressor and the forward-only indexer.
TEST(PlanHost, KernelCountsDeepSeekV4) {
  ArchModel a = resolve_model("deepseek-v4-flash");
  const LayerCost& csa = first_layer(a, true, AttnKind::CSA);
  Layout l = parse_layout("ep=32", Layout{});
  LayerLaunches k = layer_launches(csa, l, 8);
  expect_counts(k,
                {{HostPhase::Attention, 30, 0, 22, 13},
                 {HostPhase::Router, 17, 0, 4, 1},
                 {HostPhase::Dispatch, 4, 1, 4, 1},
                 {HostPhase::Experts, 3, 14, 3, 30},
                 {HostPhase::Ffn, 10, 0, 10, 5},
                 {HostPhase::Collectives, 0, 0, 0, 0}},
                "v4 csa bf16");
  // HCA: no indexer (8 forward-only ops fewer), the compressor stays.
  const LayerCost& hca = first_layer(a, true, AttnKind::HCA);
  EXPECT_EQ(layer_launches(hca, l, 8).fwd[(int)HostPhase::Attention].ops, 22);
  // Hash-routed layers look their experts up: 3 router ops forward, 2 backward.
  const LayerCost& hash = a.layers.front();
  ASSERT_TRUE(hash.hash_routed);
  expect_counts(layer_launches(hash, l, 8), {{HostPhase::Router, 3, 0, 2, 0}}, "v4 hash");
  // The hyper-connection mixing stays bf16: under mxfp8 only the other linears add quantize kernels.
  l.precision = Precision::MXFP8;
  k = layer_launches(csa, l, 8);
  EXPECT_EQ(k.fwd[(int)HostPhase::Attention].inner, 2 * (3 + 2 + 4 + 2));  // q_a, q_b, kv; compressor 2; indexer 4; o_a, o_b
}

TEST(PlanHost, CapturedPhasesCostOneGraphLaunch) {
  ArchModel a = resolve_model("deepseek-v3");
  const LayerCost& moe = first_layer(a, true, AttnKind::MLA);
  HostCost h{"x86", 10e-6, 2e-6};
  Layout off = parse_layout("ep=32", Layout{}), part = parse_layout("ep=32,graphs=partial", Layout{});
  const LayerLaunches k = layer_launches(moe, off, 8);
  const double eager = layer_host_seconds(k, false, off, h);
  EXPECT_NEAR(eager, k.total_fwd().ops * 10e-6 + k.total_fwd().inner * 2e-6, 1e-12);
  // Partial: attention, router and the FFN phase (shared experts) captured: two graph launches.
  const LayerLaunches kp = layer_launches(moe, part, 8);
  const double partial = layer_host_seconds(kp, false, part, h);
  const auto& f = kp.fwd;
  const double eager_part = host_seconds(f[(int)HostPhase::Dispatch], h) + host_seconds(f[(int)HostPhase::Experts], h);
  EXPECT_NEAR(partial, eager_part + 2 * 10e-6, 1e-12);
  EXPECT_LT(partial, eager);
  EXPECT_EQ(layer_host_seconds(kp, false, parse_layout("ep=32,graphs=full", Layout{}), h), 0);
}

TEST(PlanHost, SpecFieldsParsedAndRefused) {
  ClusterSpec g = load_spec("gb200-nvl72");
  EXPECT_EQ(g.host.cpu, "grace");
  EXPECT_NEAR(g.host.op_s, 37e-6, 1e-12);
  EXPECT_NEAR(g.host.launch_s, 3e-6, 1e-12);
  for (const char* n : {"h800", "h100", "h200", "b200"}) EXPECT_EQ(load_spec(n).host.cpu, "x86") << n;
  EXPECT_EQ(load_spec("gb300-nvl72").host.cpu, "grace");
  EXPECT_FALSE(load_spec("ascend-910c").host.modelled());  // no source found: not modelled
  EXPECT_EQ(spec_error(""), "");
  EXPECT_EQ(spec_error("[host]\ncpu = \"x86\"\nop_us = 10\nlaunch_us = 2\n"), "");
  auto has = [](const std::string& e, const std::string& s) { return e.find(s) != std::string::npos; };
  std::string e = spec_error("[host]\ncpu = \"pentium\"\nop_us = 10\nlaunch_us = 2\n");
  EXPECT_TRUE(has(e, "x.toml") && has(e, "[host] cpu") && has(e, "pentium")) << e;
  e = spec_error("[host]\ncpu = \"x86\"\nop_us = -1\nlaunch_us = 2\n");
  EXPECT_TRUE(has(e, "x.toml") && has(e, "[host] op_us")) << e;
  e = spec_error("[host]\ncpu = \"x86\"\nlaunch_us = 2\n");
  EXPECT_TRUE(has(e, "x.toml") && has(e, "[host] op_us is required")) << e;
  e = spec_error("[host]\ncpu = \"x86\"\nop_us = 5000\nlaunch_us = 2\n");
  EXPECT_TRUE(has(e, "x.toml") && has(e, "op_us")) << e;
  e = spec_error("[host]\ncpu = \"x86\"\nop_us = 1\nlaunch_us = 2\nper_op = 3\n");
  EXPECT_TRUE(has(e, "x.toml") && has(e, "per_op") && has(e, "[host]")) << e;
  e = spec_error("[host]\ncpu = 3\nop_us = 1\nlaunch_us = 2\n");
  EXPECT_TRUE(has(e, "x.toml") && has(e, "cpu")) << e;
  // The layout key.
  EXPECT_EQ(parse_layout("graphs=partial", Layout{}).graphs, Graphs::Partial);
  EXPECT_EQ(parse_layout("graphs=full", Layout{}).graphs, Graphs::Full);
  EXPECT_EQ(Layout{}.graphs, Graphs::Off);
  try {
    parse_layout("graphs=some", Layout{});
    FAIL() << "graphs=some accepted";
  } catch (const UserError& x) {
    EXPECT_TRUE(has(x.what(), "graphs=some")) << x.what();
  }
  EXPECT_NE(layout_string(parse_layout("graphs=full", Layout{})).find("graphs=full"), std::string::npos);
}

// A fast device and small layers: the host's launches take longer than the device's work.
TEST(PlanHost, BindsWhereLaunchesOutlastTheDevice) {
  ArchModel a = resolve_model("configs/bench-v3.toml");
  ClusterSpec s = load_spec("gb200-nvl72");
  Plan off = evaluate(a, s, 1, parse_layout("seq=256,gbs=4", Layout{}));
  const StepTime& t = off.time;
  EXPECT_GT(t.host_mb, t.device_t_mb);
  EXPECT_GT(t.host_wait, 0.5 * t.step);
  EXPECT_GE(t.t_mb, t.host_mb);
  ASSERT_FALSE(off.limits.empty());
  EXPECT_EQ(off.limits.front().phase, "host (kernel launches)");
  EXPECT_NE(off.limits.front().helps.find("graphs="), std::string::npos);
  bool noted = false;
  for (const std::string& n : off.notes) noted = noted || n.find("host-bound") != std::string::npos;
  EXPECT_TRUE(noted);
  // CUDA graphs lift the bound: partial leaves the routed experts eager, full launches one graph.
  Plan part = evaluate(a, s, 1, parse_layout("seq=256,gbs=4,graphs=partial", Layout{}));
  Plan full = evaluate(a, s, 1, parse_layout("seq=256,gbs=4,graphs=full", Layout{}));
  EXPECT_LT(part.time.step, off.time.step);
  EXPECT_LT(full.time.step, part.time.step);
  EXPECT_LT(full.time.host_wait, 0.01 * full.time.step);
  EXPECT_EQ(full.time.host_syncs_mb, 0);
  // A longer sequence gives the device more work per launch: the host binds less.
  Plan longer = evaluate(a, s, 1, parse_layout("seq=2048,gbs=4", Layout{}));
  EXPECT_LT(longer.time.host_wait / longer.time.step, t.host_wait / t.step);
}

// The DeepSeek-V3 pre-training layout on 2048 H800: large micro-batches of 4096 tokens per layer;
// the host is modelled (x86) and far from binding.
TEST(PlanHost, NotBindingOnH800) {
  ArchModel a = resolve_model("deepseek-v3");
  Plan p = evaluate(a, load_spec("h800"), 2048,
                    parse_layout("pp=16,ep=64,zero=1,gbs=15360,seq=4096,recompute=selective,schedule=dualpipe,"
                                 "precision=fp8,moments=bf16,mtp=1",
                                 Layout{}));
  EXPECT_GT(p.time.host_mb, 0);
  EXPECT_GT(p.time.host_syncs_mb, 0);
  EXPECT_LT(p.time.host_mb, 0.1 * p.time.device_t_mb);
  EXPECT_LT(p.time.host_wait, 0.01 * p.time.step);
}

// cpu-this: trex's CPU engine runs its kernels on the host itself; its calibration measures them.
TEST(PlanHost, NotModelledOnTheCpuCalibration) {
  ArchModel a = resolve_model("configs/bench-v3.toml");
  ClusterSpec s = load_spec("cpu-this");
  EXPECT_FALSE(s.host.modelled());
  Plan p = evaluate(a, s, 1, parse_layout("seq=2048,gbs=1", Layout{}));
  EXPECT_EQ(p.time.host_mb, 0);
  EXPECT_EQ(p.time.host_wait, 0);
  EXPECT_EQ(p.time.t_mb, p.time.device_t_mb);
}
