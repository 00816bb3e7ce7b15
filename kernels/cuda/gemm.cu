// GEMMs on cuBLASLt. Row-major C[M,N] = alpha op(A) op(B) + beta C (kernels/gemm.h) is the
// column-major product C^T[N,M] = op(B)^T op(A)^T, which needs no copy: a row-major matrix
// [r, c] with leading dimension ld is the column-major [c, r] one.
//   F32 x F32:   f32 in, f32 compute (no TF32: the CPU reference's arithmetic), f32 out.
//   BF16 x BF16: bf16 in, f32 compute and out (the tensor cores).
//   mixed:       the bf16 operand widened to f32 in scratch (exact), then F32 x F32.
// beta == 0 overwrites C without reading it (cuBLAS does not read C then); K == 0 gives beta C.
// Grouped: one cuBLASLt call per non-empty group, in order on the stream.
#include <cuda_bf16.h>
#include "kernels/cuda/check.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"

namespace trex::kern::cuda {

namespace {

__global__ void widen_bf16(const __nv_bfloat16* __restrict__ x, float* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = __bfloat162float(x[i]);
}

// C[M, N] (ldc) = beta * C (beta == 0: zeros, NaN in C ignored).
__global__ void scale_rows(float* C, int64_t M, int64_t N, int64_t ldc, float beta) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < M * N; i += int64_t(gridDim.x) * blockDim.x) {
    float& c = C[(i / N) * ldc + i % N];
    c = beta == 0.f ? 0.f : beta * c;
  }
}

// Elements a stored operand spans: rows x ld, the last row only to its used columns.
int64_t span(int64_t rows, int64_t cols, int64_t ld) { return rows ? (rows - 1) * ld + cols : 0; }

struct LtMatmul {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  ~LtMatmul() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// Both operands of one precision (F32 or BF16).
void lt_gemm(const Ctx& ctx, bool bf16_in, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
             const void* A, int64_t lda, const void* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const cudaDataType_t in = bf16_in ? CUDA_R_16BF : CUDA_R_32F;
  LtMatmul mm;
  TREX_CUBLAS_CHECK(cublasLtMatmulDescCreate(&mm.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // cuBLAS's first operand is B (column-major [N, K] as stored when !tb), the second A.
  const cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  TREX_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(mm.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
  TREX_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(mm.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
  TREX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&mm.a, in, tb ? K : N, tb ? N : K, ldb));
  TREX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&mm.b, in, ta ? M : K, ta ? K : M, lda));
  TREX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&mm.c, CUDA_R_32F, N, M, ldc));
  cublasLtMatmulPreference_t pref;
  TREX_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ctx.lt_ws_bytes,
                                       sizeof ctx.lt_ws_bytes);
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  const cublasStatus_t hs =
      cublasLtMatmulAlgoGetHeuristic(ctx.lt, mm.op, mm.a, mm.b, mm.c, mm.c, pref, 1, &heur, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (hs != CUBLAS_STATUS_SUCCESS || found == 0)
    throw Error("cuda gemm: cuBLASLt has no algorithm for M=" + std::to_string(M) + " N=" + std::to_string(N) +
                " K=" + std::to_string(K) + " lda=" + std::to_string(lda) + " ldb=" + std::to_string(ldb) +
                " ldc=" + std::to_string(ldc) + (bf16_in ? " bf16" : " f32"));
  TREX_CUBLAS_CHECK(cublasLtMatmul(ctx.lt, mm.op, &alpha, B, mm.a, A, mm.b, &beta, C, mm.c, C, mm.c, &heur.algo,
                                   ctx.lt_ws, ctx.lt_ws_bytes, ctx.stream));
}

}  // namespace

void gemm(const Ctx& c, Prec pa, Prec pb, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
          const void* A, int64_t lda, const void* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    scale_rows<<<grid_for(M * N), 256, 0, c.stream>>>(C, M, N, ldc, beta);
    TREX_CUDA_LAUNCHED("scale_rows");
    return;
  }
  if (pa == pb) {
    lt_gemm(c, pa == Prec::BF16, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  // Mixed: widen the bf16 side.
  const bool widen_a = pa == Prec::BF16;
  const int64_t n = widen_a ? span(ta ? K : M, ta ? M : K, lda) : span(tb ? N : K, tb ? K : N, ldb);
  Scratch w(c, n * sizeof(float));
  widen_bf16<<<grid_for(n), 256, 0, c.stream>>>(
      static_cast<const __nv_bfloat16*>(widen_a ? A : B), w.as<float>(), n);
  TREX_CUDA_LAUNCHED("widen_bf16");
  lt_gemm(c, false, ta, tb, M, N, K, alpha, widen_a ? w.as<float>() : A, lda, widen_a ? B : w.as<float>(), ldb, beta,
          C, ldc);
}

void grouped_gemm(const Ctx& c, Prec prec, bool ta, bool tb, float alpha, float beta, const GemmGroup* groups,
                  int n_groups) {
  for (int g = 0; g < n_groups; ++g) {
    const GemmGroup& x = groups[g];
    gemm(c, prec, prec, ta, tb, x.M, x.N, x.K, alpha, x.A, x.lda, x.B, x.ldb, beta, x.C, x.ldc);
  }
}

}  // namespace trex::kern::cuda
