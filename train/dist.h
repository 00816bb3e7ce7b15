// Data-parallel training state of one rank: gradient buckets over the model's own parameter /
// gradient slabs (zero copy), the ZeRO-1 sharded AdamW, and the collectives of one step. The
// step itself is train/trainer.cpp: trainer_step(DataParallel&, ...).
//
// Layout. The model's f32 slabs (model.params, model.grads, layout.total elements in forward
// order) are padded with zeros to a multiple of 16 * dp elements and cut into buckets of
// bucket_elems (rounded up to a multiple of 16 * dp) consecutive slab elements; every bucket is a
// multiple of 16 * dp, so parallel::BucketLayout adds no padding inside the slab and bucket b's
// flat range IS the slab range [b * size, ...): the reduce-scatter and the all-gather run in place
// on the model's slabs. A bucket may cut a tensor in two; a bucket is ready when every parameter
// group (a decoder layer, the head, the embedding: model.grad_ready) touching it has its final
// gradient. Rank r owns shard r of every bucket (16-element, 64-byte aligned); its AdamW moments
// cover those shards only (about 1/dp of the full moments), with weight decay / frozen per
// element taken from the parameter each element belongs to.
//
// One step (all ranks, same order):
//   begin_step()                       grads = 0
//   micro-batches 1 .. n-1             backward accumulates locally, no communication
//   arm(); last backward; disarm()     the model's grad_ready hook marks buckets ready as layers
//                                      finish: each bucket's reduce-scatter starts during the
//                                      backward (overlap); disarm() marks what is left
//   finish_grads()                     waits; shard = sum over ranks of the weighted gradients;
//                                      returns the global gradient norm (all-reduced)
//   opt().apply(); gather_params()     update the shard, all-gather the parameters, refresh bf16
//                                      (overlap_params: started here, waited bucket by bucket by
//                                      the next forward; wait_params() before reading them else)
// ZeRO-2 (DpOptions::zero_stage = 2; parallel/grad_sync.h): the gradients are sharded too. Every
// micro-batch is wrapped in begin_micro(last) / end_micro(last) (trainer_step does this for every
// micro-batch; with ZeRO-1 only the last one arms the hook), each micro-batch's buckets are
// reduce-scattered as the backward completes them, this rank's shard of each is added into a
// [shard elems] accumulator held by GradSync and the bucket's slab range is released to the OS
// (it reads as 0 for the next micro-batch's +=). After the last micro-batch the accumulated sum
// sits in the slab's shard ranges, where the AdamW shard reads it, exactly as with ZeRO-1. With
// pipeline parallelism only for stage-sharded models: each stage's regions are reduced over the
// stage's own ranks, which all run the same 1F1B schedule, so a bucket's reduce-scatter completes
// before the next backward reuses it; the shared embedding region (first and last stage, whose
// backwards of one micro-batch run at different times) stays ZeRO-1. A model holding every stage
// would need each micro-batch's collectives over every rank: refused.
// Gradients are SUMMED over ranks (GradSync with average = false): trainer_step weights each
// micro-batch by its share of the GLOBAL target count. (Scaling by dp and averaging would round
// twice when dp is not a power of two; with pipeline stages every tensor's sum is then exact.)
#pragma once
#include <memory>
#include <string>
#include <vector>
#include "parallel/buckets.h"
#include "parallel/comm.h"
#include "parallel/grad_sync.h"
#include "train/checkpoint.h"
#include "train/optimizer.h"

namespace trex::train {

struct DpOptions {
  int64_t bucket_elems = 4 << 20;  // slab elements per gradient bucket (rounded up to 16 * dp); 0 = one bucket
  bool overlap = true;             // start reduce-scatters from the backward (else after it)
  // Tensor parallel: the communicator holds dp x tp ranks, comm rank = tp_rank + tp * data_rank
  // (parallel/dims.h order), and the tp ranks of one data rank see the same batches. Gradients of
  // model::tp_partial_grad tensors are partial on each tp rank (their sum is the gradient); the
  // other tensors' gradients are whole on every tp rank and count once (tp rank 0's), as do the
  // loss, token and expert-load sums.
  int tp = 1;
  // Pipeline parallel: the communicator holds dp x tp x pp ranks (comm rank = tp_rank + tp *
  // (data_rank + dp * pp_rank)) and the model runs one stage (Model::set_pipeline_stage). Each
  // stage computes the gradients of its own tensors only; the others stay 0 there, so the sum over
  // every rank completes every tensor. pp_comm: the pp group of this rank (train/pipeline.h).
  int pp = 1;
  parallel::Communicator* pp_comm = nullptr;
  // Context parallel: the communicator holds tp x cp x dp x pp ranks (comm rank = tp_rank + tp *
  // (cp_rank + cp * (data_rank + dp * pp_rank)), parallel/dims.h) and the cp ranks of a data rank
  // see the same batches, each computing on its chunks of every sequence
  // (Model::set_context_parallel). Every gradient is partial on each cp rank (the reduction over
  // every rank sums them); the loss parts, token counts and expert loads count once (cp rank 0's).
  int cp = 1;
  // Let the parameter all-gather of an optimizer step run on into the next forward: each bucket
  // is waited for (and its bf16 shadow refreshed) just before the forward first reads a parameter
  // group in it (Model::params_needed). Off: gather_params() waits for everything.
  bool overlap_params = false;
  // Tensor parallel: sequence parallel outside the split blocks (model/model.h TensorParallel);
  // every gradient is then partial on each tp rank and the reduction sums all of them.
  bool sequence_parallel = false;
  // 1: ZeRO-1 (sharded moments; the gradient slab is whole on every rank). 2: ZeRO-2 (gradients
  // sharded too: see above). 2 with pp > 1 only for stage-sharded models.
  int zero_stage = 1;
  // Expert-sharded models (model/params.h ExpertShard; make_parallel_run sets it): the ranks of the
  // communicator that hold the same routed experts (the same ep rank; world / ep of them). The
  // slab is then two regions, each with its own buckets, GradSync and ZeRO shards: the dense
  // tensors [0, expert_begin) reduced over every rank, the expert region [expert_begin, total)
  // over these ranks only.
  parallel::Communicator* expert_comm = nullptr;
  // Stage-sharded models (model/params.h StageShard; make_parallel_run sets them): the ranks of
  // this pipeline stage, and (when the first and the last stage both hold the embedding) the ranks
  // of those two stages. Every region is then reduced over the ranks holding it: the shared
  // embedding [0, shared_end) over shared_comm, the stage's other dense tensors over stage_comm,
  // its held experts over expert_comm (then the ranks of this stage with the same ep rank).
  parallel::Communicator* stage_comm = nullptr;
  parallel::Communicator* shared_comm = nullptr;
  // Tensor-parallel-sharded models (model/params.h TpShard; make_parallel_run sets it): the ranks
  // holding the same slice (the same tp rank; of this stage when the model is stage-sharded). The
  // region of the split tensors [tp_begin, expert region or end) is reduced over them.
  parallel::Communicator* tp_slice_comm = nullptr;
  // A model computing on a device (model::Model::on_device(): parameters and gradients in a
  // backend's memory): the communicator over the same ranks as dp_comm that moves that memory
  // (parallel/comm_device.h; make_parallel_run sets it). The gradient reduce-scatters and the
  // parameter all-gathers run on it, in place on the model's device slabs (padded like the host
  // ones); the loss, count and norm sums, the replica broadcast and the checkpoint gathers stay on
  // dp_comm over the host copies. Plain data parallelism only: no ep / tp / pp, ZeRO-1.
  parallel::Communicator* device_comm = nullptr;
};

// What a sum over ranks counts (DataParallel::sum).
enum class Count {
  PerDataRank,  // values every rank of a data rank knows (token and target counts): counted once
  PerStage,     // values each pipeline stage computes for its own part (loss parts, expert loads):
                // counted once per stage of each data rank (tp rank 0's, cp rank 0's)
};

class DataParallel {
 public:
  // Collective over dp_comm. Pads m's parameter and gradient slabs, builds the buckets, creates
  // the sharded AdamW and makes the replicas equal (broadcast of rank 0's weights and buffers;
  // expert-sharded: each expert region from the first rank of its expert_comm, so every rank must
  // have initialized from the same seed or loaded the same checkpoint).
  DataParallel(parallel::Communicator& dp_comm, model::Model& m, AdamWConfig ocfg, DpOptions o = {});
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  parallel::Communicator& comm() const { return comm_; }
  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }
  // The data-parallel coordinates (which batches this rank reads): without tensor parallelism
  // rank() and size().
  int data_rank() const { return comm_.rank() / (o_.tp * o_.cp) % data_size(); }
  int data_size() const { return comm_.size() / (o_.tp * o_.cp * o_.pp); }
  int tp_rank() const { return comm_.rank() % o_.tp; }
  int cp_rank() const { return comm_.rank() / o_.tp % o_.cp; }
  int pp_rank() const { return comm_.rank() / (o_.tp * o_.cp * data_size()); }
  // The pp group (null without pipeline parallelism) and the time this rank was blocked in its
  // receives (pipeline_step / pipeline_forward add to it; part of exposed_wait_s).
  parallel::Communicator* pipeline() const { return o_.pp_comm; }
  double& pipeline_wait_ms() { return pp_wait_ms_; }
  model::Model& model() const { return m_; }
  AdamW& opt() { return *opt_; }
  const AdamW& opt() const { return *opt_; }
  // The buckets of the dense region (the whole slab unless the model is expert-sharded; offsets
  // are slab offsets there) and the bucket count of all regions.
  const parallel::BucketLayout& buckets() const { return regions_[0].layout; }
  int num_buckets() const;
  int64_t padded_elems() const { return padded_; }  // the slab's length with every region's padding
  bool sharded() const { return m_.layout.sharded(); }  // the model holds part of the slab (experts or a stage)
  const DpOptions& options() const { return o_; }

  // --- the step (trainer_step) ---
  void begin_step();
  // Around every micro-batch's forward_backward (last: the step's last micro-batch): ZeRO-1 arms
  // the hook for the last one only; ZeRO-2 for every one, after waiting for the previous
  // micro-batch's reduce-scatters.
  void begin_micro(bool last);
  void end_micro(bool last);
  // Before the last micro-batch's forward_backward (ZeRO-2: every one's; last: whether it is the
  // step's last): installs model.grad_ready.
  void arm(bool last = true);
  void disarm();  // after it: removes the hook, marks the buckets it did not mark
  int zero_stage() const { return o_.zero_stage; }
  // ZeRO-2: released slab ranges really return their pages to the OS (else they are zeroed).
  bool releases_grad_pages() const;
  // Waits for the gradient reduce-scatter; returns the global L2 norm of the gradient.
  // inject_nan (test hook): rank 0 puts a NaN into its shard first.
  double finish_grads(bool inject_nan = false);
  void gather_params();  // all-gather of the updated shards, then the bf16 shadow
  // overlap_params: waits for the parameter all-gather still in flight (every bucket) and
  // refreshes the bf16 shadow; a no-op when none is. Call before reading the parameters outside
  // a forward (checkpoints, comparisons); finish_grads, save_checkpoint and load_checkpoint do.
  void wait_params();
  // In place: sums over ranks (blocking; counted as exposed communication). Only the ranks that
  // count (see Count) contribute; the others' values are ignored.
  void sum(int64_t* v, size_t n, Count c = Count::PerDataRank);
  void sum(double* v, size_t n, Count c = Count::PerDataRank);
  // Per layer and expert, summed over the data ranks and the stages (each stage counts its layers).
  model::ExpertLoad sum_loads(const model::ExpertLoad& load);
  // rank 0's weights and buffers to every rank (after init or a checkpoint load).
  void broadcast_replicas();

  // Seconds this rank spent blocked in communication since construction (GradSync waits, the
  // small blocking all-reduces of the step and, expert parallel, the MoE layers' all-to-alls).
  double exposed_wait_s() const;
  // The part of exposed_wait_s spent in the context-parallel collectives (model/context_parallel.h).
  // OpenMPI progresses every request in flight inside any MPI call, so with parallel.overlap on it
  // also holds the gradient buckets' transfers that ran while the collective waited.
  double cp_wait_s() const;
  // Optional timeline (core/trace.h; null = off): the gradient and parameter collectives and the
  // step's small all-reduces on the Comm track, the waits for them on the Compute track.
  void set_trace(TraceLog* t);
  // Buckets (of every region) whose reduce-scatter was started before the last backward returned
  // (by the hook).
  int buckets_started_in_backward() const;

  // A whole model's master weights and AdamW moments on rank 0 (layout: the whole model's, not
  // sharded), for the checkpoint writer; params null and the vectors empty on the other ranks.
  // Collective. Without sharding params points at the model's own slab (valid while it is not
  // changed); with it, at `store`, assembled from every region's lowest rank.
  struct Gathered {
    model::ParamLayout layout;
    const float* params = nullptr;      // [layout.total]
    std::vector<float> store, m1, m2;   // store: the assembled weights (expert-sharded only)
  };
  Gathered gather_whole();

 private:
  // One part of the slab reduced over one communicator: [begin, begin + layout.total).
  // The shared embedding, the other dense tensors, the tensor-parallel split tensors, the experts
  // (the order of the regions in the slab).
  enum class Kind { Shared, Dense, TpSplit, Experts };
  struct Region {
    Kind kind = Kind::Dense;
    parallel::Communicator* comm = nullptr;
    int64_t begin = 0;
    parallel::BucketLayout layout;  // offsets relative to begin
    std::unique_ptr<parallel::GradSync> sync;
    std::vector<std::vector<int>> group_buckets;  // [groups] buckets touched by each parameter group
    std::vector<int> bucket_groups;               // [buckets] groups touching each bucket
    std::vector<int> left;                        // [buckets] groups still to finish this step
    int next_bucket = -1;                         // highest bucket whose reduce-scatter is not started
    bool zero2 = false;                           // gradients sharded (ZeRO-2): reduced every micro-batch
    bool armed = false;                           // its buckets are reduced in this backward
    int started_in_bwd = 0;
    std::vector<char> gathered;                   // [buckets] overlap_params: all-gather waited this step
  };
  void add_region(Kind kind, parallel::Communicator& comm, int64_t begin, int64_t end);
  // The communicator over region r's ranks for host memory: r.comm, or dp_comm when r.comm moves
  // device memory (DpOptions::device_comm).
  parallel::Communicator& host_comm(const Region& r) const { return m_.on_device() ? comm_ : *r.comm; }
  void on_group(int64_t g);
  int64_t group_index(int64_t g) const;  // grad_ready numbering -> index into Region::group_buckets
  void start_ready_buckets(Region& r);   // reduce-scatters of the ready buckets, highest index first
  void finish_param_bucket(Region& r, int b);  // waits for bucket b's all-gather, refreshes its bf16 shadow
  bool counts(Count c) const { return tp_rank() == 0 && cp_rank() == 0 && (c == Count::PerStage || pp_rank() == 0); }
  void drop_tp_copies(int64_t i);  // tensor parallel, tp rank > 0: zero group i's whole-gradient tensors
  // Region k's AdamW moments ([region size] each, indexed like the region) on its comm's rank 0.
  void gather_region_moments(size_t k, std::vector<float>& m1, std::vector<float>& m2);
  // The slab range of region kind `kind` (Kind: 0 the shared embedding, 1 the other dense
  // tensors, 2 the tensor-parallel split tensors, 3 the held experts) in a layout ([b, b) when it
  // has none).
  static std::pair<int64_t, int64_t> region_bounds(const model::ParamLayout& L, int kind);
  parallel::Communicator& comm_;
  model::Model& m_;
  DpOptions o_;
  int64_t padded_ = 0;
  std::vector<Region> regions_;  // in slab order: [shared embedding], dense (or the whole slab), [experts]
  TraceLog* trace_ = nullptr;
  void traced_wait(double t0_s, double t0_ms);  // accounts a blocking all-reduce that began at t0
  template <class T>
  void all_reduce_timed(T* v, size_t n);  // blocking sum over every rank of comm_, counted as exposed
  std::unique_ptr<AdamW> opt_;
  std::vector<char> fired_;                      // [groups]
  std::vector<std::vector<std::pair<int64_t, int64_t>>> tp_copies_;  // [groups] (offset, size) to zero
  double pp_wait_ms_ = 0;
  double wait_s_ = 0;                            // blocking all-reduces
};

// Collective: rank 0 writes the checkpoint a single-rank run would write (moments gathered from
// the shards; expert-sharded: the weights and moments of every expert gathered too, so rank 0
// holds a whole model's weights and moments while it writes); every rank returns its directory.
std::string save_checkpoint(const std::string& run_dir, DataParallel& dp, const TrainState& state, int keep = 3);
// Every rank loads the full checkpoint and keeps its shard of the moments (load_checkpoint on the
// sharded AdamW), then the replicas are made equal. verify: as train/checkpoint.h's.
TrainState load_checkpoint(const std::string& dir, DataParallel& dp, bool verify = true);

// Which global batch positions rank r reads: micro-batch a of a step takes global positions
// step_begin + a * dp * B + r * B + [0, B), so the union over ranks of micro-batch a is micro-batch
// a of a single-rank run with batch_size dp * B (same sequences, same step).
inline int64_t dp_data_position(int64_t step_begin, int64_t a, int r, int dp, int64_t B, int64_t i) {
  return step_begin + (a * dp + r) * B + i;
}

}  // namespace trex::train
