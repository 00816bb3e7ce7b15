// AVX2 + FMA flash attention (FlashAttention-2 style), forward and backward; see kernels/attention.h.
// The design is the AVX-512 kernel's (kernels/cpu/attention_avx512.cpp) resized for 8-float ymm
// vectors and 16 vector registers; it replaces the GEMM-based kernel (attention_blas.cpp) on AVX2
// CPUs: no oneDNN call per small tile, no T-wide score rows, a polynomial exp fused with the max /
// sum passes, masks only on the tiles that need them.
//
// Tiles are kB x kB (queries x keys). Every matrix product of a tile goes through one register-
// blocked micro-kernel (6 rows x 16 columns of fp32 accumulators: 12 ymm + 2 for B + 1 broadcast),
// C[m, n] (+)= A[m, k] B[k, n], with A read by broadcast under any strides and B rows read as
// full vectors. B and C rows are padded to a multiple of 8 floats (the padding is computed and
// never read back as data), so the micro-kernel has no masked loads or stores. Each work item
// packs the rows of its (b, h) that tiles reuse into contiguous per-thread panels ([t][Dp], rows
// zero padded to Dp = round8(D)) and works from those:
//   forward  (items: (b, h), split into interleaved query-block chunks only when B*H is small):
//            query blocks in increasing order, packing the k, v rows each adds. Per query block
//            Q^T is packed and each key tile computes S^T = K Q^T [keys x queries], so the online
//            softmax runs down columns with one lane per query (no horizontal reductions), then
//            O += P V with A = P^T read transposed. m, l are kept in log2 units (exp2 of a
//            pre-scaled exponent: a degree-6 polynomial and the exponent bits).
//   backward (items: (b, h), split into interleaved key-block sets only when B*H is small): q, dO
//            rows are packed and delta = rowsum(dO o) formed once per item; per key block K^T,
//            V^T and K are packed; per query tile S = Q K^T and dP = dO V^T, P = exp(S - lse),
//            dS = P (dP - delta) scale, then dV += P^T dO and dK += dS^T Q into key-tile
//            accumulators and dQ += dS K into a per-item dq panel, written out (or summed across
//            splits) at the end. No race: a (b, h, key block) belongs to one item.
// Key tiles no query of the tile can see (causal, window, disjoint document ids) are skipped,
// masks are built only for partly visible tiles (diagonal, window edge, document boundary), and
// products on the causal diagonal skip the masked triangle (to micro-kernel granularity).
// Denormals are flushed while an item runs (kernels/cpu/kernel_scratch.h).
#include "kernels/cpu/attention_avx2.h"
#include "kernels/cpu/attention_split.h"

#include <immintrin.h>

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
#include "kernels/cpu/exp2_avx2.h"
#include "kernels/cpu/kernel_scratch.h"

namespace trex::kern::cpu {
namespace {

constexpr int kB = 64;  // rows of a query tile and keys of a key tile
constexpr int kR = 6;   // micro-kernel rows (broadcast operand)
constexpr int kNV = 2;  // micro-kernel vectors of 8 columns
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline int64_t round8(int64_t n) { return (n + 7) & ~int64_t{7}; }

using avx2::exp2_ps;  // kernels/cpu/exp2_avx2.h

inline __m256 as_ps(__m256i m) { return _mm256_castsi256_ps(m); }

// C[r, 0:8*NV] (+)= sum_k A[r*sam + k*sak] * B[k*ldb + 0:8*NV] for r < R (full vectors: B and C
// rows must be readable / writable up to 8*NV columns). Step k also prefetches the cache line
// pf + 64 k into L2 (the caller points pf at the next tile's operands).
template <int R, int NV, bool ACC>
void micro(int K, const float* A, int64_t sam, int64_t sak, const float* B, int64_t ldb, float* C,
           int64_t ldc, const char* pf) {
  __m256 c[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v)
      c[r][v] = ACC ? _mm256_loadu_ps(C + r * ldc + 8 * v) : _mm256_setzero_ps();
  for (int k = 0; k < K; ++k) {
    _mm_prefetch(pf + 64 * k, _MM_HINT_T1);
    __m256 b[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) b[v] = _mm256_loadu_ps(B + k * ldb + 8 * v);
    const float* a = A + k * sak;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 ar = _mm256_broadcast_ss(a + r * sam);
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) c[r][v] = _mm256_fmadd_ps(ar, b[v], c[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) _mm256_storeu_ps(C + r * ldc + 8 * v, c[r][v]);
}

using MicroFn = void (*)(int, const float*, int64_t, int64_t, const float*, int64_t, float*,
                         int64_t, const char*);

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
// C(m, n) = C[m*ldc + n]. Columns are computed in whole vectors: B and C rows must be readable /
// writable up to round8(N) columns, and those padding columns of C get values the caller must not
// use. ACC = false overwrites C (also when K == 0), except the columns that a Tri::NLo / NHi trim
// skips, which the caller must not read. While computing, the pf_len floats at pf (if any) are
// prefetched into L2, spread over the micro-kernel steps.
template <bool ACC>
void gemm(int M, int N, int K, const float* A, int64_t sam, int64_t sak, const float* B,
          int64_t ldb, float* C, int64_t ldc, const float* pf = nullptr, int64_t pf_len = 0,
          Tri tri = Tri::None, int off = 0) {
  const auto& tab = ACC ? kMicroAcc : kMicroSet;
  int64_t pf_done = 0;
  // Rows in ceil(M / kR) groups of near-equal size (64 = 9 x 6 + 2 x 5, not 10 x 6 + 4).
  const int ng = (M + kR - 1) / kR;
  for (int g = 0, m0 = 0; g < ng; ++g) {
    const int r = (M - m0) / (ng - g);
    for (int n0 = 0; n0 < N; n0 += 8 * kNV) {
      const int n1 = std::min(N, n0 + 8 * kNV);
      int na = n0, nb = n1, ka = 0, kb = K;
      if (tri == Tri::NLo) na = std::max(na, (m0 + off) & ~7);
      if (tri == Tri::NHi) nb = std::min(nb, m0 + r + off);
      if (tri == Tri::KLo) ka = std::clamp(m0 + off, 0, K);
      if (tri == Tri::KHi) kb = std::clamp(m0 + r + off, 0, K);
      if (na < nb) {
        const int nv = (nb - na + 7) / 8;
        // Past the region, prefetch B again (in cache already: nearly free).
        const char* p = pf_done < pf_len ? reinterpret_cast<const char*>(pf + pf_done)
                                         : reinterpret_cast<const char*>(B);
        pf_done += 16 * int64_t{std::max(kb - ka, 0)};
        tab[r - 1][nv - 1](std::max(kb - ka, 0), A + m0 * sam + ka * sak, sam, sak,
                           B + ka * ldb + na, ldb, C + m0 * ldc + na, ldc, p);
      }
    }
    m0 += r;
  }
}

// r[c] = column c of the 8 x 8 block r[0..7] (rows in, columns out).
inline void transpose8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int h = 0; h < 2; ++h) {  // rows 4h..4h+3
    u[4 * h] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0x44);
    u[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0xEE);
    u[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
    u[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
  }
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
    r[c + 4] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
  }
}

// dst[d * kB + i] = src[i * lds + d] for i < n (columns n..kB-1 of dst are zero), d < D.
// 8 x 8 register transposes; the source rows (a page apart in [B,T,H,D]) of the next group of 8
// are prefetched while a group is transposed.
void pack_transposed(const float* src, int64_t lds, int n, int D, float* dst) {
  for (int i0 = 0; i0 < kB; i0 += 8) {
    const int nr = std::clamp(n - i0, 0, 8);
    for (int r = 0; r < std::clamp(n - i0 - 8, 0, 8); ++r)
      for (int d = 0; d < D; d += 16)
        _mm_prefetch(reinterpret_cast<const char*>(src + (i0 + 8 + r) * lds + d), _MM_HINT_T0);
    for (int d0 = 0; d0 < D; d0 += 8) {
      const int nc = std::min(8, D - d0);
      if (nr == 8 && nc == 8) {
        __m256 r[8];
        for (int k = 0; k < 8; ++k) r[k] = _mm256_loadu_ps(src + (i0 + k) * lds + d0);
        transpose8(r);
        for (int c = 0; c < 8; ++c) _mm256_storeu_ps(dst + (d0 + c) * kB + i0, r[c]);
      } else {
        for (int c = 0; c < nc; ++c)
          for (int k = 0; k < 8; ++k)
            dst[(d0 + c) * kB + i0 + k] = k < nr ? src[(i0 + k) * lds + d0 + c] : 0.0f;
      }
    }
  }
}

// Copies rows [t0, t1) of one (b, h) of a [B,T,H,D] tensor (row stride `stride`) to dst[t][ld],
// zero padding columns D..ld-1. Each row is on its own page, out of the hardware prefetchers'
// reach: prefetch a few rows ahead.
void pack_rows(float* dst, int64_t ld, const float* src, int64_t stride, int t0, int t1, int D) {
  constexpr int kAhead = 6;
  for (int t = t0; t < t1; ++t) {
    if (t + kAhead < t1)
      for (int d = 0; d < D; d += 16)
        _mm_prefetch(reinterpret_cast<const char*>(src + (t + kAhead) * stride + d), _MM_HINT_T0);
    std::memcpy(dst + t * ld, src + t * stride, sizeof(float) * D);
    if (ld > D) std::memset(dst + t * ld + D, 0, sizeof(float) * (ld - D));
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
  const int qs = qb * kB, nq = std::min(kB, T - qs), nc = (nq + 7) / 8;
  const float c2 = sh.scale * kLog2e;
  float *QT = w.QT, *ST = w.ST, *O = w.O, *mrow = w.mrow, *lrow = w.lrow, *alpha = w.alpha;

  pack_transposed(qb_ + qs * sq, sq, nq, Dqk, QT);
  std::memset(ST, 0, sizeof(float) * kB * kB);
  std::memset(O, 0, sizeof(float) * kB * Dvp);
  for (int i = 0; i < kB; ++i) mrow[i] = kNegInf, lrow[i] = 0.0f;
  alignas(32) int32_t qseg[kB];
  for (int i = 0; i < kB; ++i) qseg[i] = segrow ? segrow[qs + std::min(i, nq - 1)] : 0;

  const int kb_lo = W > 0 ? std::max(0, qs - W + 1) / kB : 0, kb_hi = (qs + nq - 1) / kB;
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 c2v = _mm256_set1_ps(c2), ninf = _mm256_set1_ps(kNegInf);
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
      // Keys of this tile that some query of the 8-column chunk may see: [jlo, jhi].
      const int q0 = qs + 8 * ci, q1 = std::min(q0 + 7, qs + nq - 1);
      const int jlo = W > 0 ? std::max(0, q0 - W + 1 - ks) : 0, jhi = std::min(nk - 1, q1 - ks);
      if (jlo > jhi) {
        _mm256_storeu_ps(alpha + 8 * ci, _mm256_set1_ps(1.0f));
        continue;
      }
      jmin = std::min(jmin, jlo), jmax = std::max(jmax, jhi);
      __m256 mx = ninf;
      if (kind == 2) {
        for (int j = jlo; j <= jhi; ++j) mx = _mm256_max_ps(mx, _mm256_loadu_ps(ST + j * kB + 8 * ci));
      } else {
        // Pairs a query may not see become -inf in S^T (exp2 makes them 0 below).
        const __m256i qi = _mm256_add_epi32(iota, _mm256_set1_epi32(q0));
        const __m256i qsg = _mm256_load_si256(reinterpret_cast<const __m256i*>(qseg + 8 * ci));
        for (int j = jlo; j <= jhi; ++j) {
          float* sp = ST + j * kB + 8 * ci;
          const int kj = ks + j;
          __m256i m = _mm256_cmpgt_epi32(qi, _mm256_set1_epi32(kj - 1));
          if (W > 0) m = _mm256_and_si256(m, _mm256_cmpgt_epi32(_mm256_set1_epi32(kj + W), qi));
          if (segrow)
            m = _mm256_and_si256(m, _mm256_cmpeq_epi32(qsg, _mm256_set1_epi32(segrow[kj])));
          const __m256 s = _mm256_blendv_ps(ninf, _mm256_loadu_ps(sp), as_ps(m));
          _mm256_storeu_ps(sp, s);
          mx = _mm256_max_ps(mx, s);
        }
      }
      // New running max (log2 units); lanes that have seen nothing yet use 0 as the offset.
      const __m256 mold = _mm256_loadu_ps(mrow + 8 * ci);
      const __m256 mnew = _mm256_max_ps(mold, _mm256_mul_ps(mx, c2v));
      const __m256 msafe =
          _mm256_blendv_ps(mnew, _mm256_setzero_ps(), _mm256_cmp_ps(mnew, ninf, _CMP_EQ_OQ));
      const __m256 al = exp2_ps(_mm256_sub_ps(mold, msafe));
      __m256 l0 = _mm256_mul_ps(_mm256_loadu_ps(lrow + 8 * ci), al), l1 = _mm256_setzero_ps();
      int j = jlo;
      for (; j + 1 <= jhi; j += 2) {  // two chains: the adds do not serialize the exp2s
        float* sp = ST + j * kB + 8 * ci;
        const __m256 p0 = exp2_ps(_mm256_fmsub_ps(_mm256_loadu_ps(sp), c2v, msafe));
        const __m256 p1 = exp2_ps(_mm256_fmsub_ps(_mm256_loadu_ps(sp + kB), c2v, msafe));
        _mm256_storeu_ps(sp, p0);
        _mm256_storeu_ps(sp + kB, p1);
        l0 = _mm256_add_ps(l0, p0);
        l1 = _mm256_add_ps(l1, p1);
      }
      if (j <= jhi) {
        float* sp = ST + j * kB + 8 * ci;
        const __m256 p = exp2_ps(_mm256_fmsub_ps(_mm256_loadu_ps(sp), c2v, msafe));
        _mm256_storeu_ps(sp, p);
        l0 = _mm256_add_ps(l0, p);
      }
      _mm256_storeu_ps(mrow + 8 * ci, mnew);
      _mm256_storeu_ps(lrow + 8 * ci, _mm256_add_ps(l0, l1));
      _mm256_storeu_ps(alpha + 8 * ci, al);
    }
    if (jmax < 0) continue;
    // Rows of P^T in [jmin, jmax] outside a column chunk's own range must read as zero.
    for (int ci = 0; ci < nc; ++ci) {
      const int q0 = qs + 8 * ci, q1 = std::min(q0 + 7, qs + nq - 1);
      const int jlo = W > 0 ? std::max(0, q0 - W + 1 - ks) : 0, jhi = std::min(nk - 1, q1 - ks);
      for (int j = jmin; j < std::min(jlo, jmax + 1); ++j)
        _mm256_storeu_ps(ST + j * kB + 8 * ci, _mm256_setzero_ps());
      for (int j = std::max(jhi + 1, jmin); j <= jmax; ++j)
        _mm256_storeu_ps(ST + j * kB + 8 * ci, _mm256_setzero_ps());
    }
    for (int i = 0; i < nq; ++i) {
      const float a = alpha[i];
      if (a == 1.0f) continue;
      const __m256 av = _mm256_set1_ps(a);
      for (int d = 0; d < Dv; d += 8)
        _mm256_storeu_ps(O + i * Dvp + d, _mm256_mul_ps(av, _mm256_loadu_ps(O + i * Dvp + d)));
    }
    // O[i, :] += sum_j P^T[j, i] v_j
    gemm<true>(nq, Dv, jmax - jmin + 1, ST + jmin * kB, 1, kB, w.Vc + (ks + jmin) * Dvp, Dvp, O,
               Dvp, w.Vc + (ks + kB) * Dvp, nnext * Dvp, diag ? Tri::KHi : Tri::None, -jmin);
  }
  const int dv8 = Dv & ~7;
  for (int i = 0; i < nq; ++i) {
    const int t = qs + i;
    const float l = lrow[i], inv = l > 0.0f ? 1.0f / l : 0.0f;
    const __m256 iv = _mm256_set1_ps(inv);
    float* orow = ob_ + t * sv;
    const float* Or = O + i * Dvp;
    for (int d = 0; d < dv8; d += 8) _mm256_storeu_ps(orow + d, _mm256_mul_ps(iv, _mm256_loadu_ps(Or + d)));
    for (int d = dv8; d < Dv; ++d) orow[d] = inv * Or[d];
    c.lse[int64_t{bh} * T + t] = l > 0.0f ? (mrow[i] + std::log2(l)) * kLn2 : kNegInf;
  }
}

// Query blocks chunk, chunk + nchunk, ... of one (b, h), in increasing order: the k, v rows
// each block adds are packed just before it.
void fwd_item(const FwdCtx& c, int bh, int chunk) {
  const FlushDenormals ftz;
  const AttnShape& sh = c.sh;
  const int T = sh.T, H = sh.H, Dqk = sh.Dqk, Dv = sh.Dv, W = sh.window;
  const int b = bh / H, h = bh % H;
  const int64_t sq = int64_t{H} * Dqk, sv = int64_t{H} * Dv;
  const float* kb_ = c.k + (int64_t{b} * T * H + h) * Dqk;
  const float* vb_ = c.v + (int64_t{b} * T * H + h) * Dv;
  const int64_t Dqkp = round8(Dqk), Dvp = round8(Dv), Tp = round8(T);
  float* Kc = thread_scratch((Dqkp + Dvp) * Tp + (Dqkp + Dvp) * kB + kB * kB + 3 * kB);
  float* Vc = Kc + Tp * Dqkp;
  FwdBufs w{Kc, Vc, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, Dqkp, Dvp};
  w.QT = Vc + Tp * Dvp;     // [d][query i]
  w.ST = w.QT + Dqkp * kB;  // [key j][query i]
  w.O = w.ST + kB * kB;     // [query i][Dvp]
  w.mrow = w.O + kB * Dvp;  // running max of scaled scores (log2 units)
  w.lrow = w.mrow + kB;     // running sum
  w.alpha = w.lrow + kB;
  // Keys before `packed` are seen by no query of this item (sliding window).
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
  const FlushDenormals ftz;
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

  const int64_t Dqkp = round8(Dqk), Dvp = round8(Dv), Tp = round8(T);
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
  const int dv8 = Dv & ~7;
  for (int t = t0; t < T; ++t) {
    const float* a = dOc + t * Dvp;
    const float* o = ob_ + t * sv;
    __m256 acc = _mm256_setzero_ps();
    for (int d = 0; d < dv8; d += 8)
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(o + d), acc);
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, acc);
    float s = 0.0f;
    for (int i = 0; i < 8; ++i) s += lanes[i];
    for (int d = dv8; d < Dv; ++d) s += a[d] * o[d];
    delta[t] = s;
    lse2[t] = c.lse[int64_t{bh} * T + t] * kLog2e;
  }
  std::memset(dQc + t0 * Dqkp, 0, sizeof(float) * (T - t0) * Dqkp);

  const __m256 c2v = _mm256_set1_ps(c2), scv = _mm256_set1_ps(sh.scale);
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  alignas(32) int32_t kseg[kB];
  for (int kb = split; kb < c.nkb; kb += c.nsplit) {
    const int ks = kb * kB, nk = std::min(kB, T - ks), nck = (nk + 7) / 8;
    pack_rows(Kc, Dqkp, kb_ + ks * sq, sq, 0, nk, Dqk);
    pack_transposed(Kc, Dqkp, nk, Dqk, KT);
    pack_transposed(vb_ + ks * sv, sv, nk, Dv, VT);
    for (int j = 0; j < kB; ++j) kseg[j] = segrow && j < nk ? segrow[ks + j] : 0;
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
            _mm256_storeu_ps(pr + 8 * cj, _mm256_setzero_ps());
            _mm256_storeu_ps(dr + 8 * cj, _mm256_setzero_ps());
          }
          continue;
        }
        const __m256 L = _mm256_set1_ps(lse2[t]), dl = _mm256_set1_ps(delta[t]);
        const __m256i tsg = _mm256_set1_epi32(segrow ? segrow[t] : 0);
        const __m256i lo = _mm256_set1_epi32(jlo - 1), hi = _mm256_set1_epi32(jhi + 1);
        for (int cj = 0; cj < nck; ++cj) {
          const __m256 p = exp2_ps(_mm256_fmsub_ps(_mm256_loadu_ps(pr + 8 * cj), c2v, L));
          const __m256 ds = _mm256_mul_ps(_mm256_mul_ps(p, scv),
                                          _mm256_sub_ps(_mm256_loadu_ps(dr + 8 * cj), dl));
          if (kind == 2) {
            _mm256_storeu_ps(pr + 8 * cj, p);
            _mm256_storeu_ps(dr + 8 * cj, ds);
            continue;
          }
          const __m256i jv = _mm256_add_epi32(iota, _mm256_set1_epi32(8 * cj));
          __m256i m = _mm256_and_si256(_mm256_cmpgt_epi32(jv, lo), _mm256_cmpgt_epi32(hi, jv));
          if (segrow)
            m = _mm256_and_si256(
                m, _mm256_cmpeq_epi32(
                       _mm256_load_si256(reinterpret_cast<const __m256i*>(kseg + 8 * cj)), tsg));
          // Masked lanes may hold stale values (trimmed columns): and-ing clears even NaN.
          _mm256_storeu_ps(pr + 8 * cj, _mm256_and_ps(p, as_ps(m)));
          _mm256_storeu_ps(dr + 8 * cj, _mm256_and_ps(ds, as_ps(m)));
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

void attention_fwd_avx2(const AttnShape& sh, const float* q, const float* k, const float* v,
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

void attention_bwd_avx2(const AttnShape& sh, const float* q, const float* k, const float* v,
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
