// AVX-512 flash attention (FlashAttention-2 style), forward and backward; see kernels/attention.h.
//
// Tiles are kB x kB (queries x keys). Every matrix product of a tile goes through one register-
// blocked micro-kernel (6 rows x 64 columns of fp32 accumulators), C[m, n] (+)= A[m, k] B[k, n],
// with A read by broadcast under any strides and B rows read as vectors; while it runs it
// prefetches the next tile's operands into L2. Rows of [B,T,H,D] are H*D floats apart (a page or
// more apart for real shapes), out of reach of the hardware prefetchers and hard on the TLB, so
// each work item packs the rows of its (b, h) that tiles reuse into contiguous per-thread panels
// ([t][D], huge pages where the OS allows) and works from those:
//   forward  (items: (b, h), split into interleaved query-block chunks only when B*H is small):
//            query blocks in increasing order, packing the k, v rows each adds. Per query block
//            Q^T is packed and each key tile computes S^T = K Q^T [keys x queries], so the online
//            softmax runs down columns with one lane per query (no horizontal reductions), then
//            O += P V with A = P^T read transposed. m, l are kept in log2 units (exp2 of a
//            pre-scaled exponent: a degree-6 polynomial and vscalefps).
//   backward (items: (b, h), split into interleaved key-block sets only when B*H is small): q, dO
//            rows are packed and delta = rowsum(dO o) formed once per item; per key block K^T,
//            V^T and K are packed; per query tile S = Q K^T and dP = dO V^T, P = exp(S - lse),
//            dS = P (dP - delta) scale, then dV += P^T dO and dK += dS^T Q into key-tile
//            accumulators and dQ += dS K into a per-item dq panel, written out (or summed across
//            splits) at the end. No race: a (b, h, key block) belongs to one item.
// Key tiles no query of the tile can see (causal, window, disjoint document ids) are skipped,
// masks are built only for partly visible tiles, and products on the causal diagonal skip the
// masked triangle (to micro-kernel granularity).
#include "kernels/cpu/attention_avx512.h"
#include "kernels/cpu/attention_split.h"
// GCC 12 reports the _mm512_undefined_ps() idiom inside its own intrinsics as (maybe-)
// uninitialized; the warnings point into the header, so silencing them there is enough.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>

#include "core/error.h"
#include "core/parallel.h"

namespace trex::kern::cpu {
namespace {

constexpr int kB = 64;  // rows of a query tile and keys of a key tile
constexpr int kR = 6;   // micro-kernel rows (broadcast operand); 6 x 4 beat 12 x 2 and 8 x 3 here
constexpr int kNV = 4;  // micro-kernel vectors of 16 columns
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline int64_t round16(int64_t n) { return (n + 15) & ~int64_t{15}; }

// 2^x for x <= 0 (larger x is fine up to overflow): x = n + f, f in [-1/2, 1/2], 2^f by a
// degree-6 polynomial (Cephes exp2f coefficients; measured max relative error 8e-8 on [-40, 0]),
// scaled by 2^n with vscalefps (which flushes very negative n to 0). -inf gives NaN; callers
// clamp where it can occur.
inline __m512 exp2_ps(__m512 x) {
  __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

inline __mmask16 tail_mask(int w) { return w >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << w) - 1); }

// C[r, 0:16*NV] (+)= sum_k A[r*sam + k*sak] * B[k*ldb + 0:16*NV] for r < R; the last vector of
// each row of B and C is limited to the lanes in `mlast`. Step k also prefetches the cache line
// pf + 64 k into L2 (the caller points pf at the next tile's operands).
template <int R, int NV, bool ACC>
void micro(int K, const float* A, int64_t sam, int64_t sak, const float* B, int64_t ldb, float* C,
           int64_t ldc, __mmask16 mlast, const char* pf) {
  __m512 c[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      c[r][v] = ACC ? _mm512_maskz_loadu_ps(v == NV - 1 ? mlast : 0xFFFF, C + r * ldc + 16 * v)
                    : _mm512_setzero_ps();
  for (int k = 0; k < K; ++k) {
    _mm_prefetch(pf + 64 * k, _MM_HINT_T1);
    __m512 b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      b[v] = v == NV - 1 ? _mm512_maskz_loadu_ps(mlast, B + k * ldb + 16 * v)
                         : _mm512_loadu_ps(B + k * ldb + 16 * v);
    const float* a = A + k * sak;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      __m512 ar = _mm512_set1_ps(a[r * sam]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) c[r][v] = _mm512_fmadd_ps(ar, b[v], c[r][v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      if (v == NV - 1)
        _mm512_mask_storeu_ps(C + r * ldc + 16 * v, mlast, c[r][v]);
      else
        _mm512_storeu_ps(C + r * ldc + 16 * v, c[r][v]);
    }
}

using MicroFn = void (*)(int, const float*, int64_t, int64_t, const float*, int64_t, float*,
                         int64_t, __mmask16, const char*);

template <bool ACC, int R, int... Vs>
constexpr std::array<MicroFn, kNV> micro_row(std::integer_sequence<int, Vs...>) {
  return {{&micro<R, Vs + 1, ACC>...}};
}
template <bool ACC, int... Rs>
constexpr auto micro_table(std::integer_sequence<int, Rs...>) {
  return std::array<std::array<MicroFn, kNV>, sizeof...(Rs)>{
      {micro_row<ACC, Rs + 1>(std::make_integer_sequence<int, kNV>{})...}};
}
constexpr auto kMicroSet = micro_table<false>(std::make_integer_sequence<int, kR>{});
constexpr auto kMicroAcc = micro_table<true>(std::make_integer_sequence<int, kR>{});

// Triangular trimming for tiles on the causal diagonal: row m of C only needs columns n (or
// reduction steps k) on one side of m + off; rows go in groups, so groups trim conservatively.
enum class Tri { None, NLo, NHi, KLo, KHi };  // n >= m+off, n <= m+off, k >= m+off, k <= m+off

// C[M, N] (+)= A[M, K] B[K, N]; A(m, k) = A[m*sam + k*sak], B(k, n) = B[k*ldb + n],
// C(m, n) = C[m*ldc + n]. ACC = false overwrites C (also when K == 0), except the columns that a
// Tri::NLo / NHi trim skips, which the caller must not read. While computing, the pf_len floats
// at pf (if any) are prefetched into L2, spread over the micro-kernel steps.
template <bool ACC>
void gemm(int M, int N, int K, const float* A, int64_t sam, int64_t sak, const float* B,
          int64_t ldb, float* C, int64_t ldc, const float* pf = nullptr, int64_t pf_len = 0,
          Tri tri = Tri::None, int off = 0) {
  const auto& tab = ACC ? kMicroAcc : kMicroSet;
  int64_t pf_done = 0;
  for (int n0 = 0; n0 < N; n0 += 16 * kNV) {
    const int n1 = std::min(N, n0 + 16 * kNV);
    // Rows in ceil(M / kR) groups of near-equal size (64 = 9 x 6 + 2 x 5, not 10 x 6 + 4).
    const int ng = (M + kR - 1) / kR;
    for (int g = 0, m0 = 0; g < ng; ++g) {
      const int r = (M - m0) / (ng - g);
      int na = n0, nb = n1, ka = 0, kb = K;
      if (tri == Tri::NLo) na = std::max(na, (m0 + off) & ~15);
      if (tri == Tri::NHi) nb = std::min(nb, m0 + r + off);
      if (tri == Tri::KLo) ka = std::clamp(m0 + off, 0, K);
      if (tri == Tri::KHi) kb = std::clamp(m0 + r + off, 0, K);
      if (na < nb) {
        const int nv = (nb - na + 15) / 16;
        // Past the region, prefetch B again (in cache already: nearly free).
        const char* p = pf_done < pf_len ? reinterpret_cast<const char*>(pf + pf_done)
                                         : reinterpret_cast<const char*>(B);
        pf_done += 16 * int64_t{kb - ka};
        tab[r - 1][nv - 1](kb - ka, A + m0 * sam + ka * sak, sam, sak, B + ka * ldb + na, ldb,
                           C + m0 * ldc + na, ldc, tail_mask(nb - na - 16 * (nv - 1)), p);
      }
      m0 += r;
    }
  }
}

// Per-thread scratch that grows to the largest request and is reused: bounded by one (b, h)'s
// packed rows plus the tile buffers, T * (Dqk + Dv) floats + O(64 * (Dqk + Dv)).
struct Scratch {
  float* p = nullptr;
  size_t cap = 0;
  ~Scratch() { std::free(p); }
  float* get(size_t n) {
    if (n > cap) {
      std::free(p);
      constexpr size_t kHuge = size_t{2} << 20;
      size_t bytes = (n * sizeof(float) + 63) & ~size_t{63};
      const bool huge = bytes >= 2 * kHuge;
      if (huge) bytes = (bytes + kHuge - 1) & ~(kHuge - 1);
      p = static_cast<float*>(std::aligned_alloc(huge ? kHuge : 64, bytes));
      TREX_CHECK(p, "attention: cannot allocate ", bytes, " bytes of scratch");
#ifdef MADV_HUGEPAGE
      if (huge) madvise(p, bytes, MADV_HUGEPAGE);  // a hint; failure is harmless
#endif
      cap = n;
    }
    return p;
  }
};
float* thread_scratch(size_t n) {
  static thread_local Scratch s;
  return s.get(n);
}

// dst[c * ldd + r] = src[r * lds + c] for r < 16, c < nc (nc <= 16); rows r >= nr read as 0.
void transpose16(const float* src, int64_t lds, int nr, int nc, float* dst, int64_t ldd) {
  __m512 r[16], t[16];
  const __mmask16 mc = tail_mask(nc);
  for (int i = 0; i < 16; ++i)
    r[i] = _mm512_maskz_loadu_ps(i < nr ? mc : __mmask16(0), src + i * lds);
  for (int i = 0; i < 8; ++i) {  // per 128-bit lane: (a0 b0 a1 b1), (a2 b2 a3 b3)
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // lane l of r[4i+k]: rows 4i..4i+3 of column 4l+k
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]),
                  c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int k = 0; k < 4; ++k) {
    t[k] = _mm512_shuffle_f32x4(r[k], r[4 + k], 0x88);
    t[k + 4] = _mm512_shuffle_f32x4(r[k], r[4 + k], 0xDD);
    t[k + 8] = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0x88);
    t[k + 12] = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0xDD);
  }
  for (int k = 0; k < 4; ++k) {
    r[k] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0x88);
    r[k + 8] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0xDD);
    r[k + 4] = _mm512_shuffle_f32x4(t[k + 4], t[k + 12], 0x88);
    r[k + 12] = _mm512_shuffle_f32x4(t[k + 4], t[k + 12], 0xDD);
  }
  for (int c = 0; c < nc; ++c) _mm512_storeu_ps(dst + c * ldd, r[c]);
}

// dst[d * kB + i] = src[i * lds + d] for i < n (columns n..kB-1 of dst are zero), d < D.
void pack_transposed(const float* src, int64_t lds, int n, int D, float* dst) {
  for (int i0 = 0; i0 < kB; i0 += 16)
    for (int d0 = 0; d0 < D; d0 += 16)
      transpose16(src + i0 * lds + d0, lds, std::max(0, std::min(16, n - i0)), std::min(16, D - d0),
                  dst + d0 * kB + i0, kB);
}

// Copies rows [t0, t1) of one (b, h) of a [B,T,H,D] tensor (row stride `stride`) to dst[t][ld].
// Each row is on its own page, out of the hardware prefetchers' reach: prefetch a few rows ahead.
void pack_rows(float* dst, int64_t ld, const float* src, int64_t stride, int t0, int t1, int D) {
  constexpr int kAhead = 6;
  for (int t = t0; t < t1; ++t) {
    if (t + kAhead < t1)
      for (int d = 0; d < D; d += 16)
        _mm_prefetch(reinterpret_cast<const char*>(src + (t + kAhead) * stride + d), _MM_HINT_T0);
    std::memcpy(dst + t * ld, src + t * stride, sizeof(float) * D);
  }
}

// ---------------------------------------------------------------------------------- forward --

struct FwdCtx {
  const AttnShape& sh;
  const float *q, *k, *v;
  float *o, *lse;
  const int32_t* seg;
  int nqb, nchunk;
};

// Per-thread buffers of one forward item.
struct FwdBufs {
  const float* Kc;  // [t][Dqkp] packed k rows of this (b, h)
  const float* Vc;  // [t][Dvp] packed v rows
  float *QT, *ST, *O, *mrow, *lrow, *alpha;
  int64_t Dqkp, Dvp;
};

// One (b, h, query block): online softmax over its visible key tiles; writes o and lse rows.
void fwd_block(const FwdCtx& c, const FwdBufs& w, int bh, int qb) {
  const AttnShape& sh = c.sh;
  const int T = sh.T, H = sh.H, Dqk = sh.Dqk, Dv = sh.Dv, W = sh.window;
  const int b = bh / H, h = bh % H;
  const int64_t sq = int64_t{H} * Dqk, sv = int64_t{H} * Dv;  // row strides of q and o
  const int64_t Dqkp = w.Dqkp, Dvp = w.Dvp;
  const float* qb_ = c.q + (int64_t{b} * T * H + h) * Dqk;
  float* ob_ = c.o + (int64_t{b} * T * H + h) * Dv;
  const int32_t* segrow = c.seg ? c.seg + int64_t{b} * T : nullptr;
  const int qs = qb * kB, nq = std::min(kB, T - qs), nc = (nq + 15) / 16;
  const float c2 = sh.scale * kLog2e;
  float *QT = w.QT, *ST = w.ST, *O = w.O, *mrow = w.mrow, *lrow = w.lrow, *alpha = w.alpha;

  pack_transposed(qb_ + qs * sq, sq, nq, Dqk, QT);
  std::memset(ST, 0, sizeof(float) * kB * kB);
  std::memset(O, 0, sizeof(float) * kB * Dvp);
  for (int i = 0; i < kB; ++i) mrow[i] = kNegInf, lrow[i] = 0.0f;
  alignas(64) int32_t qseg[kB];
  for (int i = 0; i < kB; ++i) qseg[i] = segrow ? segrow[qs + std::min(i, nq - 1)] : 0;
  __mmask16 msk[kB][kB / 16];

  const int kb_lo = W > 0 ? std::max(0, qs - W + 1) / kB : 0, kb_hi = (qs + nq - 1) / kB;
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 c2v = _mm512_set1_ps(c2);
  for (int kb = kb_lo; kb <= kb_hi; ++kb) {
    const int ks = kb * kB, nk = std::min(kB, T - ks);
    const int kind = tile_kind(sh, qs, nq, ks, nk, segrow);
    if (kind == 0) continue;
    // S^T[j, i] = k_j . q_i, prefetching the next key tile (k, v rows follow in the panels).
    const int64_t nnext = kb < kb_hi ? std::min(kB, T - ks - kB) : 0;
    const bool diag = ks == qs;  // then query i sees key j only if j <= i
    gemm<false>(nk, nq, Dqk, w.Kc + ks * Dqkp, Dqkp, 1, QT, kB, ST, kB, w.Kc + (ks + kB) * Dqkp,
                nnext * Dqkp, diag ? Tri::NLo : Tri::None, 0);
    int jmin = nk, jmax = -1;
    for (int ci = 0; ci < nc; ++ci) {
      // Keys of this tile that some query of the 16-column chunk may see: [jlo, jhi].
      const int q0 = qs + 16 * ci, q1 = std::min(q0 + 15, qs + nq - 1);
      const int jlo = W > 0 ? std::max(0, q0 - W + 1 - ks) : 0, jhi = std::min(nk - 1, q1 - ks);
      if (jlo > jhi) {
        _mm512_storeu_ps(alpha + 16 * ci, _mm512_set1_ps(1.0f));
        continue;
      }
      jmin = std::min(jmin, jlo), jmax = std::max(jmax, jhi);
      const __m512i qi = _mm512_add_epi32(iota, _mm512_set1_epi32(q0));
      const __m512i qsg = _mm512_load_si512(qseg + 16 * ci);
      __m512 mx = _mm512_set1_ps(kNegInf);
      for (int j = jlo; j <= jhi; ++j) {
        const __m512 s = _mm512_loadu_ps(ST + j * kB + 16 * ci);
        if (kind == 2) {
          mx = _mm512_max_ps(mx, s);
          continue;
        }
        const int kj = ks + j;
        __mmask16 m = _mm512_cmpge_epi32_mask(qi, _mm512_set1_epi32(kj));
        if (W > 0) m &= _mm512_cmplt_epi32_mask(qi, _mm512_set1_epi32(kj + W));
        if (segrow) m &= _mm512_cmpeq_epi32_mask(qsg, _mm512_set1_epi32(segrow[kj]));
        msk[j][ci] = m;
        mx = _mm512_mask_max_ps(mx, m, mx, s);
      }
      // New running max (log2 units); lanes that have seen nothing yet use 0 as the offset.
      const __m512 mold = _mm512_loadu_ps(mrow + 16 * ci);
      const __m512 mnew = _mm512_max_ps(mold, _mm512_mul_ps(mx, c2v));
      const __m512 msafe = _mm512_mask_mov_ps(
          mnew, _mm512_cmpeq_ps_mask(mnew, _mm512_set1_ps(kNegInf)), _mm512_setzero_ps());
      const __m512 al = exp2_ps(_mm512_max_ps(_mm512_sub_ps(mold, msafe), _mm512_set1_ps(-200.0f)));
      __m512 l = _mm512_mul_ps(_mm512_loadu_ps(lrow + 16 * ci), al);
      for (int j = jlo; j <= jhi; ++j) {
        float* sp = ST + j * kB + 16 * ci;
        __m512 p = exp2_ps(_mm512_fmsub_ps(_mm512_loadu_ps(sp), c2v, msafe));
        if (kind == 1) p = _mm512_maskz_mov_ps(msk[j][ci], p);
        _mm512_storeu_ps(sp, p);
        l = _mm512_add_ps(l, p);
      }
      _mm512_storeu_ps(mrow + 16 * ci, mnew);
      _mm512_storeu_ps(lrow + 16 * ci, l);
      _mm512_storeu_ps(alpha + 16 * ci, al);
    }
    if (jmax < 0) continue;
    // Rows of P^T in [jmin, jmax] outside a column chunk's own range must read as zero.
    for (int ci = 0; ci < nc; ++ci) {
      const int q0 = qs + 16 * ci, q1 = std::min(q0 + 15, qs + nq - 1);
      const int jlo = W > 0 ? std::max(0, q0 - W + 1 - ks) : 0, jhi = std::min(nk - 1, q1 - ks);
      for (int j = jmin; j <= jmax; ++j)
        if (j < jlo || j > jhi) _mm512_storeu_ps(ST + j * kB + 16 * ci, _mm512_setzero_ps());
    }
    for (int i = 0; i < nq; ++i) {
      const float a = alpha[i];
      if (a == 1.0f) continue;
      const __m512 av = _mm512_set1_ps(a);
      for (int d = 0; d < Dv; d += 16)
        _mm512_store_ps(O + i * Dvp + d, _mm512_mul_ps(av, _mm512_load_ps(O + i * Dvp + d)));
    }
    // O[i, :] += sum_j P^T[j, i] v_j
    gemm<true>(nq, Dv, jmax - jmin + 1, ST + jmin * kB, 1, kB, w.Vc + (ks + jmin) * Dvp, Dvp, O,
               Dvp, w.Vc + (ks + kB) * Dvp, nnext * Dvp, diag ? Tri::KHi : Tri::None, -jmin);
  }
  for (int i = 0; i < nq; ++i) {
    const int t = qs + i;
    const float l = lrow[i], inv = l > 0.0f ? 1.0f / l : 0.0f;
    const __m512 iv = _mm512_set1_ps(inv);
    float* orow = ob_ + t * sv;
    for (int d = 0; d < Dv; d += 16)
      _mm512_mask_storeu_ps(orow + d, tail_mask(Dv - d),
                            _mm512_mul_ps(iv, _mm512_load_ps(O + i * Dvp + d)));
    c.lse[int64_t{bh} * T + t] = l > 0.0f ? (mrow[i] + std::log2(l)) * kLn2 : kNegInf;
  }
}

// Query blocks chunk, chunk + nchunk, ... of one (b, h), in increasing order: the k, v rows
// each block adds are packed just before it.
void fwd_item(const FwdCtx& c, int bh, int chunk) {
  const AttnShape& sh = c.sh;
  const int T = sh.T, H = sh.H, Dqk = sh.Dqk, Dv = sh.Dv, W = sh.window;
  const int b = bh / H, h = bh % H;
  const int64_t sq = int64_t{H} * Dqk, sv = int64_t{H} * Dv;
  const float* kb_ = c.k + (int64_t{b} * T * H + h) * Dqk;
  const float* vb_ = c.v + (int64_t{b} * T * H + h) * Dv;
  const int64_t Dqkp = round16(Dqk), Dvp = round16(Dv), Tp = round16(T);
  float* Kc = thread_scratch((Dqkp + Dvp) * Tp + (Dqkp + Dvp) * kB + kB * kB + 3 * kB);
  float* Vc = Kc + Tp * Dqkp;
  FwdBufs w{Kc, Vc, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, Dqkp, Dvp};
  w.QT = Vc + Tp * Dvp;     // [d][query i]
  w.ST = w.QT + Dqkp * kB;  // [key j][query i]
  w.O = w.ST + kB * kB;     // [query i][Dvp]
  w.mrow = w.O + kB * Dvp;  // running max of scaled scores (log2 units)
  w.lrow = w.mrow + kB;     // running sum
  w.alpha = w.lrow + kB;
  // Keys before t0 are seen by no query of this item (sliding window).
  int packed = W > 0 ? std::max(0, chunk * kB - W + 1) / kB * kB : 0;
  for (int qb = chunk; qb < c.nqb; qb += c.nchunk) {
    const int t1 = std::min(T, (qb + 1) * kB);
    pack_rows(Kc, Dqkp, kb_, sq, packed, t1, Dqk);
    pack_rows(Vc, Dvp, vb_, sv, packed, t1, Dv);
    packed = t1;
    fwd_block(c, w, bh, qb);
  }
}

// ---------------------------------------------------------------------------------- backward --

struct BwdCtx {
  const AttnShape& sh;
  const float *q, *k, *v, *o, *lse, *dO;
  float *dq, *dk, *dv;
  const int32_t* seg;
  int nkb, nsplit;
  float* dq_part;  // [B*H, nsplit, T, Dqk] when nsplit > 1
};

// One (b, h) and the key blocks split, split + nsplit, ...: dk, dv of those blocks (overwrite)
// and their contribution to dq.
void bwd_item(const BwdCtx& c, int bh, int split) {
  const AttnShape& sh = c.sh;
  const int T = sh.T, H = sh.H, Dqk = sh.Dqk, Dv = sh.Dv, W = sh.window;
  const int b = bh / H, h = bh % H;
  const int64_t sq = int64_t{H} * Dqk, sv = int64_t{H} * Dv;
  const int64_t oq = (int64_t{b} * T * H + h) * Dqk, ov = (int64_t{b} * T * H + h) * Dv;
  const float *kb_ = c.k + oq, *vb_ = c.v + ov, *ob_ = c.o + ov, *dOb = c.dO + ov;
  float *dkb = c.dk + oq, *dvb = c.dv + ov;
  const int32_t* segrow = c.seg ? c.seg + int64_t{b} * T : nullptr;
  const float c2 = sh.scale * kLog2e;
  const int nqb = (T + kB - 1) / kB;

  const int64_t Dqkp = round16(Dqk), Dvp = round16(Dv), Tp = round16(T);
  float* Qc = thread_scratch((2 * Dqkp + Dvp) * Tp + (Dqkp + Dvp) * kB * 2 + Dqkp * kB +
                             2 * kB * kB + 2 * Tp);
  float* dOc = Qc + Tp * Dqkp;  // [t][Dvp]: packed q and dO rows of this (b, h)
  float* dQc = dOc + Tp * Dvp;  // [t][Dqkp]: dq of this (b, h) from this item's key blocks
  float* KT = dQc + Tp * Dqkp;  // [d][j]: k and v of the key tile transposed
  float* VT = KT + Dqkp * kB;
  float* Kc = VT + Dvp * kB;     // [j][Dqkp]: k rows of the key tile packed
  float* P = Kc + kB * Dqkp;     // [query i][key j]
  float* DS = P + kB * kB;       // dP, then dS, [i][j]
  float* dKa = DS + kB * kB;     // [j][Dqkp]
  float* dVa = dKa + kB * Dqkp;  // [j][Dvp]
  float* delta = dVa + kB * Dvp;
  float* lse2 = delta + Tp;
  const int t0 = split * kB;  // the first query any key block of this split is seen by
  pack_rows(Qc, Dqkp, c.q + oq, sq, t0, T, Dqk);
  pack_rows(dOc, Dvp, dOb, sv, t0, T, Dv);
  for (int t = t0; t < T; ++t) {
    const float* a = dOc + t * Dvp;
    const float* o = ob_ + t * sv;
    __m512 acc = _mm512_setzero_ps();
    for (int d = 0; d < Dv; d += 16) {
      const __mmask16 m = tail_mask(Dv - d);
      acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + d), _mm512_maskz_loadu_ps(m, o + d), acc);
    }
    delta[t] = _mm512_reduce_add_ps(acc);
    lse2[t] = c.lse[int64_t{bh} * T + t] * kLog2e;
  }
  std::memset(dQc + t0 * Dqkp, 0, sizeof(float) * (T - t0) * Dqkp);

  const __m512 c2v = _mm512_set1_ps(c2), scv = _mm512_set1_ps(sh.scale);
  for (int kb = split; kb < c.nkb; kb += c.nsplit) {
    const int ks = kb * kB, nk = std::min(kB, T - ks), nck = (nk + 15) / 16;
    for (int j = 0; j < nk; ++j)
      std::memcpy(Kc + j * Dqkp, kb_ + (ks + j) * sq, sizeof(float) * Dqk);
    pack_transposed(Kc, Dqkp, nk, Dqk, KT);
    pack_transposed(vb_ + ks * sv, sv, nk, Dv, VT);
    std::memset(dKa, 0, sizeof(float) * nk * Dqkp);
    std::memset(dVa, 0, sizeof(float) * nk * Dvp);
    const int qb_hi = W > 0 ? std::min(nqb - 1, (ks + nk - 1 + W - 1) / kB) : nqb - 1;
    for (int qb = kb; qb <= qb_hi; ++qb) {
      const int qs = qb * kB, nq = std::min(kB, T - qs);
      const int kind = tile_kind(sh, qs, nq, ks, nk, segrow);
      if (kind == 0) continue;
      const float* Qt = Qc + qs * Dqkp;
      const float* dOt = dOc + qs * Dvp;
      // S = Q K^T and dP = dO V^T, prefetching the next query tile's q and dO rows.
      const int64_t nnext = qb < qb_hi ? std::min(kB, T - qs - kB) : 0;
      const bool diag = ks == qs;  // then query i sees key j only if j <= i
      const Tri tn = diag ? Tri::NHi : Tri::None, tkl = diag ? Tri::KLo : Tri::None,
                tkh = diag ? Tri::KHi : Tri::None;
      gemm<false>(nq, nk, Dqk, Qt, Dqkp, 1, KT, kB, P, kB, Qt + kB * Dqkp, nnext * Dqkp, tn);
      gemm<false>(nq, nk, Dv, dOt, Dvp, 1, VT, kB, DS, kB, dOt + kB * Dvp, nnext * Dvp, tn);
      for (int i = 0; i < nq; ++i) {
        const int t = qs + i;
        const int jlo = W > 0 ? std::max(0, t - W + 1 - ks) : 0, jhi = std::min(nk - 1, t - ks);
        float* pr = P + i * kB;
        float* dr = DS + i * kB;
        if (jlo > jhi || lse2[t] == kNegInf) {
          for (int cj = 0; cj < nck; ++cj) {
            _mm512_storeu_ps(pr + 16 * cj, _mm512_setzero_ps());
            _mm512_storeu_ps(dr + 16 * cj, _mm512_setzero_ps());
          }
          continue;
        }
        const __m512 L = _mm512_set1_ps(lse2[t]), dl = _mm512_set1_ps(delta[t]);
        const __m512i tsg = _mm512_set1_epi32(segrow ? segrow[t] : 0);
        for (int cj = 0; cj < nck; ++cj) {
          __mmask16 m = 0xFFFF;
          if (kind == 1) {
            const int lo = std::max(jlo - 16 * cj, 0), hi = std::min(jhi - 16 * cj + 1, 16);
            m = hi > lo ? __mmask16(((1u << hi) - 1) & ~((1u << lo) - 1)) : __mmask16(0);
            if (segrow && m) {
              const __m512i ksg = _mm512_maskz_loadu_epi32(m, segrow + ks + 16 * cj);
              m &= _mm512_cmpeq_epi32_mask(ksg, tsg);
            }
          }
          __m512 p = exp2_ps(_mm512_fmsub_ps(_mm512_loadu_ps(pr + 16 * cj), c2v, L));
          p = _mm512_maskz_mov_ps(m, p);
          const __m512 ds = _mm512_mul_ps(_mm512_mul_ps(p, scv),
                                          _mm512_sub_ps(_mm512_loadu_ps(dr + 16 * cj), dl));
          _mm512_storeu_ps(pr + 16 * cj, p);
          _mm512_storeu_ps(dr + 16 * cj, _mm512_maskz_mov_ps(m, ds));
        }
      }
      gemm<true>(nk, Dv, nq, P, 1, kB, dOt, Dvp, dVa, Dvp, nullptr, 0, tkl);     // dV += P^T dO
      gemm<true>(nk, Dqk, nq, DS, 1, kB, Qt, Dqkp, dKa, Dqkp, nullptr, 0, tkl);  // dK += dS^T Q
      gemm<true>(nq, Dqk, nk, DS, kB, 1, Kc, Dqkp, dQc + qs * Dqkp, Dqkp,        // dQ += dS K
                 dQc + (qs + kB) * Dqkp, nnext * Dqkp, tkh);
    }
    for (int j = 0; j < nk; ++j) {
      std::memcpy(dkb + (ks + j) * sq, dKa + j * Dqkp, sizeof(float) * Dqk);
      std::memcpy(dvb + (ks + j) * sv, dVa + j * Dvp, sizeof(float) * Dv);
    }
  }
  // dq rows before t0 get no contribution from this item.
  float* dqb = c.nsplit == 1 ? c.dq + oq : c.dq_part + (int64_t{bh} * c.nsplit + split) * T * Dqk;
  const int64_t ldq = c.nsplit == 1 ? sq : Dqk;
  for (int t = 0; t < T; ++t) {
    if (t < t0)
      std::memset(dqb + t * ldq, 0, sizeof(float) * Dqk);
    else
      std::memcpy(dqb + t * ldq, dQc + t * Dqkp, sizeof(float) * Dqk);
  }
}

}  // namespace

void attention_fwd_avx512(const AttnShape& sh, const float* q, const float* k, const float* v,
                          float* o, float* lse, const int32_t* seg) {
  TREX_CHECK(sh.scale > 0.0f, "attention: scale must be > 0, got ", sh.scale);
  const int nqb = (sh.T + kB - 1) / kB;
  const int64_t BH = int64_t{sh.B} * sh.H;
  const int nchunk = attn_split_count(BH, nqb, 4);  // extra chunks only repack some k, v rows
  FwdCtx c{sh, q, k, v, o, lse, seg, nqb, nchunk};
  parallel_dynamic(BH * nchunk, [&](int64_t it) {
    fwd_item(c, static_cast<int>(it / nchunk), static_cast<int>(it % nchunk));
  });
}

void attention_bwd_avx512(const AttnShape& sh, const float* q, const float* k, const float* v,
                          const float* o, const float* lse, const float* dO, float* dq, float* dk,
                          float* dv, const int32_t* seg) {
  TREX_CHECK(sh.scale > 0.0f, "attention: scale must be > 0, got ", sh.scale);
  const int nkb = (sh.T + kB - 1) / kB;
  const int64_t BH = int64_t{sh.B} * sh.H;
  // Splitting the key blocks of a (b, h) makes dq a sum over splits: each split accumulates
  // into its own partial, summed below.
  const int nsplit = attn_split_count(BH, nkb, 2);  // each split costs a T x Dqk dq partial
  const DqPartials part = alloc_dq_partials(sh, nsplit);
  BwdCtx c{sh, q, k, v, o, lse, dO, dq, dk, dv, seg, nkb, nsplit, part.get()};
  parallel_dynamic(BH * nsplit, [&](int64_t it) {
    bwd_item(c, static_cast<int>(it / nsplit), static_cast<int>(it % nsplit));
  });
  if (nsplit > 1) sum_dq_partials(sh, nsplit, part.get(), dq);
}

}  // namespace trex::kern::cpu
