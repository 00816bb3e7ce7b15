// Flash attention (FlashAttention-2 style), forward and backward, written once over a vector
// traits type V (avx512::V16 in kernels/cpu/simd_avx512.h, avx2::V8 in kernels/cpu/simd_avx2.h)
// and instantiated by attention_avx512.cpp and attention_avx2.cpp; see kernels/attention.h.
// Include this header only from those two files: each compiles it with its own ISA flags, and
// everything here is in an anonymous namespace, so each gets its own copy (no inline function is
// shared between differently flagged translation units).
//
// Tiles are kB x kB (queries x keys). Every matrix product of a tile goes through one register-
// blocked micro-kernel (kR rows x V::kNV vectors of fp32 accumulators), C[m, n] (+)= A[m, k]
// B[k, n], with A read by broadcast under any strides and B rows read as vectors; while it runs it
// prefetches the next tile's operands into L2. B and C rows are padded to a multiple of the
// vector width (V8 computes the padding columns, never read back as data; V16 masks them off).
// Rows of [B,T,H,D] are H*D floats apart (a page or more apart for real shapes), out of reach of
// the hardware prefetchers and hard on the TLB, so each work item packs the rows of its (b, h)
// that tiles reuse into contiguous per-thread panels ([t][Dp], rows zero padded, huge pages where
// the OS allows) and works from those:
//   forward  (items: (b, h), split into interleaved query-block chunks only when B*H is small):
//            query blocks in increasing order, packing the k, v rows each adds. Per query block
//            Q^T is packed and each key tile computes S^T = K Q^T [keys x queries], so the online
//            softmax runs down columns with one lane per query (no horizontal reductions), then
//            O += P V with A = P^T read transposed. m, l are kept in log2 units (exp2 of a
//            pre-scaled exponent: a degree-6 polynomial and a power of two).
//   backward (items: (b, h), split into interleaved key-block sets only when B*H is small): q, dO
//            rows are packed and delta = rowsum(dO o) formed once per item; per key block K^T,
//            V^T and K are packed; per query tile S = Q K^T and dP = dO V^T, P = exp(S - lse),
//            dS = P (dP - delta) scale, then dV += P^T dO and dK += dS^T Q into key-tile
//            accumulators and dQ += dS K into a per-item dq panel, written out (or summed across
//            splits) at the end. No race: a (b, h, key block) belongs to one item.
// Query rows (sh.Tq < sh.T: the last Tq positions, bottom-right causal alignment): tiles stay on
// the grid of positions, so a query tile covers positions [qb kB, qb kB + kB) and its rows before
// the first query (position T - Tq) are absent: zero q and dO rows, lse -inf, never written out.
// Only the tile holding the first query has such rows; the tiles before it are not visited.
// Key tiles no query of the tile can see (causal, window, disjoint document ids) are skipped,
// masks are built only for partly visible tiles (diagonal, window edge, document boundary), and
// products on the causal diagonal skip the masked triangle (to micro-kernel granularity).
// Denormals are flushed while an item runs (kernels/cpu/kernel_scratch.h).
#pragma once
#include <xmmintrin.h>  // _mm_prefetch

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "core/error.h"
#include "core/parallel.h"
#include "kernels/attention.h"
#include "kernels/cpu/attention_split.h"
#include "kernels/cpu/kernel_scratch.h"

namespace trex::kern::cpu {
namespace {

constexpr int kB = 64;  // rows of a query tile and keys of a key tile
constexpr int kR = 6;   // micro-kernel rows (broadcast operand)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

template <class V>
int64_t round_v(int64_t n) {
  return (n + V::kW - 1) / V::kW * V::kW;
}

// C[r, 0:L*NV] (+)= sum_k A[r*sam + k*sak] * B[k*ldb + 0:L*NV] for r < R (L = V::kW); the last
// vector of each row of B and C is limited by `mlast` (V16: a lane mask; V8: whole vectors, so B
// and C rows must be readable / writable up to L*NV columns). Step k also prefetches the cache
// line pf + 64 k into L2 (the caller points pf at the next tile's operands).
template <class V, int R, int NV, bool ACC>
void micro(int K, const float* A, int64_t sam, int64_t sak, const float* B, int64_t ldb, float* C,
           int64_t ldc, typename V::Tail mlast, const char* pf) {
  constexpr int L = V::kW;
  typename V::T c[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      c[r][v] = !ACC            ? V::zero()
                : v == NV - 1   ? V::load_tail(mlast, C + r * ldc + L * v)
                                : V::loadu(C + r * ldc + L * v);
  for (int k = 0; k < K; ++k) {
    _mm_prefetch(pf + 64 * k, _MM_HINT_T1);
    typename V::T b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      b[v] = v == NV - 1 ? V::load_tail(mlast, B + k * ldb + L * v) : V::loadu(B + k * ldb + L * v);
    const float* a = A + k * sak;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const typename V::T ar = V::set1(a[r * sam]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) c[r][v] = V::fmadd(ar, b[v], c[r][v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      if (v == NV - 1)
        V::store_tail(C + r * ldc + L * v, mlast, c[r][v]);
      else
        V::storeu(C + r * ldc + L * v, c[r][v]);
    }
}

// The micro-kernels of every shape (rows 1..kR x vectors 1..V::kNV), overwriting or accumulating.
template <class V>
struct Micro {
  using Fn = void (*)(int, const float*, int64_t, int64_t, const float*, int64_t, float*, int64_t,
                      typename V::Tail, const char*);
  template <bool ACC, int R, int... Vs>
  static constexpr std::array<Fn, V::kNV> row(std::integer_sequence<int, Vs...>) {
    return {{&micro<V, R, Vs + 1, ACC>...}};
  }
  template <bool ACC, int... Rs>
  static constexpr auto table(std::integer_sequence<int, Rs...>) {
    return std::array<std::array<Fn, V::kNV>, sizeof...(Rs)>{
        {row<ACC, Rs + 1>(std::make_integer_sequence<int, V::kNV>{})...}};
  }
  static constexpr auto kSet = table<false>(std::make_integer_sequence<int, kR>{});
  static constexpr auto kAcc = table<true>(std::make_integer_sequence<int, kR>{});
};

// Triangular trimming for tiles on the causal diagonal: row m of C only needs columns n (or
// reduction steps k) on one side of m + off; rows go in groups, so groups trim conservatively.
enum class Tri { None, NLo, NHi, KLo, KHi };  // n >= m+off, n <= m+off, k >= m+off, k <= m+off

// C[M, N] (+)= A[M, K] B[K, N]; A(m, k) = A[m*sam + k*sak], B(k, n) = B[k*ldb + n],
// C(m, n) = C[m*ldc + n]. B and C rows must be readable / writable up to round_v(N) columns (V8
// computes those padding columns of C: the caller must not use them). ACC = false overwrites C
// (also when K == 0), except the columns that a Tri::NLo / NHi trim skips, which the caller must
// not read. While computing, the pf_len floats at pf (if any) are prefetched into L2, spread over
// the micro-kernel steps.
template <class V, bool ACC>
void gemm(int M, int N, int K, const float* A, int64_t sam, int64_t sak, const float* B,
          int64_t ldb, float* C, int64_t ldc, const float* pf = nullptr, int64_t pf_len = 0,
          Tri tri = Tri::None, int off = 0) {
  constexpr int L = V::kW, NB = L * V::kNV;
  const auto& tab = ACC ? Micro<V>::kAcc : Micro<V>::kSet;
  int64_t pf_done = 0;
  // One micro-kernel call: rows [m0, m0 + r), columns [n0, n1).
  auto tile = [&](int m0, int r, int n0, int n1) {
    int na = n0, nb = n1, ka = 0, kb = K;
    if (tri == Tri::NLo) na = std::max(na, (m0 + off) & ~(L - 1));
    if (tri == Tri::NHi) nb = std::min(nb, m0 + r + off);
    if (tri == Tri::KLo) ka = std::clamp(m0 + off, 0, K);
    if (tri == Tri::KHi) kb = std::clamp(m0 + r + off, 0, K);
    if (na >= nb) return;
    const int nv = (nb - na + L - 1) / L, nk = std::max(kb - ka, 0);
    // Past the region, prefetch B again (in cache already: nearly free).
    const char* p = pf_done < pf_len ? reinterpret_cast<const char*>(pf + pf_done)
                                     : reinterpret_cast<const char*>(B);
    pf_done += 16 * int64_t{nk};
    tab[r - 1][nv - 1](nk, A + m0 * sam + ka * sak, sam, sak, B + ka * ldb + na, ldb,
                       C + m0 * ldc + na, ldc, V::tail(nb - na - L * (nv - 1)), p);
  };
  // Rows in ceil(M / kR) groups of near-equal size (64 = 9 x 6 + 2 x 5, not 10 x 6 + 4).
  const int ng = (M + kR - 1) / kR;
  if constexpr (V::kColsOuter) {
    for (int n0 = 0; n0 < N; n0 += NB)
      for (int g = 0, m0 = 0; g < ng; ++g) {
        const int r = (M - m0) / (ng - g);
        tile(m0, r, n0, std::min(N, n0 + NB));
        m0 += r;
      }
  } else {
    for (int g = 0, m0 = 0; g < ng; ++g) {
      const int r = (M - m0) / (ng - g);
      for (int n0 = 0; n0 < N; n0 += NB) tile(m0, r, n0, std::min(N, n0 + NB));
      m0 += r;
    }
  }
}

// dst[d * kB + i] = src[i * lds + d] for i < n (columns n..kB-1 of dst are zero), d < D, in
// L x L register transposes; the source rows (a page apart in [B,T,H,D]) of the next group of L
// are prefetched while a group is transposed.
template <class V>
void pack_transposed(const float* src, int64_t lds, int n, int D, float* dst) {
  constexpr int L = V::kW;
  for (int i0 = 0; i0 < kB; i0 += L) {
    const int nr = std::clamp(n - i0, 0, L);
    for (int r = 0; r < std::clamp(n - i0 - L, 0, L); ++r)
      for (int d = 0; d < D; d += 16)
        _mm_prefetch(reinterpret_cast<const char*>(src + (i0 + L + r) * lds + d), _MM_HINT_T0);
    for (int d0 = 0; d0 < D; d0 += L)
      V::transpose_tile(src + i0 * lds + d0, lds, nr, std::min(L, D - d0), dst + d0 * kB + i0, kB);
  }
}

// Copies rows [t0, t1) of one (b, h) of a [B,T,H,D] tensor (row stride `stride`) to dst[t][ld],
// zero padding columns D..ld-1. Each row is on its own page, out of the hardware prefetchers'
// reach: prefetch a few rows ahead.
inline void pack_rows(float* dst, int64_t ld, const float* src, int64_t stride, int t0, int t1,
                      int D) {
  constexpr int kAhead = 6;
  for (int t = t0; t < t1; ++t) {
    if (t + kAhead < t1)
      for (int d = 0; d < D; d += 16)
        _mm_prefetch(reinterpret_cast<const char*>(src + (t + kAhead) * stride + d), _MM_HINT_T0);
    std::memcpy(dst + t * ld, src + t * stride, sizeof(float) * D);
    if (ld > D) std::memset(dst + t * ld + D, 0, sizeof(float) * (ld - D));
  }
}

// dst[0, D) += src[0, D).
template <class V>
void add_row(float* dst, const float* src, int D) {
  constexpr int L = V::kW;
  for (int d = 0; d < D; d += L)
    V::store_n(dst + d, V::add(V::load_n(dst + d, D - d), V::load_n(src + d, D - d)), D - d);
}

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
  const float* Kc;  // [t][Dqkp] packed k rows of this (b, h)
  const float* Vc;  // [t][Dvp] packed v rows
  float *Qr;        // [i][Dqkp] q rows of a tile with absent rows (zero)
  float *QT, *ST, *O, *mrow, *lrow, *alpha;
  int64_t Dqkp, Dvp;
};

// One (b, h, query block): online softmax over its visible key tiles; writes o and lse rows.
template <class V>
void fwd_block(const FwdCtx& c, const FwdBufs& w, int bh, int qb) {
  using T = typename V::T;
  constexpr int L = V::kW;
  const AttnShape& sh = c.sh;
  const int T_ = sh.T, Tq = sh.rows(), off = T_ - Tq, H = sh.H, Dqk = sh.Dqk, Dv = sh.Dv, W = sh.window;
  const int b = bh / H, h = bh % H;
  const int64_t sq = int64_t{H} * Dqk, sv = int64_t{H} * Dv;  // row strides of q and o
  const int64_t Dqkp = w.Dqkp, Dvp = w.Dvp;
  const float* qb_ = c.q + (int64_t{b} * Tq * H + h) * Dqk;  // query row u: position off + u
  float* ob_ = c.o + (int64_t{b} * Tq * H + h) * Dv;
  const int32_t* segrow = c.seg ? c.seg + int64_t{b} * T_ : nullptr;
  const int qs = qb * kB, nq = std::min(kB, T_ - qs), nc = (nq + L - 1) / L;
  const int lead = std::max(0, off - qs);  // absent rows [0, lead) of the tile
  const float c2 = sh.scale * kLog2e;
  float *QT = w.QT, *ST = w.ST, *O = w.O, *mrow = w.mrow, *lrow = w.lrow, *alpha = w.alpha;

  if (lead == 0) {
    pack_transposed<V>(qb_ + (qs - off) * sq, sq, nq, Dqk, QT);
  } else {
    std::memset(w.Qr, 0, sizeof(float) * lead * Dqkp);
    pack_rows(w.Qr + lead * Dqkp, Dqkp, qb_, sq, 0, nq - lead, Dqk);
    pack_transposed<V>(w.Qr, Dqkp, nq, Dqk, QT);
  }
  std::memset(ST, 0, sizeof(float) * kB * kB);
  std::memset(O, 0, sizeof(float) * kB * Dvp);
  for (int i = 0; i < kB; ++i) mrow[i] = kNegInf, lrow[i] = 0.0f;
  alignas(64) int32_t qseg[kB];
  for (int i = 0; i < kB; ++i) qseg[i] = segrow ? segrow[qs + std::min(i, nq - 1)] : 0;

  const int kb_lo = W > 0 ? std::max(0, qs - W + 1) / kB : 0, kb_hi = (qs + nq - 1) / kB;
  const T c2v = V::set1(c2), ninf = V::set1(kNegInf);
  for (int kb = kb_lo; kb <= kb_hi; ++kb) {
    const int ks = kb * kB, nk = std::min(kB, T_ - ks);
    const int kind = tile_kind(sh, qs + lead, nq - lead, ks, nk, segrow);
    if (kind == 0) continue;
    // S^T[j, i] = k_j . q_i, prefetching the next key tile (k, v rows follow in the panels).
    const int64_t nnext = kb < kb_hi ? std::min(kB, T_ - ks - kB) : 0;
    const bool diag = ks == qs;  // then query i sees key j only if j <= i
    gemm<V, false>(nk, nq, Dqk, w.Kc + ks * Dqkp, Dqkp, 1, QT, kB, ST, kB, w.Kc + (ks + kB) * Dqkp,
                   nnext * Dqkp, diag ? Tri::NLo : Tri::None, 0);
    int jmin = nk, jmax = -1;
    for (int ci = 0; ci < nc; ++ci) {
      // Keys of this tile that some query of the L-column chunk may see: [jlo, jhi].
      const int q0 = qs + L * ci, q1 = std::min(q0 + L - 1, qs + nq - 1);
      const int jlo = W > 0 ? std::max(0, q0 - W + 1 - ks) : 0, jhi = std::min(nk - 1, q1 - ks);
      if (jlo > jhi) {
        V::storeu(alpha + L * ci, V::set1(1.0f));
        continue;
      }
      jmin = std::min(jmin, jlo), jmax = std::max(jmax, jhi);
      T mx = ninf;
      if (kind == 2) {
        for (int j = jlo; j <= jhi; ++j) mx = V::max(mx, V::loadu(ST + j * kB + L * ci));
      } else {
        // Pairs a query may not see become -inf in S^T (exp2 makes them 0 below).
        const typename V::I qi = V::iota(q0), qsg = V::loadi(qseg + L * ci);
        for (int j = jlo; j <= jhi; ++j) {
          float* sp = ST + j * kB + L * ci;
          const int kj = ks + j;
          typename V::M m = V::gt(qi, V::seti(kj - 1));
          if (W > 0) m = V::mand(m, V::gt(V::seti(kj + W), qi));
          if (segrow) m = V::mand(m, V::eq(qsg, V::seti(segrow[kj])));
          const T s = V::select(m, V::loadu(sp), ninf);
          V::storeu(sp, s);
          mx = V::max(mx, s);
        }
      }
      // New running max (log2 units); lanes that have seen nothing yet use 0 as the offset.
      const T mold = V::loadu(mrow + L * ci);
      const T mnew = V::max(mold, V::mul(mx, c2v));
      const T msafe = V::select(V::eqf(mnew, ninf), V::zero(), mnew);
      const T al = V::exp2(V::sub(mold, msafe));
      T l0 = V::mul(V::loadu(lrow + L * ci), al), l1 = V::zero();
      int j = jlo;
      for (; j + 1 <= jhi; j += 2) {  // two chains: the adds do not serialize the exp2s
        float* sp = ST + j * kB + L * ci;
        const T p0 = V::exp2(V::fmsub(V::loadu(sp), c2v, msafe));
        const T p1 = V::exp2(V::fmsub(V::loadu(sp + kB), c2v, msafe));
        V::storeu(sp, p0);
        V::storeu(sp + kB, p1);
        l0 = V::add(l0, p0);
        l1 = V::add(l1, p1);
      }
      if (j <= jhi) {
        float* sp = ST + j * kB + L * ci;
        const T p = V::exp2(V::fmsub(V::loadu(sp), c2v, msafe));
        V::storeu(sp, p);
        l0 = V::add(l0, p);
      }
      V::storeu(mrow + L * ci, mnew);
      V::storeu(lrow + L * ci, V::add(l0, l1));
      V::storeu(alpha + L * ci, al);
    }
    if (jmax < 0) continue;
    // Rows of P^T in [jmin, jmax] outside a column chunk's own range must read as zero.
    for (int ci = 0; ci < nc; ++ci) {
      const int q0 = qs + L * ci, q1 = std::min(q0 + L - 1, qs + nq - 1);
      const int jlo = W > 0 ? std::max(0, q0 - W + 1 - ks) : 0, jhi = std::min(nk - 1, q1 - ks);
      for (int j = jmin; j < std::min(jlo, jmax + 1); ++j) V::storeu(ST + j * kB + L * ci, V::zero());
      for (int j = std::max(jhi + 1, jmin); j <= jmax; ++j)
        V::storeu(ST + j * kB + L * ci, V::zero());
    }
    for (int i = 0; i < nq; ++i) {
      const float a = alpha[i];
      if (a == 1.0f) continue;
      const T av = V::set1(a);
      for (int d = 0; d < Dv; d += L)
        V::storeu(O + i * Dvp + d, V::mul(av, V::loadu(O + i * Dvp + d)));
    }
    // O[i, :] += sum_j P^T[j, i] v_j
    gemm<V, true>(nq, Dv, jmax - jmin + 1, ST + jmin * kB, 1, kB, w.Vc + (ks + jmin) * Dvp, Dvp, O,
                  Dvp, w.Vc + (ks + kB) * Dvp, nnext * Dvp, diag ? Tri::KHi : Tri::None, -jmin);
  }
  for (int i = lead; i < nq; ++i) {
    const int u = qs + i - off;  // query row
    const float l = lrow[i], inv = l > 0.0f ? 1.0f / l : 0.0f;
    const T iv = V::set1(inv);
    float* orow = ob_ + u * sv;
    for (int d = 0; d < Dv; d += L) V::store_n(orow + d, V::mul(iv, V::loadu(O + i * Dvp + d)), Dv - d);
    c.lse[int64_t{bh} * Tq + u] = l > 0.0f ? (mrow[i] + std::log2(l)) * kLn2 : kNegInf;
  }
}

// Query blocks qb0 + chunk, qb0 + chunk + nchunk, ... of one (b, h), in increasing order: the
// k, v rows each block adds are packed just before it.
template <class V>
void fwd_item(const FwdCtx& c, int bh, int chunk) {
  const FlushDenormals ftz;
  const AttnShape& sh = c.sh;
  const int T = sh.T, H = sh.H, Dqk = sh.Dqk, Dv = sh.Dv, W = sh.window;
  const int b = bh / H, h = bh % H;
  const int64_t sq = int64_t{H} * Dqk, sv = int64_t{H} * Dv;
  const float* kb_ = c.k + (int64_t{b} * T * H + h) * Dqk;
  const float* vb_ = c.v + (int64_t{b} * T * H + h) * Dv;
  const int64_t Dqkp = round_v<V>(Dqk), Dvp = round_v<V>(Dv), Tp = round_v<V>(T);
  float* Kc = thread_scratch((Dqkp + Dvp) * Tp + (2 * Dqkp + Dvp) * kB + kB * kB + 3 * kB);
  float* Vc = Kc + Tp * Dqkp;
  FwdBufs w{Kc, Vc, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, Dqkp, Dvp};
  w.Qr = Vc + Tp * Dvp;     // [query i][Dqkp]
  w.QT = w.Qr + kB * Dqkp;  // [d][query i]
  w.ST = w.QT + Dqkp * kB;  // [key j][query i]
  w.O = w.ST + kB * kB;     // [query i][Dvp]
  w.mrow = w.O + kB * Dvp;  // running max of scaled scores (log2 units)
  w.lrow = w.mrow + kB;     // running sum
  w.alpha = w.lrow + kB;
  // Keys before `packed` are seen by no query of this item (sliding window).
  int packed = W > 0 ? std::max(0, (c.qb0 + chunk) * kB - W + 1) / kB * kB : 0;
  for (int qb = c.qb0 + chunk; qb < c.nqb; qb += c.nchunk) {
    const int t1 = std::min(T, (qb + 1) * kB);
    pack_rows(Kc, Dqkp, kb_, sq, packed, t1, Dqk);
    pack_rows(Vc, Dvp, vb_, sv, packed, t1, Dv);
    packed = t1;
    fwd_block<V>(c, w, bh, qb);
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

// One (b, h) and the key blocks split, split + nsplit, ...: dk, dv of those blocks (overwrite or,
// with sh.acc_dkv, add) and their contribution to dq.
template <class V>
void bwd_item(const BwdCtx& c, int bh, int split) {
  using T = typename V::T;
  constexpr int L = V::kW;
  const FlushDenormals ftz;
  const AttnShape& sh = c.sh;
  const int T_ = sh.T, Tq = sh.rows(), off = T_ - Tq, H = sh.H, Dqk = sh.Dqk, Dv = sh.Dv, W = sh.window;
  const int b = bh / H, h = bh % H;
  const int64_t sq = int64_t{H} * Dqk, sv = int64_t{H} * Dv;
  const int64_t oq = (int64_t{b} * T_ * H + h) * Dqk, ov = (int64_t{b} * T_ * H + h) * Dv;  // keys
  const int64_t lq = (int64_t{b} * Tq * H + h) * Dqk, lv = (int64_t{b} * Tq * H + h) * Dv;  // queries
  const float *kb_ = c.k + oq, *vb_ = c.v + ov, *ob_ = c.o + lv, *dOb = c.dO + lv;  // o, dO: row u = position off + u
  float *dkb = c.dk + oq, *dvb = c.dv + ov;
  const int32_t* segrow = c.seg ? c.seg + int64_t{b} * T_ : nullptr;
  const float c2 = sh.scale * kLog2e;
  const int nqb = (T_ + kB - 1) / kB, qb0 = off / kB;

  const int64_t Dqkp = round_v<V>(Dqk), Dvp = round_v<V>(Dv), Tp = round_v<V>(T_);
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
  const int t0 = split * kB;  // the first position any key block of this split is seen from
  // Query positions [tq0, T) are packed, [tz, tq0) are absent rows of the first tile read.
  const int tq0 = std::max(t0, off), tz = std::max(t0, qb0 * kB);
  pack_rows(Qc + int64_t{tq0} * Dqkp, Dqkp, c.q + lq + int64_t{tq0 - off} * sq, sq, 0, T_ - tq0, Dqk);
  pack_rows(dOc + int64_t{tq0} * Dvp, Dvp, dOb + int64_t{tq0 - off} * sv, sv, 0, T_ - tq0, Dv);
  std::memset(Qc + int64_t{tz} * Dqkp, 0, sizeof(float) * (tq0 - tz) * Dqkp);
  std::memset(dOc + int64_t{tz} * Dvp, 0, sizeof(float) * (tq0 - tz) * Dvp);
  for (int t = tz; t < tq0; ++t) delta[t] = 0.0f, lse2[t] = kNegInf;
  for (int t = tq0; t < T_; ++t) {
    const float* a = dOc + t * Dvp;
    const float* o = ob_ + (t - off) * sv;
    T acc = V::zero();
    int d = 0;
    for (; d + L <= Dv; d += L) acc = V::fmadd(V::loadu(a + d), V::loadu(o + d), acc);
    if (d < Dv) acc = V::fmadd(V::load_n(a + d, Dv - d), V::load_n(o + d, Dv - d), acc);
    delta[t] = V::reduce_add(acc);
    lse2[t] = c.lse[int64_t{bh} * Tq + t - off] * kLog2e;
  }
  std::memset(dQc + tz * Dqkp, 0, sizeof(float) * (T_ - tz) * Dqkp);

  const T c2v = V::set1(c2), scv = V::set1(sh.scale);
  alignas(64) int32_t kseg[kB];
  for (int kb = split; kb < c.nkb; kb += c.nsplit) {
    const int ks = kb * kB, nk = std::min(kB, T_ - ks), nck = (nk + L - 1) / L;
    pack_rows(Kc, Dqkp, kb_ + ks * sq, sq, 0, nk, Dqk);
    pack_transposed<V>(Kc, Dqkp, nk, Dqk, KT);
    pack_transposed<V>(vb_ + ks * sv, sv, nk, Dv, VT);
    for (int j = 0; j < kB; ++j) kseg[j] = segrow && j < nk ? segrow[ks + j] : 0;
    std::memset(dKa, 0, sizeof(float) * nk * Dqkp);
    std::memset(dVa, 0, sizeof(float) * nk * Dvp);
    const int qb_hi = W > 0 ? std::min(nqb - 1, (ks + nk - 1 + W - 1) / kB) : nqb - 1;
    for (int qb = std::max(kb, qb0); qb <= qb_hi; ++qb) {
      const int qs = qb * kB, nq = std::min(kB, T_ - qs), qp = std::max(qs, off);  // qp: first present
      const int kind = tile_kind(sh, qp, qs + nq - qp, ks, nk, segrow);
      if (kind == 0) continue;
      const float* Qt = Qc + qs * Dqkp;
      const float* dOt = dOc + qs * Dvp;
      // S = Q K^T and dP = dO V^T, prefetching the next query tile's q and dO rows.
      const int64_t nnext = qb < qb_hi ? std::min(kB, T_ - qs - kB) : 0;
      const bool diag = ks == qs;  // then query i sees key j only if j <= i
      const Tri tn = diag ? Tri::NHi : Tri::None, tkl = diag ? Tri::KLo : Tri::None,
                tkh = diag ? Tri::KHi : Tri::None;
      gemm<V, false>(nq, nk, Dqk, Qt, Dqkp, 1, KT, kB, P, kB, Qt + kB * Dqkp, nnext * Dqkp, tn);
      gemm<V, false>(nq, nk, Dv, dOt, Dvp, 1, VT, kB, DS, kB, dOt + kB * Dvp, nnext * Dvp, tn);
      for (int i = 0; i < nq; ++i) {
        const int t = qs + i;
        const int jlo = W > 0 ? std::max(0, t - W + 1 - ks) : 0, jhi = std::min(nk - 1, t - ks);
        float* pr = P + i * kB;
        float* dr = DS + i * kB;
        if (jlo > jhi || lse2[t] == kNegInf) {
          for (int cj = 0; cj < nck; ++cj) {
            V::storeu(pr + L * cj, V::zero());
            V::storeu(dr + L * cj, V::zero());
          }
          continue;
        }
        const T Lv = V::set1(lse2[t]), dl = V::set1(delta[t]);
        const typename V::I tsg = V::seti(segrow ? segrow[t] : 0);
        const typename V::I lo = V::seti(jlo - 1), hi = V::seti(jhi + 1);
        for (int cj = 0; cj < nck; ++cj) {
          const T p = V::exp2(V::fmsub(V::loadu(pr + L * cj), c2v, Lv));
          const T ds = V::mul(V::mul(p, scv), V::sub(V::loadu(dr + L * cj), dl));
          if (kind == 2) {
            V::storeu(pr + L * cj, p);
            V::storeu(dr + L * cj, ds);
            continue;
          }
          const typename V::I jv = V::iota(L * cj);
          typename V::M m = V::mand(V::gt(jv, lo), V::gt(hi, jv));
          if (segrow) m = V::mand(m, V::eq(V::loadi(kseg + L * cj), tsg));
          // Masked lanes may hold stale values (trimmed columns): the mask clears even NaN.
          V::storeu(pr + L * cj, V::maskz(m, p));
          V::storeu(dr + L * cj, V::maskz(m, ds));
        }
      }
      gemm<V, true>(nk, Dv, nq, P, 1, kB, dOt, Dvp, dVa, Dvp, nullptr, 0, tkl);     // dV += P^T dO
      gemm<V, true>(nk, Dqk, nq, DS, 1, kB, Qt, Dqkp, dKa, Dqkp, nullptr, 0, tkl);  // dK += dS^T Q
      gemm<V, true>(nq, Dqk, nk, DS, kB, 1, Kc, Dqkp, dQc + qs * Dqkp, Dqkp,        // dQ += dS K
                    dQc + (qs + kB) * Dqkp, nnext * Dqkp, tkh);
    }
    if (sh.acc_dkv) {
      for (int j = 0; j < nk; ++j) {
        add_row<V>(dkb + (ks + j) * sq, dKa + j * Dqkp, Dqk);
        add_row<V>(dvb + (ks + j) * sv, dVa + j * Dvp, Dv);
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

// q: [B,Tq,H,Dqk]  k: [B,T,H,Dqk]  v: [B,T,H,Dv]  seg: [B,T] or null -> o: [B,Tq,H,Dv]
// lse: [B,H,Tq] (Tq = sh.rows())
template <class V>
void attention_fwd_tiles(const AttnShape& sh, const float* q, const float* k, const float* v,
                         float* o, float* lse, const int32_t* seg) {
  TREX_CHECK(sh.scale > 0.0f, "attention: scale must be > 0, got ", sh.scale);
  const int nqb = (sh.T + kB - 1) / kB, qb0 = (sh.T - sh.rows()) / kB;
  const int64_t BH = int64_t{sh.B} * sh.H;
  const int nchunk = attn_split_count(BH, nqb - qb0, 4);  // extra chunks only repack some k, v rows
  FwdCtx c{sh, q, k, v, o, lse, seg, nqb, nchunk, qb0};
  parallel_dynamic(BH * nchunk, [&](int64_t it) {
    fwd_item<V>(c, static_cast<int>(it / nchunk), static_cast<int>(it % nchunk));
  });
}

// q: [B,Tq,H,Dqk]  k: [B,T,H,Dqk]  v: [B,T,H,Dv]  o, dO: [B,Tq,H,Dv]  lse: [B,H,Tq]
// seg: [B,T] or null -> dq: [B,Tq,H,Dqk] (overwritten)  dk: [B,T,H,Dqk]  dv: [B,T,H,Dv]
// (overwritten, or added to with sh.acc_dkv)
template <class V>
void attention_bwd_tiles(const AttnShape& sh, const float* q, const float* k, const float* v,
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
    bwd_item<V>(c, static_cast<int>(it / nsplit), static_cast<int>(it % nsplit));
  });
  if (nsplit > 1) sum_dq_partials(sh, nsplit, part.get(), dq);
}

}  // namespace
}  // namespace trex::kern::cpu
