// AVX-512 mHC loops (see kernels/cpu/hyper_conn_avx512.h). Every loop runs 16 columns at a time
// with a masked tail, so no operand needs padding. Products and sums are rounded one at a time,
// in the baseline loops' order (no fused multiply-add): the outputs equal theirs bit for bit. The
// streams of one token ([n, d], 16 KiB at n = 4, d = 1024) stay in L1 while it is mixed: the post
// step reads them n times from there and writes each output once, where the baseline loops made
// n + 1 passes over every output row. The exceptions are the pre step's projection and its input
// gradient, GEMMs with fused multiply-adds (the baseline runs them on sgemm, whose bits differ
// between ISAs anyway). The per-token coefficients run 16 tokens to a vector, one per lane, with
// the scalar code's operations: its bits.
// GCC 12 warns falsely about the _mm512_undefined_ps() inside some intrinsics (GCC PR105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include "kernels/cpu/hyper_conn_avx512.h"
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include "kernels/cpu/simd_avx512.h"
#include "kernels/hyper_conn.h"

namespace trex::kern::cpu {

using avx512::hsum;
using avx512::tail_mask;

// acc += a * b on the lanes of m (a product, then a sum: the baseline loops' two roundings).
inline __m512 mul_add(__m512 acc, __m512 a, __m512 b, __mmask16 m = 0xFFFF) {
  return _mm512_mask_add_ps(acc, m, acc, _mm512_mul_ps(a, b));
}

// Stores an output row's 16 columns that no later pass of this kernel reads: streamed past the
// caches where they fill one aligned line (the rows, 16 KiB a token, outgrow L3 long before
// they are read again, and a cached store reads each line first), else a masked store. Callers
// end with _mm_sfence() so the streamed lines are visible to the threads that read them next.
inline void store_out(float* p, __mmask16 m, __m512 v) {
  if (m == 0xFFFF && (reinterpret_cast<uintptr_t>(p) & 63) == 0) _mm512_stream_ps(p, v);
  else _mm512_mask_storeu_ps(p, m, v);
}

// While columns [i, i + 16) of a token are mixed, the same columns of the next token's streams a
// [n, d], b [n, d] (may be null) and row f [d] are fetched into L2: the streams of one token are
// too short for the hardware prefetchers to ramp up on.
inline void prefetch_next(int n, int64_t d, int64_t i, const float* a, const float* b, const float* f) {
  for (int j = 0; j < n; ++j) {
    _mm_prefetch(reinterpret_cast<const char*>(a + j * d + i), _MM_HINT_T1);
    if (b) _mm_prefetch(reinterpret_cast<const char*>(b + j * d + i), _MM_HINT_T1);
  }
  _mm_prefetch(reinterpret_cast<const char*>(f + i), _MM_HINT_T1);
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

void hc_dots_avx512(int n, int64_t d, const float* a, const float* x, float* out, const float* a_next,
                    const float* x_next) {
  __m512 acc[kHcMaxStreams];
  for (int j = 0; j < n; ++j) acc[j] = _mm512_setzero_ps();
  for (int64_t i = 0; i < d; i += 16) {
    const __mmask16 m = tail_mask(d - i);
    if (x_next) prefetch_next(n, d, i, x_next, nullptr, a_next);
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

namespace {

constexpr int kTokTile = 4;    // tokens of a projection tile
constexpr int kOutTile = kHcProjTile;  // outputs of a tile: 4 x 6 accumulators, 4 + 6 loads per 24 FMAs
constexpr int kOutBlock = 48;  // outputs whose partial sums stay on the stack (12 KiB)

// acc[t][q] (part[t * kOutBlock + q]) += x_t . fn_q over all of K, lane-wise. Row q of the tile
// at f + q rs, its next 16 columns gs floats on (packed: rs 16, gs QN 16; fn itself: rs K, gs 16).
// x_next (may be null): the next tile's tn_next rows, fetched into L2 a line a row per step.
template <int TN, int QN>
void project_tile(int64_t K, const float* x, const float* f, int64_t rs, int64_t gs, __m512* part,
                  const float* x_next, int tn_next) {
  __m512 acc[TN][QN];
  for (int t = 0; t < TN; ++t)
    for (int q = 0; q < QN; ++q) acc[t][q] = part[t * kOutBlock + q];
  int64_t i = 0;
  for (; i + 16 <= K; i += 16, f += gs) {
    if (x_next)
      for (int t = 0; t < tn_next; ++t) _mm_prefetch(reinterpret_cast<const char*>(x_next + t * K + i), _MM_HINT_T1);
    __m512 xv[TN];
    for (int t = 0; t < TN; ++t) xv[t] = _mm512_loadu_ps(x + t * K + i);
    for (int q = 0; q < QN; ++q) {
      const __m512 fv = _mm512_loadu_ps(f + q * rs);
      for (int t = 0; t < TN; ++t) acc[t][q] = _mm512_fmadd_ps(xv[t], fv, acc[t][q]);
    }
  }
  if (i < K) {  // the masked tail (zeros in the other lanes add nothing)
    const __mmask16 m = tail_mask(K - i);
    __m512 xv[TN];
    for (int t = 0; t < TN; ++t) xv[t] = _mm512_maskz_loadu_ps(m, x + t * K + i);
    for (int q = 0; q < QN; ++q) {
      const __m512 fv = _mm512_maskz_loadu_ps(m, f + q * rs);
      for (int t = 0; t < TN; ++t) acc[t][q] = _mm512_fmadd_ps(xv[t], fv, acc[t][q]);
    }
  }
  for (int t = 0; t < TN; ++t)
    for (int q = 0; q < QN; ++q) part[t * kOutBlock + q] = acc[t][q];
}

template <int TN>
void project_tile_q(int qn, int64_t K, const float* x, const float* f, int64_t rs, int64_t gs, __m512* part,
                    const float* x_next, int tn_next) {
  switch (qn) {
    case 1: return project_tile<TN, 1>(K, x, f, rs, gs, part, x_next, tn_next);
    case 2: return project_tile<TN, 2>(K, x, f, rs, gs, part, x_next, tn_next);
    case 3: return project_tile<TN, 3>(K, x, f, rs, gs, part, x_next, tn_next);
    case 4: return project_tile<TN, 4>(K, x, f, rs, gs, part, x_next, tn_next);
    case 5: return project_tile<TN, 5>(K, x, f, rs, gs, part, x_next, tn_next);
    default: return project_tile<TN, kOutTile>(K, x, f, rs, gs, part, x_next, tn_next);
  }
}

int64_t padded16(int64_t K) { return (K + 15) / 16 * 16; }

}  // namespace

int64_t hc_pack_proj_floats(int R, int64_t K) { return R * padded16(K); }

void hc_pack_proj_avx512(int R, int64_t K, const float* fn, float* packed) {
  const int64_t Kp = padded16(K);
  for (int q0 = 0; q0 < R; q0 += kOutTile) {
    const int qn = std::min(kOutTile, R - q0);
    float* tile = packed + q0 * Kp;
    for (int64_t i = 0; i < Kp; i += 16) {
      const __mmask16 m = tail_mask(K - i);
      for (int q = 0; q < qn; ++q)
        _mm512_storeu_ps(tile + (i / 16 * qn + q) * 16, _mm512_maskz_loadu_ps(m, fn + (q0 + q) * K + i));
    }
  }
}

void hc_project_avx512(int R, int64_t K, int64_t tc, const float* x, const float* fn, float* mix, bool packed) {
  static_assert(kOutBlock % kOutTile == 0);
  __m512 part[kTokTile * kOutBlock];
  const int64_t Kp = padded16(K);
  for (int64_t t0 = 0; t0 < tc; t0 += kTokTile) {
    const int tn = static_cast<int>(std::min<int64_t>(kTokTile, tc - t0));
    const int tn_next = static_cast<int>(std::clamp<int64_t>(tc - t0 - kTokTile, 0, kTokTile));
    const float* xt = x + t0 * K;
    for (int q0 = 0; q0 < R; q0 += kOutBlock) {
      const int qb = std::min(kOutBlock, R - q0);
      for (int t = 0; t < tn; ++t)
        for (int q = 0; q < qb; ++q) part[t * kOutBlock + q] = _mm512_setzero_ps();
      for (int q = 0; q < qb; q += kOutTile) {
        const int qn = std::min(kOutTile, qb - q);
        const float* f = packed ? fn + (q0 + q) * Kp : fn + (q0 + q) * K;
        const int64_t rs = packed ? 16 : K, gs = packed ? 16 * qn : 16;
        // the next tile's rows into L2 during the first pass over this one's (read 4 times from L2)
        const float* xn = q0 == 0 && q == 0 && tn_next > 0 ? xt + kTokTile * K : nullptr;
        __m512* pq = part + q;
        switch (tn) {
          case 1: project_tile_q<1>(qn, K, xt, f, rs, gs, pq, xn, tn_next); break;
          case 2: project_tile_q<2>(qn, K, xt, f, rs, gs, pq, xn, tn_next); break;
          case 3: project_tile_q<3>(qn, K, xt, f, rs, gs, pq, xn, tn_next); break;
          default: project_tile_q<kTokTile>(qn, K, xt, f, rs, gs, pq, xn, tn_next); break;
        }
      }
      for (int t = 0; t < tn; ++t)
        for (int q = 0; q < qb; ++q) mix[(t0 + t) * R + q0 + q] = hsum(part[t * kOutBlock + q]);
    }
  }
}

namespace {

constexpr int kDxTok = 8;    // tokens of a dx tile: 8 x 2 accumulators, 2 + 8 loads per 16 FMAs
constexpr int64_t kDxCols = 32;  // columns of a dx tile (a block of the packed fn)
constexpr int64_t kDxAhead = 4 * kDxCols;  // prefetch distance along a token's rows

// One stream's columns [i, i + 32) of dx for TN tokens (see hc_pre_dx_avx512); fb: the packed
// block [R, 32] of fn.
template <int TN>
void pre_dx_tile(int n, int R, int64_t d, int j, int64_t i, const float* dmixs, const float* fb, const float* pre,
                 const float* cx, const float* dy, const float* x, float* dx, bool accumulate, float* pb) {
  const int64_t K = n * d, c = j * d + i;
  const __mmask16 m[2] = {tail_mask(d - i), tail_mask(d - i - 16)};
  __m512 acc[TN][2];
#pragma GCC unroll 8
  for (int t = 0; t < TN; ++t) {
    acc[t][0] = acc[t][1] = _mm512_setzero_ps();
    // the rows' columns 4 tiles on into L2 (the next stream's, or the next token's, at the end)
    for (int64_t o = c + kDxAhead; o < c + kDxAhead + kDxCols; o += 16) {
      _mm_prefetch(reinterpret_cast<const char*>(x + t * K + o), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(dx + t * K + o), _MM_HINT_T1);
    }
  }
  for (int q = 0; q < R; ++q) {
    const __m512 f0 = _mm512_loadu_ps(fb + q * kDxCols), f1 = _mm512_loadu_ps(fb + q * kDxCols + 16);
#pragma GCC unroll 8
    for (int t = 0; t < TN; ++t) {
      const __m512 w = _mm512_set1_ps(dmixs[t * R + q]);
      acc[t][0] = _mm512_fmadd_ps(w, f0, acc[t][0]);
      acc[t][1] = _mm512_fmadd_ps(w, f1, acc[t][1]);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < TN; ++t) {
    const __m512 pv = _mm512_set1_ps(pre[t * n + j]), cv = _mm512_set1_ps(cx[t]);
    for (int h = 0; h < 2; ++h) {
      if (!m[h]) continue;
      float* o = dx + t * K + c + 16 * h;
      const __m512 v = accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(m[h], o), acc[t][h]) : acc[t][h];
      const __m512 cxv = _mm512_mul_ps(cv, _mm512_maskz_loadu_ps(m[h], x + t * K + c + 16 * h));
      const __m512 r =
          dy ? _mm512_add_ps(v, _mm512_sub_ps(_mm512_mul_ps(pv, _mm512_maskz_loadu_ps(m[h], dy + t * d + i + 16 * h)),
                                              cxv))
             : _mm512_sub_ps(v, cxv);
      if (accumulate) _mm512_mask_storeu_ps(o, m[h], r);
      else store_out(o, m[h], r);  // not read first: streamed
    }
  }
  if (!pb) return;
  // dfn's partial, block [R, 32]: pb[q] += sum_t dmixs[t, q] x_t, the tokens in order (x from L1,
  // where the lines just read sit; the rows' own stride, 16 KiB at d = 1024, would share L1 sets)
  __m512 xv[TN][2];
#pragma GCC unroll 8
  for (int t = 0; t < TN; ++t)
    for (int h = 0; h < 2; ++h) xv[t][h] = _mm512_maskz_loadu_ps(m[h], x + t * K + c + 16 * h);
  for (int q = 0; q < R; ++q) {
    __m512 a0 = _mm512_loadu_ps(pb + q * kDxCols), a1 = _mm512_loadu_ps(pb + q * kDxCols + 16);
#pragma GCC unroll 8
    for (int t = 0; t < TN; ++t) {
      const __m512 w = _mm512_set1_ps(dmixs[t * R + q]);
      a0 = _mm512_fmadd_ps(w, xv[t][0], a0);
      a1 = _mm512_fmadd_ps(w, xv[t][1], a1);
    }
    _mm512_storeu_ps(pb + q * kDxCols, a0);
    _mm512_storeu_ps(pb + q * kDxCols + 16, a1);
  }
}

int64_t dx_blocks(int64_t d) { return (d + kDxCols - 1) / kDxCols; }

}  // namespace

int64_t hc_pack_fn_floats(int n, int R, int64_t d) { return n * dx_blocks(d) * R * kDxCols; }

void hc_pack_fn_avx512(int n, int R, int64_t d, const float* fn, float* packed) {
  const int64_t K = n * d, nb = dx_blocks(d);
  for (int j = 0; j < n; ++j)
    for (int64_t b = 0; b < nb; ++b) {
      float* o = packed + (j * nb + b) * R * kDxCols;
      const int64_t i = b * kDxCols, w = std::min(kDxCols, d - i);
      for (int q = 0; q < R; ++q) {
        std::copy(fn + q * K + j * d + i, fn + q * K + j * d + i + w, o + q * kDxCols);
        std::fill(o + q * kDxCols + w, o + (q + 1) * kDxCols, 0.f);
      }
    }
}

void hc_pre_dx_avx512(int n, int R, int64_t d, int64_t tc, const float* dmixs, const float* fn_packed,
                      const float* pre, const float* cx, const float* dy, const float* x, float* dx, bool accumulate,
                      float* dfn_part) {
  struct Fence {  // the streamed rows of an overwritten dx, visible to the threads that read them next
    ~Fence() { _mm_sfence(); }
  } fence;
  const int64_t K = n * d, nb = dx_blocks(d);
  // Column blocks outer, token tiles inner: a block's dfn partial (3 KiB at R = 24) stays in L1
  // for all the tiles; each token's sums still run in token order.
  for (int j = 0; j < n; ++j)
    for (int64_t b = 0; b < nb; ++b) {
      const float* fb = fn_packed + (j * nb + b) * R * kDxCols;
      float* pb = dfn_part ? dfn_part + (j * nb + b) * R * kDxCols : nullptr;
      const int64_t i = b * kDxCols;
      for (int64_t t0 = 0; t0 < tc; t0 += kDxTok) {
        const int64_t tn = std::min<int64_t>(kDxTok, tc - t0);
        const float* dm = dmixs + t0 * R;
        const float* pt = pre + t0 * n;
        const float* ct = cx + t0;
        const float* dyt = dy ? dy + t0 * d : nullptr;
        if (tn == kDxTok) {
          pre_dx_tile<kDxTok>(n, R, d, j, i, dm, fb, pt, ct, dyt, x + t0 * K, dx + t0 * K, accumulate, pb);
          continue;
        }
        for (int64_t t = 0; t < tn; ++t)  // the tail, token by token (the same bits per token)
          pre_dx_tile<1>(n, R, d, j, i, dm + t * R, fb, pt + t * n, ct + t, dyt ? dyt + t * d : nullptr,
                         x + (t0 + t) * K, dx + (t0 + t) * K, accumulate, pb);
      }
    }
}

namespace {

constexpr int kN4 = 4, kNN4 = 16, kR4 = (2 + kN4) * kN4;

// Lane t's offset t * stride into a token-major [tc, stride] array.
inline __m512i lane_offsets(int64_t stride) {
  return _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                            _mm512_set1_epi32(static_cast<int>(stride)));
}
// Column q of a token-major [tc, stride] array as one vector (lane t = token t; lanes >= tc: 0).
inline __m512 load_col(const float* a, int64_t stride, int64_t tc, int q) {
  return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), tail_mask(tc), lane_offsets(stride), a + q, 4);
}
inline void store_col(float* a, int64_t stride, int64_t tc, int q, __m512 v) {
  _mm512_mask_i32scatter_ps(a + q, tail_mask(tc), lane_offsets(stride), v, 4);
}

// std::exp on each lane: the scalar code's bits.
inline __m512 exp_lanes(__m512 v) {
  alignas(64) float a[16];
  _mm512_store_ps(a, v);
  for (float& e : a) e = std::exp(e);
  return _mm512_load_ps(a);
}
// hd::hc_sigmoid: 1 / (1 + exp(-a))
inline __m512 sigmoid(__m512 a) {
  const __m512 one = _mm512_set1_ps(1.f);
  return _mm512_div_ps(one, _mm512_add_ps(one, exp_lanes(_mm512_xor_ps(a, _mm512_set1_ps(-0.f)))));
}

// hd::hc_coeffs_fwd_n<float, 4> on 16 tokens; hist (may be null): [2 iters, 16] vectors.
void coeffs4_fwd(int iters, float eps_s, const __m512* mix, const float* base, const float* scale, __m512* pre,
                 __m512* post, __m512* comb, __m512* hist) {
  const __m512 eps = _mm512_set1_ps(eps_s), s0 = _mm512_set1_ps(scale[0]), s1 = _mm512_set1_ps(scale[1]),
               s2 = _mm512_set1_ps(scale[2]);
  for (int j = 0; j < kN4; ++j)
    pre[j] = _mm512_add_ps(sigmoid(_mm512_add_ps(_mm512_mul_ps(mix[j], s0), _mm512_set1_ps(base[j]))), eps);
  for (int j = 0; j < kN4; ++j)
    post[j] = _mm512_mul_ps(_mm512_set1_ps(2.f), sigmoid(_mm512_add_ps(_mm512_mul_ps(mix[kN4 + j], s1),
                                                                       _mm512_set1_ps(base[kN4 + j]))));
  for (int j = 0; j < kN4; ++j) {
    __m512* c = comb + j * kN4;
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (int k = 0; k < kN4; ++k) {
      const int q = 2 * kN4 + j * kN4 + k;
      c[k] = _mm512_add_ps(_mm512_mul_ps(mix[q], s2), _mm512_set1_ps(base[q]));
      m = _mm512_max_ps(c[k], m);  // c > m ? c : m (max returns its second operand on NaN or equal)
    }
    __m512 s = _mm512_setzero_ps();
    for (int k = 0; k < kN4; ++k) {
      c[k] = exp_lanes(_mm512_sub_ps(c[k], m));
      s = _mm512_add_ps(s, c[k]);
    }
    for (int k = 0; k < kN4; ++k) c[k] = _mm512_div_ps(c[k], s);
  }
  if (hist)
    for (int q = 0; q < kNN4; ++q) hist[q] = comb[q];
  for (int q = 0; q < kNN4; ++q) comb[q] = _mm512_add_ps(comb[q], eps);
  const int steps = 2 * iters - 1;
  for (int st = 0; st < steps; ++st) {
    if (hist)
      for (int q = 0; q < kNN4; ++q) hist[(1 + st) * kNN4 + q] = comb[q];
    if (st % 2 == 0) {  // columns
      __m512 den[kN4];
      for (int k = 0; k < kN4; ++k) den[k] = _mm512_setzero_ps();
      for (int j = 0; j < kN4; ++j)
        for (int k = 0; k < kN4; ++k) den[k] = _mm512_add_ps(den[k], comb[j * kN4 + k]);
      for (int k = 0; k < kN4; ++k) den[k] = _mm512_add_ps(den[k], eps);
      for (int j = 0; j < kN4; ++j)
        for (int k = 0; k < kN4; ++k) comb[j * kN4 + k] = _mm512_div_ps(comb[j * kN4 + k], den[k]);
    } else {  // rows
      for (int j = 0; j < kN4; ++j) {
        __m512 s = _mm512_setzero_ps();
        for (int k = 0; k < kN4; ++k) s = _mm512_add_ps(s, comb[j * kN4 + k]);
        const __m512 dj = _mm512_add_ps(s, eps);
        for (int k = 0; k < kN4; ++k) comb[j * kN4 + k] = _mm512_div_ps(comb[j * kN4 + k], dj);
      }
    }
  }
}

}  // namespace

int64_t hc_coeffs4_scratch_floats(int iters) { return int64_t{2} * iters * kNN4 * kHcLanes; }

void hc_coeffs4_fwd_avx512(int iters, float eps, int64_t tc, const float* mix, const float* base, const float* scale,
                           float* pre, float* post, float* comb) {
  __m512 mv[kR4], pv[kN4], qv[kN4], cv[kNN4];
  for (int q = 0; q < kR4; ++q) mv[q] = load_col(mix, kR4, tc, q);
  coeffs4_fwd(iters, eps, mv, base, scale, pv, qv, cv, nullptr);
  for (int j = 0; j < kN4; ++j) {
    store_col(pre, kN4, tc, j, pv[j]);
    store_col(post, kN4, tc, j, qv[j]);
  }
  for (int q = 0; q < kNN4; ++q) store_col(comb, kNN4, tc, q, cv[q]);
}

void hc_coeffs4_bwd_avx512(int iters, float eps_s, int64_t tc, const float* mix, const float* base, const float* scale,
                           const float* dpre, const float* dpost, const float* dcomb, float* dz, float* pre,
                           float* scratch) {
  __m512 mv[kR4], pr[kN4], po[kN4], cm[kNN4], G[kNN4];
  __m512* hist = reinterpret_cast<__m512*>(scratch);  // [2 iters, 16]
  for (int q = 0; q < kR4; ++q) mv[q] = load_col(mix, kR4, tc, q);
  coeffs4_fwd(iters, eps_s, mv, base, scale, pr, po, cm, hist);
  if (pre)
    for (int j = 0; j < kN4; ++j) store_col(pre, kN4, tc, j, pr[j]);
  for (int q = 0; q < kNN4; ++q) G[q] = dcomb ? load_col(dcomb, kNN4, tc, q) : _mm512_setzero_ps();
  const __m512 eps = _mm512_set1_ps(eps_s);
  for (int st = 2 * iters - 2; st >= 0; --st) {
    const __m512* A = hist + (1 + st) * kNN4;
    if (st % 2 == 0) {  // column step
      __m512 den[kN4], gs[kN4];
      for (int k = 0; k < kN4; ++k) den[k] = gs[k] = _mm512_setzero_ps();
      for (int j = 0; j < kN4; ++j)
        for (int k = 0; k < kN4; ++k) {
          den[k] = _mm512_add_ps(den[k], A[j * kN4 + k]);
          gs[k] = _mm512_add_ps(gs[k], _mm512_mul_ps(G[j * kN4 + k], A[j * kN4 + k]));
        }
      for (int k = 0; k < kN4; ++k) {
        den[k] = _mm512_add_ps(den[k], eps);
        gs[k] = _mm512_div_ps(gs[k], _mm512_mul_ps(den[k], den[k]));
      }
      for (int j = 0; j < kN4; ++j)
        for (int k = 0; k < kN4; ++k)
          G[j * kN4 + k] = _mm512_sub_ps(_mm512_div_ps(G[j * kN4 + k], den[k]), gs[k]);
    } else {  // row step
      for (int j = 0; j < kN4; ++j) {
        __m512 s = _mm512_setzero_ps(), g = _mm512_setzero_ps();
        for (int k = 0; k < kN4; ++k) {
          s = _mm512_add_ps(s, A[j * kN4 + k]);
          g = _mm512_add_ps(g, _mm512_mul_ps(G[j * kN4 + k], A[j * kN4 + k]));
        }
        const __m512 dj = _mm512_add_ps(s, eps), corr = _mm512_div_ps(g, _mm512_mul_ps(dj, dj));
        for (int k = 0; k < kN4; ++k) G[j * kN4 + k] = _mm512_sub_ps(_mm512_div_ps(G[j * kN4 + k], dj), corr);
      }
    }
  }
  const __m512* S = hist;  // the softmax
  for (int j = 0; j < kN4; ++j) {
    __m512 s = _mm512_setzero_ps();
    for (int k = 0; k < kN4; ++k) s = _mm512_add_ps(s, _mm512_mul_ps(G[j * kN4 + k], S[j * kN4 + k]));
    for (int k = 0; k < kN4; ++k)
      store_col(dz, kR4, tc, 2 * kN4 + j * kN4 + k, _mm512_mul_ps(S[j * kN4 + k], _mm512_sub_ps(G[j * kN4 + k], s)));
  }
  const __m512 one = _mm512_set1_ps(1.f), two = _mm512_set1_ps(2.f), s0 = _mm512_set1_ps(scale[0]),
               s1 = _mm512_set1_ps(scale[1]);
  for (int j = 0; j < kN4; ++j) {
    const __m512 sp = sigmoid(_mm512_add_ps(_mm512_mul_ps(mv[j], s0), _mm512_set1_ps(base[j])));
    const __m512 zp = dpre ? _mm512_mul_ps(_mm512_mul_ps(load_col(dpre, kN4, tc, j), sp), _mm512_sub_ps(one, sp))
                           : _mm512_setzero_ps();
    store_col(dz, kR4, tc, j, zp);
    const __m512 sq = sigmoid(_mm512_add_ps(_mm512_mul_ps(mv[kN4 + j], s1), _mm512_set1_ps(base[kN4 + j])));
    const __m512 zq =
        dpost ? _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(load_col(dpost, kN4, tc, j), two), sq), _mm512_sub_ps(one, sq))
              : _mm512_setzero_ps();
    store_col(dz, kR4, tc, kN4 + j, zq);
  }
}

namespace {

// The post step's loops for n streams: NC > 0 takes n as the constant NC (DeepSeek-V4's 4), so the
// loops over streams unroll and the vectors stay in registers; NC = 0 the count at run time. The
// same operations in the same order: the same bits.
template <int NC>
void post_fwd(int n_, int64_t d, int64_t t0, int64_t t1, const float* x, const float* f, const float* post,
                        const float* comb, float* out) {
  const int n = NC > 0 ? NC : n_;
  const int64_t K = n * d;
  __m512 xv[NC > 0 ? NC : kHcMaxStreams];
  for (int64_t t = t0; t < t1; ++t) {
    const float* xt = x + t * K;
    const float* ft = f + t * d;
    const float* cm = comb + t * n * n;
    const float* pt = post + t * n;
    float* ot = out + t * K;
    for (int64_t i = 0; i < d; i += 16) {
      const __mmask16 m = tail_mask(d - i);
      if (t + 1 < t1) prefetch_next(n, d, i, xt + K, nullptr, ft + d);
      const __m512 fv = _mm512_maskz_loadu_ps(m, ft + i);
      for (int j = 0; j < n; ++j) xv[j] = _mm512_maskz_loadu_ps(m, xt + j * d + i);
      for (int k = 0; k < n; ++k) {
        __m512 acc = _mm512_mul_ps(_mm512_set1_ps(pt[k]), fv);
        for (int j = 0; j < n; ++j) acc = mul_add(acc, _mm512_set1_ps(cm[j * n + k]), xv[j]);
        store_out(ot + k * d + i, m, acc);
      }
    }
  }
  _mm_sfence();
}

template <int NC>
void post_bwd(int n_, int64_t d, int64_t t0, int64_t t1, const float* x, const float* f, const float* post,
                        const float* comb, const float* dout, float* dx, float* df, float* dpost, float* dcomb) {
  const int n = NC > 0 ? NC : n_;
  const int64_t K = n * d;
  __m512 gv[NC > 0 ? NC : kHcMaxStreams];
  __m512 acc[(NC > 0 ? NC : kHcMaxStreams) + 1];
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
      if (t + 1 < t1) prefetch_next(n, d, i, xt + K, go + K, ft + d);
      for (int k = 0; k < n; ++k) gv[k] = _mm512_maskz_loadu_ps(m, go + k * d + i);
      store_out(df + t * d + i, m, weighted(n, pt, gv));
      for (int j = 0; j < n; ++j) store_out(dxt + j * d + i, m, weighted(n, cm + j * n, gv));
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
  _mm_sfence();
}

}  // namespace

void hc_post_fwd_avx512(int n, int64_t d, int64_t t0, int64_t t1, const float* x, const float* f, const float* post,
                        const float* comb, float* out) {
  if (n == 4) return post_fwd<4>(n, d, t0, t1, x, f, post, comb, out);
  post_fwd<0>(n, d, t0, t1, x, f, post, comb, out);
}

void hc_post_bwd_avx512(int n, int64_t d, int64_t t0, int64_t t1, const float* x, const float* f, const float* post,
                        const float* comb, const float* dout, float* dx, float* df, float* dpost, float* dcomb) {
  if (n == 4) return post_bwd<4>(n, d, t0, t1, x, f, post, comb, dout, dx, df, dpost, dcomb);
  post_bwd<0>(n, d, t0, t1, x, f, post, comb, dout, dx, df, dpost, dcomb);
}

}  // namespace trex::kern::cpu
