// Scalar reference for DeepSeek-V4's gated window pooling (the canonical definition), as in
// Hugging Face DeepseekV4HCACompressor / DeepseekV4CSACompressor / DeepseekV4Indexer with no
// cache (training). Inputs kv, gate: [B, T, c*hd] (the caller's kv_proj / gate_proj outputs),
// position bias pb: [m, c*hd]; nw = T / m windows (trailing T % m tokens are dropped).
//   c = 1 (HCA): window w has m slots r: value kv[b, w*m+r, d], logit gate[b, w*m+r, d] + pb[r, d].
//   c = 2 (CSA, indexer): window w has 2m slots:
//     r < m  ("Ca" of window w-1, only for w > 0): value kv[b, (w-1)*m+r, d],
//            logit gate[b, (w-1)*m+r, d] + pb[r, d]
//            (HF fills w = 0 with kv 0 and logit -inf, i.e. softmax weight exactly 0: skipped here)
//     m + r  ("Cb" of window w): value kv[b, w*m+r, hd+d], logit gate[b, w*m+r, hd+d] + pb[r, hd+d]
//   out[b, w, d] = sum_slots softmax_slots(logit)[slot] * value[slot]   (per channel d < hd)
// Backward with p = softmax weights and o = out:
//   dvalue[slot] = p * dout;  dlogit[slot] = p * dout * (value - o)
//   dkv, dgate at each slot's source element = dvalue, dlogit (every element of kv / gate feeds at
//   most one slot); elements feeding no slot (trailing tokens; for c = 2 the Ca half of the last
//   window) get 0. dkv, dgate OVERWRITE (activation gradients); dpb[r, col] += sum over
//   (b, w) of dlogit (parameter gradient: ACCUMULATES).
// NaN / Inf propagate as in torch's softmax: a NaN logit or value makes that window channel NaN;
// -inf logits get weight 0 unless all slots of the channel are -inf (then NaN).
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include "kernels/hd/compress_pool.h"

namespace trex::kern::ref {

// Calls f(value, logit, kv_index, pb_index) for every slot of window w, channel d
// (kernels/hd/compress_pool.h, which the CUDA kernels run too).
template <class T, class F>
void compress_pool_slots(int64_t b, int64_t w, int64_t d, int64_t Tn, int64_t m, int64_t hd, int c, const T* kv,
                         const T* gate, const T* pb, F&& f) {
  int64_t i, ip;
  for (int64_t s = 0; s < hd::compress_pool_nslots(m, c); ++s)
    if (hd::compress_pool_slot(b, w, d, Tn, m, hd, c, s, &i, &ip)) f(kv[i], gate[i] + pb[ip], i, ip);
}

// Softmax statistics of window w, channel d: max logit and sum of exp(logit - max).
using hd::compress_pool_stats;

// kv, gate: [B, T, c*hd]  pb: [m, c*hd] -> out: [B, T/m, hd]
template <class T>
void compress_pool_fwd(int64_t B, int64_t Tn, int64_t m, int64_t hd, int c, const T* kv, const T* gate, const T* pb,
                       T* out) {
  const int64_t nw = Tn / m;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t w = 0; w < nw; ++w)
      for (int64_t d = 0; d < hd; ++d) {
        T mx, sum, o;
        compress_pool_stats<T>(b, w, d, Tn, m, hd, c, kv, gate, pb, mx, sum, o);
        out[(b * nw + w) * hd + d] = o;
      }
}

// kv, gate: [B, T, c*hd]  pb: [m, c*hd]  dout: [B, T/m, hd]
//   -> dkv, dgate: [B, T, c*hd] (overwritten)  dpb: [m, c*hd] (+=)
template <class T>
void compress_pool_bwd(int64_t B, int64_t Tn, int64_t m, int64_t hd, int c, const T* kv, const T* gate, const T* pb,
                       const T* dout, T* dkv, T* dgate, T* dpb) {
  const int64_t nw = Tn / m, C = c * hd;
  for (int64_t i = 0; i < B * Tn * C; ++i) dkv[i] = dgate[i] = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t w = 0; w < nw; ++w)
      for (int64_t d = 0; d < hd; ++d) {
        T mx, sum, o;
        compress_pool_stats<T>(b, w, d, Tn, m, hd, c, kv, gate, pb, mx, sum, o);
        const T g = dout[(b * nw + w) * hd + d];
        compress_pool_slots<T>(b, w, d, Tn, m, hd, c, kv, gate, pb, [&](T v, T l, int64_t i, int64_t ip) {
          const T p = std::exp(l - mx) / sum;
          const T dl = p * g * (v - o);
          dkv[i] = p * g;
          dgate[i] = dl;
          dpb[ip] += dl;
        });
      }
}

}  // namespace trex::kern::ref
