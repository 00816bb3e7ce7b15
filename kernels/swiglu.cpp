// SwiGLU dispatch: the AVX-512 kernel when the CPU has it, the AVX2 kernel on a CPU with
// AVX2 + FMA only, else the scalar reference.
#include "kernels/swiglu.h"
#include <algorithm>
#include <vector>
#include "core/cpu.h"
#include "core/error.h"
#include "kernels/cpu/swiglu_avx2.h"
#include "kernels/cpu/swiglu_avx512.h"
#include "kernels/ref/swiglu.h"
#include "kernels/rows.h"

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

void swiglu_bwd_bf16(const float* dh, const float* gu, int64_t N, int64_t F, float limit, bf16* dgu) {
  TREX_CHECK(N >= 0 && F > 0, "swiglu_bwd_bf16: N=", N, " F=", F);
  if (N == 0) return;
  TREX_CHECK(dh && gu && dgu, "swiglu_bwd_bf16: null pointer");
  if (cpu_isa() >= Isa::Avx512) return cpu::swiglu_bwd_bf16_avx512(dh, gu, N, F, limit, dgu);
  // Elsewhere blocks of rows through the f32 kernel and the rounding of kernels/rows.h.
  const int64_t rows = std::max<int64_t>(1, std::min<int64_t>(N, (int64_t{1} << 20) / (2 * F)));
  std::vector<float> blk(static_cast<size_t>(rows * 2 * F));
  for (int64_t n0 = 0; n0 < N; n0 += rows) {
    const int64_t nb = std::min(rows, N - n0);
    swiglu_bwd(dh + n0 * F, gu + n0 * 2 * F, nb, F, limit, blk.data());
    to_bf16(blk.data(), nb * 2 * F, dgu + n0 * 2 * F);
  }
}

}  // namespace trex::kern
