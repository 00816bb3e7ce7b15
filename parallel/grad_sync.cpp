// GradSync: bucketed async reduce-scatter of gradients and all-gather of parameters. See grad_sync.h.
#include "parallel/grad_sync.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "core/error.h"
#include "core/log.h"
#include "core/parallel.h"
#include "core/timer.h"
#include "kernels/rows.h"

namespace trex::parallel {

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// True when [p, p + bytes) lies in private anonymous mappings (the heap, glibc's mmap'd chunks,
// anonymous mmaps), where madvise(MADV_DONTNEED) drops pages that then read back as zeros.
bool private_anonymous(const void* p, size_t bytes) {
  std::ifstream f("/proc/self/maps");
  const uintptr_t hi = reinterpret_cast<uintptr_t>(p) + bytes;
  uintptr_t covered = reinterpret_cast<uintptr_t>(p);
  std::string line;
  while (covered < hi && std::getline(f, line)) {
    unsigned long a = 0, b = 0, off = 0, inode = 0;
    unsigned maj = 0, min = 0;
    char perms[8] = {};
    int n = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx %7s %lx %x:%x %lu %n", &a, &b, perms, &off, &maj, &min, &inode, &n) < 7)
      continue;
    if (b <= covered) continue;
    if (a > covered) return false;  // a hole (the maps are sorted)
    const std::string path = n > 0 && (size_t)n <= line.size() ? line.substr((size_t)n) : std::string();
    if (perms[3] != 'p' || inode != 0 || !(path.empty() || path == "[heap]" || path.rfind("[anon", 0) == 0))
      return false;
    covered = b;
  }
  return covered >= hi;
}

// dst[i] += src[i], i < n.
void add_into(float* dst, const float* src, size_t n) {
  parallel_for((int64_t)n, 1 << 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) dst[i] += src[i];
  });
}

}  // namespace

GradSync::GradSync(Communicator& dp_comm, const BucketLayout& layout, float* grads, float* params, bool average,
                   bool shard_grads, kern::Backend* mem)
    : comm_(dp_comm), L_(layout), grads_(grads), params_(params),
      dev_(mem && !mem->host_addressable() ? mem : nullptr), rank_(dp_comm.rank()), average_(average),
      shard_(shard_grads) {
  TREX_CHECK(dp_comm.size() == layout.dp, "GradSync: the dp communicator has ", dp_comm.size(),
             " ranks but the bucket layout was built for dp = ", layout.dp);
  TREX_CHECK(grads && params, "GradSync: null grads or params buffer");
  TREX_CHECK(!dev_ || (!average && !shard_grads), "GradSync: on device memory (", dev_->name(),
             ") only the summing ZeRO-1 form runs (average = false, shard_grads = false)");
  const size_t nb = layout.buckets.size();
  ready_count_.assign(nb, 0);
  marked_.assign(layout.params.size(), 0);
  rs_started_.assign(nb, 0);
  rs_.resize(nb);
  ag_.resize(nb);
  rs_t0_.assign(nb, 0);
  ag_t0_.assign(nb, 0);
  folded_.assign(nb, 0);
  rs_seq_.assign(nb, 0);
  zero_padding(grads_);
  zero_padding(params_);
  if (!shard_) return;
  page_ = (size_t)::sysconf(_SC_PAGESIZE);
  release_pages_ = private_anonymous(grads_, L_.total * sizeof(float));
  if (!release_pages_)
    TREX_LOG_WARN("GradSync: the gradient slab is not private anonymous memory; ZeRO-2 zeroes released buckets "
                  "instead of returning their pages to the OS (no memory saved)");
  size_t off = 0;
  for (int b = 0; b < layout.num_buckets(); ++b) acc_off_.push_back(off), off += layout.shard_size(b);
  acc_bytes_ = std::max<size_t>(off * sizeof(float), 1);
  void* a = ::mmap(nullptr, acc_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  TREX_CHECK(a != MAP_FAILED, "GradSync: cannot map the ", acc_bytes_, "-byte gradient shard accumulator");
  acc_ = static_cast<float*>(a);  // zero-filled
}

GradSync::~GradSync() {
  for (Handle& h : rs_) h.wait();  // (reads grads only; the accumulator is ours)
  if (acc_) ::munmap(acc_, acc_bytes_);
}

void GradSync::zero(float* p, size_t n) const {
  if (n == 0) return;
  if (dev_) dev_->zero(p, n * sizeof(float));
  else kern::zero_bytes(p, n * sizeof(float));
}

void GradSync::zero_padding(float* buf) const {
  for (const Bucket& b : L_.buckets) zero(buf + b.begin + b.used, b.size - b.used);
}

void GradSync::reset_marks() {
  std::fill(ready_count_.begin(), ready_count_.end(), 0);
  std::fill(marked_.begin(), marked_.end(), 0);
  std::fill(rs_started_.begin(), rs_started_.end(), 0);
  std::fill(folded_.begin(), folded_.end(), 0);
}

void GradSync::release(float* p, size_t n) const {
  if (n == 0) return;
  char* a = reinterpret_cast<char*>(p);
  char* e = a + n * sizeof(float);
  if (release_pages_) {
    char* lo = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(a) + page_ - 1) / page_ * page_);
    char* hi = reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(e) / page_ * page_);
    if (lo < hi && ::madvise(lo, (size_t)(hi - lo), MADV_DONTNEED) == 0) {
      std::memset(a, 0, (size_t)(lo - a));
      std::memset(hi, 0, (size_t)(e - hi));
      return;
    }
  }
  std::memset(a, 0, (size_t)(e - a));
}

void GradSync::rs_done(int b) {
  folded_[b] = 1;
  trace_done("reduce-scatter", b, rs_t0_[b]);
  if (!shard_) return;
  const Bucket& B = L_.buckets[b];
  const FlatRange r = L_.shard(b, rank_);
  float* acc = acc_ + acc_off_[b];
  if (!last_) {  // this rank's part of the micro-batch's sum into the accumulator; the bucket is free
    add_into(acc, grads_ + r.begin, r.size());
    acc_dirty_ = true;
    release(grads_ + B.begin, B.size);
    return;
  }
  // The step's last micro-batch: the shard keeps the total, the rest of the bucket is free.
  if (acc_dirty_) {
    add_into(grads_ + r.begin, acc, r.size());
    release(acc, r.size());  // 0 again for the next step
  }
  release(grads_ + B.begin, r.begin - B.begin);
  release(grads_ + r.end, B.begin + B.size - r.end);
}

void GradSync::wait_reduce_scatters(const char* what) {
  const double t0 = now_s(), w0 = now_ms();
  for (int b = 0; b < L_.num_buckets(); ++b)
    if (rs_started_[b] && !folded_[b]) rs_[b].wait();
  wait_s_ += now_s() - t0;
  if (trace_) trace_->add(what, TraceTrack::Compute, w0, now_ms());
  for (int b = 0; b < L_.num_buckets(); ++b)  // (the folds are compute, not waiting)
    if (rs_started_[b] && !folded_[b]) rs_done(b);
}

void GradSync::begin_micro_batch(bool last) {
  TREX_CHECK(shard_, "GradSync::begin_micro_batch: only with sharded gradients (ZeRO-2)");
  if (!last_) {  // the previous micro-batch of this step: every bucket must have been reduced
    for (int b = 0; b < L_.num_buckets(); ++b)
      TREX_CHECK(rs_started_[b], "GradSync::begin_micro_batch: bucket ", b,
                 " of the previous micro-batch was never marked ready");
    wait_reduce_scatters("wait: gradient reduce-scatter");
  } else {
    TREX_CHECK(buckets_started() == 0, "GradSync::begin_micro_batch after the step's last micro-batch: call "
                                       "finish_grad_sync and zero_grads first");
  }
  reset_marks();
  last_ = last;
}

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
    rs_seq_[b] = ++seq_;
  }
  if (progress() > max_in_flight_ && shard_) bound_in_flight();
}

void GradSync::bound_in_flight() {
  // OpenMPI progresses the reduce-scatters only inside MPI calls (here: once per bucket started),
  // so over a whole backward they would pile up, each holding its bucket (and MPI's temporary
  // buffers) resident: wait for the oldest ones (started first on every rank) until at most
  // max_in_flight_ remain.
  const double t0 = now_s(), w0 = now_ms();
  for (;;) {
    int oldest = -1, n = 0;
    for (int b = 0; b < L_.num_buckets(); ++b)
      if (rs_started_[b] && !folded_[b]) {
        ++n;
        if (oldest < 0 || rs_seq_[b] < rs_seq_[oldest]) oldest = b;
      }
    if (n <= max_in_flight_) break;
    rs_[oldest].wait();
    rs_done(oldest);
  }
  wait_s_ += now_s() - t0;
  if (trace_) trace_->add("wait: gradient reduce-scatter (in flight)", TraceTrack::Compute, w0, now_ms());
}

int GradSync::progress() {
  int pending = 0;
  for (int b = 0; b < L_.num_buckets(); ++b) {
    if (rs_started_[b] && !folded_[b]) {
      if (rs_[b].test()) rs_done(b);
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
  TREX_CHECK(last_, "GradSync::finish_grad_sync: the step's last micro-batch was begun with last = false");
  wait_reduce_scatters("wait: gradient reduce-scatter");
  if (average_) {
    const float inv = 1.0f / static_cast<float>(L_.dp);
    for (int b = 0; b < L_.num_buckets(); ++b)
      for (float& g : grad_shard(b)) g *= inv;
  }
  reset_marks();
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
  if (dev_) {
    for (int b = 0; b < L_.num_buckets(); ++b) {
      const FlatRange r = L_.shard(b, rank_);
      s += dev_->sum_squares(grads_ + r.begin, (int64_t)r.size());
    }
    return s;
  }
  for (int b = 0; b < L_.num_buckets(); ++b) {
    const FlatRange r = L_.shard(b, rank_);
    for (size_t i = r.begin; i < r.end; ++i) s += static_cast<double>(grads_[i]) * grads_[i];
  }
  return s;
}

double GradSync::global_grad_norm() {
  TREX_CHECK(!dev_, "GradSync::global_grad_norm: on device memory the communicator moves device buffers; sum "
             "grad_norm_sq_local() over a host communicator instead (train::DataParallel::finish_grads does)");
  return std::sqrt(comm_.all_reduce_value(grad_norm_sq_local()));
}

void GradSync::scale_grad_shards(float s) {
  TREX_CHECK(!dev_, "GradSync::scale_grad_shards: not on device memory (the optimizer scales instead)");
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
  if (!shard_) {
    zero(grads_, L_.total);
    return;
  }
  release(grads_, L_.total);
  release(acc_, acc_bytes_ / sizeof(float));
  acc_dirty_ = false;
  last_ = true;
  reset_marks();
}

}  // namespace trex::parallel
