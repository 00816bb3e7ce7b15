// Data-parallel state: buckets over the model slab, the grad_ready hook, ZeRO-1 AdamW, checkpoint
// gathering. See dist.h.
#include "train/dist.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include "core/error.h"
#include "core/timer.h"
#include "kernels/adamw.h"
#include "model/linear.h"

namespace trex::train {

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Parameter group of a tensor (model.grad_ready numbering, shifted so it indexes a vector):
// decoder layer l -> l (V4 MTP block k -> num_hidden_layers + k), head -> L, embedding -> L + 1,
// where L = layout.layers.size().
int64_t group_of(const model::Model& m, const std::string& name) {
  const int64_t L = (int64_t)m.layout.layers.size();
  auto number_after = [&](const char* prefix) -> int64_t {
    const size_t k = std::strlen(prefix);
    if (name.compare(0, k, prefix) != 0) return -1;
    size_t i = k;
    int64_t v = 0;
    while (i < name.size() && name[i] >= '0' && name[i] <= '9') v = v * 10 + (name[i++] - '0');
    return i > k && i < name.size() && name[i] == '.' ? v : -1;
  };
  if (int64_t l = number_after("model.layers."); l >= 0) return l;
  if (int64_t k = number_after("mtp."); k >= 0) return m.cfg.num_hidden_layers + k;
  if (name.rfind("model.embed_tokens.", 0) == 0) return L + 1;
  return L;  // final norm, LM head, V4 hc_head
}

// Replaces an arena by a zero-padded copy of at least `bytes`.
void grow_arena(Arena& a, const char* name, size_t bytes) {
  if (a.capacity() >= bytes) return;
  Arena b(name, bytes);
  b.zero();
  if (a.capacity()) std::memcpy(b.base(), a.base(), a.capacity());
  a = std::move(b);
}

}  // namespace

DataParallel::DataParallel(parallel::Communicator& dp_comm, model::Model& m, AdamWConfig ocfg, DpOptions o)
    : comm_(dp_comm), m_(m), o_(o) {
  const int dp = comm_.size();
  TREX_CHECK(o_.tp >= 1 && o_.pp >= 1 && dp % (o_.tp * o_.pp) == 0, "DataParallel: ", dp,
             " ranks are not a multiple of tp x pp = ", o_.tp, " x ", o_.pp);
  TREX_CHECK(o_.tp == 1 || m.tensor_parallel().on(), "DataParallel: tp = ", o_.tp,
             " but tensor parallelism is not set on the model");
  TREX_CHECK((o_.pp == 1) == !m.pipeline_stage().on() && (o_.pp == 1 || (o_.pp_comm && o_.pp_comm->size() == o_.pp)),
             "DataParallel: pp = ", o_.pp, " needs a pipeline stage on the model and a pp group of that size");
  TREX_CHECK(o_.zero_stage == 1 || o_.zero_stage == 2, "DataParallel: zero_stage = ", o_.zero_stage,
             " (allowed: 1, 2)");
  TREX_CHECK(o_.zero_stage == 1 || o_.pp == 1, "DataParallel: zero_stage = 2 (sharded gradients) does not work with "
             "pipeline parallelism (pp = ", o_.pp, "); use zero_stage = 1");
  const int64_t total = m.layout.total, q = 16 * (int64_t)dp;
  TREX_CHECK(total > 0, "DataParallel: the model has no parameters");
  padded_ = (total + q - 1) / q * q;
  grow_arena(m.params, "params", (size_t)padded_ * sizeof(float));
  grow_arena(m.grads, "grads", (size_t)padded_ * sizeof(float));

  // Buckets: consecutive slab ranges of bs elements (the last one ends at padded_).
  const int64_t bs = o_.bucket_elems > 0 ? (o_.bucket_elems + q - 1) / q * q : padded_;
  const int64_t nb = std::max<int64_t>(1, (total + bs - 1) / bs);
  std::vector<size_t> sizes;
  for (int64_t b = 0; b < nb; ++b) sizes.push_back((size_t)((b + 1 == nb ? padded_ : (b + 1) * bs) - b * bs));
  layout_ = parallel::BucketLayout::build(sizes, (size_t)bs, dp, 16);
  TREX_CHECK(layout_.num_buckets() == nb && (int64_t)layout_.total == padded_, "DataParallel: bucket layout mismatch");
  for (int b = 0; b < nb; ++b)
    TREX_CHECK((int64_t)layout_.buckets[b].begin == b * bs && layout_.buckets[b].used == layout_.buckets[b].size,
               "DataParallel: bucket ", b, " is not a padding-free slab range");
  // The sum over ranks (no 1/dp: the trainer weights the micro-batches by the global target count).
  sync_ = std::make_unique<parallel::GradSync>(comm_, layout_, m.G(), m.P(), /*average=*/false,
                                               /*shard_grads=*/o_.zero_stage == 2);
  if (o_.zero_stage == 2) sync_->zero_grads();  // the slab's pages go back to the OS until a backward writes them

  // This rank's shard of every bucket -> the sharded AdamW.
  std::vector<SlabRange> owned;
  for (int b = 0; b < nb; ++b) {
    const parallel::FlatRange r = layout_.shard(b, comm_.rank());
    owned.push_back({(int64_t)r.begin, (int64_t)r.end});
  }
  opt_ = std::make_unique<AdamW>(m, ocfg, owned);

  // Parameter groups -> buckets they touch.
  const int64_t ng = (int64_t)m.layout.layers.size() + 2;
  group_buckets_.assign(ng, {});
  for (const model::ParamEntry& e : m.layout.entries) {
    const int64_t g = group_of(m, e.name);
    TREX_CHECK(g >= 0 && g < ng, "DataParallel: no parameter group for ", e.name);
    if (e.shape.numel() == 0) continue;
    for (int64_t b = e.offset / bs; b <= std::min(nb - 1, (e.offset + e.shape.numel() - 1) / bs); ++b)
      group_buckets_[g].push_back((int)b);
  }
  bucket_groups_.assign(nb, 0);
  for (auto& v : group_buckets_) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    for (int b : v) ++bucket_groups_[b];
  }
  left_.assign(nb, 0);
  fired_.assign(ng, 0);
  tp_copies_.assign(ng, {});
  if (tp_rank() != 0 && !m.tensor_parallel().sp)  // sequence parallel: every gradient is partial
    for (const model::ParamEntry& e : m.layout.entries)
      if (!model::tp_partial_grad(e.name) && e.shape.numel() > 0)
        tp_copies_[group_of(m, e.name)].push_back({e.offset, e.shape.numel()});
  broadcast_replicas();
}

DataParallel::~DataParallel() {
  m_.grad_ready = nullptr;
  m_.params_needed = nullptr;
}

void DataParallel::broadcast_replicas() {
  wait_params();
  comm_.broadcast(m_.P(), (size_t)padded_, 0);
  if (!m_.buffers.empty()) comm_.broadcast(m_.buffers.data(), m_.buffers.size(), 0);
  m_.refresh_bf16();
}

void DataParallel::begin_step() { sync_->zero_grads(); }

void DataParallel::begin_micro(bool last) {
  if (o_.zero_stage == 2) sync_->begin_micro_batch(last);  // waits for the previous micro-batch's buckets
  if (last || o_.zero_stage == 2) arm();
}

void DataParallel::end_micro(bool last) {
  if (last || o_.zero_stage == 2) disarm();
}

void DataParallel::arm() {
  left_ = bucket_groups_;
  std::fill(fired_.begin(), fired_.end(), 0);
  started_in_bwd_ = 0;
  next_bucket_ = layout_.num_buckets() - 1;
  if (!o_.overlap) return;
  // Pipeline parallel: the other stages' parameter groups have their final gradient (0) now.
  const int64_t L = (int64_t)m_.layout.layers.size();
  for (int64_t g = -2; g < L; ++g)
    if (!m_.owns_grad_group(g)) on_group(g);
  start_ready_buckets();  // and the buckets without parameters (gaps, padding)
  m_.grad_ready = [this](int64_t g) { on_group(g); };
}

void DataParallel::start_ready_buckets() {
  // Highest index first, whatever order the groups finish in: the reduce-scatters are collectives
  // and must start in the same order on every rank (pipeline stages finish theirs at different
  // times). Backward runs from the head to the embedding, i.e. from high slab offsets to low.
  while (next_bucket_ >= 0 && left_[next_bucket_] == 0) {
    sync_->mark_ready(next_bucket_--);
    ++started_in_bwd_;
  }
}

int64_t DataParallel::group_index(int64_t g) const {
  const int64_t L = (int64_t)m_.layout.layers.size();
  const int64_t i = g == model::Model::kGradGroupHead ? L : g == model::Model::kGradGroupEmbed ? L + 1 : g;
  TREX_CHECK(i >= 0 && i < (int64_t)group_buckets_.size(), "DataParallel: unknown parameter group ", g);
  return i;
}

void DataParallel::on_group(int64_t g) {
  const int64_t i = group_index(g);
  TREX_CHECK(!fired_[i], "DataParallel: parameter group ", g, " reported twice");
  fired_[i] = 1;
  drop_tp_copies(i);
  for (int b : group_buckets_[i]) --left_[b];
  start_ready_buckets();
}

void DataParallel::drop_tp_copies(int64_t i) {
  // Every tp rank computed these gradients in full: the reduction over dp x tp ranks counts tp
  // rank 0's.
  for (auto [off, n] : tp_copies_[i]) std::memset(m_.G() + off, 0, (size_t)n * sizeof(float));
}

void DataParallel::disarm() {
  m_.grad_ready = nullptr;
  for (size_t i = 0; i < fired_.size(); ++i)
    if (!fired_[i]) drop_tp_copies((int64_t)i);
  // Buckets the hook did not complete (overlap off, or a model without the hook): all now, in
  // the same order as the hook's (the same order on every rank).
  const int started = started_in_bwd_;
  std::fill(left_.begin(), left_.end(), 0);
  start_ready_buckets();
  started_in_bwd_ = started;
}

template <class T>
void DataParallel::all_reduce_timed(T* v, size_t n) {
  const double t0 = now_s(), t0m = now_ms();
  comm_.all_reduce(v, n);
  traced_wait(t0, t0m);
}

double DataParallel::finish_grads(bool inject_nan) {
  wait_params();  // this rank's shards are the all-gather's send buffers: complete it before the update
  sync_->finish_grad_sync();
  if (inject_nan && rank() == 0) sync_->grad_shard(0)[0] = std::nanf("");
  double ss = 0;
  for (int b = 0; b < layout_.num_buckets(); ++b) {
    std::span<float> g = sync_->grad_shard(b);
    ss += kern::sum_squares(g.data(), (int64_t)g.size());
  }
  all_reduce_timed(&ss, 1);  // over every rank, tp ranks included: each holds its own shards
  return std::sqrt(ss);
}

void DataParallel::gather_params() {
  wait_params();  // (nothing is in flight here: finish_grads waited)
  const int nb = layout_.num_buckets();
  gathered_.assign(nb, 0);
  if (!o_.overlap_params) {
    sync_->start_param_all_gather();
    for (int b = nb - 1; b >= 0; --b) finish_param_bucket(b);  // the order they were started in
    return;
  }
  // The forward reads the slab from the embedding (bucket 0) on: start them in that order.
  sync_->start_param_all_gather(/*first_bucket_first=*/true);
  m_.params_needed = [this](int64_t g) {
    for (int b : group_buckets_[group_index(g)]) finish_param_bucket(b);
  };
}

void DataParallel::finish_param_bucket(int b) {
  if (gathered_[b]) return;
  sync_->wait_param_bucket(b);
  gathered_[b] = 1;
  if (m_.params_bf16.empty()) return;
  const int64_t lo = (int64_t)layout_.buckets[b].begin;
  const int64_t hi = std::min<int64_t>(lo + (int64_t)layout_.buckets[b].size, m_.layout.total);
  if (lo < hi) model::to_bf16(m_.P() + lo, m_.params_bf16.data() + lo, hi - lo);
}

void DataParallel::wait_params() {
  if (!m_.params_needed) return;
  m_.params_needed = nullptr;
  for (int b = 0; b < layout_.num_buckets(); ++b) finish_param_bucket(b);
}

void DataParallel::traced_wait(double t0_s, double t0_ms) {
  wait_s_ += now_s() - t0_s;
  if (!trace_) return;
  const double t1 = now_ms();
  trace_->add("all-reduce", TraceTrack::Comm, t0_ms, t1);
  trace_->add("wait: all-reduce", TraceTrack::Compute, t0_ms, t1);
}

void DataParallel::set_trace(TraceLog* t) {
  trace_ = t;
  sync_->set_trace(t);
}

void DataParallel::sum(int64_t* v, size_t n, Count c) {
  if (!counts(c)) std::fill(v, v + n, 0);
  all_reduce_timed(v, n);
}

void DataParallel::sum(double* v, size_t n, Count c) {
  if (!counts(c)) std::fill(v, v + n, 0.0);
  all_reduce_timed(v, n);
}

std::vector<std::vector<int64_t>> DataParallel::sum_loads(const std::vector<std::vector<int64_t>>& load) {
  std::vector<int64_t> flat;
  for (const auto& v : load) flat.insert(flat.end(), v.begin(), v.end());
  if (!flat.empty()) sum(flat.data(), flat.size(), Count::PerStage);
  std::vector<std::vector<int64_t>> out(load.size());
  size_t k = 0;
  for (size_t l = 0; l < load.size(); ++l) {
    out[l].assign(flat.begin() + k, flat.begin() + k + load[l].size());
    k += load[l].size();
  }
  return out;
}

double DataParallel::exposed_wait_s() const {
  return wait_s_ + sync_->exposed_wait_seconds() +
         (m_.expert_parallel().wait_ms + m_.tensor_parallel().wait_ms + pp_wait_ms_) / 1e3;
}

void DataParallel::gather_moments(std::vector<float>& m1, std::vector<float>& m2) {
  const int64_t S = opt_->state_elems();  // the same on every rank (equal shards)
  const int tag = 7301;
  if (rank() != 0) {
    comm_.send(opt_->M1(), (size_t)S, DType::F32, 0, tag);
    comm_.send(opt_->M2(), (size_t)S, DType::F32, 0, tag);
    m1.clear();
    m2.clear();
    return;
  }
  m1.assign((size_t)padded_, 0.f);
  m2.assign((size_t)padded_, 0.f);
  std::vector<float> r1((size_t)S), r2((size_t)S);
  for (int r = 0; r < size(); ++r) {
    const float *s1 = opt_->M1(), *s2 = opt_->M2();
    if (r != 0) {
      comm_.recv(r1.data(), (size_t)S, DType::F32, r, tag);
      comm_.recv(r2.data(), (size_t)S, DType::F32, r, tag);
      s1 = r1.data(), s2 = r2.data();
    }
    int64_t state = 0;
    for (int b = 0; b < layout_.num_buckets(); ++b) {
      const parallel::FlatRange fr = layout_.shard(b, r);
      std::copy(s1 + state, s1 + state + fr.size(), m1.begin() + fr.begin);
      std::copy(s2 + state, s2 + state + fr.size(), m2.begin() + fr.begin);
      state += (int64_t)fr.size();
    }
  }
}

ParallelRun make_parallel_run(parallel::Communicator& world, const parallel::ParallelDims& dims, model::Model& m,
                              AdamWConfig ocfg, DpOptions o) {
  TREX_CHECK(world.size() == dims.world(), "make_parallel_run: ", dims.str(), " on ", world.size(), " ranks");
  ParallelRun r;
  if (world.size() == 1) return r;
  r.groups = parallel::make_process_groups(world, dims);
  if (dims.ep > 1) m.set_expert_parallel(r.groups.ep.get());
  if (dims.tp > 1) m.set_tensor_parallel(r.groups.tp.get(), o.sequence_parallel);
  if (dims.pp > 1) {
    const int s = dims.coord(world.rank()).pp;
    const int64_t L = m.cfg.num_hidden_layers, l0 = dims.stage_first_layer(L, s);
    m.set_pipeline_stage({l0, l0 + dims.stage_layers(L)[s], s == 0, s == dims.pp - 1});
  }
  o.tp = dims.tp;
  o.pp = dims.pp;
  o.pp_comm = dims.pp > 1 ? r.groups.pp.get() : nullptr;
  // The DataParallel runs over the whole world (rank = tp_rank + tp * (dp_rank + dp * pp_rank)).
  r.dp = std::make_unique<DataParallel>(world, m, ocfg, o);
  return r;
}

std::string save_checkpoint(const std::string& run_dir, DataParallel& dp, const TrainState& state, int keep) {
  dp.wait_params();
  std::vector<float> m1, m2;
  dp.gather_moments(m1, m2);
  std::string dir;
  if (dp.rank() == 0) dir = save_checkpoint(run_dir, dp.model(), m1.data(), m2.data(), dp.opt().steps(), state, keep);
  dp.comm().barrier();  // the checkpoint is complete before any rank goes on (or resumes from it)
  if (dp.rank() != 0) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "step-%08lld", (long long)state.step);
    dir = (std::filesystem::path(run_dir) / "checkpoints" / buf).string();
  }
  return dir;
}

TrainState load_checkpoint(const std::string& dir, DataParallel& dp) {
  dp.wait_params();  // an all-gather in flight would overwrite the loaded weights
  TrainState st = load_checkpoint(dir, dp.model(), dp.opt());
  dp.broadcast_replicas();
  return st;
}

}  // namespace trex::train
