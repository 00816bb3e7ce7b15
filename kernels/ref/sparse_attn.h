// Scalar reference for sparse shared-KV multi-query attention with an attention sink (the
// DeepSeek-V4 attention core; semantics in kernels/sparse_attn.h): the canonical definition the
// fast kernel is tested against. Plain loops, one (query, head) at a time.
// Forward: s_j = scale q[i,h].kv[idx_j], lse = log(sum_j exp(s_j) + exp(sink[h])),
//          o[i,h] = sum_j exp(s_j - lse) kv[idx_j]  (o = 0 for a query without keys).
// Backward (autograd of the above, K = V = kv): with p_j = exp(s_j - lse), dp_j = dO.kv[idx_j],
// delta = sum_j p_j dp_j (= dO.o) and ds_j = p_j (dp_j - delta):
//   dq[i,h]      = scale sum_j ds_j kv[idx_j]                              (OVERWRITES)
//   dkv[idx_j]  += scale ds_j q[i,h] + p_j dO[i,h]    (key and value part)  (ACCUMULATES)
//   dsink[h]    += -exp(sink[h] - lse) delta                                (ACCUMULATES)
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/sparse_attn.h"

namespace trex::kern::ref {

// q: [N,H,D]  kv: [M,D]  off: [N+1]  idx: [off[N]]  sink: [H] or null -> o: [N,H,D]  lse: [N,H]
template <class T>
void sparse_attn_fwd(const SparseAttnShape& sh, const T* q, const T* kv, int64_t M,
                     const int64_t* off, const int32_t* idx, const T* sink, T* o, T* lse) {
  (void)M;
  const int H = sh.H, D = sh.D;
  const T scale = static_cast<T>(sh.scale), ninf = -std::numeric_limits<T>::infinity();
  std::vector<T> s;
  for (int64_t i = 0; i < sh.N; ++i) {
    const int64_t b = off[i], n = off[i + 1] - off[i];
    s.resize(static_cast<size_t>(n));
    for (int h = 0; h < H; ++h) {
      const T* qh = q + (i * H + h) * D;
      T* oh = o + (i * H + h) * D;
      T m = sink ? sink[h] : ninf;
      for (int64_t j = 0; j < n; ++j) {
        const T* kj = kv + static_cast<int64_t>(idx[b + j]) * D;
        T acc = 0;
        for (int d = 0; d < D; ++d) acc += qh[d] * kj[d];
        s[j] = scale * acc;
        if (s[j] > m) m = s[j];
      }
      for (int d = 0; d < D; ++d) oh[d] = 0;
      if (m == ninf) {  // no key and no sink
        lse[i * H + h] = ninf;
        continue;
      }
      T l = sink ? std::exp(sink[h] - m) : T(0);
      for (int64_t j = 0; j < n; ++j) {
        const T p = std::exp(s[j] - m);
        l += p;
        const T* kj = kv + static_cast<int64_t>(idx[b + j]) * D;
        for (int d = 0; d < D; ++d) oh[d] += p * kj[d];
      }
      for (int d = 0; d < D; ++d) oh[d] /= l;
      lse[i * H + h] = m + std::log(l);
    }
  }
}

// q: [N,H,D]  kv: [M,D]  off, idx, sink: as in forward  o: [N,H,D]  lse: [N,H]  dO: [N,H,D]
// -> dq: [N,H,D] (overwritten)  dkv: [M,D] (+=)  dsink: [H] (+=; null iff sink is null).
// `o` is unused here: delta is formed from its definition (sum_j p_j dp_j); the fast kernel
// uses delta = dO.o.
template <class T>
void sparse_attn_bwd(const SparseAttnShape& sh, const T* q, const T* kv, int64_t M,
                     const int64_t* off, const int32_t* idx, const T* sink, const T* o,
                     const T* lse, const T* dO, T* dq, T* dkv, T* dsink) {
  (void)M, (void)o;
  const int H = sh.H, D = sh.D;
  const T scale = static_cast<T>(sh.scale), ninf = -std::numeric_limits<T>::infinity();
  std::vector<T> p, dp;
  for (int64_t i = 0; i < sh.N; ++i) {
    const int64_t b = off[i], n = off[i + 1] - off[i];
    p.resize(static_cast<size_t>(n)), dp.resize(static_cast<size_t>(n));
    for (int h = 0; h < H; ++h) {
      const T* qh = q + (i * H + h) * D;
      const T* dOh = dO + (i * H + h) * D;
      T* dqh = dq + (i * H + h) * D;
      for (int d = 0; d < D; ++d) dqh[d] = 0;
      const T L = lse[i * H + h];
      if (L == ninf) continue;
      T delta = 0;
      for (int64_t j = 0; j < n; ++j) {
        const T* kj = kv + static_cast<int64_t>(idx[b + j]) * D;
        T acc = 0, accv = 0;
        for (int d = 0; d < D; ++d) acc += qh[d] * kj[d], accv += dOh[d] * kj[d];
        p[j] = std::exp(scale * acc - L);
        dp[j] = accv;
        delta += p[j] * accv;
      }
      for (int64_t j = 0; j < n; ++j) {
        const int64_t r = idx[b + j];
        const T ds = p[j] * (dp[j] - delta) * scale;  // d loss / d (q.k)
        for (int d = 0; d < D; ++d) {
          dqh[d] += ds * kv[r * D + d];
          dkv[r * D + d] += ds * qh[d] + p[j] * dOh[d];
        }
      }
      if (sink) dsink[h] += -std::exp(sink[h] - L) * delta;
    }
  }
}

}  // namespace trex::kern::ref
