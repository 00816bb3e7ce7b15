// AVX-512 helpers of the GEMM and fused LM-head cross-entropy kernels. Call through
// kernels/gemm.h and kernels/lm_head_ce.h, which check arguments and the CPU. All functions
// here are single-threaded; the callers split rows across threads.
#pragma once
#include <cstdint>
#include "core/dtype.h"

namespace trex::kern::cpu {

// src: [rows, cols] bf16 (row stride lds) -> dst: [rows, cols] f32 (row stride ldd), exact.
void bf16_to_f32_2d_avx512(const bf16* src, int64_t lds, int64_t rows, int64_t cols, float* dst, int64_t ldd);

// Online log-sum-exp update over one vocabulary chunk (gemm_ce_avx512.cpp).
// logits: [rows, cols] (row stride ld); m, s: [rows] running max and sum of exp(l - m),
// updated in place (start from m = -inf, s = 0). NaN in a row makes s NaN.
void ce_chunk_stats_avx512(const float* logits, int64_t ld, int64_t rows, int64_t cols, float* m, float* s);

// In place: logits[r, j] <- exp(logits[r, j] - lse[r]) * g[r]   (the softmax scaled by g).
// logits: [rows, cols] (row stride ld)  lse, g: [rows]
void ce_chunk_softmax_avx512(float* logits, int64_t ld, int64_t rows, int64_t cols, const float* lse,
                             const float* g);

// The backward's rows where one chunk holds the whole vocabulary, each row in one visit while it
// sits in L2 (its logits read once from memory, no f32 row written back): the log-sum-exp
// (ce_chunk_stats_avx512 from m = -inf, s = 0; lse = m + log s), the label's logit, and
// p = g * softmax - g * onehot rounded to bf16, with g = grad_scale (0 on ignored rows). The bits
// of the two functions above, the label's subtraction and to_bf16_avx512.
// logits: [rows, cols] (row stride ld)  y: [rows] labels (-100: ignored)
// -> lse, lab: [rows] (lab: the label's logit, 0 on ignored rows)  p: [rows, cols] (row stride ldp)
void ce_rows_p_bf16_avx512(const float* logits, int64_t ld, int64_t rows, int64_t cols, const int32_t* y,
                           float grad_scale, float* lse, float* lab, bf16* p, int64_t ldp);

}  // namespace trex::kern::cpu
