// SwiGLU dispatch: the AVX-512 kernel when the CPU has it, the AVX2 kernel on a CPU with
// AVX2 + FMA only, else the scalar reference.
#include "kernels/swiglu.h"
#include "core/cpu.h"
#include "core/error.h"
#include "kernels/cpu/swiglu_avx2.h"
#include "kernels/cpu/swiglu_avx512.h"
#include "kernels/ref/swiglu.h"

namespace trex::kern {

void swiglu_fwd(const float* gu, int64_t N, int64_t F, float limit, float* h) {
  TREX_CHECK(N >= 0 && F > 0, "swiglu_fwd: N=", N, " F=", F);
  if (N == 0) return;
  TREX_CHECK(gu && h, "swiglu_fwd: null pointer");
  if (cpu_isa() >= Isa::Avx512) return cpu::swiglu_fwd_avx512(gu, N, F, limit, h);
  if (cpu_isa() == Isa::Avx2) return cpu::swiglu_fwd_avx2(gu, N, F, limit, h);
  ref::swiglu_fwd<float>(gu, N, F, limit, h);
}

void swiglu_bwd(const float* dh, const float* gu, int64_t N, int64_t F, float limit, float* dgu) {
  TREX_CHECK(N >= 0 && F > 0, "swiglu_bwd: N=", N, " F=", F);
  if (N == 0) return;
  TREX_CHECK(dh && gu && dgu, "swiglu_bwd: null pointer");
  if (cpu_isa() >= Isa::Avx512) return cpu::swiglu_bwd_avx512(dh, gu, N, F, limit, dgu);
  if (cpu_isa() == Isa::Avx2) return cpu::swiglu_bwd_avx2(dh, gu, N, F, limit, dgu);
  ref::swiglu_bwd<float>(dh, gu, N, F, limit, dgu);
}

}  // namespace trex::kern
