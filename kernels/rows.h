// Row operations of the training step around the GEMMs: strided copies, residual adds, bf16 casts of
// GEMM operands, gathers and ordered scatter-adds by row index (embedding, MoE dispatch), a sum over
// heads, and the MoE combine with its adjoints. Every function is deterministic: the order of each
// sum is fixed by the arguments, not by threads, so a backend that keeps the same order gives the
// same bits.
#pragma once
#include <cstdint>
#include "core/dtype.h"

namespace trex::kern {

// rows rows of row_bytes bytes: dst + r ldd <- src + r lds (byte strides; regions must not overlap).
void copy_rows(void* dst, int64_t ldd, const void* src, int64_t lds, int64_t row_bytes, int64_t rows);
// y [n] += x [n]
void add(float* y, const float* x, int64_t n);
// x [rows, cols] at row stride ldx -> y [rows, cols] packed, round to nearest even.
void to_bf16(const float* x, int64_t ldx, int64_t rows, int64_t cols, bf16* y);
// dst [R, d] = src [idx[r], :] (src has at least max(idx) + 1 rows of d).
void gather_rows(const float* src, const int32_t* idx, int64_t R, int64_t d, float* dst);
// dst [idx[r], :] += src [r, :], for each element in ascending r (repeated indices sum in row order).
void scatter_add_rows(const float* src, const int32_t* idx, int64_t R, int64_t d, float* dst);
// y [n, 0:w] (row stride ldy) = sum over h in 0..H-1, ascending, of x [n ldn + h ldh + 0:w].
void sum_heads(const float* x, int64_t N, int64_t H, int64_t ldn, int64_t ldh, int64_t w, float* y, int64_t ldy);

// MoE rows (model/moe.h; R = N K rows sorted by expert, slot_row [N K] the sorted row of token n's
// k-th slot):
// out [N, d] += sum_k probs[n K + k] y[slot_row[n K + k]] (slot order per token).
void moe_combine(const float* y, const float* probs, const int32_t* slot_row, int64_t N, int64_t K, int64_t d,
                 float* out);
// The combine's adjoint: dy[slot_row[n K + k]] = probs[n K + k] dout[n] and
// dprobs[n K + k] = dout[n] . y[slot_row[n K + k]] (the dot accumulated in double).
void moe_combine_bwd(const float* dout, const float* y, const float* probs, const int32_t* slot_row, int64_t N,
                     int64_t K, int64_t d, float* dy, float* dprobs);
// The dispatch's adjoint: dx [N, d] += sum_k dxs[slot_row[n K + k]] (fixed slot order).
void moe_dispatch_bwd(const float* dxs, const int32_t* slot_row, int64_t N, int64_t K, int64_t d, float* dx);

}  // namespace trex::kern
