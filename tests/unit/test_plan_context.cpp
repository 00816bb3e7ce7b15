// The planner's context parallelism (plan/layout.h cp) and `trex plan --longest-context`
// (plan/context.h): validation, what the cp ranks exchange, memory and time against cp = 1 on
// the same devices, and the longest-context search's boundary.
#include <gtest/gtest.h>

#include <numeric>
#include "core/error.h"
#include "plan/context.h"
#include "plan/memory.h"
#include "plan/planner.h"
#include "plan/timing.h"

using namespace trex;
using namespace trex::plan;

namespace {

Layout valid(const std::string& s, const ArchModel& a, int64_t devices) {
  Layout l = parse_layout(s, Layout{});
  validate_layout(l, a, devices);
  return l;
}

std::string error_of(const std::string& layout, int64_t devices) {
  ArchModel a = resolve_model("deepseek-v3");
  Layout l = parse_layout(layout, Layout{});
  try {
    validate_layout(l, a, devices);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(PlanContext, LayoutCountsCpAndNamesWhatFails) {
  const ArchModel a = resolve_model("deepseek-v3");
  Layout l = valid("cp=4,pp=4,ep=8,seq=32768", a, 96);
  EXPECT_EQ(l.dp, 6);
  EXPECT_EQ(l.world(), 96);
  EXPECT_EQ(l.dpcp(), 24);
  EXPECT_EQ(l.edp(), 3);
  EXPECT_EQ(l.gbs, 4 * 96 / 4);  // 4 sequences per device, a sequence on cp devices
  EXPECT_DOUBLE_EQ(l.local_tokens(), 32768.0 / 4);
  EXPECT_NE(layout_string(l).find(",cp=4,"), std::string::npos) << layout_string(l);
  EXPECT_EQ(layout_string(valid("pp=4", a, 96)).find("cp="), std::string::npos);
  EXPECT_EQ(parse_layout(layout_string(l), Layout{}).cp, 4);
  EXPECT_NE(error_of("cp=3,seq=4099", 3).find("seq (4099) must be divisible by 2*cp (2*3 = 6)"), std::string::npos);
  EXPECT_NE(error_of("cp=5", 32).find("devices (32) must be divisible by tp*pp*cp (1*1*5 = 5)"), std::string::npos);
  // ep is carved out of dp x cp x tp: 64 experts ranks over dp 16 x cp 4.
  EXPECT_EQ(error_of("cp=4,ep=64", 64), "");
  EXPECT_NE(error_of("cp=4,ep=64,dp=8", 64).find("dp*cp*tp*pp (8*4*1*1 = 32) must equal the devices (64)"),
            std::string::npos);
}

TEST(PlanContext, ExchangeElemsPerAttentionKind) {
  AttnShape mla{AttnKind::MLA, 128, 192, 128};
  EXPECT_DOUBLE_EQ(cp_exchange_elems(mla, 1000).gathered, 1000.0 * 128 * (192 + 128));
  EXPECT_DOUBLE_EQ(cp_exchange_elems(mla, 1000).halo, 0);
  EXPECT_DOUBLE_EQ(cp_exchange_elems(mla, 1000, 4).gathered, 1000.0 * 32 * (192 + 128));  // a tp rank's heads
  AttnShape dsa{AttnKind::MLA, 128, 192, 128, 0, 0, 2048, 64, 128};  // DeepSeek-V3.2: + the indexer's keys
  EXPECT_DOUBLE_EQ(cp_exchange_elems(dsa, 1000, 4).gathered, 1000.0 * (32 * (192 + 128) + 128));
  AttnShape sw{AttnKind::SlidingWindow, 64, 512, 512, 128};
  EXPECT_DOUBLE_EQ(cp_exchange_elems(sw, 1000).gathered, 0);
  EXPECT_DOUBLE_EQ(cp_exchange_elems(sw, 1000).halo, 2.0 * 128 * 512);
  EXPECT_DOUBLE_EQ(cp_exchange_elems(sw, 100).halo, 2.0 * 100 * 512);  // a window longer than the sequence
  AttnShape csa{AttnKind::CSA, 64, 512, 512, 128, 4, 512, 64, 128};
  EXPECT_DOUBLE_EQ(cp_exchange_elems(csa, 1003).gathered, 250.0 * (512 + 128));
  AttnShape hca{AttnKind::HCA, 64, 512, 512, 128, 128};
  EXPECT_DOUBLE_EQ(cp_exchange_elems(hca, 1003).gathered, 7.0 * 512);
  EXPECT_DOUBLE_EQ(cp_exchange_elems(hca, 1003).halo, 2.0 * 128 * 512);
}

// Twice the sequence on cp = 2 holds what one sequence holds on cp = 1 per device (the same
// tokens per device; optimizer shards over the same dp x cp ranks), plus the gathered keys and
// values; the step exchanges them and only then.
TEST(PlanContext, MemoryAndTimeAgainstOneRankPerSequence) {
  for (const char* model : {"deepseek-v3", "deepseek-v4-flash"}) {
    const ArchModel a = resolve_model(model);
    const ClusterSpec s = load_spec("h800", "");
    const Layout one = valid("pp=16,ep=32,seq=16384,gbs=64,recompute=full", a, 512);
    const Layout two = valid("pp=16,ep=32,cp=2,seq=32768,gbs=32,recompute=full", a, 512);
    const MemoryReport m1 = plan_memory(a, s, one), m2 = plan_memory(a, s, two);
    EXPECT_NEAR(m2.peak().activations, m1.peak().activations, 1e-9 * m1.peak().activations) << model;
    EXPECT_DOUBLE_EQ(m2.peak().optimizer, m1.peak().optimizer) << model;
    EXPECT_GT(m2.peak().buffers, m1.peak().buffers) << model << ": the gathered keys and values";
    const StepTime t1 = plan_time(a, s, one), t2 = plan_time(a, s, two);
    EXPECT_EQ(t1.comm_cp, 0) << model;
    EXPECT_GT(t2.comm_cp, 0) << model;
    // Attention is quadratic: the longer sequence costs more per token.
    EXPECT_GT(t2.attention, t1.attention) << model;
    // The exchange grows with the sequence.
    const Layout four = valid("pp=16,ep=32,cp=2,seq=65536,gbs=32,recompute=full", a, 512);
    EXPECT_GT(plan_time(a, s, four).comm_cp, 1.5 * t2.comm_cp) << model;
  }
}

// The longest seq of each cp fits and the next multiple does not; a larger cp reaches further;
// the best row is the longest.
TEST(PlanContext, LongestContextFindsTheMemoryBoundary) {
  const ArchModel a = resolve_model("deepseek-v3");
  const ClusterSpec s = load_spec("h800", "");
  const Layout base = parse_layout("pp=16,ep=32,recompute=full,gbs=64", Layout{});
  const ContextResult r = longest_context(a, s, 512, base, 1024, int64_t{1} << 22);
  ASSERT_GE(r.rows.size(), 3u);
  int64_t prev = 0;
  for (const ContextRow& x : r.rows) {
    ASSERT_GT(x.seq, 0) << "cp " << x.cp;
    const int64_t q = std::lcm<int64_t>(1024, 2 * x.cp);
    EXPECT_EQ(x.seq % q, 0);
    EXPECT_TRUE(x.plan.memory.fits);
    EXPECT_EQ(x.plan.layout.cp, x.cp);
    if (x.seq + q <= r.max_seq) {
      Layout next = x.plan.layout;
      next.seq = x.seq + q;
      EXPECT_FALSE(plan_memory(a, s, next).fits) << "cp " << x.cp << ": seq " << next.seq << " fits too";
    }
    EXPECT_GE(x.seq, prev) << "cp " << x.cp;  // more ranks per sequence never shorten it here
    prev = x.seq;
  }
  ASSERT_GE(r.best, 0);
  for (const ContextRow& x : r.rows) EXPECT_LE(x.seq, r.rows[r.best].seq);
  EXPECT_GT(r.rows.back().seq, 2 * r.rows.front().seq);
  EXPECT_NE(format_context(r).find("<- longest"), std::string::npos);
  EXPECT_EQ(context_to_json(r)["longest"].get<int64_t>(), r.rows[r.best].seq);
}
