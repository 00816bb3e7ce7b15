// Causal attention of one context-parallel rank's queries against every key of their sequences
// (model/mla.cpp with parallel.cp > 1): the queries are a subset of the sequence's positions (the
// rank's chunks, in any order), the keys and values are the whole sequence.
// Query row t (of the Tq local rows) sits at sequence index qidx[t] (the same for every batch row);
// it attends key s of its batch row b iff
//   s <= qidx[t]  and  (seg == nullptr || seg[b, s] == seg[b, qidx[t]]).
// Scores are scale * q.k; Dqk and Dv may differ.
// On the flash kernels (kernels/attention.h: AVX-512, AVX2, and AVX512_BF16 with prec BF16, as on
// one rank) the local rows are cut into runs of consecutive sequence indices (the zigzag split of
// model/context_parallel.h gives two, or one where a rank's chunks touch), and each run [p0, p0 + n)
// of a batch row is one call with query rows Tq = n against the keys [0, p0 + n) (bottom-right
// causal alignment); the backward adds each run's dk, dv into the row's (AttnShape::acc_dkv), so
// the keys' gradients are this rank's queries' share. Elsewhere (the GEMM-based kernel, TREX_ISA=ref)
// in f32 through GEMMs (oneDNN sgemm), as kernels/cpu/attention_blas.h does for the square case: per
// (b, h) and block of queries, the scores of the block against the keys its last query may see are
// one GEMM (scratch [block, keys]), masked and soft-maxed, the output one more GEMM; the backward
// recomputes the probabilities from lse.
#pragma once
#include <cstdint>

#include "kernels/gemm.h"

namespace trex::kern {

struct AttnCpShape {
  int B, Tq, Tk, H, Dqk, Dv;  // Tq local query rows, Tk keys (the whole sequence)
  float scale;                // multiplies q.k
  Prec prec = Prec::F32;      // as AttnShape::prec (kernels/attention.h)
};

// q: [B,Tq,H,Dqk]  k: [B,Tk,H,Dqk]  v: [B,Tk,H,Dv]  qidx: [Tq]  seg: [B,Tk] document ids or null
// -> o: [B,Tq,H,Dv]  lse: [B,H,Tq] (natural log-sum-exp of each query row's scaled scores; -inf
// and o = 0 for a row that sees no key).
void attention_cp_fwd(const AttnCpShape& sh, const float* q, const float* k, const float* v, const int32_t* qidx,
                      const int32_t* seg, float* o, float* lse);

// q, o, dO, lse: as forward; k, v: as forward -> dq: [B,Tq,H,Dqk], dk: [B,Tk,H,Dqk], dv: [B,Tk,H,Dv]
// (all overwritten; dk, dv are this rank's queries' share of the keys' gradients).
void attention_cp_bwd(const AttnCpShape& sh, const float* q, const float* k, const float* v, const int32_t* qidx,
                      const int32_t* seg, const float* o, const float* lse, const float* dO, float* dq, float* dk,
                      float* dv);

}  // namespace trex::kern
