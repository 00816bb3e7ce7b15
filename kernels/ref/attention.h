// Scalar reference for causal (optionally windowed, optionally document-packed) softmax
// attention: the canonical definition that the fast kernels are tested against.
// Layout [B, T, H, D] row-major (token-major). Query t of batch row b attends key s iff
//   s <= t  and  (seg == nullptr || seg[b,s] == seg[b,t])  and  (window <= 0 || s > t - window).
// Forward: o[t] = sum_s softmax_s(scale * q[t].k[s]) v[s];  lse[t] = log sum_s exp(scale *
// q[t].k[s]). Backward: activation gradients dq, dk, dv OVERWRITE (attention has no parameters). A
// row with no visible key (impossible with causal + seg, guarded anyway) gives o = 0, lse = -inf
// and zero gradients.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/attention.h"

namespace trex::kern::ref {

// Whether query t may attend key s of batch row b.
inline bool attn_visible(const AttnShape& sh, const int32_t* seg, int b, int t, int s) {
  if (s > t) return false;
  if (sh.window > 0 && s <= t - sh.window) return false;
  if (seg && seg[static_cast<int64_t>(b) * sh.T + s] != seg[static_cast<int64_t>(b) * sh.T + t])
    return false;
  return true;
}

// q: [B,T,H,Dqk]  k: [B,T,H,Dqk]  v: [B,T,H,Dv]  seg: [B,T] or null -> o: [B,T,H,Dv]  lse: [B,H,T]
template <class F>
void attention_fwd(const AttnShape& sh, const F* q, const F* k, const F* v, F* o, F* lse,
                   const int32_t* seg = nullptr) {
  const int B = sh.B, T = sh.T, H = sh.H, Dqk = sh.Dqk, Dv = sh.Dv;
  const F scale = static_cast<F>(sh.scale);
  std::vector<F> s(T);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int t = 0; t < T; ++t) {
        const F* qt = q + ((static_cast<int64_t>(b) * T + t) * H + h) * Dqk;
        F* ot = o + ((static_cast<int64_t>(b) * T + t) * H + h) * Dv;
        F m = -std::numeric_limits<F>::infinity();
        for (int j = 0; j <= t; ++j) {
          if (!attn_visible(sh, seg, b, t, j)) continue;
          const F* kj = k + ((static_cast<int64_t>(b) * T + j) * H + h) * Dqk;
          F acc = 0;
          for (int d = 0; d < Dqk; ++d) acc += qt[d] * kj[d];
          s[j] = scale * acc;
          if (s[j] > m) m = s[j];
        }
        for (int d = 0; d < Dv; ++d) ot[d] = 0;
        F l = 0;
        if (m != -std::numeric_limits<F>::infinity()) {
          for (int j = 0; j <= t; ++j) {
            if (!attn_visible(sh, seg, b, t, j)) continue;
            F p = std::exp(s[j] - m);
            l += p;
            const F* vj = v + ((static_cast<int64_t>(b) * T + j) * H + h) * Dv;
            for (int d = 0; d < Dv; ++d) ot[d] += p * vj[d];
          }
          for (int d = 0; d < Dv; ++d) ot[d] /= l;
        }
        lse[(static_cast<int64_t>(b) * H + h) * T + t] =
            l > 0 ? m + std::log(l) : -std::numeric_limits<F>::infinity();
      }
}

// q, k: [B,T,H,Dqk]  v: [B,T,H,Dv]  o: [B,T,H,Dv]  lse: [B,H,T]  dO: [B,T,H,Dv]  seg: [B,T] or null
// -> dq, dk: [B,T,H,Dqk]  dv: [B,T,H,Dv] (overwritten). `o` is unused here (the reference
// forms delta = sum_s P dP from its definition); the fast kernel uses delta = dO . o.
template <class F>
void attention_bwd(const AttnShape& sh, const F* q, const F* k, const F* v, const F* o,
                   const F* lse, const F* dO, F* dq, F* dk, F* dv, const int32_t* seg = nullptr) {
  (void)o;
  const int B = sh.B, T = sh.T, H = sh.H, Dqk = sh.Dqk, Dv = sh.Dv;
  const F scale = static_cast<F>(sh.scale);
  const int64_t nqk = static_cast<int64_t>(B) * T * H * Dqk,
                nv = static_cast<int64_t>(B) * T * H * Dv;
  for (int64_t i = 0; i < nqk; ++i) dq[i] = dk[i] = 0;
  for (int64_t i = 0; i < nv; ++i) dv[i] = 0;
  std::vector<F> p(T), dp(T);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int t = 0; t < T; ++t) {
        const int64_t rt = (static_cast<int64_t>(b) * T + t) * H + h;
        const F* qt = q + rt * Dqk;
        const F* dOt = dO + rt * Dv;
        const F L = lse[(static_cast<int64_t>(b) * H + h) * T + t];
        if (L == -std::numeric_limits<F>::infinity()) continue;
        F delta = 0;
        for (int j = 0; j <= t; ++j) {
          p[j] = dp[j] = 0;
          if (!attn_visible(sh, seg, b, t, j)) continue;
          const int64_t rj = (static_cast<int64_t>(b) * T + j) * H + h;
          F acc = 0, accv = 0;
          for (int d = 0; d < Dqk; ++d) acc += qt[d] * k[rj * Dqk + d];
          for (int d = 0; d < Dv; ++d) accv += dOt[d] * v[rj * Dv + d];
          p[j] = std::exp(scale * acc - L);
          dp[j] = accv;
          delta += p[j] * accv;
        }
        for (int j = 0; j <= t; ++j) {
          if (!attn_visible(sh, seg, b, t, j)) continue;
          const int64_t rj = (static_cast<int64_t>(b) * T + j) * H + h;
          const F ds = p[j] * (dp[j] - delta) * scale;  // d loss / d (q.k)
          for (int d = 0; d < Dqk; ++d) {
            dq[rt * Dqk + d] += ds * k[rj * Dqk + d];
            dk[rj * Dqk + d] += ds * qt[d];
          }
          for (int d = 0; d < Dv; ++d) dv[rj * Dv + d] += p[j] * dOt[d];
        }
      }
}

}  // namespace trex::kern::ref
