// Dense GEMM and grouped (per-expert) GEMM, row-major with leading dimensions (in elements).
//   C[M,N] = alpha * op(A) @ op(B) + beta * C
//   op(A) = A stored [M, K] (lda >= K), or if ta: A stored [K, M] (lda >= M)
//   op(B) = B stored [K, N] (ldb >= N), or if tb: B stored [N, K] (ldb >= K);  ldc >= N
// BLAS semantics for beta: beta == 0 overwrites C without reading it (NaN in C is ignored).
// The three uses in a linear layer with weight W: [out, in]:
//   forward  y  = x @ W^T          gemm(ta=0, tb=1, beta=0)
//   backward dx = dy @ W           gemm(ta=0, tb=0, beta=0)   (activation grad: overwrite)
//   backward dW += dy^T @ x        gemm(ta=1, tb=0, beta=1)   (parameter grad: accumulate)
// M, N, K may be any size >= 0 (M = 0 or N = 0: nothing happens; K = 0: C = beta * C).
//
// Implementation (see gemm.cpp): f32 goes to oneDNN's dnnl_sgemm (as fast as a matmul
// primitive, and needs no per-shape primitive). bf16 operands are widened to f32 panels (exact)
// and multiplied by the same sgemm. Measured on the 2-core Emerald Rapids VM (1 core): fp32
// FMA peak 174 GFLOP/s, vdpbf16ps peak 87 GFLOP/s (half!), sgemm 145-165, oneDNN's bf16
// matmul (bf16 emulated: CPUID hides AVX512-BF16) 31, widen + sgemm 135-158. So no
// vdpbf16ps kernel can beat widening here. TREX_ISA=ref selects the scalar reference instead;
// a CPU without AVX-512 still uses oneDNN (its AVX2 code) and widens bf16 with scalar code.
// Results are deterministic for a fixed thread count.
#pragma once
#include <cstdint>
#include "core/dtype.h"

namespace trex::kern {

enum class Prec { F32, BF16 };

// A: op(A) [M, K]  B: op(B) [K, N]  C: [M, N] (f32 everywhere)
void gemm_f32(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// A, B in bf16; products and accumulation in f32; C: [M, N] f32.
void gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
               const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc);

// Mixed precision: A is float* when pa == F32, bf16* when pa == BF16 (same for B with pb);
// f32 accumulation and output. E.g. dx = dy(f32) @ W(bf16) without rounding dy.
void gemm_mixed(Prec pa, Prec pb, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
                int64_t lda, const void* B, int64_t ldb, float beta, float* C, int64_t ldc);

// bf16 -> f32, exact: src [rows, cols] (row stride lds) -> dst [rows, cols] (row stride cols), on
// the worker threads unless called inside a parallel region (the widened path's conversion).
void widen_bf16(const bf16* src, int64_t lds, int64_t rows, int64_t cols, float* dst);

// One independent GEMM of a grouped call (an expert): A, B are float* or bf16* per the call's
// Prec; M may be 0 (the group is skipped).
struct GemmGroup {
  const void* A;
  const void* B;
  float* C;
  int64_t M, N, K, lda, ldb, ldc;
};

// groups: [n_groups]; each group computes C = alpha * op(A) @ op(B) + beta * C with the shared
// ta / tb / alpha / beta / precision. Groups must not share C. Large groups run one after the
// other on all threads; small ones run concurrently, one thread each (largest first).
void grouped_gemm(Prec prec, bool ta, bool tb, float alpha, float beta, const GemmGroup* groups, int n_groups);

// Row-invariant forms, for generation (model/generate.h: a prompt decoded among others must give
// what it gives alone): C = alpha * A @ B^T + beta * C with A stored [M, K] and B stored [N, K]
// (a linear layer's forward; A and B f32 or bf16, bf16 widened exactly). Row i of C depends only
// on row i of A, on B and on K: never on M, on the other rows or on the thread count. The fast
// forms above give no such promise: oneDNN's sgemm runs another kernel below 16 rows, and
// another K blocking as M or the thread count changes, so on AVX-512 CPUs a row of a 3-row call
// differs in its last bits from the same row alone. Here each element is one fixed sequence of
// operations (kernels/cpu/gemm_rows_avx512.h: 16-lane partial sums over k added in fixed pairs;
// a portable form with 8 lanes elsewhere); threads take tiles of 64 x 64 of all groups.
// Host memory only (the CPU backend).
void gemm_rows_invariant(Prec pa, Prec pb, int64_t M, int64_t N, int64_t K, float alpha, const void* A, int64_t lda,
                         const void* B, int64_t ldb, float beta, float* C, int64_t ldc);
void grouped_gemm_rows_invariant(Prec prec, float alpha, float beta, const GemmGroup* groups, int n_groups);

}  // namespace trex::kern
