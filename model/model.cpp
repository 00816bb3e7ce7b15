#include "model/model.h"

#include <cmath>
#include <cstring>
#include "core/error.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "core/timer.h"
#include "kernels/lm_head_ce.h"
#include "kernels/rows.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "model/linear.h"
#include "model/mtp_v3.h"
#include "model/split.h"
#include "parallel/comm.h"

namespace trex::model {

std::vector<int32_t> shift_labels(const std::vector<int32_t>& labels, int64_t B, int64_t T) {
  std::vector<int32_t> t(B * T, -100);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i + 1 < T; ++i) t[b * T + i] = labels[b * T + i + 1];
  return t;
}

namespace {

kern::RopeParams rope_params(const ModelConfig& c) {
  kern::RopeParams r{};
  r.dim = (int)c.qk_rope_head_dim;
  r.theta = c.rope_theta;
  r.yarn = c.rope_scaling.yarn;
  r.factor = c.rope_scaling.factor;
  r.beta_fast = c.rope_scaling.beta_fast;
  r.beta_slow = c.rope_scaling.beta_slow;
  r.mscale = c.rope_scaling.mscale;
  r.mscale_all_dim = c.rope_scaling.mscale_all_dim;
  r.original_max_pos = c.rope_scaling.original_max_position_embeddings;
  r.truncate = c.rope_scaling.truncate;
  return r;
}

struct LayerSaved {
  float *h_in, *n1, *rstd1, *h_mid, *n2, *rstd2;
  MlaSaved att;
  MlpSaved mlp;
  MoeSaved moe;
};

}  // namespace

void Model::check_backend(const kern::Backend& b, const ModelConfig& c) {
  if (b.host_addressable()) return;
  TREX_USER_CHECK(!c.is_v32(), "train DeepSeek-V3.2 on device \"cpu\"",
                  "model_type ", c.model_type, " does not run on the ", b.name(),
                  " backend yet: its lightning indexer and the top-k sparse attention are host code "
                  "(DeepSeek-V3 and V2 models do run there)");
}

void Model::use_backend(kern::Backend& b) {
  check_backend(b, cfg);
  TREX_USER_CHECK(b.host_addressable() || (!ep_.on() && !tp_.on() && !stage_.on() && !layout.sharded()),
                  "run this layout on device \"cpu\", or one process without ep, tp or pp",
                  "expert, tensor and pipeline parallelism do not run on the ", b.name(), " backend yet");
  TREX_USER_CHECK(b.host_addressable() || !cfg.is_v4() || !opt.indexer_metrics(),
                  "set train.indexer_loss_weight = 0 and train.indexer_recall = false, or train on device \"cpu\"",
                  "DeepSeek-V4's indexer loss and recall (train.indexer_loss_weight = ", opt.indexer_loss_weight,
                  opt.indexer_recall ? ", train.indexer_recall" : "", ") do not run on the ", b.name(),
                  " backend yet: their KL terms are host code");
  be_ = &b;
  dparams_.reset(), dgrads_.reset(), drope_.reset(), dparams_bf16_.reset();
  rope_dev_ = {};
  if (b.host_addressable()) {
    acts.use_source(nullptr);
    return;
  }
  acts.use_source(std::make_shared<BlockSource>(
      BlockSource{[&b](size_t n) { return b.alloc(n); }, [&b](void* p) { b.release(p); }}));
  dparams_ = kern::DeviceBuffer<float>(b, (size_t)layout.total);
  dgrads_ = kern::DeviceBuffer<float>(b, (size_t)layout.total);
  if (!params_bf16.empty()) dparams_bf16_ = kern::DeviceBuffer<bf16>(b, (size_t)layout.total);
  b.zero(dgrads_.get(), (size_t)layout.total * sizeof(float));
  params_to_device();
  if (!cfg.is_v4()) upload_rope();
}

void Model::params_to_device() {
  if (!on_device()) return;
  dparams_.upload(P());
  if (!params_bf16.empty()) dparams_bf16_.upload(params_bf16.data());
}

void Model::params_to_host() {
  if (!on_device()) return;
  dparams_.download(P());
  if (!params_bf16.empty()) dparams_bf16_.download(params_bf16.data());
}

void Model::grads_to_host() {
  if (on_device()) dgrads_.download(G());
}

void Model::grow_device_slabs(int64_t n) {
  if (!on_device() || (int64_t)dparams_.size() >= n) return;
  for (kern::DeviceBuffer<float>* d : {&dparams_, &dgrads_}) {
    kern::DeviceBuffer<float> b(*be_, (size_t)n);
    be_->zero(b.get(), (size_t)n * sizeof(float));
    be_->copy(b.get(), d->get(), d->size() * sizeof(float));
    *d = std::move(b);
  }
}

void Model::upload_rope() {
  drope_ = kern::DeviceBuffer<float>(*be_, cos_.size() + sin_.size());
  be_->to_device(drope_.get(), cos_.data(), cos_.size() * sizeof(float));
  be_->to_device(drope_.get() + cos_.size(), sin_.data(), sin_.size() * sizeof(float));
  rope_dev_ = rope_;
  rope_dev_.cos = drope_.get();
  rope_dev_.sin = drope_.get() + cos_.size();
}

namespace {

// The layout's frozen flags for a run that trains the lightning indexer (TrainOptions; DeepSeek-V3.2
// self_attn.indexer.*, DeepSeek-V4 self_attn.compressor.indexer.*): the indexer's tensors train; in
// the dense warm-up nothing else does.
ParamLayout with_indexer_training(ParamLayout L, const TrainOptions& o) {
  if (!o.indexer_loss()) return L;
  for (ParamEntry& e : L.entries) {
    const bool ix = e.name.find(".self_attn.indexer.") != std::string::npos ||
                    e.name.find(".compressor.indexer.") != std::string::npos;
    e.frozen = o.dense_warmup() ? !ix : (ix ? false : e.frozen);
  }
  return L;
}

}  // namespace

Model::Model(const ModelConfig& c, kern::Prec p, TrainOptions o, ExpertShard shard, StageShard stage, TpShard tp)
    : cfg(with_mtp(c, o.mtp_loss_weight > 0 ? c.num_nextn_predict_layers : 0)),
      layout(with_indexer_training(build_layout(cfg, shard, stage, tp), o)),
      prec(p), opt(o) {
  TREX_USER_CHECK(o.indexer_loss_weight >= 0 && (!o.indexer_metrics() || c.indexer_layers() > 0),
                  "set train.indexer_loss_weight = 0 and train.indexer_recall = false, or use a deepseek_v32 model "
                  "or a deepseek_v4 model with compressed_sparse_attention layers",
                  "train.indexer_loss_weight = ", o.indexer_loss_weight, o.indexer_recall ? " with train.indexer_recall" : "",
                  " needs a lightning indexer; model_type ", c.model_type, " has none");
  TREX_USER_CHECK(o.mtp_loss_weight <= 0 || c.num_nextn_predict_layers > 0,
                  "set mtp_loss_weight = 0, or use a config with num_nextn_predict_layers > 0",
                  "MTP training needs MTP blocks: model_type ", c.model_type, ", num_nextn_predict_layers ",
                  c.num_nextn_predict_layers);
  params.reserve("params", layout.total * sizeof(float));
  grads.reserve("grads", layout.total * sizeof(float));
  params.zero();
  grads.zero();
  if (prec == kern::Prec::BF16) params_bf16.resize(layout.total);
  buffers.assign(layout.buffers_total, 0.f);
  load_.L = (int64_t)layout.layers.size(), load_.E = cfg.n_routed_experts;
  load_.v.assign((size_t)(load_.L * load_.E), 0);
  if (cfg.is_v4()) return;  // V4 builds its two RoPE tables per batch length (v4_tables)
  // RoPE tables up to max_position_embeddings (grown on demand for longer sequences).
  const int64_t half = cfg.qk_rope_head_dim / 2;
  const int64_t maxp = cfg.max_position_embeddings;
  cos_.assign(std::max<int64_t>(maxp * half, 1), 0.f);
  sin_.assign(std::max<int64_t>(maxp * half, 1), 0.f);
  if (half) kern::rope_tables(rope_params(cfg), maxp, cos_.data(), sin_.data());
  rope_.cos = cos_.data();
  rope_.sin = sin_.data();
  rope_.max_pos = maxp;
  rope_.interleaved = cfg.rope_interleave;
  kern::RopeParams rp = rope_params(cfg);
  if (rp.dim == 0) rp.dim = 2;  // the YaRN softmax factor applies even without rotated dims
  rope_.softmax_scale = (float)(std::pow((double)cfg.qk_head_dim(), -0.5) * kern::yarn_softmax_mscale(rp));
}

void Model::zero_grads() {
  // On a device only the device's copy: G() is what the last grads_to_host() brought back.
  if (on_device()) be_->zero(dgrads_.get(), (size_t)layout.total * sizeof(float));
  else kern::zero_bytes(grads.base(), grads.capacity());
}

void Model::refuse_on_device(const char* what) const {
  TREX_USER_CHECK(!on_device(), "run this layout on device \"cpu\", or one process without ep, tp or pp",
                  what, " does not run on the ", be_->name(), " backend yet");
}

void Model::set_expert_parallel(parallel::Communicator* ep_comm) {
  if (ep_comm && ep_comm->size() > 1) refuse_on_device("expert parallelism");
  ep_ = {};
  a2a_dispatcher_.reset();
  if (!ep_comm || ep_comm->size() == 1) {
    TREX_CHECK(!layout.expert_sharded(), "set_expert_parallel: this model holds experts [", layout.expert_first, ", ",
               layout.expert_first + layout.expert_count, ") only and needs an expert-parallel group");
    return;
  }
  const int64_t E = cfg.n_routed_experts, P = ep_comm->size();
  TREX_USER_CHECK(E > 0 && E % P == 0, "set parallel.ep to a divisor of n_routed_experts, or 1",
                  "parallel.ep = ", P, " does not divide n_routed_experts = ", E);
  ep_.comm = ep_comm;
  ep_.count = E / P;
  ep_.first = ep_comm->rank() * ep_.count;
  if (layout.expert_sharded()) {
    TREX_CHECK(layout.expert_first == ep_.first && layout.expert_count == ep_.count, "set_expert_parallel: ep rank ",
               ep_comm->rank(), " of ", P, " computes experts [", ep_.first, ", ", ep_.first + ep_.count,
               ") but the model holds [", layout.expert_first, ", ", layout.expert_first + layout.expert_count, ")");
    ep_.slab_first = ep_.first;
  }
  a2a_dispatcher_ = std::make_unique<AllToAllDispatcher>(ep_);
}

const MoeDispatcher& Model::moe_dispatcher() const {
  if (a2a_dispatcher_) return *a2a_dispatcher_;
  return local_dispatcher_;
}

bool tp_partial_grad(const std::string& name) {
  if (name.find(".self_attn.") != std::string::npos) return true;
  for (const char* k : {".mlp.gate_proj.", ".mlp.up_proj.", ".mlp.down_proj."})  // dense MLP (not experts)
    if (name.find(k) != std::string::npos) return true;
  return false;
}

void Model::set_tensor_parallel(parallel::Communicator* tp_comm, bool sequence_parallel) {
  if (tp_comm && tp_comm->size() > 1) refuse_on_device("tensor parallelism");
  tp_ = {};
  TREX_USER_CHECK(!tp_comm || tp_comm->size() == 1 || !opt.indexer_metrics(), "set parallel.tp = 1, or "
                  "train.indexer_loss_weight = 0 and train.indexer_recall = false", "the indexer loss needs every attention head's probabilities on "
                  "one rank; parallel.tp = ", tp_comm ? tp_comm->size() : 1);
  if (!tp_comm || tp_comm->size() == 1) {
    TREX_CHECK(!layout.tp_sharded(), "set_tensor_parallel: this model holds tensor-parallel slice ", layout.tp.rank,
               " of ", layout.tp.size, " only and needs a tp group of that size");
    return;
  }
  const int tp = tp_comm->size();
  check_split(cfg, {.tp = tp});  // heads, V4 output groups and the dense width must split evenly
  TREX_CHECK(!layout.tp_sharded() || (layout.tp.rank == tp_comm->rank() && layout.tp.size == tp_comm->size()),
             "set_tensor_parallel: tp rank ", tp_comm->rank(), " of ", tp_comm->size(), " but the model holds slice ",
             layout.tp.rank, " of ", layout.tp.size);
  tp_.comm = tp_comm;
  tp_.slice = {tp_comm->rank(), tp, layout.tp_sharded()};
  tp_.sp = sequence_parallel;
}

void Model::set_context_parallel(parallel::Communicator* cp_comm) {
  cp_ = {};
  if (!cp_comm || cp_comm->size() == 1) return;
  refuse_on_device("context parallelism");
  cp_.comm = cp_comm;
  cp_.rank = cp_comm->rank();
  cp_.size = cp_comm->size();
}

void Model::tp_sum(float* x, int64_t n) const {
  if (!tp_.on()) return;
  const double t0 = now_ms();
  tp_.comm->all_reduce(x, (size_t)n);
  tp_.wait_ms += now_ms() - t0;
}

void Model::tp_sum(double* x, int64_t n) const {
  if (!tp_.on()) return;
  const double t0 = now_ms();
  tp_.comm->all_reduce(x, (size_t)n);
  tp_.wait_ms += now_ms() - t0;
}

void Model::refresh_bf16() {
  if (!params_bf16.empty()) to_bf16(P(), params_bf16.data(), layout.total);
  params_to_device();
}

void Model::reset_load() { std::fill(load_.v.begin(), load_.v.end(), 0); }

void Model::update_router_bias(const ExpertLoad& load, float gamma) {
  TREX_CHECK(load.L == load_.L && load.E == load_.E, "update_router_bias: loads of [", load.L, ", ", load.E,
             "], the model has [", load_.L, ", ", load_.E, "]");
  if (gamma != 0.f) {
    for (int64_t l = 0; l < load.L; ++l) {
      if (!cfg.is_moe_layer(l) || layout.layers[l].bias < 0) continue;  // hash layers: no bias
      const int64_t* ld = load.layer(l);
      double mean = 0;
      for (int64_t e = 0; e < load.E; ++e) mean += (double)ld[e];
      mean /= (double)load.E;
      float* bias = buffers.data() + layout.layers[l].bias;
      for (int64_t e = 0; e < load.E; ++e) {
        const double diff = mean - (double)ld[e];
        bias[e] += gamma * (float)((diff > 0) - (diff < 0));
      }
    }
  }
  reset_load();
}

void Model::for_each_init_target(const std::function<void(const ParamEntry&, float*)>& gen,
                                 const std::function<bool(const std::string&)>& keep) {
  if (!layout.sharded()) {
    for (const ParamEntry& e : layout.entries)
      if (!keep || keep(e.name)) gen(e, P() + e.offset);
    return;
  }
  const ParamLayout whole = build_layout(cfg);
  std::vector<float> tmp;
  for (const ParamEntry& w : whole.entries) {
    if (keep && !keep(w.name)) continue;
    const ParamEntry* e = layout.find(w.name);
    if (e && !e->sliced()) {
      gen(w, P() + e->offset);
      continue;
    }
    tmp.resize((size_t)w.shape.numel());
    gen(w, tmp.data());
    if (!e) continue;  // another rank's expert, or another stage's tensor
    e->take_from_whole(tmp.data(), P() + e->offset);  // an expert shard's rows, a tp slice
  }
}

void Model::init_random(uint64_t seed) {
  if (cfg.is_v4()) return init_random_v4(seed);
  Rng rng(seed);
  for_each_init_target([&](const ParamEntry& e, float* w) {
    const int64_t n = e.shape.numel();
    if (e.shape.ndim == 1) {
      // LayerNorm biases (the V3.2 indexer's k_norm) start at 0, as torch's nn.LayerNorm.
      const bool bias = e.name.size() > 5 && e.name.compare(e.name.size() - 5, 5, ".bias") == 0;
      for (int64_t i = 0; i < n; ++i) w[i] = bias ? 0.f : 1.f;
    } else {
      for (int64_t i = 0; i < n; ++i) w[i] = (float)(rng.normal() * cfg.initializer_range);
    }
  });
  std::fill(buffers.begin(), buffers.end(), 0.f);
  refresh_bf16();
}

const RopeTable& Model::rope_table(int64_t maxpos) {
  if (maxpos > rope_.max_pos && cfg.qk_rope_head_dim) {
    const int64_t half = cfg.qk_rope_head_dim / 2;
    cos_.assign(maxpos * half, 0.f);
    sin_.assign(maxpos * half, 0.f);
    kern::rope_tables(rope_params(cfg), maxpos, cos_.data(), sin_.data());
    rope_.cos = cos_.data(), rope_.sin = sin_.data(), rope_.max_pos = maxpos;
    if (on_device()) upload_rope();
  }
  return rope_;
}

LossParts Model::forward_backward(const Batch& b, float grad_scale) {
  TREX_CHECK(!stage_.on(), "Model::forward_backward on a pipeline stage: use stage_forward_backward");
  return run(b, grad_scale, true, nullptr);
}
LossParts Model::forward(const Batch& b) {
  TREX_CHECK(!stage_.on(), "Model::forward on a pipeline stage: use stage_forward");
  return run(b, 0.f, false, nullptr);
}

void Model::set_pipeline_stage(PipelineStage s) {
  if (!(s.first && s.last)) refuse_on_device("pipeline parallelism");
  const int64_t L = cfg.num_hidden_layers;
  if (s.l1 < 0) s.l1 = L;
  TREX_CHECK(0 <= s.l0 && s.l0 <= s.l1 && s.l1 <= L, "set_pipeline_stage: layers [", s.l0, ", ", s.l1,
             ") outside the model's ", L);
  TREX_CHECK(!s.first || s.l0 == 0, "set_pipeline_stage: the first stage starts at layer 0, not ", s.l0);
  TREX_CHECK(!s.last || s.l1 == L, "set_pipeline_stage: the last stage ends at layer ", L, ", not ", s.l1);
  const StageShard& h = layout.stage;
  TREX_CHECK(!layout.stage_sharded() || (h.l0 == s.l0 && h.l1 == s.l1 && h.first == s.first && h.last == s.last),
             "set_pipeline_stage: this model holds the stage of layers [", h.l0, ", ", h.l1, ") only, not [", s.l0,
             ", ", s.l1, ")");
  stage_ = s;
}

int64_t Model::stage_io_floats(int64_t N) const {
  // Sequence parallel: this rank's token rows only (a buffer fits every rank's); context parallel:
  // this rank's chunks (N / cp).
  if (cp_.on()) N /= cp_.size;
  return (tp_.sp ? seq_shard_of(N).block : N) * cfg.hidden_size * (cfg.is_v4() ? cfg.v4.hc_mult : 1);
}

bool Model::owns_grad_group(int64_t g) const {
  const int64_t L = cfg.num_hidden_layers;
  if (g == kGradGroupHead) return stage_.last;
  if (g == kGradGroupEmbed)  // the last stage also reads the embedding when the head is tied or for V4 MTP
    return stage_.first || (stage_.last && embedding_shared(cfg, StageShard{stage_.l0, stage_end(), false, true}));
  if (g >= L) return stage_.last;  // V4 MTP block g - L
  return g >= stage_.l0 && g < stage_end();
}

LossParts Model::stage_forward(const Batch& b, const StageIO& io) { return run(b, 0.f, false, &io); }

LossParts Model::stage_forward_backward(const Batch& b, const StageIO& io, float grad_scale) {
  return run(b, grad_scale, true, &io);
}

LossParts Model::run(const Batch& b, float grad_scale, bool backward, const StageIO* io) {
  const SerialScope host_serial(on_device());  // the host's share of a device step: batch, positions (core/parallel.h)
  const int64_t B = b.B, T = b.T, N = B * T, V = cfg.vocab_size;
  TREX_CHECK(B > 0 && T > 0, "empty batch");
  for (int64_t i = 0; i < N; ++i) {
    TREX_USER_CHECK(b.input_ids[i] >= 0 && b.input_ids[i] < V, "token ids must be in [0, vocab_size)",
                    "input_ids[", i / T, "][", i % T, "] = ", b.input_ids[i], " is outside the vocabulary (",
                    V, ")");
    TREX_USER_CHECK(b.targets[i] == -100 || (b.targets[i] >= 0 && b.targets[i] < V),
                    "labels must be -100 or in [0, vocab_size)", "label for position [", i / T, "][", i % T,
                    "] = ", b.targets[i], " is outside the vocabulary (", V, ")");
  }
  TREX_CHECK(!layout.expert_sharded() || ep_.on(), "Model: this model holds routed experts [", layout.expert_first,
             ", ", layout.expert_first + layout.expert_count, ") only; set_expert_parallel before a forward");
  TREX_CHECK(!layout.stage_sharded() || stage_.on(), "Model: this model holds the pipeline stage of layers [",
             layout.stage.l0, ", ", layout.stage.l1, ") only; set_pipeline_stage before a forward");
  TREX_CHECK(!layout.tp_sharded() || tp_.on(), "Model: this model holds tensor-parallel slice ", layout.tp.rank, " of ",
             layout.tp.size, " only; set_tensor_parallel before a forward");
  const PipelineStage& st = stage_;
  TREX_CHECK(!st.on() || (io && (st.first || io->x_in) && (st.last || backward || io->x_out) &&
                          (st.last || !backward || io->dy) && (st.first || !backward || io->dx_in)),
             "Model: pipeline stage without its inputs / outputs");
  if (cp_.on()) return run_cp(b, grad_scale, backward, io);
  return run_tp(b, grad_scale, backward, io);
}

LossParts Model::run_tp(const Batch& b, float grad_scale, bool backward, const StageIO* io) {
  const int64_t N = b.B * b.T;
  if (!tp_.sp) return cfg.is_v4() ? run_v4(b, grad_scale, backward, io) : run_v3(b, grad_scale, backward, io);
  // Sequence parallel: every shard's loss parts and expert loads are summed over the tp group, so
  // each tp rank returns (and counts) what the whole micro-batch gives, as without it.
  TREX_USER_CHECK(N >= tp_.slice.size, "set train.batch_size x data.seq_len >= parallel.tp, or "
                  "parallel.sequence_parallel = false", "sequence parallel: a micro-batch of ", N,
                  " tokens does not split over ", tp_.slice.size, " tensor-parallel ranks");
  const std::vector<int64_t> load0 = load_.v;
  LossParts out = cfg.is_v4() ? run_v4(b, grad_scale, backward, io) : run_v3(b, grad_scale, backward, io);
  double parts[3] = {out.ce, out.aux, out.mtp};
  std::vector<int64_t> dl(load_.v.size());
  for (size_t i = 0; i < dl.size(); ++i) dl[i] = load_.v[i] - load0[i];
  tp_sum(parts, 3);
  const double t0 = now_ms();
  if (!dl.empty()) tp_.comm->all_reduce(dl.data(), dl.size());
  tp_.wait_ms += now_ms() - t0;
  for (size_t i = 0; i < dl.size(); ++i) load_.v[i] = load0[i] + dl[i];
  out.ce = parts[0], out.aux = parts[1], out.mtp = parts[2];
  out.loss = out.ce + out.aux + opt.mtp_loss_weight * out.mtp + opt.indexer_loss_weight * out.indexer;
  return out;
}

LossParts Model::run_cp(const Batch& b, float grad_scale, bool backward, const StageIO* io) {
  const CpSplit split = cp_split(b.T, cp_);
  const CpBatch lb = cp_local_batch(b, split);
  const Batch local{lb.B, lb.T, lb.ids.data(), lb.targets.data(), lb.pos.data(), b.seg ? lb.seg.data() : nullptr};
  cp_attn_ = CpAttn{&cp_, split, lb.qidx.data(), b.seg};
  cp_full_ = &b, cp_batch_ = &lb;
  const std::vector<int64_t> load0 = load_.v;
  LossParts out;
  try {
    out = run_tp(local, grad_scale, backward, io);  // tensor parallel: the tp ranks share the local tokens
  } catch (...) {
    cp_full_ = nullptr, cp_batch_ = nullptr;
    throw;
  }
  cp_full_ = nullptr, cp_batch_ = nullptr;
  // Each rank's CE and MTP sums are divided by the whole micro-batch's target counts, its aux part
  // by the whole sequences' length and its indexer loss and recall by the micro-batch's query
  // count: their sums over the cp group are the micro-batch's.
  double parts[5] = {out.ce, out.aux, out.mtp, out.indexer, out.indexer_recall};
  std::vector<int64_t> dl(load_.v.size());
  for (size_t i = 0; i < dl.size(); ++i) dl[i] = load_.v[i] - load0[i];
  const double t0 = now_ms();
  cp_.comm->all_reduce(parts, 5);
  if (!dl.empty()) cp_.comm->all_reduce(dl.data(), dl.size());
  cp_.wait_ms += now_ms() - t0;
  for (size_t i = 0; i < dl.size(); ++i) load_.v[i] = load0[i] + dl[i];
  out.ce = parts[0], out.aux = parts[1], out.mtp = parts[2], out.indexer = parts[3], out.indexer_recall = parts[4];
  out.loss = out.ce + out.aux + opt.mtp_loss_weight * out.mtp + opt.indexer_loss_weight * out.indexer;
  return out;
}

SeqShard Model::seq_shard_of(int64_t N) const {
  return tp_.sp ? seq_shard(N, (int)tp_.slice.rank, (int)tp_.slice.size) : seq_shard(N, 0, 1);
}

const float* Model::tp_block_in(const SeqShard& s, const float* x, int64_t w) {
  if (!s.on()) return x;
  float* full = acts.alloc<float>(s.N * w);
  sp_all_gather(*tp_.comm, s, x, full, w, acts, &tp_.wait_ms);
  return full;
}

void Model::tp_block_out(const SeqShard& s, float* full, float* out, int64_t w) {
  if (!s.on()) {
    tp_sum(full, s.N * w);
    if (out != full) std::memcpy(out, full, s.N * w * sizeof(float));
    return;
  }
  sp_reduce_scatter(*tp_.comm, s, full, out, w, acts, &tp_.wait_ms);
}

float* Model::tp_block_out_buf(const SeqShard& s, float* out, int64_t w) {
  return s.on() ? acts.alloc<float>(s.N * w) : out;
}

LossParts Model::run_v3(const Batch& b, float grad_scale, bool backward, const StageIO* io) {
  const int64_t B = b.B, T = b.T, N = B * T, d = cfg.hidden_size, V = cfg.vocab_size;
  const PipelineStage& st = stage_;
  const bool count_stats = !io || io->count;
  const int64_t l0 = st.l0, l1 = stage_end();
  // The DeepSeek-V3.2 indexer loss: its gradient factor; the dense warm-up trains only the
  // indexer, so the LM loss's gradients (CE, aux, MTP) are scaled by 0.
  const float ix_grad = (float)(grad_scale * opt.indexer_loss_weight);
  if (opt.dense_warmup()) grad_scale = 0.f;
  acts.reset();
  host_acts_.reset();
  // Parameters, gradients and activations in the backend's memory; the host keeps the batch, the
  // positions and the routing (Ctx::host / device move them).
  Ctx c{prec, &acts, prof, be_, be_->host_addressable() ? nullptr : &host_acts_};
  float* P = dev_P();
  float* G = dev_G();
  const bf16* Pb = dev_Pb();
  const float eps = (float)cfg.rms_norm_eps;
  // Sequence parallel: this rank's token rows [n0, n0 + Nl); everything else: all N of them.
  const SeqShard sh = seq_shard_of(N);
  const int64_t Nl = sh.rows, n0 = sh.n0;

  // Positions (grow the RoPE table if a position exceeds it).
  int32_t* pos_h = c.host_ws().alloc<int32_t>(N);
  int64_t maxpos = 0;
  for (int64_t i = 0; i < N; ++i) {
    pos_h[i] = b.pos ? b.pos[i] : (int32_t)(i % T);
    TREX_USER_CHECK(pos_h[i] >= 0, "position ids must be >= 0", "position id ", pos_h[i], " at ", i);
    maxpos = std::max<int64_t>(maxpos, pos_h[i] + 1);
  }
  rope_table(maxpos);
  const RopeTable& rope = rope_dev_.cos ? rope_dev_ : rope_;  // the tables in the backend's memory
  const int32_t* pos = c.device(pos_h, N);
  const int32_t* seg = b.seg ? c.device(b.seg, N) : nullptr;

  auto need = [&](int64_t g) {
    if (params_needed) params_needed(g);
  };
  // Embedding (pipeline stages after the first: the previous stage's output). x: [Nl, d]
  float* x = acts.alloc<float>(Nl * d);
  const int32_t* ids = nullptr;  // [Nl] this rank's token ids (backend memory)
  if (st.first) {
    need(kGradGroupEmbed);
    ids = c.device(b.input_ids + n0, Nl);
    c.k().gather_rows(P + layout.embed, ids, Nl, d, x);
  } else {
    be_->to_device(x, io->x_in, Nl * d * sizeof(float));
  }

  std::vector<LayerSaved> sv(layout.layers.size());  // main layers, then MTP layers
  LossParts out;
  // Context parallel: b is this rank's part of the micro-batch fb (run_cp).
  const Batch& fb = cp_full_ ? *cp_full_ : b;
  int64_t n_valid = 0;  // of the whole micro-batch (the CE is its mean)
  for (int64_t i = 0; i < fb.B * fb.T; ++i) n_valid += fb.targets[i] != -100;
  out.n_valid = st.last ? n_valid : 0;
  // The router biases in the backend's memory (one copy per step; they change between steps).
  const float* bufs = buffers.empty() ? nullptr : c.device(buffers.data(), (int64_t)buffers.size());
  auto moe_in = [&](const LayerParams& lp) {
    const float* bias = lp.bias >= 0 ? bufs + lp.bias : nullptr;  // DeepSeek-V2: none
    MoeIn mi{&cfg, &lp, P, Pb, G, bias, B, T, opt.aux_loss_alpha, grad_scale};
    mi.dispatcher = &moe_dispatcher();
    mi.slab_first = ep_.slab_first;
    mi.recompute_act = opt.recomputes(kRecomputeMoeAct);
    mi.recompute_shared = opt.recomputes(kRecomputeSharedExperts);
    mi.recompute_out = opt.recomputes(kRecomputeMoeOut);
    if (sh.on()) {
      mi.n0 = n0, mi.rows = Nl;
      mi.seq_sum = [this](double* v, size_t n) { tp_sum(v, (int64_t)n); };
    }
    if (cp_full_) {  // the aux loss's counts and lengths are the whole sequences'
      mi.T_seq = fb.T;
      mi.seq_sum = [this, tp_shard = sh.on()](double* v, size_t n) {
        if (tp_shard) tp_sum(v, (int64_t)n);  // sequence parallel: the tp shards of the cp rank's tokens first
        const double t0 = now_ms();
        cp_.comm->all_reduce(v, n);
        cp_.wait_ms += now_ms() - t0;
      };
    }
    return mi;
  };

  // Decoder layer l: x [Nl, d] -> returns h_out [Nl, d] (arena), its activations in s. count: add
  // the aux loss and the expert loads (not when the backward replays the layer). The attention and
  // the dense MLP see all N tokens (tp_block_in / tp_block_out).
  // replaying (full recompute, in the backward): its regions are not timed again (bwd.recompute
  // holds them).
  // Selective recompute of "moe": a MoE block's activations are dropped after its forward and
  // rebuilt by replaying it (moe_forward on the kept s.n2) just before its backward.
  const bool replay_moe = opt.recomputes(kRecomputeMoe);
  auto layer_forward = [&](int64_t l, float* x, LayerSaved& s, bool count, bool replaying = false) -> float* {
    Profiler* pr = replaying ? nullptr : prof;
    const Ctx cx{prec, &acts, pr, be_, c.hs};
    const LayerParams& lp = layout.layers[l];
    s.h_in = x;
    s.n1 = acts.alloc<float>(Nl * d);
    s.rstd1 = acts.alloc<float>(Nl);
    cx.k().rmsnorm_fwd(x, Nl, d, P + lp.in_norm, eps, s.n1, s.rstd1);
    AttnIn ai{&cfg, &lp, P, Pb, G, &rope, pos, seg, B, T, tp_.slice, opt.indexer_metrics(), opt.dense_warmup(), ix_grad};
    ai.cp = cp_full_ ? &cp_attn_ : nullptr;
    s.h_mid = acts.alloc<float>(Nl * d);
    {
      ProfScope ps(pr, "fwd.mla");
      const float* in = tp_block_in(sh, s.n1, d);
      float* h = tp_block_out_buf(sh, s.h_mid, d);
      mla_forward(cx, ai, in, h, s.att);
      tp_block_out(sh, h, s.h_mid, d);  // row-parallel o_proj: sum of the heads' parts
    }
    if (count && ai.ix_loss) out.indexer += s.att.ix_loss, out.indexer_recall += s.att.ix_recall;
    cx.k().add(s.h_mid, x, Nl * d);
    s.n2 = acts.alloc<float>(Nl * d);
    s.rstd2 = acts.alloc<float>(Nl);
    cx.k().rmsnorm_fwd(s.h_mid, Nl, d, P + lp.post_norm, eps, s.n2, s.rstd2);
    float* h_out = acts.alloc<float>(Nl * d);
    if (cfg.is_moe_layer(l)) {
      ProfScope ps(pr, "fwd.moe");
      const auto mk = acts.mark();
      const double aux = moe_forward(cx, moe_in(lp), s.n2, h_out, s.moe, count ? load_.layer(l) : nullptr);
      if (count) out.aux += aux;
      if (replay_moe) acts.release(mk);  // selective "moe": only its input s.n2 is kept
    } else {
      MlpW w = mlp_weights_tp(P, Pb, G, lp.mlp_gu, lp.mlp_down, d, cfg.intermediate_size, tp_.slice);
      ProfScope ps(pr, "fwd.mlp");
      const float* in = tp_block_in(sh, s.n2, d);
      float* h = tp_block_out_buf(sh, h_out, d);
      mlp_forward(cx, w, in, N, h, 0.f, s.mlp);
      tp_block_out(sh, h, h_out, d);
    }
    cx.k().add(h_out, s.h_mid, Nl * d);
    return h_out;
  };
  // Full recompute: a layer keeps only its input; its activations are dropped after the forward
  // and rebuilt by replaying it just before its backward.
  const bool replay = opt.recompute == Recompute::Full;
  // Layer l of the forward pass (main or MTP): its output, or under full recompute a copy of it
  // with the layer's activations dropped.
  auto forward_layer = [&](int64_t l, float* xin) -> float* {
    need(l);
    ProfSpan span(prof, [&] { return layer_region(l, "fwd"); });
    if (!replay) return layer_forward(l, xin, sv[l], count_stats);
    float* kept = acts.alloc<float>(Nl * d);
    const auto mk = acts.mark();
    c.k().copy(kept, layer_forward(l, xin, sv[l], count_stats), Nl * d * sizeof(float));
    acts.release(mk);
    return kept;
  };
  for (int64_t l = l0; l < l1; ++l) x = forward_layer(l, x);
  auto indexer_parts = [&] { return opt.indexer_loss_weight * out.indexer; };  // the loss's indexer term
  out.loss = out.aux;
  MtpV3In mtp_in;
  std::vector<MtpV3Saved> mtp_saved;
  float* dx = nullptr;  // [Nl, d] gradient of the last layer's output
  if (!st.last) {       // a pipeline stage before the last: x goes to the next stage, dy comes back
    out.loss += indexer_parts();
    if (!backward) {
      be_->to_host(io->x_out, x, Nl * d * sizeof(float));
      return out;
    }
    dx = acts.alloc<float>(Nl * d);
    be_->to_device(dx, io->dy, Nl * d * sizeof(float));
  } else {
    // Final norm + LM head fused with cross-entropy (on this rank's rows; the CE is divided by
    // the whole micro-batch's target count).
    need(kGradGroupHead);
    if (layout.head == layout.embed) need(kGradGroupEmbed);  // tied
    float* rstdf = acts.alloc<float>(Nl);
    float* dhf = backward ? acts.alloc<float>(Nl * d) : nullptr;
    // The normed rows, their bf16 copy and the head's workspace: released once the head has run.
    const auto head_mark = acts.mark();
    float* hf = acts.alloc<float>(Nl * d);
    c.k().rmsnorm_fwd(x, Nl, d, P + layout.final_norm, eps, hf, rstdf);
    kern::CeArgs ce{};
    ce.prec = prec;
    ce.N = Nl, ce.d = d, ce.V = V;
    ce.h = hf;
    ce.W = P + layout.head;
    if (prec == kern::Prec::BF16) {
      bf16* hb = acts.alloc<bf16>(Nl * d);
      c.k().to_bf16(hf, d, Nl, d, hb);
      ce.h_b = hb;
      ce.W_b = Pb + layout.head;
    }
    ce.labels = c.device(b.targets + n0, Nl);
    ce.grad_scale = n_valid ? grad_scale / (float)n_valid : 0.f;
    ce.dh = dhf;
    ce.dW = backward ? G + layout.head : nullptr;
    ce.workspace = acts.alloc<float>(kern::lm_head_ce_workspace_floats(ce));
    int64_t nv = 0;
    double ce_sum;
    {
      ProfScope ps(prof, backward ? "head_ce.fwd+bwd" : "head_ce.fwd");
      ce_sum = c.k().lm_head_ce(ce, &nv);
    }
    acts.release(head_mark);
    out.ce = n_valid ? ce_sum / (double)n_valid : 0.0;
    if (cfg.v3_mtp_layers > 0) {  // MTP layers on the main model's last hidden states (model/mtp_v3.h)
      need(kGradGroupEmbed);
      for (int64_t l = cfg.num_hidden_layers; l < (int64_t)layout.layers.size(); ++l) need(l);
      mtp_in = MtpV3In{&cfg, &layout, c, P, Pb, G, &fb, n0, Nl, grad_scale, opt.mtp_loss_weight, backward};
      if (cp_full_) mtp_in.flat = cp_batch_->flat.data();  // the shifted inputs come from the whole rows
      out.mtp = mtp_v3_forward(mtp_in, x, mtp_saved, forward_layer);
    }
    out.loss = out.ce + out.aux + opt.mtp_loss_weight * out.mtp + indexer_parts();
    if (!backward) return out;

    // Backward.
    dx = acts.alloc<float>(Nl * d);
    c.k().rmsnorm_bwd(dhf, x, Nl, d, P + layout.final_norm, rstdf, dx, G + layout.final_norm);
    if (grad_ready) grad_ready(kGradGroupHead);
  }
  float* tmp = acts.alloc<float>(Nl * d);
  float* tmp2 = acts.alloc<float>(Nl * d);
  // Decoder layer l's backward: dx, the gradient of its output, becomes that of its input.
  auto layer_backward = [&](int64_t l, float* dx) {
    const LayerParams& lp = layout.layers[l];
    LayerSaved& s = sv[l];
    const auto mk = acts.mark();
    ProfSpan span(prof, [&] { return layer_region(l, "bwd"); });
    if (replay) {
      ProfScope ps(prof, "bwd.recompute");
      layer_forward(l, s.h_in, s, false, /*replaying=*/true);
    }
    if (replay_moe && cfg.is_moe_layer(l)) {  // its regions are not timed again (bwd.recompute holds them)
      ProfScope ps(prof, "bwd.recompute");
      const Ctx cx{prec, &acts, nullptr, be_, c.hs};
      float* h_out = acts.alloc<float>(Nl * d);  // the block's output again (unused)
      moe_forward(cx, moe_in(lp), s.n2, h_out, s.moe, nullptr);
    }
    // h_out = h_mid + ffn(norm2(h_mid))
    if (cfg.is_moe_layer(l)) {
      ProfScope ps(prof, "bwd.moe");
      moe_backward(c, moe_in(lp), s.moe, dx, tmp);
    } else {
      MlpW w = mlp_weights_tp(P, Pb, G, lp.mlp_gu, lp.mlp_down, d, cfg.intermediate_size, tp_.slice);
      ProfScope ps(prof, "bwd.mlp");
      const float* dy = tp_block_in(sh, dx, d);
      float* dn = tp_block_out_buf(sh, tmp, d);
      mlp_backward(c, w, s.mlp, N, dy, dn, false);
      tp_block_out(sh, dn, tmp, d);  // the column-parallel input's gradient: sum of the parts
    }
    c.k().rmsnorm_bwd(tmp, s.h_mid, Nl, d, P + lp.post_norm, s.rstd2, tmp2, G + lp.post_norm);
    c.k().add(dx, tmp2, Nl * d);
    // h_mid = h_in + mla(norm1(h_in))
    AttnIn ai{&cfg, &lp, P, Pb, G, &rope, pos, seg, B, T, tp_.slice, opt.indexer_metrics(), opt.dense_warmup(), ix_grad};
    ai.cp = cp_full_ ? &cp_attn_ : nullptr;
    {
      ProfScope ps(prof, "bwd.mla");
      const float* dy = tp_block_in(sh, dx, d);
      float* dn = tp_block_out_buf(sh, tmp, d);
      mla_backward(c, ai, s.att, dy, dn);
      tp_block_out(sh, dn, tmp, d);
    }
    c.k().rmsnorm_bwd(tmp, s.h_in, Nl, d, P + lp.in_norm, s.rstd1, tmp2, G + lp.in_norm);
    c.k().add(dx, tmp2, Nl * d);
    acts.release(mk);
  };
  if (st.last && cfg.v3_mtp_layers > 0) mtp_v3_backward(mtp_in, mtp_saved, layer_backward, dx, grad_ready);
  for (int64_t l = l1 - 1; l >= l0; --l) {
    layer_backward(l, dx);
    if (grad_ready) grad_ready(l);
  }
  if (!st.first) {  // the gradient of the previous stage's output
    be_->to_host(io->dx_in, dx, Nl * d * sizeof(float));
    if (grad_ready && owns_grad_group(kGradGroupEmbed)) grad_ready(kGradGroupEmbed);  // tied head
    return out;
  }
  // Embedding: every row's updates in token order.
  c.k().scatter_add_rows(dx, ids, Nl, d, G + layout.embed);
  if (grad_ready) grad_ready(kGradGroupEmbed);
  return out;
}

}  // namespace trex::model
