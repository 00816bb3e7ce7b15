// AdamW and sum-of-squares dispatch: AVX-512 kernels when the CPU has them, else the reference.
#include "kernels/adamw.h"
#include "core/cpu.h"
#include "core/error.h"
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
  ref::adamw_step<float>(hp, p, g, m, v, n, p_bf16);
}

double sum_squares(const float* x, int64_t n) {
  TREX_CHECK(n >= 0, "sum_squares: n=", n);
  if (n == 0) return 0.0;
  TREX_CHECK(x, "sum_squares: null pointer");
  if (cpu_isa() >= Isa::Avx512) return cpu::sum_squares_avx512(x, n);
  return ref::sum_squares<float>(x, n);
}

}  // namespace trex::kern
