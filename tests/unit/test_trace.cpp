// core/trace.h: profiler regions land on the compute track when a trace is attached (and only
// then), part files join into one Chrome trace whose events keep their rank, track, start and
// duration, names are JSON-escaped, and an unwritable path is a user error naming it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include "core/profile.h"
#include "core/trace.h"
#include "test_util.h"

using namespace trex;

TEST(Trace, ProfilerRegionsGoToTheComputeTrack) {
  Profiler p;
  { ProfScope s(&p, "untraced"); }
  TraceLog log;
  p.trace = &log;
  {
    ProfScope outer(&p, "fwd.attn");
    ProfScope inner(&p, "fwd.attn.core");
  }
  ASSERT_EQ(log.events().size(), 2u);  // the region before the trace was attached is not on it
  const TraceEvent& inner = log.events()[0];
  const TraceEvent& outer = log.events()[1];
  EXPECT_EQ(inner.name, "fwd.attn.core");
  EXPECT_EQ(outer.name, "fwd.attn");
  EXPECT_EQ(outer.track, TraceTrack::Compute);
  EXPECT_LE(outer.t0_ms, inner.t0_ms);
  EXPECT_GE(outer.t1_ms, inner.t1_ms);
}

TEST(Trace, PartsJoinIntoOneChromeTrace) {
  test::TmpDir dir("trex_trace");
  TraceLog a, b;
  a.add("step 0", TraceTrack::Compute, 1000.0, 1250.5);
  a.add("reduce-scatter bucket 3", TraceTrack::Comm, 1100.25, 1200.0);
  b.add("odd \"name\"\\\n", TraceTrack::Compute, 1001.0, 1002.0);
  const std::string pa = (dir.path / "t.rank0.part").string(), pb = (dir.path / "t.rank1.part").string();
  const std::string out = (dir.path / "t.json").string();
  write_trace_part(a, 0, pa);
  write_trace_part(b, 1, pb);
  EXPECT_EQ(merge_trace_parts({pa, pb, (dir.path / "t.rank2.part").string()}, out), 2u * 3 + 3);
  std::ifstream f(out);
  const nlohmann::json j = nlohmann::json::parse(f);
  std::vector<nlohmann::json> x;
  int meta = 0;
  for (const auto& e : j["traceEvents"]) (e["ph"] == "X" ? (x.push_back(e), 0) : ++meta);
  EXPECT_EQ(meta, 6);  // per rank: process name, two thread names
  ASSERT_EQ(x.size(), 3u);
  EXPECT_EQ(x[0]["name"], "step 0");
  EXPECT_EQ(x[0]["pid"], 0);
  EXPECT_EQ(x[0]["tid"], 0);
  EXPECT_NEAR(x[0]["ts"].get<double>(), 1000.0e3, 1e-3);
  EXPECT_NEAR(x[0]["dur"].get<double>(), 250.5e3, 1e-3);
  EXPECT_EQ(x[1]["tid"], 1);
  EXPECT_EQ(x[1]["cat"], "comm");
  EXPECT_NEAR(x[1]["dur"].get<double>(), 99.75e3, 1e-3);
  EXPECT_EQ(x[2]["pid"], 1);
  EXPECT_EQ(x[2]["name"], "odd \"name\"\\\n");
}

TEST(Trace, UnwritablePathIsAUserError) {
  TraceLog a;
  const std::string m = test::user_error([&] { write_trace_part(a, 0, "/nonexistent-dir/t.part"); });
  EXPECT_NE(m.find("/nonexistent-dir/t.part"), std::string::npos) << m;
}
