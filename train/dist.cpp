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

// The slab range of region kind `kind` (DataParallel::Kind: 0 the shared embedding, 1 the other
// dense tensors, 2 the tensor-parallel split tensors, 3 the held experts) in a layout ([b, b)
// when it has none).
std::pair<int64_t, int64_t> region_bounds(const model::ParamLayout& L, int kind) {
  const int64_t experts_begin = L.expert_sharded() ? L.expert_begin : L.total;
  const int64_t dense_begin = std::max<int64_t>(L.shared_end, 0);
  const int64_t dense_end = L.tp_sharded() ? L.tp_begin : experts_begin;
  if (kind == 0) return {0, std::max<int64_t>(L.shared_end, 0)};
  if (kind == 1) return {dense_begin, dense_end};
  if (kind == 2) return L.tp_sharded() ? std::pair<int64_t, int64_t>{L.tp_begin, experts_begin}
                                       : std::pair<int64_t, int64_t>{0, 0};
  return L.expert_sharded() ? std::pair<int64_t, int64_t>{L.expert_begin, L.total} : std::pair<int64_t, int64_t>{0, 0};
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
  const model::ParamLayout& ml = m.layout;
  TREX_CHECK(o_.zero_stage == 1 || o_.pp == 1 || ml.stage_sharded(), "DataParallel: zero_stage = 2 (sharded "
             "gradients) with pipeline parallelism (pp = ", o_.pp, ") needs a model holding its stage only "
             "(model::StageShard, train::stage_shard_of); or use zero_stage = 1");
  const int64_t total = ml.total, q = 16 * (int64_t)dp;
  TREX_CHECK(total > 0, "DataParallel: the model has no parameters");
  fired_.assign(ml.layers.size() + 2, 0);
  // The regions of the slab, each reduced over the ranks holding it (dist.h DpOptions): the shared
  // embedding, the other dense tensors (every rank, or this stage's), the held experts.
  struct Part {
    Kind kind;
    parallel::Communicator* comm;
    int64_t begin, end;
  };
  TREX_CHECK(ml.shared_end < 0 || o_.shared_comm, "DataParallel: a stage-sharded model with a shared embedding "
             "needs DpOptions::shared_comm (the ranks of the first and the last stage)");
  TREX_CHECK(!ml.stage_sharded() || (o_.stage_comm && dp % o_.stage_comm->size() == 0), "DataParallel: a "
             "stage-sharded model needs DpOptions::stage_comm (the ranks of its stage)");
  TREX_CHECK(!ml.expert_sharded() || (o_.expert_comm && dp % o_.expert_comm->size() == 0), "DataParallel: an "
             "expert-sharded model needs DpOptions::expert_comm (the ranks holding the same experts)");
  TREX_CHECK(!ml.tp_sharded() || (o_.tp_slice_comm && dp % o_.tp_slice_comm->size() == 0 && ml.tp.size == o_.tp),
             "DataParallel: a tp-sharded model needs DpOptions::tp_slice_comm (the ranks holding the same slice) and "
             "tp = its slice count");
  parallel::Communicator* comms[4] = {o_.shared_comm, ml.stage_sharded() ? o_.stage_comm : &comm_, o_.tp_slice_comm,
                                      o_.expert_comm};
  std::vector<Part> parts;
  for (Kind k : {Kind::Shared, Kind::Dense, Kind::TpSplit, Kind::Experts}) {
    const auto [b, e] = region_bounds(ml, (int)k);
    if (e > b) parts.push_back({k, comms[(int)k], b, e});  // (a stage without experts has none, say)
  }
  TREX_CHECK(!parts.empty(), "DataParallel: the model has no parameters");
  for (const Part& p : parts)  // region boundaries: multiples of 16 x ranks (the shards' region_align)
    TREX_CHECK(p.begin % q == 0 && (&p == &parts.back() || p.end % q == 0), "DataParallel: region [", p.begin, ", ",
               p.end, ") does not start and end on multiples of 16 x ", dp,
               " ranks (model::ExpertShard / StageShard region_align)");
  const int64_t ql = 16 * (int64_t)parts.back().comm->size();
  parts.back().end = (parts.back().end + ql - 1) / ql * ql;
  padded_ = parts.back().end;
  grow_arena(m.params, "params", (size_t)padded_ * sizeof(float));
  grow_arena(m.grads, "grads", (size_t)padded_ * sizeof(float));
  regions_.reserve(parts.size());
  for (const Part& p : parts) add_region(p.kind, *p.comm, p.begin, p.end);
  for (Region& r : regions_)  // ZeRO-2: the slab's pages go back to the OS until a backward writes them
    if (r.zero2) r.sync->zero_grads();

  // This rank's shard of every bucket of every region -> the sharded AdamW.
  std::vector<SlabRange> owned;
  for (const Region& r : regions_)
    for (int b = 0; b < r.layout.num_buckets(); ++b) {
      const parallel::FlatRange f = r.layout.shard(b, r.comm->rank());
      owned.push_back({r.begin + (int64_t)f.begin, r.begin + (int64_t)f.end});
    }
  opt_ = std::make_unique<AdamW>(m, ocfg, owned);

  const int64_t ng = (int64_t)ml.layers.size() + 2;
  tp_copies_.assign(ng, {});
  if (tp_rank() != 0 && !m.tensor_parallel().sp)  // sequence parallel: every gradient is partial
    for (const model::ParamEntry& e : ml.entries)
      if (!model::tp_partial_grad(e.name) && e.shape.numel() > 0)
        tp_copies_[group_of(m, e.name)].push_back({e.offset, e.shape.numel()});
  broadcast_replicas();
}

void DataParallel::add_region(Kind kind, parallel::Communicator& comm, int64_t begin, int64_t end) {
  // Buckets: consecutive slab ranges of bs elements (the last one ends at `end`), each a multiple
  // of 16 x ranks, so BucketLayout pads nothing inside the region.
  const int n = comm.size();
  const int64_t q = 16 * (int64_t)n, len = end - begin;
  TREX_CHECK(len > 0 && len % q == 0, "DataParallel: region [", begin, ", ", end, ") is not a multiple of ", q);
  const int64_t used = std::min<int64_t>(m_.layout.total, end) - begin;  // elements before the padding
  const int64_t bs = o_.bucket_elems > 0 ? (o_.bucket_elems + q - 1) / q * q : len;
  const int64_t nb = std::max<int64_t>(1, (used + bs - 1) / bs);
  std::vector<size_t> sizes;
  for (int64_t b = 0; b < nb; ++b) sizes.push_back((size_t)((b + 1 == nb ? len : (b + 1) * bs) - b * bs));
  TREX_CHECK(regions_.size() < regions_.capacity(), "DataParallel: regions_ must not reallocate (GradSync keeps "
             "references to its layout)");
  Region& r = regions_.emplace_back();
  r.kind = kind;
  r.comm = &comm;
  // ZeRO-2 reduces every micro-batch's gradients as its backward completes them. The shared
  // embedding's two stages run a micro-batch's backward at different times (1F1B), so that region
  // stays ZeRO-1: reduced once, after the step's last micro-batch.
  r.zero2 = o_.zero_stage == 2 && kind != Kind::Shared;
  r.begin = begin;
  r.layout = parallel::BucketLayout::build(sizes, (size_t)bs, n, 16);
  TREX_CHECK(r.layout.num_buckets() == nb && (int64_t)r.layout.total == len, "DataParallel: bucket layout mismatch");
  for (int b = 0; b < nb; ++b)
    TREX_CHECK((int64_t)r.layout.buckets[b].begin == b * bs && r.layout.buckets[b].used == r.layout.buckets[b].size,
               "DataParallel: bucket ", b, " is not a padding-free slab range");
  // The sum over ranks (no 1/dp: the trainer weights the micro-batches by the global target count).
  r.sync = std::make_unique<parallel::GradSync>(comm, r.layout, m_.G() + begin, m_.P() + begin, /*average=*/false,
                                                /*shard_grads=*/r.zero2);
  // Parameter groups -> buckets of this region they touch.
  const int64_t ng = (int64_t)m_.layout.layers.size() + 2;
  r.group_buckets.assign(ng, {});
  for (const model::ParamEntry& e : m_.layout.entries) {
    const int64_t g = group_of(m_, e.name);
    TREX_CHECK(g >= 0 && g < ng, "DataParallel: no parameter group for ", e.name);
    if (e.shape.numel() == 0 || e.offset < begin || e.offset >= end) continue;
    const int64_t lo = e.offset - begin, hi = lo + e.shape.numel() - 1;
    for (int64_t b = lo / bs; b <= std::min(nb - 1, hi / bs); ++b) r.group_buckets[g].push_back((int)b);
  }
  r.bucket_groups.assign(nb, 0);
  for (auto& v : r.group_buckets) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    for (int b : v) ++r.bucket_groups[b];
  }
  r.left.assign(nb, 0);
}

DataParallel::~DataParallel() {
  m_.grad_ready = nullptr;
  m_.params_needed = nullptr;
}

int DataParallel::num_buckets() const {
  int n = 0;
  for (const Region& r : regions_) n += r.layout.num_buckets();
  return n;
}

int DataParallel::buckets_started_in_backward() const {
  int n = 0;
  for (const Region& r : regions_) n += r.started_in_bwd;
  return n;
}

void DataParallel::broadcast_replicas() {
  wait_params();
  for (const Region& r : regions_) r.comm->broadcast(m_.P() + r.begin, r.layout.total, 0);
  if (!m_.buffers.empty()) comm_.broadcast(m_.buffers.data(), m_.buffers.size(), 0);
  m_.refresh_bf16();
}

void DataParallel::begin_step() {
  for (Region& r : regions_) r.sync->zero_grads();
}

void DataParallel::begin_micro(bool last) {
  for (Region& r : regions_)  // ZeRO-2: waits for the previous micro-batch's buckets
    if (r.zero2) r.sync->begin_micro_batch(last);
  if (last || o_.zero_stage == 2) arm(last);
}

void DataParallel::end_micro(bool last) {
  if (last || o_.zero_stage == 2) disarm();
}

bool DataParallel::releases_grad_pages() const {
  for (const Region& r : regions_)
    if (r.zero2 && r.sync->releases_pages()) return true;
  return false;
}

void DataParallel::arm(bool last) {
  std::fill(fired_.begin(), fired_.end(), 0);
  for (Region& r : regions_) {  // the ZeRO-1 regions reduce after the step's last micro-batch only
    r.armed = last || r.zero2;
    if (!r.armed) continue;
    r.left = r.bucket_groups;
    r.started_in_bwd = 0;
    r.next_bucket = r.layout.num_buckets() - 1;
  }
  if (!o_.overlap) return;
  // Pipeline parallel: the other stages' parameter groups have their final gradient (0) now.
  const int64_t L = (int64_t)m_.layout.layers.size();
  for (int64_t g = -2; g < L; ++g)
    if (!m_.owns_grad_group(g)) on_group(g);
  for (Region& r : regions_)  // and the buckets without parameters (gaps, padding)
    if (r.armed) start_ready_buckets(r);
  m_.grad_ready = [this](int64_t g) { on_group(g); };
}

void DataParallel::start_ready_buckets(Region& r) {
  // Highest index first, whatever order the groups finish in: the reduce-scatters are collectives
  // and must start in the same order on every rank (pipeline stages finish theirs at different
  // times). Backward runs from the head to the embedding, i.e. from high slab offsets to low.
  while (r.next_bucket >= 0 && r.left[r.next_bucket] == 0) {
    r.sync->mark_ready(r.next_bucket--);
    ++r.started_in_bwd;
  }
}

int64_t DataParallel::group_index(int64_t g) const {
  const int64_t L = (int64_t)m_.layout.layers.size();
  const int64_t i = g == model::Model::kGradGroupHead ? L : g == model::Model::kGradGroupEmbed ? L + 1 : g;
  TREX_CHECK(i >= 0 && i < (int64_t)fired_.size(), "DataParallel: unknown parameter group ", g);
  return i;
}

void DataParallel::on_group(int64_t g) {
  const int64_t i = group_index(g);
  TREX_CHECK(!fired_[i], "DataParallel: parameter group ", g, " reported twice");
  fired_[i] = 1;
  drop_tp_copies(i);
  for (Region& r : regions_) {
    if (!r.armed) continue;
    for (int b : r.group_buckets[i]) --r.left[b];
    start_ready_buckets(r);
  }
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
  for (Region& r : regions_) {
    if (!r.armed) continue;
    r.armed = false;
    const int started = r.started_in_bwd;
    std::fill(r.left.begin(), r.left.end(), 0);
    start_ready_buckets(r);
    r.started_in_bwd = started;
  }
}

template <class T>
void DataParallel::all_reduce_timed(T* v, size_t n) {
  const double t0 = now_s(), t0m = now_ms();
  comm_.all_reduce(v, n);
  traced_wait(t0, t0m);
}

double DataParallel::finish_grads(bool inject_nan) {
  wait_params();  // this rank's shards are the all-gather's send buffers: complete it before the update
  for (Region& r : regions_) r.sync->finish_grad_sync();
  if (inject_nan && rank() == 0) regions_[0].sync->grad_shard(0)[0] = std::nanf("");
  // Every region's shards partition its tensors over its ranks, and different regions of the same
  // kind (the ep ranks' experts, the stages' layers) hold different tensors: the sum over every
  // rank is the whole model's.
  double ss = 0;
  for (Region& r : regions_)
    for (int b = 0; b < r.layout.num_buckets(); ++b) {
      std::span<float> g = r.sync->grad_shard(b);
      ss += kern::sum_squares(g.data(), (int64_t)g.size());
    }
  all_reduce_timed(&ss, 1);  // over every rank, tp ranks included: each holds its own shards
  return std::sqrt(ss);
}

void DataParallel::gather_params() {
  wait_params();  // (nothing is in flight here: finish_grads waited)
  for (Region& r : regions_) r.gathered.assign(r.layout.num_buckets(), 0);
  if (!o_.overlap_params) {
    for (Region& r : regions_) {
      r.sync->start_param_all_gather();
      for (int b = r.layout.num_buckets() - 1; b >= 0; --b) finish_param_bucket(r, b);  // the order they were started in
    }
    return;
  }
  // The forward reads the slab from the embedding (bucket 0) on: start them in that order.
  for (Region& r : regions_) r.sync->start_param_all_gather(/*first_bucket_first=*/true);
  m_.params_needed = [this](int64_t g) {
    const int64_t i = group_index(g);
    for (Region& r : regions_)
      for (int b : r.group_buckets[i]) finish_param_bucket(r, b);
  };
}

void DataParallel::finish_param_bucket(Region& r, int b) {
  if (r.gathered[b]) return;
  r.sync->wait_param_bucket(b);
  r.gathered[b] = 1;
  if (m_.params_bf16.empty()) return;
  const int64_t lo = r.begin + (int64_t)r.layout.buckets[b].begin;
  const int64_t hi = std::min<int64_t>(lo + (int64_t)r.layout.buckets[b].size, m_.layout.total);
  if (lo < hi) model::to_bf16(m_.P() + lo, m_.params_bf16.data() + lo, hi - lo);
}

void DataParallel::wait_params() {
  if (!m_.params_needed) return;
  m_.params_needed = nullptr;
  for (Region& r : regions_)
    for (int b = 0; b < r.layout.num_buckets(); ++b) finish_param_bucket(r, b);
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
  for (Region& r : regions_) r.sync->set_trace(t);
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
  double s = wait_s_;
  for (const Region& r : regions_) s += r.sync->exposed_wait_seconds();
  return s + (m_.expert_parallel().wait_ms + m_.tensor_parallel().wait_ms + pp_wait_ms_) / 1e3;
}

void DataParallel::gather_region_moments(size_t k, std::vector<float>& m1, std::vector<float>& m2) {
  const Region& R = regions_[k];
  parallel::Communicator& c = *R.comm;
  // This rank's state of region k: after the earlier regions' shards (AdamW state in owned order).
  int64_t off = 0;
  for (size_t j = 0; j < k; ++j) off += (int64_t)regions_[j].layout.shard_elems();
  const int64_t S = (int64_t)R.layout.shard_elems();  // the same on every rank of the region (equal shards)
  const int tag = 7301;
  if (c.rank() != 0) {
    c.send(opt_->M1() + off, (size_t)S, DType::F32, 0, tag);
    c.send(opt_->M2() + off, (size_t)S, DType::F32, 0, tag);
    m1.clear();
    m2.clear();
    return;
  }
  m1.assign(R.layout.total, 0.f);
  m2.assign(R.layout.total, 0.f);
  std::vector<float> r1((size_t)S), r2((size_t)S);
  for (int r = 0; r < c.size(); ++r) {
    const float *s1 = opt_->M1() + off, *s2 = opt_->M2() + off;
    if (r != 0) {
      c.recv(r1.data(), (size_t)S, DType::F32, r, tag);
      c.recv(r2.data(), (size_t)S, DType::F32, r, tag);
      s1 = r1.data(), s2 = r2.data();
    }
    int64_t state = 0;
    for (int b = 0; b < R.layout.num_buckets(); ++b) {
      const parallel::FlatRange fr = R.layout.shard(b, r);
      std::copy(s1 + state, s1 + state + fr.size(), m1.begin() + fr.begin);
      std::copy(s2 + state, s2 + state + fr.size(), m2.begin() + fr.begin);
      state += (int64_t)fr.size();
    }
  }
}

DataParallel::Gathered DataParallel::gather_whole() {
  wait_params();
  Gathered g;
  const model::ParamLayout& ml = m_.layout;
  if (!ml.sharded()) {
    std::vector<float> m1, m2;
    gather_region_moments(0, m1, m2);  // rank 0: the whole slab's moments
    if (rank() == 0) {
      g.layout = ml;
      g.params = m_.P();
      m1.resize(ml.total), m2.resize(ml.total);
      g.m1 = std::move(m1), g.m2 = std::move(m2);
    }
    return g;
  }
  // Sharded: every region's moments on its lowest rank, which sends the region's weights and
  // moments to rank 0 with the shard they belong to; rank 0 lays every tensor out as a whole
  // model's. All ranks walk their regions in the same kind order, so the point-to-point messages
  // of one region never wait on another's.
  constexpr int kKinds = 4, kSpec = 9, kTag = 7302;
  std::vector<std::vector<float>> m1s(regions_.size()), m2s(regions_.size());
  std::vector<int64_t> lead((size_t)size() * kKinds, 0);
  for (size_t k = 0; k < regions_.size(); ++k) {
    gather_region_moments(k, m1s[k], m2s[k]);
    if (regions_[k].comm->rank() == 0) lead[(size_t)rank() * kKinds + (size_t)regions_[k].kind] = 1;
  }
  comm_.all_reduce(lead.data(), lead.size(), parallel::ReduceOp::Max);
  // The shard a layout was built for (expert first / count, stage l0 / l1 / first / last, tp rank /
  // size) and the region's length here (its end depends on the alignment: rank 0 rebuilds the
  // layout with 16).
  int64_t spec[kSpec] = {ml.expert_first, ml.expert_sharded() ? ml.expert_count : -1, ml.stage.l0,
                         ml.stage_sharded() ? ml.stage.l1 : -1, ml.stage.first, ml.stage.last, ml.tp.rank,
                         ml.tp_sharded() ? ml.tp.size : 1, 0};
  if (rank() != 0) {
    for (size_t k = 0; k < regions_.size(); ++k) {
      if (regions_[k].comm->rank() != 0) continue;
      const auto [b, e] = region_bounds(ml, (int)regions_[k].kind);
      spec[kSpec - 1] = e - b;
      comm_.send(spec, kSpec, DType::I64, 0, kTag);
      comm_.send(m_.P() + b, (size_t)(e - b), DType::F32, 0, kTag);
      comm_.send(m1s[k].data(), (size_t)(e - b), DType::F32, 0, kTag);
      comm_.send(m2s[k].data(), (size_t)(e - b), DType::F32, 0, kTag);
    }
    return g;
  }
  g.layout = model::build_layout(m_.cfg);
  const model::ParamLayout& W = g.layout;
  g.store.assign((size_t)W.total, 0.f);
  g.params = g.store.data();
  g.m1.assign((size_t)W.total, 0.f);
  g.m2.assign((size_t)W.total, 0.f);
  std::vector<int64_t> placed(W.entries.size(), 0);  // elements of each whole tensor placed
  std::vector<float> rp, r1, r2;
  for (int r = 0; r < size(); ++r)
    for (int kind = 0; kind < kKinds; ++kind) {
      if (!lead[(size_t)r * kKinds + (size_t)kind]) continue;
      int64_t sp[kSpec];
      const float *p = nullptr, *a = nullptr, *c = nullptr;
      if (r == 0) {
        std::copy(spec, spec + kSpec, sp);
        for (size_t k = 0; k < regions_.size(); ++k)
          if ((int)regions_[k].kind == kind) {
            p = m_.P() + region_bounds(ml, kind).first, a = m1s[k].data(), c = m2s[k].data();
          }
      } else {
        comm_.recv(sp, kSpec, DType::I64, r, kTag);
      }
      const int64_t len = sp[kSpec - 1];
      // That rank's layout (16-element region alignment: offsets inside a region do not depend on
      // where it starts).
      const model::ParamLayout sh = model::build_layout(m_.cfg, model::ExpertShard{sp[0], sp[1], 16},
                                                        model::StageShard{sp[2], sp[3], sp[4] != 0, sp[5] != 0, 16},
                                                        model::TpShard{sp[6], sp[7], 16});
      const auto [b, e] = region_bounds(sh, kind);
      if (r != 0) {
        rp.resize((size_t)len), r1.resize((size_t)len), r2.resize((size_t)len);
        comm_.recv(rp.data(), rp.size(), DType::F32, r, kTag);
        comm_.recv(r1.data(), r1.size(), DType::F32, r, kTag);
        comm_.recv(r2.data(), r2.size(), DType::F32, r, kTag);
        p = rp.data(), a = r1.data(), c = r2.data();
      }
      TREX_CHECK(p, "gather_whole: rank 0 leads a region it does not hold");
      for (const model::ParamEntry& en : sh.entries) {  // its tensors into the whole model's, by name
        if (en.offset < b || en.offset >= e || en.shape.numel() == 0) continue;
        TREX_CHECK(r == 0 || en.offset - b + en.shape.numel() <= len, "gather_whole: rank ", r, " sent ", len,
                   " elements, short of ", en.name);
        const auto it = W.index.find(en.name);
        TREX_CHECK(it != W.index.end(), "gather_whole: ", en.name, " is not in the whole model's layout");
        const model::ParamEntry& w = W.entries[it->second];
        const int64_t src = en.offset - b;  // an expert shard's rows or a tp slice go to their place
        en.put_into_whole(p + src, g.store.data() + w.offset);
        en.put_into_whole(a + src, g.m1.data() + w.offset);
        en.put_into_whole(c + src, g.m2.data() + w.offset);
        placed[it->second] += en.shape.numel();
      }
    }
  for (size_t i = 0; i < W.entries.size(); ++i)
    TREX_CHECK(placed[i] == W.entries[i].shape.numel(), "gather_whole: ", placed[i], " of the ",
               W.entries[i].shape.numel(), " elements of ", W.entries[i].name, " came from the ranks");
  return g;
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
  const model::ParamLayout& ml = m.layout;
  if (ml.stage_sharded()) {  // every tensor reduced over the ranks holding it
    TREX_CHECK(dims.pp > 1, "make_parallel_run: a stage-sharded model needs parallel.pp > 1");
    r.stage = world.group(dims.stage_group(world.rank()));
    o.stage_comm = r.stage.get();
    if (model::embedding_shared(m.cfg, ml.stage)) {
      const int s = dims.coord(world.rank()).pp;
      r.shared = world.split(s == 0 || s == dims.pp - 1 ? 0 : -1, world.rank());
      o.shared_comm = r.shared.get();
    }
  }
  if (ml.tp_sharded()) {
    TREX_CHECK(dims.tp == ml.tp.size, "make_parallel_run: a model holding tp slice ", ml.tp.rank, " of ", ml.tp.size,
               " needs parallel.tp = ", ml.tp.size);
    r.tp_slice = world.group(ml.stage_sharded() ? dims.dp_group(world.rank()) : dims.tp_slice_group(world.rank()));
    o.tp_slice_comm = r.tp_slice.get();
  }
  if (ml.expert_sharded()) {
    TREX_CHECK(dims.ep > 1, "make_parallel_run: an expert-sharded model needs parallel.ep > 1");
    r.expert_replicas = world.group(ml.stage_sharded() ? dims.stage_expert_group(world.rank())
                                                       : dims.expert_replica_group(world.rank()));
    o.expert_comm = r.expert_replicas.get();
  }
  // The DataParallel runs over the whole world (rank = tp_rank + tp * (dp_rank + dp * pp_rank)).
  r.dp = std::make_unique<DataParallel>(world, m, ocfg, o);
  return r;
}

model::ExpertShard expert_shard_of(const parallel::ParallelDims& dims, int rank, const model::ModelConfig& cfg) {
  model::ExpertShard s;
  if (dims.ep <= 1) return s;
  const int64_t E = cfg.n_routed_experts;
  s.count = dims.experts_per_rank(E);
  s.first = dims.first_expert(E, dims.coord(rank).ep);
  s.region_align = 16 * (int64_t)dims.world();
  return s;
}

model::StageShard stage_shard_of(const parallel::ParallelDims& dims, int rank, const model::ModelConfig& cfg) {
  model::StageShard s;
  if (dims.pp <= 1) return s;
  const int p = dims.coord(rank).pp;
  const int64_t L = cfg.num_hidden_layers;
  s.l0 = dims.stage_first_layer(L, p);
  s.l1 = s.l0 + dims.stage_layers(L)[(size_t)p];
  s.first = p == 0;
  s.last = p == dims.pp - 1;
  s.region_align = 16 * (int64_t)dims.world();
  return s;
}

model::TpShard tp_shard_of(const parallel::ParallelDims& dims, int rank) {
  model::TpShard s;
  if (dims.tp <= 1) return s;
  s.rank = dims.coord(rank).tp;
  s.size = dims.tp;
  s.region_align = 16 * (int64_t)dims.world();
  return s;
}

std::string save_checkpoint(const std::string& run_dir, DataParallel& dp, const TrainState& state, int keep) {
  DataParallel::Gathered g = dp.gather_whole();
  std::string dir;
  if (dp.rank() == 0) {
    const model::Model& m = dp.model();
    dir = save_checkpoint(run_dir, model::WeightsView{m.cfg, g.layout, g.params, m.buffers.data()},
                          g.m1.data(), g.m2.data(), dp.opt().steps(), state, keep);
  }
  dp.comm().barrier();  // the checkpoint is complete before any rank goes on (or resumes from it)
  if (dp.rank() != 0) dir = checkpoint_path(run_dir, state.step);
  return dir;
}

TrainState load_checkpoint(const std::string& dir, DataParallel& dp, bool verify) {
  dp.wait_params();  // an all-gather in flight would overwrite the loaded weights
  TrainState st = load_checkpoint(dir, dp.model(), dp.opt(), verify);
  dp.broadcast_replicas();
  return st;
}

}  // namespace trex::train
