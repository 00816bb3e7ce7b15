// AVX-512 mHC loops (see kernels/cpu/hyper_conn_avx512.h). Every loop runs 16 columns at a time
// with a masked tail, so no operand needs padding. Products and sums are rounded one at a time,
// in the baseline loops' order (no fused multiply-add): the outputs equal theirs bit for bit. The streams of one token ([n, d], 16 KiB at
// n = 4, d = 1024) stay in L1 while it is mixed: the post step reads them n times from there and
// writes each output once, where the baseline loops made n + 1 passes over every output row.
// GCC 12 warns falsely about the _mm512_undefined_ps() inside some intrinsics (GCC PR105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "kernels/cpu/hyper_conn_avx512.h"
#include <immintrin.h>
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
