// DeepSeekMoE layer in named stages: route -> dispatch (permute tokens so each expert's rows are
// contiguous) -> grouped expert GEMMs (gate|up, SwiGLU, down) -> combine (probability-weighted
// sum back to token order), plus the shared experts on every token. Dispatch and combine are
// each other's adjoint and share one handle (the routing map and the row permutation).
// Dropless: every (token, slot) pair is computed. Parameter gradients accumulate.
//
// Where the routed rows are computed is the dispatcher's business (model/moe_dispatch.h): every
// expert on this rank (LocalDispatcher) or the experts split over an expert-parallel group
// (AllToAllDispatcher: the shared experts run while the rows are in flight). The layer reads
// route -> dispatch -> experts -> combine once for both. Gradients land only in the slab ranges of
// the experts computed here.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>
#include "model/config.h"
#include "model/linear.h"
#include "model/mlp.h"
#include "model/moe_dispatch.h"
#include "model/params.h"
#include "model/router.h"

namespace trex::model {

struct MoeSaved {
  const float* x = nullptr;  // [N, d]
  RouterOut route;                   // backend memory (the router runs on the backend)
  const float* probs_dev = nullptr;  // route.probs
  Dispatch disp;
  MoeRoute local;       // the rows computed here (the dispatcher's plan)
  float* gu = nullptr;  // [Rl, 2F] local rows
  float* h = nullptr;   // [Rl, F] (null under MoeIn::recompute_act: the backward recomputes it)
  // The routed experts' outputs before weighting [N*K, d], sorted rows, kept only for the router
  // probabilities' gradient (dy . y = p dout . y, kern::moe_probs_bwd); null under
  // MoeIn::recompute_out: the experts' backward takes dy . y as dh . h (model/moe.cpp).
  float* y = nullptr;
  MlpSaved shared;  // the shared experts' input and activations (gu, h null under recompute_shared)
};

struct MoeIn {
  const ModelConfig* cfg;
  const LayerParams* p;
  const float* P;
  const bf16* Pb;
  float* G;
  const float* bias;  // [E] e_score_correction_bias (backend memory)
  int64_t B, T;
  double aux_alpha = 0;   // sequence-wise aux loss coefficient (0 = off)
  float aux_grad_scale = 1.f;
  const int32_t* hash_idx = nullptr;  // [N, K] fixed experts (DeepSeek-V4 hash layers) or null (host memory)
  float swiglu_limit = 0.f;           // clamp of routed and shared experts (V4), 0 = none
  bool recompute_act = false;         // selective recompute "moe_act": the experts' h is not kept
  bool recompute_shared = false;      // selective recompute "shared_experts": their gu, h are not kept
  bool recompute_out = false;         // selective recompute "moe_out": the routed experts' y is not kept
  const MoeDispatcher* dispatcher = nullptr;  // where the routed rows go (AllToAll: a collective)
  int64_t slab_first = 0;  // the first routed expert the weight slab holds (expert-sharded models)
  // Sequence parallel (model/seq_parallel.h): x holds the token rows [n0, n0 + rows) of the B x T
  // batch (rows < 0: all B T of them) and seq_sum sums the aux loss's [B, E] selection counts over
  // the shards (a collective of the tp group); the aux loss returned is this shard's part.
  int64_t n0 = 0, rows = -1;
  std::function<void(double*, size_t)> seq_sum = {};
  // Context parallel (model/context_parallel.h): the B x T tokens are this rank's parts of B
  // sequences of T_seq tokens; seq_sum then sums the counts over the cp group. 0: T.
  int64_t T_seq = 0;
  int64_t tokens() const { return rows >= 0 ? rows : B * T; }
};

// x: [N, d] -> out: [N, d]; returns the aux loss (0 when off); adds expert loads into `load` [E].
double moe_forward(const Ctx&, const MoeIn&, const float* x, float* out, MoeSaved& s, int64_t* load);
// dout: [N, d] -> dx: [N, d] (overwrite)
void moe_backward(const Ctx&, const MoeIn&, const MoeSaved& s, const float* dout, float* dx);

}  // namespace trex::model
