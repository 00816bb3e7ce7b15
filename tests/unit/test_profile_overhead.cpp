// `trex bench step --profile`'s overhead rows: the threading overhead of trex's parallel regions
// (core/par_stats.h via core/parallel.h) and the heap counter (core/heap_count.h, with the
// replaced operator new / delete of cli/heap_hooks.cpp linked into this binary), and how
// print_breakdown shows them. The timed checks use a 50 ms imbalance and loose bounds.
#include <gtest/gtest.h>
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "core/heap_count.h"
#include "core/par_stats.h"
#include "core/parallel.h"
#include "core/profile.h"

using namespace trex;

namespace {

// Two OpenMP threads for the test's lifetime (even on one core: the work is sleeping).
struct TwoThreads {
  int old = omp_get_max_threads();
  TwoThreads() { omp_set_num_threads(2); }
  ~TwoThreads() { omp_set_num_threads(old); }
};

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

constexpr int kSleep = 50;  // the imbalance: one thread sleeps this long, the other not at all

// The imbalance costs half the region on two threads: wall ~ 50 ms, mean busy ~ 25 ms.
void expect_about_half_of_the_sleep(const ParStats& st) {
  const double over = st.overhead_ns.load() / 1e6, wall = st.wall_ns.load() / 1e6;
  EXPECT_EQ(st.regions.load(), 1);
  EXPECT_GE(wall, kSleep * 0.9);
  EXPECT_LE(over, wall);
  EXPECT_GT(over, kSleep / 2 * 0.5);  // 12.5 ms: far above fork/join noise
  EXPECT_LT(over, kSleep / 2 * 8.0);  // 200 ms: a loaded machine delays, it does not invent
}

std::string print_to_string(const Profiler& p, int steps, double step_ms) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  p.print_breakdown(f, steps, step_ms);
  std::fclose(f);
  std::string s(buf, len);
  std::free(buf);
  return s;
}

// The "ms share%" of the row named `name` (the start of a line).
bool row(const std::string& text, const std::string& name, double* ms, double* share) {
  size_t at = text.find("\n" + name + " ");
  if (at == std::string::npos) return false;
  return std::sscanf(text.c_str() + at + 1 + name.size(), "%lf %lf%%", ms, share) == 2;
}

// Keeps a pointer observable so the compiler cannot drop a new / delete pair.
void escape(void* p) { asm volatile("" : : "g"(p) : "memory"); }

struct alignas(256) Wide {
  char c[300];
};

}  // namespace

TEST(ProfileOverhead, ImbalancedParallelForIsOverhead) {
  TwoThreads two;
  ParStats st;
  {
    ParStatsScope scope(&st);
    parallel_for(2, 0, [](int64_t b, int64_t e) {
      if (b == 0) sleep_ms(kSleep);
    });
  }
  expect_about_half_of_the_sleep(st);
}

TEST(ProfileOverhead, ImbalancedParallelDynamicIsOverhead) {
  TwoThreads two;
  ParStats st;
  {
    ParStatsScope scope(&st);
    parallel_dynamic(2, [](int64_t i) {
      if (i == 0) sleep_ms(kSleep);
    });
  }
  expect_about_half_of_the_sleep(st);
}

TEST(ProfileOverhead, NoRegionsCountedWhenOff) {
  TwoThreads two;
  ParStats st;
  EXPECT_EQ(par_stats(), nullptr);
  parallel_for(1000, 1, [](int64_t, int64_t) {});
  parallel_dynamic(8, [](int64_t) {});
  EXPECT_EQ(st.regions.load(), 0);
  {
    ParStatsScope on(&st);
    EXPECT_EQ(par_stats(), &st);
    {
      ParStatsScope off(nullptr);  // a nested scope may switch it off; the outer one comes back
      parallel_for(1000, 1, [](int64_t, int64_t) {});
    }
    EXPECT_EQ(par_stats(), &st);
  }
  EXPECT_EQ(par_stats(), nullptr);
  EXPECT_EQ(st.regions.load(), 0);
  EXPECT_EQ(st.wall_ns.load(), 0);
  EXPECT_EQ(st.overhead_ns.load(), 0);
}

TEST(ProfileOverhead, InlineRunsAndNestedCallsAreNotRegions) {
  TwoThreads two;
  ParStats st;
  std::vector<int> worker_saw_stats(2, -1);
  {
    ParStatsScope scope(&st);
    parallel_for(10, 100, [](int64_t, int64_t) {});  // below the grain: inline, not a region
    parallel_for(2, 0, [&](int64_t b, int64_t) {
      worker_saw_stats[omp_get_thread_num()] = par_stats() != nullptr;
      parallel_for(100, 1, [](int64_t, int64_t) {});  // inside a region: inline
    });
  }
  EXPECT_EQ(st.regions.load(), 1);
  EXPECT_EQ(worker_saw_stats[1], 0);  // workers do not inherit the caller's thread_local
}

TEST(ProfileOverhead, HeapCountsNewCallsInScopeOnly) {
  HeapCounter& h = heap_counter();
  h.clear();
  constexpr int kEach = 25;
  std::vector<void*> keep;
  keep.reserve(4 * kEach);  // before the scope: not counted
  bool aligned = false;     // checked after the scope (no gtest call inside it)
  {
    HeapCountScope scope(h);
    for (int i = 0; i < kEach; ++i) {
      keep.push_back(new int(i));
      keep.push_back(new double[7]);
      keep.push_back(new (std::nothrow) long(i));
      keep.push_back(new Wide);  // the aligned form
    }
    for (void* p : keep) escape(p);
    aligned = reinterpret_cast<uintptr_t>(keep[3]) % alignof(Wide) == 0;
    for (int i = 0; i < kEach; ++i) {
      delete static_cast<int*>(keep[4 * i]);
      delete[] static_cast<double*>(keep[4 * i + 1]);
      delete static_cast<long*>(keep[4 * i + 2]);
      delete static_cast<Wide*>(keep[4 * i + 3]);
    }
  }
  EXPECT_TRUE(aligned);
  EXPECT_EQ(h.allocs.load(), 4 * kEach);
  EXPECT_EQ(h.frees.load(), 4 * kEach);
  EXPECT_EQ(h.bytes.load(), (int64_t)kEach * (sizeof(int) + 7 * sizeof(double) + sizeof(long) + sizeof(Wide)));
  EXPECT_GT(h.ns.load(), 0);
  const int64_t allocs = h.allocs.load();
  int* outside = new int(1);  // the scope is over: not counted
  escape(outside);
  delete outside;
  EXPECT_EQ(h.allocs.load(), allocs);
  EXPECT_FALSE(h.on.load());
}

TEST(ProfileOverhead, BreakdownShowsOverheadsAsOfWhichRows) {
  Profiler p;
  const int steps = 2;
  p.add("step.zero_grads", 2.0);
  p.add("step.forward_backward", 160.0);
  p.add("step.optimizer", 30.0);
  p.add("fwd.moe", 60.0);
  const std::string before = print_to_string(p, steps, 100.0);
  EXPECT_EQ(before.find("of which"), std::string::npos);
  p.overheads.threads = p.overheads.heap = p.overheads.arena = true;
  p.overheads.regions = 400;
  p.overheads.region_ms = 50;
  p.overheads.thread_overhead_ms = 8;
  p.overheads.heap_allocs = 120;
  p.overheads.heap_ms = 0.6;
  const std::string text = print_to_string(p, steps, 100.0);
  SCOPED_TRACE(text);
  // The rows of the step are unchanged; the overheads follow the total, per step.
  EXPECT_EQ(text.substr(0, before.size()), before);
  double ms = 0, share = 0;
  ASSERT_TRUE(row(text, "of which: threading overhead in trex parallel regions", &ms, &share));
  EXPECT_DOUBLE_EQ(ms, 4.0);
  EXPECT_DOUBLE_EQ(share, 4.0);
  ASSERT_TRUE(row(text, "of which: heap allocations (operator new/delete)", &ms, &share));
  EXPECT_DOUBLE_EQ(ms, 0.3);
  EXPECT_DOUBLE_EQ(share, 0.3);
  EXPECT_NE(text.find("200.0 trex parallel regions/step taking 25.0 ms/step"), std::string::npos);
  EXPECT_NE(text.find("oneDNN GEMMs"), std::string::npos);
  EXPECT_NE(text.find("heap allocations: 60.0 calls/step, 0.30 ms/step"), std::string::npos);
  EXPECT_NE(text.find("activation arena growth: 0.0 grows/step"), std::string::npos);
  EXPECT_LT(text.find("total"), text.find("of which"));
}
