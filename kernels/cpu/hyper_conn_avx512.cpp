// AVX-512 mHC loops (see kernels/cpu/hyper_conn_avx512.h). Every loop runs 16 columns at a time
// with a masked tail, so no operand needs padding. Products and sums are rounded one at a time,
// in the baseline loops' order (no fused multiply-add): the outputs equal theirs bit for bit. The
// streams of one token ([n, d], 16 KiB at n = 4, d = 1024) stay in L1 while it is mixed: the post
// step reads them n times from there and writes each output once, where the baseline loops made
// n + 1 passes over every output row. The exception is the pre step's projection, a GEMM with
// fused multiply-adds (the baseline runs it on sgemm, whose bits differ between ISAs anyway).
// GCC 12 warns falsely about the _mm512_undefined_ps() inside some intrinsics (GCC PR105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "kernels/cpu/hyper_conn_avx512.h"
#include <immintrin.h>
#include <algorithm>
#include "kernels/cpu/simd_avx512.h"
#include "kernels/hyper_conn.h"

namespace trex::kern::cpu {

using avx512::hsum;
using avx512::tail_mask;

// acc += a * b on the lanes of m (a product, then a sum: the baseline loops' two roundings).
inline __m512 mul_add(__m512 acc, __m512 a, __m512 b, __mmask16 m = 0xFFFF) {
  return _mm512_mask_add_ps(acc, m, acc, _mm512_mul_ps(a, b));
}

// sum_k w[k] v[k] over k < n, in order (n >= 1)
inline __m512 weighted(int n, const float* w, const __m512* v) {
  __m512 s = _mm512_mul_ps(_mm512_set1_ps(w[0]), v[0]);
  for (int k = 1; k < n; ++k) s = mul_add(s, _mm512_set1_ps(w[k]), v[k]);
  return s;
}

float hc_dot_avx512(const float* a, const float* b, int64_t len) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < len; i += 16) {
    const __mmask16 m = tail_mask(len - i);
    acc = mul_add(acc, _mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), m);
  }
  return hsum(acc);
}

void hc_dots_avx512(int n, int64_t d, const float* a, const float* x, float* out) {
  __m512 acc[kHcMaxStreams];
  for (int j = 0; j < n; ++j) acc[j] = _mm512_setzero_ps();
  for (int64_t i = 0; i < d; i += 16) {
    const __mmask16 m = tail_mask(d - i);
    const __m512 av = _mm512_maskz_loadu_ps(m, a + i);
    for (int j = 0; j < n; ++j) acc[j] = mul_add(acc[j], av, _mm512_maskz_loadu_ps(m, x + j * d + i), m);
  }
  for (int j = 0; j < n; ++j) out[j] = hsum(acc[j]);
}

void hc_collapse_avx512(int n, int64_t d, const float* w, const float* x, float* y) {
  for (int64_t i = 0; i < d; i += 16) {
    const __mmask16 m = tail_mask(d - i);
    __m512 acc = _mm512_mul_ps(_mm512_set1_ps(w[0]), _mm512_maskz_loadu_ps(m, x + i));
    for (int j = 1; j < n; ++j) acc = mul_add(acc, _mm512_set1_ps(w[j]), _mm512_maskz_loadu_ps(m, x + j * d + i));
    _mm512_mask_storeu_ps(y + i, m, acc);
  }
}

void hc_dx_update_avx512(int n, int64_t d, const float* p, float c, const float* dy, const float* x, float* dx) {
  const __m512 cv = _mm512_set1_ps(c);
  for (int j = 0; j < n; ++j) {
    const float* xj = x + j * d;
    float* dxj = dx + j * d;
    const __m512 pv = _mm512_set1_ps(p[j]);
    for (int64_t i = 0; i < d; i += 16) {
      const __mmask16 m = tail_mask(d - i);
      const __m512 v = _mm512_maskz_loadu_ps(m, dxj + i), cx = _mm512_mul_ps(cv, _mm512_maskz_loadu_ps(m, xj + i));
      // dx += p dy - c x (dy null: dx -= c x), in the baseline's order
      const __m512 r = dy ? _mm512_add_ps(v, _mm512_sub_ps(_mm512_mul_ps(pv, _mm512_maskz_loadu_ps(m, dy + i)), cx))
                          : _mm512_sub_ps(v, cx);
      _mm512_mask_storeu_ps(dxj + i, m, r);
    }
  }
}

namespace {

constexpr int kTokTile = 4;      // tokens of a projection tile
constexpr int kOutTile = 6;      // outputs of a tile: 4 x 6 accumulators, 4 + 6 loads per 24 FMAs
constexpr int kOutBlock = 48;    // outputs whose partial sums stay on the stack (12 KiB)
constexpr int64_t kKBlock = 512;  // K block: a tile's 4 x and 6 fn rows (20 KiB) stay in L1

// acc[t][q] (part[t * kOutBlock + q]) += x_t[k0, k1) . fn_q[k0, k1), lane-wise.
template <int TN, int QN>
void project_tile(int64_t K, int64_t k0, int64_t k1, const float* x, const float* fn, __m512* part) {
  __m512 acc[TN][QN];
  for (int t = 0; t < TN; ++t)
    for (int q = 0; q < QN; ++q) acc[t][q] = part[t * kOutBlock + q];
  int64_t i = k0;
  for (; i + 16 <= k1; i += 16) {
    __m512 xv[TN];
    for (int t = 0; t < TN; ++t) xv[t] = _mm512_loadu_ps(x + t * K + i);
    for (int q = 0; q < QN; ++q) {
      const __m512 f = _mm512_loadu_ps(fn + q * K + i);
      for (int t = 0; t < TN; ++t) acc[t][q] = _mm512_fmadd_ps(xv[t], f, acc[t][q]);
    }
  }
  if (i < k1) {  // the masked tail (zeros in the other lanes add nothing)
    const __mmask16 m = tail_mask(k1 - i);
    __m512 xv[TN];
    for (int t = 0; t < TN; ++t) xv[t] = _mm512_maskz_loadu_ps(m, x + t * K + i);
    for (int q = 0; q < QN; ++q) {
      const __m512 f = _mm512_maskz_loadu_ps(m, fn + q * K + i);
      for (int t = 0; t < TN; ++t) acc[t][q] = _mm512_fmadd_ps(xv[t], f, acc[t][q]);
    }
  }
  for (int t = 0; t < TN; ++t)
    for (int q = 0; q < QN; ++q) part[t * kOutBlock + q] = acc[t][q];
}

template <int TN>
void project_tile_q(int qn, int64_t K, int64_t k0, int64_t k1, const float* x, const float* fn, __m512* part) {
  switch (qn) {
    case 1: return project_tile<TN, 1>(K, k0, k1, x, fn, part);
    case 2: return project_tile<TN, 2>(K, k0, k1, x, fn, part);
    case 3: return project_tile<TN, 3>(K, k0, k1, x, fn, part);
    case 4: return project_tile<TN, 4>(K, k0, k1, x, fn, part);
    case 5: return project_tile<TN, 5>(K, k0, k1, x, fn, part);
    default: return project_tile<TN, kOutTile>(K, k0, k1, x, fn, part);
  }
}

}  // namespace

void hc_project_avx512(int R, int64_t K, int64_t tc, const float* x, const float* fn, float* mix) {
  static_assert(kOutBlock % kOutTile == 0);
  __m512 part[kTokTile * kOutBlock];
  for (int64_t t0 = 0; t0 < tc; t0 += kTokTile) {
    const int tn = static_cast<int>(std::min<int64_t>(kTokTile, tc - t0));
    const float* xt = x + t0 * K;
    for (int q0 = 0; q0 < R; q0 += kOutBlock) {
      const int qb = std::min(kOutBlock, R - q0);
      for (int t = 0; t < tn; ++t)
        for (int q = 0; q < qb; ++q) part[t * kOutBlock + q] = _mm512_setzero_ps();
      for (int64_t k0 = 0; k0 < K; k0 += kKBlock) {
        const int64_t k1 = std::min(K, k0 + kKBlock);
        for (int q = 0; q < qb; q += kOutTile) {
          const int qn = std::min(kOutTile, qb - q);
          const float* fq = fn + (q0 + q) * K;
          __m512* pq = part + q;
          switch (tn) {
            case 1: project_tile_q<1>(qn, K, k0, k1, xt, fq, pq); break;
            case 2: project_tile_q<2>(qn, K, k0, k1, xt, fq, pq); break;
            case 3: project_tile_q<3>(qn, K, k0, k1, xt, fq, pq); break;
            default: project_tile_q<kTokTile>(qn, K, k0, k1, xt, fq, pq); break;
          }
        }
      }
      for (int t = 0; t < tn; ++t)
        for (int q = 0; q < qb; ++q) mix[(t0 + t) * R + q0 + q] = hsum(part[t * kOutBlock + q]);
    }
  }
}

void hc_post_fwd_avx512(int n, int64_t d, int64_t t0, int64_t t1, const float* x, const float* f, const float* post,
                        const float* comb, float* out) {
  const int64_t K = n * d;
  __m512 xv[kHcMaxStreams];
  for (int64_t t = t0; t < t1; ++t) {
    const float* xt = x + t * K;
    const float* ft = f + t * d;
    const float* cm = comb + t * n * n;
    const float* pt = post + t * n;
    float* ot = out + t * K;
    for (int64_t i = 0; i < d; i += 16) {
      const __mmask16 m = tail_mask(d - i);
      const __m512 fv = _mm512_maskz_loadu_ps(m, ft + i);
      for (int j = 0; j < n; ++j) xv[j] = _mm512_maskz_loadu_ps(m, xt + j * d + i);
      for (int k = 0; k < n; ++k) {
        __m512 acc = _mm512_mul_ps(_mm512_set1_ps(pt[k]), fv);
        for (int j = 0; j < n; ++j) acc = mul_add(acc, _mm512_set1_ps(cm[j * n + k]), xv[j]);
        _mm512_mask_storeu_ps(ot + k * d + i, m, acc);
      }
    }
  }
}

void hc_post_bwd_avx512(int n, int64_t d, int64_t t0, int64_t t1, const float* x, const float* f, const float* post,
                        const float* comb, const float* dout, float* dx, float* df, float* dpost, float* dcomb) {
  const int64_t K = n * d;
  __m512 gv[kHcMaxStreams];
  __m512 acc[kHcMaxStreams + 1];
  for (int64_t t = t0; t < t1; ++t) {
    const float* xt = x + t * K;
    const float* ft = f + t * d;
    const float* go = dout + t * K;
    const float* cm = comb + t * n * n;
    const float* pt = post + t * n;
    float* dxt = dx + t * K;
    // df and dx: each output column once, the token's gradient rows from L1.
    for (int64_t i = 0; i < d; i += 16) {
      const __mmask16 m = tail_mask(d - i);
      for (int k = 0; k < n; ++k) gv[k] = _mm512_maskz_loadu_ps(m, go + k * d + i);
      _mm512_mask_storeu_ps(df + t * d + i, m, weighted(n, pt, gv));
      for (int j = 0; j < n; ++j) _mm512_mask_storeu_ps(dxt + j * d + i, m, weighted(n, cm + j * n, gv));
    }
    // dpost[k] = g_k . f and dcomb[j][k] = g_k . x_j: one pass per k over g_k, f and the streams.
    for (int k = 0; k < n; ++k) {
      const float* gk = go + k * d;
      for (int j = 0; j <= n; ++j) acc[j] = _mm512_setzero_ps();
      for (int64_t i = 0; i < d; i += 16) {
        const __mmask16 m = tail_mask(d - i);
        const __m512 g = _mm512_maskz_loadu_ps(m, gk + i);
        acc[n] = mul_add(acc[n], g, _mm512_maskz_loadu_ps(m, ft + i), m);
        for (int j = 0; j < n; ++j) acc[j] = mul_add(acc[j], g, _mm512_maskz_loadu_ps(m, xt + j * d + i), m);
      }
      dpost[t * n + k] = hsum(acc[n]);
      for (int j = 0; j < n; ++j) dcomb[(t * n + j) * n + k] = hsum(acc[j]);
    }
  }
}

}  // namespace trex::kern::cpu
