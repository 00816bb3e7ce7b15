// AVX2 AdamW and sum of squares; both give the bits of the reference fallback in
// kernels/adamw.cpp.
// AdamW: elementwise, 8 floats a vector, threads over contiguous ranges; the last partial vector
// goes through zero-padded 8-float stack copies. The step's f32 scalars come from the caller (see
// the header). Every operation is the reference's, in its order, each rounded to f32: sqrt and
// division are correctly rounded, and every product is kept out of an FMA (GCC's default
// -ffp-contract=fast would fuse a multiply with the add after it; the reference, built for
// baseline x86-64, never does). Where two different NaNs meet (a NaN p plus a NaN update), x86
// returns the first source operand, which the compiler picks for a commutative add, here and in
// the reference alike; GCC 12 picks the same one (tests/ops/adamw_ops.cpp checks NaN bits too).
// The bf16 copy rounds to nearest even, NaN -> quiet NaN, as f32_to_bf16 in core/dtype.h.
// Sum of squares: blocks of kSumSquaresBlock elements, each summed in element order in double
// (x^2 is exact in double, so mul + add and FMA give the reference's s += x*x alike), the block
// sums added in block order. A sequential sum cannot be split inside a block, so the vector
// lanes run different blocks: 4 blocks side by side, 4 floats of each loaded and transposed so
// that one vector holds element j of the 4 blocks; two such chains (8 blocks) hide the add
// latency. The last, partial block runs scalar (one chain; a tensor under 2^16 elements gets no
// speed-up). The result does not depend on the thread count.
#include "kernels/cpu/adamw_avx2.h"

#include <immintrin.h>

#include <algorithm>

#include "core/parallel.h"

namespace trex::kern::cpu {
namespace {

constexpr int64_t kBlock = kSumSquaresBlock;
constexpr int64_t kRun = 8;       // full blocks per sum_squares task (two chains of 4 lanes)
constexpr int64_t kGroup = 4096;  // block sums kept at a time (32 KiB of stack; a multiple of kRun)

// a * b rounded to f32, never fused into a following add: the empty asm hides the product from
// the optimizer, so contraction cannot turn mul + add into an FMA.
inline __m256 mul(__m256 a, __m256 b) {
  __m256 r = _mm256_mul_ps(a, b);
  asm("" : "+x"(r));
  return r;
}

// 8 f32 -> 8 bf16, round to nearest even, NaN -> quiet NaN (sign and upper payload kept).
inline __m128i to_bf16(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  // |u| and 0x7f800000 are non-negative as int32, so the signed compare is the unsigned one.
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  const __m256i hi = _mm256_srli_epi32(u, 16);
  const __m256i bias = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(hi, _mm256_set1_epi32(1)));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
  r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
  // Every lane is in [0, 0xffff]: the unsigned saturating pack keeps it.
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

struct Vecs {
  __m256 decay, w, w1, b2, c2, ns, bc2, eps, gs;
  explicit Vecs(const ref::AdamWScalars<float>& s)
      : decay(_mm256_set1_ps(s.decay)), w(_mm256_set1_ps(s.lerp_w)), w1(_mm256_set1_ps(1.0f - s.lerp_w)),
        b2(_mm256_set1_ps(s.b2)), c2(_mm256_set1_ps(s.c2)), ns(_mm256_set1_ps(s.neg_step)),
        bc2(_mm256_set1_ps(s.bc2_sqrt)), eps(_mm256_set1_ps(s.eps)), gs(_mm256_set1_ps(s.gscale)) {}
};

// One vector of the reference's loop body: p, g, m, v: [8] -> p, m, v: [8] (in place), pb: [8] or null.
template <bool kLerpSmall>
inline void step8(const Vecs& c, float* p, const float* g, float* m, float* v, bf16* pb) {
  const __m256 gi = mul(_mm256_loadu_ps(g), c.gs);
  const __m256 pi = mul(_mm256_loadu_ps(p), c.decay);
  const __m256 mo = _mm256_loadu_ps(m);
  const __m256 diff = _mm256_sub_ps(gi, mo);
  // torch's lerp: m + w*(g - m) for |w| < 0.5, else g - (g - m)*(1 - w)
  const __m256 mi = kLerpSmall ? _mm256_add_ps(mo, mul(c.w, diff)) : _mm256_sub_ps(gi, mul(diff, c.w1));
  const __m256 vi = _mm256_add_ps(mul(_mm256_loadu_ps(v), c.b2), mul(mul(c.c2, gi), gi));
  const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), c.bc2), c.eps);
  const __m256 pn = _mm256_add_ps(pi, _mm256_div_ps(mul(c.ns, mi), denom));
  _mm256_storeu_ps(p, pn);
  _mm256_storeu_ps(m, mi);
  _mm256_storeu_ps(v, vi);
  if (pb) _mm_storeu_si128(reinterpret_cast<__m128i*>(pb), to_bf16(pn));
}

// Elements [b, e): full vectors in place, the rest through zero-padded stack copies.
template <bool kLerpSmall>
void adamw_range(const Vecs& c, float* p, const float* g, float* m, float* v, int64_t b, int64_t e, bf16* pb) {
  int64_t i = b;
  for (; i + 8 <= e; i += 8) step8<kLerpSmall>(c, p + i, g + i, m + i, v + i, pb ? pb + i : nullptr);
  if (i == e) return;
  const int64_t r = e - i;
  float tp[8] = {}, tg[8] = {}, tm[8] = {}, tv[8] = {};
  bf16 tb[8];
  std::copy(p + i, p + e, tp);
  std::copy(g + i, g + e, tg);
  std::copy(m + i, m + e, tm);
  std::copy(v + i, v + e, tv);
  step8<kLerpSmall>(c, tp, tg, tm, tv, pb ? tb : nullptr);
  std::copy(tp, tp + r, p + i);
  std::copy(tm, tm + r, m + i);
  std::copy(tv, tv + r, v + i);
  if (pb) std::copy(tb, tb + r, pb + i);
}

// One chain: 4 blocks x[0..3] side by side; acc lane k += x[k][j]^2 for j = 0, 1, ... in order.
inline void chain4(const float* const* x, int64_t j, __m256d& acc) {
  __m128 r0 = _mm_loadu_ps(x[0] + j), r1 = _mm_loadu_ps(x[1] + j), r2 = _mm_loadu_ps(x[2] + j),
         r3 = _mm_loadu_ps(x[3] + j);
  _MM_TRANSPOSE4_PS(r0, r1, r2, r3);  // r0 = element j of the 4 blocks, r1 = element j+1, ...
  for (__m128 r : {r0, r1, r2, r3}) {
    const __m256d d = _mm256_cvtps_pd(r);
    acc = _mm256_add_pd(acc, _mm256_mul_pd(d, d));  // exact product; FMA would give the same bits
  }
}

// k in [1, kRun] full blocks from x: out[i] = sum of squares of block i, in element order.
void run_blocks(const float* x, int64_t k, double* out) {
  const float* ptr[kRun];
  for (int64_t i = 0; i < kRun; ++i) ptr[i] = x + std::min(i, k - 1) * kBlock;  // spare lanes repeat a block
  __m256d a0 = _mm256_setzero_pd(), a1 = a0;
  if (k <= 4) {
    for (int64_t j = 0; j < kBlock; j += 4) chain4(ptr, j, a0);
  } else {
    for (int64_t j = 0; j < kBlock; j += 4) {
      chain4(ptr, j, a0);
      chain4(ptr + 4, j, a1);
    }
  }
  alignas(32) double lanes[8];
  _mm256_store_pd(lanes, a0);
  _mm256_store_pd(lanes + 4, a1);
  std::copy(lanes, lanes + k, out);
}

// x: [len] -> sum x^2 in element order (the reference).
double seq_ss(const float* x, int64_t len) {
  double s = 0;
  for (int64_t j = 0; j < len; ++j) s += static_cast<double>(x[j]) * static_cast<double>(x[j]);
  return s;
}

}  // namespace

void adamw_step_avx2(const ref::AdamWScalars<float>& s, float* p, const float* g, float* m, float* v,
                     int64_t n, bf16* p_bf16) {
  const Vecs c(s);
  parallel_for(n, 32768, [&](int64_t b, int64_t e) {
    if (s.lerp_small) adamw_range<true>(c, p, g, m, v, b, e, p_bf16);
    else adamw_range<false>(c, p, g, m, v, b, e, p_bf16);
  });
}

double sum_squares_avx2(const float* x, int64_t n) {
  const int64_t nb = (n + kBlock - 1) / kBlock, nfull = n / kBlock;
  double part[kGroup];
  double total = 0.0;
  for (int64_t g0 = 0; g0 < nb; g0 += kGroup) {
    const int64_t gn = std::min(kGroup, nb - g0);
    const int64_t gfull = std::min(gn, nfull - g0);  // full blocks in this group
    const int64_t nrun = (gfull + kRun - 1) / kRun;
    // Tasks: runs of up to kRun full blocks, then the partial block (if in this group) alone.
    parallel_dynamic(nrun + (gn > gfull), [&](int64_t t) {
      if (t < nrun) {
        const int64_t b = t * kRun;
        run_blocks(x + (g0 + b) * kBlock, std::min(kRun, gfull - b), part + b);
      } else {
        part[gfull] = seq_ss(x + (g0 + gfull) * kBlock, n - (g0 + gfull) * kBlock);
      }
    });
    for (int64_t i = 0; i < gn; ++i) total += part[i];
  }
  return total;
}

}  // namespace trex::kern::cpu
