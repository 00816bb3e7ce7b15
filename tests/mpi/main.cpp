// trex_mpi_tests: GoogleTest under MPI. Run with
//   mpirun --allow-run-as-root --oversubscribe -np 2 trex_mpi_tests   (and -np 3)
// Every rank runs every test (the tests are collective). Rank 0 prints the usual gtest output;
// the other ranks print only their failures, prefixed with their rank. After each test the ranks
// exchange their pass/fail flags and rank 0 names the ranks where it failed; the exit code is
// non-zero on every rank if any rank failed.
// Benchmarks are disabled tests: add --gtest_also_run_disabled_tests --gtest_filter='CommBench.*'.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm_mpi.h"

namespace trex::parallel {

namespace {
Communicator* g_world = nullptr;
const MpiContext* g_ctx = nullptr;
}  // namespace

// Shared with the test files (declared there).
Communicator& test_world() { return *g_world; }
const MpiContext& test_mpi_context() { return *g_ctx; }

namespace {

// Non-root ranks: print failed assertions only.
class FailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?", r.line_number(),
                 r.message());
  }

 private:
  int rank_;
};

// Every rank: after each test, gather the failure flags; rank 0 reports failing ranks.
class RankAgreement : public testing::EmptyTestEventListener {
 public:
  void OnTestEnd(const testing::TestInfo& info) override {
    Communicator& w = test_world();
    int32_t mine = info.result()->Failed() ? 1 : 0;
    std::vector<int32_t> all(w.size());
    w.all_gather(&mine, all.data(), 1, DType::I32);
    std::string ranks;
    for (int r = 0; r < w.size(); ++r)
      if (all[r]) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    if (!ranks.empty()) {
      any_failed = true;
      if (w.rank() == 0)
        std::printf("[  RANKS   ] %s.%s failed on rank(s) %s of %d\n", info.test_suite_name(), info.name(),
                    ranks.c_str(), w.size());
    }
  }
  bool any_failed = false;
};

}  // namespace
}  // namespace trex::parallel

int main(int argc, char** argv) {
  using namespace trex::parallel;
  int rc = 1;
  try {
    MpiContext ctx(&argc, &argv, ThreadLevel::Serialized);
    testing::InitGoogleTest(&argc, argv);
    std::unique_ptr<Communicator> world = ctx.world();
    g_world = world.get();
    g_ctx = &ctx;
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    if (ctx.world_rank() != 0) {
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new FailurePrinter(ctx.world_rank()));
    }
    auto* agree = new RankAgreement;
    listeners.Append(agree);
    const int local = RUN_ALL_TESTS();
    int32_t bad = (local != 0 || agree->any_failed) ? 1 : 0;
    bad = world->all_reduce_value(bad, ReduceOp::Max);
    if (ctx.world_rank() == 0)
      std::printf("trex_mpi_tests: %s on %d ranks\n", bad ? "FAILED" : "passed", ctx.world_size());
    rc = bad ? 1 : 0;
    g_world = nullptr;
    world.reset();  // communicators go before MPI_Finalize
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trex_mpi_tests: %s\n", e.what());
    MpiContext::abort(2);  // the other ranks would wait forever
  }
  return rc;
}
