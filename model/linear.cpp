#include "model/linear.h"

#include "core/parallel.h"

namespace trex::model {

void to_bf16(const float* x, bf16* y, int64_t n) {
  parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] = f32_to_bf16(x[i]);
  });
}

const void* gemm_input(const Ctx& c, const float* x, int64_t n) {
  if (c.prec == kern::Prec::F32) return x;
  bf16* b = c.ws->alloc<bf16>(n);
  to_bf16(x, b, n);
  return b;
}

void linear_fwd(const Ctx& c, const float* x, int64_t N, int64_t in, W w, int64_t out, float* y, float beta) {
  if (N == 0) return;
  if (c.prec == kern::Prec::F32 || !w.b) {
    kern::gemm_f32(false, true, N, out, in, 1.f, x, in, w.f, in, beta, y, out);
    return;
  }
  auto m = c.ws->mark();
  bf16* xb = c.ws->alloc<bf16>(N * in);
  to_bf16(x, xb, N * in);
  kern::gemm_bf16(false, true, N, out, in, 1.f, xb, in, w.b, in, beta, y, out);
  c.ws->release(m);
}

void linear_bwd(const Ctx& c, const float* dy, const float* x, int64_t N, int64_t in, W w, int64_t out, float* dx,
                bool dx_accum, float* dW) {
  if (N == 0) {
    if (dx && !dx_accum) return;
    return;
  }
  if (c.prec == kern::Prec::F32 || !w.b) {
    if (dx) kern::gemm_f32(false, false, N, in, out, 1.f, dy, out, w.f, in, dx_accum ? 1.f : 0.f, dx, in);
    if (dW) kern::gemm_f32(true, false, out, in, N, 1.f, dy, out, x, in, 1.f, dW, in);
    return;
  }
  auto m = c.ws->mark();
  bf16* dyb = c.ws->alloc<bf16>(N * out);
  to_bf16(dy, dyb, N * out);
  if (dx) kern::gemm_bf16(false, false, N, in, out, 1.f, dyb, out, w.b, in, dx_accum ? 1.f : 0.f, dx, in);
  if (dW) {
    bf16* xb = c.ws->alloc<bf16>(N * in);
    to_bf16(x, xb, N * in);
    kern::gemm_bf16(true, false, out, in, N, 1.f, dyb, out, xb, in, 1.f, dW, in);
  }
  c.ws->release(m);
}

}  // namespace trex::model
