// AVX2 + FMA sparse shared-KV attention with an attention sink, forward and backward; semantics in
// kernels/sparse_attn.h, the canonical definition in kernels/ref/sparse_attn.h. The design is the
// AVX-512 kernel's (kernels/cpu/sparse_attn_avx512.cpp) resized for 8-float ymm vectors and 16
// vector registers:
//
// All heads of a query share its key rows (K = V = kv), so a query is one work unit: its list is
// walked in blocks of block_rows(D) rows and every product is a small matrix product in a
// register-blocked micro-kernel that reads the listed kv rows in place. Heads live in vector
// lanes (Hp = round8(H) lanes; the padded lanes carry zeros and are never stored):
//   scores    S^T [nb, Hp] = K Q^T: broadcast K[j, d] from the listed rows, Q^T [D, Hp] rows as
//             vectors (packed once per query, pre-scaled by scale log2(e): S is in log2 units);
//   outputs   O^T [D, Hp] (+)= K^T P^T: broadcast K[j, d] again, P^T rows as vectors;
//   key grads dkv[rows] += [dS^T | P^T] [Q ; dO] with the C rows scattered by the list.
// Micro-kernels hold at most 12 accumulators + the B vectors + one broadcast (<= 15 of the 16
// ymm): 6 rows x 2 vectors (16 columns) or 12 rows x 1 vector. Panels are stored in column chunks
// of 16 (one micro-kernel width). While a block's scores run, the rows of the next row group are
// prefetched into L1 a line at a time; a block (~16 KiB of rows) is sized to stay in L1 for the
// later products, which read each row once per group of output rows.
//   forward:  per block S^T, m and l updated in log2 units (the sink starts them: m = sink, l =
//             1), O^T = alpha O^T + K^T P^T; finally o = (O^T / l)^T, lse = m + log l.
//   backward: [S^T | dP^T] = K [Q^T | dO^T] in one product, P = 2^(S - lse),
//             dS = P (dP - delta) scale with delta = dO.o, then dq^T += K^T dS^T and
//             dkv[rows] += [dS^T | P^T] [Q ; dO].
// Determinism: forward queries are independent. Backward queries go in C fixed chunks (a function
// of N only, kernels/cpu/sparse_attn_avx2.h); chunk 0 accumulates into dkv, chunk c > 0 into its
// own partial [M, D] in the workspace (only the row range the chunk touches is zeroed), and the
// partials are added to dkv row by row in chunk order; dsink likewise through per-chunk partials.
#include "kernels/cpu/sparse_attn_avx2.h"

#include <immintrin.h>

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
#include "kernels/cpu/simd_avx2.h"
#include "kernels/cpu/kernel_scratch.h"

namespace trex::kern::cpu {
namespace {

constexpr int kNV = 2;    // micro-kernel vectors of 8 columns at most
constexpr int kCC = 16;   // column chunk of a panel (8 kNV)
constexpr int kRows = 12; // micro-kernel rows at most
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Key rows per block: D floats each, kept within ~16 KiB of L1 (at least 16, at most 128 rows).
inline int block_rows(int D) { return std::clamp(4096 / std::max(D, 1) / 8 * 8, 16, 128); }
constexpr int kKBMax = 128;

inline int64_t round8(int64_t n) { return (n + 7) & ~int64_t{7}; }
using avx2::tail_mask;

// Softmax in log2 units: 2^x clamped to [-127, 127] (2^-127 comes out as 0; a NaN score stays
// NaN, as in the reference), kernels/cpu/simd_avx2.h.
using avx2::exp2_ps;

// A panel in column chunks: P [K, N] (N a multiple of 8) stored as chunks of kCC columns, chunk
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
// Rows of a micro-kernel with nv vectors of columns: 12 accumulators either way.
constexpr int rows_for(int nv) { return nv == 1 ? 12 : 6; }

// ---- scores: C[r, 0:8 NV] = sum_k kv[rows[r] D + k] B[k 8 NV + 0:8 NV], r < R ----------------
// B is one chunk of a panel. The first line of each 16 steps of the nn rows `next` (the next row
// group) is prefetched. (ACC is unused here and in MicroKeyGrad: the tables take one shape.)
template <int R, int NV, bool ACC>
struct MicroScores {
  static void run(int K, const float* kv, int64_t D, const int32_t* rows, const float* B, float* C,
                  int64_t ldc, const int32_t* next, int nn) {
    __m256 c[R][NV];
    const float* ar[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) ar[r] = kv + static_cast<int64_t>(rows[r]) * D;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) c[r][v] = _mm256_setzero_ps();
    const float* bk = B;
    for (int k0 = 0; k0 < K; k0 += 16) {
      for (int r = 0; r < nn; ++r)
        _mm_prefetch(reinterpret_cast<const char*>(kv + static_cast<int64_t>(next[r]) * D + k0),
                     _MM_HINT_T0);
      const int k1 = std::min(K, k0 + 16);
      for (int k = k0; k < k1; ++k, bk += 8 * NV) {
        __m256 b[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) b[v] = _mm256_loadu_ps(bk + 8 * v);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          const __m256 a = _mm256_broadcast_ss(ar[r] + k);
#pragma GCC unroll 4
          for (int v = 0; v < NV; ++v) c[r][v] = _mm256_fmadd_ps(a, b[v], c[r][v]);
        }
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) _mm256_storeu_ps(C + r * ldc + 8 * v, c[r][v]);
  }
};
constexpr auto kScores = make_table<MicroScores, false>(std::make_integer_sequence<int, kRows>{});

// C[M, N] = kv[rows] [M, K] B [K, N], B a panel, C row-major (ldc). `avail` rows follow rows[M)
// in the list (the next block; prefetched by the last group).
void gemm_scores(int M, int N, int K, const float* kv, int64_t D, const int32_t* rows,
                 int64_t avail, const float* B, float* C, int64_t ldc) {
  for (int n0 = 0; n0 < N; n0 += kCC) {
    const int nv = std::min(N - n0, kCC) / 8;
    row_groups(M, rows_for(nv), [&](int m0, int r) {
      const int nn = static_cast<int>(std::min<int64_t>(r, M - m0 - r + avail));
      kScores[r - 1][nv - 1](K, kv, D, rows + m0, chunk_of(B, K, n0), C + m0 * ldc + n0, ldc,
                             rows + m0 + r, nn);
    });
  }
}

// ---- transposed values: C[r, 0:8 NV] (+)= sum_k kv[rows[k] D + d0 + r] B[k ldb + 0:8 NV] ------
// (C = O^T or dq^T rows d0 .. d0 + R, B = P^T or dS^T.) One kv row per step, read at immediate
// offsets (the block's rows are in L1 after the scores).
template <int R, int NV, bool ACC>
struct MicroValsT {
  static void run(int K, const float* kv, int64_t D, const int32_t* rows, const float* B,
                  int64_t ldb, float* C, int64_t ldc, const float* alpha) {
    __m256 c[R][NV];
    __m256 al[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      al[v] = ACC ? _mm256_loadu_ps(alpha + 8 * v) : _mm256_setzero_ps();
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v)
        c[r][v] = ACC ? _mm256_mul_ps(al[v], _mm256_loadu_ps(C + r * ldc + 8 * v))
                      : _mm256_setzero_ps();
    const float* bk = B;
    for (int k = 0; k < K; ++k, bk += ldb) {
      const float* a = kv + static_cast<int64_t>(rows[k]) * D;
      __m256 b[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) b[v] = _mm256_loadu_ps(bk + 8 * v);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const __m256 ar = _mm256_broadcast_ss(a + r);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) c[r][v] = _mm256_fmadd_ps(ar, b[v], c[r][v]);
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) _mm256_storeu_ps(C + r * ldc + 8 * v, c[r][v]);
  }
};
constexpr auto kValsTSet = make_table<MicroValsT, false>(std::make_integer_sequence<int, kRows>{});
constexpr auto kValsTAcc = make_table<MicroValsT, true>(std::make_integer_sequence<int, kRows>{});

// C[D, N] = alpha C + kv[rows]^T [D, K] B [K, N] (alpha per column, ACC; C = ... without), B
// row-major (ldb), C row-major (ldc); N a multiple of 8. The row range of one kv row goes into
// the row groups as d0 offsets: kv + d0 is passed.
template <bool ACC>
void gemm_valst(int D, int N, int K, const float* kv, const int32_t* rows, const float* B,
                int64_t ldb, float* C, int64_t ldc, const float* alpha) {
  const auto& tab = ACC ? kValsTAcc : kValsTSet;
  for (int n0 = 0; n0 < N; n0 += kCC) {
    const int nv = std::min(N - n0, kCC) / 8;
    row_groups(D, rows_for(nv), [&](int d0, int r) {
      tab[r - 1][nv - 1](K, kv + d0, D, rows, B + n0, ldb, C + d0 * ldc + n0, ldc,
                         alpha ? alpha + n0 : nullptr);
    });
  }
}

// ---- key grads: C[rows[r], 0:8 NV] += sum_k A[r lda + k] B[k w + 0:8 NV], r < R --------------
// A = [dS^T | P^T] rows, B one chunk (width w, zero padded past D) of the panel [Q ; dO]; the
// last vector of C holds nlast <= 8 columns (fewer only for the last chunk when D % 8 != 0).
template <int R, int NV, bool ACC>
struct MicroKeyGrad {
  static void run(int K, const float* A, int64_t lda, const float* B, int64_t w, float* C,
                  int64_t ldc, const int32_t* rows, int nlast) {
    __m256 c[R][NV];
    float* cr[R];
    // The C rows are scattered (in L2 or further): sum into zeroed registers and add C at the end,
    // so their latency overlaps the products instead of delaying them.
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      cr[r] = C + static_cast<int64_t>(rows[r]) * ldc;
      _mm_prefetch(reinterpret_cast<const char*>(cr[r]), _MM_HINT_T0);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) c[r][v] = _mm256_setzero_ps();
    const float* bk = B;
    for (int k = 0; k < K; ++k, bk += w) {
      __m256 b[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) b[v] = _mm256_loadu_ps(bk + 8 * v);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const __m256 ar = _mm256_broadcast_ss(A + r * lda + k);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) c[r][v] = _mm256_fmadd_ps(ar, b[v], c[r][v]);
      }
    }
    // The last vector of a partial chunk (D % 8 != 0) goes through a stack buffer (masked stores
    // are slow on AMD). Fully unrolled, so the accumulators stay in registers.
    const __m256i m = tail_mask(nlast);
    alignas(32) float t[8];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        float* y = cr[r] + 8 * v;
        if (v < NV - 1 || nlast == 8) {
          _mm256_storeu_ps(y, _mm256_add_ps(c[r][v], _mm256_loadu_ps(y)));
        } else {
          _mm256_store_ps(t, _mm256_add_ps(c[r][v], _mm256_maskload_ps(y, m)));
          std::memcpy(y, t, sizeof(float) * nlast);
        }
      }
  }
};
constexpr auto kKeyGrad =
    make_table<MicroKeyGrad, true>(std::make_integer_sequence<int, rows_for(2)>{});

// C[rows[m], 0:D] += A [M, K] B [K, D] (A row-major lda, B a panel of D columns whose chunks are
// zero padded to a multiple of 8 columns). Row groups of 6 outside, column chunks inside: a group
// walks its C rows from start to end while the next group's rows are prefetched chunk by chunk.
void gemm_keygrad(int M, int D, int K, const float* A, int64_t lda, const float* B, float* C,
                  const int32_t* rows) {
  row_groups(M, rows_for(2), [&](int m0, int r) {
    const int nn = std::min(r, M - m0 - r);
    for (int n0 = 0; n0 < D; n0 += kCC) {
      const int nw = std::min(D - n0, kCC), nv = (nw + 7) / 8;
      for (int i = 0; i < nn; ++i)
        _mm_prefetch(
            reinterpret_cast<const char*>(C + static_cast<int64_t>(rows[m0 + r + i]) * D + n0),
            _MM_HINT_T0);
      kKeyGrad[r - 1][nv - 1](K, A + m0 * lda, lda, chunk_of(B, K, n0), round8(nw), C + n0, D,
                              rows + m0, nw - 8 * (nv - 1));
    }
  });
}

// ---- packing ----------------------------------------------------------------------------------
// Columns col0 .. col0 + round8(H) of a panel [D, N] (col0 and N multiples of 8):
// P(d, col0 + h) = s src[h D + d] for d < D, h < round8(H) (zero for h >= H).
void pack_heads_transposed(const float* src, int H, int D, float s, float* P, int col0, int N) {
  const __m256 vs = _mm256_set1_ps(s);
  for (int h0 = 0; h0 < H; h0 += 8) {
    const int col = col0 + h0, c0 = col / kCC * kCC, w = std::min(kCC, N - c0);
    float* base = P + static_cast<int64_t>(c0) * D + (col - c0);
    const int nh = std::min(8, H - h0);
    for (int d0 = 0; d0 < D; d0 += 8) {
      const int nd = std::min(8, D - d0);
      const __m256i m = tail_mask(nd);
      __m256 r[8];
      for (int i = 0; i < 8; ++i)  // row h0 + i of src (zero past H), columns d0 .. d0 + nd
        r[i] = i < nh ? _mm256_mul_ps(vs, _mm256_maskload_ps(src + (h0 + i) * D + d0, m))
                      : _mm256_setzero_ps();
      avx2::transpose8(r);
      for (int c = 0; c < nd; ++c) _mm256_storeu_ps(base + static_cast<int64_t>(d0 + c) * w, r[c]);
    }
  }
}

// dst[h D + d] = s[h] XT[d ldx + h] for h < H, d < D (XT [D, >= round8(H)] row-major).
void unpack_transposed(const float* XT, int64_t ldx, int H, int D, const float* s, float* dst) {
  alignas(32) float t[8];
  for (int h0 = 0; h0 < H; h0 += 8) {
    const int nh = std::min(8, H - h0);
    const __m256 vs = _mm256_loadu_ps(s + h0);
    for (int d0 = 0; d0 < D; d0 += 8) {
      const int nd = std::min(8, D - d0);
      __m256 r[8];
      for (int i = 0; i < 8; ++i)  // row d0 + i of XT, scaled per column (head)
        r[i] = i < nd ? _mm256_mul_ps(vs, _mm256_loadu_ps(XT + (d0 + i) * ldx + h0))
                      : _mm256_setzero_ps();
      avx2::transpose8(r);
      for (int h = 0; h < nh; ++h) {
        float* y = dst + static_cast<int64_t>(h0 + h) * D + d0;
        if (nd == 8) {
          _mm256_storeu_ps(y, r[h]);
        } else {
          _mm256_store_ps(t, r[h]);
          std::memcpy(y, t, sizeof(float) * nd);
        }
      }
    }
  }
}

// Rows r0 .. r0 + R of a panel [K, D] (chunks zero padded to a multiple of 8 columns) = the rows
// of a row-major [R, D] matrix src, or zeros when src is null.
void pack_rows_panel(const float* src, int R, int D, float* P, int r0, int K) {
  for (int c0 = 0; c0 < D; c0 += kCC) {
    const int nw = std::min(kCC, D - c0), w = static_cast<int>(round8(nw));
    float* base = P + static_cast<int64_t>(c0) * K + static_cast<int64_t>(r0) * w;
    for (int r = 0; r < R; ++r) {
      const int n = src ? nw : 0;
      if (n) std::memcpy(base + r * w, src + static_cast<int64_t>(r) * D + c0, sizeof(float) * n);
      std::memset(base + r * w + n, 0, sizeof(float) * (w - n));
    }
  }
}

inline float dot(const float* a, const float* b, int D) {
  __m256 acc = _mm256_setzero_ps();
  for (int d = 0; d < D; d += 8) {
    const __m256i m = tail_mask(std::min(8, D - d));
    acc = _mm256_fmadd_ps(_mm256_maskload_ps(a + d, m), _mm256_maskload_ps(b + d, m), acc);
  }
  return avx2::hsum(acc);
}

// ---- one query ----------------------------------------------------------------------------------
// Forward: qi: [H, D]  rows: [n] -> oi: [H, D]  lsei: [H].
void fwd_query(const SparseAttnShape& sh, const float* qi, const float* kv, const int32_t* rows,
               int64_t n, const float* sink, float* oi, float* lsei) {
  const int H = sh.H, D = sh.D, Hp = static_cast<int>(round8(H)), KB = block_rows(D);
  if (n == 0) {
    std::memset(oi, 0, sizeof(float) * H * D);
    for (int h = 0; h < H; ++h) lsei[h] = sink ? sink[h] : kNegInf;
    return;
  }
  const size_t np = static_cast<size_t>(D) * Hp, ns = static_cast<size_t>(kKBMax) * Hp;
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
  for (int64_t j0 = 0; j0 < n; j0 += KB) {
    const int nb = static_cast<int>(std::min<int64_t>(KB, n - j0));
    const int32_t* rb = rows + j0;
    gemm_scores(nb, Hp, D, kv, D, rb, n - j0 - nb, QT, S, Hp);  // S^T [nb, Hp] = K Q^T
    for (int h0 = 0; h0 < Hp; h0 += 8) {
      __m256 mb = _mm256_set1_ps(kNegInf);
      for (int j = 0; j < nb; ++j) mb = _mm256_max_ps(mb, _mm256_load_ps(S + j * Hp + h0));
      const __m256 mo = _mm256_load_ps(m2 + h0), mn = _mm256_max_ps(mo, mb);
      __m256 sum = _mm256_setzero_ps();
      for (int j = 0; j < nb; ++j) {
        float* s = S + j * Hp + h0;
        const __m256 p = exp2_ps(_mm256_sub_ps(_mm256_load_ps(s), mn));
        _mm256_store_ps(s, p);
        sum = _mm256_add_ps(sum, p);
      }
      const __m256 al = exp2_ps(_mm256_sub_ps(mo, mn));
      _mm256_store_ps(m2 + h0, mn);
      _mm256_store_ps(l + h0, _mm256_fmadd_ps(_mm256_load_ps(l + h0), al, sum));
      _mm256_store_ps(alpha + h0, al);
    }
    if (j0 == 0)  // O^T = K^T P^T
      gemm_valst<false>(D, Hp, nb, kv, rb, S, Hp, OT, Hp, nullptr);
    else  // O^T = alpha O^T + K^T P^T
      gemm_valst<true>(D, Hp, nb, kv, rb, S, Hp, OT, Hp, alpha);
  }
  for (int h = 0; h < Hp; ++h) rl[h] = h < H ? 1.f / l[h] : 0.f;
  for (int h = 0; h < H; ++h) lsei[h] = (m2[h] + std::log2(l[h])) * kLn2;
  unpack_transposed(OT, Hp, H, D, rl, oi);
}

// Backward: qi, oi, dOi: [H, D]  lsei: [H]  rows: [n] -> dqi [H, D] overwritten, dkv rows (of
// `dkv_rows` [M, D]) += and dsink_part [Hp] +=.
void bwd_query(const SparseAttnShape& sh, const float* qi, const float* kv, const int32_t* rows,
               int64_t n, const float* sink, const float* oi, const float* lsei, const float* dOi,
               float* dqi, float* dkv_rows, float* dsink_part) {
  const int H = sh.H, D = sh.D, Hp = static_cast<int>(round8(H)), W = 2 * Hp, KB = block_rows(D);
  const size_t nb1 = static_cast<size_t>(D) * W,
               nqd = static_cast<size_t>(W) * ((D + kCC - 1) / kCC * kCC),
               nsp = static_cast<size_t>(kKBMax) * W, ndq = static_cast<size_t>(D) * Hp;
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
  const __m256 vscale = _mm256_set1_ps(sh.scale);
  for (int64_t j0 = 0; j0 < n; j0 += KB) {
    const int nb = static_cast<int>(std::min<int64_t>(KB, n - j0));
    const int32_t* rb = rows + j0;
    // [S^T | dP^T] = K [Q^T | dO^T], S in log2 units
    gemm_scores(nb, W, D, kv, D, rb, n - j0 - nb, B1, SP, W);
    for (int h0 = 0; h0 < Hp; h0 += 8) {
      const __m256 l2 = _mm256_load_ps(lse2 + h0), dl = _mm256_load_ps(delta + h0);
      for (int j = 0; j < nb; ++j) {
        float* s = SP + static_cast<int64_t>(j) * W + h0;
        const __m256 p = exp2_ps(_mm256_sub_ps(_mm256_load_ps(s), l2));
        const __m256 ds =
            _mm256_mul_ps(_mm256_mul_ps(p, _mm256_sub_ps(_mm256_load_ps(s + Hp), dl)), vscale);
        _mm256_store_ps(s, ds);
        _mm256_store_ps(s + Hp, p);
      }
    }
    if (j0 == 0)  // dq^T = K^T dS^T
      gemm_valst<false>(D, Hp, nb, kv, rb, SP, W, dqT, Hp, nullptr);
    else  // dq^T += K^T dS^T
      gemm_valst<true>(D, Hp, nb, kv, rb, SP, W, dqT, Hp, ones);
    // dkv[rows] += [dS^T | P^T] [Q ; dO]
    gemm_keygrad(nb, D, W, SP, W, QdO, dkv_rows, rb);
  }
  unpack_transposed(dqT, Hp, H, D, ones, dqi);
}

}  // namespace

void sparse_attn_fwd_avx2(const SparseAttnShape& sh, const float* q, const float* kv, int64_t M,
                          const int64_t* off, const int32_t* idx, const float* sink, float* o,
                          float* lse) {
  (void)M;
  constexpr int64_t kQ = 4;  // queries per work item
  const int64_t HD = static_cast<int64_t>(sh.H) * sh.D;
  parallel_dynamic((sh.N + kQ - 1) / kQ, [&](int64_t it) {
    const FlushDenormals ftz;
    for (int64_t i = it * kQ; i < std::min(sh.N, it * kQ + kQ); ++i)
      fwd_query(sh, q + i * HD, kv, idx + off[i], off[i + 1] - off[i], sink, o + i * HD,
                lse + i * sh.H);
  });
}

void sparse_attn_bwd_avx2(const SparseAttnShape& sh, const float* q, const float* kv, int64_t M,
                          const int64_t* off, const int32_t* idx, const float* sink,
                          const float* o, const float* lse, const float* dO, float* dq,
                          float* dkv, float* dsink, float* workspace) {
  const int64_t N = sh.N, C = sparse_attn_bwd_chunks_avx2(N), D = sh.D, HD = sh.H * D;
  const int Hp = static_cast<int>(round8(sh.H));
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
    for (int64_t i = i0; i < i1; ++i)
      bwd_query(sh, q + i * HD, kv, idx + off[i], off[i + 1] - off[i], sink, o + i * HD,
                lse + i * sh.H, dO + i * HD, dq + i * HD, tgt, sp);
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
        for (; e + 8 <= len; e += 8)
          _mm256_storeu_ps(y + e, _mm256_add_ps(_mm256_loadu_ps(y + e), _mm256_loadu_ps(x + e)));
        for (; e < len; ++e) y[e] += x[e];
      }
    });
  if (sink)
    for (int64_t c = 0; c < C; ++c)
      for (int h = 0; h < sh.H; ++h) dsink[h] += sinkp[c * Hp + h];
}

}  // namespace trex::kern::cpu
