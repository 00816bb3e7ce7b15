// DeepSeekMoE layer in named stages: route -> dispatch (permute tokens so each expert's rows are
// contiguous) -> grouped expert GEMMs (gate|up, SwiGLU, down) -> combine (probability-weighted
// sum back to token order), plus the shared experts on every token. Dispatch and combine are
// each other's adjoint and share one handle (the routing map and the row permutation).
// Dropless: every (token, slot) pair is computed. Parameter gradients accumulate.
#pragma once
#include <cstdint>
#include <vector>
#include "model/config.h"
#include "model/linear.h"
#include "model/mlp.h"
#include "model/params.h"
#include "model/router.h"

namespace trex::model {

// The dispatch handle: rows sorted by expert.
struct Dispatch {
  std::vector<int64_t> offsets;  // [E + 1] first row of each expert
  int32_t* row_token = nullptr;  // [N*K] token of each sorted row
  int32_t* slot_row = nullptr;   // [N*K] sorted row of token n's k-th slot (n*K + k)
};

struct MoeSaved {
  const float* x = nullptr;  // [N, d]
  RouterOut route;
  Dispatch disp;
  float* gu = nullptr;  // [N*K, 2F] sorted rows
  float* h = nullptr;   // [N*K, F]
  float* y = nullptr;   // [N*K, d] expert outputs before weighting
  MlpSaved shared;
};

struct MoeIn {
  const ModelConfig* cfg;
  const LayerParams* p;
  const float* P;
  const bf16* Pb;
  float* G;
  const float* bias;  // [E] e_score_correction_bias
  int64_t B, T;
  double aux_alpha = 0;   // sequence-wise aux loss coefficient (0 = off)
  float aux_grad_scale = 1.f;
  const int32_t* hash_idx = nullptr;  // [N, K] fixed experts (DeepSeek-V4 hash layers) or null
  float swiglu_limit = 0.f;           // clamp of routed and shared experts (V4), 0 = none
};

// x: [N, d] -> out: [N, d]; returns the aux loss (0 when off); adds expert loads into `load` [E].
double moe_forward(const Ctx&, const MoeIn&, const float* x, float* out, MoeSaved& s, int64_t* load);
// dout: [N, d] -> dx: [N, d] (overwrite)
void moe_backward(const Ctx&, const MoeIn&, const MoeSaved& s, const float* dout, float* dx);

}  // namespace trex::model
