// Model configuration of the DeepSeek-V3 family, read from a Hugging Face config.json (or the
// [model] table of a trex TOML file, which holds the same keys). Every value trex cannot compute
// exactly is rejected at load time with the field name and what is supported.
#pragma once
#include <cstdint>
#include <set>
#include <string>
#include <vector>
#include <nlohmann/json_fwd.hpp>

namespace trex::model {

// Activation recompute of a training step (TrainOptions::recompute, [train] recompute): None keeps
// every layer's activations from the forward to the backward; Full keeps only each decoder
// layer's input and replays the layer's forward just before its backward (the gradients are
// bitwise the same; the step runs the layers' forward twice). Selective drops and replays only
// the modules of TrainOptions::recompute_modules (Megatron-Core's `--recompute-granularity
// selective`), never the attention core: the same gradients, a smaller extra cost.
enum class Recompute { None, Full, Selective };

// Modules of selective recompute (bits of TrainOptions::recompute_modules; [train]
// recompute_modules, named as Megatron-Core's --recompute-modules).
//   kRecomputeMoe ("moe"): a layer's whole MoE block (router, dispatch, routed and shared experts,
//   combine) keeps only its input; its forward is replayed just before its backward.
//   kRecomputeMoeAct ("moe_act"): the routed experts' SwiGLU output h [rows, F] is not kept; the
//   backward computes it again from the kept gate|up product (one elementwise pass per layer).
//   kRecomputeMoeOut ("moe_out"): the routed experts' outputs y [rows, d], kept only for the router
//   probabilities' gradient (dy . y), are not kept; the experts' backward takes that gradient as
//   dh . h (dh = dy W_down, the down projection's input gradient it computes anyway): no GEMM
//   more, the same value up to rounding (not bitwise: a dot over the F intermediate columns
//   instead of the d outputs, and in bf16 runs dh comes from dy rounded to bf16).
//   kRecomputeSharedExperts ("shared_experts"): the shared experts' gate|up product and SwiGLU
//   output ([tokens, 3 x shared width]) are not kept; the backward runs their gate|up GEMM and
//   SwiGLU again (a third of the shared experts' forward).
//   kRecomputeMlaUpProj ("mla_up_proj"; DeepSeek-V4): the query up-projection's output (q_b of
//   q_res, [N, heads x head_dim]) is not kept; the backward runs q_b again (one GEMM a layer).
//   kRecomputeMhc ("mhc"; DeepSeek-V4): of the hyper-connections only the layer's input streams,
//   its block outputs and the post / comb mixes are kept; the streams between the attention and
//   the MoE, and each mix's input row, its rstd and mix logits, are computed again in the backward
//   (elementwise passes and the small mix projection; DeepSeek's mHC paper recomputes them too).
// The DeepSeek-V4-only modules are refused at load for other models.
enum RecomputeModule : unsigned {
  kRecomputeMoe = 1u << 0,
  kRecomputeMoeAct = 1u << 1,
  kRecomputeMlaUpProj = 1u << 2,
  kRecomputeMhc = 1u << 3,
  kRecomputeSharedExperts = 1u << 4,
  kRecomputeMoeOut = 1u << 5,
};

// Stage of the lightning indexer's training (TrainOptions::indexer_stage, [train] indexer_stage;
// DeepSeek-V3.2 report, "DeepSeek Sparse Attention"). Sparse: the attention sees the indexer's
// top-k, every tensor trains, the indexer from its KL loss over the selected keys only. DenseWarmup:
// the attention sees every causal key, only the indexer trains (KL over every causal key).
enum class IndexerStage { Sparse, DenseWarmup };

enum class ScoringFunc { Sigmoid, Softmax, SqrtSoftplus };
enum class TopkMethod { NoauxTc, Greedy, GroupLimitedGreedy };

struct RopeScaling {
  bool yarn = false;  // false: plain RoPE
  double factor = 1.0, beta_fast = 32.0, beta_slow = 1.0, mscale = 1.0, mscale_all_dim = 0.0;
  int64_t original_max_position_embeddings = 4096;
  bool truncate = true;
  double attention_factor = -1;  // > 0: given explicitly (cos/sin factor); else derived from mscale
};

// DeepSeek-V4 attention kinds per layer (HF layer_types; original compress_ratios 0 / 4 / 128).
enum class AttnKind { Sliding, CSA, HCA };

// The DeepSeek-V4 part of a config (model_type "deepseek_v4"; HF DeepseekV4Config names).
struct V4Config {
  int64_t head_dim = 0;                   // q / kv head dim (one shared KV head: K = V)
  int64_t o_groups = 0, o_lora_rank = 0;  // grouped low-rank output projection
  int64_t sliding_window = 0;             // keys t-W+1 .. t
  int64_t csa_rate = 4, hca_rate = 128;   // compress_rates
  int64_t index_n_heads = 0, index_head_dim = 0, index_topk = 0;
  double compress_rope_theta = 160000.0;
  RopeScaling compress_rope;              // YaRN of the compressed layers (attention_factor 1)
  int64_t hc_mult = 1, hc_sinkhorn_iters = 1;
  double hc_eps = 1e-6;
  double swiglu_limit = 0;                // 0 = no clamp
  std::vector<AttnKind> attn;             // [num_hidden_layers + mtp_layers]
  std::vector<char> hash;                 // [num_hidden_layers + mtp_layers] 1 = hash_moe (tid2eid routing)
  // MTP blocks trex instantiates (0, or num_nextn_predict_layers when the run trains MTP: see
  // with_mtp). They follow the main layers in attn / hash and in the parameter layout; their
  // attention is sliding-window only (the release has no compressor tensors under mtp.*).
  int64_t mtp_layers = 0;
  int64_t rate(int64_t l) const { return attn[l] == AttnKind::CSA ? csa_rate : attn[l] == AttnKind::HCA ? hca_rate : 0; }
};

// The DeepSeek-V3.2 part of a config (model_type "deepseek_v32"; transformers' DeepseekV32Config):
// the lightning indexer that picks, per query, the index_topk tokens MLA attends (DSA).
struct V32Config {
  int64_t index_n_heads = 0, index_head_dim = 0, index_topk = 0;
};

struct ModelConfig {
  std::string model_type = "deepseek_v3";
  int64_t vocab_size = 0, hidden_size = 0, num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t q_lora_rank = 0;  // 0 = null (plain q_proj)
  int64_t kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  int64_t intermediate_size = 0, moe_intermediate_size = 0;
  int64_t n_routed_experts = 0, n_shared_experts = 0, num_experts_per_tok = 0;
  int64_t first_k_dense_replace = 0, n_group = 1, topk_group = 1;
  TopkMethod topk_method = TopkMethod::NoauxTc;
  ScoringFunc scoring_func = ScoringFunc::Sigmoid;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool rope_interleave = true;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 4096;
  double initializer_range = 0.02;
  int64_t num_nextn_predict_layers = 0;  // MTP layers of the checkpoint (trained with mtp_loss_weight > 0)
  // DeepSeek-V3 MTP layers trex instantiates (0, or num_nextn_predict_layers when the run trains
  // them: see with_mtp): decoder layers num_hidden_layers + k with their own enorm, hnorm,
  // eh_proj and shared_head (model/mtp_v3.h). V4 keeps its count in v4.mtp_layers.
  int64_t v3_mtp_layers = 0;
  // The checkpoint's MTP layers have no shared_head.head: it is lm_head (vLLM's reading of such
  // checkpoints). The MTP head then uses lm_head's tensor (one tensor, both gradients), and a
  // save writes no shared_head.head. Set by load_config_json from the checkpoint's tensor names.
  bool v3_mtp_head_tied = false;
  V4Config v4;                           // used when is_v4()
  V32Config v32;                         // used when is_v32()

  // Derived.
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  bool is_v4() const { return model_type == "deepseek_v4"; }
  bool is_v2() const { return model_type == "deepseek_v2"; }  // no e_score_correction_bias
  bool is_v32() const { return model_type == "deepseek_v32"; }  // MLA over the indexer's top-k tokens
  bool is_moe_layer(int64_t l) const { return n_routed_experts > 0 && l >= first_k_dense_replace; }
  // Some layer has a dense SwiGLU MLP (V3 first_k_dense_replace layers; V4 has none).
  bool has_dense_mlp() const { return !is_v4() && (n_routed_experts == 0 || first_k_dense_replace > 0); }
  int64_t shared_intermediate() const { return moe_intermediate_size * n_shared_experts; }
  // Layers with a lightning indexer (train.indexer_loss_weight trains them): DeepSeek-V3.2 every
  // decoder layer (MTP layers included), DeepSeek-V4 its compressed_sparse_attention layers; else 0.
  int64_t indexer_layers() const;

  // Parameter counts (all, and active per token: top-k routed experts + shared), MTP layers or
  // blocks included when instantiated (with_mtp).
  int64_t num_params() const;
  int64_t num_active_params() const;
  // Training FLOPs per token for a sequence of T tokens: 6 x active matmul params (embedding
  // lookup excluded, LM head included) + the causal attention term 6 * H * (dqk + dv) * T / 2 * L.
  // DeepSeek-V4: the attention term counts the keys actually attended (v4_attn_flops_per_token).
  // DeepSeek-V3.2: the keys attended are min(t, index_topk), plus the indexer's forward-only FLOPs.
  double train_flops_per_token(int64_t T) const;
};

// The config with n MTP blocks instantiated (n <= num_nextn_predict_layers): DeepSeek-V4's
// (v4.mtp_layers) or DeepSeek-V3's (v3_mtp_layers); unchanged when n == 0.
ModelConfig with_mtp(const ModelConfig& c, int64_t n);

// Parses a config object; `where` names the source (file path) in error messages.
// used (optional): receives every top-level key the parser looks at.
ModelConfig parse_config(const nlohmann::json& j, const std::string& where, std::set<std::string>* used = nullptr);
ModelConfig parse_config_v4(const nlohmann::json& j, const std::string& where,  // model/config_v4.cpp
                            std::set<std::string>* used = nullptr);
// DeepSeek-V2 / V2-Lite / V2.5 (model/config_v2.cpp): transformers' DeepseekV2Config keys and
// defaults, read into the V3 fields (softmax router, no router bias); what V2 computes
// differently is refused there naming the field.
ModelConfig parse_config_v2(const nlohmann::json& j, const std::string& where, std::set<std::string>* used = nullptr);
// Its config.json as transformers' save_pretrained writes it (DeepseekV2ForCausalLM).
std::string config_to_json_v2(const ModelConfig& c);
// DeepSeek-V3.2 (model/config_v32.cpp): transformers' DeepseekV32Config keys and defaults, read
// into the V3 fields plus v32; what trex cannot compute as transformers does is refused there.
ModelConfig parse_config_v32(const nlohmann::json& j, const std::string& where, std::set<std::string>* used = nullptr);
std::string config_to_json_v32(const ModelConfig& c);  // as save_pretrained writes it
// Top-level config.json keys: those the DeepSeek-V3 / Kimi-K2 / DeepSeek-V4 parsers look at, those
// the Hugging Face classes know and trex does not use (bos_token_id, use_cache, architectures,
// quantization_config: read by the weight loader), and both. A [model] key of a run config
// outside known_config_keys() is an error (a typo).
const std::vector<std::string>& read_config_keys();
const std::vector<std::string>& ignored_config_keys();
const std::vector<std::string>& known_config_keys();
// Keys of config j that trex does not use (its parser for j's model_type never looks at them),
// leaving out pure metadata (architectures, transformers_version, torch_dtype, ...); sorted.
std::vector<std::string> unused_config_keys(const nlohmann::json& j, const std::string& where);
// The same from the keys a parse looked at (parse_config's `used`).
std::vector<std::string> not_used(const nlohmann::json& j, const std::set<std::string>& used);
// One rope_parameters / rope_scaling block (rope_type default or yarn) into y and *theta.
void parse_rope_block(const nlohmann::json& rs, const std::string& where, const std::string& field, RopeScaling& y,
                      double* theta);
// Reads a config.json; the keys trex does not use are listed once (one info line).
ModelConfig load_config_json(const std::string& path);
std::string scoring_name(ScoringFunc);
// DeepSeek-V4 counts (model/config_v4.cpp): parameters (all, or active per token), and the
// attention + indexer training FLOPs per token for sequences of T tokens.
int64_t v4_num_params(const ModelConfig& c, bool active);
double v4_attn_flops_per_token(const ModelConfig& c, int64_t T);
std::string topk_method_name(TopkMethod);
// The keys every save_pretrained config.json of the MLA + MoE families (DeepSeek-V2, V3, V3.2)
// opens with, in that order: architectures and model_type as given, then the sizes through
// qk_nope_head_dim (q_lora_rank null when 0). Each family's writer adds the rest in its order.
void mla_moe_config_keys(nlohmann::ordered_json& j, const ModelConfig& c, const char* architecture,
                         const char* model_type);
// transformers >= 5's rope_parameters of the V2 / V3.2 writers: rope_type ("yarn" or "default")
// and rope_theta, plus YaRN's factor, original_max_position_embeddings, beta_fast / slow, mscale,
// mscale_all_dim (and truncate = false where it is off).
nlohmann::ordered_json rope_parameters_json(const ModelConfig& c);

}  // namespace trex::model
