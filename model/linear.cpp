#include "model/linear.h"

#include "kernels/rows.h"

namespace trex::model {

void to_bf16(const float* x, bf16* y, int64_t n) { kern::to_bf16(x, n, y); }

const void* gemm_input(const Ctx& c, const float* x, int64_t n) {
  if (c.prec == kern::Prec::F32) return x;
  bf16* b = c.ws->alloc<bf16>(n);
  c.k().to_bf16(x, n, 1, n, b);
  return b;
}

Act act_with_bf16(const Ctx& c, const float* x, int64_t n) {
  if (c.prec == kern::Prec::F32) return Act(x);
  return Act(x, static_cast<const bf16*>(gemm_input(c, x, n)));
}

namespace {

// n rows of `cols` floats at row stride ld -> a packed bf16 copy [n, cols] from c.ws.
bf16* bf16_rows(const Ctx& c, const float* x, int64_t n, int64_t cols, int64_t ld) {
  bf16* b = c.ws->alloc<bf16>(n * cols);
  c.k().to_bf16(x, ld, n, cols, b);
  return b;
}

}  // namespace

void gemm_fwd(const Ctx& c, kern::Prec pa, kern::Prec pb, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda,
              const void* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (!c.rows_invariant) return c.k().gemm(pa, pb, false, true, M, N, K, 1.f, A, lda, B, ldb, beta, C, ldc);
  TREX_CHECK(c.host_memory(), "row-invariant GEMMs run on host memory (the CPU backend)");
  kern::gemm_rows_invariant(pa, pb, M, N, K, 1.f, A, lda, B, ldb, beta, C, ldc);
}

void grouped_gemm_fwd(const Ctx& c, kern::Prec prec, float beta, const kern::GemmGroup* groups, int n_groups) {
  if (!c.rows_invariant) return c.k().grouped_gemm(prec, false, true, 1.f, beta, groups, n_groups);
  TREX_CHECK(c.host_memory(), "row-invariant GEMMs run on host memory (the CPU backend)");
  kern::grouped_gemm_rows_invariant(prec, 1.f, beta, groups, n_groups);
}

void linear_fwd(const Ctx& c, Act x, int64_t N, int64_t in, W w, int64_t out, float* y, float beta, int64_t ldy) {
  if (N == 0) return;
  const int64_t ldw = w.ld ? w.ld : in, ly = ldy ? ldy : out;
  if (c.prec == kern::Prec::F32 || !w.b) {
    gemm_fwd(c, kern::Prec::F32, kern::Prec::F32, N, out, in, x.f, in, w.f, ldw, beta, y, ly);
    return;
  }
  auto m = c.ws->mark();
  const bf16* xb = x.b ? x.b : bf16_rows(c, x.f, N, in, in);
  gemm_fwd(c, kern::Prec::BF16, kern::Prec::BF16, N, out, in, xb, in, w.b, ldw, beta, y, ly);
  c.ws->release(m);
}

void linear_bwd(const Ctx& c, const float* dy, Act x, int64_t N, int64_t in, W w, int64_t out, float* dx,
                bool dx_accum, float* dW, int64_t ldy) {
  if (N == 0) return;
  const int64_t ldw = w.ld ? w.ld : in, ly = ldy ? ldy : out;
  if (c.prec == kern::Prec::F32 || !w.b) {
    if (dx) c.k().gemm(kern::Prec::F32, kern::Prec::F32, false, false, N, in, out, 1.f, dy, ly, w.f, ldw, dx_accum ? 1.f : 0.f, dx, in);
    if (dW) c.k().gemm(kern::Prec::F32, kern::Prec::F32, true, false, out, in, N, 1.f, dy, ly, x.f, in, 1.f, dW, ldw);
    return;
  }
  auto m = c.ws->mark();
  bf16* dyb = bf16_rows(c, dy, N, out, ly);
  if (dx) c.k().gemm(kern::Prec::BF16, kern::Prec::BF16, false, false, N, in, out, 1.f, dyb, out, w.b, ldw, dx_accum ? 1.f : 0.f, dx, in);
  if (dW) {
    const bf16* xb = x.b ? x.b : bf16_rows(c, x.f, N, in, in);
    c.k().gemm(kern::Prec::BF16, kern::Prec::BF16, true, false, out, in, N, 1.f, dyb, out, xb, in, 1.f, dW, ldw);
  }
  c.ws->release(m);
}

}  // namespace trex::model
