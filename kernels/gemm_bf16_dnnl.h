// bf16 x bf16 -> f32 GEMM on the CPU's bf16 dot-product units, through oneDNN's matmul primitive
// (kernels/gemm.cpp uses it for gemm_bf16 and bf16 grouped GEMMs when bf16_dot_gemm() says so).
//
// Why: trex's other bf16 GEMM widens the bf16 operands to f32 panels and runs oneDNN's sgemm on
// the FMA units. That is the fastest path where vdpbf16ps is slow or hidden (the hypervisor of
// BENCHMARKS.md's first machine hides the CPUID bit and the instruction runs at half the fp32
// rate; Intel's Xeons that report it run it at about half their FMA rate too). On AMD Zen 4 the
// dot-product units run at twice the fp32 FMA rate (459 against 228 GFLOP/s on 2 cores, `trex
// bench peak`), and where AMX tiles are usable (Sapphire Rapids and later) oneDNN's bf16 matmul
// (brgemm kernels) runs on them, far faster again. Numerics: products of bf16 values are exact in
// f32 and the sums are f32, as on the widened path; only the order of the additions differs.
#pragma once
#include <cstdint>
#include "core/tensor.h"

namespace trex::kern {

// True when bf16 GEMMs run on oneDNN's bf16 matmul: CPUID reports AVX512_BF16 (not just the
// SIGILL probe of core/cpu.h), TREX_ISA is not capped below avx512bf16, oneDNN can use the AMX
// tiles (kernels/peak.h amx_bf16_usable) or vdpbf16ps outruns the FMAs (bf16_dot_fast: Zen 4, not
// Intel's Xeons without the tiles), and TREX_GEMM_BF16 is not `widen` (`dot` or unset: this path; `widen`: the widened path for A/B runs; anything else is an
// error). Per GEMM it is as accurate as the widened path (tests/ops/gemm_ops.cpp, against double);
// only the order of the f32 additions differs, which the tiny parity models' 10-step bf16
// trajectories amplify after their first updates exactly as they amplify a change of the widened
// path's K blocking (tests/unit/test_parity.cpp, Parity.TenAdamWStepsFp32AndBf16).
bool bf16_dot_gemm();

// C[M, N] = alpha * op(A) op(B) + beta * C (row-major; op = transpose when ta / tb), A and B bf16,
// C f32; beta == 0 never reads C. Returns false (and does nothing) when oneDNN has no
// implementation for these strides; the caller then takes the widened path. On the AMX tiles a K
// that is not a multiple of 32 is zero-padded to one (copies of the operands, or of their last
// K % 32 steps where whole copies would pass 16 MiB), as oneDNN runs such reductions far slower.
bool gemm_bf16_dnnl(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
                    const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc);

// TREX_ISA names a level below amx (ref, avx2, avx512, avx512bf16; core/cpu.h): trex runs no GEMM
// on the AMX tiles and the machine's peak leaves them out (kernels/peak.h). Unset or "amx": no cap.
bool amx_capped();

// Where TREX_ISA caps the kernels below amx (amx_capped), caps oneDNN at avx512_core_bf16
// (dnnl_set_max_cpu_isa), so its bf16 matmuls run on the vector dot-product units instead of the
// AMX tiles: the same work measured against the peak of those units. Once
// per process, before oneDNN's first kernel; every oneDNN call in trex (sgemm, the bf16 matmul,
// dnnl_uses_amx) goes through it first. ONEDNN_MAX_CPU_ISA, oneDNN's own switch, still works.
void dnnl_apply_isa_cap();

// True when oneDNN may run kernels on the AMX tiles (its effective ISA, after the cap above and
// ONEDNN_MAX_CPU_ISA): kernels/peak.cpp then counts the tiles in the machine's peak.
bool dnnl_uses_amx();

}  // namespace trex::kern
