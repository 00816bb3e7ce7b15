// GradSync over MPI (dp = world size, so 2 and 3 ranks: odd dp too): each rank's reduced shard
// equals the slice of the full all-reduce average, and of the average computed locally; the
// parameter all-gather restores every element; buckets start their reduce-scatter as soon as
// their last parameter is marked; grad norm, accumulation and two steps in a row.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "parallel/comm.h"
#include "parallel/grad_sync.h"

namespace trex::parallel {
Communicator& test_world();
}  // namespace trex::parallel

using namespace trex;
using namespace trex::parallel;

// ASSERT_EQ for a checking loop in a collective test: on a mismatch it records the failure and
// leaves the loop only. An early return on one rank would skip the collectives that follow and
// leave the other ranks waiting in them.
#define EXPECT_EQ_OR_BREAK(a, b, msg) \
  if (!((a) == (b))) {                \
    EXPECT_EQ(a, b) << msg;           \
    break;                            \
  }

namespace {

// Parameter sizes in backward order: odd, with one larger than the bucket size.
const std::vector<size_t> kSizes = {37, 129, 5, 1000, 3, 64, 250, 1, 77};
constexpr size_t kBucket = 200;

// Gradient of flat element i (a parameter element) on `rank` at micro-batch `mb`: small
// integers, so sums are exact in f32 and equal whatever the reduction order.
float grad_val(int rank, size_t i, int mb = 0) {
  return static_cast<float>(static_cast<int>((i * 7 + rank * 13 + mb * 5) % 23) - 11);
}

std::vector<float> make_grads(const BucketLayout& L, int rank, int mb = 0) {
  std::vector<float> g(L.total, 0.f);
  for (const ParamSlot& p : L.params)
    for (size_t i = p.offset; i < p.offset + p.size; ++i) g[i] = grad_val(rank, i, mb);
  return g;
}

bool is_param_element(const BucketLayout& L, size_t i) {
  for (const ParamSlot& p : L.params)
    if (i >= p.offset && i < p.offset + p.size) return true;
  return false;
}

// Records the collectives started through it, then forwards them to a real communicator.
class RecordingComm final : public Communicator {
 public:
  explicit RecordingComm(Communicator& inner) : in_(inner) {}
  int rank() const override { return in_.rank(); }
  int size() const override { return in_.size(); }
  std::string backend() const override { return "recording(" + in_.backend() + ")"; }
  void barrier() override { in_.barrier(); }
  std::unique_ptr<Communicator> split(int c, int k) override { return in_.split(c, k); }
  std::vector<std::pair<std::string, const void*>> log;

 protected:
  Handle do_iall_reduce(const void* s, void* r, size_t n, DType t, ReduceOp op) override {
    log.emplace_back("all_reduce", s);
    return in_.iall_reduce(s, r, n, t, op);
  }
  Handle do_ireduce_scatter(const void* s, void* r, size_t n, DType t, ReduceOp op) override {
    log.emplace_back("reduce_scatter", s);
    return in_.ireduce_scatter(s, r, n, t, op);
  }
  Handle do_iall_gather(const void* s, void* r, size_t n, DType t) override {
    log.emplace_back("all_gather", r);
    return in_.iall_gather(s, r, n, t);
  }
  Handle do_iall_to_all_v(const void* s, std::span<const size_t> sc, std::span<const size_t> sd, void* r,
                          std::span<const size_t> rc, std::span<const size_t> rd, DType t) override {
    log.emplace_back("all_to_all_v", s);
    return in_.iall_to_all_v(s, sc, sd, r, rc, rd, t);
  }
  Handle do_ibroadcast(void* b, size_t n, DType t, int root) override { return in_.ibroadcast(b, n, t, root); }
  Handle do_isend(const void* b, size_t n, DType t, int d, int tag) override { return in_.isend(b, n, t, d, tag); }
  Handle do_irecv(void* b, size_t n, DType t, int s, int tag) override { return in_.irecv(b, n, t, s, tag); }

 private:
  Communicator& in_;
};

}  // namespace

TEST(GradSync, ReduceScatterEqualsAllReduceSlice) {
  Communicator& w = test_world();
  const int dp = w.size(), me = w.rank();
  BucketLayout L = BucketLayout::build(kSizes, kBucket, dp);
  ASSERT_GE(L.num_buckets(), 3);
  std::vector<float> grads = make_grads(L, me), params(L.total, 0.f);
  // Reference 1: a full all-reduce of the same gradients, then the same scaling.
  std::vector<float> full = grads;
  w.all_reduce(full.data(), full.size());
  const float inv = 1.0f / static_cast<float>(dp);
  for (float& x : full) x *= inv;
  GradSync gs(w, L, grads.data(), params.data());
  for (int p = 0; p < static_cast<int>(kSizes.size()); ++p) gs.mark_ready(p);
  gs.finish_grad_sync();
  for (int b = 0; b < L.num_buckets(); ++b) {
    const FlatRange r = L.shard(b, me);
    auto shard = gs.grad_shard(b);
    EXPECT_EQ(shard.size(), r.size());
    EXPECT_EQ(shard.data(), grads.data() + r.begin);
    for (size_t i = 0; i < r.size(); ++i) {
      const size_t f = r.begin + i;
      EXPECT_EQ_OR_BREAK(shard[i], full[f], "bucket " << b << " flat " << f);
      // Reference 2: computed locally from every rank's inputs (padding stays 0).
      float sum = 0;
      if (is_param_element(L, f))
        for (int q = 0; q < dp; ++q) sum += grad_val(q, f);
      EXPECT_EQ_OR_BREAK(shard[i], sum * inv, "bucket " << b << " flat " << f);
    }
  }
  // Global norm: over the whole averaged gradient, computed locally.
  double want = 0;
  for (float x : full) want += static_cast<double>(x) * x;
  EXPECT_NEAR(gs.global_grad_norm(), std::sqrt(want), 1e-9 * std::sqrt(want));
  gs.scale_grad_shards(0.5f);
  EXPECT_NEAR(gs.global_grad_norm(), 0.5 * std::sqrt(want), 1e-9 * std::sqrt(want));
  EXPECT_GE(gs.exposed_wait_seconds(), 0.0);
}

TEST(GradSync, AllGatherRestoresEveryParam) {
  Communicator& w = test_world();
  const int dp = w.size(), me = w.rank();
  for (size_t align : {size_t{1}, size_t{16}}) {
    BucketLayout L = BucketLayout::build(kSizes, kBucket, dp, align);
    std::vector<float> grads(L.total, 0.f), params(L.total, std::nanf(""));
    GradSync gs(w, L, grads.data(), params.data());
    auto pval = [](size_t f) { return 0.25f * static_cast<float>(f % 1013) - 3.f; };
    for (int b = 0; b < L.num_buckets(); ++b) {  // the optimizer writes only its shard
      const FlatRange r = L.shard(b, me);
      auto ps = gs.param_shard(b);
      EXPECT_EQ(ps.data(), params.data() + r.begin);
      for (size_t i = 0; i < ps.size(); ++i) ps[i] = is_param_element(L, r.begin + i) ? pval(r.begin + i) : 0.f;
    }
    gs.start_param_all_gather();
    gs.wait_param_bucket(L.num_buckets() - 1);  // the first bucket of the forward pass
    gs.wait_param_all_gather();
    for (size_t f = 0; f < L.total; ++f)
      EXPECT_EQ_OR_BREAK(params[f], is_param_element(L, f) ? pval(f) : 0.f, "align " << align << " flat " << f);
  }
}

TEST(GradSync, BucketsStartInMarkOrder) {
  Communicator& w = test_world();
  RecordingComm rec(w);
  BucketLayout L = BucketLayout::build(kSizes, kBucket, w.size());
  std::vector<float> grads = make_grads(L, w.rank()), params(L.total, 0.f);
  GradSync gs(rec, L, grads.data(), params.data());
  for (int p = 0; p < static_cast<int>(kSizes.size()); ++p) {
    gs.mark_ready(p);
    const int b = L.params[p].bucket;
    const bool last_of_bucket = p == L.buckets[b].first_param + L.buckets[b].num_params - 1;
    // Exactly the buckets whose last parameter has been marked have started, in order.
    EXPECT_EQ(static_cast<int>(rec.log.size()), last_of_bucket ? b + 1 : b) << "after marking param " << p;
    EXPECT_EQ(gs.bucket_started(b), last_of_bucket);
    if (last_of_bucket) {
      EXPECT_EQ(rec.log.back().first, "reduce_scatter");
      EXPECT_EQ(rec.log.back().second, grads.data() + L.buckets[b].begin);
    }
  }
  EXPECT_EQ(gs.buckets_started(), L.num_buckets());
  gs.finish_grad_sync();
  EXPECT_EQ(gs.buckets_started(), 0);  // reset for the next step
  // The parameter all-gather goes last bucket first (first in forward order).
  rec.log.clear();
  gs.start_param_all_gather();
  EXPECT_EQ(static_cast<int>(rec.log.size()), L.num_buckets());
  for (int k = 0; k < std::min(L.num_buckets(), static_cast<int>(rec.log.size())); ++k)
    EXPECT_EQ(rec.log[k].second, params.data() + L.buckets[L.num_buckets() - 1 - k].begin);
  gs.wait_param_all_gather();
}

TEST(GradSync, MarkOrderInsideABucketDoesNotMatter) {
  Communicator& w = test_world();
  BucketLayout L = BucketLayout::build(kSizes, kBucket, w.size());
  std::vector<float> grads = make_grads(L, w.rank()), params(L.total, 0.f);
  std::vector<float> full = grads;
  w.all_reduce(full.data(), full.size());
  GradSync gs(w, L, grads.data(), params.data());
  for (int p = static_cast<int>(kSizes.size()) - 1; p >= 0; --p) gs.mark_ready(p);
  gs.finish_grad_sync();
  for (int b = 0; b < L.num_buckets(); ++b) {
    auto s = gs.grad_shard(b);
    const FlatRange r = L.shard(b, w.rank());
    for (size_t i = 0; i < s.size(); ++i)
      EXPECT_EQ_OR_BREAK(s[i], full[r.begin + i] * (1.0f / w.size()), "flat " << r.begin + i);
  }
}

TEST(GradSync, AccumulationAndTwoSteps) {
  Communicator& w = test_world();
  const int dp = w.size(), me = w.rank();
  BucketLayout L = BucketLayout::build(kSizes, kBucket, dp);
  std::vector<float> grads(L.total, 0.f), params(L.total, 0.f);
  GradSync gs(w, L, grads.data(), params.data());
  for (int step = 0; step < 2; ++step) {
    gs.zero_grads();
    for (int mb = 0; mb < 3; ++mb) {  // micro-batches accumulate; only the last one marks
      std::vector<float> g = make_grads(L, me, mb + step);
      for (size_t i = 0; i < L.total; ++i) grads[i] += g[i];
      if (mb == 2)
        for (int p = 0; p < static_cast<int>(kSizes.size()); ++p) gs.mark_ready(p);
    }
    gs.finish_grad_sync();
    for (int b = 0; b < L.num_buckets(); ++b) {
      auto s = gs.grad_shard(b);
      const FlatRange r = L.shard(b, me);
      for (size_t i = 0; i < s.size(); ++i) {
        const size_t f = r.begin + i;
        float sum = 0;
        if (is_param_element(L, f))
          for (int q = 0; q < dp; ++q)
            for (int mb = 0; mb < 3; ++mb) sum += grad_val(q, f, mb + step);
        EXPECT_EQ_OR_BREAK(s[i], sum * (1.0f / dp), "step " << step << " flat " << f);
      }
    }
  }
}

TEST(GradSync, MisuseIsAnError) {
  Communicator& w = test_world();
  BucketLayout L = BucketLayout::build(kSizes, kBucket, w.size());
  ASSERT_GE(L.buckets[0].num_params, 2);
  std::vector<float> grads(L.total, 0.f), params(L.total, 0.f);
  auto msg = [](auto&& fn) -> std::string {
    try {
      fn();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  GradSync gs(w, L, grads.data(), params.data());
  EXPECT_NE(msg([&] { gs.finish_grad_sync(); }).find("bucket 0 is incomplete: param 0 was never marked ready"),
            std::string::npos);
  gs.mark_ready(0);  // bucket 0 has more params: nothing starts
  EXPECT_NE(msg([&] { gs.mark_ready(0); }).find("param 0 marked twice"), std::string::npos);
  EXPECT_NE(msg([&] { gs.mark_ready(99); }).find("param 99 outside"), std::string::npos);
  BucketLayout wrong = BucketLayout::build(kSizes, kBucket, w.size() + 1);
  EXPECT_NE(msg([&] {
              GradSync bad(w, wrong, grads.data(), params.data());
            }).find("bucket layout was built for dp = " + std::to_string(w.size() + 1)),
            std::string::npos);
}

// mpirun -np 2 trex_mpi_tests --gtest_also_run_disabled_tests --gtest_filter='GradSyncBench.*'
// 64 MiB of f32 gradients in 64 parameters and 16 MiB buckets: mark all + finish (reduce-scatter
// of every bucket and the 1/dp scaling), then the parameter all-gather. Rank 0 prints min / median.
TEST(GradSyncBench, DISABLED_Step64MB) {
  Communicator& w = test_world();
  const std::vector<size_t> sizes(64, size_t{1} << 18);
  BucketLayout L = BucketLayout::build(sizes, size_t{4} << 20, w.size(), 16);
  std::vector<float> grads(L.total, 1.f), params(L.total, 0.f);
  GradSync gs(w, L, grads.data(), params.data());
  auto stats = [&](std::vector<double> t) {
    std::sort(t.begin(), t.end());
    return std::pair{1e3 * w.all_reduce_value(t.front(), ReduceOp::Max),
                     1e3 * w.all_reduce_value(t[t.size() / 2], ReduceOp::Max)};
  };
  std::vector<double> rs, ag;
  for (int rep = 0; rep < 6; ++rep) {
    w.barrier();
    auto t0 = std::chrono::steady_clock::now();
    for (int p = 0; p < static_cast<int>(sizes.size()); ++p) gs.mark_ready(p);
    gs.finish_grad_sync();
    auto t1 = std::chrono::steady_clock::now();
    gs.start_param_all_gather();
    gs.wait_param_all_gather();
    auto t2 = std::chrono::steady_clock::now();
    if (rep == 0) continue;  // warm-up
    rs.push_back(std::chrono::duration<double>(t1 - t0).count());
    ag.push_back(std::chrono::duration<double>(t2 - t1).count());
  }
  auto [rs_min, rs_med] = stats(rs);
  auto [ag_min, ag_med] = stats(ag);
  if (w.rank() == 0)
    std::printf(
        "[ BENCH    ] GradSync %d ranks, %.1f MB in %d buckets: reduce-scatter step min %.1f ms median %.1f "
        "ms; param all-gather min %.1f ms median %.1f ms\n",
        w.size(), 4e-6 * L.total, L.num_buckets(), rs_min, rs_med, ag_min, ag_med);
}
