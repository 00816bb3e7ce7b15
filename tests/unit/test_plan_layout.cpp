// Planner layouts: parsing, validation that names the failing product or divisibility, stage
// balancing, the 1F1B bubble, and the time model's basic monotonicity.
#include <gtest/gtest.h>

#include <numeric>
#include "core/error.h"
#include "plan/planner.h"

using namespace trex;
using namespace trex::plan;

namespace {

std::string error_of(const std::string& layout, int64_t devices, const std::string& model = "deepseek-v3") {
  ArchModel a = resolve_model(model);
  Layout l = parse_layout(layout, Layout{});
  try {
    validate_layout(l, a, devices);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

std::string parse_error(const std::string& layout) {
  try {
    parse_layout(layout, Layout{});
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(PlanLayout, ParseAndDerive) {
  Layout l = parse_layout("tp=2,pp=4,ep=8,mbs=2,gbs=512,seq=8192,recompute=selective,zero=2,schedule=dualpipe,"
                          "precision=fp8,overlap=ep+tp,mtp=1,moments=bf16,grads=bf16,dedup=0,expert_load=1.25",
                          Layout{});
  EXPECT_EQ(l.tp, 2);
  EXPECT_EQ(l.pp, 4);
  EXPECT_EQ(l.ep, 8);
  EXPECT_EQ(l.mbs, 2);
  EXPECT_EQ(l.gbs, 512);
  EXPECT_EQ(l.seq, 8192);
  EXPECT_EQ(l.recompute, Recompute::Selective);
  EXPECT_EQ(l.zero, 2);
  EXPECT_EQ(l.schedule, Schedule::DualPipe);
  EXPECT_EQ(l.precision, Precision::FP8);
  EXPECT_TRUE(l.overlap_ep && l.overlap_tp && !l.overlap_dp && !l.overlap_pp);
  EXPECT_TRUE(l.mtp);
  EXPECT_EQ(l.moment_bytes, 2);
  EXPECT_EQ(l.grad_bytes, 2);
  EXPECT_FALSE(l.ep_dedup);
  EXPECT_DOUBLE_EQ(l.expert_load, 1.25);
  ArchModel a = resolve_model("deepseek-v3");
  validate_layout(l, a, 256);
  EXPECT_EQ(l.dp, 32);       // 256 / (tp 2 * pp 4)
  EXPECT_EQ(l.edp(), 8);     // dp*tp/ep, as Megatron-Core folds experts into dp x tp
  EXPECT_EQ(l.micro_batches(), 8);
  // The canonical string parses back to the same layout.
  Layout r = parse_layout(layout_string(l), Layout{});
  EXPECT_EQ(layout_string(r), layout_string(l));
  EXPECT_EQ(layout_keys("tp=2,micro_batch=4,seq=1"), (std::vector<std::string>{"tp", "mbs", "seq"}));
  // Default global batch: 4 sequences per device.
  Layout d = parse_layout("pp=2", Layout{});
  validate_layout(d, a, 64);
  EXPECT_EQ(d.gbs, 256);
}

TEST(PlanLayout, InvalidLayoutsNameTheFailure) {
  EXPECT_NE(error_of("tp=3", 48).find("attention heads (128) must be divisible by tp (3)"), std::string::npos);
  EXPECT_NE(error_of("ep=3", 48).find("routed experts (256) must be divisible by ep (3)"), std::string::npos);
  EXPECT_NE(error_of("ep=64", 32).find("ep*etp (64*1 = 64) must divide dp*cp*tp (32*1*1 = 32)"), std::string::npos);
  EXPECT_NE(error_of("tp=4,pp=4", 24).find("devices (24) must be divisible by tp*pp*cp (4*4*1 = 16)"), std::string::npos);
  EXPECT_NE(error_of("dp=4,tp=2,pp=2", 32).find("dp*cp*tp*pp (4*1*2*2 = 16) must equal the devices (32)"),
            std::string::npos);
  EXPECT_NE(error_of("pp=64", 64).find("pp (64) must not exceed the decoder layers (61)"), std::string::npos);
  EXPECT_NE(error_of("gbs=100,mbs=2", 16).find("global batch (100 sequences) must be divisible by dp*mbs (16*2 = 32)"),
            std::string::npos);
  EXPECT_NE(error_of("pp=3,schedule=dualpipe", 6).find("dualpipe needs an even pp"), std::string::npos);
  EXPECT_NE(error_of("pp=4,schedule=dualpipe,gbs=4", 8).find("even number of micro-batches"), std::string::npos);
  EXPECT_NE(error_of("zero=3,pp=2", 4).find("zero=3 with pp (2)"), std::string::npos);
  EXPECT_EQ(error_of("mtp=1", 8, "deepseek-v4-flash"), "");
  // The indexer's KL loss needs an indexer (V3.2, V4's CSA layers); it round-trips in the string.
  EXPECT_EQ(error_of("indexer_loss=1", 8, "deepseek-v4-flash"), "");
  EXPECT_EQ(error_of("indexer_loss=1", 8, "deepseek-v3.2"), "");
  EXPECT_NE(error_of("indexer_loss=1", 8).find("indexer_loss=1 but the model has no sparse-attention indexer"),
            std::string::npos);
  EXPECT_TRUE(parse_layout(layout_string(parse_layout("dp=8,gbs=32,indexer_loss=1", Layout{})), Layout{}).indexer_loss);
  EXPECT_EQ(layout_string(Layout{}).find("indexer_loss"), std::string::npos);
  EXPECT_NE(parse_error("indexer_loss=2").find("indexer_loss=2"), std::string::npos);
  EXPECT_NE(error_of("ep=7", 8, "deepseek-v4-pro").find("routed experts (384) must be divisible by ep (7)"),
            std::string::npos);
  // Several problems are all reported.
  std::string many = error_of("tp=3,ep=3", 48);
  EXPECT_NE(many.find("tp (3)"), std::string::npos);
  EXPECT_NE(many.find("ep (3)"), std::string::npos);
  // Bad syntax names the key.
  EXPECT_NE(parse_error("tp=two").find("tp=two"), std::string::npos);
  EXPECT_NE(parse_error("xp=2").find("unknown key 'xp'"), std::string::npos);
  EXPECT_NE(parse_error("recompute=some").find("recompute=some"), std::string::npos);
  EXPECT_NE(parse_error("overlap=ep+zz").find("'zz'"), std::string::npos);
  EXPECT_NE(parse_error("tp").find("not key=value"), std::string::npos);
}

TEST(PlanLayout, StageSplitBalances) {
  std::vector<double> w(61, 1.0);
  std::vector<int64_t> n = stage_layers(w, 0, 0, 16);
  int64_t sum = 0, mx = 0, mn = 1 << 30;
  for (int64_t x : n) sum += x, mx = std::max(mx, x), mn = std::min(mn, x);
  EXPECT_EQ(sum, 61);
  EXPECT_EQ(mx, 4);
  EXPECT_EQ(mn, 3);
  // A heavy head (2.5 layers' worth) leaves the last stage fewer layers.
  n = stage_layers(w, 0, 2.5, 16);
  EXPECT_LE(n.back(), 2);
  EXPECT_EQ(std::accumulate(n.begin(), n.end(), (int64_t)0), 61);
  // DualPipe pairs stages r and pp-1-r: the heaviest pair is never heavier than unpaired balancing.
  auto pair_max = [&](const std::vector<int64_t>& c, double last) {
    double worst = 0;
    for (size_t r = 0; r < c.size() / 2; ++r)
      worst = std::max(worst, c[r] + c[c.size() - 1 - r] + (r == 0 ? last : 0.0));
    return worst;
  };
  std::vector<int64_t> p = stage_layers(w, 0, 2.5, 16, true);
  EXPECT_LE(pair_max(p, 2.5), pair_max(n, 2.5));
  EXPECT_EQ(std::accumulate(p.begin(), p.end(), (int64_t)0), 61);
  for (int64_t x : p) EXPECT_GE(x, 1);
}

TEST(PlanLayout, BubbleFormula) {
  EXPECT_DOUBLE_EQ(bubble_fraction_1f1b(1, 8), 0.0);
  EXPECT_DOUBLE_EQ(bubble_fraction_1f1b(4, 12), 3.0 / 15.0);
  EXPECT_DOUBLE_EQ(bubble_fraction_1f1b(16, 120), 15.0 / 135.0);
  // The time model's 1F1B bubble is (pp-1)/(m+pp-1) of the pipeline time.
  ArchModel a = resolve_model("deepseek-v3");
  ClusterSpec s = load_spec("h100");
  for (int64_t pp : {2, 4, 8}) {
    Layout l = parse_layout("pp=" + std::to_string(pp) + ",ep=32,gbs=1024,overlap=none", Layout{});
    validate_layout(l, a, 1024);
    StepTime t = plan_time(a, s, l);
    const double pipeline = t.micro_batches * t.t_mb + t.bubble;
    EXPECT_NEAR(t.bubble / pipeline, bubble_fraction_1f1b(pp, t.micro_batches), 1e-12) << "pp " << pp;
    EXPECT_NEAR(t.step, pipeline + t.dp_exposed + t.optimizer, 1e-12);
    EXPECT_NEAR(t.compute + t.exposed_comm + t.bubble + t.optimizer + t.host_wait, t.step, 1e-9 * t.step);
  }
  // DualPipe's bubble (pp/2-1)(F + 2B - 3W) is below 1F1B's at the same layout.
  Layout one = parse_layout("pp=8,ep=32,gbs=1024", Layout{}), dual = parse_layout("pp=8,ep=32,gbs=1024,schedule=dualpipe", Layout{});
  validate_layout(one, a, 1024);
  validate_layout(dual, a, 1024);
  EXPECT_LT(plan_time(a, s, dual).bubble, plan_time(a, s, one).bubble);
}

TEST(PlanLayout, TimeModelMonotone) {
  ArchModel a = resolve_model("deepseek-v3");
  ClusterSpec s = load_spec("h800");
  auto t = [&](const std::string& str, int64_t devices) {
    Layout l = parse_layout(str, Layout{});
    validate_layout(l, a, devices);
    return plan_time(a, s, l);
  };
  // Overlap hides communication; recompute costs time; more micro-batches shrink the bubble share.
  EXPECT_LT(t("pp=8,ep=64,overlap=ep+dp", 1024).step, t("pp=8,ep=64,overlap=none", 1024).step);
  EXPECT_LT(t("pp=8,ep=64,recompute=none", 1024).step, t("pp=8,ep=64,recompute=full", 1024).step);
  StepTime few = t("pp=8,ep=64,gbs=512", 1024), many = t("pp=8,ep=64,gbs=4096", 1024);
  EXPECT_LT(many.bubble / many.step, few.bubble / few.step);
  // Node-limited routing with DeepEP-style dedup sends less across nodes than per-expert copies.
  StepTime dedup = t("pp=8,ep=64,dedup=1", 1024), copies = t("pp=8,ep=64,dedup=0", 1024);
  EXPECT_LT(dedup.ep_inter_bytes_mb, copies.ep_inter_bytes_mb);
  // A skewed router slows the step.
  EXPECT_GT(t("pp=8,ep=64,expert_load=1.5", 1024).step, t("pp=8,ep=64", 1024).step);
  // MFU = model FLOPs x tokens/s / (devices x peak).
  StepTime x = t("pp=8,ep=64", 1024);
  EXPECT_NEAR(x.mfu, a.model_flops_per_token(4096) * x.tokens_per_s / (1024 * s.peak_bf16), 1e-12);
}
