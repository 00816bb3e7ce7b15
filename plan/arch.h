// The planner's view of a model architecture: per decoder layer, how many parameters it holds
// (replicated, tensor-parallel or expert-parallel), how many FLOPs a token costs in it, which
// tensors the backward pass needs saved, and how much memory-bound traffic it makes. Built from a
// model::ModelConfig (the same parser that builds the model): DeepSeek-V3 family or DeepSeek-V4.
//
// Conventions: every per-token figure is for one token of a training sequence, before any
// parallel split; "fwd" FLOPs are forward only (training = fwd + 2 x fwd for the backward).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>
#include "model/config.h"

namespace trex::plan {

// Attention of a layer. MLA: DeepSeek-V3 multi-head latent attention over the causal context.
// V4 layers (model::V4Config::attn): SlidingWindow, CSA (compressed sparse, compress rate 4,
// indexer top-k), HCA (heavily compressed, rate 128, dense over the compressed entries); every V4
// layer also attends its sliding window.
enum class AttnKind { MLA, SlidingWindow, CSA, HCA };
const char* attn_kind_name(AttnKind k);

// Shape of the attention core (QK^T and PV) of a layer.
struct AttnShape {
  AttnKind kind = AttnKind::MLA;
  int64_t heads = 0, qk_dim = 0, v_dim = 0;  // per head
  int64_t window = 0;                        // V4 sliding window (keys), 0 = none
  int64_t compress_ratio = 0;                // V4: tokens per compressed entry
  int64_t index_topk = 0;                    // CSA: compressed entries kept per query
  int64_t index_heads = 0, index_dim = 0;    // CSA indexer scoring (ReLU scores over entries)
};

// Mean over the positions 1..T of one causal sequence of the keys a query attends.
double mean_attended_keys(const AttnShape& a, int64_t T);
// Forward FLOPs per token of the attention core for sequences of T tokens, averaged over
// positions: 2*H*(dqk + dv) per attended key, plus for CSA the indexer's 2*Hi*di per compressed
// entry scored (indexer_fwd_flops).
double attn_core_fwd_flops(const AttnShape& a, int64_t T);
// The CSA indexer's part of attn_core_fwd_flops: 2*Hi*di per compressed entry formed so far
// (0 for other kinds).
double indexer_fwd_flops(const AttnShape& a, int64_t T);

// What the kernels compute, for the time (the FLOPs above are the model's, for MFU). slot_pad 0:
// the attended keys (trex's kernels run each query over its own key list). slot_pad > 0: a sparse
// kernel that runs every query over a fixed slot list whatever its position, the list padded to a
// multiple of slot_pad (FlashMLA's sparse kernels and cuDNN's sparse backward as Megatron-Core
// calls them for DeepSeek-V3.2 and V4: the causally invalid slots are masked, not skipped): the
// sliding window plus the index top-k (CSA; DeepSeek-V3.2 the top-k alone) or every compressed
// entry of the row (HCA). Dense MLA is the attended keys either way.
double kernel_attended_keys(const AttnShape& a, int64_t T, int64_t slot_pad);
// The CSA indexer's scoring as its kernel runs: with slot_pad > 0 every compressed entry of the
// row for every query (the fused scoring writes [T, T / rate] scores), else indexer_fwd_flops.
double indexer_kernel_flops(const AttnShape& a, int64_t T, int64_t slot_pad);

// Context parallelism (plan/layout.h): what one layer's attention exchanges over a cp group for
// one sequence of T tokens on one device of a tp group, in elements, each direction (forward:
// keys and values; backward: their gradients):
//   gathered  all-gathered over the group (the full buffer; each rank sends its share): MLA the
//             keys and values of the device's heads, H (dqk + dv) / tp per token (Megatron-Core's
//             ring attention passes K and V; the heads are split over tp; DeepSeek-V3.2 also the
//             indexer's keys, index_dim per token); CSA / HCA the compressed entries (T / rate of dqk each;
//             CSA also the indexer's keys, index_dim each)
//   halo      point to point from the neighbouring rank: the sliding window's keys (V4 layers:
//             window rows of dqk for each of a rank's two chunks)
// Time (plan/timing.cpp) moves the gathered buffer as an all-gather would ((cp-1)/cp of it per
// rank, the volume of a ring too); memory (plan/memory.cpp) holds what ring attention holds: two
// chunks of 1/cp of it (the one in use and the next in flight), and as much again for their
// gradients in the backward.
struct CpExchange {
  double gathered = 0, halo = 0;
};
CpExchange cp_exchange_elems(const AttnShape& a, int64_t T, int64_t tp = 1);

// A tensor the backward pass reads, saved per token during the forward.
struct SavedTensor {
  std::string name;
  double elems = 0;       // elements per token
  int bytes = 2;          // bytes per element as stored by a bf16 run
  bool fp8_ok = false;    // a GEMM / SwiGLU input that an FP8 recipe caches in 1 byte (+ scales)
  bool selective = false; // dropped and recomputed under selective recompute
  bool routed = false;    // per routed copy of the token (scales with the busiest expert rank's load)
  bool mlp = false;       // dropped under recompute=mlp (dense MLP internals, routed SwiGLU output)
};

// The modules of a layer as a framework launches them (plan/host.h counts their kernels).
struct LayerModules {
  bool v4 = false;             // DeepSeek-V4 layer (hyper-connections, grouped output)
  bool q_lora = false;         // low-rank query: q down-projection + its norm
  bool compressor = false;     // V4 compressed attention (CSA, HCA)
  bool indexer = false;        // V3.2 / V4 CSA indexer (forward only)
  bool shared_expert = false;  // MoE layer with shared experts
};

struct LayerCost {
  std::string kind;  // e.g. "mla+moe", "csa+moe(hash)"
  AttnShape attn;
  bool moe = false;
  // Parameters. dense: attention, norms, dense MLP, shared experts, router, V4 compressors and
  // hyper-connections (replicated over data parallel, split by tensor parallel). experts: all
  // routed experts of the layer (split by expert parallel).
  double dense_params = 0, expert_params = 0;
  double active_matmul_params = 0;  // matmul weights a token goes through (6x of these = FLOPs)
  double fwd_only_matmul_params = 0;  // of those, run forward only (V4 indexer: its selection carries no gradient)
  // Forward FLOPs per token by efficiency class.
  double gemm_fwd = 0;      // dense matmuls (2 x dense matmul params a token uses)
  double expert_fwd = 0;    // routed-expert grouped GEMMs (2 x top-k x 3 x d x I)
  double upproj_fwd = 0;    // part of gemm_fwd that selective recompute re-runs (MLA up-projections)
  double mlp_gemm_fwd = 0;  // part of gemm_fwd that recompute=mlp re-runs (the dense MLP's fc1, fc2)
  double swiglu_bytes_fwd = 0, swiglu_routed_bytes_fwd = 0;  // SwiGLU traffic: dense MLP; routed experts (x load)
  double bf16_gemm_fwd = 0; // part of gemm_fwd that stays bf16 under every low-precision recipe
                            // (the router; V4's hyper-connection mixing)
  double elem_bytes_fwd = 0;      // memory-bound traffic per token (norms, RoPE, SwiGLU, router, permute)
  double elem_sel_bytes_fwd = 0;  // part of it that selective recompute re-runs
  // GEMM operands a low-precision recipe quantizes (plan/precision.h), elements per token: every
  // low-precision linear layer's input (forward) and its output gradient (backward; forward-only
  // linears such as the indexer's have none). routed: the routed experts', over the token's k
  // copies (scaled by the busiest rank's load). The router and V4's hyper-connection mixing stay
  // bf16 and are not counted.
  double q_in = 0, q_in_routed = 0, q_grad = 0, q_grad_routed = 0;
  std::vector<SavedTensor> saved;
  double input_elems = 0;   // layer input per token (what full recompute keeps): d, or hc x d for V4
  // MoE routing (for the all-to-all).
  int64_t n_experts = 0, topk = 0, n_group = 1, topk_group = 1;
  bool hash_routed = false;
  // Tensor-parallel collectives per layer per direction (each of [tokens, d]).
  int tp_collectives = 2;
  LayerModules modules;
};

struct ArchModel {
  std::string name;         // "deepseek-v3", a config path, ...
  std::string family;       // "deepseek_v3" | "deepseek_v4"
  std::string source;       // where the figures come from
  int64_t hidden = 0, vocab = 0, heads = 0, hc_mult = 1;
  int64_t n_experts = 0, topk = 0;
  std::vector<LayerCost> layers;
  LayerCost mtp_block;      // the decoder block of one MTP module (computed when mtp is on)
  double mtp_extra_params = 0;  // per module: projections, norms (V4: + its hc_head); embedding and head are shared
  double mtp_extra_matmul_params = 0;  // of which matmul weights a token goes through (V4: h_proj once per stream)
  int64_t mtp_modules = 0;  // modules in the checkpoint (num_nextn_predict_layers)
  double embed_params = 0, head_params = 0;
  double final_norm_params = 0;  // held with the head: final norm (V4: + the hc_head stream collapse)
  double final_mix_params = 0;   // of which matmul weights a token goes through (V4 hc_head projection)
  bool tied_embeddings = false;
  // The parsed config the figures come from (arch_from_config): what trex's own engine would
  // build, for the memory of a cpu-this plan (plan/memory.h).
  std::shared_ptr<const model::ModelConfig> config;

  int64_t n_layers() const { return (int64_t)layers.size(); }
  double total_params() const;   // all trained parameters (MTP modules excluded)
  double active_params() const;  // matmul parameters a token goes through (LM head in, embedding out)
  // Model FLOPs per trained token (the MFU numerator), as model::ModelConfig::train_flops_per_token
  // counts them: 6 x active matmul params + 3 x the forward attention-core FLOPs for sequences of T
  // tokens, the V4 indexer's scoring once (forward only: its selection carries no gradient). MTP
  // excluded (as in the published counts).
  double model_flops_per_token(int64_t T) const;
  int64_t residual_width() const { return hidden * hc_mult; }  // what a pipeline stage sends
};

// From the parsed config: DeepSeek-V3 family (deepseek_v3, kimi_k2 model types) or DeepSeek-V4
// (deepseek_v4; its MTP modules from num_nextn_predict_layers, as model::with_mtp builds them).
ArchModel arch_from_config(const model::ModelConfig& c, const std::string& name);

// Model name or path -> architecture. Names: deepseek-v2 (236B), deepseek-v2-lite (15.7B),
// deepseek-v3 (671B), deepseek-v3.2 (671B), deepseek-v4-flash, deepseek-v4-pro; a path is a
// Hugging Face config.json or a trex TOML run config ([model]).
ArchModel resolve_model(const std::string& name_or_path);
std::vector<std::string> builtin_model_names();
// The DeepSeek-V3 671B config.json values (huggingface.co/deepseek-ai/DeepSeek-V3).
model::ModelConfig deepseek_v3_config();
// DeepSeek-V3.2-Exp (deepseek_v32: V3 + the lightning indexer), DeepSeek-V2 (236B / 21B active)
// and V2-Lite (15.7B / 2.4B active), from their released config.json values (plan/arch.cpp).
model::ModelConfig deepseek_v32_config();
model::ModelConfig deepseek_v2_config();
model::ModelConfig deepseek_v2_lite_config();
// DeepSeek-V4-Flash (284B / 13B active announced) and V4-Pro (1.6T / 49B): Hugging Face
// deepseek_v4 config objects parsed by model::parse_config (sources in plan/arch.cpp).
model::ModelConfig deepseek_v4_flash_config();
model::ModelConfig deepseek_v4_pro_config();

}  // namespace trex::plan
