// AVX2 + FMA lightning-indexer top-k (the AVX-512 kernel's design, kernels/cpu/indexer_avx512.cpp,
// resized for 8-float vectors and 16 vector registers). The keys of each batch row are packed into
// panels of 16 entries ([nw/16][dI][16], zero padded). Per query (dynamic schedule over all B*T
// queries), only the valid entries s < nv are scored, and only when nv exceeds min(topk, nw) (else
// every valid entry is selected and no score is needed) or scores_out is requested. Scoring is
// fused: for a panel of 16 entries a micro-kernel keeps up to 6 heads x 2 vectors of q.k
// accumulators in registers (12 of the 16 ymm; k loads shared by the heads, q broadcast), then
// adds w_h * relu(acc) into the two score vectors; no [T*nh, nw] product is materialized.
// Selection is exact: the scores become order-preserving 32-bit keys, the kk-th largest key is
// found bit by bit with vector counts (at most 32 branch-free passes over nv keys), and one
// ascending pass emits the indices, already sorted, the lower index winning ties.
#include "kernels/cpu/indexer_avx2.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <limits>

#include "core/parallel.h"
#include "kernels/cpu/indexer_panels.h"

namespace trex::kern::cpu {
namespace {

constexpr int64_t kPanel = 16;  // key entries per packed panel (2 vectors)
constexpr int kHeads = 6;       // heads per micro-kernel call at most

inline int64_t round_panel(int64_t n) { return (n + kPanel - 1) / kPanel * kPanel; }

// sc0, sc1 += sum_{i<H} w[i] * relu(q_i . kp[:, 0:16]) for heads q_i = qh + i dI;
// kp: [dI][16] panel.
template <int H>
void score_heads(const float* qh, int64_t dI, const float* w, const float* kp, __m256& sc0,
                 __m256& sc1) {
  __m256 a0[H], a1[H];
  const float* qr[H];
#pragma GCC unroll 8
  for (int i = 0; i < H; ++i) a0[i] = a1[i] = _mm256_setzero_ps(), qr[i] = qh + i * dI;
  for (int64_t d = 0; d < dI; ++d) {
    const __m256 k0 = _mm256_loadu_ps(kp + d * kPanel), k1 = _mm256_loadu_ps(kp + d * kPanel + 8);
#pragma GCC unroll 8
    for (int i = 0; i < H; ++i) {
      const __m256 qb = _mm256_broadcast_ss(qr[i] + d);
      a0[i] = _mm256_fmadd_ps(qb, k0, a0[i]);
      a1[i] = _mm256_fmadd_ps(qb, k1, a1[i]);
    }
  }
  const __m256 z = _mm256_setzero_ps();
#pragma GCC unroll 8
  for (int i = 0; i < H; ++i) {  // max(0, x) returns x when x is NaN: relu keeps NaN as torch does
    const __m256 wi = _mm256_broadcast_ss(w + i);
    sc0 = _mm256_fmadd_ps(wi, _mm256_max_ps(z, a0[i]), sc0);
    sc1 = _mm256_fmadd_ps(wi, _mm256_max_ps(z, a1[i]), sc1);
  }
}

using HeadsFn = void (*)(const float*, int64_t, const float*, const float*, __m256&, __m256&);
constexpr HeadsFn kHeadsFn[kHeads + 1] = {nullptr,        score_heads<1>, score_heads<2>,
                                          score_heads<3>, score_heads<4>, score_heads<5>,
                                          score_heads<6>};

// row[0 : round_panel(nv)] = scores of query qt (heads [nh][dI], weights w [nh]) against the
// first panels of kp (entries >= nv of the last panel are garbage).
void score_row(const float* qt, const float* w, const float* kp, int64_t nv, int nh, int dI,
               float scale, float* row) {
  const int64_t np = round_panel(nv) / kPanel;
  const int ng = (nh + kHeads - 1) / kHeads;  // near-equal head groups (16 = 6 + 5 + 5)
  const __m256 s = _mm256_set1_ps(scale);
  for (int64_t p = 0; p < np; ++p) {
    __m256 sc0 = _mm256_setzero_ps(), sc1 = sc0;
    const float* kpp = kp + p * dI * kPanel;
    for (int g = 0, h0 = 0; g < ng; ++g) {
      const int r = (nh - h0) / (ng - g);
      kHeadsFn[r](qt + static_cast<int64_t>(h0) * dI, dI, w + h0, kpp, sc0, sc1);
      h0 += r;
    }
    _mm256_storeu_ps(row + p * kPanel, _mm256_mul_ps(sc0, s));
    _mm256_storeu_ps(row + p * kPanel + 8, _mm256_mul_ps(sc1, s));
  }
}

// Order-preserving signed 32-bit keys of 8 scores: larger score -> larger key (signed compare);
// -0 maps as +0; every NaN maps to INT32_MAX (above +inf); no score maps to INT32_MIN (-inf gives
// INT32_MIN + 0x7FFFFF), which marks padding.
inline __m256i score_keys(__m256 x) {
  const __m256i u = _mm256_andnot_si256(
      _mm256_castps_si256(_mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_EQ_OQ)),
      _mm256_castps_si256(x));                                  // -0 -> +0
  const __m256i flip = _mm256_srli_epi32(_mm256_srai_epi32(u, 31), 1);  // negative: 0x7FFFFFFF
  const __m256i k = _mm256_xor_si256(u, flip);
  const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  return _mm256_blendv_epi8(k, _mm256_set1_epi32(INT32_MAX), _mm256_castps_si256(nan));
}

inline __m256i lanes_below(int64_t n) {  // lane i set iff i < n
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(n, 8))),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

inline uint32_t lane_bits(__m256i m) {  // bit i = lane i of a compare result
  return static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(m)));
}

inline int64_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// Number of keys >= c in nvec vectors of signed keys, for an unsigned-order threshold c > 0 (the
// key of c is c ^ 0x80000000 > INT32_MIN, so the padding INT32_MIN is never counted).
inline int64_t count_ge(const int32_t* keys, int64_t nvec, uint32_t c) {
  const __m256i cv = _mm256_set1_epi32(static_cast<int32_t>((c ^ 0x80000000u) - 1u));
  auto gt = [&](int64_t v) {  // -1 in each lane whose key counts
    return _mm256_cmpgt_epi32(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(keys + 8 * v)), cv);
  };
  __m256i a0 = _mm256_setzero_si256(), a1 = a0;
  int64_t v = 0;
  for (; v + 2 <= nvec; v += 2)
    a0 = _mm256_sub_epi32(a0, gt(v)), a1 = _mm256_sub_epi32(a1, gt(v + 1));
  if (v < nvec) a0 = _mm256_sub_epi32(a0, gt(v));
  return hsum_epi32(_mm256_add_epi32(a0, a1));
}

// Top kk (0 < kk < n) of row[0:n] -> sel[0:kk] ascending, the lower index first among equal
// scores. row (room for round_up(n, 8) floats) is overwritten with the keys. The kk-th largest key
// K (in unsigned order, key ^ 0x80000000) is found bit by bit (largest K with count(key >= K) >=
// kk, starting from the bits that the smallest and largest key share), then one ascending pass
// takes every key > K and the first kk - count(key > K) keys equal to K.
void topk_select(float* row, int64_t n, int64_t kk, int32_t* sel) {
  int32_t* keys = reinterpret_cast<int32_t*>(row);
  const int64_t nvec = (n + 7) / 8;
  __m256i kmin = _mm256_set1_epi32(INT32_MAX), kmax = _mm256_set1_epi32(INT32_MIN);
  for (int64_t v = 0; v < nvec; ++v) {
    const __m256i valid = lanes_below(n - 8 * v);
    const __m256i k = _mm256_blendv_epi8(_mm256_set1_epi32(INT32_MIN),
                                         score_keys(_mm256_loadu_ps(row + 8 * v)), valid);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(keys + 8 * v), k);
    kmin = _mm256_min_epi32(kmin, _mm256_blendv_epi8(_mm256_set1_epi32(INT32_MAX), k, valid));
    kmax = _mm256_max_epi32(kmax, k);
  }
  alignas(32) int32_t mn[8], mx[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(mn), kmin);
  _mm256_store_si256(reinterpret_cast<__m256i*>(mx), kmax);
  const uint32_t lo = static_cast<uint32_t>(*std::min_element(mn, mn + 8)) ^ 0x80000000u,
                 hi = static_cast<uint32_t>(*std::max_element(mx, mx + 8)) ^ 0x80000000u;
  uint32_t thr = lo;
  if (lo != hi) {
    const int top = 31 - __builtin_clz(lo ^ hi);  // highest differing bit
    thr = top == 31 ? 0u : lo & ~((2u << top) - 1u);
    for (int bit = top; bit >= 0; --bit) {
      const uint32_t cand = thr | (1u << bit);
      if (count_ge(keys, nvec, cand) >= kk) thr = cand;
    }
  }
  const int64_t gt = thr == 0xFFFFFFFFu ? 0 : count_ge(keys, nvec, thr + 1u);
  int64_t need = kk - gt, j = 0;
  const __m256i tv = _mm256_set1_epi32(static_cast<int32_t>(thr ^ 0x80000000u));
  for (int64_t v = 0; v < nvec; ++v) {
    const __m256i k = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(keys + 8 * v));
    // padding keys (INT32_MIN) are below every real key, and thr is a real key: never taken
    uint32_t eq = lane_bits(_mm256_cmpeq_epi32(k, tv));
    const uint32_t take_gt = lane_bits(_mm256_cmpgt_epi32(k, tv));
    int pe = __builtin_popcount(eq);
    while (pe > need) eq &= ~(0x80000000u >> __builtin_clz(eq)), --pe;  // drop the highest indices
    need -= pe;
    for (uint32_t take = take_gt | eq; take; take &= take - 1)
      sel[j++] = static_cast<int32_t>(8 * v + __builtin_ctz(take));
  }
}

}  // namespace

void indexer_topk_avx2(const IndexerShape& sh, const float* q, const float* k, const float* wts,
                       const int32_t* pos, int32_t* cnt, int32_t* sel, float* scores_out,
                       float* workspace) {
  const int64_t nw = sh.nw, nwp = round_panel(nw), npan = nwp / kPanel, dI = sh.dI;
  const int64_t kk = std::min<int64_t>(sh.topk, nw);
  float* kp = workspace;                      // [B][npan][dI][16]
  float* rows = workspace + sh.B * nwp * dI;  // [threads][nwp]
  pack_key_panels<kPanel>(sh.B, nw, dI, dI, k, kp, [](const float* src, int64_t d) { return src[d]; });
  const int64_t nq = sh.B * sh.T;
  const int nt = omp_in_parallel() ? 1 : std::min(num_threads(), kIndexerMaxThreads);
#pragma omp parallel num_threads(nt)
  {
    float* row = rows + omp_get_thread_num() * nwp;
#pragma omp for schedule(dynamic, 4)
    for (int64_t bt = 0; bt < nq; ++bt) {
      const int64_t b = bt / sh.T, nv = indexer_valid_count(pos[bt], sh.m, nw);
      int32_t* st = sel + bt * sh.topk;
      float* so = scores_out ? scores_out + bt * nw : nullptr;
      const bool pick = nv > kk && kk > 0;  // a real choice among the valid entries
      if (pick || so)
        score_row(q + bt * sh.nh * dI, wts + bt * sh.nh, kp + b * npan * dI * kPanel, nv, sh.nh,
                  sh.dI, sh.softmax_scale, row);
      if (so) {
        std::copy(row, row + nv, so);
        std::fill(so + nv, so + nw, -std::numeric_limits<float>::infinity());
      }
      const int64_t c = std::min(nv, kk);
      if (pick) {
        topk_select(row, nv, kk, st);
      } else {
        for (int64_t j = 0; j < c; ++j) st[j] = static_cast<int32_t>(j);
      }
      for (int64_t j = c; j < sh.topk; ++j) st[j] = -1;
      cnt[bt] = static_cast<int32_t>(c);
    }
  }
}

}  // namespace trex::kern::cpu
