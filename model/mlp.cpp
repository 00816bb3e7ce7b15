#include "model/mlp.h"

#include "core/error.h"
#include "kernels/swiglu.h"

namespace trex::model {

namespace {

W up_rows(W gu, int64_t off) { return {gu.f + off, gu.b ? gu.b + off : nullptr, gu.ld}; }

}  // namespace

MlpW mlp_weights(const float* P, const bf16* Pb, float* G, int64_t gu_off, int64_t down_off, int64_t d, int64_t F) {
  return {{P + gu_off, Pb ? Pb + gu_off : nullptr},
          {P + down_off, Pb ? Pb + down_off : nullptr},
          G ? G + gu_off : nullptr,
          G ? G + down_off : nullptr,
          d,
          F};
}

MlpW mlp_weights_tp(const float* P, const bf16* Pb, float* G, int64_t gu_off, int64_t down_off, int64_t d, int64_t F,
                    TpSlice tp) {
  if (!tp.on()) return mlp_weights(P, Pb, G, gu_off, down_off, d, F);
  TREX_CHECK(F % tp.size == 0, "MLP width ", F, " is not a multiple of the tensor-parallel size ", tp.size);
  const int64_t Fl = F / tp.size, f0 = tp.rank * Fl;
  // A tp-sharded layout holds exactly this slice: gate|up [2 Fl, d] stacked, down [d, Fl].
  if (tp.held) return mlp_weights(P, Pb, G, gu_off, down_off, d, Fl);
  MlpW w = mlp_weights(P, Pb, G, gu_off + f0 * d, down_off + f0, d, Fl);
  w.up_off = F * d;  // up rows start F rows after the gate rows of the whole matrix
  w.down.ld = F;     // columns [f0, f0 + Fl) of down [d, F]
  return w;
}

void mlp_forward(const Ctx& c, const MlpW& w, const float* x, int64_t N, float* y, float beta, MlpSaved& s) {
  s.gu = c.ws->alloc<float>(N * 2 * w.F);
  s.h = c.ws->alloc<float>(N * w.F);
  mlp_forward_saved(c, w, x, N, y, beta, s);
}

void mlp_forward_saved(const Ctx& c, const MlpW& w, Act x, int64_t N, float* y, float beta, MlpSaved& s) {
  mlp_hidden(c, w, x, N, s);
  linear_fwd(c, s.h, N, w.F, w.down, w.d, y, beta);
}

void mlp_hidden(const Ctx& c, const MlpW& w, Act x, int64_t N, MlpSaved& s) {
  s.x = x.f;
  if (!w.up_off || w.up_off == w.F * w.d) {
    linear_fwd(c, x, N, w.d, w.gu, 2 * w.F, s.gu);
  } else {  // gate and up rows apart (tensor-parallel slice): two GEMMs into the halves of gu
    linear_fwd(c, x, N, w.d, w.gu, w.F, s.gu, 0.f, 2 * w.F);
    linear_fwd(c, x, N, w.d, up_rows(w.gu, w.up_off), w.F, s.gu + w.F, 0.f, 2 * w.F);
  }
  c.k().swiglu_fwd(s.gu, N, w.F, w.limit, s.h);
}

void mlp_backward(const Ctx& c, const MlpW& w, const MlpSaved& s, int64_t N, const float* dy, float* dx,
                  bool dx_accum) {
  auto m = c.ws->mark();
  float* dh = c.ws->alloc<float>(N * w.F);
  linear_bwd(c, dy, s.h, N, w.F, w.down, w.d, dh, false, w.ddown);
  float* dgu = c.ws->alloc<float>(N * 2 * w.F);
  c.k().swiglu_bwd(dh, s.gu, N, w.F, w.limit, dgu);
  const Act x(s.x, s.xb);
  if (!w.up_off || w.up_off == w.F * w.d) {
    linear_bwd(c, dgu, x, N, w.d, w.gu, 2 * w.F, dx, dx_accum, w.dgu);
  } else {
    linear_bwd(c, dgu, x, N, w.d, w.gu, w.F, dx, dx_accum, w.dgu, 2 * w.F);
    linear_bwd(c, dgu + w.F, x, N, w.d, up_rows(w.gu, w.up_off), w.F, dx, true, w.dgu ? w.dgu + w.up_off : nullptr,
               2 * w.F);
  }
  c.ws->release(m);
}

}  // namespace trex::model
