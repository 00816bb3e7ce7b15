// GradSync: bucketed async reduce-scatter of gradients and all-gather of parameters. See grad_sync.h.
#include "parallel/grad_sync.h"

#include <chrono>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/timer.h"

namespace trex::parallel {

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

void zero_padding(const BucketLayout& L, float* buf) {
  for (const Bucket& b : L.buckets) std::memset(buf + b.begin + b.used, 0, (b.size - b.used) * sizeof(float));
}

}  // namespace

GradSync::GradSync(Communicator& dp_comm, const BucketLayout& layout, float* grads, float* params, bool average)
    : comm_(dp_comm), L_(layout), grads_(grads), params_(params), rank_(dp_comm.rank()), average_(average) {
  TREX_CHECK(dp_comm.size() == layout.dp, "GradSync: the dp communicator has ", dp_comm.size(),
             " ranks but the bucket layout was built for dp = ", layout.dp);
  TREX_CHECK(grads && params, "GradSync: null grads or params buffer");
  const size_t nb = layout.buckets.size();
  ready_count_.assign(nb, 0);
  marked_.assign(layout.params.size(), 0);
  rs_started_.assign(nb, 0);
  rs_.resize(nb);
  ag_.resize(nb);
  rs_t0_.assign(nb, 0);
  ag_t0_.assign(nb, 0);
  zero_padding(L_, grads_);
  zero_padding(L_, params_);
}

GradSync::~GradSync() = default;  // Handle destructors wait

void GradSync::mark_ready(int param) {
  TREX_CHECK(param >= 0 && param < static_cast<int>(L_.params.size()), "GradSync::mark_ready: param ", param,
             " outside [0, ", L_.params.size(), ")");
  TREX_CHECK(!marked_[param], "GradSync::mark_ready: param ", param, " marked twice in one step");
  marked_[param] = 1;
  const int b = L_.params[param].bucket;
  const Bucket& B = L_.buckets[b];
  if (++ready_count_[b] == B.num_params) {
    const size_t S = B.size / L_.dp;
    rs_t0_[b] = now_ms();
    rs_[b] = comm_.ireduce_scatter(grads_ + B.begin, grads_ + B.begin + rank_ * S, S, DType::F32, ReduceOp::Sum);
    rs_started_[b] = 1;
  }
  progress();
}

int GradSync::progress() {
  int pending = 0;
  for (int b = 0; b < L_.num_buckets(); ++b) {
    if (rs_[b].pending()) {
      if (rs_[b].test()) trace_done("reduce-scatter", b, rs_t0_[b]);
      else ++pending;
    }
    if (ag_[b].pending()) {
      if (ag_[b].test()) trace_done("all-gather", b, ag_t0_[b]);
      else ++pending;
    }
  }
  return pending;
}

void GradSync::trace_done(const char* what, int b, double t0) {
  if (trace_) trace_->add(std::string(what) + " bucket " + std::to_string(b), TraceTrack::Comm, t0, now_ms());
}

void GradSync::wait_traced(Handle& h, const char* what, int b, double t0) {
  if (!h.pending()) return;
  h.wait();
  trace_done(what, b, t0);
}

int GradSync::buckets_started() const {
  int n = 0;
  for (char c : rs_started_) n += c != 0;
  return n;
}

void GradSync::finish_grad_sync() {
  for (int b = 0; b < L_.num_buckets(); ++b) {
    if (rs_started_[b]) continue;
    const Bucket& B = L_.buckets[b];
    for (int p = B.first_param; p < B.first_param + B.num_params; ++p)
      TREX_CHECK(marked_[p], "GradSync::finish_grad_sync: bucket ", b, " is incomplete: param ", p,
                 " was never marked ready this step");
  }
  const double t0 = now_s(), w0 = now_ms();
  for (int b = 0; b < L_.num_buckets(); ++b) wait_traced(rs_[b], "reduce-scatter", b, rs_t0_[b]);
  wait_s_ += now_s() - t0;
  if (trace_) trace_->add("wait: gradient reduce-scatter", TraceTrack::Compute, w0, now_ms());
  if (average_) {
    const float inv = 1.0f / static_cast<float>(L_.dp);
    for (int b = 0; b < L_.num_buckets(); ++b)
      for (float& g : grad_shard(b)) g *= inv;
  }
  std::fill(ready_count_.begin(), ready_count_.end(), 0);
  std::fill(marked_.begin(), marked_.end(), 0);
  std::fill(rs_started_.begin(), rs_started_.end(), 0);
}

std::span<float> GradSync::grad_shard(int bucket) {
  const FlatRange r = L_.shard(bucket, rank_);
  return {grads_ + r.begin, r.size()};
}

std::span<float> GradSync::param_shard(int bucket) {
  const FlatRange r = L_.shard(bucket, rank_);
  return {params_ + r.begin, r.size()};
}

double GradSync::grad_norm_sq_local() const {
  double s = 0;
  for (int b = 0; b < L_.num_buckets(); ++b) {
    const FlatRange r = L_.shard(b, rank_);
    for (size_t i = r.begin; i < r.end; ++i) s += static_cast<double>(grads_[i]) * grads_[i];
  }
  return s;
}

double GradSync::global_grad_norm() { return std::sqrt(comm_.all_reduce_value(grad_norm_sq_local())); }

void GradSync::scale_grad_shards(float s) {
  for (int b = 0; b < L_.num_buckets(); ++b)
    for (float& g : grad_shard(b)) g *= s;
}

void GradSync::start_param_all_gather(bool first_bucket_first) {
  const int nb = L_.num_buckets();
  for (int i = 0; i < nb; ++i) {
    const int b = first_bucket_first ? i : nb - 1 - i;
    TREX_CHECK(!ag_[b].pending(), "GradSync: parameter all-gather of bucket ", b, " started twice");
    const Bucket& B = L_.buckets[b];
    const size_t S = B.size / L_.dp;
    ag_t0_[b] = now_ms();
    ag_[b] = comm_.iall_gather(params_ + B.begin + rank_ * S, params_ + B.begin, S, DType::F32);
  }
}

void GradSync::wait_param_bucket(int bucket) {
  TREX_CHECK(bucket >= 0 && bucket < L_.num_buckets(), "bucket ", bucket, " outside [0, ", L_.num_buckets(), ")");
  const double t0 = now_s(), w0 = now_ms();
  wait_traced(ag_[bucket], "all-gather", bucket, ag_t0_[bucket]);
  wait_s_ += now_s() - t0;
  if (trace_) trace_->add("wait: parameter all-gather", TraceTrack::Compute, w0, now_ms());
}

void GradSync::wait_param_all_gather() {
  const double t0 = now_s(), w0 = now_ms();
  for (int b = L_.num_buckets() - 1; b >= 0; --b) wait_traced(ag_[b], "all-gather", b, ag_t0_[b]);
  wait_s_ += now_s() - t0;
  if (trace_) trace_->add("wait: parameter all-gather", TraceTrack::Compute, w0, now_ms());
}

void GradSync::zero_grads() {
  for (int b = 0; b < L_.num_buckets(); ++b)
    TREX_CHECK(!rs_[b].pending(), "GradSync::zero_grads while the reduce-scatter of bucket ", b,
               " is in flight (call finish_grad_sync first)");
  std::memset(grads_, 0, L_.total * sizeof(float));
}

}  // namespace trex::parallel
