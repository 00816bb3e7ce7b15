// GradSync: data-parallel gradient reduction with a distributed optimizer (ZeRO-1), Megatron-Core
// DistributedOptimizer style, on flat f32 buffers laid out by a BucketLayout.
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
// OpenMPI only progresses non-blocking collectives inside MPI calls: mark_ready() and progress()
// test the handles in flight, so a backward that calls mark_ready regularly keeps them moving.
// Model-parallel note: with tp / pp > 1 the grad norm must also be summed over the model-parallel
// ranks (grad_norm_sq_local() is exposed for that); dp_comm is the data-parallel group only.
#pragma once
#include <span>
#include <vector>

#include "core/trace.h"
#include "parallel/buckets.h"
#include "parallel/comm.h"

namespace trex::parallel {

class GradSync {
 public:
  // grads, params: [layout.total] flat f32 buffers in the layout's order, owned by the caller and
  // alive as long as this object. dp_comm.size() must equal layout.dp. Zeroes the padding of both.
  // average = false: finish_grad_sync leaves the sum over ranks (no 1/dp).
  GradSync(Communicator& dp_comm, const BucketLayout& layout, float* grads, float* params, bool average = true);
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;
  ~GradSync();  // waits for anything in flight

  // --- backward (last micro-batch) ---
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
  double global_grad_norm();          // sqrt of grad_norm_sq_local() summed over dp_comm
  void scale_grad_shards(float s);    // grads of this rank's shards *= s (clipping)

  // --- after the optimizer step ---
  // Starts an in-place all-gather of every bucket's parameter shards, last bucket first (or first
  // bucket first: the order a forward over a slab in forward order needs them).
  void start_param_all_gather(bool first_bucket_first = false);
  void wait_param_bucket(int bucket);
  void wait_param_all_gather();

  // Zeroes all of `grads` (the reduce-scatter leaves partial sums outside the shard).
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
  int rank_;
  bool average_;
  std::vector<int> ready_count_;  // [buckets] params marked this step
  std::vector<char> marked_;      // [params]
  std::vector<char> rs_started_;  // [buckets]
  std::vector<Handle> rs_;        // [buckets] reduce-scatter in flight
  std::vector<Handle> ag_;        // [buckets] all-gather in flight
  std::vector<double> rs_t0_, ag_t0_;  // [buckets] launch times (now_ms), for the trace
  double wait_s_ = 0;
  TraceLog* trace_ = nullptr;
  // Waits for h (if pending) and traces it as `what` of bucket b launched at t0.
  void wait_traced(Handle& h, const char* what, int b, double t0);
  void trace_done(const char* what, int b, double t0);
};

}  // namespace trex::parallel
