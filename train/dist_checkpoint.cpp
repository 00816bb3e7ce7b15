// The checkpoint collectives of a data-parallel run: the sharded AdamW moments gathered to rank 0,
// the whole model a single-rank run would write, and the load that every rank makes. See dist.h.
#include <algorithm>
#include "core/error.h"
#include "train/dist.h"

namespace trex::train {

void DataParallel::gather_region_moments(size_t k, std::vector<float>& m1, std::vector<float>& m2) {
  const Region& R = regions_[k];
  parallel::Communicator& c = host_comm(R);
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
  m_.params_to_host();    // a device's copies (no-ops on the CPU)
  opt_->state_to_host();
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

std::string save_checkpoint(const std::string& run_dir, DataParallel& dp, const TrainState& state, int keep) {
  DataParallel::Gathered g = dp.gather_whole();
  std::string dir;
  if (dp.rank() == 0) {
    const model::Model& m = dp.model();
    dir = save_checkpoint(run_dir, model::WeightsView{m.cfg, g.layout, g.params, m.buffers.data(), &m.kept},
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
