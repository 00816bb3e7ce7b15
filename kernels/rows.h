// Row operations of the training step around the GEMMs: strided copies, residual adds, bf16 casts of
// GEMM operands, gathers and ordered scatter-adds by row index (embedding, MoE dispatch), a sum over
// heads, and the MoE combine with its adjoints. Every function is deterministic: the order of each
// sum is fixed by the arguments, not by threads, so a backend that keeps the same order gives the
// same bits.
#pragma once
#include <cstddef>
#include <cstdint>
#include "core/dtype.h"

namespace trex::kern {

// rows rows of row_bytes bytes: dst + r ldd <- src + r lds (byte strides; regions must not overlap).
void copy_rows(void* dst, int64_t ldd, const void* src, int64_t lds, int64_t row_bytes, int64_t rows);
// p [bytes] = 0. Regions of kZeroStreamBytes and up (a gradient buffer; far past the L2) are split
// over the threads and, on AVX-512, written with streaming stores (no read of the old lines:
// about 4x a one-thread memset of the 1.25 GB gradient buffer of bench-v3 on 2 cores); smaller
// ones stay a memset, which leaves them in the cache for the writes that follow.
void zero_bytes(void* p, size_t bytes);
inline constexpr size_t kZeroStreamBytes = size_t{32} << 20;
// y [n] += x [n]
void add(float* y, const float* x, int64_t n);
// out [R] = a [R, w] . b [R, w] row by row (each dot accumulated in double, ascending j; kept in
// double: model/moe.cpp divides it by the routing probability).
void row_dot(const float* a, const float* b, int64_t R, int64_t w, double* out);
// x [rows, cols] at row stride ldx -> y [rows, cols] packed, round to nearest even.
void to_bf16(const float* x, int64_t ldx, int64_t rows, int64_t cols, bf16* y);
// x [n] -> y [n], the same bits (one row).
inline void to_bf16(const float* x, int64_t n, bf16* y) { to_bf16(x, n, 1, n, y); }
// dst [R, d] = src [idx[r], :] (src has at least max(idx) + 1 rows of d).
void gather_rows(const float* src, const int32_t* idx, int64_t R, int64_t d, float* dst);
// The same on bf16 rows (the routed experts' GEMM operands gathered from one bf16 copy of the
// tokens: the bits to_bf16 would give the gathered f32 rows).
void gather_rows_bf16(const bf16* src, const int32_t* idx, int64_t R, int64_t d, bf16* dst);
// dst [idx[r], :] += src [r, :], for each element in ascending r (repeated indices sum in row order).
void scatter_add_rows(const float* src, const int32_t* idx, int64_t R, int64_t d, float* dst);
// y [n, 0:w] (row stride ldy) = sum over h in 0..H-1, ascending, of x [n ldn + h ldh + 0:w].
void sum_heads(const float* x, int64_t N, int64_t H, int64_t ldn, int64_t ldh, int64_t w, float* y, int64_t ldy);

// MoE rows (model/moe.h; R = N K rows sorted by expert, slot_row [N K] the sorted row of token n's
// k-th slot):
// out [N, d] += sum_k probs[n K + k] y[slot_row[n K + k]] (slot order per token).
void moe_combine(const float* y, const float* probs, const int32_t* slot_row, int64_t N, int64_t K, int64_t d,
                 float* out);
// The combine's adjoint for the rows: dy[slot_row[n K + k]] = probs[n K + k] dout[n].
void moe_combine_bwd(const float* dout, const float* probs, const int32_t* slot_row, int64_t N, int64_t K, int64_t d,
                     float* dy);
// The combine's adjoint for the probabilities from q [R] (sorted order), q[row] = dy[row] . y[row]
// = probs (dout[n] . y[row]) (row_dot of moe_combine_bwd's dy and the routed outputs, where the
// rows are computed: model/moe.cpp): dprobs[n K + k] = q[slot_row[n K + k]] / probs[n K + k]; 0
// where the probability is 0 (its score underflowed: a gradient through it is below float precision).
// In double up to the one rounding of dprobs: only the rounding of p dout in dy separates it from
// dout . y.
void moe_probs_bwd(const double* q, const float* probs, const int32_t* slot_row, int64_t N, int64_t K,
                   float* dprobs);
// The dispatch's adjoint: dx [N, d] += sum_k dxs[slot_row[n K + k]] (fixed slot order).
void moe_dispatch_bwd(const float* dxs, const int32_t* slot_row, int64_t N, int64_t K, int64_t d, float* dx);

}  // namespace trex::kern
