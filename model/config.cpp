#include "model/config.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <nlohmann/json.hpp>
#include "core/error.h"
#include "core/log.h"
#include "io/safetensors.h"
#include "model/config_reader.h"

namespace trex::model {

using nlohmann::json;
using namespace cfgread;

void parse_rope_block(const json& rs, const std::string& where, const std::string& field, RopeScaling& y,
                      double* theta) {
  if (rs.contains("rope_theta") && !rs["rope_theta"].is_null()) {
    TREX_USER_CHECK(rs["rope_theta"].is_number(), kFixHint, where, ": ", field, ".rope_theta must be a number");
    *theta = rs["rope_theta"].get<double>();
  }
  std::string type = "default";
  if (rs.contains("rope_type") && rs["rope_type"].is_string()) type = rs["rope_type"];
  else if (rs.contains("type") && rs["type"].is_string()) type = rs["type"];
  if (type == "default") return;
  TREX_USER_CHECK(type == "yarn", "use rope_type \"yarn\" or \"default\" (DeepSeek uses yarn)", where, ": ",
                  field, " type '", type, "' is not supported");
  Reader r{rs, where};
  y.yarn = true;
  y.factor = r.f64("factor", 1.0, true);
  TREX_USER_CHECK(y.factor >= 1.0, kFixHint, where, ": ", field, ".factor must be >= 1, got ", y.factor);
  y.beta_fast = r.f64("beta_fast", 32.0);
  y.beta_slow = r.f64("beta_slow", 1.0);
  y.mscale = r.f64("mscale", 1.0);
  y.mscale_all_dim = r.f64("mscale_all_dim", 0.0);
  y.original_max_position_embeddings = r.i64("original_max_position_embeddings", y.original_max_position_embeddings,
                                             false, 1);
  y.truncate = r.boolean("truncate", true);
  if (r.has("attention_factor")) {
    y.attention_factor = r.f64("attention_factor", -1.0);
    TREX_USER_CHECK(y.attention_factor > 0, kFixHint, where, ": ", field, ".attention_factor must be > 0");
  }
}

namespace {

void parse_rope(const json& j, const std::string& where, ModelConfig& c, std::set<std::string>* used) {
  if (used) used->insert({"rope_parameters", "rope_scaling"});
  // transformers >= 5 writes rope_parameters {rope_type, rope_theta, factor, ...}; DeepSeek's
  // own checkpoints write rope_theta and rope_scaling {type|rope_type, factor, ...}.
  const json* rs = nullptr;
  const char* field = "rope_parameters";
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) rs = &j["rope_parameters"];
  else if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) rs = &j["rope_scaling"], field = "rope_scaling";
  if (!rs) return;
  c.rope_scaling.original_max_position_embeddings = c.max_position_embeddings;
  parse_rope_block(*rs, where, field, c.rope_scaling, &c.rope_theta);
  TREX_USER_CHECK(c.rope_scaling.attention_factor < 0, "remove rope_scaling.attention_factor", where,
                  ": rope_scaling.attention_factor is not supported for DeepSeek-V3 (it uses mscale / mscale_all_dim)");
}

}  // namespace

ModelConfig parse_config(const json& j, const std::string& where, std::set<std::string>* used) {
  TREX_USER_CHECK(j.is_object(), kFixHint, where, ": model config must be a JSON object");
  Reader r{j, where, used};
  ModelConfig c;
  c.model_type = r.str("model_type", "deepseek_v3");
  if (c.model_type == "deepseek_v4") return parse_config_v4(j, where, used);
  if (c.model_type == "deepseek_v2") return parse_config_v2(j, where, used);
  if (c.model_type == "deepseek_v32") return parse_config_v32(j, where, used);
  TREX_USER_CHECK(c.model_type == "deepseek_v3" || c.model_type == "kimi_k2",
                  "this build trains model_type deepseek_v3 (also R1, V3.1, Kimi-K2, Moonlight), deepseek_v2 (also "
                  "V2-Lite, V2.5), deepseek_v32 (V3.2) and deepseek_v4", where,
                  ": model_type '", c.model_type, "' is not supported");
  c.vocab_size = r.i64("vocab_size", 0, true, 1);
  c.hidden_size = r.i64("hidden_size", 0, true, 1);
  c.num_hidden_layers = r.i64("num_hidden_layers", 0, true, 1);
  c.num_attention_heads = r.i64("num_attention_heads", 0, true, 1);
  int64_t kvh = r.i64("num_key_value_heads", c.num_attention_heads, false, 1);
  TREX_USER_CHECK(kvh == c.num_attention_heads, "set num_key_value_heads = num_attention_heads", where,
                  ": MLA expands the latent to every head; num_key_value_heads (", kvh,
                  ") != num_attention_heads (", c.num_attention_heads, ") is not supported");
  c.q_lora_rank = r.has("q_lora_rank") ? r.i64("q_lora_rank", 0, false, 1) : 0;
  c.kv_lora_rank = r.i64("kv_lora_rank", 0, true, 1);
  c.qk_nope_head_dim = r.i64("qk_nope_head_dim", 0, true, 0);
  c.qk_rope_head_dim = r.i64("qk_rope_head_dim", 0, true, 0);
  TREX_USER_CHECK(c.qk_rope_head_dim % 2 == 0, kFixHint, where, ": qk_rope_head_dim must be even, got ",
                  c.qk_rope_head_dim);
  TREX_USER_CHECK(c.qk_head_dim() > 0, kFixHint, where, ": qk_nope_head_dim + qk_rope_head_dim must be > 0");
  c.v_head_dim = r.i64("v_head_dim", 0, true, 1);
  c.intermediate_size = r.i64("intermediate_size", 0, true, 1);
  c.n_routed_experts = r.i64("n_routed_experts", 0, false, 0);
  c.first_k_dense_replace = r.i64("first_k_dense_replace", 0, false, 0);
  int64_t freq = r.i64("moe_layer_freq", 1, false, 1);
  TREX_USER_CHECK(freq == 1, "set moe_layer_freq = 1", where, ": moe_layer_freq ", freq,
                  " is not supported (DeepSeek-V3 uses 1)");
  // MoE fields: some layer has routed experts (MTP layers num_hidden_layers + k included).
  const int64_t nextn = r.i64("num_nextn_predict_layers", 0, false, 0);
  if (c.n_routed_experts > 0 && c.first_k_dense_replace < c.num_hidden_layers + nextn) {
    c.moe_intermediate_size = r.i64("moe_intermediate_size", 0, true, 1);
    c.n_shared_experts = r.i64("n_shared_experts", 0, false, 0);
    c.num_experts_per_tok = r.i64("num_experts_per_tok", 0, true, 1);
    c.n_group = r.i64("n_group", 1, false, 1);
    c.topk_group = r.i64("topk_group", 1, false, 1);
    std::string tm = r.str("topk_method", "noaux_tc");
    if (tm == "noaux_tc") c.topk_method = TopkMethod::NoauxTc;
    else if (tm == "greedy") c.topk_method = TopkMethod::Greedy;
    else if (tm == "group_limited_greedy") c.topk_method = TopkMethod::GroupLimitedGreedy;
    else TREX_USER_FAIL("allowed: noaux_tc, greedy, group_limited_greedy", where, ": topk_method '", tm, "' is not supported");
    std::string sf = r.str("scoring_func", "sigmoid");
    if (sf == "sigmoid") c.scoring_func = ScoringFunc::Sigmoid;
    else if (sf == "softmax") c.scoring_func = ScoringFunc::Softmax;
    else TREX_USER_FAIL("allowed: sigmoid, softmax", where, ": scoring_func '", sf, "' is not supported");
    c.norm_topk_prob = r.boolean("norm_topk_prob", true);
    c.routed_scaling_factor = r.f64("routed_scaling_factor", 1.0);
    const int64_t E = c.n_routed_experts;
    TREX_USER_CHECK(E % c.n_group == 0, kFixHint, where, ": n_routed_experts (", E,
                    ") must be divisible by n_group (", c.n_group, ")");
    TREX_USER_CHECK(c.topk_group <= c.n_group, kFixHint, where, ": topk_group (", c.topk_group,
                    ") must be <= n_group (", c.n_group, ")");
    if (c.topk_method == TopkMethod::NoauxTc)
      TREX_USER_CHECK(E / c.n_group >= 2, kFixHint, where,
                      ": noaux_tc scores each group by its top-2 experts, so every group needs >= 2 experts (",
                      E, " experts in ", c.n_group, " groups)");
    int64_t selectable = c.topk_method == TopkMethod::Greedy ? E : c.topk_group * (E / c.n_group);
    TREX_USER_CHECK(c.num_experts_per_tok <= selectable, kFixHint, where, ": num_experts_per_tok (",
                    c.num_experts_per_tok, ") exceeds the experts selectable (", selectable, ")");
  }
  c.max_position_embeddings = r.i64("max_position_embeddings", 4096, false, 1);
  c.rope_theta = r.f64("rope_theta", 10000.0);
  parse_rope(j, where, c, used);
  TREX_USER_CHECK(c.rope_theta > 1.0, kFixHint, where, ": rope_theta must be > 1, got ", c.rope_theta);
  c.rope_interleave = r.boolean("rope_interleave", true);
  c.rms_norm_eps = r.f64("rms_norm_eps", 1e-6);
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
  c.initializer_range = r.f64("initializer_range", 0.02);
  c.num_nextn_predict_layers = r.i64("num_nextn_predict_layers", 0, false, 0);
  std::string act = r.str("hidden_act", "silu");
  TREX_USER_CHECK(act == "silu", "set hidden_act = \"silu\"", where, ": hidden_act '", act, "' is not supported");
  TREX_USER_CHECK(!r.boolean("attention_bias", false), "set attention_bias = false", where,
                  ": attention_bias = true is not supported (DeepSeek-V3 has no attention biases)");
  TREX_USER_CHECK(r.f64("attention_dropout", 0.0) == 0.0, "set attention_dropout = 0", where,
                  ": attention dropout is not supported");
  if (c.num_nextn_predict_layers > 0)
    TREX_LOG_INFO(where, ": num_nextn_predict_layers = ", c.num_nextn_predict_layers,
                  "; the MTP layers are trained with [train] mtp_loss_weight > 0, else kept unchanged (saved back)");
  return c;
}

namespace {

// Keys read elsewhere (quantization_config: the weight loader) or that only describe the file.
const std::set<std::string>& metadata_keys() {
  static const std::set<std::string> k = {"architectures", "auto_map",       "transformers_version", "torch_dtype",
                                          "dtype",         "_name_or_path", "quantization_config"};
  return k;
}

}  // namespace

std::vector<std::string> not_used(const json& j, const std::set<std::string>& used) {
  std::vector<std::string> out;
  for (auto& [k, v] : j.items())
    if (!used.count(k) && !metadata_keys().count(k)) out.push_back(k);
  return out;  // json objects iterate in key order
}

const std::vector<std::string>& read_config_keys() {
  // tests/unit/test_config_keys.cpp checks that this list holds every key the parsers look at.
  static const std::vector<std::string> k = {
      "attention_bias", "attention_dropout", "compress_rate_csa", "compress_rate_hca", "compress_rates",
      "compress_ratios", "compress_rope_theta", "first_k_dense_replace", "hc_eps", "hc_mult", "hc_sinkhorn_iters",
      "head_dim", "hidden_act", "hidden_size", "index_head_dim", "index_n_heads", "index_topk", "initializer_range",
      "intermediate_size", "kv_lora_rank", "layer_types", "max_position_embeddings", "mlp_bias", "mlp_layer_types",
      "model_type", "moe_intermediate_size", "moe_layer_freq", "n_group", "n_routed_experts", "n_shared_experts",
      "norm_topk_prob", "num_attention_heads", "num_experts_per_tok", "num_hash_layers", "num_hidden_layers",
      "num_key_value_heads", "num_nextn_predict_layers", "o_groups", "o_lora_rank", "output_router_logits",
      "partial_rotary_factor", "q_lora_rank", "qk_head_dim", "qk_nope_head_dim", "qk_rope_head_dim", "rms_norm_eps",
      "rope_interleave", "rope_parameters", "rope_scaling", "rope_theta", "routed_scaling_factor", "scoring_func",
      "sliding_window", "swiglu_limit", "tie_word_embeddings", "topk_group", "topk_method", "v_head_dim",
      "vocab_size"};
  return k;
}

const std::vector<std::string>& ignored_config_keys() {
  static const std::vector<std::string> k = {
      "architectures", "auto_map", "transformers_version", "torch_dtype", "dtype", "_name_or_path",
      "quantization_config", "bos_token_id", "eos_token_id", "pad_token_id", "use_cache", "pretraining_tp",
      "ep_size", "aux_loss_alpha", "seq_aux", "router_aux_loss_coef", "output_attentions", "output_hidden_states",
      "return_dict", "is_encoder_decoder", "use_sliding_window", "max_window_layers", "scale_fmt"};
  return k;
}

const std::vector<std::string>& known_config_keys() {
  static const std::vector<std::string> k = [] {
    std::vector<std::string> all = read_config_keys();
    all.insert(all.end(), ignored_config_keys().begin(), ignored_config_keys().end());
    return all;
  }();
  return k;
}

std::vector<std::string> unused_config_keys(const json& j, const std::string& where) {
  std::set<std::string> used;
  parse_config(j, where, &used);
  return not_used(j, used);
}

namespace {

// A DeepSeek-V3-family checkpoint in dir whose first MTP layer has eh_proj but no
// shared_head.head (some releases and conversions omit it: it is lm_head). Only the tensor names
// of the safetensors headers are read; a directory without model.safetensors or its index (a bare
// config.json) says no.
bool mtp_head_omitted(const ModelConfig& c, const std::string& dir) {
  namespace fs = std::filesystem;
  if (c.is_v4() || c.num_nextn_predict_layers == 0 || dir.empty() || !fs::is_directory(dir)) return false;
  std::error_code ec;
  const fs::path d(dir);
  if (!fs::exists(d / "model.safetensors", ec) && !fs::exists(d / "model.safetensors.index.json", ec)) return false;
  const io::SafetensorsDir ck = io::SafetensorsDir::open(dir);
  const std::string pre = "model.layers." + std::to_string(c.num_hidden_layers) + ".";
  return ck.find(pre + "eh_proj.weight") && !ck.find(pre + "shared_head.head.weight");
}

}  // namespace

ModelConfig load_config_json(const std::string& path) {
  std::ifstream f(path);
  TREX_USER_CHECK(f.good(), "check the --model directory", path, ": cannot open model config");
  json j;
  try {
    j = json::parse(f);
  } catch (const json::exception& e) {
    TREX_USER_FAIL("the file must be valid JSON", path, ": not valid JSON: ", e.what());
  }
  std::set<std::string> used;
  ModelConfig c = parse_config(j, path, &used);
  c.v3_mtp_head_tied = mtp_head_omitted(c, std::filesystem::path(path).parent_path().string());
  if (c.v3_mtp_head_tied)
    TREX_LOG_INFO(path, ": the MTP layer has no shared_head.head; its head is lm_head (tied; saved without it)");
  std::string unused;
  for (const std::string& k : not_used(j, used)) unused += (unused.empty() ? "" : ", ") + k;
  if (!unused.empty()) TREX_LOG_INFO(path, ": keys trex does not use (ignored): ", unused);
  return c;
}

int64_t ModelConfig::indexer_layers() const {
  if (is_v32()) return num_hidden_layers + v3_mtp_layers;
  if (!is_v4()) return 0;
  int64_t n = 0;
  for (AttnKind k : v4.attn) n += k == AttnKind::CSA;
  return n;
}

int64_t ModelConfig::num_params() const {
  if (is_v4()) return v4_num_params(*this, false);
  const int64_t d = hidden_size, H = num_attention_heads;
  int64_t attn = (q_lora_rank ? d * q_lora_rank + q_lora_rank + q_lora_rank * H * qk_head_dim()
                              : d * H * qk_head_dim()) +
                 d * (kv_lora_rank + qk_rope_head_dim) + kv_lora_rank +
                 kv_lora_rank * H * (qk_nope_head_dim + v_head_dim) + H * v_head_dim * d + 2 * d;
  if (is_v32())  // the indexer: wq_b, wk, k_norm (weight, bias), weights_proj
    attn += v32.index_n_heads * v32.index_head_dim * q_lora_rank + v32.index_head_dim * d + 2 * v32.index_head_dim +
            v32.index_n_heads * d;
  int64_t total = vocab_size * d * (tie_word_embeddings ? 1 : 2) + d;
  // MTP layers (v3_mtp_layers, model/mtp_v3.h): a decoder layer each, plus enorm, hnorm, eh_proj,
  // shared_head.norm and shared_head.head.
  total += v3_mtp_layers * (3 * d + 2 * d * d + (v3_mtp_head_tied ? 0 : vocab_size * d));
  for (int64_t l = 0; l < num_hidden_layers + v3_mtp_layers; ++l) {
    total += attn;
    if (is_moe_layer(l))
      total += n_routed_experts * 3 * d * moe_intermediate_size + 3 * d * shared_intermediate() +
               n_routed_experts * d;
    else
      total += 3 * d * intermediate_size;
  }
  return total;
}

int64_t ModelConfig::num_active_params() const {
  if (is_v4()) return v4_num_params(*this, true);
  const int64_t d = hidden_size, H = num_attention_heads;
  int64_t attn = (q_lora_rank ? d * q_lora_rank + q_lora_rank * H * qk_head_dim() : d * H * qk_head_dim()) +
                 d * (kv_lora_rank + qk_rope_head_dim) + kv_lora_rank * H * (qk_nope_head_dim + v_head_dim) +
                 H * v_head_dim * d;
  int64_t total = vocab_size * d;  // LM head (the embedding lookup is not a matmul)
  total += v3_mtp_layers * (2 * d * d + vocab_size * d);  // MTP layers: eh_proj, shared_head.head
  for (int64_t l = 0; l < num_hidden_layers + v3_mtp_layers; ++l) {
    total += attn;
    if (is_moe_layer(l))
      total += num_experts_per_tok * 3 * d * moe_intermediate_size + 3 * d * shared_intermediate() +
               n_routed_experts * d;
    else
      total += 3 * d * intermediate_size;
  }
  return total;
}

double ModelConfig::train_flops_per_token(int64_t T) const {
  if (is_v4()) return 6.0 * static_cast<double>(num_active_params()) + v4_attn_flops_per_token(*this, T);
  // Causal attention: per token on average (T+1)/2 keys; QK^T and PV: 2*H*(dqk+dv) FLOPs per
  // key forward, x3 for forward + backward.
  // DeepSeek-V3.2: a query attends min(t, index_topk) keys; the indexer (forward only: 2 FLOPs per
  // parameter of its projections, 2*Hi*di per earlier token scored) adds to it.
  double keys = (T + 1) / 2.0, index = 0;
  if (is_v32()) {
    const double k = (double)v32.index_topk, t = (double)T;
    keys = (t <= k ? t * (t + 1) / 2 : k * (k + 1) / 2 + (t - k) * k) / t;
    const double Hi = (double)v32.index_n_heads, di = (double)v32.index_head_dim;
    index = num_hidden_layers * (2.0 * (Hi * di * q_lora_rank + di * hidden_size + Hi * hidden_size) +
                                 2.0 * Hi * di * (T + 1) / 2.0);
  }
  double attn = 6.0 * num_attention_heads * (qk_head_dim() + v_head_dim) * keys *
                (num_hidden_layers + v3_mtp_layers);
  return 6.0 * static_cast<double>(num_active_params()) + attn + index;
}

std::string scoring_name(ScoringFunc s) {
  return s == ScoringFunc::Sigmoid ? "sigmoid" : s == ScoringFunc::Softmax ? "softmax" : "sqrtsoftplus";
}
void mla_moe_config_keys(nlohmann::ordered_json& j, const ModelConfig& c, const char* architecture,
                         const char* model_type) {
  j["architectures"] = {architecture};
  j["model_type"] = model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_attention_heads;
  j["n_shared_experts"] = c.n_shared_experts;
  j["n_routed_experts"] = c.n_routed_experts;
  j["routed_scaling_factor"] = c.routed_scaling_factor;
  j["kv_lora_rank"] = c.kv_lora_rank;
  j["q_lora_rank"] = c.q_lora_rank ? nlohmann::ordered_json(c.q_lora_rank) : nlohmann::ordered_json(nullptr);
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  j["v_head_dim"] = c.v_head_dim;
  j["qk_nope_head_dim"] = c.qk_nope_head_dim;
}

nlohmann::ordered_json rope_parameters_json(const ModelConfig& c) {
  nlohmann::ordered_json rp = {{"rope_type", c.rope_scaling.yarn ? "yarn" : "default"}, {"rope_theta", c.rope_theta}};
  if (c.rope_scaling.yarn) {
    const RopeScaling& y = c.rope_scaling;
    rp["factor"] = y.factor;
    rp["original_max_position_embeddings"] = y.original_max_position_embeddings;
    rp["beta_fast"] = y.beta_fast;
    rp["beta_slow"] = y.beta_slow;
    rp["mscale"] = y.mscale;
    rp["mscale_all_dim"] = y.mscale_all_dim;
    if (!y.truncate) rp["truncate"] = false;
  }
  return rp;
}

std::string topk_method_name(TopkMethod t) {
  switch (t) {
    case TopkMethod::NoauxTc: return "noaux_tc";
    case TopkMethod::Greedy: return "greedy";
    case TopkMethod::GroupLimitedGreedy: return "group_limited_greedy";
  }
  return "?";
}

}  // namespace trex::model
