// SwiGLU MLP (dense layers and shared experts): y = down(silu(gate(x)) * up(x)), with gate and
// up stacked as one [2F, d] weight so one GEMM produces both. Forward and backward side by side;
// parameter gradients accumulate, dx accumulates into the caller's buffer when dx_accum.
#pragma once
#include <cstdint>
#include "model/linear.h"

namespace trex::model {

struct MlpSaved {
  const float* x = nullptr;  // [N, d] input
  float* gu = nullptr;       // [N, 2F] gate|up pre-activation
  float* h = nullptr;        // [N, F] silu(gate)*up
  // x's bf16 copy for the weight gradient of gate|up (Act::b), set by a backward's caller that made
  // one for other uses too; null: mlp_backward rounds x itself.
  const bf16* xb = nullptr;
};

struct MlpW {
  W gu, down;          // [2F, d], [d, F]
  float *dgu, *ddown;  // gradient slots
  int64_t d, F;
  float limit = 0.f;   // SwiGLU clamp (DeepSeek-V4 swiglu_limit); 0 = none
  // Elements from the first gate row to the first up row of gu (0 = F * d: gate and up stacked,
  // one GEMM). A tensor-parallel slice has its gate and up rows apart (F_full * d): two GEMMs.
  int64_t up_off = 0;
};

// The weights at slab offsets gu_off ([2F, d]) and down_off ([d, F]) of the parameter slab P,
// its bf16 shadow Pb (or null) and the gradient slab G (or null when no backward follows).
MlpW mlp_weights(const float* P, const bf16* Pb, float* G, int64_t gu_off, int64_t down_off, int64_t d, int64_t F);
// Tensor parallel: columns [rank * F / size, (rank + 1) * F / size) of the gate and up rows and of
// down's input (F % size == 0). mlp_forward's y and mlp_backward's dx are then this rank's partial
// sums; the gradients touch this rank's slice only.
MlpW mlp_weights_tp(const float* P, const bf16* Pb, float* G, int64_t gu_off, int64_t down_off, int64_t d, int64_t F,
                    TpSlice tp);

// x: [N, d] -> y: [N, d] (y = beta*y + mlp(x)); s.gu, s.h come from the arena.
void mlp_forward(const Ctx&, const MlpW&, const float* x, int64_t N, float* y, float beta, MlpSaved& s);
// The same into s.gu [N, 2F] and s.h [N, F] allocated by the caller (who may have scratch of its
// own above them in the arena).
void mlp_forward_saved(const Ctx&, const MlpW&, Act x, int64_t N, float* y, float beta, MlpSaved& s);
// The forward without its down projection: x [N, d] -> s.gu [N, 2F], s.h [N, F] (the caller's
// buffers), the same bits as mlp_forward's (selective recompute rebuilds them for the backward).
void mlp_hidden(const Ctx&, const MlpW&, Act x, int64_t N, MlpSaved& s);
// dy: [N, d] -> dx: [N, d] (overwrite, or += when dx_accum)
void mlp_backward(const Ctx&, const MlpW&, const MlpSaved& s, int64_t N, const float* dy, float* dx, bool dx_accum);

}  // namespace trex::model
