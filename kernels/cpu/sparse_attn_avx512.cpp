// AVX-512 sparse shared-KV attention with an attention sink, forward and backward; semantics in
// kernels/sparse_attn.h, the canonical definition in kernels/ref/sparse_attn.h.
//
// All heads of a query share its key rows (K = V = kv), so a query is one work unit: its list is
// walked in blocks of kKB rows, each gathered into a contiguous tile Kc [nb, D], and every product
// is a small matrix product through one register-blocked micro-kernel (R rows x 16 NV columns of
// fp32 accumulators, C[m, n] (+)= A[m, k] B[k, n], A read by broadcast under any strides, B rows
// as vectors, C rows contiguous or scattered by a row list):
//   forward:  S^T = Kc Q^T [nb, Hp] (Q^T packed once per query, heads in lanes, so the online
//             softmax runs down columns without horizontal reductions), m, l updated per block in
//             log2 units (the sink starts them: m = sink, l = 1), O [H, D] rescaled and
//             O += P Kc with A = P^T read transposed; finally O /= l, lse = m + log l.
//   backward: [S^T | dP^T] = Kc [Q^T | dO^T] [nb, 2Hp] in one product, P = exp(S scale - lse),
//             dS = P (dP - delta) scale with delta = dO.o, then dq += dS Kc (dq rows of the query,
//             overwritten on its first block) and dkv[rows] += [dS^T | P^T] [Q ; dO] (key and
//             value part in one product, K = 2Hp, C rows scattered by the list).
// Determinism: forward queries are independent. Backward queries go in C fixed chunks (a function
// of N only, kernels/cpu/sparse_attn_avx512.h); chunk 0 accumulates into dkv, chunk c > 0 into its
// own partial [M, D] in the workspace (only the row range the chunk touches is zeroed), and the
// partials are added to dkv row by row in chunk order; dsink likewise through per-chunk partials.
// Hp = round16(H): padded head lanes carry zeros in Q^T / dO^T / [Q ; dO] and are never stored.
#include "kernels/cpu/sparse_attn_avx512.h"
// GCC 12 reports the _mm512_undefined_ps() idiom inside its own intrinsics as (maybe-)
// uninitialized; the warnings point into the header, so silencing them there is enough.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"

namespace trex::kern::cpu {
namespace {

constexpr int kKB = 128;  // key rows per block (gathered tile)
constexpr int kNV = 4;    // micro-kernel vectors of 16 columns at most
constexpr int kRMax = 12;  // micro-kernel rows at most
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kExpFloor = -200.f;  // log2 units: exp2 of anything below is 0 in fp32

inline int64_t round16(int64_t n) { return (n + 15) & ~int64_t{15}; }
inline __mmask16 tail_mask(int w) { return w >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << w) - 1); }

// 2^x for x in [kExpFloor, ~0]: x = n + f, f in [-1/2, 1/2], 2^f by a degree-6 polynomial
// (Cephes exp2f coefficients, max relative error ~1e-7), scaled by 2^n with vscalefps.
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

// C[r, 0:16 NV] (+)= sum_k A(r, k) B(k, 0:16 NV) for r < R, where
//   A(r, k) = A[r sam + k sak], or A[aidx[r] sam + k] when AIDX (rows of kv picked by a list),
//   B(k, :) = B[k ldb + :],     or B[bidx[k] ldb + :] when BIDX,
//   row r of C at C + r ldc,    or C + cidx[r] ldc when CIDX.
// The last vector of each row of B and C is limited to the lanes in `mlast`.
template <int R, int NV, bool ACC, bool CIDX, bool AIDX, bool BIDX>
void micro(int K, const float* A, int64_t sam, int64_t sak, const int32_t* aidx, const float* B,
           int64_t ldb, const int32_t* bidx, float* C, int64_t ldc, const int32_t* cidx,
           __mmask16 mlast) {
  __m512 c[R][NV];
  float* crow[R];
  const float* arow[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    crow[r] = C + (CIDX ? static_cast<int64_t>(cidx[r]) : r) * ldc;
    arow[r] = A + (AIDX ? static_cast<int64_t>(aidx[r]) : r) * sam;
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      c[r][v] = ACC ? _mm512_maskz_loadu_ps(v == NV - 1 ? mlast : 0xFFFF, crow[r] + 16 * v)
                    : _mm512_setzero_ps();
  const float* bk = B;
  for (int k = 0; k < K; ++k) {
    if constexpr (BIDX) {
      bk = B + static_cast<int64_t>(bidx[k]) * ldb;
      if (k + 8 < K) {
        const float* pf = B + static_cast<int64_t>(bidx[k + 8]) * ldb;
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) _mm_prefetch(reinterpret_cast<const char*>(pf + 16 * v), _MM_HINT_T0);
      }
    }
    __m512 b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      b[v] = v == NV - 1 ? _mm512_maskz_loadu_ps(mlast, bk + 16 * v) : _mm512_loadu_ps(bk + 16 * v);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      __m512 ar = _mm512_set1_ps(AIDX ? arow[r][k] : arow[r][k * sak]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) c[r][v] = _mm512_fmadd_ps(ar, b[v], c[r][v]);
    }
    if constexpr (!BIDX) bk += ldb;
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      if (v == NV - 1)
        _mm512_mask_storeu_ps(crow[r] + 16 * v, mlast, c[r][v]);
      else
        _mm512_storeu_ps(crow[r] + 16 * v, c[r][v]);
    }
}

using MicroFn = void (*)(int, const float*, int64_t, int64_t, const int32_t*, const float*,
                         int64_t, const int32_t*, float*, int64_t, const int32_t*, __mmask16);

template <bool ACC, bool CIDX, bool AIDX, bool BIDX, int R, int... Vs>
constexpr std::array<MicroFn, kNV> micro_row(std::integer_sequence<int, Vs...>) {
  return {{&micro<R, Vs + 1, ACC, CIDX, AIDX, BIDX>...}};
}
template <bool ACC, bool CIDX, bool AIDX, bool BIDX>
struct MicroTable {
  template <int... Rs>
  static constexpr auto make(std::integer_sequence<int, Rs...>) {
    return std::array<std::array<MicroFn, kNV>, sizeof...(Rs)>{
        {micro_row<ACC, CIDX, AIDX, BIDX, Rs + 1>(std::make_integer_sequence<int, kNV>{})...}};
  }
  static constexpr auto tab = make(std::make_integer_sequence<int, kRMax>{});
};

// Rows of the register block for NV vectors of columns: accumulators and B vectors fit in the
// 32 zmm registers, and with A rows picked by a list (AIDX) their row pointers fit in the GPRs.
constexpr int rows_for(int nv, bool aidx) {
  return aidx ? (nv <= 2 ? 12 : nv == 3 ? 8 : 6) : 6;
}

// C[M, N] (+)= A[M, K] B[K, N] with A, B, C addressed as in `micro` (aidx, bidx, cidx index the
// M, K and M dimensions). ACC = false overwrites C (also when K = 0). Rows go in ceil(M / rmax)
// groups of near-equal size (128 = 16 x 8; 13 = 7 + 6 rather than 8 + 5), columns in chunks of
// 16 kNV.
template <bool ACC, bool CIDX, bool AIDX, bool BIDX>
void gemm(int M, int N, int K, const float* A, int64_t sam, int64_t sak, const int32_t* aidx,
          const float* B, int64_t ldb, const int32_t* bidx, float* C, int64_t ldc,
          const int32_t* cidx) {
  const auto& tab = MicroTable<ACC, CIDX, AIDX, BIDX>::tab;
  for (int n0 = 0; n0 < N; n0 += 16 * kNV) {
    const int nw = std::min(N - n0, 16 * kNV), nv = (nw + 15) / 16, rmax = rows_for(nv, AIDX);
    const __mmask16 ml = tail_mask(nw - 16 * (nv - 1));
    const int ng = (M + rmax - 1) / rmax;
    for (int g = 0, m0 = 0; g < ng; ++g) {
      const int r = (M - m0) / (ng - g);
      tab[r - 1][nv - 1](K, AIDX ? A : A + m0 * sam, sam, sak, AIDX ? aidx + m0 : nullptr, B + n0,
                         ldb, bidx, CIDX ? C + n0 : C + m0 * ldc + n0, ldc,
                         CIDX ? cidx + m0 : nullptr, ml);
      m0 += r;
    }
  }
}

// dst[c ldd + r] = src[r lds + c] for r < 16, c < nc (nc <= 16); rows r >= nr read as 0.
void transpose16(const float* src, int64_t lds, int nr, int nc, float* dst, int64_t ldd) {
  __m512 r[16], t[16];
  const __mmask16 mc = tail_mask(nc);
  for (int i = 0; i < 16; ++i)
    r[i] = _mm512_maskz_loadu_ps(i < nr ? mc : __mmask16(0), src + (i < nr ? i * lds : 0));
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

// dst[d ldd + h] = src[h D + d] for d < D, h < Hp = round16(H) (zero for h >= H).
void pack_heads_transposed(const float* src, int H, int D, float* dst, int64_t ldd) {
  for (int h0 = 0; h0 < H; h0 += 16)
    for (int d0 = 0; d0 < D; d0 += 16)
      transpose16(src + static_cast<int64_t>(h0) * D + d0, D, std::min(16, H - h0),
                  std::min(16, D - d0), dst + static_cast<int64_t>(d0) * ldd + h0, ldd);
}

// Prefetches rows[0 .. n) of x (rows of D floats) into L2.
void prefetch_rows(const float* x, int D, const int32_t* rows, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const char* p = reinterpret_cast<const char*>(x + static_cast<int64_t>(rows[j]) * D);
    for (int b = 0; b < D * 4; b += 64) _mm_prefetch(p + b, _MM_HINT_T1);
  }
}
// Prefetches n contiguous floats into L2.
void prefetch_span(const float* x, int64_t n) {
  const char* p = reinterpret_cast<const char*>(x);
  for (int64_t b = 0; b < n * 4; b += 64) _mm_prefetch(p + b, _MM_HINT_T1);
}

// x[0:D] *= s
inline void scale_row(float* x, int D, float s) {
  const __m512 vs = _mm512_set1_ps(s);
  for (int d = 0; d < D; d += 16) {
    const __mmask16 m = tail_mask(D - d);
    _mm512_mask_storeu_ps(x + d, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + d), vs));
  }
}

inline float dot(const float* a, const float* b, int D) {
  __m512 acc = _mm512_setzero_ps();
  for (int d = 0; d < D; d += 16) {
    const __mmask16 m = tail_mask(D - d);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + d), _mm512_maskz_loadu_ps(m, b + d), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

// Per-thread scratch that grows to the largest request and is reused (O((kKB + H) D) floats).
struct Scratch {
  float* p = nullptr;
  size_t cap = 0;
  ~Scratch() { std::free(p); }
  float* get(size_t n) {
    if (n > cap) {
      std::free(p);
      const size_t bytes = (n * sizeof(float) + 63) & ~size_t{63};
      p = static_cast<float*>(std::aligned_alloc(64, bytes));
      TREX_CHECK(p, "sparse_attn: cannot allocate ", bytes, " bytes of scratch");
      cap = n;
    }
    return p;
  }
};
float* thread_scratch(size_t n) {
  static thread_local Scratch s;
  return s.get(n);
}

// The rows of the next key block: later in this list, else the first block of the next query.
struct Next {
  const int32_t* rows;  // next query's list (null: none)
  int64_t n;
};
inline void prefetch_next_block(const float* kv, int D, const int32_t* rows, int64_t n,
                                int64_t j0, const Next& nx) {
  if (j0 + kKB < n)
    prefetch_rows(kv, D, rows + j0 + kKB, std::min<int64_t>(kKB, n - j0 - kKB));
  else if (nx.rows)
    prefetch_rows(kv, D, nx.rows, std::min<int64_t>(kKB, nx.n));
}

// One query of the forward: o_i: [H, D]  lse_i: [H]. Prefetches the next query's q (qn).
static int SKIP = getenv("SKIP") ? atoi(getenv("SKIP")) : 0;
void fwd_query(const SparseAttnShape& sh, const float* qi, const float* kv, const int32_t* rows,
               int64_t n, const float* sink, float* oi, float* lsei, const float* qn,
               const Next& nx) {
  const int H = sh.H, D = sh.D, Hp = static_cast<int>(round16(H));
  if (qn) prefetch_span(qn, static_cast<int64_t>(H) * D);
  if (n == 0) {
    std::memset(oi, 0, sizeof(float) * H * D);
    for (int h = 0; h < H; ++h) lsei[h] = sink ? sink[h] : kNegInf;
    return;
  }
  float* QT = thread_scratch(static_cast<size_t>(D) * Hp + static_cast<size_t>(kKB) * Hp + 3 * Hp);
  float* S = QT + static_cast<size_t>(D) * Hp;
  float* m2 = S + static_cast<size_t>(kKB) * Hp;  // running max, log2 units
  float* l = m2 + Hp;                              // running sum of 2^(s - m2)
  float* alpha = l + Hp;                           // rescale of this block
  pack_heads_transposed(qi, H, D, QT, Hp);
  for (int h = 0; h < Hp; ++h) {
    const bool has = sink && h < H;
    m2[h] = has ? sink[h] * kLog2e : kNegInf;
    l[h] = has ? 1.f : 0.f;
  }
  const __m512 c1 = _mm512_set1_ps(sh.scale * kLog2e), floor = _mm512_set1_ps(kExpFloor);
  for (int64_t j0 = 0; j0 < n; j0 += kKB) {
    const int nb = static_cast<int>(std::min<int64_t>(kKB, n - j0));
    const int32_t* rb = rows + j0;
    prefetch_next_block(kv, D, rows, n, j0, nx);
    // S^T [nb, Hp] = K Q^T
    if (!(SKIP & 1)) gemm<false, false, true, false>(nb, Hp, D, kv, D, 1, rb, QT, Hp, nullptr, S, Hp, nullptr);
    for (int h0 = 0; h0 < Hp && !(SKIP & 4); h0 += 16) {
      __m512 mb = _mm512_set1_ps(kNegInf);
      for (int j = 0; j < nb; ++j) {
        float* s = S + static_cast<int64_t>(j) * Hp + h0;
        const __m512 v = _mm512_mul_ps(_mm512_load_ps(s), c1);
        _mm512_store_ps(s, v);
        mb = _mm512_max_ps(mb, v);
      }
      const __m512 mo = _mm512_load_ps(m2 + h0), mn = _mm512_max_ps(mo, mb);
      const __m512 al = exp2_ps(_mm512_max_ps(_mm512_sub_ps(mo, mn), floor));
      __m512 sum = _mm512_setzero_ps();
      for (int j = 0; j < nb; ++j) {
        float* s = S + static_cast<int64_t>(j) * Hp + h0;
        const __m512 p = exp2_ps(_mm512_max_ps(_mm512_sub_ps(_mm512_load_ps(s), mn), floor));
        _mm512_store_ps(s, p);
        sum = _mm512_add_ps(sum, p);
      }
      _mm512_store_ps(m2 + h0, mn);
      _mm512_store_ps(l + h0, _mm512_fmadd_ps(_mm512_load_ps(l + h0), al, sum));
      _mm512_store_ps(alpha + h0, al);
    }
    if (SKIP & 2) {} else if (j0 == 0) {
      gemm<false, false, false, true>(H, D, nb, S, 1, Hp, nullptr, kv, D, rb, oi, D, nullptr);
    } else {
      for (int h = 0; h < H; ++h)
        if (alpha[h] != 1.f) scale_row(oi + static_cast<int64_t>(h) * D, D, alpha[h]);
      gemm<true, false, false, true>(H, D, nb, S, 1, Hp, nullptr, kv, D, rb, oi, D, nullptr);
    }
  }
  for (int h = 0; h < H; ++h) {
    scale_row(oi + static_cast<int64_t>(h) * D, D, 1.f / l[h]);
    lsei[h] = (m2[h] + std::log2(l[h])) * kLn2;
  }
}

// One query of the backward: dq_i [H, D] overwritten, dkv rows (of `dkv_rows`) += and dsink_part
// [Hp] +=. Prefetches the next query's q, dO, o (qn, dOn, on).
void bwd_query(const SparseAttnShape& sh, const float* qi, const float* kv, const int32_t* rows,
               int64_t n, const float* sink, const float* oi, const float* lsei, const float* dOi,
               float* dqi, float* dkv_rows, float* dsink_part, const float* qn, const float* dOn,
               const float* on, const Next& nx) {
  const int H = sh.H, D = sh.D, Hp = static_cast<int>(round16(H)), W = 2 * Hp;
  if (qn)
    for (const float* x : {qn, dOn, on}) prefetch_span(x, static_cast<int64_t>(H) * D);
  float* B1 = thread_scratch(static_cast<size_t>(D) * W * 2 + static_cast<size_t>(kKB) * W + 2 * Hp);
  float* QdO = B1 + static_cast<size_t>(D) * W;  // [Q ; dO] [2Hp, D]
  float* SP = QdO + static_cast<size_t>(D) * W;  // [S^T | dP^T] then [dS^T | P^T], [nb, 2Hp]
  float* delta = SP + static_cast<size_t>(kKB) * W;
  float* lse2 = delta + Hp;
  for (int h = 0; h < Hp; ++h) {
    delta[h] = h < H ? dot(dOi + static_cast<int64_t>(h) * D, oi + static_cast<int64_t>(h) * D, D)
                     : 0.f;
    lse2[h] = h < H ? lsei[h] * kLog2e : 0.f;
    if (sink && h < H && lsei[h] != kNegInf)
      dsink_part[h] += -std::exp(sink[h] - lsei[h]) * delta[h];
  }
  if (n == 0) {
    std::memset(dqi, 0, sizeof(float) * H * D);
    return;
  }
  pack_heads_transposed(qi, H, D, B1, W);
  pack_heads_transposed(dOi, H, D, B1 + Hp, W);
  std::memcpy(QdO, qi, sizeof(float) * H * D);
  std::memset(QdO + static_cast<int64_t>(H) * D, 0, sizeof(float) * (Hp - H) * D);
  std::memcpy(QdO + static_cast<int64_t>(Hp) * D, dOi, sizeof(float) * H * D);
  std::memset(QdO + static_cast<int64_t>(Hp + H) * D, 0, sizeof(float) * (Hp - H) * D);
  const __m512 c1 = _mm512_set1_ps(sh.scale * kLog2e), vscale = _mm512_set1_ps(sh.scale),
               floor = _mm512_set1_ps(kExpFloor);
  for (int64_t j0 = 0; j0 < n; j0 += kKB) {
    const int nb = static_cast<int>(std::min<int64_t>(kKB, n - j0));
    const int32_t* rb = rows + j0;
    prefetch_rows(dkv_rows, D, rb, nb);
    prefetch_next_block(kv, D, rows, n, j0, nx);
    // [S^T | dP^T] = K [Q^T | dO^T]
    gemm<false, false, true, false>(nb, W, D, kv, D, 1, rb, B1, W, nullptr, SP, W, nullptr);
    for (int h0 = 0; h0 < Hp; h0 += 16) {
      const __m512 l2 = _mm512_load_ps(lse2 + h0), dl = _mm512_load_ps(delta + h0);
      for (int j = 0; j < nb; ++j) {
        float* s = SP + static_cast<int64_t>(j) * W + h0;
        const __m512 x = _mm512_fmsub_ps(_mm512_load_ps(s), c1, l2);
        const __m512 p = exp2_ps(_mm512_max_ps(x, floor));
        const __m512 ds = _mm512_mul_ps(_mm512_mul_ps(p, _mm512_sub_ps(_mm512_load_ps(s + Hp), dl)),
                                        vscale);
        _mm512_store_ps(s, ds);
        _mm512_store_ps(s + Hp, p);
      }
    }
    if (j0 == 0)  // dq = dS K
      gemm<false, false, false, true>(H, D, nb, SP, 1, W, nullptr, kv, D, rb, dqi, D, nullptr);
    else  // dq += dS K
      gemm<true, false, false, true>(H, D, nb, SP, 1, W, nullptr, kv, D, rb, dqi, D, nullptr);
    // dkv[rows] += [dS^T | P^T] [Q ; dO]
    gemm<true, true, false, false>(nb, D, W, SP, W, 1, nullptr, QdO, D, nullptr, dkv_rows, D, rb);
  }
}

}  // namespace

void sparse_attn_fwd_avx512(const SparseAttnShape& sh, const float* q, const float* kv, int64_t M,
                            const int64_t* off, const int32_t* idx, const float* sink, float* o,
                            float* lse) {
  (void)M;
  constexpr int64_t kQ = 4;  // queries per work item
  const int64_t HD = static_cast<int64_t>(sh.H) * sh.D;
  parallel_dynamic((sh.N + kQ - 1) / kQ, [&](int64_t it) {
    for (int64_t i = it * kQ; i < std::min(sh.N, it * kQ + kQ); ++i) {
      const bool more = i + 1 < sh.N;
      const Next nx{more ? idx + off[i + 1] : nullptr, more ? off[i + 2] - off[i + 1] : 0};
      fwd_query(sh, q + i * HD, kv, idx + off[i], off[i + 1] - off[i], sink, o + i * HD,
                lse + i * sh.H, more ? q + (i + 1) * HD : nullptr, nx);
    }
  });
}

void sparse_attn_bwd_avx512(const SparseAttnShape& sh, const float* q, const float* kv, int64_t M,
                            const int64_t* off, const int32_t* idx, const float* sink,
                            const float* o, const float* lse, const float* dO, float* dq,
                            float* dkv, float* dsink, float* workspace) {
  const int64_t N = sh.N, C = sparse_attn_bwd_chunks(N), D = sh.D, HD = sh.H * D;
  const int Hp = static_cast<int>(round16(sh.H));
  float* part = workspace;                       // [C - 1, M, D]: chunks 1.. (0 uses dkv)
  float* sinkp = workspace + (C - 1) * M * D;    // [C, Hp]
  std::vector<int64_t> lo(C, 0), hi(C, -1);      // row range each chunk touches
  parallel_dynamic(C, [&](int64_t c) {
    const int64_t i0 = N * c / C, i1 = N * (c + 1) / C;
    float* tgt = c == 0 ? dkv : part + (c - 1) * M * D;
    float* sp = sinkp + c * Hp;
    std::memset(sp, 0, sizeof(float) * Hp);
    if (off[i1] > off[i0]) {
      const auto [mn, mx] = std::minmax_element(idx + off[i0], idx + off[i1]);
      lo[c] = *mn, hi[c] = *mx;
      if (c > 0) std::memset(tgt + lo[c] * D, 0, sizeof(float) * (hi[c] - lo[c] + 1) * D);
    }
    for (int64_t i = i0; i < i1; ++i) {
      const bool more = i + 1 < i1;
      const Next nx{more ? idx + off[i + 1] : nullptr, more ? off[i + 2] - off[i + 1] : 0};
      bwd_query(sh, q + i * HD, kv, idx + off[i], off[i + 1] - off[i], sink, o + i * HD,
                lse + i * sh.H, dO + i * HD, dq + i * HD, tgt, sp,
                more ? q + (i + 1) * HD : nullptr, more ? dO + (i + 1) * HD : nullptr,
                more ? o + (i + 1) * HD : nullptr, nx);
    }
  });
  if (C > 1)
    parallel_for(M, 64, [&](int64_t r0, int64_t r1) {
      for (int64_t c = 1; c < C; ++c) {
        const int64_t a = std::max(r0, lo[c]), b = std::min(r1, hi[c] + 1);
        const float* src = part + (c - 1) * M * D;
        for (int64_t r = a; r < b; ++r)
          for (int64_t d = 0; d < D; d += 16) {
            const __mmask16 m = tail_mask(static_cast<int>(std::min<int64_t>(16, D - d)));
            float* y = dkv + r * D + d;
            _mm512_mask_storeu_ps(y, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, y),
                                                      _mm512_maskz_loadu_ps(m, src + r * D + d)));
          }
      }
    });
  if (sink)
    for (int64_t c = 0; c < C; ++c)
      for (int h = 0; h < sh.H; ++h) dsink[h] += sinkp[c * Hp + h];
}

}  // namespace trex::kern::cpu
