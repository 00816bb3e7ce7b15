// Sparse shared-KV sink attention on the bf16 dot-product instruction (see
// sparse_attn_avx512bf16.h): per query, the scores and the value products as small GEMMs on
// vdpbf16ps, the softmax in f32 on 16-float vectors.
//
// vdpbf16ps adds, per f32 lane n, a[2n] b[2n] + a[2n+1] b[2n+1]: both operands hold PAIRS of bf16
// along the reduction dimension in one 32-bit word (element 2p in the low half, 2p+1 in the high
// half). The micro-kernel computes C_m[n] (+)= sum_p A_m[p sak] . B[p ldb + n]: rows m of A and C
// are pointers (so the listed kv rows are read in place, no gather, and the listed rows of dkv
// accumulate in place), B is read as 16-word vectors.
// Per query i with its L listed rows (P and dS below are [L, H]):
//   scores  S[j, h]  = kvw[idx j] . qT            A: kv rows (pairs along D, packed once per call)
//                                                  B: qT [D/2, H] (q's pairs transposed)
//   output  o[h, d]  = E^T kvp / sum               A: E^T pairs of rows (j, j+1), column h, with
//                                                     E = exp(scale S - max) (one exp an entry)
//                                                  B: kvp [L/2, D] (listed rows by pairs)
//   backward dP = kvw . dO^T as the scores, dq = dS^T kvp as the output, and
//   dkv[idx j, d] += [scale dS | P][j, 0:2H] . [q ; dO][0:2H, d]: one product over 2H.
// o and dq are written once, past the caches where their rows start on a cache line.
// An odd reduction length pairs its last element with a zero.
//
// Determinism as in kernels/cpu/sparse_attn_tiles.h: forward queries are independent; backward
// queries go in sparse_attn_bwd_chunks(N) fixed chunks, chunk 0 accumulating into dkv and chunk
// c > 0 into its own partial [M, D] in the workspace, the partials added to dkv in chunk order;
// dsink likewise through per-chunk partials.
#include "kernels/cpu/sparse_attn_avx512bf16.h"

// The AVX-512 helpers (exp, masks). This file's flags are the AVX-512 files' plus -mavx512bf16,
// and those inline helpers use no bf16 instruction: whichever copy the linker keeps runs on any
// AVX-512 CPU.
#include "kernels/cpu/simd_avx512.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "core/aligned.h"
#include "core/parallel.h"
#include "kernels/cpu/kernel_scratch.h"
#include "kernels/cpu/sparse_attn_avx512.h"

namespace trex::kern::cpu {
namespace {

using avx512::tail_mask;
using W32 = uint32_t;  // two bf16 of neighbouring reduction elements

constexpr int kRMax = 12;  // micro-kernel rows at most (one vector of columns)
constexpr int kNV = 4;     // micro-kernel vectors of 16 columns at most
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int64_t round16(int64_t n) { return (n + 15) / 16 * 16; }
int64_t pairs_of(int64_t n) { return (n + 1) / 2; }
// Rows per micro-kernel for nv vectors of columns: R nv accumulators + nv B vectors in 32 zmm.
constexpr int rows_for(int nv) { return nv == 1 ? 12 : nv == 2 ? 8 : 6; }

// C[r][c0 + 0:16 NV] (+)= sum_p A[r][p sak] . B[p ldb + 0:16 NV] for r < R, p < KP; the last
// vector of each row of B and C is limited by the lane mask `mlast`. Rows of A and C are pointers
// (kv rows read in place, dkv rows accumulated in place).
template <int R, int NV>
void micro(int64_t KP, const W32* const* A, int64_t sak, const W32* B, int64_t ldb, float* const* C,
           int64_t c0, __mmask16 mlast, bool acc) {
  __m512 c[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      c[r][v] = !acc          ? _mm512_setzero_ps()
                : v == NV - 1 ? _mm512_maskz_loadu_ps(mlast, C[r] + c0 + 16 * v)
                              : _mm512_loadu_ps(C[r] + c0 + 16 * v);
  const W32* a[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) a[r] = A[r];
  for (int64_t p = 0; p < KP; ++p) {
    __m512i b[NV];
    const W32* bp = B + p * ldb;
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      b[v] = v == NV - 1 ? _mm512_maskz_loadu_epi32(mlast, bp + 16 * v) : _mm512_loadu_si512(bp + 16 * v);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512i ar = _mm512_set1_epi32(static_cast<int>(a[r][p * sak]));
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
        _mm512_mask_storeu_ps(C[r] + c0 + 16 * v, mlast, c[r][v]);
      else
        _mm512_storeu_ps(C[r] + c0 + 16 * v, c[r][v]);
    }
}

using MicroFn = void (*)(int64_t, const W32* const*, int64_t, const W32*, int64_t, float* const*,
                         int64_t, __mmask16, bool);
template <int R>
constexpr std::array<MicroFn, kNV> micro_row() {
  return {{&micro<R, 1>, &micro<R, 2>, &micro<R, 3>, &micro<R, 4>}};
}
template <int... Rs>
constexpr auto micro_table(std::integer_sequence<int, Rs...>) {
  return std::array<std::array<MicroFn, kNV>, sizeof...(Rs)>{{micro_row<Rs + 1>()...}};
}
constexpr auto kMicro = micro_table(std::make_integer_sequence<int, kRMax>{});

// C[M, N] (+)= A[M, 2 KP] B[2 KP, N]: A(m, pair p) = A[m][p sak], B(pair p, n) = B[p ldb + n],
// C(m, n) = C[m][n]; acc = false overwrites C (also when KP == 0).
void gemm(int64_t M, int64_t N, int64_t KP, const W32* const* A, int64_t sak, const W32* B,
          int64_t ldb, float* const* C, bool acc) {
  for (int64_t n0 = 0; n0 < N; n0 += 16 * kNV) {
    const int64_t nw = std::min<int64_t>(16 * kNV, N - n0);
    const int nv = static_cast<int>((nw + 15) / 16), rmax = rows_for(nv);
    const __mmask16 ml = tail_mask(nw - 16 * (nv - 1));
    for (int64_t m0 = 0; m0 < M; m0 += rmax) {
      const int r = static_cast<int>(std::min<int64_t>(rmax, M - m0));
      kMicro[r - 1][nv - 1](KP, A + m0, sak, B + n0, ldb, C + m0, n0, ml, acc);
    }
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

// "row": dst[p] = bf16 pair (src[2p], src[2p + 1]) for p < words (a multiple of 16); elements
// past n are zero.
void pack_row(W32* dst, int64_t words, const float* src, int64_t n) {
  for (int64_t p0 = 0; p0 < words; p0 += 16) {
    const int64_t d = 2 * p0;
    const __m512 a = _mm512_maskz_loadu_ps(tail_mask(n - d), src + d);
    const __m512 b = _mm512_maskz_loadu_ps(tail_mask(n - d - 16), src + d + 16);
    _mm512_storeu_si512(dst + p0, (__m512i)_mm512_cvtne2ps_pbh(b, a));
  }
}

// "pairs": dst[x] = bf16 pair (r0[x], r1[x]) for x < n (a multiple-of-16 row; r1 null = zeros).
void pack_pair(W32* dst, const float* r0, const float* r1, int64_t n) {
  for (int64_t x = 0; x < n; x += 16) {
    const __mmask16 m = tail_mask(n - x);
    const __m512 a = _mm512_maskz_loadu_ps(m, r0 + x);
    const __m512 b = r1 ? _mm512_maskz_loadu_ps(m, r1 + x) : _mm512_setzero_ps();
    _mm512_storeu_si512(dst + x, pair_words(a, b));
  }
}

// dst [D words] = bf16 pairs (w0[x], w1[x]) of two kvw rows (their bf16 values in order; w1
// null: zeros), the words pack_pair makes from the rows' f32 values.
void pair_of_rows(W32* dst, const W32* w0, const W32* w1, int64_t D) {
  const auto* r0 = reinterpret_cast<const uint16_t*>(w0);
  const auto* r1 = reinterpret_cast<const uint16_t*>(w1);
  for (int64_t x = 0; x < D; x += 16) {
    const __mmask16 m = tail_mask(D - x);
    // The maskz forms: GCC 12 warns that the plain ones' internal undefined source is uninitialized.
    const __m512i a = _mm512_maskz_cvtepu16_epi32(0xFFFF, _mm256_maskz_loadu_epi16(m, r0 + x));
    const __m512i b = r1 ? _mm512_castps_si512(avx512::widen_bf16(_mm256_maskz_loadu_epi16(m, r1 + x)))
                         : _mm512_setzero_si512();
    _mm512_storeu_si512(dst + x, _mm512_or_si512(a, b));
  }
}

// The next query's rows [n floats] at p into the caches while this one is computed (issued
// before its last GEMM, late enough that its own operands do not evict them first): a query's
// rows are too short for the hardware prefetchers to ramp up on.
inline void prefetch_rows(const float* p, int64_t n) {
  for (int64_t e = 0; e < n; e += 16) _mm_prefetch(reinterpret_cast<const char*>(p + e), _MM_HINT_T0);
}

// The per-call constants and one thread's buffers for queries of at most Lmax keys.
struct Work {
  int H, D;
  int64_t Hp, DP, DPW, Dw, XW, Lmax, LP;
  float scale;
  // On cache lines (aligned_vector): the GEMMs' 64-byte B rows and C rows never straddle two.
  aligned_vector<W32> qrow, qT, dOT, PwT, SwT, kvp, Xw, Yp;
  aligned_vector<float> S, dP, xt, ob;
  std::vector<const W32*> rows;
  std::vector<float*> crow;
  std::vector<float> inv_h;  // [H] 1 / the softmax's sum (the forward)

  Work(const SparseAttnShape& sh, int64_t lmax, bool bwd)
      : H(sh.H), D(sh.D), Hp(round16(sh.H)), DP(pairs_of(sh.D)), DPW(round16(DP)),
        Dw(round16(sh.D)), XW(round16(sh.H)), Lmax(lmax), LP(pairs_of(lmax)), scale(sh.scale) {
    qrow.assign(H * DPW, 0), qT.assign(DP * Hp, 0), PwT.assign(LP * Hp, 0);
    kvp.assign(LP * Dw, 0), S.assign(Lmax * Hp, 0.f);
    rows.assign(std::max<int64_t>(Lmax, H), nullptr);
    crow.assign(std::max<int64_t>(Lmax, H), nullptr);
    inv_h.assign(H, 0.f);
    ob.assign(H * D, 0.f);
    if (bwd) {
      dOT.assign(DP * Hp, 0), SwT.assign(LP * Hp, 0), Xw.assign(Lmax * XW, 0);
      Yp.assign(H * Dw, 0), dP.assign(Lmax * Hp, 0.f), xt.assign(2 * XW + 32, 0.f);
    }
  }

  // Row pointers base + r ld for r < n (C of a GEMM).
  float* const* crows(float* base, int64_t n, int64_t ld) {
    for (int64_t r = 0; r < n; ++r) crow[r] = base + r * ld;
    return crow.data();
  }

  // dst [DP, Hp] = pairs of x [H, D] along D, transposed (the B operand of x . kv); the padded
  // head columns are zero.
  void transpose_pack(W32* dst, const float* x) {
    for (int h = 0; h < H; ++h) pack_row(qrow.data() + h * DPW, DPW, x + int64_t{h} * D, D);
    for (int64_t h0 = 0; h0 < Hp; h0 += 16)
      for (int64_t p0 = 0; p0 < DP; p0 += 16) {  // one 16 x 16 block of words
        __m512 r[16];
        for (int t = 0; t < 16; ++t)
          r[t] = h0 + t < H ? _mm512_castsi512_ps(_mm512_loadu_si512(qrow.data() + (h0 + t) * DPW + p0))
                            : _mm512_setzero_ps();
        avx512::transpose16(r);
        const int64_t pn = std::min<int64_t>(16, DP - p0);
        for (int64_t c = 0; c < pn; ++c)
          _mm512_storeu_ps(reinterpret_cast<float*>(dst + (p0 + c) * Hp + h0), r[c]);
      }
  }

  // C [L, Hp] = scores of the listed kv rows (packed kvw) against xT [DP, Hp] (unscaled).
  void dots(float* C, const W32* kvw, const int32_t* ix, int64_t L, const W32* xT) {
    for (int64_t j = 0; j < L; ++j) rows[j] = kvw + int64_t{ix[j]} * DPW;
    gemm(L, H, DP, rows.data(), 1, xT, Hp, crows(C, L, Hp), false);
  }

  // dst [LP, Hp] = pairs of rows (2p, 2p + 1) of x [L, Hp] (a missing last row is zero).
  void pack_rows_pairs(W32* dst, const float* x, int64_t L) {
    for (int64_t p = 0; p < pairs_of(L); ++p)
      pack_pair(dst + p * Hp, x + 2 * p * Hp, 2 * p + 1 < L ? x + (2 * p + 1) * Hp : nullptr, Hp);
  }

  // kvp [LP, Dw] = pairs of the listed kv rows (2p, 2p + 1), from their bf16 copies in kvw (a
  // kvw row is the row's bf16 values in order): the words pack_pair would make from the f32
  // rows, without converting them again for every query that lists them.
  void pack_kv_pairs(const W32* kvw, const int32_t* ix, int64_t L) {
    for (int64_t p = 0; p < pairs_of(L); ++p)
      pair_of_rows(kvp.data() + p * Dw, kvw + int64_t{ix[2 * p]} * DPW,
                   2 * p + 1 < L ? kvw + int64_t{ix[2 * p + 1]} * DPW : nullptr, D);
  }

  // out [H, D] = XwT^T kvp over the L listed rows (XwT [LP, Hp] pairs of an [L, Hp] matrix).
  void times_kv(float* out, const W32* XwT, int64_t L) {
    for (int h = 0; h < H; ++h) rows[h] = XwT + h;
    gemm(H, D, pairs_of(L), rows.data(), Hp, kvp.data(), Dw, crows(out, H, D), false);
  }

  // The forward: S [L, Hp] scores -> e = exp(scale S - m) in place, m the largest of the scaled
  // scores and the sink; lse [H] = m + log(sum e + exp(sink - m)) and inv_h [H] = 1 / that sum,
  // so P = e inv_h (one exp an entry; inv_h is applied to the output by store_out).
  void softmax_fwd(int64_t L, const float* sink, float* lse_out) {
    const __m512 sc = _mm512_set1_ps(scale);
    for (int64_t h0 = 0; h0 < Hp; h0 += 16) {
      const __mmask16 mh = tail_mask(H - h0);
      __m512 m = sink ? _mm512_mask_loadu_ps(_mm512_set1_ps(kNegInf), mh, sink + h0)
                      : _mm512_set1_ps(kNegInf);
      for (int64_t j = 0; j < L; ++j)
        m = _mm512_max_ps(m, _mm512_mul_ps(sc, _mm512_loadu_ps(S.data() + j * Hp + h0)));
      // padded lanes: keep them finite (their results are never read)
      m = _mm512_mask_blend_ps(mh, _mm512_setzero_ps(), m);
      __m512 s = sink ? avx512::exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(mh, sink + h0), m))
                      : _mm512_setzero_ps();
      for (int64_t j = 0; j < L; ++j) {
        float* x = S.data() + j * Hp + h0;
        const __m512 e = avx512::exp_ps(_mm512_fmsub_ps(sc, _mm512_loadu_ps(x), m));
        _mm512_storeu_ps(x, e);
        s = _mm512_add_ps(s, e);
      }
      alignas(64) float mm[16], ss[16];
      _mm512_store_ps(mm, m), _mm512_store_ps(ss, s);
      for (int t = 0; t < 16 && h0 + t < H; ++t) {
        lse_out[h0 + t] = mm[t] + std::log(ss[t]);
        inv_h[h0 + t] = 1.f / ss[t];
      }
    }
  }
  // out [H, D] = ob [H, D] with each row h times rs[h] (rs null: 1). out is not read again by
  // this kernel: where its rows start on a cache line, it is streamed past the caches (no line
  // read before it is written; callers fence).
  void store_out(float* out, const float* rs) const {
    const bool stream = D % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 64 == 0;
    for (int h = 0; h < H; ++h) {
      const __m512 r = _mm512_set1_ps(rs ? rs[h] : 1.f);
      const float* x = ob.data() + int64_t{h} * D;
      float* y = out + int64_t{h} * D;
      for (int d = 0; d < D; d += 16) {
        const __mmask16 m = tail_mask(D - d);
        const __m512 v = rs ? _mm512_mul_ps(r, _mm512_maskz_loadu_ps(m, x + d)) : _mm512_maskz_loadu_ps(m, x + d);
        if (stream)
          _mm512_stream_ps(y + d, v);
        else
          _mm512_mask_storeu_ps(y + d, m, v);
      }
    }
  }

  // The backward: S [L, Hp] scores -> P = exp(scale S - lse) in place, lse [H] from the forward.
  void softmax_bwd(int64_t L, const float* lse_in) {
    const __m512 sc = _mm512_set1_ps(scale);
    for (int64_t h0 = 0; h0 < Hp; h0 += 16) {
      const __m512 l = _mm512_maskz_loadu_ps(tail_mask(H - h0), lse_in + h0);
      for (int64_t j = 0; j < L; ++j) {
        float* x = S.data() + j * Hp + h0;
        _mm512_storeu_ps(x, avx512::exp_ps(_mm512_fmsub_ps(sc, _mm512_loadu_ps(x), l)));
      }
    }
  }
};

int64_t max_keys(int64_t N, const int64_t* off) {
  int64_t m = 0;
  for (int64_t i = 0; i < N; ++i) m = std::max(m, off[i + 1] - off[i]);
  return m;
}

// kv [M, D] -> kvw [M, DPW] (pairs along D).
aligned_vector<W32> pack_kv(const float* kv, int64_t M, int D, int64_t DPW) {
  aligned_vector<W32> w(M * DPW);
  parallel_for(M, 256, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) pack_row(w.data() + r * DPW, DPW, kv + r * D, D);
  });
  return w;
}

}  // namespace

void sparse_attn_fwd_avx512bf16(const SparseAttnShape& sh, const float* q, const float* kv,
                                int64_t M, const int64_t* off, const int32_t* idx,
                                const float* sink, float* o, float* lse) {
  const int H = sh.H, D = sh.D;
  const int64_t HD = int64_t{H} * D, lmax = max_keys(sh.N, off);
  const aligned_vector<W32> kvw = pack_kv(kv, M, D, round16(pairs_of(D)));
  parallel_for(sh.N, 1, [&](int64_t i0, int64_t i1) {
    const FlushDenormals ftz;
    Work w(sh, lmax, false);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t L = off[i + 1] - off[i];
      const int32_t* ix = idx + off[i];
      float* oi = o + i * HD;
      float* li = lse + i * H;
      if (L == 0) {
        std::memset(oi, 0, sizeof(float) * HD);
        for (int h = 0; h < H; ++h) li[h] = sink ? sink[h] : kNegInf;
        continue;
      }
      w.transpose_pack(w.qT.data(), q + i * HD);
      w.dots(w.S.data(), kvw.data(), ix, L, w.qT.data());
      w.softmax_fwd(L, sink, li);
      w.pack_rows_pairs(w.PwT.data(), w.S.data(), L);
      w.pack_kv_pairs(kvw.data(), ix, L);
      if (i + 1 < i1) prefetch_rows(q + (i + 1) * HD, HD);
      w.times_kv(w.ob.data(), w.PwT.data(), L);
      w.store_out(oi, w.inv_h.data());
    }
    _mm_sfence();  // the streamed rows of o, visible to the threads that read them next
  });
}

void sparse_attn_bwd_avx512bf16(const SparseAttnShape& sh, const float* q, const float* kv,
                                int64_t M, const int64_t* off, const int32_t* idx,
                                const float* sink, const float* o, const float* lse,
                                const float* dO, float* dq, float* dkv, float* dsink,
                                float* workspace) {
  const int H = sh.H, D = sh.D;
  const int64_t N = sh.N, C = sparse_attn_bwd_chunks(N), HD = int64_t{H} * D;
  const int64_t Hp = round16(H), lmax = max_keys(N, off);
  const aligned_vector<W32> kvw = pack_kv(kv, M, D, round16(pairs_of(D)));
  float* part = workspace;                     // [C - 1, M, D]: chunks 1.. (0 uses dkv)
  float* sinkp = workspace + (C - 1) * M * D;  // [C, Hp]
  std::vector<int64_t> lo(C, 0), hi(C, -1);    // row range each chunk touches
  parallel_dynamic(C, [&](int64_t c) {
    const FlushDenormals ftz;
    Work w(sh, lmax, true);
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
      const int64_t L = off[i + 1] - off[i];
      const int32_t* ix = idx + off[i];
      const float *qi = q + i * HD, *dOi = dO + i * HD, *oi = o + i * HD;
      float* dqi = dq + i * HD;
      if (L == 0) {  // no key: o = 0, so delta = 0 and nothing flows
        std::memset(dqi, 0, sizeof(float) * HD);
        continue;
      }
      // P [L, Hp] from the saved lse; dP [L, Hp] = kv . dO
      w.transpose_pack(w.qT.data(), qi);
      w.dots(w.S.data(), kvw.data(), ix, L, w.qT.data());
      w.softmax_bwd(L, lse + i * H);
      w.transpose_pack(w.dOT.data(), dOi);
      w.dots(w.dP.data(), kvw.data(), ix, L, w.dOT.data());
      // delta [H] = rowsum(dO o) in f32
      alignas(64) float delta[16];
      for (int64_t h0 = 0; h0 < Hp; h0 += 16) {
        for (int t = 0; t < 16; ++t) {
          const int h = static_cast<int>(h0) + t;
          if (h >= H) {
            delta[t] = 0.f;
            continue;
          }
          __m512 a = _mm512_setzero_ps();
          for (int d = 0; d < D; d += 16) {
            const __mmask16 m = tail_mask(D - d);
            a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, dOi + h * D + d),
                                _mm512_maskz_loadu_ps(m, oi + h * D + d), a);
          }
          delta[t] = avx512::hsum(a);
          if (sink) sp[h] += -std::exp(sink[h] - lse[i * H + h]) * delta[t];
        }
        // dS = scale P (dP - delta), in place of dP
        const __m512 dl = _mm512_load_ps(delta), sc = _mm512_set1_ps(sh.scale);
        for (int64_t j = 0; j < L; ++j) {
          float* x = w.dP.data() + j * Hp + h0;
          const __m512 p = _mm512_loadu_ps(w.S.data() + j * Hp + h0);
          const __m512 d = _mm512_sub_ps(_mm512_loadu_ps(x), dl);
          _mm512_storeu_ps(x, _mm512_mul_ps(sc, _mm512_mul_ps(p, d)));
        }
      }
      // dq [H, D] = dS^T kv
      w.pack_rows_pairs(w.SwT.data(), w.dP.data(), L);
      w.pack_kv_pairs(kvw.data(), ix, L);
      w.times_kv(w.ob.data(), w.SwT.data(), L);
      w.store_out(dqi, nullptr);
      // dkv[ix j] += [dS | P][j, 0:2H] . [q ; dO], accumulated into the rows in place
      for (int64_t j = 0; j < L; ++j) {
        W32* xw = w.Xw.data() + j * w.XW;
        const float *ds = w.dP.data() + j * Hp, *pj = w.S.data() + j * Hp;
        if (H % 16 == 0) {  // [dS | P] of 32 floats -> 16 words, straight from the two rows
          for (int64_t e = 0; e < 2 * H; e += 32) {
            const float* a = e < H ? ds + e : pj + (e - H);
            const float* b = e + 16 < H ? ds + e + 16 : pj + (e + 16 - H);
            _mm512_storeu_si512(xw + e / 2, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(b), _mm512_loadu_ps(a)));
          }
        } else {
          std::memcpy(w.xt.data(), ds, sizeof(float) * H);
          std::memcpy(w.xt.data() + H, pj, sizeof(float) * H);
          pack_row(xw, w.XW, w.xt.data(), 2 * H);
        }
        w.rows[j] = xw;
        w.crow[j] = tgt + int64_t{ix[j]} * D;
      }
      for (int p = 0; p < H; ++p) {
        const int k0 = 2 * p, k1 = 2 * p + 1;
        pack_pair(w.Yp.data() + int64_t{p} * w.Dw, k0 < H ? qi + k0 * D : dOi + (k0 - H) * D,
                  k1 < H ? qi + k1 * D : dOi + (k1 - H) * D, D);
      }
      if (i + 1 < i1)
        for (const float* x : {q, dO, o}) prefetch_rows(x + (i + 1) * HD, HD);
      gemm(L, D, H, w.rows.data(), 1, w.Yp.data(), w.Dw, w.crow.data(), true);
    }
    _mm_sfence();  // the streamed rows of dq, visible to the threads that read them next
  });
  if (C > 1)
    parallel_for(M, 64, [&](int64_t r0, int64_t r1) {
      for (int64_t c = 1; c < C; ++c) {
        const int64_t a = std::max(r0, lo[c]), b = std::min(r1, hi[c] + 1);
        if (a >= b) continue;
        float* y = dkv + a * D;
        const float* x = part + (c - 1) * M * D + a * D;
        const int64_t len = (b - a) * D;
        int64_t e = 0;
        for (; e + 16 <= len; e += 16)
          _mm512_storeu_ps(y + e, _mm512_add_ps(_mm512_loadu_ps(y + e), _mm512_loadu_ps(x + e)));
        for (; e < len; ++e) y[e] += x[e];
      }
    });
  if (sink)
    for (int64_t c = 0; c < C; ++c)
      for (int h = 0; h < H; ++h) dsink[h] += sinkp[c * Hp + h];
}

}  // namespace trex::kern::cpu
