#include "train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <vector>
#include "kernels/adamw.h"

namespace trex::train {

AdamW::AdamW(const model::Model& m, AdamWConfig c) : cfg(c) {
  const SlabRange all{0, m.layout.total};
  init(m, std::span<const SlabRange>(&all, 1));
  owns_all_ = true;
}

AdamW::AdamW(const model::Model& m, AdamWConfig c, std::span<const SlabRange> owned) : cfg(c) { init(m, owned); }

void AdamW::init(const model::Model& m, std::span<const SlabRange> owned) {
  owned_.assign(owned.begin(), owned.end());
  // Entries sorted by offset (they are disjoint; sub-views of one slab are listed separately).
  std::vector<int> order(m.layout.entries.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = (int)i;
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return m.layout.entries[a].offset < m.layout.entries[b].offset; });
  int64_t state = 0;
  for (const SlabRange& r : owned_) {
    TREX_CHECK(r.begin >= 0 && r.end >= r.begin, "AdamW: bad owned range [", r.begin, ", ", r.end, ")");
    // First entry ending after r.begin.
    auto it = std::partition_point(order.begin(), order.end(), [&](int i) {
      const model::ParamEntry& e = m.layout.entries[i];
      return e.offset + e.shape.numel() <= r.begin;
    });
    for (; it != order.end(); ++it) {
      const model::ParamEntry& e = m.layout.entries[*it];
      if (e.offset >= r.end) break;
      const int64_t lo = std::max<int64_t>(r.begin, e.offset), hi = std::min<int64_t>(r.end, e.offset + e.shape.numel());
      if (lo < hi) pieces_.push_back({lo, hi - lo, state + (lo - r.begin), *it, e.decay, e.frozen});
    }
    state += r.size();
  }
  state_elems_ = state;
  m1.reserve("adam_m", (size_t)state * sizeof(float));
  m2.reserve("adam_v", (size_t)state * sizeof(float));
  m1.zero();
  m2.zero();
}

double grad_norm(const model::Model& m) {
  // One backend call over every tensor (a device answers with one wait, not one per tensor).
  std::vector<int64_t> off, n;
  for (const model::ParamEntry& e : m.layout.entries) off.push_back(e.offset), n.push_back(e.shape.numel());
  return std::sqrt(m.backend().sum_squares_segments(m.dev_G(), off.data(), n.data(), (int)off.size()));
}

double AdamW::step(model::Model& m, float lr) {
  TREX_CHECK(owns_all_, "AdamW::step on a sharded optimizer: use apply() with the global gradient norm");
  const double norm = grad_norm(m);
  apply(m, lr, norm);
  return norm;
}

bool AdamW::apply(model::Model& m, float lr, double norm) {
  if (!std::isfinite(norm)) return false;
  float scale = 1.f;
  if (cfg.clip_grad_norm > 0) {
    double coef = cfg.clip_grad_norm / (norm + 1e-6);
    if (coef < 1.0) scale = (float)coef;
  }
  ++t_;
  float* M = M1();
  float* Vv = M2();
  kern::Backend& be = m.backend();
  if (m.on_device()) {  // the moments in the backend's memory, sent there when the host's changed
    const size_t n = (size_t)state_elems_;
    if (dm1_.size() != n || dev_stale_) {
      dm1_ = kern::DeviceBuffer<float>(be, n), dm2_ = kern::DeviceBuffer<float>(be, n);
      dm1_.upload(M), dm2_.upload(Vv);
      dev_stale_ = false;
    }
    M = dm1_.get(), Vv = dm2_.get();
  }
  bf16* Pb = m.dev_Pb_mut();
  for (const AdamWPiece& e : pieces_) {
    if (e.frozen) continue;
    kern::AdamWParams p{lr, cfg.beta1, cfg.beta2, cfg.eps, e.decay ? cfg.weight_decay : 0.f, t_, scale};
    be.adamw_step(p, m.dev_P() + e.off, m.dev_G() + e.off, M + e.state, Vv + e.state, e.n, Pb ? Pb + e.off : nullptr);
  }
  return true;
}

void AdamW::state_to_host() {
  if (dm1_.size() == 0 || dev_stale_) return;  // the host's copies are the newest
  dm1_.download(M1()), dm2_.download(M2());
}

}  // namespace trex::train
