// AVX-512 lightning-indexer top-k. The keys of each batch row are packed into panels of 32
// entries ([nw/32][dI][32], zero padded). Per query (dynamic schedule over all B*T queries), only
// the valid entries s < nv are scored, and only when nv exceeds min(topk, nw) (else every valid
// entry is selected and no score is needed) or scores_out is requested. Scoring is fused: for a
// panel of 32 entries a micro-kernel (kernels/cpu/indexer_score_avx512.h, shared with the bf16
// scores) keeps 8 heads x 2 vectors of q.k accumulators in registers
// (k loads shared by the 8 heads, q broadcast), then adds w_h * relu(acc) into the two score
// vectors; no [T*nh, nw] product is materialized. Selection is exact and vectorized: the scores
// become order-preserving 32-bit keys, the kk-th largest key is found bit by bit with vector
// counts (at most 32 passes over nv keys, branch-free), and one ascending pass emits the indices
// (compress-store), already sorted, the lower index winning ties.
// GCC 12 reports false (maybe-)uninitialized warnings inside the AVX-512 intrinsic headers.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include "kernels/cpu/indexer_avx512.h"
#include <immintrin.h>
#include <omp.h>
#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>
#include "core/aligned.h"
#include "core/parallel.h"
#include "kernels/cpu/indexer_avx512bf16.h"
#include "kernels/cpu/indexer_score_avx512.h"
#include "kernels/cpu/simd_avx512.h"

namespace trex::kern::cpu {
namespace {

using avx512::tail_mask;

constexpr int64_t kPanel = kIndexerPanel;  // key entries per packed panel (2 vectors)

inline int64_t round_panel(int64_t n) { return (n + kPanel - 1) / kPanel * kPanel; }

// The f32 operands of the scoring micro-kernel (kernels/cpu/indexer_score_avx512.h): one
// dimension a word, one FMA a word.
struct StepF32 {
  using Word = float;
  using Vec = __m512;
  static Vec load(const float* p) { return _mm512_loadu_ps(p); }
  static Vec broadcast(float q) { return _mm512_set1_ps(q); }
  static __m512 madd(__m512 acc, Vec q, Vec k) { return _mm512_fmadd_ps(q, k, acc); }
};

// Order-preserving 32-bit keys of 16 scores: larger score -> larger key; -0 maps as +0; every
// NaN maps to the largest key (above +inf).
inline __m512i score_keys(__m512 x) {
  const __m512 z = _mm512_setzero_ps();
  const __m512i u = _mm512_castps_si512(x);
  __m512i k = _mm512_or_si512(u, _mm512_set1_epi32(INT32_MIN));  // x >= +0: set the sign bit
  k = _mm512_mask_mov_epi32(k, _mm512_cmp_ps_mask(x, z, _CMP_LT_OQ), _mm512_xor_si512(u, _mm512_set1_epi32(-1)));
  k = _mm512_mask_mov_epi32(k, _mm512_cmp_ps_mask(x, z, _CMP_EQ_OQ), _mm512_set1_epi32(INT32_MIN));
  return _mm512_mask_mov_epi32(k, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_set1_epi32(-1));
}

// Number of keys >= c (unsigned, c > 0) in nvec vectors; the padding keys past n are 0 and real
// keys are never 0 (-inf maps to 0x007FFFFF), so the padding is never counted.
inline int64_t count_ge(const uint32_t* keys, int64_t nvec, uint32_t c) {
  const __m512i cv = _mm512_set1_epi32(static_cast<int>(c)), one = _mm512_set1_epi32(1);
  __m512i a0 = _mm512_setzero_si512(), a1 = a0;
  int64_t v = 0;
  for (; v + 2 <= nvec; v += 2) {
    a0 = _mm512_mask_add_epi32(a0, _mm512_cmpge_epu32_mask(_mm512_loadu_si512(keys + 16 * v), cv), a0, one);
    a1 = _mm512_mask_add_epi32(a1, _mm512_cmpge_epu32_mask(_mm512_loadu_si512(keys + 16 * v + 16), cv), a1, one);
  }
  if (v < nvec) a0 = _mm512_mask_add_epi32(a0, _mm512_cmpge_epu32_mask(_mm512_loadu_si512(keys + 16 * v), cv), a0, one);
  return _mm512_reduce_add_epi32(_mm512_add_epi32(a0, a1));
}

// Top kk (0 < kk < n) of row[0:n] -> sel[0:kk] ascending, the lower index first among equal
// scores. row (room for round_up(n, 16) floats) is overwritten with the keys. The kk-th
// largest key K is found bit by bit (largest K with count(key >= K) >= kk, starting from the bits
// that the smallest and largest key share), then one ascending pass takes every key > K and the
// first kk - count(key > K) keys equal to K.
void topk_select(float* row, int64_t n, int64_t kk, int32_t* sel) {
  uint32_t* keys = reinterpret_cast<uint32_t*>(row);
  const int64_t nvec = (n + 15) / 16;
  __m512i kmin = _mm512_set1_epi32(-1), kmax = _mm512_setzero_si512();
  for (int64_t v = 0; v < nvec; ++v) {
    const __mmask16 mk = tail_mask(n - 16 * v);
    const __m512i k = _mm512_maskz_mov_epi32(mk, score_keys(_mm512_loadu_ps(row + 16 * v)));
    _mm512_storeu_si512(keys + 16 * v, k);
    kmin = _mm512_mask_min_epu32(kmin, mk, kmin, k);
    kmax = _mm512_max_epu32(kmax, k);
  }
  const uint32_t lo = _mm512_reduce_min_epu32(kmin), hi = _mm512_reduce_max_epu32(kmax);
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
  const __m512i tv = _mm512_set1_epi32(static_cast<int>(thr));
  __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t v = 0; v < nvec; ++v, idx = _mm512_add_epi32(idx, _mm512_set1_epi32(16))) {
    const __mmask16 mk = tail_mask(n - 16 * v);
    const __m512i k = _mm512_loadu_si512(keys + 16 * v);
    uint32_t eq = _mm512_mask_cmpeq_epu32_mask(mk, k, tv);
    const uint32_t take_gt = _mm512_mask_cmpgt_epu32_mask(mk, k, tv);
    int pe = __builtin_popcount(eq);
    while (pe > need) eq &= ~(0x80000000u >> __builtin_clz(eq)), --pe;  // drop the highest indices
    need -= pe;
    const __mmask16 take = static_cast<__mmask16>(take_gt | eq);
    _mm512_mask_compressstoreu_epi32(sel + j, take, idx);
    j += __builtin_popcount(take);
  }
}

}  // namespace

void indexer_topk_avx512(const IndexerShape& sh, const float* q, const float* k, const float* wts,
                         const int32_t* pos, int32_t* cnt, int32_t* sel, float* scores_out, float* workspace,
                         bool bf16) {
  const int64_t nw = sh.nw, nwp = round_panel(nw), npan = nwp / kPanel, dI = sh.dI;
  const int64_t kk = std::min<int64_t>(sh.topk, nw);
  float* kp = workspace;                      // [B][npan][dI][32]
  // bf16: [B][npan][pairs][32] words in the same place ((dI + 1) / 2 <= dI words an entry)
  uint32_t* kp16 = reinterpret_cast<uint32_t*>(workspace);
  float* rows = workspace + sh.B * nwp * dI;  // [threads][nwp]
  if (bf16) indexer_pack_keys_bf16(sh.B, nw, sh.dI, k, kp16);
  else pack_key_panels<kIndexerPanel>(sh.B, nw, sh.dI, sh.dI, k, kp, [](const float* src, int64_t d) { return src[d]; });
  const int64_t nq = sh.B * sh.T;
  const int nt = omp_in_parallel() ? 1 : std::min(num_threads(), kIndexerMaxThreads);
#pragma omp parallel num_threads(nt)
  {
    float* row = rows + omp_get_thread_num() * nwp;
    const int64_t P = indexer_pairs(sh.dI);
    aligned_vector<uint32_t> qp(bf16 ? sh.nh * P : 0);  // the query's bf16 pair words
#pragma omp for schedule(dynamic, 4)
    for (int64_t bt = 0; bt < nq; ++bt) {
      const int64_t b = bt / sh.T, nv = indexer_valid_count(pos[bt], sh.m, nw);
      int32_t* st = sel + bt * sh.topk;
      float* so = scores_out ? scores_out + bt * nw : nullptr;
      const bool pick = nv > kk && kk > 0;  // a real choice among the valid entries
      if ((pick || so) && bf16) {
        indexer_pack_query_bf16(sh.nh, sh.dI, q + bt * sh.nh * dI, qp.data());
        indexer_score_row_bf16(qp.data(), wts + bt * sh.nh, kp16 + b * npan * P * kPanel, nv, sh.nh, sh.dI,
                               sh.softmax_scale, row);
      } else if (pick || so) {
        indexer_score::score_row<StepF32>(q + bt * sh.nh * dI, wts + bt * sh.nh, kp + b * npan * dI * kPanel, nv,
                                          sh.nh, sh.dI, sh.softmax_scale, row);
      }
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
