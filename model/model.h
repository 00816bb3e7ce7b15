// A DeepSeek-V3-family (or DeepSeek-V4, model/model_v4.cpp) causal LM on one rank: parameter / gradient / bf16-shadow slabs, the
// activation arena, and the training step's forward and backward (embedding -> L x [RMSNorm,
// MLA, residual, RMSNorm, dense MLP or MoE, residual] -> RMSNorm -> LM head fused with
// cross-entropy; with mtp_loss_weight > 0 the MTP layers, model/mtp_v3.h). Gradients accumulate
// over calls until zero_grads().
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>
#include "core/arena.h"
#include "core/stack_arena.h"
#include "kernels/gemm.h"
#include "model/config.h"
#include "model/context_parallel.h"
#include "model/mla.h"
#include "model/moe.h"
#include "model/params.h"
#include "model/seq_parallel.h"

namespace trex::model {

// One micro-batch. targets are already shifted: targets[b, t] is the token that position t
// predicts (-100 = no loss). pos and seg may be null (positions 0..T-1, one document per row).
struct Batch {
  int64_t B = 0, T = 0;
  const int32_t* input_ids = nullptr;  // [B, T]
  const int32_t* targets = nullptr;    // [B, T]
  const int32_t* pos = nullptr;        // [B, T]
  const int32_t* seg = nullptr;        // [B, T]
};

// Hugging Face labels (aligned with input_ids) -> shifted targets for Batch.
std::vector<int32_t> shift_labels(const std::vector<int32_t>& labels, int64_t B, int64_t T);

struct LossParts {
  double loss = 0;  // ce + aux + mtp_loss_weight * mtp + indexer_loss_weight * indexer
  double ce = 0;    // mean over valid targets
  double aux = 0;   // sequence-wise balance loss (0 when off)
  double mtp = 0;   // MTP (V3, V4): mean over depths of each depth's mean CE (0 when off)
  // DeepSeek-V3.2 with indexer_loss_weight > 0 (else 0), summed over the decoder layers run (MTP
  // layers included): each layer's indexer KL loss (its mean over queries; loss += weight *
  // indexer) and the main attention's mass inside the indexer's top-k (mean over queries; divide
  // by the layers for the mean recall).
  double indexer = 0, indexer_recall = 0;
  int64_t n_valid = 0;
};

// Tensor parallel (Megatron-style column / row parallel pairs) on one rank of a tp group: the
// attention heads (and the dense MLPs' columns) are split over the tp ranks; every other part of
// the layer (norms, hyper-connections, router, experts, embedding, head) runs in full on every tp
// rank on the same tokens. The slabs still hold every tensor. After each split block an
// all-reduce over the tp group sums the partial outputs (forward) and the partial input
// gradients (backward), so the activations stay the same on every tp rank.
//
// Sequence parallel (sp, model/seq_parallel.h): outside the split blocks each tp rank keeps only
// its shard of the tokens, so the norms, hyper-connections, MoE layers, embedding and head run on
// N / tp tokens; the shards are all-gathered before a split block and its partial outputs
// reduce-scattered after it (instead of the all-reduce). Every gradient is then partial on each
// tp rank (the data-parallel reduction sums them); the loss parts and expert loads a forward
// returns are summed over the tp group, so they are the whole micro-batch's on every tp rank.
struct TensorParallel {
  parallel::Communicator* comm = nullptr;  // tp group
  TpSlice slice;                           // this rank's part
  bool sp = false;                         // sequence parallel
  mutable double wait_ms = 0;              // time blocked in the tp collectives
  bool on() const { return comm != nullptr; }
};

// Under tensor parallelism, true for the tensors whose gradient each tp rank holds a partial sum
// of (the attention blocks, the dense MLPs: the sum over the tp group is the gradient); false for
// the tensors whose full gradient every tp rank computes (count them once). With sequence
// parallel every tensor's gradient is partial (each tp rank sees its own tokens).
bool tp_partial_grad(const std::string& name);

// Pipeline parallel: the part of the model one pp stage runs. Decoder layers [l0, l1); the first
// stage also the embedding, the last also the final norm, the LM head with the loss and the MTP
// blocks or layers. A model built with the matching StageShard holds only those tensors; a whole model
// keeps every tensor, and the gradients of the other stages' tensors stay 0 here (the
// data-parallel reduction over every rank sums them in).
struct PipelineStage {
  int64_t l0 = 0, l1 = -1;  // l1 = -1: every layer (no pipeline)
  bool first = true, last = true;
  bool on() const { return !(first && last); }
};

// The activations a pipeline stage exchanges (V3: [N, d]; V4: the streams [N, hc_mult, d]).
struct StageIO {
  const float* x_in = nullptr;  // not the first stage: the previous stage's output
  float* x_out = nullptr;       // not the last stage, forward: this stage's output
  const float* dy = nullptr;    // not the last stage, backward: the gradient of x_out
  float* dx_in = nullptr;       // not the first stage, backward: the gradient of x_in (overwritten)
  bool count = true;            // add the aux loss and the expert loads of this call
};

// Expert loads (token-slot assignments) per layer and routed expert: one flat [L, E] slab (rows of
// layers without routed experts stay 0), so a data-parallel sum is one collective.
struct ExpertLoad {
  int64_t L = 0, E = 0;
  std::vector<int64_t> v;  // [L, E]
  int64_t* layer(int64_t l) { return v.data() + l * E; }
  const int64_t* layer(int64_t l) const { return v.data() + l * E; }
  std::vector<int64_t> operator[](int64_t l) const { return {layer(l), layer(l) + E}; }  // a copy of layer l's row
  bool operator==(const ExpertLoad&) const = default;
};

struct TrainOptions {
  double aux_loss_alpha = 0;   // sequence-wise aux loss coefficient
  double mtp_loss_weight = 0;  // > 0: train the config's MTP blocks / layers (V3, V4), loss += weight * mtp
  Recompute recompute = Recompute::None;
  // > 0: train the lightning indexer with its KL loss (DeepSeek-V3.2 model/v32_indexer_loss.h,
  // DeepSeek-V4 CSA model/v4_indexer.h):
  // loss += weight * indexer loss, the indexer's tensors unfrozen. 0: frozen, as transformers.
  double indexer_loss_weight = 0;
  IndexerStage indexer_stage = IndexerStage::Sparse;  // DenseWarmup: only the indexer trains
  // With weight 0: compute the indexer loss and its recall anyway (forward only, the indexer stays
  // frozen), so a run without the loss reports them too (LossParts::indexer / indexer_recall).
  bool indexer_recall = false;
  // Recompute::Selective: the modules dropped and replayed (RecomputeModule bits; ignored otherwise).
  unsigned recompute_modules = kRecomputeMoe;
  // Module m (a RecomputeModule) is dropped after its forward and replayed before its backward.
  bool recomputes(unsigned m) const { return recompute == Recompute::Selective && (recompute_modules & m) != 0; }
  bool indexer_loss() const { return indexer_loss_weight > 0; }
  // The forward computes the indexer loss and recall: with the loss, or for the metrics.
  bool indexer_metrics() const { return indexer_loss() || indexer_recall; }
  bool dense_warmup() const { return indexer_loss() && indexer_stage == IndexerStage::DenseWarmup; }
};

// A checkpoint tensor the model does not compute with but writes back when saved (f32): the
// DeepSeek-V3 MTP layers of a run that does not train them (model/checkpoint.cpp).
struct KeptTensor {
  std::string name;
  Shape shape;
  std::vector<float> v;
};

class Model {
 public:
  // shard: the routed experts this model holds (expert-parallel memory sharding, model/params.h);
  // a sharded model runs only with set_expert_parallel over the matching ep group. stage: the
  // pipeline stage it holds (pipeline memory sharding); it runs only as that stage
  // (set_pipeline_stage with the same layers). tp: the tensor-parallel slice of the attention and
  // dense-MLP tensors it holds (tensor-parallel memory sharding); it runs only with
  // set_tensor_parallel over a tp group of that size, as that rank.
  Model(const ModelConfig& cfg, kern::Prec prec, TrainOptions opt = {}, ExpertShard shard = {}, StageShard stage = {},
        TpShard tp = {});

  // Forward + backward of one micro-batch; gradients of grad_scale * (ce + aux) are added into
  // the gradient slab. Returns the loss parts of this batch.
  LossParts forward_backward(const Batch& b, float grad_scale = 1.f);
  // Loss only (no gradients).
  LossParts forward(const Batch& b);

  void zero_grads();
  // Re-rounds the bf16 shadow from the f32 master weights (after every optimizer step).
  void refresh_bf16();
  // Random init as Hugging Face does (normal(0, initializer_range), norms 1, biases 0).
  void init_random(uint64_t seed);

  // Expert loads since reset_load().
  const ExpertLoad& expert_load() const { return load_; }
  void reset_load();
  // The auxiliary-loss-free balancing step (DeepSeek-V3): each MoE layer's router bias moves by
  // gamma toward balance, +gamma for experts below the layer's mean load and -gamma above it
  // (hash-routed layers have no bias); load: the loads of the whole global batch. Then
  // reset_load(). gamma = 0: only the reset.
  void update_router_bias(const ExpertLoad& load, float gamma);

  const ModelConfig cfg;
  const ParamLayout layout;
  const kern::Prec prec;
  TrainOptions opt;
  Arena params, grads;          // f32 [layout.total]
  std::vector<bf16> params_bf16;  // [layout.total] in bf16 mode, empty otherwise
  std::vector<float> buffers;     // [layout.buffers_total] router biases
  std::vector<KeptTensor> kept;   // tensors loaded and saved unchanged (V3 MTP layers not trained)
  StackArena acts;                // activations and scratch, reset every step
  Profiler* prof = nullptr;       // optional: timing of named regions (owned by the caller)
  // Optional hook for data parallelism (train/dist.cpp starts the gradient reduction early; the
  // model knows nothing of communication). When set, forward_backward calls grad_ready(g) as soon
  // as the gradients of parameter group g are final for this call: g = l after decoder layer l's
  // backward (an MTP block (V4) or layer (V3) k, its extras included, is l = num_hidden_layers + k),
  // kGradGroupHead after the final norm and the LM head (V4: and hc_head), kGradGroupEmbed last
  // (the embedding; also the LM head when tied). Called on the calling thread, between kernels.
  std::function<void(int64_t)> grad_ready;
  static constexpr int64_t kGradGroupHead = -1, kGradGroupEmbed = -2;
  // Optional hook for data parallelism (train/dist.cpp lets the parameter all-gather of the last
  // optimizer step run on into the forward): forward and forward_backward call params_needed(g)
  // before the forward first reads the parameters of group g (grad_ready numbering): the
  // embedding, each layer, the head (V4: and hc_head), each MTP block or layer (which also reads
  // the embedding; V4's also the head). Called on the calling thread, between kernels.
  std::function<void(int64_t)> params_needed;
  // Expert parallel (model/moe.h): this rank computes routed experts [first, first + E / ep) for
  // the tokens of every rank of ep_comm; forward and forward_backward become collectives over it
  // (every rank calls them in the same order). An expert-sharded model (ExpertShard) holds exactly
  // those experts; a whole model keeps every expert, and the gradients of the other ranks'
  // experts stay 0 here (the data-parallel reduction sums them in). null: off.
  void set_expert_parallel(parallel::Communicator* ep_comm);
  const ExpertParallel& expert_parallel() const { return ep_; }
  // Where the MoE layers' routed rows go: AllToAll over the ep group, else Local.
  const MoeDispatcher& moe_dispatcher() const;
  // Tensor parallel over tp_comm (see TensorParallel): forward and forward_backward become
  // collectives over it; every tp rank must see the same batches. Gradients of the split tensors
  // touch this rank's slice only (a tp-sharded model holds only that slice), and those of
  // tp_partial_grad tensors are partial: the data-parallel reduction over dp x tp ranks
  // (train/dist.h, DpOptions::tp) completes them.
  // null: off. sequence_parallel: see TensorParallel (a batch must then hold >= tp tokens).
  void set_tensor_parallel(parallel::Communicator* tp_comm, bool sequence_parallel = false);
  const TensorParallel& tensor_parallel() const { return tp_; }
  // Context parallel over cp_comm (model/context_parallel.h): every cp rank receives the same
  // micro-batches and computes on its two chunks of every row; forward and forward_backward become
  // collectives over it. Gradients are partial on each cp rank (the data-parallel reduction over
  // dp x cp ranks sums them, DpOptions::cp); the loss parts and expert loads a forward returns are
  // summed over the cp group, so they are the whole micro-batch's on every cp rank. Refused on a
  // device backend. null: off.
  void set_context_parallel(parallel::Communicator* cp_comm);
  const ContextParallel& context_parallel() const { return cp_; }
  // In place sum over the tp group of [n] floats (a no-op without tensor parallelism).
  void tp_sum(float* x, int64_t n) const;
  void tp_sum(double* x, int64_t n) const;  // (loss parts, aux-loss counts)
  // Pipeline parallel: this model runs only `stage` (see PipelineStage); forward and
  // forward_backward are then refused, use stage_forward / stage_forward_backward. Checks
  // 0 <= l0 <= l1 <= num_hidden_layers.
  void set_pipeline_stage(PipelineStage stage);
  const PipelineStage& pipeline_stage() const { return stage_; }
  // Floats of StageIO::x_in / x_out / dy / dx_in for a batch of N = B * T tokens.
  int64_t stage_io_floats(int64_t N) const;
  // True when this stage computes gradients of parameter group g (grad_ready numbering); the
  // stage calls grad_ready for exactly these groups.
  bool owns_grad_group(int64_t g) const;
  // One stage's forward: reads io.x_in (not first), writes io.x_out (not last). The loss parts
  // are this stage's: ce / mtp / n_valid on the last stage only, aux of its layers (io.count).
  LossParts stage_forward(const Batch& b, const StageIO& io);
  // One stage's forward and backward (the forward is recomputed from io.x_in): reads io.dy (not
  // last), writes io.dx_in (not first), adds the gradients of this stage's tensors.
  LossParts stage_forward_backward(const Batch& b, const StageIO& io, float grad_scale);

  float* P() const { return reinterpret_cast<float*>(params.base()); }
  float* G() const { return reinterpret_cast<float*>(grads.base()); }
  const bf16* Pb() const { return params_bf16.empty() ? nullptr : params_bf16.data(); }
  size_t peak_activation_bytes() const { return acts.peak(); }
  // Sequence parallel: the token rows of a batch of N this rank holds (all of them without it).
  SeqShard seq_shard_of(int64_t N) const;
  // Around a tensor-parallel block on a batch of s.N tokens: its input [N, w] from this rank's
  // rows x [s.rows, w] (x itself, or all-gathered into the arena); a buffer for its partial
  // output [N, w] (out itself, or the arena); the output completed into out [s.rows, w] (the
  // tp all-reduce, or the reduce-scatter; full is overwritten).
  const float* tp_block_in(const SeqShard& s, const float* x, int64_t w);
  float* tp_block_out_buf(const SeqShard& s, float* out, int64_t w);
  void tp_block_out(const SeqShard& s, float* full, float* out, int64_t w);
  // RoPE tables and softmax scale covering positions [0, max_pos) (grown on demand).
  const RopeTable& rope_table(int64_t max_pos);
  // The backend whose kernel table the modules call (kernels/backend.h): a CPU backend the model
  // owns, unless use_backend names another (owned by the caller, outliving the model).
  // On a backend the host cannot address (a GPU) the model also keeps its parameters, gradients,
  // bf16 shadow, RoPE tables and activations in the backend's memory; the host keeps the batch, the
  // routing and the expert sort of each MoE layer, and P(), G(), params_bf16 stay the host copies
  // that checkpoints, initialization and communication use. refresh_bf16() (called by every writer
  // of P(): loading, init, the host optimizer) uploads P() and its shadow; grads_to_host() and
  // params_to_host() bring the backend's copies back. On the CPU backend there is one copy and
  // these are no-ops.
  kern::Backend& backend() const { return *be_; }
  // check_backend, then b; on a device backend, the device copies of P() (as it is now) and of
  // zero gradients.
  void use_backend(kern::Backend& b);
  // A UserError unless a model of cfg can compute on b: on a backend the host cannot address,
  // DeepSeek-V3-family models and DeepSeek-V4 (not V3.2) for now.
  static void check_backend(const kern::Backend& b, const ModelConfig& cfg);
  bool on_device() const { return !be_->host_addressable(); }
  // The slabs the step computes on: the backend's copies (the host's on the CPU backend).
  float* dev_P() const { return on_device() ? dparams_.get() : P(); }
  float* dev_G() const { return on_device() ? dgrads_.get() : G(); }
  const bf16* dev_Pb() const { return on_device() ? dparams_bf16_.get() : Pb(); }
  bf16* dev_Pb_mut() { return on_device() ? dparams_bf16_.get() : (params_bf16.empty() ? nullptr : params_bf16.data()); }
  void params_to_device();  // P() and params_bf16 -> the backend's copies
  void params_to_host();    // the backend's parameters -> P() and params_bf16
  void grads_to_host();     // the backend's gradients -> G()
  // The device parameter and gradient slabs made n >= layout.total elements long (a data-parallel
  // run pads them to its buckets, as it pads P() and G()): contents kept, the tail zero. A no-op on
  // a host backend or when they are that long already.
  void grow_device_slabs(int64_t n);

 private:
  // io: the pipeline stage's inputs and outputs (null without pipeline parallelism).
  LossParts run(const Batch& b, float grad_scale, bool backward, const StageIO* io);
  LossParts run_v3(const Batch& b, float grad_scale, bool backward, const StageIO* io);
  // run_v3 / run_v4; under sequence parallel the shards' loss parts and expert loads summed over tp.
  LossParts run_tp(const Batch& b, float grad_scale, bool backward, const StageIO* io);
  // Context parallel: run_tp on this rank's part of b (cp_local_batch), the parts summed over cp.
  LossParts run_cp(const Batch& b, float grad_scale, bool backward, const StageIO* io);
  LossParts run_v4(const Batch& b, float grad_scale, bool backward, const StageIO* io);  // model/model_v4.cpp
  int64_t stage_end() const { return stage_.l1 < 0 ? cfg.num_hidden_layers : stage_.l1; }
  void v4_tables(int64_t T);            // main / compress RoPE tables for positions [0, T)
  // Where the step reads them: [0] main, [1] compress (the backend's copies on a device).
  void v4_device_tables(const float* cos[2], const float* sin[2]) const;
  void init_random_v4(uint64_t seed);
 public:
  // Calls gen(entry, dst) for every tensor in the order of the whole model's layout, entry being
  // the whole model's; dst is where its values go here. Expert-sharded: another rank's expert gets
  // a scratch dst, a row slice the whole tensor (then its rows are kept), so a random init draws
  // the same numbers into the held experts as a whole model does. keep(name): only those tensors.
  void for_each_init_target(const std::function<void(const ParamEntry&, float*)>& gen,
                            const std::function<bool(const std::string&)>& keep = nullptr);
  // Random init (HF rules) of the MTP blocks only: for checkpoints without MTP weights.
  void init_mtp_random(uint64_t seed);
  // DeepSeek-V4: forward of one row ids [T] (no cache: everything recomputed) -> logits [vocab]
  // of its last token: the reference the cached decoding (model/v4_decode.h) is tested against.
  void v4_last_logits(const int32_t* ids, int64_t T, float* logits);
  // DeepSeek-V4: the main ([0]) and compress ([1]) RoPE tables for positions [0, T), [T, rd/2]
  // each; valid until a later call needs longer ones (the incremental forward, model/v4_decode.h).
  void v4_rope_tables(int64_t T, const float* cos[2], const float* sin[2]);
 private:
  std::vector<float> cos_, sin_;
  std::vector<float> v4_cos_[2], v4_sin_[2];  // V4: [0] main, [1] compress
  RopeTable rope_;
  ExpertLoad load_;
  ExpertParallel ep_;
  LocalDispatcher local_dispatcher_;
  std::unique_ptr<AllToAllDispatcher> a2a_dispatcher_;  // reads ep_
  TensorParallel tp_;
  ContextParallel cp_;
  // During a context-parallel run_v3: the whole micro-batch, this rank's part of it and what the
  // attention needs (null / unused otherwise).
  const Batch* cp_full_ = nullptr;
  const CpBatch* cp_batch_ = nullptr;
  CpAttn cp_attn_;
  PipelineStage stage_;
  std::unique_ptr<kern::Backend> own_be_ = kern::make_cpu_backend();
  kern::Backend* be_ = own_be_.get();
  // On a device backend (see backend()): the device slabs, RoPE tables and host scratch of a step.
  kern::DeviceBuffer<float> dparams_, dgrads_, drope_;
  kern::DeviceBuffer<bf16> dparams_bf16_;
  RopeTable rope_dev_;  // rope_ with cos / sin in drope_ (cos null: not on a device)
  StackArena host_acts_{size_t(8) << 20};
  void upload_rope();
  void refuse_on_device(const char* what) const;  // a UserError on a device backend
};

}  // namespace trex::model
