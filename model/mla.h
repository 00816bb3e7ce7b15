// Multi-head Latent Attention (DeepSeek-V2/V3), forward and backward side by side.
//   q    = q_b(rmsnorm(q_a(x)))  or  q_proj(x)                       [N, H, dn + dr]
//   kva  = kv_a_proj_with_mqa(x) = [latent | k_pe]                    [N, r + dr]
//   kv   = kv_b(rmsnorm(latent))  = per head [k_nope | v]             [N, H, dn + dv]
//   K    = [k_nope_h | rope(k_pe)] (k_pe shared by all heads), Q = [q_nope | rope(q_pe)]
//   out  = o_proj(attention(Q, K, V))                                  [N, d]
// The latent RMSNorms use eps 1e-6 (not rms_norm_eps), as the reference code does.
// Parameter gradients accumulate into the gradient slab; dx is overwritten.
#pragma once
#include <cstdint>
#include "model/config.h"
#include "model/context_parallel.h"
#include "model/linear.h"
#include "model/params.h"

namespace trex::model {

struct RopeTable {
  const float* cos = nullptr;  // [max_pos, dr/2]
  const float* sin = nullptr;
  int64_t max_pos = 0;
  bool interleaved = true;
  float softmax_scale = 1.f;   // qk_head_dim^-0.5 x YaRN mscale^2
};

// Everything a layer's attention needs from the model, for one micro-batch.
struct AttnIn {
  const ModelConfig* cfg;
  const LayerParams* p;
  const float* P;     // parameter slab
  const bf16* Pb;     // bf16 shadow (bf16 mode) or null
  float* G;           // gradient slab
  const RopeTable* rope;
  const int32_t* pos;  // [N] positions
  const int32_t* seg;  // [B, T] document ids, or null
  int64_t B, T;
  // Tensor parallel: this rank computes heads [rank * H / size, (rank + 1) * H / size) only (q_b /
  // q_proj and kv_b rows, o_proj columns). forward's `out` and backward's `dx` are then this
  // rank's partial sums (summed over the tp ranks they equal the whole layer's); the gradients of
  // the sliced weights touch only this rank's slice, those of q_a, kv_a and the latent norms are
  // partial sums too. The saved Q, K, V, O hold the local heads only.
  TpSlice tp{};
  // DeepSeek-V3.2 lightning indexer loss (model/v32_indexer.h; off by default). ix_loss: the
  // forward computes the indexer's KL loss and recall (MlaSaved::ix_*), the backward its gradient
  // times ix_grad into the indexer's tensors. ix_dense: the dense warm-up (attention over every
  // causal key of the query's document).
  bool ix_loss = false, ix_dense = false;
  float ix_grad = 0.f;
  // Context parallel (model/context_parallel.h; null: off): B x T are this rank's local tokens
  // (T = 2c per row), pos their own positions, seg their document ids. The normalized latents and
  // roped k_pe of every cp rank are all-gathered, so the saved K, V (and MlaSaved::latn_all) cover
  // the whole rows, [B, cp->split.T, ...]; the backward reduce-scatters their gradients.
  const CpAttn* cp = nullptr;
};

// Activations saved by forward for backward (allocated from the activation arena).
struct MlaSaved {
  const float* x = nullptr;               // [N, d] input (normed hidden; owned by the layer)
  float *qa = nullptr, *qa_rstd = nullptr, *qan = nullptr;  // q_lora path
  float *Q = nullptr;                     // [N, H, dqk] after RoPE
  float *lat = nullptr, *lat_rstd = nullptr, *latn = nullptr;  // [N, r] latent, rstd, normed
  float *K = nullptr, *V = nullptr, *O = nullptr, *lse = nullptr;
  float* latn_all = nullptr;              // context parallel: [B, T_full, r] every rank's normed latents
  // DeepSeek-V3.2 (model/v32_indexer.h): the selected keys of each (token, head) query and the
  // padded rows of the sparse attention ([N H, dqk + dv]).
  int64_t* off = nullptr;
  int32_t* idx = nullptr;
  float *Qp = nullptr, *KVp = nullptr, *Op = nullptr;
  // DeepSeek-V3.2 with AttnIn::ix_loss: per attended (query, key) pair, in the order of the key
  // lists, dKL/dscore = q - p (the indexer's queries and keys are recomputed, not kept); the
  // layer's indexer loss (mean over queries of KL(p || q)) and the main attention's mass inside
  // the indexer's top-k (mean over queries).
  float* ix_dI = nullptr;
  double ix_loss = 0, ix_recall = 0;
};

// Projections only: x: [N, d] -> s.Q [N, H, dqk] (RoPE applied), s.K [N, H, dqk], s.V [N, H, dv]
// and the saved latents (used by forward, and by generation with a KV cache).
void mla_project(const Ctx&, const AttnIn&, const float* x, MlaSaved& s);
// x: [N, d] -> out: [N, d]
void mla_forward(const Ctx&, const AttnIn&, const float* x, float* out, MlaSaved& s);
// dout: [N, d] -> dx: [N, d] (overwrite); parameter grads += into in.G
void mla_backward(const Ctx&, const AttnIn&, const MlaSaved& s, const float* dout, float* dx);

}  // namespace trex::model
