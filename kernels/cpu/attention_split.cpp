// Tile visibility and work split of the flash-attention kernels; see attention_split.h.
#include "kernels/cpu/attention_split.h"

#include <algorithm>

#include "core/error.h"
#include "core/parallel.h"

namespace trex::kern::cpu {

int attn_split_count(int64_t BH, int blocks, int per_thread) {
  const int64_t want = int64_t{per_thread} * num_threads();
  return static_cast<int>(std::clamp<int64_t>((want + BH - 1) / BH, 1, blocks));
}

DqPartials alloc_dq_partials(const AttnShape& sh, int nsplit) {
  DqPartials part(nullptr, &std::free);
  if (nsplit <= 1) return part;
  const int64_t BH = int64_t{sh.B} * sh.H;
  const size_t bytes = (sizeof(float) * BH * nsplit * sh.rows() * sh.Dqk + 63) & ~size_t{63};
  part.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
  TREX_CHECK(part, "attention: cannot allocate ", bytes, " bytes for dq partials");
  return part;
}

void sum_dq_partials(const AttnShape& sh, int nsplit, const float* part, float* dq) {
  const int T = sh.rows(), H = sh.H, Dqk = sh.Dqk;  // T: query rows
  const int64_t BH = int64_t{sh.B} * H;
  parallel_for(BH * T, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t bh = r / T, t = r % T, b = bh / H, h = bh % H;
      float* dst = dq + ((b * T + t) * H + h) * Dqk;
      const float* src = part + bh * nsplit * T * Dqk + t * Dqk;
      for (int d = 0; d < Dqk; ++d) {
        float acc = 0.0f;
        for (int s = 0; s < nsplit; ++s) acc += src[int64_t{s} * T * Dqk + d];
        dst[d] = acc;
      }
    }
  });
}

namespace {

struct SegRange {
  int32_t lo, hi;
};
SegRange seg_range(const int32_t* s, int n) {
  SegRange r{s[0], s[0]};
  for (int i = 1; i < n; ++i) r.lo = std::min(r.lo, s[i]), r.hi = std::max(r.hi, s[i]);
  return r;
}

}  // namespace

int tile_kind(const AttnShape& sh, int qs, int nq, int ks, int nk, const int32_t* segrow) {
  const int qe = qs + nq - 1, ke = ks + nk - 1;
  if (ks > qe) return 0;
  if (sh.window > 0 && ke <= qs - sh.window) return 0;
  bool full = ke <= qs && (sh.window <= 0 || ks > qe - sh.window);
  if (segrow) {
    SegRange a = seg_range(segrow + qs, nq), b = seg_range(segrow + ks, nk);
    if (a.hi < b.lo || b.hi < a.lo) return 0;
    full = full && a.lo == a.hi && b.lo == b.hi && a.lo == b.lo;
  }
  return full ? 2 : 1;
}

}  // namespace trex::kern::cpu
