// RMSNorm dispatch: the AVX-512 kernel when the CPU has it, the AVX2 kernel on a CPU with
// AVX2 + FMA only, else the scalar reference.
#include "kernels/rmsnorm.h"
#include "core/cpu.h"
#include "core/error.h"
#include "kernels/cpu/rmsnorm_avx2.h"
#include "kernels/cpu/rmsnorm_avx512.h"
#include "kernels/ref/rmsnorm.h"

namespace trex::kern {

void rmsnorm_fwd(const float* x, int64_t N, int64_t d, const float* w, float eps, float* y, float* rstd) {
  TREX_CHECK(N >= 0 && d > 0, "rmsnorm_fwd: N=", N, " d=", d);
  TREX_CHECK(eps >= 0, "rmsnorm_fwd: eps=", eps);
  if (N == 0) return;
  TREX_CHECK(x && w && y, "rmsnorm_fwd: null pointer");
  if (cpu_isa() >= Isa::Avx512) return cpu::rmsnorm_fwd_avx512(x, N, d, w, eps, y, rstd);
  if (cpu_isa() == Isa::Avx2) return cpu::rmsnorm_fwd_avx2(x, N, d, w, eps, y, rstd);
  ref::rmsnorm_fwd<float>(x, N, d, w, eps, y, rstd);
}

void rmsnorm_bwd(const float* dy, const float* x, int64_t N, int64_t d, const float* w, const float* rstd,
                 float* dx, float* dw) {
  TREX_CHECK(N >= 0 && d > 0, "rmsnorm_bwd: N=", N, " d=", d);
  if (N == 0) return;
  TREX_CHECK(dy && x && w && rstd && dx && dw, "rmsnorm_bwd: null pointer");
  if (cpu_isa() >= Isa::Avx512) return cpu::rmsnorm_bwd_avx512(dy, x, N, d, w, rstd, dx, dw);
  if (cpu_isa() == Isa::Avx2) return cpu::rmsnorm_bwd_avx2(dy, x, N, d, w, rstd, dx, dw);
  ref::rmsnorm_bwd<float>(dy, x, N, d, w, rstd, dx, dw);
}

}  // namespace trex::kern
