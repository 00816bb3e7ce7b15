// AVX-512 sparse shared-KV attention with an attention sink, forward and backward; semantics in
// kernels/sparse_attn.h, the canonical definition in kernels/ref/sparse_attn.h.
//
// All heads of a query share its key rows (K = V = kv), so a query is one work unit: its list is
// walked in blocks of up to kKB rows, and every product is a small matrix product in a
// register-blocked micro-kernel that reads the listed kv rows in place (no gathered copy: copying
// costs as much as the product for H = 16). Heads live in vector lanes throughout (Hp =
// round16(H) lanes; the padded lanes carry zeros and are never stored):
//   scores    S^T [nb, Hp] = K Q^T: broadcast K[j, d] from the listed rows, Q^T [D, Hp] rows as
//             vectors (packed once per query, pre-scaled by scale log2(e), so S is in log2 units);
//   outputs   O^T [D, Hp] (+)= K^T P^T: broadcast K[j, d] again, P^T rows as vectors;
//   key grads dkv[rows] += [dS^T | P^T] [Q ; dO] with the C rows scattered by the list.
// Each kv element of a block is read once per product (the rows are random, so re-reading them
// would miss L1), the softmax runs down columns with one lane per head (no horizontal
// reductions), and O^T, dq^T are transposed into [H, D] once per query. The next query's q, o
// (dO, dq) are prefetched into L2 a line every second step of the value products.
//   forward:  per block S^T, m and l updated in log2 units (the sink starts them: m = sink, l =
//             1), O^T = alpha O^T + K^T P^T (alpha = 2^(m_old - m_new) per column, applied as the
//             accumulators load); finally o = (O^T / l)^T, lse = m + log l.
//   backward: [S^T | dP^T] = K [Q^T | dO^T] in one product, P = 2^(S - lse), dS = P (dP - delta)
//             scale with delta = dO.o, then dq^T += K^T dS^T and dkv[rows] += [dS^T | P^T] [Q ; dO]
//             (key and value part in one product, K = 2Hp).
// Determinism: forward queries are independent. Backward queries go in C fixed chunks (a function
// of N only, kernels/cpu/sparse_attn_avx512.h); chunk 0 accumulates into dkv, chunk c > 0 into its
// own partial [M, D] in the workspace (only the row range the chunk touches is zeroed), and the
// partials are added to dkv row by row in chunk order; dsink likewise through per-chunk partials.
#include "kernels/cpu/sparse_attn_avx512.h"

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
#include "kernels/cpu/kernel_scratch.h"
#include "kernels/cpu/simd_avx512.h"

namespace trex::kern::cpu {
namespace {

constexpr int kKB = 128;  // key rows per block
constexpr int kNV = 4;    // micro-kernel vectors of 16 columns at most
constexpr int kCC = 64;   // column chunk of a panel (16 kNV)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline int64_t round16(int64_t n) { return (n + 15) & ~int64_t{15}; }
// Softmax in log2 units: exp2_ps clamps x below at -200 (2^-200 is 0 in fp32) and keeps a NaN
// score NaN (as in the reference), kernels/cpu/simd_avx512.h.
using avx512::exp2_ps;
using avx512::tail_mask;
using avx512::transpose16;

// A panel in column chunks: P [K, N] (N a multiple of 16) stored as chunks of kCC columns, chunk
// c (columns kCC c .. kCC c + w, w = min(kCC, N - kCC c)) at P + kCC c K with row stride w, so a
// micro-kernel walks one chunk with a compile-time stride and the chunk is contiguous in memory.
inline const float* chunk_of(const float* P, int K, int n0) {
  return P + static_cast<int64_t>(n0) * K;
}

// Near-equal row groups of at most rmax rows: f(m0, r) for each (128 = 8 x 11 + 4 x 10 with 12).
template <class F>
inline void row_groups(int M, int rmax, F&& f) {
  const int ng = (M + rmax - 1) / rmax;
  for (int g = 0, m0 = 0; g < ng; ++g) {
    const int r = (M - m0) / (ng - g);
    f(m0, r);
    m0 += r;
  }
}

template <template <int, int, bool> class Micro, bool ACC, int R, int... Vs>
constexpr auto table_row(std::integer_sequence<int, Vs...>) {
  return std::array<decltype(&Micro<1, 1, ACC>::run), kNV>{{&Micro<R, Vs + 1, ACC>::run...}};
}
// [R - 1][NV - 1] -> Micro<R, NV, ACC>::run
template <template <int, int, bool> class Micro, bool ACC, int... Rs>
constexpr auto make_table(std::integer_sequence<int, Rs...>) {
  return std::array<decltype(table_row<Micro, ACC, 1>(std::make_integer_sequence<int, kNV>{})),
                    sizeof...(Rs)>{
      {table_row<Micro, ACC, Rs + 1>(std::make_integer_sequence<int, kNV>{})...}};
}

// ---- scores: C[r, 0:16 NV] = sum_k kv[rows[r] D + k] B[k 16 NV + 0:16 NV], r < R ---------------
// B is one chunk of a panel. k runs from -K up to 0 over row pointers advanced by K, so the R row
// pointers, k and the B pointer are all the loop keeps in registers. (ACC is unused here and in
// MicroKeyGrad: the tables take one template shape.)
template <int R, int NV, bool ACC>
struct MicroScores {
  static void run(int K, const float* kv, int64_t D, const int32_t* rows, const float* B, float* C,
                  int64_t ldc) {
    __m512 c[R][NV];
    const float* ar[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) ar[r] = kv + static_cast<int64_t>(rows[r]) * D + K;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) c[r][v] = _mm512_setzero_ps();
    const float* bk = B;
    for (int64_t k = -K; k < 0; ++k, bk += 16 * NV) {
      __m512 b[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) b[v] = _mm512_loadu_ps(bk + 16 * v);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const __m512 a = _mm512_set1_ps(ar[r][k]);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) c[r][v] = _mm512_fmadd_ps(a, b[v], c[r][v]);
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) _mm512_storeu_ps(C + r * ldc + 16 * v, c[r][v]);
  }
};
// 12 row pointers + k + B fill the general-purpose registers.
constexpr auto kScores = make_table<MicroScores, false>(std::make_integer_sequence<int, 12>{});
constexpr int rows_scores(int nv) { return nv <= 2 ? 12 : nv == 3 ? 8 : 6; }

// C[M, N] = kv[rows] [M, K] B [K, N], B a panel, C row-major (ldc).
void gemm_scores(int M, int N, int K, const float* kv, int64_t D, const int32_t* rows,
                 const float* B, float* C, int64_t ldc) {
  for (int n0 = 0; n0 < N; n0 += kCC) {
    const int nv = std::min(N - n0, kCC) / 16;
    row_groups(M, rows_scores(nv), [&](int m0, int r) {
      kScores[r - 1][nv - 1](K, kv, D, rows + m0, chunk_of(B, K, n0), C + m0 * ldc + n0, ldc);
    });
  }
}

// ---- transposed values: C[r, 0:16 NV] (+)= sum_k kv[rows[k] D + d0 + r] B[k ldb + 0:16 NV] ------
// (C = O^T or dq^T rows d0 .. d0 + R, B = P^T or dS^T.) One kv row per step, read at immediate
// offsets; the row 8 steps ahead is prefetched (the rows are scattered).
template <int R, int NV, bool ACC>
struct MicroValsT {
  static void run(int K, const float* kv, int64_t D, const int32_t* rows, const float* B,
                  int64_t ldb, float* C, int64_t ldc, const float* alpha, const char* pf, int npf) {
    __m512 c[R][NV];
    __m512 al[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      al[v] = ACC ? _mm512_loadu_ps(alpha + 16 * v) : _mm512_setzero_ps();
#pragma GCC unroll 32
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v)
        c[r][v] =
            ACC ? _mm512_mul_ps(al[v], _mm512_loadu_ps(C + r * ldc + 16 * v)) : _mm512_setzero_ps();
    const float* bk = B;
    for (int k = 0; k < K; ++k, bk += ldb) {
      if ((k & 1) == 0 && (k >> 1) < npf) _mm_prefetch(pf + 32 * k, _MM_HINT_T1);
      const float* a = kv + static_cast<int64_t>(rows[k]) * D;
      if (k + 8 < K) {  // the row 8 steps ahead: its first line, then (next step) its last
        const char* p = reinterpret_cast<const char*>(kv + static_cast<int64_t>(rows[k + 8]) * D);
        _mm_prefetch(p, _MM_HINT_T0);
        if (R > 16 && k > 0)
          _mm_prefetch(
              reinterpret_cast<const char*>(kv + static_cast<int64_t>(rows[k + 7]) * D) + 4 * R - 4,
              _MM_HINT_T0);
      }
      __m512 b[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) b[v] = _mm512_loadu_ps(bk + 16 * v);
#pragma GCC unroll 32
      for (int r = 0; r < R; ++r) {
        const __m512 ar = _mm512_set1_ps(a[r]);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) c[r][v] = _mm512_fmadd_ps(ar, b[v], c[r][v]);
      }
    }
#pragma GCC unroll 32
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) _mm512_storeu_ps(C + r * ldc + 16 * v, c[r][v]);
  }
};
// With one vector of columns (H <= 16) every FMA needs its own broadcast load, so the loads bound
// it: more rows amortize the B load and the prefetches (28 accumulators + 2 fit 32 zmm).
constexpr auto kValsTSet = make_table<MicroValsT, false>(std::make_integer_sequence<int, 28>{});
constexpr auto kValsTAcc = make_table<MicroValsT, true>(std::make_integer_sequence<int, 28>{});
constexpr int rows_valst(int nv) { return nv == 1 ? 28 : nv == 2 ? 12 : nv == 3 ? 8 : 6; }

// Lines to prefetch into L2 while a product runs, one every second micro-kernel step (in a burst
// they stall the core once the line fill buffers run out): the next query's inputs and outputs
// (a line read in alone is owned exclusively, so a later store to it needs no further request).
struct PfStream {
  static constexpr int kMax = 4;
  const char* p[kMax] = {};
  int64_t lines[kMax] = {};
  int cur = 0;
  void add(const float* x, int64_t n) {  // the lines of x[0 .. n) (n a multiple of 16)
    for (int i = 0; i < kMax; ++i)
      if (!lines[i]) {
        p[i] = reinterpret_cast<const char*>(x), lines[i] = n / 16;
        return;
      }
  }
  int take(int k, const char** at) {  // up to ceil(k / 2) contiguous lines
    while (cur < kMax && !lines[cur]) ++cur;
    if (cur == kMax) return 0;
    const int n = static_cast<int>(std::min<int64_t>(lines[cur], (k + 1) / 2));
    *at = p[cur], p[cur] += 64 * n, lines[cur] -= n;
    return n;
  }
};

// C[D, N] = alpha C + kv[rows]^T [D, K] B [K, N] (alpha per column, ACC; C = ... without), B
// row-major (ldb), C row-major (ldc); N a multiple of 16. The row range of one kv row goes into
// the row groups as d0 offsets: kv + d0 is passed.
template <bool ACC>
void gemm_valst(int D, int N, int K, const float* kv, const int32_t* rows, const float* B,
                int64_t ldb, float* C, int64_t ldc, const float* alpha, PfStream& pf) {
  const auto& tab = ACC ? kValsTAcc : kValsTSet;
  for (int n0 = 0; n0 < N; n0 += kCC) {
    const int nv = std::min(N - n0, kCC) / 16;
    row_groups(D, rows_valst(nv), [&](int d0, int r) {
      const char* at = nullptr;
      const int npf = pf.take(K, &at);
      tab[r - 1][nv - 1](K, kv + d0, D, rows, B + n0, ldb, C + d0 * ldc + n0, ldc,
                         alpha ? alpha + n0 : nullptr, at, npf);
    });
  }
}

// ---- key grads: C[rows[r], 0:16 NV] += sum_k A[r lda + k] B[k w + 0:16 NV], r < R ---------------
// A = [dS^T | P^T] rows, B one chunk (width w) of the panel [Q ; dO]; the last vector is masked
// to D.
template <int R, int NV, bool ACC>
struct MicroKeyGrad {
  static void run(int K, const float* A, int64_t lda, const float* B, int64_t w, float* C,
                  int64_t ldc, const int32_t* rows, __mmask16 mlast) {
    __m512 c[R][NV];
    float* cr[R];
    // The C rows are scattered (in L2 or further): sum into zeroed registers and add C at the end,
    // so their latency overlaps the products instead of delaying them.
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      cr[r] = C + static_cast<int64_t>(rows[r]) * ldc;
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v)
        _mm_prefetch(reinterpret_cast<const char*>(cr[r] + 16 * v), _MM_HINT_T0);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) c[r][v] = _mm512_setzero_ps();
    const float* bk = B;
    for (int k = 0; k < K; ++k, bk += w) {
      __m512 b[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v)
        b[v] =
            v == NV - 1 ? _mm512_maskz_loadu_ps(mlast, bk + 16 * v) : _mm512_loadu_ps(bk + 16 * v);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const __m512 ar = _mm512_set1_ps(A[r * lda + k]);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) c[r][v] = _mm512_fmadd_ps(ar, b[v], c[r][v]);
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        const __mmask16 m = v == NV - 1 ? mlast : __mmask16(0xFFFF);
        _mm512_mask_storeu_ps(cr[r] + 16 * v, m,
                              _mm512_add_ps(c[r][v], _mm512_maskz_loadu_ps(m, cr[r] + 16 * v)));
      }
  }
};
constexpr auto kKeyGrad = make_table<MicroKeyGrad, true>(std::make_integer_sequence<int, 6>{});

// C[rows[m], 0:D] += A [M, K] B [K, D] (A row-major lda, B a panel of D columns; its chunks pad
// the last one to a multiple of 16 columns, unread past D).
void gemm_keygrad(int M, int D, int K, const float* A, int64_t lda, const float* B, float* C,
                  const int32_t* rows) {
  for (int n0 = 0; n0 < D; n0 += kCC) {
    const int nw = std::min(D - n0, kCC), nv = (nw + 15) / 16;
    row_groups(M, 6, [&](int m0, int r) {
      kKeyGrad[r - 1][nv - 1](K, A + m0 * lda, lda, chunk_of(B, K, n0), round16(nw), C + n0, D,
                              rows + m0, tail_mask(nw - 16 * (nv - 1)));
    });
  }
}

// ---- packing ----------------------------------------------------------------------------------
// Columns col0 .. col0 + Hp of a panel [D, N] (col0 and N multiples of 16):
// P(d, col0 + h) = s src[h D + d] for d < D, h < Hp = round16(H) (zero for h >= H).
void pack_heads_transposed(const float* src, int H, int D, float s, float* P, int col0, int N) {
  const __m512 vs = _mm512_set1_ps(s);
  for (int h0 = 0; h0 < H; h0 += 16) {
    const int col = col0 + h0, c0 = col / kCC * kCC, w = std::min(kCC, N - c0);
    float* base = P + static_cast<int64_t>(c0) * D + (col - c0);
    const int nh = std::min(16, H - h0);
    for (int d0 = 0; d0 < D; d0 += 16) {
      __m512 r[16];
      const int nd = std::min(16, D - d0);
      for (int i = 0; i < 16; ++i)  // row h0 + i of src (zero past H), columns d0 .. d0 + nd
        r[i] = i < nh ? _mm512_mul_ps(vs,
                                      _mm512_maskz_loadu_ps(tail_mask(nd), src + (h0 + i) * D + d0))
                      : _mm512_setzero_ps();
      transpose16(r);
      for (int c = 0; c < nd; ++c) _mm512_storeu_ps(base + static_cast<int64_t>(d0 + c) * w, r[c]);
    }
  }
}

// dst[h D + d] = s[h] XT[d ldx + h] for h < H, d < D (XT [D, >= round16(H)] row-major).
void unpack_transposed(const float* XT, int64_t ldx, int H, int D, const float* s, float* dst) {
  for (int h0 = 0; h0 < H; h0 += 16) {
    const int nh = std::min(16, H - h0);
    const __m512 vs = _mm512_loadu_ps(s + h0);
    for (int d0 = 0; d0 < D; d0 += 16) {
      const int nd = std::min(16, D - d0);
      __m512 r[16];
      for (int i = 0; i < 16; ++i)  // row d0 + i of XT, scaled per column (head)
        r[i] = i < nd ? _mm512_mul_ps(vs, _mm512_loadu_ps(XT + (d0 + i) * ldx + h0))
                      : _mm512_setzero_ps();
      transpose16(r);
      for (int h = 0; h < nh; ++h)
        _mm512_mask_storeu_ps(dst + static_cast<int64_t>(h0 + h) * D + d0, tail_mask(nd), r[h]);
    }
  }
}

// Rows r0 .. r0 + R of a panel [K, D] (chunks padded to 16 columns, never read past D) = the
// rows of a row-major [R, D] matrix src, or zeros when src is null.
void pack_rows_panel(const float* src, int R, int D, float* P, int r0, int K) {
  for (int c0 = 0; c0 < D; c0 += kCC) {
    const int nw = std::min(kCC, D - c0), w = static_cast<int>(round16(nw));
    float* base = P + static_cast<int64_t>(c0) * K + static_cast<int64_t>(r0) * w;
    for (int r = 0; r < R; ++r)
      if (src)
        std::memcpy(base + r * w, src + static_cast<int64_t>(r) * D + c0, sizeof(float) * nw);
      else
        std::memset(base + r * w, 0, sizeof(float) * w);
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

// ---- one query ----------------------------------------------------------------------------------
// Forward: o_i: [H, D]  lse_i: [H]. Prefetches the next query's q and o (qn, on).
void fwd_query(const SparseAttnShape& sh, const float* qi, const float* kv, const int32_t* rows,
               int64_t n, const float* sink, float* oi, float* lsei, const float* qn,
               const float* on) {
  const int H = sh.H, D = sh.D, Hp = static_cast<int>(round16(H));
  PfStream pf;  // the next query's q and o come into L2 while this one computes
  if (qn) pf.add(qn, static_cast<int64_t>(H) * D), pf.add(on, static_cast<int64_t>(H) * D);
  if (n == 0) {
    std::memset(oi, 0, sizeof(float) * H * D);
    for (int h = 0; h < H; ++h) lsei[h] = sink ? sink[h] : kNegInf;
    return;
  }
  const size_t np = static_cast<size_t>(D) * Hp, ns = static_cast<size_t>(kKB) * Hp;
  float* QT = thread_scratch(2 * np + ns + 4 * Hp);  // panel Q^T scale log2(e) [D, Hp]
  float* OT = QT + np;                               // unnormalized O^T [D, Hp]
  float* S = OT + np;                                // S^T, then P^T, of a block [nb, Hp]
  float* m2 = S + ns;                                // running max, log2 units
  float* l = m2 + Hp;                                // running sum of 2^(s - m2)
  float* rl = l + Hp;                                // 1 / l at the end
  float* alpha = rl + Hp;                            // rescale of O^T by a block
  pack_heads_transposed(qi, H, D, sh.scale * kLog2e, QT, 0, Hp);
  for (int h = 0; h < Hp; ++h) {
    const bool has = sink && h < H;
    m2[h] = has ? sink[h] * kLog2e : kNegInf;
    l[h] = has ? 1.f : 0.f;
  }
  for (int64_t j0 = 0; j0 < n; j0 += kKB) {
    const int nb = static_cast<int>(std::min<int64_t>(kKB, n - j0));
    const int32_t* rb = rows + j0;
    gemm_scores(nb, Hp, D, kv, D, rb, QT, S, Hp);  // S^T [nb, Hp] = K Q^T
    for (int h0 = 0; h0 < Hp; h0 += 16) {
      __m512 mb = _mm512_set1_ps(kNegInf);
      for (int j = 0; j < nb; ++j) mb = _mm512_max_ps(mb, _mm512_load_ps(S + j * Hp + h0));
      const __m512 mo = _mm512_load_ps(m2 + h0), mn = _mm512_max_ps(mo, mb);
      __m512 sum = _mm512_setzero_ps();
      for (int j = 0; j < nb; ++j) {
        float* s = S + j * Hp + h0;
        const __m512 p = exp2_ps(_mm512_sub_ps(_mm512_load_ps(s), mn));
        _mm512_store_ps(s, p);
        sum = _mm512_add_ps(sum, p);
      }
      const __m512 al = exp2_ps(_mm512_sub_ps(mo, mn));
      _mm512_store_ps(m2 + h0, mn);
      _mm512_store_ps(l + h0, _mm512_fmadd_ps(_mm512_load_ps(l + h0), al, sum));
      _mm512_store_ps(alpha + h0, al);
    }
    if (j0 == 0)  // O^T = K^T P^T
      gemm_valst<false>(D, Hp, nb, kv, rb, S, Hp, OT, Hp, nullptr, pf);
    else  // O^T = alpha O^T + K^T P^T
      gemm_valst<true>(D, Hp, nb, kv, rb, S, Hp, OT, Hp, alpha, pf);
  }
  for (int h = 0; h < Hp; ++h) rl[h] = h < H ? 1.f / l[h] : 0.f;
  for (int h = 0; h < H; ++h) lsei[h] = (m2[h] + std::log2(l[h])) * kLn2;
  unpack_transposed(OT, Hp, H, D, rl, oi);
}

// Backward: dq_i [H, D] overwritten, dkv rows (of `dkv_rows`) += and dsink_part [Hp] +=.
// Prefetches the next query's q, dO, o, dq (qn, dOn, on, dqn).
void bwd_query(const SparseAttnShape& sh, const float* qi, const float* kv, const int32_t* rows,
               int64_t n, const float* sink, const float* oi, const float* lsei, const float* dOi,
               float* dqi, float* dkv_rows, float* dsink_part, const float* qn, const float* dOn,
               const float* on, const float* dqn) {
  const int H = sh.H, D = sh.D, Hp = static_cast<int>(round16(H)), W = 2 * Hp;
  PfStream pf;
  if (qn)
    for (const float* x : {dOn, on, qn, dqn}) pf.add(x, static_cast<int64_t>(H) * D);
  const size_t nb1 = static_cast<size_t>(D) * W, nqd = static_cast<size_t>(W) * round16(D) + 64,
               nsp = static_cast<size_t>(kKB) * W, ndq = static_cast<size_t>(D) * Hp;
  float* B1 = thread_scratch(nb1 + nqd + nsp + ndq + 3 * Hp);  // [Q^T scale log2(e) | dO^T]
  float* QdO = B1 + nb1;                                       // panel [Q ; dO] [2Hp, D]
  float* SP = QdO + nqd;  // [S^T | dP^T] then [dS^T | P^T] of a key block [nb, 2Hp]
  float* dqT = SP + nsp;  // dq^T [D, Hp]
  float* delta = dqT + ndq;
  float* lse2 = delta + Hp;
  float* ones = lse2 + Hp;
  for (int h = 0; h < Hp; ++h) {
    delta[h] =
        h < H ? dot(dOi + static_cast<int64_t>(h) * D, oi + static_cast<int64_t>(h) * D, D) : 0.f;
    lse2[h] = h < H ? lsei[h] * kLog2e : 0.f;
    ones[h] = 1.f;
    if (sink && h < H && lsei[h] != kNegInf)
      dsink_part[h] += -std::exp(sink[h] - lsei[h]) * delta[h];
  }
  if (n == 0) {
    std::memset(dqi, 0, sizeof(float) * H * D);
    return;
  }
  pack_heads_transposed(qi, H, D, sh.scale * kLog2e, B1, 0, W);
  pack_heads_transposed(dOi, H, D, 1.f, B1, Hp, W);
  pack_rows_panel(qi, H, D, QdO, 0, W);
  pack_rows_panel(nullptr, Hp - H, D, QdO, H, W);
  pack_rows_panel(dOi, H, D, QdO, Hp, W);
  pack_rows_panel(nullptr, Hp - H, D, QdO, Hp + H, W);
  const __m512 vscale = _mm512_set1_ps(sh.scale);
  for (int64_t j0 = 0; j0 < n; j0 += kKB) {
    const int nb = static_cast<int>(std::min<int64_t>(kKB, n - j0));
    const int32_t* rb = rows + j0;
    // [S^T | dP^T] = K [Q^T | dO^T], S in log2 units
    gemm_scores(nb, W, D, kv, D, rb, B1, SP, W);
    for (int h0 = 0; h0 < Hp; h0 += 16) {
      const __m512 l2 = _mm512_load_ps(lse2 + h0), dl = _mm512_load_ps(delta + h0);
      for (int j = 0; j < nb; ++j) {
        float* s = SP + static_cast<int64_t>(j) * W + h0;
        const __m512 p = exp2_ps(_mm512_sub_ps(_mm512_load_ps(s), l2));
        const __m512 ds =
            _mm512_mul_ps(_mm512_mul_ps(p, _mm512_sub_ps(_mm512_load_ps(s + Hp), dl)), vscale);
        _mm512_store_ps(s, ds);
        _mm512_store_ps(s + Hp, p);
      }
    }
    if (j0 == 0)  // dq^T = K^T dS^T
      gemm_valst<false>(D, Hp, nb, kv, rb, SP, W, dqT, Hp, nullptr, pf);
    else  // dq^T += K^T dS^T
      gemm_valst<true>(D, Hp, nb, kv, rb, SP, W, dqT, Hp, ones, pf);
    // dkv[rows] += [dS^T | P^T] [Q ; dO]
    gemm_keygrad(nb, D, W, SP, W, QdO, dkv_rows, rb);
  }
  unpack_transposed(dqT, Hp, H, D, ones, dqi);
}

}  // namespace

void sparse_attn_fwd_avx512(const SparseAttnShape& sh, const float* q, const float* kv, int64_t M,
                            const int64_t* off, const int32_t* idx, const float* sink, float* o,
                            float* lse) {
  (void)M;
  constexpr int64_t kQ = 4;  // queries per work item
  const int64_t HD = static_cast<int64_t>(sh.H) * sh.D;
  parallel_dynamic((sh.N + kQ - 1) / kQ, [&](int64_t it) {
    const FlushDenormals ftz;
    for (int64_t i = it * kQ; i < std::min(sh.N, it * kQ + kQ); ++i)
      fwd_query(sh, q + i * HD, kv, idx + off[i], off[i + 1] - off[i], sink, o + i * HD,
                lse + i * sh.H, i + 1 < sh.N ? q + (i + 1) * HD : nullptr,
                i + 1 < sh.N ? o + (i + 1) * HD : nullptr);
  });
}

void sparse_attn_bwd_avx512(const SparseAttnShape& sh, const float* q, const float* kv, int64_t M,
                            const int64_t* off, const int32_t* idx, const float* sink,
                            const float* o, const float* lse, const float* dO, float* dq,
                            float* dkv, float* dsink, float* workspace) {
  const int64_t N = sh.N, C = sparse_attn_bwd_chunks(N), D = sh.D, HD = sh.H * D;
  const int Hp = static_cast<int>(round16(sh.H));
  float* part = workspace;                     // [C - 1, M, D]: chunks 1.. (0 uses dkv)
  float* sinkp = workspace + (C - 1) * M * D;  // [C, Hp]
  std::vector<int64_t> lo(C, 0), hi(C, -1);    // row range each chunk touches
  parallel_dynamic(C, [&](int64_t c) {
    const FlushDenormals ftz;
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
      bwd_query(sh, q + i * HD, kv, idx + off[i], off[i + 1] - off[i], sink, o + i * HD,
                lse + i * sh.H, dO + i * HD, dq + i * HD, tgt, sp,
                more ? q + (i + 1) * HD : nullptr, more ? dO + (i + 1) * HD : nullptr,
                more ? o + (i + 1) * HD : nullptr, more ? dq + (i + 1) * HD : nullptr);
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
            _mm512_mask_storeu_ps(y, m,
                                  _mm512_add_ps(_mm512_maskz_loadu_ps(m, y),
                                                _mm512_maskz_loadu_ps(m, src + r * D + d)));
          }
      }
    });
  if (sink)
    for (int64_t c = 0; c < C; ++c)
      for (int h = 0; h < sh.H; ++h) dsink[h] += sinkp[c * Hp + h];
}

}  // namespace trex::kern::cpu
