// DeepSeek-V3 multi-token prediction (MTP) layers, as the V3 / R1 / V3.1 releases ship them: layer
// num_hidden_layers + k - 1 is MTP depth k (1..D) with the tensors
//   model.layers.<L+k-1>.{enorm, hnorm}.weight [d], .eh_proj.weight [d, 2d],
//   .shared_head.norm.weight [d], .shared_head.head.weight [vocab, d]
// and a full decoder layer (attention + MoE, or a dense MLP where first_k_dense_replace says so)
// under the usual names. The release also stores .embed_tokens.weight, a copy of the main
// embedding: the MTP layers read model.embed_tokens (shared), and a save writes the copy back.
// Depth k, for token i (h_0 = the main model's last decoder-layer output, before model.norm):
//   x_k = eh_proj([enorm(embed[t_{i+k}]) ; hnorm(h_{k-1,i})])    (embedding first, as "eh" says)
//   h_k = decoder layer L+k-1 (x_k)       (same positions, mask and RoPE as the main layers)
//   logits_k = shared_head.head(shared_head.norm(h_k)), target t_{i+k+1}
//   loss = CE + mtp_loss_weight * mean_k CE_k
// Tokens past the end of their row (or of their document in a packed row) have no target at
// depth k; their input is their own token. Shapes: this rank's Nl token rows of d.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>
#include "model/linear.h"
#include "model/model.h"

namespace trex::model {

// What the V3 MTP forward / backward reads (Model::run_v3 builds it).
struct MtpV3In {
  const ModelConfig* cfg = nullptr;
  const ParamLayout* layout = nullptr;
  Ctx ctx;
  const float* P = nullptr;
  const bf16* Pb = nullptr;  // bf16 shadow (BF16 mode)
  float* G = nullptr;
  const Batch* b = nullptr;
  int64_t n0 = 0, Nl = 0;  // this rank's token rows [n0, n0 + Nl) of the batch's N
  float grad_scale = 0.f;
  double weight = 0;       // mtp_loss_weight
  bool backward = false;
  // Context parallel: local row i is token flat[n0 + i] of the batch b (the whole micro-batch;
  // flat covers the cp rank's tokens, n0 the sequence-parallel shard among them); null: n0 + i.
  const int64_t* flat = nullptr;
};

// Saved state of one depth.
struct MtpV3Saved {
  const int32_t *ids = nullptr, *tg = nullptr;  // [Nl] shifted input tokens and targets (backend memory)
  int64_t n_valid = 0;                    // targets of the whole micro-batch
  float *e = nullptr, *e_rstd = nullptr;  // [Nl, d] embedding rows, rstd [Nl]
  const float* h_prev = nullptr;          // [Nl, d] h_{k-1}
  float* h_rstd = nullptr;                // [Nl]
  float* cat = nullptr;                   // [Nl, 2d] [enorm(e) | hnorm(h_prev)]
  float* h = nullptr;                     // [Nl, d] h_k (the layer's output)
  float* rstdf = nullptr;  // [Nl] rstd of shared_head.norm(h_k) (the normed rows are not kept)
  float* dhf = nullptr;    // [Nl, d] gradient of the normed rows (backward)
};

// Runs decoder layer l on x [Nl, d] and returns its output [Nl, d] (arena).
using MtpLayerFwd = std::function<float*(int64_t l, float* x)>;
// Turns dx [Nl, d], the gradient of decoder layer l's output, into the gradient of its input (in
// place), adding the layer's parameter gradients.
using MtpLayerBwd = std::function<void(int64_t l, float* dx)>;

// Every depth's forward (and, in.backward, the head's gradients, fused with the CE as the main
// head does). h0: [Nl, d]. Returns the MTP loss of this rank's rows: the mean over depths of
// each depth's CE sum / its n_valid (summed over a tp group under sequence parallelism).
double mtp_v3_forward(const MtpV3In& in, const float* h0, std::vector<MtpV3Saved>& s, const MtpLayerFwd& layer);
// Every depth's backward, last depth first; dh0 [Nl, d] += the gradient of h0. grad_ready(L + k)
// after depth k's tensors are final (null: not called).
void mtp_v3_backward(const MtpV3In& in, std::vector<MtpV3Saved>& s, const MtpLayerBwd& layer, float* dh0,
                     const std::function<void(int64_t)>& grad_ready);

// Random init (Hugging Face rules: normal(0, initializer_range), norms 1) of the MTP layers'
// tensors only, with shared_head.head copied from lm_head (the head it shares in the release)
// where the model holds both: for checkpoints without MTP layers.
void init_mtp_v3_random(Model& m, uint64_t seed);

// The layer index of "model.layers.<l>.<rest>", or -1.
int64_t v3_layer_of(const std::string& name);
// "model.layers.<l>.embed_tokens.weight": the release's copy of the embedding in an MTP layer.
bool v3_mtp_embed_alias(const std::string& name, int64_t num_hidden_layers);

}  // namespace trex::model
