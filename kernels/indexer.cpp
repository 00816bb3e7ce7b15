// Lightning-indexer top-k dispatch: the AVX-512 kernel when the CPU has it (its scores on the
// AVX512_BF16 dot product for a bf16 shape where the attention core's bf16 kernels run:
// kern::attention_bf16_kernels), the AVX2 kernel on a CPU with AVX2 + FMA only, else the scalar
// reference.
#include "kernels/indexer.h"
#include "core/cpu.h"
#include "core/error.h"
#include "kernels/attention.h"
#include "kernels/cpu/indexer_avx2.h"
#include "kernels/cpu/indexer_avx512.h"
#include "kernels/ref/indexer.h"

namespace trex::kern {
namespace {

void check_shape(const char* fn, const IndexerShape& sh) {
  TREX_CHECK(sh.B >= 0 && sh.T >= 0 && sh.nw >= 0, fn, ": B=", sh.B, " T=", sh.T, " nw=", sh.nw);
  TREX_CHECK(sh.nh > 0 && sh.dI > 0, fn, ": nh=", sh.nh, " dI=", sh.dI);
  TREX_CHECK(sh.m >= 1 && sh.topk >= 0, fn, ": m=", sh.m, " topk=", sh.topk);
  TREX_CHECK(sh.nw < (int64_t{1} << 31), fn, ": nw=", sh.nw, " does not fit int32 indices");
}

}  // namespace

size_t indexer_workspace_floats(const IndexerShape& sh) {
  check_shape("indexer_workspace_floats", sh);
  const int64_t nwp = (sh.nw + 31) / 32 * 32;
  return static_cast<size_t>(sh.B * nwp * sh.dI + kIndexerMaxThreads * nwp);
}

void indexer_topk(const IndexerShape& sh, const float* q, const float* k, const float* wts, const int32_t* pos,
                  int32_t* cnt, int32_t* sel, float* scores_out, float* workspace) {
  check_shape("indexer_topk", sh);
  if (sh.B * sh.T == 0) return;
  TREX_CHECK(pos && cnt && (sel || sh.topk == 0), "indexer_topk: null pointer");
  TREX_CHECK(sh.nw == 0 || (q && k && wts && workspace), "indexer_topk: null pointer");
  if (cpu_isa() >= Isa::Avx512)
    return cpu::indexer_topk_avx512(sh, q, k, wts, pos, cnt, sel, scores_out, workspace,
                                    attention_bf16_kernels(sh.prec));
  if (cpu_isa() == Isa::Avx2)
    return cpu::indexer_topk_avx2(sh, q, k, wts, pos, cnt, sel, scores_out, workspace);
  ref::indexer_topk<float>(sh, q, k, wts, pos, cnt, sel, scores_out);
}

}  // namespace trex::kern
