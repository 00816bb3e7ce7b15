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

namespace {

// n rows of `cols` floats at row stride ld -> a packed bf16 copy [n, cols] from c.ws.
bf16* bf16_rows(const Ctx& c, const float* x, int64_t n, int64_t cols, int64_t ld) {
  bf16* b = c.ws->alloc<bf16>(n * cols);
  c.k().to_bf16(x, ld, n, cols, b);
  return b;
}

}  // namespace

void linear_fwd(const Ctx& c, const float* x, int64_t N, int64_t in, W w, int64_t out, float* y, float beta,
                int64_t ldy) {
  if (N == 0) return;
  const int64_t ldw = w.ld ? w.ld : in, ly = ldy ? ldy : out;
  if (c.prec == kern::Prec::F32 || !w.b) {
    c.k().gemm(kern::Prec::F32, kern::Prec::F32, false, true, N, out, in, 1.f, x, in, w.f, ldw, beta, y, ly);
    return;
  }
  auto m = c.ws->mark();
  bf16* xb = bf16_rows(c, x, N, in, in);
  c.k().gemm(kern::Prec::BF16, kern::Prec::BF16, false, true, N, out, in, 1.f, xb, in, w.b, ldw, beta, y, ly);
  c.ws->release(m);
}

void linear_bwd(const Ctx& c, const float* dy, const float* x, int64_t N, int64_t in, W w, int64_t out, float* dx,
                bool dx_accum, float* dW, int64_t ldy) {
  if (N == 0) return;
  const int64_t ldw = w.ld ? w.ld : in, ly = ldy ? ldy : out;
  if (c.prec == kern::Prec::F32 || !w.b) {
    if (dx) c.k().gemm(kern::Prec::F32, kern::Prec::F32, false, false, N, in, out, 1.f, dy, ly, w.f, ldw, dx_accum ? 1.f : 0.f, dx, in);
    if (dW) c.k().gemm(kern::Prec::F32, kern::Prec::F32, true, false, out, in, N, 1.f, dy, ly, x, in, 1.f, dW, ldw);
    return;
  }
  auto m = c.ws->mark();
  bf16* dyb = bf16_rows(c, dy, N, out, ly);
  if (dx) c.k().gemm(kern::Prec::BF16, kern::Prec::BF16, false, false, N, in, out, 1.f, dyb, out, w.b, ldw, dx_accum ? 1.f : 0.f, dx, in);
  if (dW) {
    bf16* xb = bf16_rows(c, x, N, in, in);
    c.k().gemm(kern::Prec::BF16, kern::Prec::BF16, true, false, out, in, N, 1.f, dyb, out, xb, in, 1.f, dW, ldw);
  }
  c.ws->release(m);
}

}  // namespace trex::model
