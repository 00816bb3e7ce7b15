// Dispatch of causal attention (see attention.h): with AttnShape::prec == BF16 on a CPU whose
// AVX512_BF16 dot product outruns its FMAs (kernels/peak.h bf16_dot_fast) the bf16 kernel, else
// the AVX-512 kernel, else the AVX2 + FMA one, else the GEMM-based one (oneDNN, any x86-64), else (TREX_ISA=ref) the scalar reference.
// For A/B measurements: TREX_ATTN=blas picks the GEMM-based kernel on a CPU below AVX-512;
// TREX_ATTN=f32 keeps the f32 kernels in a bf16 run. Query rows Tq != T (and acc_dkv): the flash
// kernels only (attention_supports_rows).
#include "kernels/attention.h"

#include <cstdlib>
#include <cstring>

#include "core/cpu.h"
#include "core/error.h"
#include "kernels/cpu/attention_avx2.h"
#include "kernels/cpu/attention_avx512.h"
#include "kernels/cpu/attention_avx512bf16.h"
#include "kernels/cpu/attention_blas.h"
#include "kernels/peak.h"
#include "kernels/ref/attention.h"

namespace trex::kern {

namespace {

enum class AttnImpl { Ref, Blas, Avx2, Avx512 };

AttnImpl attn_impl() {
  static const AttnImpl impl = [] {
    if (cpu_isa() >= Isa::Avx512) return AttnImpl::Avx512;
    if (isa_ref_forced()) return AttnImpl::Ref;
    const char* e = std::getenv("TREX_ATTN");
    if (cpu_isa() == Isa::Avx2 && !(e && !std::strcmp(e, "blas"))) return AttnImpl::Avx2;
    return AttnImpl::Blas;
  }();
  return impl;
}

bool attn_bf16(const AttnShape& sh) { return attention_bf16_kernels(sh.prec); }

}  // namespace

bool attention_bf16_kernels(Prec prec) {
  if (prec != Prec::BF16 || cpu_isa() < Isa::Avx512Bf16 || !bf16_dot_fast()) return false;
  const char* e = std::getenv("TREX_ATTN");
  return !(e && !std::strcmp(e, "f32"));
}

bool attention_supports_rows(const AttnShape& sh) {
  return attn_bf16(sh) || attn_impl() == AttnImpl::Avx512 || attn_impl() == AttnImpl::Avx2;
}

static void check_shape(const AttnShape& sh) {
  TREX_CHECK(sh.B > 0 && sh.T > 0 && sh.H > 0 && sh.Dqk > 0 && sh.Dv > 0,
             "attention: bad shape B=", sh.B, " T=", sh.T, " H=", sh.H, " Dqk=", sh.Dqk,
             " Dv=", sh.Dv);
  TREX_CHECK(sh.window >= 0, "attention: window must be >= 0, got ", sh.window);
  TREX_CHECK(sh.Tq >= 0 && sh.Tq <= sh.T, "attention: query rows Tq=", sh.Tq, " outside [0, T=", sh.T, "]");
  TREX_CHECK((sh.rows() == sh.T && !sh.acc_dkv) || attention_supports_rows(sh),
             "attention: Tq != T or acc_dkv needs a flash kernel (not the GEMM-based or reference one)");
}

void attention_fwd(const AttnShape& sh, const float* q, const float* k, const float* v, float* o,
                   float* lse, const int32_t* seg) {
  check_shape(sh);
  if (attn_bf16(sh)) return cpu::attention_fwd_avx512bf16(sh, q, k, v, o, lse, seg);
  switch (attn_impl()) {
    case AttnImpl::Avx512: return cpu::attention_fwd_avx512(sh, q, k, v, o, lse, seg);
    case AttnImpl::Avx2: return cpu::attention_fwd_avx2(sh, q, k, v, o, lse, seg);
    case AttnImpl::Blas: return cpu::attention_fwd_blas(sh, q, k, v, o, lse, seg);
    case AttnImpl::Ref: return ref::attention_fwd<float>(sh, q, k, v, o, lse, seg);
  }
}

void attention_bwd(const AttnShape& sh, const float* q, const float* k, const float* v,
                   const float* o, const float* lse, const float* dO, float* dq, float* dk,
                   float* dv, const int32_t* seg) {
  check_shape(sh);
  if (attn_bf16(sh)) return cpu::attention_bwd_avx512bf16(sh, q, k, v, o, lse, dO, dq, dk, dv, seg);
  switch (attn_impl()) {
    case AttnImpl::Avx512: return cpu::attention_bwd_avx512(sh, q, k, v, o, lse, dO, dq, dk, dv, seg);
    case AttnImpl::Avx2: return cpu::attention_bwd_avx2(sh, q, k, v, o, lse, dO, dq, dk, dv, seg);
    case AttnImpl::Blas: return cpu::attention_bwd_blas(sh, q, k, v, o, lse, dO, dq, dk, dv, seg);
    case AttnImpl::Ref: return ref::attention_bwd<float>(sh, q, k, v, o, lse, dO, dq, dk, dv, seg);
  }
}

}  // namespace trex::kern
