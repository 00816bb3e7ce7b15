#include "model/mlp.h"

#include "kernels/swiglu.h"

namespace trex::model {

MlpW mlp_weights(const float* P, const bf16* Pb, float* G, int64_t gu_off, int64_t down_off, int64_t d, int64_t F) {
  return {{P + gu_off, Pb ? Pb + gu_off : nullptr},
          {P + down_off, Pb ? Pb + down_off : nullptr},
          G ? G + gu_off : nullptr,
          G ? G + down_off : nullptr,
          d,
          F};
}

void mlp_forward(const Ctx& c, const MlpW& w, const float* x, int64_t N, float* y, float beta, MlpSaved& s) {
  s.gu = c.ws->alloc<float>(N * 2 * w.F);
  s.h = c.ws->alloc<float>(N * w.F);
  mlp_forward_saved(c, w, x, N, y, beta, s);
}

void mlp_forward_saved(const Ctx& c, const MlpW& w, const float* x, int64_t N, float* y, float beta, MlpSaved& s) {
  s.x = x;
  linear_fwd(c, x, N, w.d, w.gu, 2 * w.F, s.gu);
  kern::swiglu_fwd(s.gu, N, w.F, w.limit, s.h);
  linear_fwd(c, s.h, N, w.F, w.down, w.d, y, beta);
}

void mlp_backward(const Ctx& c, const MlpW& w, const MlpSaved& s, int64_t N, const float* dy, float* dx,
                  bool dx_accum) {
  auto m = c.ws->mark();
  float* dh = c.ws->alloc<float>(N * w.F);
  linear_bwd(c, dy, s.h, N, w.F, w.down, w.d, dh, false, w.ddown);
  float* dgu = c.ws->alloc<float>(N * 2 * w.F);
  kern::swiglu_bwd(dh, s.gu, N, w.F, w.limit, dgu);
  linear_bwd(c, dgu, s.x, N, w.d, w.gu, 2 * w.F, dx, dx_accum, w.dgu);
  c.ws->release(m);
}

}  // namespace trex::model
