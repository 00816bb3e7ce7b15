// Flash attention on the bf16 dot-product instruction (see attention_avx512bf16.h): the tiling,
// work split, masks and online softmax of kernels/cpu/attention_tiles.h (read that first), with
// every tile product on vdpbf16ps.
//
// vdpbf16ps adds, per f32 lane n, a[2n] b[2n] + a[2n+1] b[2n+1]: both operands hold PAIRS of bf16
// along the reduction dimension in one 32-bit word (element 2p in the low half, 2p+1 in the high
// half). The micro-kernel computes C[m, n] (+)= sum_p A(m, p) . B(p, n) over K = 2 KP reduction
// elements, A(m, p) broadcast as one word under any strides, B(p, n) read as 16-word vectors
// from rows of words. So each operand is packed, with the bf16 rounding, into one of:
//   rows    [m][p]   the pairs are neighbours in a row: a plain conversion (q, k, v, dO rows for
//                    A; the backward's dS rows for dQ += dS K);
//   pairs   [p][n]   row pairs interleaved (VNNI order: k, v, q, dO as B; the forward's P^T and
//                    the backward's P, dS as A, broadcast per pair of rows);
//   words^T [p][n]   the word matrix of "rows" transposed (Q^T, K^T, V^T as B of Q K^T, dO V^T).
// q, k, v and dO are packed once per work item (forward: the k and v rows each query block adds;
// backward: q and dO of the item, k and v per key block); P and dS once per tile. An odd reduction
// length pairs its last element with a zero. Trimming the causal triangle keeps whole pairs: the
// extra element of a straddling pair is a masked (zero) probability. Query rows Tq < T (the last
// Tq positions) as in attention_tiles.h: tiles on the grid of positions, the absent rows of the
// tile holding the first query zero.
#include "kernels/cpu/attention_avx512bf16.h"

// The AVX-512 helpers (V16: exp2, masks, the 16 x 16 transpose). This file's flags are the
// AVX-512 files' plus -mavx512bf16, and those inline helpers use no bf16 instruction: whichever
// copy the linker keeps runs on any AVX-512 CPU.
#include "kernels/cpu/simd_avx512.h"

#include <xmmintrin.h>  // _mm_prefetch

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "core/error.h"
#include "core/parallel.h"
#include "kernels/cpu/attention_split.h"
#include "kernels/cpu/kernel_scratch.h"

namespace trex::kern::cpu {
namespace {

using avx512::V16;
using avx512::tail_mask;
using W32 = uint32_t;  // two bf16 of neighbouring reduction elements

// Rows of a query tile and keys of a key tile. bench-v3's heads (H 8, Dqk 96, Dv 64) on 2 Zen 5
// cores, forward / backward ms a layer, 64 -> 192: 7.72 / 18.28 -> 7.44 / 17.75 at 2048 tokens,
// 115 / 279.5 -> 108.6 / 265.1 at 8192, 1789 / 4917 -> 1715 / 4327 at 32768 (128 and 256 between).
constexpr int kB = 192;
constexpr int kR = 6;    // micro-kernel rows (broadcast operand)
constexpr int kNV = 4;   // micro-kernel vectors of 16 columns
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int64_t round16(int64_t n) { return (n + 15) / 16 * 16; }
int pairs_of(int n) { return (n + 1) / 2; }

// C[r, 0:16 NV] (+)= sum_p A[r sam + p sak] . B[p ldb + 0:16 NV] for r < R, p < KP; the last
// vector of each row of B and C is limited by the lane mask `mlast`. Step p also prefetches the
// cache line pf + 64 p into L2.
template <int R, int NV, bool ACC>
void micro(int KP, const W32* A, int64_t sam, int64_t sak, const W32* B, int64_t ldb, float* C,
           int64_t ldc, __mmask16 mlast, const char* pf) {
  __m512 c[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      c[r][v] = !ACC            ? _mm512_setzero_ps()
                : v == NV - 1   ? _mm512_maskz_loadu_ps(mlast, C + r * ldc + 16 * v)
                                : _mm512_loadu_ps(C + r * ldc + 16 * v);
  for (int p = 0; p < KP; ++p) {
    _mm_prefetch(pf + 64 * p, _MM_HINT_T1);
    __m512i b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      b[v] = v == NV - 1 ? _mm512_maskz_loadu_epi32(mlast, B + p * ldb + 16 * v)
                         : _mm512_loadu_si512(B + p * ldb + 16 * v);
    const W32* a = A + p * sak;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512i ar = _mm512_set1_epi32(static_cast<int>(a[r * sam]));
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v)
        c[r][v] = _mm512_dpbf16_ps(c[r][v], (__m512bh)ar, (__m512bh)b[v]);
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

// The micro-kernels of every shape (rows 1..kR x vectors 1..kNV), overwriting or accumulating.
struct Micro {
  using Fn = void (*)(int, const W32*, int64_t, int64_t, const W32*, int64_t, float*, int64_t,
                      __mmask16, const char*);
  template <bool ACC, int R, int... Vs>
  static constexpr std::array<Fn, kNV> row(std::integer_sequence<int, Vs...>) {
    return {{&micro<R, Vs + 1, ACC>...}};
  }
  template <bool ACC, int... Rs>
  static constexpr auto table(std::integer_sequence<int, Rs...>) {
    return std::array<std::array<Fn, kNV>, sizeof...(Rs)>{
        {row<ACC, Rs + 1>(std::make_integer_sequence<int, kNV>{})...}};
  }
};
constexpr auto kMicroSet = Micro::table<false>(std::make_integer_sequence<int, kR>{});
constexpr auto kMicroAcc = Micro::table<true>(std::make_integer_sequence<int, kR>{});

// Triangular trimming on the causal diagonal, as in attention_tiles.h: row m of C only needs
// columns n (or reduction elements k) on one side of m + off.
enum class Tri { None, NLo, NHi, KLo, KHi };  // n >= m+off, n <= m+off, k >= m+off, k <= m+off

// C[M, N] (+)= A[M, K] B[K, N] with K = 2 KP: A(m, pair p) = A[m*sam + p*sak],
// B(pair p, n) = B[p*ldb + n], C(m, n) = C[m*ldc + n]. ACC = false overwrites C (also when
// KP == 0) except the columns a Tri::NLo / NHi trim skips, which the caller must not read. A K
// trim keeps the pair that straddles its edge. The pf_bytes at pf are prefetched into L2 on the
// way.
template <bool ACC>
void gemm(int M, int N, int KP, const W32* A, int64_t sam, int64_t sak, const W32* B, int64_t ldb,
          float* C, int64_t ldc, const void* pf = nullptr, int64_t pf_bytes = 0,
          Tri tri = Tri::None, int off = 0) {
  constexpr int NB = 16 * kNV;
  const auto& tab = ACC ? kMicroAcc : kMicroSet;
  int64_t pf_done = 0;
  auto tile = [&](int m0, int r, int n0, int n1) {
    int na = n0, nb = n1, ka = 0, kb = KP;
    if (tri == Tri::NLo) na = std::max(na, (m0 + off) & ~15);
    if (tri == Tri::NHi) nb = std::min(nb, m0 + r + off);
    if (tri == Tri::KLo) ka = std::clamp(m0 + off, 0, 2 * KP) / 2;
    if (tri == Tri::KHi) kb = (std::clamp(m0 + r + off, 0, 2 * KP) + 1) / 2;
    if (na >= nb) return;
    const int nv = (nb - na + 15) / 16, nk = std::max(kb - ka, 0);
    const char* p = pf_done < pf_bytes ? static_cast<const char*>(pf) + pf_done
                                       : reinterpret_cast<const char*>(B);
    pf_done += 64 * int64_t{nk};
    tab[r - 1][nv - 1](nk, A + m0 * sam + ka * sak, sam, sak, B + ka * ldb + na, ldb,
                       C + m0 * ldc + na, ldc, tail_mask(nb - na - 16 * (nv - 1)), p);
  };
  // Column blocks outside row groups; rows in ceil(M / kR) groups of near-equal size.
  const int ng = (M + kR - 1) / kR;
  for (int n0 = 0; n0 < N; n0 += NB)
    for (int g = 0, m0 = 0; g < ng; ++g) {
      const int r = (M - m0) / (ng - g);
      tile(m0, r, n0, std::min(N, n0 + NB));
      m0 += r;
    }
}

// 16 words (bf16(a[i]) | bf16(b[i]) << 16), bf16 rounded to nearest even.
inline __m512i pair_words(__m512 a, __m512 b) {
  alignas(64) static constexpr uint16_t kIdx[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,
                                                    21, 6, 22, 7, 23, 8, 24, 9, 25, 10, 26,
                                                    11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i x = (__m512i)_mm512_cvtne2ps_pbh(b, a);  // words 0..15 bf16(a), 16..31 bf16(b)
  return _mm512_permutexvar_epi16(_mm512_load_si512(kIdx), x);
}

// "rows": dst[t*ldw + p] = bf16 pair (src[t*stride + 2p], src[t*stride + 2p + 1]) for rows
// t in [t0, t1), p < ldw (ldw a multiple of 16; elements past D are zero). Rows of [B,T,H,D] are a
// page apart: prefetch a few ahead.
void pack_rows_bf(W32* dst, int64_t ldw, const float* src, int64_t stride, int t0, int t1, int D) {
  constexpr int kAhead = 6;
  for (int t = t0; t < t1; ++t) {
    if (t + kAhead < t1)
      for (int d = 0; d < D; d += 16)
        _mm_prefetch(reinterpret_cast<const char*>(src + (t + kAhead) * stride + d), _MM_HINT_T0);
    const float* s = src + t * stride;
    W32* o = dst + t * ldw;
    for (int p0 = 0; p0 < ldw; p0 += 16) {
      const int d = 2 * p0;
      const __m512 a = _mm512_maskz_loadu_ps(tail_mask(D - d), s + d);
      const __m512 b = _mm512_maskz_loadu_ps(tail_mask(D - d - 16), s + d + 16);
      _mm512_storeu_si512(o + p0, (__m512i)_mm512_cvtne2ps_pbh(b, a));
    }
  }
}

// "pairs": dst[(p - p0)*ldw + x] = bf16 pair (row 2p, row 2p + 1)[x] for pairs p in [p0, p1),
// x < round16(n) (columns past n are zero), where row r is src[(r - rlo)*stride + x] if
// rlo <= r < rhi and zero otherwise (src points at row rlo).
void pack_pairs_bf(W32* dst, int64_t ldw, const float* src, int64_t stride, int p0, int p1,
                   int rlo, int rhi, int n) {
  for (int p = p0; p < p1; ++p) {
    const int r0 = 2 * p, r1 = 2 * p + 1;
    const bool u0 = r0 >= rlo && r0 < rhi, u1 = r1 >= rlo && r1 < rhi;
    const float* s0 = u0 ? src + int64_t{r0 - rlo} * stride : src;
    const float* s1 = u1 ? src + int64_t{r1 - rlo} * stride : src;
    if (u1 && p + 2 < p1)  // the rows two pairs ahead (a page apart in [B,T,H,D])
      for (int x = 0; x < n; x += 16) {
        _mm_prefetch(reinterpret_cast<const char*>(s0 + 4 * stride + x), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(s1 + 4 * stride + x), _MM_HINT_T0);
      }
    W32* o = dst + int64_t{p - p0} * ldw;
    for (int x = 0; x < n; x += 16) {
      const __mmask16 m = tail_mask(n - x);
      const __m512 a = _mm512_maskz_loadu_ps(u0 ? m : __mmask16(0), u0 ? s0 + x : src);
      const __m512 b = _mm512_maskz_loadu_ps(u1 ? m : __mmask16(0), u1 ? s1 + x : src);
      _mm512_storeu_si512(o + x, pair_words(a, b));
    }
  }
}

// "words^T": dst[p*kB + i] = src[i*lds + p] for i < n (columns n..kB-1 of dst are zero), p < P,
// in 16 x 16 register transposes (bit patterns move unchanged).
void transpose_words(const W32* src, int64_t lds, int n, int P, W32* dst) {
  for (int i0 = 0; i0 < kB; i0 += 16) {
    const int nr = std::clamp(n - i0, 0, 16);
    for (int p0 = 0; p0 < P; p0 += 16)
      V16::transpose_tile(reinterpret_cast<const float*>(src + i0 * lds + p0), lds, nr,
                          std::min(16, P - p0), reinterpret_cast<float*>(dst + p0 * kB + i0), kB);
  }
}

// dst[0, D) += src[0, D).
void add_row(float* dst, const float* src, int D) {
  for (int d = 0; d < D; d += 16) {
    const __mmask16 m = tail_mask(D - d);
    _mm512_mask_storeu_ps(dst + d, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, dst + d), _mm512_maskz_loadu_ps(m, src + d)));
  }
}

// Widths: P* pairs of a row, W* words of a packed row (multiple of 16), *p floats / words of a
// B-operand or f32 row (multiple of 16).
struct Dims {
  int Dqk, Dv, DqkP, DvP;
  int64_t DqkW, DvW, Dqkp, Dvp;
  explicit Dims(const AttnShape& sh)
      : Dqk(sh.Dqk), Dv(sh.Dv), DqkP(pairs_of(sh.Dqk)), DvP(pairs_of(sh.Dv)),
        DqkW(round16(DqkP)), DvW(round16(DvP)), Dqkp(round16(sh.Dqk)), Dvp(round16(sh.Dv)) {}
};

// ---------------------------------------------------------------------------------- forward --

struct FwdCtx {
  const AttnShape& sh;
  const float *q, *k, *v;
  float *o, *lse;
  const int32_t* seg;
  int nqb, nchunk;
  int qb0;  // the first query tile (the one holding position T - Tq)
};

// Per-thread buffers of one forward item.
struct FwdBufs {
  const W32* Kw;  // [t][DqkW] k rows ("rows")
  const W32* Vv;  // [t/2][Dvp] v row pairs ("pairs")
  W32 *Qw, *QT, *PT;  // q rows of the block [i][DqkW]; Q^T [p][i]; P^T pairs [j/2][i]
  float *ST, *O, *mrow, *lrow, *alpha;
};

// One (b, h, query block): online softmax over its visible key tiles; writes o and lse rows.
void fwd_block(const FwdCtx& c, const Dims& dm, const FwdBufs& w, int bh, int qb) {
  using T = __m512;
  constexpr int L = 16;
  const AttnShape& sh = c.sh;
  const int T_ = sh.T, Tq = sh.rows(), off = T_ - Tq, H = sh.H, Dqk = sh.Dqk, Dv = sh.Dv, W = sh.window;
  const int b = bh / H, h = bh % H;
  const int64_t sq = int64_t{H} * Dqk, sv = int64_t{H} * Dv;
  const int64_t DqkW = dm.DqkW, Dvp = dm.Dvp;
  const float* qb_ = c.q + (int64_t{b} * Tq * H + h) * Dqk;  // query row u: position off + u
  float* ob_ = c.o + (int64_t{b} * Tq * H + h) * Dv;
  const int32_t* segrow = c.seg ? c.seg + int64_t{b} * T_ : nullptr;
  const int qs = qb * kB, nq = std::min(kB, T_ - qs), nc = (nq + L - 1) / L;
  const int lead = std::max(0, off - qs);  // absent rows [0, lead) of the tile
  const float c2 = sh.scale * kLog2e;
  float *ST = w.ST, *O = w.O, *mrow = w.mrow, *lrow = w.lrow, *alpha = w.alpha;

  std::memset(w.Qw, 0, sizeof(W32) * lead * DqkW);
  pack_rows_bf(w.Qw + lead * DqkW, DqkW, qb_ + (qs + lead - off) * sq, sq, 0, nq - lead, Dqk);
  transpose_words(w.Qw, DqkW, nq, dm.DqkP, w.QT);
  std::memset(ST, 0, sizeof(float) * kB * kB);
  std::memset(O, 0, sizeof(float) * kB * Dvp);
  for (int i = 0; i < kB; ++i) mrow[i] = kNegInf, lrow[i] = 0.0f;
  alignas(64) int32_t qseg[kB];
  for (int i = 0; i < kB; ++i) qseg[i] = segrow ? segrow[qs + std::min(i, nq - 1)] : 0;

  const int kb_lo = W > 0 ? std::max(0, qs - W + 1) / kB : 0, kb_hi = (qs + nq - 1) / kB;
  const T c2v = V16::set1(c2), ninf = V16::set1(kNegInf);
  for (int kb = kb_lo; kb <= kb_hi; ++kb) {
    const int ks = kb * kB, nk = std::min(kB, T_ - ks);
    const int kind = tile_kind(sh, qs + lead, nq - lead, ks, nk, segrow);
    if (kind == 0) continue;
    // S^T[j, i] = k_j . q_i, prefetching the next key tile's k, v rows.
    const int64_t nnext = kb < kb_hi ? std::min(kB, T_ - ks - kB) : 0;
    const bool diag = ks == qs;  // then query i sees key j only if j <= i
    gemm<false>(nk, nq, dm.DqkP, w.Kw + ks * DqkW, DqkW, 1, w.QT, kB, ST, kB,
                w.Kw + (ks + kB) * DqkW, 4 * nnext * DqkW, diag ? Tri::NLo : Tri::None, 0);
    // Keys of this tile that some query of the 16-column chunk ci may see: [jlo, jhi]; over
    // the tile, [jmin, jmax].
    auto keys_of = [&](int ci) {
      const int q0 = qs + L * ci, q1 = std::min(q0 + L - 1, qs + nq - 1);
      return std::pair{W > 0 ? std::max(0, q0 - W + 1 - ks) : 0, std::min(nk - 1, q1 - ks)};
    };
    int jmin = nk, jmax = -1;
    for (int ci = 0; ci < nc; ++ci)
      if (const auto [jlo, jhi] = keys_of(ci); jlo <= jhi)
        jmin = std::min(jmin, jlo), jmax = std::max(jmax, jhi);
    if (jmax < 0) continue;
    // P^T goes straight from registers into key row pairs je/2 + [0, np) (je = jmin rounded
    // down to a pair boundary), the A operand of O += P^T V: zero outside [jlo, jhi] and
    // on query columns past nq.
    const int je = jmin & ~1, np = (jmax - je + 2) / 2;
    for (int ci = 0; ci < nc; ++ci) {
      const auto [jlo, jhi] = keys_of(ci);
      const int q0 = qs + L * ci;
      if (jlo > jhi) {
        V16::storeu(alpha + L * ci, V16::set1(1.0f));
        for (int q = 0; q < np; ++q) _mm512_storeu_si512(w.PT + q * kB + L * ci, _mm512_setzero_si512());
        continue;
      }
      T mx = ninf;
      if (kind == 2) {
        for (int j = jlo; j <= jhi; ++j) mx = V16::max(mx, V16::loadu(ST + j * kB + L * ci));
      } else {
        // Pairs a query may not see become -inf in S^T (exp2 makes them 0 below).
        const __m512i qi = V16::iota(q0), qsg = V16::loadi(qseg + L * ci);
        for (int j = jlo; j <= jhi; ++j) {
          float* sp = ST + j * kB + L * ci;
          const int kj = ks + j;
          __mmask16 m = V16::gt(qi, V16::seti(kj - 1));
          if (W > 0) m = V16::mand(m, V16::gt(V16::seti(kj + W), qi));
          if (segrow) m = V16::mand(m, V16::eq(qsg, V16::seti(segrow[kj])));
          const T s = V16::select(m, V16::loadu(sp), ninf);
          V16::storeu(sp, s);
          mx = V16::max(mx, s);
        }
      }
      // New running max (log2 units); lanes that have seen nothing yet use 0 as the offset.
      const T mold = V16::loadu(mrow + L * ci);
      const T mnew = V16::max(mold, V16::mul(mx, c2v));
      const T msafe = V16::select(V16::eqf(mnew, ninf), V16::zero(), mnew);
      const T al = V16::exp2(V16::sub(mold, msafe));
      // The row sum in two chains (the adds do not serialize the exp2s): chain 0 takes keys
      // jlo, jlo + 2, ... and the old sum, chain 1 the others, each in increasing j. le sums
      // the even keys, lo the odd ones.
      const bool odd = jlo & 1;
      const T l0 = V16::mul(V16::loadu(lrow + L * ci), al);
      T le = odd ? V16::zero() : l0, lo = odd ? l0 : V16::zero();
      const __mmask16 cm = tail_mask(nq - L * ci);
      for (int q = 0; q < np; ++q) {
        const int j = je + 2 * q;  // even
        T pe = V16::zero(), po = V16::zero();
        if (j >= jlo && j <= jhi) {
          pe = V16::exp2(V16::fmsub(V16::loadu(ST + j * kB + L * ci), c2v, msafe));
          le = V16::add(le, pe);
        }
        if (j + 1 >= jlo && j + 1 <= jhi) {
          po = V16::exp2(V16::fmsub(V16::loadu(ST + (j + 1) * kB + L * ci), c2v, msafe));
          lo = V16::add(lo, po);
        }
        _mm512_storeu_si512(w.PT + q * kB + L * ci, pair_words(V16::maskz(cm, pe), V16::maskz(cm, po)));
      }
      V16::storeu(mrow + L * ci, mnew);
      V16::storeu(lrow + L * ci, odd ? V16::add(lo, le) : V16::add(le, lo));
      V16::storeu(alpha + L * ci, al);
    }
    for (int i = 0; i < nq; ++i) {
      const float a = alpha[i];
      if (a == 1.0f) continue;
      const T av = V16::set1(a);
      for (int d = 0; d < Dv; d += L)
        V16::storeu(O + i * Dvp + d, V16::mul(av, V16::loadu(O + i * Dvp + d)));
    }
    // O[i, :] += sum_j P^T[j, i] v_j over keys [je, jmax].
    gemm<true>(nq, Dv, np, w.PT, 1, kB, w.Vv + (ks + je) / 2 * Dvp, Dvp, O, Dvp,
               w.Vv + (ks + kB) / 2 * Dvp, 4 * pairs_of(static_cast<int>(nnext)) * Dvp, diag ? Tri::KHi : Tri::None,
               -je);
  }
  for (int i = lead; i < nq; ++i) {
    const int u = qs + i - off;  // query row
    const float l = lrow[i], inv = l > 0.0f ? 1.0f / l : 0.0f;
    const T iv = V16::set1(inv);
    float* orow = ob_ + u * sv;
    for (int d = 0; d < Dv; d += L)
      V16::store_n(orow + d, V16::mul(iv, V16::loadu(O + i * Dvp + d)), Dv - d);
    c.lse[int64_t{bh} * Tq + u] = l > 0.0f ? (mrow[i] + std::log2(l)) * kLn2 : kNegInf;
  }
}

// Query blocks qb0 + chunk, qb0 + chunk + nchunk, ... of one (b, h), in increasing order: the
// k, v rows each block adds are packed just before it.
void fwd_item(const FwdCtx& c, int bh, int chunk) {
  const FlushDenormals ftz;
  const AttnShape& sh = c.sh;
  const Dims dm(sh);
  const int T = sh.T, H = sh.H, Dqk = sh.Dqk, Dv = sh.Dv, W = sh.window;
  const int b = bh / H, h = bh % H;
  const int64_t sq = int64_t{H} * Dqk, sv = int64_t{H} * Dv;
  const float* kb_ = c.k + (int64_t{b} * T * H + h) * Dqk;
  const float* vb_ = c.v + (int64_t{b} * T * H + h) * Dv;
  const int64_t Tp = round16(T);
  // 4-byte units; every piece a multiple of 16 (64-byte aligned).
  W32* Kw = reinterpret_cast<W32*>(thread_scratch(Tp * dm.DqkW + Tp / 2 * dm.Dvp + 2 * kB * dm.DqkW +
                                                  kB * kB + kB / 2 * kB + kB * dm.Dvp + 3 * kB));
  FwdBufs w{};
  W32* Vv = Kw + Tp * dm.DqkW;
  w.Kw = Kw, w.Vv = Vv;
  w.Qw = Vv + Tp / 2 * dm.Dvp;
  w.QT = w.Qw + kB * dm.DqkW;
  w.ST = reinterpret_cast<float*>(w.QT + kB * dm.DqkW);  // [key j][query i]
  w.PT = reinterpret_cast<W32*>(w.ST + kB * kB);
  w.O = reinterpret_cast<float*>(w.PT + kB / 2 * kB);  // [query i][Dvp]
  w.mrow = w.O + kB * dm.Dvp;  // running max of scaled scores (log2 units)
  w.lrow = w.mrow + kB;        // running sum
  w.alpha = w.lrow + kB;
  // Keys before `packed` are seen by no query of this item (sliding window); a multiple of kB.
  int packed = W > 0 ? std::max(0, (c.qb0 + chunk) * kB - W + 1) / kB * kB : 0;
  for (int qb = c.qb0 + chunk; qb < c.nqb; qb += c.nchunk) {
    const int t1 = std::min(T, (qb + 1) * kB);  // even unless it is T
    pack_rows_bf(Kw, dm.DqkW, kb_, sq, packed, t1, Dqk);
    pack_pairs_bf(Vv + packed / 2 * dm.Dvp, dm.Dvp, vb_ + packed * sv, sv, packed / 2, pairs_of(t1), packed, t1,
                  Dv);
    packed = t1;
    fwd_block(c, dm, w, bh, qb);
  }
}

// ---------------------------------------------------------------------------------- backward --

struct BwdCtx {
  const AttnShape& sh;
  const float *q, *k, *v, *o, *lse, *dO;
  float *dq, *dk, *dv;
  const int32_t* seg;
  int nkb, nsplit;
  float* dq_part;  // [B*H, nsplit, Tq, Dqk] when nsplit > 1
};

// One query row of a backward tile: its S and dP rows, and what decides its visible keys.
struct BwdRow {
  const float *pr, *dr;  // S and dP of the row, [key j]
  bool live;             // the row is present and sees some key of the tile
  __m512 Lv, dl;         // lse (log2 units), delta
  __m512i tsg, lo, hi;   // its segment; visible keys j satisfy lo < j < hi
};

// The backward's P = exp2(S c2 - lse2) and dS = P scale (dP - delta) of 16 keys of one query row,
// zero on the lanes outside m (masked lanes may hold stale values: the mask clears even NaN).
// Both of bwd_item's paths form them here, so they give the same bits.
inline void p_and_ds(__m512 S, __m512 dP, __m512 Lv, __m512 dl, __m512 c2v, __m512 scv, __mmask16 m, __m512& p,
                     __m512& ds) {
  const __m512 e = V16::exp2(V16::fmsub(S, c2v, Lv));
  p = V16::maskz(m, e);
  ds = V16::maskz(m, V16::mul(V16::mul(e, scv), V16::sub(dP, dl)));
}

// A backward tile that every one of its query rows sees whole (no mask, no trim, no absent row):
// S = Q K^T and dP = dO V^T in blocks of R <= kR rows x 32 keys held together in registers, then
// P and dS formed and packed from there as bwd_item's general path does (the same operations, so
// the same bits), the f32 S and dP never stored.
struct WholeTile {
  int nq, nk, DqkP, DvP;
  int64_t DqkW, DvW;
  const W32 *Qt, *KT, *dOt, *VT;  // q, dO rows of the tile; K^T, V^T of the key tile
  const float *lse2, *delta;      // of the tile's first row
  float c2, scale;
  W32 *PP, *DSP, *DSr;            // as in bwd_item
  const char *pfq, *pfd;          // the next tile's q, dO rows, fetched into L2 on the way
  int64_t nlq, nld;               // their cache lines
};

template <int R>
void whole_block(const WholeTile& a, int m0, int n0, int64_t lq0, int64_t lq1, int64_t ld0, int64_t ld1) {
  constexpr int L = 16;
  __m512 s[R][2], d[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) s[r][0] = s[r][1] = d[r][0] = d[r][1] = _mm512_setzero_ps();
  // Both products step through their reduction together while both last (24 independent
  // accumulator chains), then the longer one alone; each chain's order is its GEMM's.
  const W32* q = a.Qt + int64_t{m0} * a.DqkW;
  const W32* o = a.dOt + int64_t{m0} * a.DvW;
  auto step = [&](const W32* A, int64_t lda, const W32* B, int p, __m512 (*c)[2]) {
    const __m512i b0 = _mm512_loadu_si512(B + int64_t{p} * kB + n0);
    const __m512i b1 = _mm512_loadu_si512(B + int64_t{p} * kB + n0 + L);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512i ar = _mm512_set1_epi32(static_cast<int>(A[r * lda + p]));
      c[r][0] = _mm512_dpbf16_ps(c[r][0], (__m512bh)ar, (__m512bh)b0);
      c[r][1] = _mm512_dpbf16_ps(c[r][1], (__m512bh)ar, (__m512bh)b1);
    }
  };
  const int both = std::min(a.DqkP, a.DvP);
  int p = 0;
  for (; p < both; ++p) {
    if (lq0 + p < lq1) _mm_prefetch(a.pfq + 64 * (lq0 + p), _MM_HINT_T1);
    if (ld0 + p < ld1) _mm_prefetch(a.pfd + 64 * (ld0 + p), _MM_HINT_T1);
    step(q, a.DqkW, a.KT, p, s);
    step(o, a.DvW, a.VT, p, d);
  }
  for (int p1 = p; p1 < a.DqkP; ++p1) {
    if (lq0 + p1 < lq1) _mm_prefetch(a.pfq + 64 * (lq0 + p1), _MM_HINT_T1);
    step(q, a.DqkW, a.KT, p1, s);
  }
  for (int p1 = p; p1 < a.DvP; ++p1) {
    if (ld0 + p1 < ld1) _mm_prefetch(a.pfd + 64 * (ld0 + p1), _MM_HINT_T1);
    step(o, a.DvW, a.VT, p1, d);
  }
  // P = exp2(S c2 - lse2), dS = P scale (dP - delta); zero past nk and on rows that see nothing.
  const __m512 c2v = V16::set1(a.c2), scv = V16::set1(a.scale);
  const __mmask16 mk[2] = {tail_mask(a.nk - n0), tail_mask(a.nk - n0 - L)};
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const float l2 = a.lse2[m0 + r];
    const __m512 Lv = V16::set1(l2), dl = V16::set1(a.delta[m0 + r]);
    for (int h = 0; h < 2; ++h)
      p_and_ds(s[r][h], d[r][h], Lv, dl, c2v, scv, l2 == kNegInf ? __mmask16(0) : mk[h], s[r][h], d[r][h]);
  }
#pragma GCC unroll 4
  for (int q2 = 0; q2 < (R + 1) / 2; ++q2) {
    const int r0 = 2 * q2, r1 = 2 * q2 + 1;
    for (int h = 0; h < 2 && n0 + L * h < a.nk; ++h) {
      const int64_t at = int64_t{m0 / 2 + q2} * kB + n0 + L * h;
      _mm512_storeu_si512(a.PP + at, pair_words(s[r0][h], r1 < R ? s[r1][h] : _mm512_setzero_ps()));
      _mm512_storeu_si512(a.DSP + at, pair_words(d[r0][h], r1 < R ? d[r1][h] : _mm512_setzero_ps()));
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
    _mm512_storeu_si512(a.DSr + int64_t{m0 + r} * (kB / 2) + n0 / 2, (__m512i)_mm512_cvtne2ps_pbh(d[r][1], d[r][0]));
}

void whole_tile(const WholeTile& a) {
  using Fn = void (*)(const WholeTile&, int, int, int64_t, int64_t, int64_t, int64_t);
  static constexpr Fn kFns[kR] = {&whole_block<1>, &whole_block<2>, &whole_block<3>,
                                  &whole_block<4>, &whole_block<5>, &whole_block<6>};
  static_assert(kR == 6);
  const int ng = (a.nq + kR - 1) / kR, ncb = (a.nk + 31) / 32, nb = ng * ncb;
  const int64_t sq = (a.nlq + nb - 1) / nb, sd = (a.nld + nb - 1) / nb;  // lines a block
  int b = 0;
  for (int n0 = 0; n0 < a.nk; n0 += 32)
    for (int m0 = 0; m0 < a.nq; m0 += kR, ++b)
      kFns[std::min(kR, a.nq - m0) - 1](a, m0, n0, b * sq, std::min(a.nlq, (b + 1) * sq), b * sd,
                                        std::min(a.nld, (b + 1) * sd));
}

// One (b, h) and the key blocks split, split + nsplit, ...: dk, dv of those blocks (overwrite or,
// with sh.acc_dkv, add) and their contribution to dq.
void bwd_item(const BwdCtx& c, int bh, int split) {
  using T = __m512;
  constexpr int L = 16;
  const FlushDenormals ftz;
  const AttnShape& sh = c.sh;
  const Dims dm(sh);
  const int T_ = sh.T, Tq = sh.rows(), off = T_ - Tq, H = sh.H, Dqk = sh.Dqk, Dv = sh.Dv, W = sh.window;
  const int b = bh / H, h = bh % H;
  const int64_t sq = int64_t{H} * Dqk, sv = int64_t{H} * Dv;
  const int64_t oq = (int64_t{b} * T_ * H + h) * Dqk, ov = (int64_t{b} * T_ * H + h) * Dv;  // keys
  const int64_t lq = (int64_t{b} * Tq * H + h) * Dqk, lv = (int64_t{b} * Tq * H + h) * Dv;  // queries
  // q, o, dO: row u is position off + u.
  const float *qb_ = c.q + lq, *kb_ = c.k + oq, *vb_ = c.v + ov, *ob_ = c.o + lv, *dOb = c.dO + lv;
  float *dkb = c.dk + oq, *dvb = c.dv + ov;
  const int32_t* segrow = c.seg ? c.seg + int64_t{b} * T_ : nullptr;
  const float c2 = sh.scale * kLog2e;
  const int nqb = (T_ + kB - 1) / kB, qb0 = off / kB;
  const int64_t DqkW = dm.DqkW, DvW = dm.DvW, Dqkp = dm.Dqkp, Dvp = dm.Dvp;

  // 4-byte units; every piece a multiple of 16 (64-byte aligned).
  const int64_t Tp = round16(T_);
  W32* Qw = reinterpret_cast<W32*>(thread_scratch(
      Tp * (DqkW + DvW + Dqkp) + Tp / 2 * (Dqkp + Dvp) + kB * 2 * (DqkW + DvW) +
      kB / 2 * Dqkp + 2 * kB * kB + 3 * kB / 2 * kB + kB * (Dqkp + Dvp) + 2 * Tp));
  W32* dOw = Qw + Tp * DqkW;     // [t][DvW]: dO rows
  W32* Qv = dOw + Tp * DvW;      // [t/2][Dqkp]: q row pairs
  W32* dOv = Qv + Tp / 2 * Dqkp; // [t/2][Dvp]: dO row pairs
  float* dQc = reinterpret_cast<float*>(dOv + Tp / 2 * Dvp);  // [t][Dqkp]: this item's dq
  W32* Kw = reinterpret_cast<W32*>(dQc + Tp * Dqkp);  // [j][DqkW]: k rows of the key tile
  W32* Vw = Kw + kB * DqkW;      // [j][DvW]: v rows
  W32* KT = Vw + kB * DvW;       // [p][j]: K^T
  W32* VT = KT + DqkW * kB;      // [p][j]: V^T
  W32* Kv = VT + DvW * kB;       // [j/2][Dqkp]: k row pairs
  float* P = reinterpret_cast<float*>(Kv + kB / 2 * Dqkp);  // [query i][key j]
  float* DS = P + kB * kB;       // dP, then dS, [i][j]
  W32* PP = reinterpret_cast<W32*>(DS + kB * kB);  // [i/2][j]: P row pairs
  W32* DSP = PP + kB / 2 * kB;   // [i/2][j]: dS row pairs
  W32* DSr = DSP + kB / 2 * kB;  // [i][j/2]: dS rows
  float* dKa = reinterpret_cast<float*>(DSr + kB * kB / 2);  // [j][Dqkp]
  float* dVa = dKa + kB * Dqkp;  // [j][Dvp]
  float* delta = dVa + kB * Dvp;
  float* lse2 = delta + Tp;
  const int t0 = split * kB;  // the first position any key block of this split is seen from
  // Query positions [tq0, T) are packed, [tz, tq0) are absent rows of the first tile read (tz
  // even: a multiple of kB).
  const int tq0 = std::max(t0, off), tz = std::max(t0, qb0 * kB);
  const float *qt0 = qb_ + int64_t{tq0 - off} * sq, *dOt0 = dOb + int64_t{tq0 - off} * sv;
  std::memset(Qw + int64_t{tz} * DqkW, 0, sizeof(W32) * (tq0 - tz) * DqkW);
  std::memset(dOw + int64_t{tz} * DvW, 0, sizeof(W32) * (tq0 - tz) * DvW);
  pack_rows_bf(Qw + int64_t{tq0} * DqkW, DqkW, qt0, sq, 0, T_ - tq0, Dqk);
  pack_rows_bf(dOw + int64_t{tq0} * DvW, DvW, dOt0, sv, 0, T_ - tq0, Dv);
  pack_pairs_bf(Qv + tz / 2 * Dqkp, Dqkp, qt0, sq, tz / 2, pairs_of(T_), tq0, T_, Dqk);
  pack_pairs_bf(dOv + tz / 2 * Dvp, Dvp, dOt0, sv, tz / 2, pairs_of(T_), tq0, T_, Dv);
  for (int t = tz; t < tq0; ++t) delta[t] = 0.0f, lse2[t] = kNegInf;
  for (int t = tq0; t < T_; ++t) {  // delta = rowsum(dO o) in f32
    const float* a = dOb + int64_t{t - off} * sv;
    const float* o = ob_ + int64_t{t - off} * sv;
    T acc = V16::zero();
    for (int d = 0; d < Dv; d += L) acc = V16::fmadd(V16::load_n(a + d, Dv - d), V16::load_n(o + d, Dv - d), acc);
    delta[t] = V16::reduce_add(acc);
    lse2[t] = c.lse[int64_t{bh} * Tq + t - off] * kLog2e;
  }
  std::memset(dQc + tz * Dqkp, 0, sizeof(float) * (T_ - tz) * Dqkp);

  const T c2v = V16::set1(c2), scv = V16::set1(sh.scale);
  alignas(64) int32_t kseg[kB];
  for (int kb = split; kb < c.nkb; kb += c.nsplit) {
    const int ks = kb * kB, nk = std::min(kB, T_ - ks), nck = (nk + L - 1) / L;
    pack_rows_bf(Kw, DqkW, kb_ + ks * sq, sq, 0, nk, Dqk);
    pack_rows_bf(Vw, DvW, vb_ + ks * sv, sv, 0, nk, Dv);
    transpose_words(Kw, DqkW, nk, dm.DqkP, KT);
    transpose_words(Vw, DvW, nk, dm.DvP, VT);
    pack_pairs_bf(Kv, Dqkp, kb_ + ks * sq, sq, 0, pairs_of(nk), 0, nk, Dqk);
    for (int j = 0; j < kB; ++j) kseg[j] = segrow && j < nk ? segrow[ks + j] : 0;
    std::memset(dKa, 0, sizeof(float) * nk * Dqkp);
    std::memset(dVa, 0, sizeof(float) * nk * Dvp);
    const int qb_hi = W > 0 ? std::min(nqb - 1, (ks + nk - 1 + W - 1) / kB) : nqb - 1;
    for (int qb = std::max(kb, qb0); qb <= qb_hi; ++qb) {
      const int qs = qb * kB, nq = std::min(kB, T_ - qs), np = pairs_of(nq);
      const int qp = std::max(qs, off);  // the tile's first present row
      const int kind = tile_kind(sh, qp, qs + nq - qp, ks, nk, segrow);
      if (kind == 0) continue;
      const W32* Qt = Qw + qs * DqkW;
      const W32* dOt = dOw + qs * DvW;
      // S = Q K^T and dP = dO V^T, prefetching the next query tile's q and dO rows.
      const int64_t nnext = qb < qb_hi ? std::min(kB, T_ - qs - kB) : 0;
      const bool diag = ks == qs;  // then query i sees key j only if j <= i
      const Tri tn = diag ? Tri::NHi : Tri::None, tkl = diag ? Tri::KLo : Tri::None,
                tkh = diag ? Tri::KHi : Tri::None;
      if (kind == 2 && !diag && qp == qs) {
        whole_tile(WholeTile{nq, nk, dm.DqkP, dm.DvP, DqkW, DvW, Qt, KT, dOt, VT, lse2 + qs, delta + qs, c2,
                             sh.scale, PP, DSP, DSr, reinterpret_cast<const char*>(Qt + kB * DqkW),
                             reinterpret_cast<const char*>(dOt + kB * DvW), nnext * DqkW / 16, nnext * DvW / 16});
      } else {
        gemm<false>(nq, nk, dm.DqkP, Qt, DqkW, 1, KT, kB, P, kB, Qt + kB * DqkW, 4 * nnext * DqkW, tn);
        gemm<false>(nq, nk, dm.DvP, dOt, DvW, 1, VT, kB, DS, kB, dOt + kB * DvW, 4 * nnext * DvW, tn);
        // P = exp2(S c2 - lse2) and dS = P scale (dP - delta) on the visible pairs, zero elsewhere
        // (absent or blind rows, masked pairs, columns past nk), packed straight from registers
        // into P and dS row pairs (the A operands of dV and dK) and dS rows (dQ's A).
        // Column chunks of 16 are taken two at a time: 32 columns of a row make 16 words.
        const int ncw = (nk + 2 * L - 1) / (2 * L);  // 32-column groups
        for (int pp = 0; pp < np; ++pp) {
          BwdRow rw[2];
          for (int r = 0; r < 2; ++r) {
            const int i = 2 * pp + r, t = qs + i;
            BwdRow& x = rw[r];
            x.pr = P + i * kB, x.dr = DS + i * kB;
            const int jlo = W > 0 ? std::max(0, t - W + 1 - ks) : 0, jhi = std::min(nk - 1, t - ks);
            x.live = i < nq && jlo <= jhi && lse2[t] != kNegInf;
            if (!x.live) continue;
            x.Lv = V16::set1(lse2[t]), x.dl = V16::set1(delta[t]);
            x.tsg = V16::seti(segrow ? segrow[t] : 0);
            x.lo = V16::seti(jlo - 1), x.hi = V16::seti(jhi + 1);
          }
          // Row r's p and dS on the columns of chunk cj.
          auto vals = [&](const BwdRow& x, int cj, T& p, T& ds) {
            if (!x.live || cj >= nck) {
              p = ds = V16::zero();
              return;
            }
            __mmask16 m = tail_mask(nk - L * cj);
            if (kind != 2) {
              const __m512i jv = V16::iota(L * cj);
              m = V16::mand(m, V16::mand(V16::gt(jv, x.lo), V16::gt(x.hi, jv)));
              if (segrow) m = V16::mand(m, V16::eq(V16::loadi(kseg + L * cj), x.tsg));
            }
            p_and_ds(V16::loadu(x.pr + L * cj), V16::loadu(x.dr + L * cj), x.Lv, x.dl, c2v, scv, m, p, ds);
          };
          for (int g = 0; g < ncw; ++g) {
            T p[2][2], ds[2][2];  // [row][chunk 2g + h]
            for (int r = 0; r < 2; ++r)
              for (int h = 0; h < 2; ++h) vals(rw[r], 2 * g + h, p[r][h], ds[r][h]);
            for (int h = 0; h < 2 && 2 * g + h < nck; ++h) {
              const int64_t o = int64_t{pp} * kB + 2 * L * g + L * h;
              _mm512_storeu_si512(PP + o, pair_words(p[0][h], p[1][h]));
              _mm512_storeu_si512(DSP + o, pair_words(ds[0][h], ds[1][h]));
            }
            for (int r = 0; r < 2 && 2 * pp + r < nq; ++r)
              _mm512_storeu_si512(DSr + (2 * pp + r) * (kB / 2) + L * g,
                                  (__m512i)_mm512_cvtne2ps_pbh(ds[r][1], ds[r][0]));
          }
        }
      }
      // dV += P^T dO and dK += dS^T Q, prefetching the next query tile's dO and q row pairs.
      const int64_t npn = pairs_of(static_cast<int>(nnext));
      gemm<true>(nk, Dv, np, PP, 1, kB, dOv + qs / 2 * Dvp, Dvp, dVa, Dvp, dOv + (qs + kB) / 2 * Dvp,
                 4 * npn * Dvp, tkl);
      gemm<true>(nk, Dqk, np, DSP, 1, kB, Qv + qs / 2 * Dqkp, Dqkp, dKa, Dqkp,
                 Qv + (qs + kB) / 2 * Dqkp, 4 * npn * Dqkp, tkl);
      gemm<true>(nq, Dqk, pairs_of(nk), DSr, kB / 2, 1, Kv, Dqkp, dQc + qs * Dqkp, Dqkp,  // dQ += dS K
                 dQc + (qs + kB) * Dqkp, 4 * nnext * Dqkp, tkh);
    }
    if (sh.acc_dkv) {
      for (int j = 0; j < nk; ++j) {
        add_row(dkb + (ks + j) * sq, dKa + j * Dqkp, Dqk);
        add_row(dvb + (ks + j) * sv, dVa + j * Dvp, Dv);
      }
    } else {
      for (int j = 0; j < nk; ++j) {
        std::memcpy(dkb + (ks + j) * sq, dKa + j * Dqkp, sizeof(float) * Dqk);
        std::memcpy(dvb + (ks + j) * sv, dVa + j * Dvp, sizeof(float) * Dv);
      }
    }
  }
  // dq rows (position off + u) before t0 get no contribution from this item.
  float* dqb = c.nsplit == 1 ? c.dq + lq : c.dq_part + (int64_t{bh} * c.nsplit + split) * Tq * Dqk;
  const int64_t ldq = c.nsplit == 1 ? sq : Dqk;
  for (int u = 0; u < Tq; ++u) {
    if (u + off < t0)
      std::memset(dqb + u * ldq, 0, sizeof(float) * Dqk);
    else
      std::memcpy(dqb + u * ldq, dQc + (u + off) * Dqkp, sizeof(float) * Dqk);
  }
}

}  // namespace

void attention_fwd_avx512bf16(const AttnShape& sh, const float* q, const float* k, const float* v,
                              float* o, float* lse, const int32_t* seg) {
  TREX_CHECK(sh.scale > 0.0f, "attention: scale must be > 0, got ", sh.scale);
  const int nqb = (sh.T + kB - 1) / kB, qb0 = (sh.T - sh.rows()) / kB;
  const int64_t BH = int64_t{sh.B} * sh.H;
  const int nchunk = attn_split_count(BH, nqb - qb0, 4);  // extra chunks only repack some k, v rows
  FwdCtx c{sh, q, k, v, o, lse, seg, nqb, nchunk, qb0};
  parallel_dynamic(BH * nchunk, [&](int64_t it) {
    fwd_item(c, static_cast<int>(it / nchunk), static_cast<int>(it % nchunk));
  });
}

void attention_bwd_avx512bf16(const AttnShape& sh, const float* q, const float* k, const float* v,
                              const float* o, const float* lse, const float* dO, float* dq,
                              float* dk, float* dv, const int32_t* seg) {
  TREX_CHECK(sh.scale > 0.0f, "attention: scale must be > 0, got ", sh.scale);
  const int nkb = (sh.T + kB - 1) / kB;
  const int64_t BH = int64_t{sh.B} * sh.H;
  const int nsplit = attn_split_count(BH, nkb, 2);  // each split costs a T x Dqk dq partial
  const DqPartials part = alloc_dq_partials(sh, nsplit);
  BwdCtx c{sh, q, k, v, o, lse, dO, dq, dk, dv, seg, nkb, nsplit, part.get()};
  parallel_dynamic(BH * nsplit, [&](int64_t it) {
    bwd_item(c, static_cast<int>(it / nsplit), static_cast<int>(it % nsplit));
  });
  if (nsplit > 1) sum_dq_partials(sh, nsplit, part.get(), dq);
}

}  // namespace trex::kern::cpu
