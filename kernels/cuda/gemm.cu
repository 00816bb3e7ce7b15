// GEMMs on cuBLASLt. Row-major C[M,N] = alpha op(A) op(B) + beta C (kernels/gemm.h) is the
// column-major product C^T[N,M] = op(B)^T op(A)^T, which needs no copy: a row-major matrix
// [r, c] with leading dimension ld is the column-major [c, r] one.
//   F32 x F32:   f32 in, f32 compute (no TF32: the CPU reference's arithmetic), f32 out.
//   BF16 x BF16: bf16 in, f32 compute and out (the tensor cores).
//   mixed:       the bf16 operand widened to f32 in scratch (exact), then F32 x F32.
// beta == 0 overwrites C without reading it (cuBLAS does not read C then); K == 0 gives beta C.
// Grouped: one cuBLASLt call per non-empty group, in order on the stream. Batched: strided
// batches of one shape in one call. Each shape's plan (descriptors, algorithm) is made once and
// kept in the backend's LtPlans.
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

}  // namespace

LtPlans::~LtPlans() { clear(); }

void LtPlans::clear() {
  for (auto& [key, p] : plans_) cublasLtMatmulDescDestroy(p.op);
  plans_.clear();
}

size_t LtKeyHash::operator()(const LtKey& k) const {
  const int64_t v[] = {k.M, k.N, k.K, k.lda, k.ldb, k.ldc, k.batch, k.sa, k.sb, k.sc, k.align,
                       (int64_t(k.bf16_in) << 2) | (int64_t(k.ta) << 1) | int64_t(k.tb)};
  size_t h = 1469598103934665603ull;
  for (int64_t x : v) h = (h ^ size_t(x)) * 1099511628211ull;
  return h;
}

namespace {

// A size's class for the plan table: itself up to 64 (rounded up to 16), else rounded up to a
// quarter of its power of two (384 -> 384, 400 -> 448), so the experts' varying row counts share
// a few plans.
int64_t size_class(int64_t x) {
  if (x <= 64) return (x + 15) / 16 * 16;
  int64_t p = 1;
  while (p * 2 <= x) p *= 2;
  const int64_t step = p / 4;
  return (x + step - 1) / step * step;
}

// The three matrix layouts of one product, made per call (cheap host structs).
struct Layouts {
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  Layouts(const LtKey& k) {
    const cudaDataType_t in = k.bf16_in ? CUDA_R_16BF : CUDA_R_32F;
    // cuBLAS's first operand is B (column-major [N, K] as stored when !tb), the second A.
    TREX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a, in, k.tb ? k.K : k.N, k.tb ? k.N : k.K, k.ldb));
    TREX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b, in, k.ta ? k.M : k.K, k.ta ? k.K : k.M, k.lda));
    TREX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, k.N, k.M, k.ldc));
    if (k.batch > 1) {
      const int32_t n = int32_t(k.batch);
      const std::pair<cublasLtMatrixLayout_t, int64_t> sets[] = {{a, k.sb}, {b, k.sa}, {c, k.sc}};
      for (const auto& [lay, stride] : sets) {
        TREX_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(lay, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &n, sizeof n));
        TREX_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(lay, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                           sizeof stride));
      }
    }
  }
  ~Layouts() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
  }
  Layouts(const Layouts&) = delete;
  Layouts& operator=(const Layouts&) = delete;
};

// The descriptor of op(A) op(B) with f32 compute and output.
cublasLtMatmulDesc_t make_op(bool ta, bool tb) {
  cublasLtMatmulDesc_t op = nullptr;
  TREX_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
  return op;
}

// cuBLASLt's first choice for the product k (false when it has none).
bool heuristic(const Ctx& ctx, cublasLtMatmulDesc_t op, const LtKey& k, cublasLtMatmulAlgo_t* algo) {
  const Layouts L(k);
  cublasLtMatmulPreference_t pref;
  TREX_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ctx.lt_ws_bytes,
                                       sizeof ctx.lt_ws_bytes);
  const uint32_t align = uint32_t(k.align);
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof align);
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(ctx.lt, op, L.a, L.b, L.c, L.c, pref, 1, &heur, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (hs != CUBLAS_STATUS_SUCCESS || found == 0) return false;
  *algo = heur.algo;
  return true;
}

[[noreturn]] void no_algorithm(const LtKey& k) {
  throw Error("cuda gemm: cuBLASLt has no algorithm for M=" + std::to_string(k.M) + " N=" + std::to_string(k.N) +
              " K=" + std::to_string(k.K) + " lda=" + std::to_string(k.lda) + " ldb=" + std::to_string(k.ldb) +
              " ldc=" + std::to_string(k.ldc) + " batch=" + std::to_string(k.batch) + " alignment " +
              std::to_string(k.align) + (k.bf16_in ? " bf16" : " f32"));
}

}  // namespace

// The plan of a size class: the descriptor and the algorithm cuBLASLt's heuristic picks for the
// class's largest problem, made once (the heuristic costs tens of microseconds of host time).
const LtPlan& LtPlans::get(const Ctx& ctx, const LtKey& k) {
  auto it = plans_.find(k);
  if (it != plans_.end()) return it->second;
  if (plans_.size() >= kMaxPlans) clear();
  LtPlan p;
  p.op = make_op(k.ta, k.tb);
  if (!heuristic(ctx, p.op, k, &p.algo)) {
    cublasLtMatmulDescDestroy(p.op);
    no_algorithm(k);
  }
  return plans_.emplace(k, p).first->second;
}

namespace {

// The largest power of two (<= 256) that divides every address.
int64_t alignment_of(const void* A, const void* B, const void* C) {
  const uintptr_t u = uintptr_t(A) | uintptr_t(B) | uintptr_t(C) | uintptr_t(256);
  return int64_t(u & (~u + 1));
}

// Both operands of one precision (F32 or BF16); batch > 1: strided batches (sa, sb, sc elements
// between the batch's matrices). The algorithm comes from the plan of the size class; should
// cuBLASLt refuse it for this exact size, the size's own heuristic choice is used.
void lt_gemm(const Ctx& ctx, bool bf16_in, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
             const void* A, int64_t lda, const void* B, int64_t ldb, float beta, float* C, int64_t ldc,
             int64_t batch = 1, int64_t sa = 0, int64_t sb = 0, int64_t sc = 0) {
  const LtKey exact{bf16_in, ta, tb, M, N, K, lda, ldb, ldc, batch, sa, sb, sc, alignment_of(A, B, C)};
  LtKey cls = exact;
  const LtPlans::Mode mode = ctx.plans ? ctx.plans->mode : LtPlans::Mode::Off;
  if (batch == 1 && mode == LtPlans::Mode::Classes) {  // (batched products, the attention's, come in few fixed sizes)
    cls.M = size_class(M), cls.N = size_class(N), cls.K = size_class(K);
    // The class's problem must fit the leading dimensions (column-major: ld >= rows), else the
    // exact size is planned.
    const bool fits = (tb ? cls.K : cls.N) <= ldb && (ta ? cls.M : cls.K) <= lda && cls.N <= ldc;
    if (!fits) cls = exact;
  }
  LtPlans local;  // a Ctx without a plan table: plan, use, drop
  const LtPlan& p = (mode != LtPlans::Mode::Off ? *ctx.plans : local).get(ctx, cls);
  const Layouts L(exact);
  cublasStatus_t st = cublasLtMatmul(ctx.lt, p.op, &alpha, B, L.a, A, L.b, &beta, C, L.c, C, L.c, &p.algo, ctx.lt_ws,
                                     ctx.lt_ws_bytes, ctx.stream);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) {
    cublasLtMatmulAlgo_t algo;
    if (!heuristic(ctx, p.op, exact, &algo)) no_algorithm(exact);
    st = cublasLtMatmul(ctx.lt, p.op, &alpha, B, L.a, A, L.b, &beta, C, L.c, C, L.c, &algo, ctx.lt_ws,
                        ctx.lt_ws_bytes, ctx.stream);
  }
  TREX_CUBLAS_CHECK(st);
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

void gemm_batched(const Ctx& c, Prec prec, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                  const void* A, int64_t lda, int64_t sa, const void* B, int64_t ldb, int64_t sb, float beta, float* C,
                  int64_t ldc, int64_t sc, int64_t batch) {
  if (M <= 0 || N <= 0 || batch <= 0) return;
  if (K <= 0) {
    for (int64_t i = 0; i < batch; ++i) {
      scale_rows<<<grid_for(M * N), 256, 0, c.stream>>>(C + i * sc, M, N, ldc, beta);
      TREX_CUDA_LAUNCHED("scale_rows");
    }
    return;
  }
  lt_gemm(c, prec == Prec::BF16, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, batch, sa, sb, sc);
}

void grouped_gemm(const Ctx& c, Prec prec, bool ta, bool tb, float alpha, float beta, const GemmGroup* groups,
                  int n_groups) {
  for (int g = 0; g < n_groups; ++g) {
    const GemmGroup& x = groups[g];
    gemm(c, prec, prec, ta, tb, x.M, x.N, x.K, alpha, x.A, x.lda, x.B, x.ldb, beta, x.C, x.ldc);
  }
}

}  // namespace trex::kern::cuda
