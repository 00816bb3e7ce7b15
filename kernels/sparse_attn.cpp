// Dispatch of sparse shared-KV sink attention (see sparse_attn.h): with SparseAttnShape::prec ==
// BF16 on a CPU whose AVX512_BF16 dot product outruns its FMAs (kernels/peak.h bf16_dot_fast) the
// bf16 dot-product kernel (unless TREX_ATTN=f32), else the AVX-512 kernel, the AVX2 kernel or the
// scalar reference. Checks the shape and the key lists (O(N + off[N]), cheap next to the
// O(off[N] H D) work) before any runs.
#include "kernels/sparse_attn.h"

#include <algorithm>

#include "core/cpu.h"
#include "core/error.h"
#include "kernels/attention.h"
#include "kernels/cpu/sparse_attn_avx2.h"
#include "kernels/cpu/sparse_attn_avx512.h"
#include "kernels/cpu/sparse_attn_avx512bf16.h"
#include "kernels/ref/sparse_attn.h"

namespace trex::kern {

static bool sparse_bf16(const SparseAttnShape& sh) { return attention_bf16_kernels(sh.prec); }

static void check_args(const SparseAttnShape& sh, int64_t M, const int64_t* off,
                       const int32_t* idx) {
  TREX_CHECK(sh.N >= 0 && sh.H > 0 && sh.D > 0 && M >= 0, "sparse_attn: bad shape N=", sh.N,
             " H=", sh.H, " D=", sh.D, " M=", M);
  TREX_CHECK(off[0] == 0, "sparse_attn: off[0] must be 0, got ", off[0]);
  for (int64_t i = 0; i < sh.N; ++i)
    TREX_CHECK(off[i + 1] >= off[i], "sparse_attn: off decreases at query ", i, ": ", off[i],
               " -> ", off[i + 1]);
  for (int64_t j = 0; j < off[sh.N]; ++j)
    TREX_CHECK(idx[j] >= 0 && idx[j] < M, "sparse_attn: idx[", j, "] = ", idx[j],
               " outside [0, M=", M, ")");
}

void sparse_attn_fwd(const SparseAttnShape& sh, const float* q, const float* kv, int64_t M,
                     const int64_t* off, const int32_t* idx, const float* sink, float* o,
                     float* lse) {
  check_args(sh, M, off, idx);
  if (sparse_bf16(sh))
    cpu::sparse_attn_fwd_avx512bf16(sh, q, kv, M, off, idx, sink, o, lse);
  else if (cpu_isa() >= Isa::Avx512)
    cpu::sparse_attn_fwd_avx512(sh, q, kv, M, off, idx, sink, o, lse);
  else if (cpu_isa() == Isa::Avx2)
    cpu::sparse_attn_fwd_avx2(sh, q, kv, M, off, idx, sink, o, lse);
  else
    ref::sparse_attn_fwd<float>(sh, q, kv, M, off, idx, sink, o, lse);
}

void sparse_attn_bwd(const SparseAttnShape& sh, const float* q, const float* kv, int64_t M,
                     const int64_t* off, const int32_t* idx, const float* sink, const float* o,
                     const float* lse, const float* dO, float* dq, float* dkv, float* dsink,
                     float* workspace) {
  check_args(sh, M, off, idx);
  TREX_CHECK((sink == nullptr) == (dsink == nullptr),
             "sparse_attn_bwd: dsink must be given exactly when sink is");
  if (cpu_isa() >= Isa::Avx2)
    TREX_CHECK(workspace || sparse_attn_bwd_workspace_floats(sh, M) == 0,
               "sparse_attn_bwd: workspace is null");
  if (sparse_bf16(sh)) {
    cpu::sparse_attn_bwd_avx512bf16(sh, q, kv, M, off, idx, sink, o, lse, dO, dq, dkv, dsink,
                                    workspace);
  } else if (cpu_isa() >= Isa::Avx512) {
    cpu::sparse_attn_bwd_avx512(sh, q, kv, M, off, idx, sink, o, lse, dO, dq, dkv, dsink,
                                workspace);
  } else if (cpu_isa() == Isa::Avx2) {
    cpu::sparse_attn_bwd_avx2(sh, q, kv, M, off, idx, sink, o, lse, dO, dq, dkv, dsink,
                              workspace);
  } else {
    ref::sparse_attn_bwd<float>(sh, q, kv, M, off, idx, sink, o, lse, dO, dq, dkv, dsink);
  }
}

// The larger of the two kernels' needs (the AVX2 one is never more: the same chunks, round8(H)
// partial dsinks instead of round16(H)), so a size computed on one machine fits either kernel.
size_t sparse_attn_bwd_workspace_floats(const SparseAttnShape& sh, int64_t M) {
  return std::max(cpu::sparse_attn_bwd_workspace_floats_avx512(sh, M),
                  cpu::sparse_attn_bwd_workspace_floats_avx2(sh, M));
}

}  // namespace trex::kern
