// Data-parallel state: buckets over the model slab, the grad_ready hook, the ZeRO-1 / ZeRO-2
// sharded AdamW. See dist.h (gathering for checkpoints: train/dist_checkpoint.cpp).
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
  TREX_CHECK(o_.tp >= 1 && o_.pp >= 1 && o_.cp >= 1 && dp % (o_.tp * o_.cp * o_.pp) == 0, "DataParallel: ", dp,
             " ranks are not a multiple of tp x cp x pp = ", o_.tp, " x ", o_.cp, " x ", o_.pp);
  TREX_CHECK(o_.cp == 1 || m.context_parallel().on(), "DataParallel: cp = ", o_.cp,
             " but context parallelism is not set on the model");
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
  const bool dev = m.on_device();
  TREX_CHECK(!dev || (o_.device_comm && o_.device_comm->size() == dp && o_.tp == 1 && o_.pp == 1 && !ml.sharded() &&
                      !ml.tp_sharded() && o_.zero_stage == 1),
             "DataParallel: a model on device \"", m.backend().name(), "\" takes plain data parallelism (no ep, tp "
             "or pp; zero_stage 1) with DpOptions::device_comm over the same ", dp, " ranks");
  parallel::Communicator* comms[4] = {o_.shared_comm, dev ? o_.device_comm : ml.stage_sharded() ? o_.stage_comm : &comm_,
                                      o_.tp_slice_comm, o_.expert_comm};
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
  m.grow_device_slabs(padded_);
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
  r.sync = std::make_unique<parallel::GradSync>(comm, r.layout, m_.dev_G() + begin, m_.dev_P() + begin,
                                                /*average=*/false, /*shard_grads=*/r.zero2, &m_.backend());
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
  // (On a device: the host copies, which refresh_bf16 then sends to the device.)
  for (const Region& r : regions_) host_comm(r).broadcast(m_.P() + r.begin, r.layout.total, 0);
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
  if (inject_nan && rank() == 0) {
    const float nan = std::nanf("");
    m_.backend().to_device(regions_[0].sync->grad_shard(0).data(), &nan, sizeof nan);  // (a memcpy on the CPU)
  }
  // Every region's shards partition its tensors over its ranks, and different regions of the same
  // kind (the ep ranks' experts, the stages' layers) hold different tensors: the sum over every
  // rank is the whole model's.
  double ss = 0;
  for (Region& r : regions_)
    for (int b = 0; b < r.layout.num_buckets(); ++b) {
      std::span<float> g = r.sync->grad_shard(b);
      ss += m_.backend().sum_squares(g.data(), (int64_t)g.size());
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
  if (lo >= hi) return;
  if (m_.on_device()) m_.backend().to_bf16(m_.dev_P() + lo, hi - lo, 1, hi - lo, m_.dev_Pb_mut() + lo);
  else model::to_bf16(m_.P() + lo, m_.params_bf16.data() + lo, hi - lo);
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

double DataParallel::cp_wait_s() const { return m_.context_parallel().wait_ms / 1e3; }

model::ExpertLoad DataParallel::sum_loads(const model::ExpertLoad& load) {
  model::ExpertLoad out = load;
  if (!out.v.empty()) sum(out.v.data(), out.v.size(), Count::PerStage);
  return out;
}

double DataParallel::exposed_wait_s() const {
  double s = wait_s_;
  for (const Region& r : regions_) s += r.sync->exposed_wait_seconds();
  return s + (m_.expert_parallel().wait_ms + m_.tensor_parallel().wait_ms + m_.context_parallel().wait_ms +
               pp_wait_ms_) / 1e3;
}

// The slab range of region kind `kind` (DataParallel::Kind: 0 the shared embedding, 1 the other
// dense tensors, 2 the tensor-parallel split tensors, 3 the held experts) in a layout ([b, b)
// when it has none).
std::pair<int64_t, int64_t> DataParallel::region_bounds(const model::ParamLayout& L, int kind) {
  const int64_t experts_begin = L.expert_sharded() ? L.expert_begin : L.total;
  const int64_t dense_begin = std::max<int64_t>(L.shared_end, 0);
  const int64_t dense_end = L.tp_sharded() ? L.tp_begin : experts_begin;
  if (kind == 0) return {0, std::max<int64_t>(L.shared_end, 0)};
  if (kind == 1) return {dense_begin, dense_end};
  if (kind == 2) return L.tp_sharded() ? std::pair<int64_t, int64_t>{L.tp_begin, experts_begin}
                                       : std::pair<int64_t, int64_t>{0, 0};
  return L.expert_sharded() ? std::pair<int64_t, int64_t>{L.expert_begin, L.total} : std::pair<int64_t, int64_t>{0, 0};
}

}  // namespace trex::train
