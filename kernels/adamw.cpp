// AdamW and sum-of-squares dispatch: AVX-512 kernels when the CPU has them, AVX2 kernels on a CPU
// with AVX2 only (bitwise the reference fallback's results), else the reference (threaded over
// fixed ranges).
#include "kernels/adamw.h"

#include <algorithm>
#include <vector>
#include "core/cpu.h"
#include "core/error.h"
#include "core/parallel.h"
#include "kernels/cpu/adamw_avx2.h"
#include "kernels/cpu/adamw_avx512.h"
#include "kernels/ref/adamw.h"

namespace trex::kern {

void adamw_step(const AdamWParams& hp, float* p, const float* g, float* m, float* v, int64_t n, bf16* p_bf16) {
  TREX_CHECK(n >= 0, "adamw_step: n=", n);
  TREX_CHECK(hp.step >= 1, "adamw_step: step is 1-based, got ", hp.step);
  TREX_CHECK(hp.beta1 >= 0 && hp.beta1 < 1 && hp.beta2 >= 0 && hp.beta2 < 1, "adamw_step: betas ", hp.beta1,
             ", ", hp.beta2, " must lie in [0, 1)");
  TREX_CHECK(hp.lr >= 0 && hp.eps >= 0 && hp.weight_decay >= 0, "adamw_step: lr=", hp.lr, " eps=", hp.eps,
             " weight_decay=", hp.weight_decay);
  if (n == 0) return;
  TREX_CHECK(p && g && m && v, "adamw_step: null pointer");
  if (cpu_isa() >= Isa::Avx512) return cpu::adamw_step_avx512(hp, p, g, m, v, n, p_bf16);
  // The scalars are formed here, in baseline code, as the reference forms them (see adamw_avx2.h).
  if (cpu_isa() == Isa::Avx2) return cpu::adamw_step_avx2(ref::AdamWScalars<float>(hp), p, g, m, v, n, p_bf16);
  // Without AVX2: the reference, threaded over fixed element ranges (the update is
  // elementwise, so the result is the reference's, bit for bit, at any thread count).
  parallel_for(n, 1 << 15, [&](int64_t b, int64_t e) {
    ref::adamw_step<float>(hp, p + b, g + b, m + b, v + b, e - b, p_bf16 ? p_bf16 + b : nullptr);
  });
}

double sum_squares(const float* x, int64_t n) {
  TREX_CHECK(n >= 0, "sum_squares: n=", n);
  if (n == 0) return 0.0;
  TREX_CHECK(x, "sum_squares: null pointer");
  if (cpu_isa() >= Isa::Avx512) return cpu::sum_squares_avx512(x, n);
  if (cpu_isa() == Isa::Avx2) return cpu::sum_squares_avx2(x, n);
  // Without AVX2: fixed blocks summed in double by the reference, then added in block order
  // (deterministic, independent of the thread count; the AVX2 kernel gives the same bits).
  constexpr int64_t kBlock = cpu::kSumSquaresBlock;
  const int64_t nb = (n + kBlock - 1) / kBlock;
  std::vector<double> part(nb);
  parallel_for(nb, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) part[b] = ref::sum_squares<float>(x + b * kBlock, std::min(kBlock, n - b * kBlock));
  });
  double ss = 0;
  for (double v : part) ss += v;
  return ss;
}

double sum_squares_segments(const float* base, const int64_t* offsets, const int64_t* sizes, int n) {
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += sum_squares(base + offsets[i], sizes[i]);
  return ss;
}

}  // namespace trex::kern
