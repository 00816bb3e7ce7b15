// Dispatch of causal attention (see attention.h): the AVX-512 kernel, else the GEMM-based one
// (oneDNN, any x86-64), else (TREX_ISA=ref) the scalar reference.
#include "kernels/attention.h"

#include "core/cpu.h"
#include "core/error.h"
#include "kernels/cpu/attention_avx512.h"
#include "kernels/cpu/attention_blas.h"
#include "kernels/ref/attention.h"

namespace trex::kern {

static void check_shape(const AttnShape& sh) {
  TREX_CHECK(sh.B > 0 && sh.T > 0 && sh.H > 0 && sh.Dqk > 0 && sh.Dv > 0,
             "attention: bad shape B=", sh.B, " T=", sh.T, " H=", sh.H, " Dqk=", sh.Dqk,
             " Dv=", sh.Dv);
  TREX_CHECK(sh.window >= 0, "attention: window must be >= 0, got ", sh.window);
}

void attention_fwd(const AttnShape& sh, const float* q, const float* k, const float* v, float* o,
                   float* lse, const int32_t* seg) {
  check_shape(sh);
  if (cpu_isa() >= Isa::Avx512)
    cpu::attention_fwd_avx512(sh, q, k, v, o, lse, seg);
  else if (!isa_ref_forced())
    cpu::attention_fwd_blas(sh, q, k, v, o, lse, seg);
  else
    ref::attention_fwd<float>(sh, q, k, v, o, lse, seg);
}

void attention_bwd(const AttnShape& sh, const float* q, const float* k, const float* v,
                   const float* o, const float* lse, const float* dO, float* dq, float* dk,
                   float* dv, const int32_t* seg) {
  check_shape(sh);
  if (cpu_isa() >= Isa::Avx512)
    cpu::attention_bwd_avx512(sh, q, k, v, o, lse, dO, dq, dk, dv, seg);
  else if (!isa_ref_forced())
    cpu::attention_bwd_blas(sh, q, k, v, o, lse, dO, dq, dk, dv, seg);
  else
    ref::attention_bwd<float>(sh, q, k, v, o, lse, dO, dq, dk, dv, seg);
}

}  // namespace trex::kern
