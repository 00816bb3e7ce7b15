// Sparse shared-KV attention with an attention sink, forward and backward, written once over a
// vector traits type V (avx512::V16, kernels/cpu/simd_avx512.h; avx2::V8, kernels/cpu/simd_avx2.h)
// and a tuning type Tune (block and micro-kernel sizes, prefetch policy, backward chunking), both
// given by sparse_attn_avx512.cpp and sparse_attn_avx2.cpp; semantics in kernels/sparse_attn.h,
// the canonical definition in kernels/ref/sparse_attn.h. Include this header only from those two
// files: each compiles it with its own ISA flags, and everything here is in an anonymous
// namespace, so each gets its own copy.
//
// All heads of a query share its key rows (K = V = kv), so a query is one work unit: its list is
// walked in blocks of Tune::block_rows(D) rows, and every product is a small matrix product in a
// register-blocked micro-kernel that reads the listed kv rows in place (no gathered copy: copying
// costs as much as the product for H = 16). Heads live in vector lanes throughout (Hp = H rounded
// up to the vector width; the padded lanes carry zeros and are never stored):
//   scores    S^T [nb, Hp] = K Q^T: broadcast K[j, d] from the listed rows, Q^T [D, Hp] rows as
//             vectors (packed once per query, pre-scaled by scale log2(e), so S is in log2 units);
//   outputs   O^T [D, Hp] (+)= K^T P^T: broadcast K[j, d] again, P^T rows as vectors;
//   key grads dkv[rows] += [dS^T | P^T] [Q ; dO] with the C rows scattered by the list.
// Each kv element of a block is read once per product (the rows are random, so re-reading them
// would miss L1), the softmax runs down columns with one lane per head (no horizontal
// reductions), and O^T, dq^T are transposed into [H, D] once per query. Panels are stored in
// column chunks of one micro-kernel width. Prefetching (Tune): either the next row group's kv rows
// while the scores run and the next group's dkv rows in the key grads (kPrefetchNext), or the next
// query's q, o (dO, dq) into L2 a line every second step of the value products plus the kv row 8
// steps ahead (kPrefetchStream).
//   forward:  per block S^T, m and l updated in log2 units (the sink starts them: m = sink, l =
//             1), O^T = alpha O^T + K^T P^T (alpha = 2^(m_old - m_new) per column, applied as the
//             accumulators load); finally o = (O^T / l)^T, lse = m + log l.
//   backward: [S^T | dP^T] = K [Q^T | dO^T] in one product, P = 2^(S - lse), dS = P (dP - delta)
//             scale with delta = dO.o, then dq^T += K^T dS^T and dkv[rows] += [dS^T | P^T] [Q ; dO]
//             (key and value part in one product, K = 2Hp).
// Determinism: forward queries are independent. Backward queries go in Tune::chunks(N) fixed
// chunks (a function of N only); chunk 0 accumulates into dkv, chunk c > 0 into its own partial
// [M, D] in the workspace (only the row range the chunk touches is zeroed), and the partials are
// added to dkv row by row in chunk order; dsink likewise through per-chunk partials.
#pragma once
#include <xmmintrin.h>  // _mm_prefetch

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/kernel_scratch.h"
#include "kernels/sparse_attn.h"

namespace trex::kern::cpu {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

template <class V>
constexpr int64_t round_v(int64_t n) {
  return (n + V::kW - 1) / V::kW * V::kW;
}

// A panel in column chunks: P [K, N] (N a multiple of the vector width) stored as chunks of
// kCC = V::kW V::kNV columns, chunk c (columns kCC c .. kCC c + w, w = min(kCC, N - kCC c)) at
// P + kCC c K with row stride w, so a micro-kernel walks one chunk with a compile-time stride and
// the chunk is contiguous in memory.
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

// [R - 1][NV - 1] -> Fam::run<R, NV, ACC>, R <= sizeof...(Rs), NV <= NVmax.
template <class Fam, bool ACC, int NVmax, int R, int... Vs>
constexpr auto table_row(std::integer_sequence<int, Vs...>) {
  return std::array<decltype(&Fam::template run<1, 1, ACC>), NVmax>{
      {&Fam::template run<R, Vs + 1, ACC>...}};
}
template <class Fam, bool ACC, int NVmax, int... Rs>
constexpr auto make_table(std::integer_sequence<int, Rs...>) {
  return std::array<decltype(table_row<Fam, ACC, NVmax, 1>(std::make_integer_sequence<int, NVmax>{})),
                    sizeof...(Rs)>{
      {table_row<Fam, ACC, NVmax, Rs + 1>(std::make_integer_sequence<int, NVmax>{})...}};
}

// ---- scores: C[r, 0:L NV] = sum_k kv[rows[r] D + k] B[k L NV + 0:L NV], r < R -----------------
// B is one chunk of a panel. k runs from -K up to 0 over row pointers advanced by K, so the R row
// pointers, k and the B pointer are all the loop keeps in registers. With Tune::kPrefetchNext the
// first line of each 16 steps of the nn rows `next` (the next row group) is prefetched. (ACC is
// unused here and in KeyGrad: the tables take one template shape.)
template <class V, class Tune>
struct Scores {
  template <int R, int NV>
  __attribute__((always_inline)) static inline void step(typename V::T (&c)[R][NV],
                                                         const float* const (&ar)[R], int64_t k,
                                                         const float* bk) {
    typename V::T b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = V::loadu(bk + V::kW * v);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const typename V::T a = V::set1(ar[r][k]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) c[r][v] = V::fmadd(a, b[v], c[r][v]);
    }
  }
  template <int R, int NV, bool ACC>
  static void run(int K, const float* kv, int64_t D, const int32_t* rows, const float* B, float* C,
                  int64_t ldc, const int32_t* next, int nn) {
    constexpr int L = V::kW;
    typename V::T c[R][NV];
    const float* ar[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) ar[r] = kv + static_cast<int64_t>(rows[r]) * D + K;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) c[r][v] = V::zero();
    const float* bk = B;
    if constexpr (Tune::kPrefetchNext) {
      for (int k0 = 0; k0 < K; k0 += 16) {
        for (int r = 0; r < nn; ++r)
          _mm_prefetch(reinterpret_cast<const char*>(kv + static_cast<int64_t>(next[r]) * D + k0),
                       _MM_HINT_T0);
        const int k1 = std::min(K, k0 + 16);
        for (int64_t k = k0 - K; k < k1 - K; ++k, bk += L * NV) step<R, NV>(c, ar, k, bk);
      }
    } else {
      for (int64_t k = -K; k < 0; ++k, bk += L * NV) step<R, NV>(c, ar, k, bk);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) V::storeu(C + r * ldc + L * v, c[r][v]);
  }
  static constexpr auto kTable =
      make_table<Scores, false, V::kNV>(std::make_integer_sequence<int, Tune::kScoreRows>{});
};

// C[M, N] = kv[rows] [M, K] B [K, N], B a panel, C row-major (ldc). `avail` rows follow rows[M)
// in the list (the next block; prefetched by the last group under Tune::kPrefetchNext).
template <class V, class Tune>
void gemm_scores(int M, int N, int K, const float* kv, int64_t D, const int32_t* rows,
                 int64_t avail, const float* B, float* C, int64_t ldc) {
  constexpr int kCC = V::kW * V::kNV;
  for (int n0 = 0; n0 < N; n0 += kCC) {
    const int nv = std::min(N - n0, kCC) / V::kW;
    row_groups(M, Tune::rows_scores(nv), [&](int m0, int r) {
      const int nn = Tune::kPrefetchNext ? static_cast<int>(std::min<int64_t>(r, M - m0 - r + avail))
                                         : 0;
      Scores<V, Tune>::kTable[r - 1][nv - 1](K, kv, D, rows + m0, chunk_of(B, K, n0),
                                             C + m0 * ldc + n0, ldc, rows + m0 + r, nn);
    });
  }
}

// ---- transposed values: C[r, 0:L NV] (+)= sum_k kv[rows[k] D + d0 + r] B[k ldb + 0:L NV] ------
// (C = O^T or dq^T rows d0 .. d0 + R, B = P^T or dS^T.) One kv row per step, read at immediate
// offsets; with Tune::kPrefetchStream the row 8 steps ahead is prefetched (the rows are
// scattered) and npf lines from pf into L2, one every second step.
template <class V, class Tune>
struct ValsT {
  template <int R, int NV, bool ACC>
  static void run(int K, const float* kv, int64_t D, const int32_t* rows, const float* B,
                  int64_t ldb, float* C, int64_t ldc, const float* alpha, const char* pf, int npf) {
    constexpr int L = V::kW;
    typename V::T c[R][NV];
    typename V::T al[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) al[v] = ACC ? V::loadu(alpha + L * v) : V::zero();
#pragma GCC unroll 32
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v)
        c[r][v] = ACC ? V::mul(al[v], V::loadu(C + r * ldc + L * v)) : V::zero();
    const float* bk = B;
    for (int k = 0; k < K; ++k, bk += ldb) {
      if constexpr (Tune::kPrefetchStream) {
        if ((k & 1) == 0 && (k >> 1) < npf) _mm_prefetch(pf + 32 * k, _MM_HINT_T1);
        if (k + 8 < K) {  // the row 8 steps ahead: its first line, then (next step) its last
          const char* p = reinterpret_cast<const char*>(kv + static_cast<int64_t>(rows[k + 8]) * D);
          _mm_prefetch(p, _MM_HINT_T0);
          if (R > 16 && k > 0)
            _mm_prefetch(reinterpret_cast<const char*>(kv + static_cast<int64_t>(rows[k + 7]) * D) +
                             4 * R - 4,
                         _MM_HINT_T0);
        }
      }
      const float* a = kv + static_cast<int64_t>(rows[k]) * D;
      typename V::T b[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) b[v] = V::loadu(bk + L * v);
#pragma GCC unroll 32
      for (int r = 0; r < R; ++r) {
        const typename V::T ar = V::set1(a[r]);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) c[r][v] = V::fmadd(ar, b[v], c[r][v]);
      }
    }
#pragma GCC unroll 32
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) V::storeu(C + r * ldc + L * v, c[r][v]);
  }
  static constexpr auto kSet =
      make_table<ValsT, false, V::kNV>(std::make_integer_sequence<int, Tune::kValsRows>{});
  static constexpr auto kAcc =
      make_table<ValsT, true, V::kNV>(std::make_integer_sequence<int, Tune::kValsRows>{});
};

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
// row-major (ldb), C row-major (ldc); N a multiple of the vector width. The row range of one kv
// row goes into the row groups as d0 offsets: kv + d0 is passed.
template <class V, class Tune, bool ACC>
void gemm_valst(int D, int N, int K, const float* kv, const int32_t* rows, const float* B,
                int64_t ldb, float* C, int64_t ldc, const float* alpha, PfStream& pf) {
  constexpr int kCC = V::kW * V::kNV;
  const auto& tab = ACC ? ValsT<V, Tune>::kAcc : ValsT<V, Tune>::kSet;
  for (int n0 = 0; n0 < N; n0 += kCC) {
    const int nv = std::min(N - n0, kCC) / V::kW;
    row_groups(D, Tune::rows_valst(nv), [&](int d0, int r) {
      const char* at = nullptr;
      const int npf = Tune::kPrefetchStream ? pf.take(K, &at) : 0;
      tab[r - 1][nv - 1](K, kv + d0, D, rows, B + n0, ldb, C + d0 * ldc + n0, ldc,
                         alpha ? alpha + n0 : nullptr, at, npf);
    });
  }
}

// ---- key grads: C[rows[r], 0:L NV] += sum_k A[r lda + k] B[k w + 0:L NV], r < R ----------------
// A = [dS^T | P^T] rows, B one chunk (width w, zero padded past D) of the panel [Q ; dO]; the last
// vector of C holds nlast <= L columns (fewer only for the last chunk when D is not a multiple of
// L).
template <class V, class Tune>
struct KeyGrad {
  template <int R, int NV, bool ACC>
  static void run(int K, const float* A, int64_t lda, const float* B, int64_t w, float* C,
                  int64_t ldc, const int32_t* rows, int nlast) {
    constexpr int L = V::kW;
    const typename V::Tail tl = V::tail(nlast);
    typename V::T c[R][NV];
    float* cr[R];
    // The C rows are scattered (in L2 or further): sum into zeroed registers and add C at the end,
    // so their latency overlaps the products instead of delaying them.
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      cr[r] = C + static_cast<int64_t>(rows[r]) * ldc;
#pragma GCC unroll 4
      for (int o = 0; o < L * NV; o += 16)
        _mm_prefetch(reinterpret_cast<const char*>(cr[r] + o), _MM_HINT_T0);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) c[r][v] = V::zero();
    const float* bk = B;
    for (int k = 0; k < K; ++k, bk += w) {
      typename V::T b[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v)
        b[v] = v == NV - 1 ? V::load_tail(tl, bk + L * v) : V::loadu(bk + L * v);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const typename V::T ar = V::set1(A[r * lda + k]);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) c[r][v] = V::fmadd(ar, b[v], c[r][v]);
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        float* y = cr[r] + L * v;
        if (v < NV - 1 || nlast == L)
          V::storeu(y, V::add(c[r][v], V::loadu(y)));
        else
          V::store_n(y, V::add(c[r][v], V::load_n(y, nlast)), nlast);
      }
  }
  static constexpr auto kTable =
      make_table<KeyGrad, true, V::kNV>(std::make_integer_sequence<int, Tune::kKeyRows>{});
};

// C[rows[m], 0:D] += A [M, K] B [K, D] (A row-major lda, B a panel of D columns whose chunks are
// zero padded to a multiple of the vector width). With Tune::kPrefetchNext row groups go outside
// and column chunks inside: a group walks its C rows from start to end while the next group's rows
// are prefetched chunk by chunk; else column chunks go outside.
template <class V, class Tune>
void gemm_keygrad(int M, int D, int K, const float* A, int64_t lda, const float* B, float* C,
                  const int32_t* rows) {
  constexpr int L = V::kW, kCC = L * V::kNV;
  const auto& tab = KeyGrad<V, Tune>::kTable;
  if constexpr (Tune::kPrefetchNext) {
    row_groups(M, Tune::kKeyRows, [&](int m0, int r) {
      const int nn = std::min(r, M - m0 - r);
      for (int n0 = 0; n0 < D; n0 += kCC) {
        const int nw = std::min(D - n0, kCC), nv = (nw + L - 1) / L;
        for (int i = 0; i < nn; ++i)
          _mm_prefetch(
              reinterpret_cast<const char*>(C + static_cast<int64_t>(rows[m0 + r + i]) * D + n0),
              _MM_HINT_T0);
        tab[r - 1][nv - 1](K, A + m0 * lda, lda, chunk_of(B, K, n0), round_v<V>(nw), C + n0, D,
                           rows + m0, nw - L * (nv - 1));
      }
    });
  } else {
    for (int n0 = 0; n0 < D; n0 += kCC) {
      const int nw = std::min(D - n0, kCC), nv = (nw + L - 1) / L;
      row_groups(M, Tune::kKeyRows, [&](int m0, int r) {
        tab[r - 1][nv - 1](K, A + m0 * lda, lda, chunk_of(B, K, n0), round_v<V>(nw), C + n0, D,
                           rows + m0, nw - L * (nv - 1));
      });
    }
  }
}

// ---- packing ----------------------------------------------------------------------------------
// Columns col0 .. col0 + Hp of a panel [D, N] (col0 and N multiples of the vector width L):
// P(d, col0 + h) = s src[h D + d] for d < D, h < Hp = H rounded up to L (zero for h >= H).
template <class V>
void pack_heads_transposed(const float* src, int H, int D, float s, float* P, int col0, int N) {
  constexpr int L = V::kW, kCC = L * V::kNV;
  const typename V::T vs = V::set1(s);
  for (int h0 = 0; h0 < H; h0 += L) {
    const int col = col0 + h0, c0 = col / kCC * kCC, w = std::min(kCC, N - c0);
    float* base = P + static_cast<int64_t>(c0) * D + (col - c0);
    const int nh = std::min(L, H - h0);
    for (int d0 = 0; d0 < D; d0 += L) {
      const int nd = std::min(L, D - d0);
      typename V::T r[L];
      for (int i = 0; i < L; ++i)  // row h0 + i of src (zero past H), columns d0 .. d0 + nd
        r[i] = i < nh ? V::mul(vs, V::load_n(src + (h0 + i) * D + d0, nd)) : V::zero();
      V::transpose(r);
      for (int c = 0; c < nd; ++c) V::storeu(base + static_cast<int64_t>(d0 + c) * w, r[c]);
    }
  }
}

// dst[h D + d] = s[h] XT[d ldx + h] for h < H, d < D (XT [D, >= Hp] row-major).
template <class V>
void unpack_transposed(const float* XT, int64_t ldx, int H, int D, const float* s, float* dst) {
  constexpr int L = V::kW;
  for (int h0 = 0; h0 < H; h0 += L) {
    const int nh = std::min(L, H - h0);
    const typename V::T vs = V::loadu(s + h0);
    for (int d0 = 0; d0 < D; d0 += L) {
      const int nd = std::min(L, D - d0);
      typename V::T r[L];
      for (int i = 0; i < L; ++i)  // row d0 + i of XT, scaled per column (head)
        r[i] = i < nd ? V::mul(vs, V::loadu(XT + (d0 + i) * ldx + h0)) : V::zero();
      V::transpose(r);
      for (int h = 0; h < nh; ++h) V::store_n(dst + static_cast<int64_t>(h0 + h) * D + d0, r[h], nd);
    }
  }
}

// Rows r0 .. r0 + R of a panel [K, D] (chunks zero padded to a multiple of the vector width) =
// the rows of a row-major [R, D] matrix src, or zeros when src is null.
template <class V>
void pack_rows_panel(const float* src, int R, int D, float* P, int r0, int K) {
  constexpr int kCC = V::kW * V::kNV;
  for (int c0 = 0; c0 < D; c0 += kCC) {
    const int nw = std::min(kCC, D - c0), w = static_cast<int>(round_v<V>(nw));
    float* base = P + static_cast<int64_t>(c0) * K + static_cast<int64_t>(r0) * w;
    for (int r = 0; r < R; ++r) {
      const int n = src ? nw : 0;
      if (n) std::memcpy(base + r * w, src + static_cast<int64_t>(r) * D + c0, sizeof(float) * n);
      std::memset(base + r * w + n, 0, sizeof(float) * (w - n));
    }
  }
}

template <class V>
float dot(const float* a, const float* b, int D) {
  typename V::T acc = V::zero();
  for (int d = 0; d < D; d += V::kW)
    acc = V::fmadd(V::load_n(a + d, D - d), V::load_n(b + d, D - d), acc);
  return V::reduce_add(acc);
}

// ---- one query ----------------------------------------------------------------------------------
// Forward: qi: [H, D]  rows: [n] -> oi: [H, D]  lsei: [H]. With Tune::kPrefetchStream the next
// query's q and o (qn, on; null for none) come into L2 while this one computes.
template <class V, class Tune>
void fwd_query(const SparseAttnShape& sh, const float* qi, const float* kv, const int32_t* rows,
               int64_t n, const float* sink, float* oi, float* lsei, const float* qn,
               const float* on) {
  using T = typename V::T;
  constexpr int L = V::kW;
  const int H = sh.H, D = sh.D, Hp = static_cast<int>(round_v<V>(H)), KB = Tune::block_rows(D);
  PfStream pf;
  if (Tune::kPrefetchStream && qn)
    pf.add(qn, static_cast<int64_t>(H) * D), pf.add(on, static_cast<int64_t>(H) * D);
  if (n == 0) {
    std::memset(oi, 0, sizeof(float) * H * D);
    for (int h = 0; h < H; ++h) lsei[h] = sink ? sink[h] : kNegInf;
    return;
  }
  const size_t np = static_cast<size_t>(D) * Hp, ns = static_cast<size_t>(Tune::kKBMax) * Hp;
  float* QT = thread_scratch(2 * np + ns + 4 * Hp);  // panel Q^T scale log2(e) [D, Hp]
  float* OT = QT + np;                               // unnormalized O^T [D, Hp]
  float* S = OT + np;                                // S^T, then P^T, of a block [nb, Hp]
  float* m2 = S + ns;                                // running max, log2 units
  float* l = m2 + Hp;                                // running sum of 2^(s - m2)
  float* rl = l + Hp;                                // 1 / l at the end
  float* alpha = rl + Hp;                            // rescale of O^T by a block
  pack_heads_transposed<V>(qi, H, D, sh.scale * kLog2e, QT, 0, Hp);
  for (int h = 0; h < Hp; ++h) {
    const bool has = sink && h < H;
    m2[h] = has ? sink[h] * kLog2e : kNegInf;
    l[h] = has ? 1.f : 0.f;
  }
  for (int64_t j0 = 0; j0 < n; j0 += KB) {
    const int nb = static_cast<int>(std::min<int64_t>(KB, n - j0));
    const int32_t* rb = rows + j0;
    gemm_scores<V, Tune>(nb, Hp, D, kv, D, rb, n - j0 - nb, QT, S, Hp);  // S^T [nb, Hp] = K Q^T
    for (int h0 = 0; h0 < Hp; h0 += L) {
      T mb = V::set1(kNegInf);
      for (int j = 0; j < nb; ++j) mb = V::max(mb, V::loadu(S + j * Hp + h0));
      const T mo = V::loadu(m2 + h0), mn = V::max(mo, mb);
      T sum = V::zero();
      for (int j = 0; j < nb; ++j) {
        float* s = S + j * Hp + h0;
        const T p = V::exp2(V::sub(V::loadu(s), mn));
        V::storeu(s, p);
        sum = V::add(sum, p);
      }
      const T al = V::exp2(V::sub(mo, mn));
      V::storeu(m2 + h0, mn);
      V::storeu(l + h0, V::fmadd(V::loadu(l + h0), al, sum));
      V::storeu(alpha + h0, al);
    }
    if (j0 == 0)  // O^T = K^T P^T
      gemm_valst<V, Tune, false>(D, Hp, nb, kv, rb, S, Hp, OT, Hp, nullptr, pf);
    else  // O^T = alpha O^T + K^T P^T
      gemm_valst<V, Tune, true>(D, Hp, nb, kv, rb, S, Hp, OT, Hp, alpha, pf);
  }
  for (int h = 0; h < Hp; ++h) rl[h] = h < H ? 1.f / l[h] : 0.f;
  for (int h = 0; h < H; ++h) lsei[h] = (m2[h] + std::log2(l[h])) * kLn2;
  unpack_transposed<V>(OT, Hp, H, D, rl, oi);
}

// Backward: qi, oi, dOi: [H, D]  lsei: [H]  rows: [n] -> dqi [H, D] overwritten, dkv rows (of
// `dkv_rows` [M, D]) += and dsink_part [Hp] +=. With Tune::kPrefetchStream the next query's q,
// dO, o, dq (qn, dOn, on, dqn; null for none) come into L2 while this one computes.
template <class V, class Tune>
void bwd_query(const SparseAttnShape& sh, const float* qi, const float* kv, const int32_t* rows,
               int64_t n, const float* sink, const float* oi, const float* lsei, const float* dOi,
               float* dqi, float* dkv_rows, float* dsink_part, const float* qn, const float* dOn,
               const float* on, const float* dqn) {
  using T = typename V::T;
  constexpr int L = V::kW, kCC = L * V::kNV;
  const int H = sh.H, D = sh.D, Hp = static_cast<int>(round_v<V>(H)), W = 2 * Hp,
            KB = Tune::block_rows(D);
  PfStream pf;
  if (Tune::kPrefetchStream && qn)
    for (const float* x : {dOn, on, qn, dqn}) pf.add(x, static_cast<int64_t>(H) * D);
  const size_t nb1 = static_cast<size_t>(D) * W,
               nqd = static_cast<size_t>(W) * ((D + kCC - 1) / kCC * kCC) + 64,
               nsp = static_cast<size_t>(Tune::kKBMax) * W, ndq = static_cast<size_t>(D) * Hp;
  float* B1 = thread_scratch(nb1 + nqd + nsp + ndq + 3 * Hp);  // [Q^T scale log2(e) | dO^T]
  float* QdO = B1 + nb1;                                       // panel [Q ; dO] [2Hp, D]
  float* SP = QdO + nqd;  // [S^T | dP^T] then [dS^T | P^T] of a key block [nb, 2Hp]
  float* dqT = SP + nsp;  // dq^T [D, Hp]
  float* delta = dqT + ndq;
  float* lse2 = delta + Hp;
  float* ones = lse2 + Hp;
  for (int h = 0; h < Hp; ++h) {
    delta[h] = h < H ? dot<V>(dOi + static_cast<int64_t>(h) * D, oi + static_cast<int64_t>(h) * D, D)
                     : 0.f;
    lse2[h] = h < H ? lsei[h] * kLog2e : 0.f;
    ones[h] = 1.f;
    if (sink && h < H && lsei[h] != kNegInf)
      dsink_part[h] += -std::exp(sink[h] - lsei[h]) * delta[h];
  }
  if (n == 0) {
    std::memset(dqi, 0, sizeof(float) * H * D);
    return;
  }
  pack_heads_transposed<V>(qi, H, D, sh.scale * kLog2e, B1, 0, W);
  pack_heads_transposed<V>(dOi, H, D, 1.f, B1, Hp, W);
  pack_rows_panel<V>(qi, H, D, QdO, 0, W);
  pack_rows_panel<V>(nullptr, Hp - H, D, QdO, H, W);
  pack_rows_panel<V>(dOi, H, D, QdO, Hp, W);
  pack_rows_panel<V>(nullptr, Hp - H, D, QdO, Hp + H, W);
  const T vscale = V::set1(sh.scale);
  for (int64_t j0 = 0; j0 < n; j0 += KB) {
    const int nb = static_cast<int>(std::min<int64_t>(KB, n - j0));
    const int32_t* rb = rows + j0;
    // [S^T | dP^T] = K [Q^T | dO^T], S in log2 units
    gemm_scores<V, Tune>(nb, W, D, kv, D, rb, n - j0 - nb, B1, SP, W);
    for (int h0 = 0; h0 < Hp; h0 += L) {
      const T l2 = V::loadu(lse2 + h0), dl = V::loadu(delta + h0);
      for (int j = 0; j < nb; ++j) {
        float* s = SP + static_cast<int64_t>(j) * W + h0;
        const T p = V::exp2(V::sub(V::loadu(s), l2));
        const T ds = V::mul(V::mul(p, V::sub(V::loadu(s + Hp), dl)), vscale);
        V::storeu(s, ds);
        V::storeu(s + Hp, p);
      }
    }
    if (j0 == 0)  // dq^T = K^T dS^T
      gemm_valst<V, Tune, false>(D, Hp, nb, kv, rb, SP, W, dqT, Hp, nullptr, pf);
    else  // dq^T += K^T dS^T
      gemm_valst<V, Tune, true>(D, Hp, nb, kv, rb, SP, W, dqT, Hp, ones, pf);
    // dkv[rows] += [dS^T | P^T] [Q ; dO]
    gemm_keygrad<V, Tune>(nb, D, W, SP, W, QdO, dkv_rows, rb);
  }
  unpack_transposed<V>(dqT, Hp, H, D, ones, dqi);
}

// q: [N,H,D]  kv: [M,D]  off: [N+1]  idx: [off[N]]  sink: [H] or null -> o: [N,H,D]  lse: [N,H]
template <class V, class Tune>
void sparse_attn_fwd_tiles(const SparseAttnShape& sh, const float* q, const float* kv,
                           const int64_t* off, const int32_t* idx, const float* sink, float* o,
                           float* lse) {
  constexpr int64_t kQ = 4;  // queries per work item
  const int64_t HD = static_cast<int64_t>(sh.H) * sh.D;
  parallel_dynamic((sh.N + kQ - 1) / kQ, [&](int64_t it) {
    const FlushDenormals ftz;
    for (int64_t i = it * kQ; i < std::min(sh.N, it * kQ + kQ); ++i)
      fwd_query<V, Tune>(sh, q + i * HD, kv, idx + off[i], off[i + 1] - off[i], sink, o + i * HD,
                         lse + i * sh.H, i + 1 < sh.N ? q + (i + 1) * HD : nullptr,
                         i + 1 < sh.N ? o + (i + 1) * HD : nullptr);
  });
}

// as the forward plus o, lse from it and dO: [N,H,D]; workspace: (Tune::chunks(N) - 1) x [M, D]
// + Tune::chunks(N) x Hp floats -> dq: [N,H,D] (overwritten)  dkv: [M,D] (+=)  dsink: [H] (+=)
template <class V, class Tune>
void sparse_attn_bwd_tiles(const SparseAttnShape& sh, const float* q, const float* kv, int64_t M,
                           const int64_t* off, const int32_t* idx, const float* sink,
                           const float* o, const float* lse, const float* dO, float* dq,
                           float* dkv, float* dsink, float* workspace) {
  constexpr int L = V::kW;
  const int64_t N = sh.N, C = Tune::chunks(N), D = sh.D, HD = sh.H * D;
  const int Hp = static_cast<int>(round_v<V>(sh.H));
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
      bwd_query<V, Tune>(sh, q + i * HD, kv, idx + off[i], off[i + 1] - off[i], sink, o + i * HD,
                         lse + i * sh.H, dO + i * HD, dq + i * HD, tgt, sp,
                         more ? q + (i + 1) * HD : nullptr, more ? dO + (i + 1) * HD : nullptr,
                         more ? o + (i + 1) * HD : nullptr, more ? dq + (i + 1) * HD : nullptr);
    }
  });
  if (C > 1)
    parallel_for(M, 64, [&](int64_t r0, int64_t r1) {
      for (int64_t c = 1; c < C; ++c) {
        const int64_t a = std::max(r0, lo[c]), b = std::min(r1, hi[c] + 1);
        if (a >= b) continue;
        // rows a .. b of dkv and of the partial are contiguous: add them as one vector
        float* y = dkv + a * D;
        const float* x = part + (c - 1) * M * D + a * D;
        const int64_t len = (b - a) * D;
        int64_t e = 0;
        for (; e + L <= len; e += L) V::storeu(y + e, V::add(V::loadu(y + e), V::loadu(x + e)));
        for (; e < len; ++e) y[e] += x[e];
      }
    });
  if (sink)
    for (int64_t c = 0; c < C; ++c)
      for (int h = 0; h < sh.H; ++h) dsink[h] += sinkp[c * Hp + h];
}

}  // namespace
}  // namespace trex::kern::cpu
