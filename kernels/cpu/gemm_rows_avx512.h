// Row-invariant C = alpha A B^T (+ beta C) on AVX-512, the kernel of kernels/gemm.h's
// gemm_rows_invariant. Call through kernels/gemm.h, which checks the arguments and the CPU.
// Single-threaded; the caller splits the rows and columns into tiles.
#pragma once
#include <cstdint>

namespace trex::kern::cpu {

// Rows [i0, i1) x columns [n0, n1) of C [., ldc] from A [., K] (row stride lda) and B [., K]
// (row stride ldb), each f32 or bf16 (a_bf16 / b_bf16; bf16 widened exactly). Every C[i, n] is
// one fixed sequence of operations: a 16-lane f32 accumulator over k in steps of 16 (the last
// step masked), its lanes added in fixed pairs (l + 8, + 4, + 2, + 1), times alpha, plus beta
// C[i, n] (std::fma) unless beta == 0. So an element's bits do not depend on the tile it falls
// in, on the other rows, or on the thread.
void gemm_rows_abt_avx512(bool a_bf16, bool b_bf16, int64_t i0, int64_t i1, int64_t n0, int64_t n1, int64_t K,
                          float alpha, const void* A, int64_t lda, const void* B, int64_t ldb, float beta, float* C,
                          int64_t ldc);

}  // namespace trex::kern::cpu
