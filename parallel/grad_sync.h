// GradSync: data-parallel gradient reduction with a distributed optimizer (ZeRO-1, or ZeRO-2 with
// sharded gradients: see below), Megatron-Core DistributedOptimizer style, on flat f32 buffers
// laid out by a BucketLayout.
//
// One step:
//   zero_grads()                         grads = 0 (padding included), counters reset
//   micro-batches 1 .. n-1: backward     gradients accumulate (+=) in `grads`; nothing is marked
//   last micro-batch: backward, calling mark_ready(p) as each parameter's gradient is final; the
//                                        bucket's reduce-scatter starts as soon as its last
//                                        parameter is marked (in place, async)
//   finish_grad_sync()                   waits for every bucket; rank r's shard of `grads` then
//                                        holds the dp average (sum x 1/dp; the sum with average = false); the rest of `grads`
//                                        is undefined
//   global_grad_norm(), scale_grad_shards(c)   clipping over the whole model
//   optimizer on grad_shard(b) / param_shard(b) for every bucket (state: layout.shard_elems())
//   start_param_all_gather()             async, in place, last bucket first (= first in forward)
//   next forward: wait_param_bucket(b) before using a bucket's parameters, or
//   wait_param_all_gather()              for all of them
//
// Sharded gradients (ZeRO-2, DeepSpeed stage 2; shard_grads = true): every micro-batch's backward
// marks its buckets, so each bucket is reduce-scattered per micro-batch, and the full-size
// gradient of a bucket lives only between the backward that writes it and its reduce-scatter:
//   zero_grads()                         grads and the shard accumulator released (read as 0)
//   per micro-batch: begin_micro_batch(last); backward calling mark_ready(p)
//                                        begin_micro_batch waits for the previous micro-batch's
//                                        reduce-scatters; when bucket b's completes:
//     not last: accumulator[shard b] += grads[shard b]; the whole bucket range of grads is
//               released to the OS (madvise(MADV_DONTNEED) on its page-aligned interior, the
//               partial pages at its edges zeroed by hand): it reads as 0 for the next +=
//     last:     grads[shard b] += accumulator[shard b] (then released); the rest of the bucket
//               is released. After finish_grad_sync rank r's shard of `grads` holds the sum over
//               ranks and micro-batches, as with ZeRO-1 (up to the order of the float additions).
//   mark_ready keeps at most 2 reduce-scatters in flight (it waits for the oldest beyond that):
//   each one holds a full bucket resident (and MPI's temporaries), and OpenMPI advances them only
//   inside MPI calls, so unbounded they would pile up over a backward.
// The accumulator ([layout.shard_elems()] f32, a private anonymous mapping of its own) is the only
// full-precision gradient state that persists across micro-batches. grads must be private
// anonymous memory (malloc / aligned_alloc memory is; checked against /proc/self/maps at
// construction): otherwise released ranges are zeroed with memset (correct, no memory saved;
// releases_pages() says which).
//
// OpenMPI only progresses non-blocking collectives inside MPI calls: mark_ready() and progress()
// test the handles in flight, so a backward that calls mark_ready regularly keeps them moving.
// Model-parallel note: with tp / pp > 1 the grad norm must also be summed over the model-parallel
// ranks (grad_norm_sq_local() is exposed for that); dp_comm is the data-parallel group only.
#pragma once
#include <span>
#include <vector>

#include "core/trace.h"
#include "kernels/backend.h"
#include "parallel/buckets.h"
#include "parallel/comm.h"

namespace trex::parallel {

class GradSync {
 public:
  // grads, params: [layout.total] flat f32 buffers in the layout's order, owned by the caller and
  // alive as long as this object. dp_comm.size() must equal layout.dp. Zeroes the padding of both.
  // average = false: finish_grad_sync leaves the sum over ranks (no 1/dp). shard_grads: ZeRO-2
  // (above).
  // mem: the backend whose memory grads and params are, when the host cannot address it (a
  // device; dp_comm must then move that memory: parallel/comm_device.h); the zeroing and the
  // norm then run there. Device memory takes ZeRO-1 summing only (average = false, no
  // shard_grads, no scale_grad_shards).
  GradSync(Communicator& dp_comm, const BucketLayout& layout, float* grads, float* params, bool average = true,
           bool shard_grads = false, kern::Backend* mem = nullptr);
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;
  ~GradSync();  // waits for anything in flight

  // --- ZeRO-2: before each micro-batch's backward (shard_grads only) ---
  // Waits for the previous micro-batch's reduce-scatters (every bucket must have been marked) and
  // folds them into the accumulator; resets the ready counters. last: this is the step's last
  // micro-batch (its reduce-scatters end in `grads`; finish_grad_sync follows). Not calling it at
  // all makes the step one (last) micro-batch.
  void begin_micro_batch(bool last);
  bool shards_grads() const { return shard_; }
  bool releases_pages() const { return release_pages_; }  // madvise works on `grads` (else memset)

  // --- backward (ZeRO-1: last micro-batch; ZeRO-2: every micro-batch) ---
  // Parameter `param`'s gradient is complete; when it is the last of its bucket, the bucket's
  // reduce-scatter starts. Each parameter once per step.
  void mark_ready(int param);
  // Tests the handles in flight (drives MPI progress); returns the number still pending.
  int progress();
  // Waits for every bucket's reduce-scatter and averages this rank's shards (unless the object
  // sums: average = false). Every parameter must
  // have been marked. Resets the ready counters for the next step.
  void finish_grad_sync();
  bool bucket_started(int bucket) const { return rs_started_[bucket] != 0; }
  int buckets_started() const;

  // --- optimizer ---
  // This rank's slice of bucket b: [layout.shard_size(b)] elements.
  std::span<float> grad_shard(int bucket);
  std::span<float> param_shard(int bucket);
  double grad_norm_sq_local() const;  // sum of squares over this rank's shards (after finish)
  double global_grad_norm();          // sqrt of grad_norm_sq_local() summed over dp_comm (host memory only)
  void scale_grad_shards(float s);    // grads of this rank's shards *= s (clipping)

  // --- after the optimizer step ---
  // Starts an in-place all-gather of every bucket's parameter shards, last bucket first (or first
  // bucket first: the order a forward over a slab in forward order needs them).
  void start_param_all_gather(bool first_bucket_first = false);
  void wait_param_bucket(int bucket);
  void wait_param_all_gather();

  // Zeroes all of `grads` (the reduce-scatter leaves partial sums outside the shard). ZeRO-2: by
  // releasing its pages, and the accumulator's.
  void zero_grads();

  // Seconds the calling thread spent blocked in finish_grad_sync / wait_param_* (exposed
  // communication), accumulated since construction.
  double exposed_wait_seconds() const { return wait_s_; }

  // Optional timeline (core/trace.h; null = off): every bucket's reduce-scatter and all-gather
  // from launch until seen complete on the Comm track, the waits on the Compute track.
  void set_trace(TraceLog* t) { trace_ = t; }

  const BucketLayout& layout() const { return L_; }

 private:
  Communicator& comm_;
  const BucketLayout& L_;
  float* grads_;
  float* params_;
  kern::Backend* dev_ = nullptr;  // non-null: grads_ and params_ are this backend's device memory
  int rank_;
  bool average_;
  std::vector<int> ready_count_;  // [buckets] params marked this step
  std::vector<char> marked_;      // [params]
  std::vector<char> rs_started_;  // [buckets]
  std::vector<Handle> rs_;        // [buckets] reduce-scatter in flight
  std::vector<Handle> ag_;        // [buckets] all-gather in flight
  std::vector<double> rs_t0_, ag_t0_;  // [buckets] launch times (now_ms), for the trace
  std::vector<char> folded_;           // [buckets] reduce-scatter seen complete (and folded) this micro-batch
  std::vector<int64_t> rs_seq_;        // [buckets] start order of the reduce-scatters
  int64_t seq_ = 0;
  // ZeRO-2
  bool shard_ = false;
  bool release_pages_ = false;  // grads is private anonymous memory: madvise releases its pages
  int max_in_flight_ = 2;       // reduce-scatters left in flight before mark_ready waits for the oldest
  bool last_ = true;            // the current micro-batch is the step's last
  bool acc_dirty_ = false;      // a non-last micro-batch was folded into the accumulator this step
  float* acc_ = nullptr;        // [layout.shard_elems()] mmap'd; bucket b at acc_off_[b]
  size_t acc_bytes_ = 0;
  std::vector<size_t> acc_off_;  // [buckets]
  size_t page_ = 4096;
  double wait_s_ = 0;
  TraceLog* trace_ = nullptr;
  // Waits for h (if pending) and traces it as `what` of bucket b launched at t0.
  void wait_traced(Handle& h, const char* what, int b, double t0);
  void trace_done(const char* what, int b, double t0);
  // Bucket b's reduce-scatter is complete: traced, and (ZeRO-2) folded and released.
  void rs_done(int b);
  // ZeRO-2: waits for the oldest reduce-scatters in flight until max_in_flight_ remain.
  void bound_in_flight();
  // Waits for (and folds) every reduce-scatter started and not yet seen complete; `what` names the
  // wait in the trace. Counted as exposed communication.
  void wait_reduce_scatters(const char* what);
  // The per-step bookkeeping back to "nothing marked, started or folded".
  void reset_marks();
  void zero(float* p, size_t n) const;  // p[0, n) = 0 in host or device memory
  void zero_padding(float* buf) const;  // the padding of every bucket of buf
  // [p, p + n) reads as 0 afterwards: its whole pages released (release_pages_), the rest zeroed.
  void release(float* p, size_t n) const;
};

}  // namespace trex::parallel
