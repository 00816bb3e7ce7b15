// DeepSeek-V4 config.json (Hugging Face DeepseekV4Config names, including the legacy keys its
// __post_init__ folds in: compress_ratios, compress_rate_csa / _hca, num_hash_layers,
// qk_rope_head_dim). Defaults are HF's; every value trex cannot compute exactly as the HF
// reference does is rejected here with the field name.
#include <cmath>
#include <set>
#include "core/log.h"
#include "model/config.h"
#include "model/config_reader.h"

namespace trex::model {

using nlohmann::json;
using namespace cfgread;

namespace {

AttnKind attn_kind(const std::string& s, const std::string& where, int64_t l) {
  if (s == "sliding_attention") return AttnKind::Sliding;
  if (s == "compressed_sparse_attention") return AttnKind::CSA;
  if (s == "heavily_compressed_attention") return AttnKind::HCA;
  TREX_USER_FAIL("allowed: sliding_attention, compressed_sparse_attention, heavily_compressed_attention", where,
                 ": layer_types[", l, "] = '", s, "' is not a DeepSeek-V4 attention type");
}

void parse_layer_types(const json& j, const std::string& where, ModelConfig& c, std::set<std::string>* used) {
  Reader r{j, where, used};
  V4Config& v = c.v4;
  const int64_t L = c.num_hidden_layers;
  if (r.has("compress_rates")) {
    const json& cr = j["compress_rates"];
    TREX_USER_CHECK(cr.is_object(), kFixHint, where, ": compress_rates must be an object");
    Reader rr{cr, where};
    v.csa_rate = rr.i64("compressed_sparse_attention", v.csa_rate, false, 1);
    v.hca_rate = rr.i64("heavily_compressed_attention", v.hca_rate, false, 1);
  }
  v.csa_rate = r.i64("compress_rate_csa", v.csa_rate, false, 1);
  v.hca_rate = r.i64("compress_rate_hca", v.hca_rate, false, 1);
  v.attn.clear();
  if (r.has("layer_types")) {
    const json& lt = j["layer_types"];
    TREX_USER_CHECK(lt.is_array() && (int64_t)lt.size() == L, kFixHint, where,
                    ": layer_types must be a list of num_hidden_layers (", L, ") strings");
    for (int64_t l = 0; l < L; ++l) {
      TREX_USER_CHECK(lt[l].is_string(), kFixHint, where, ": layer_types[", l, "] must be a string");
      v.attn.push_back(attn_kind(lt[l].get<std::string>(), where, l));
    }
  } else if (r.has("compress_ratios")) {
    // The original release's per-layer ratios: 0 = sliding window only, 4 = CSA (with indexer and
    // overlapping windows), any other ratio = HCA. One HCA rate per model (HF keeps one).
    const json& cr = j["compress_ratios"];
    TREX_USER_CHECK(cr.is_array() && (int64_t)cr.size() >= L, kFixHint, where,
                    ": compress_ratios must list at least num_hidden_layers (", L, ") integers");
    std::set<int64_t> hca;
    for (int64_t l = 0; l < L; ++l) {
      TREX_USER_CHECK(cr[l].is_number_integer() && cr[l].get<int64_t>() >= 0, kFixHint, where,
                      ": compress_ratios[", l, "] must be an integer >= 0");
      const int64_t x = cr[l].get<int64_t>();
      if (x == 0) v.attn.push_back(AttnKind::Sliding);
      else if (x == 4) v.attn.push_back(AttnKind::CSA);
      else v.attn.push_back(AttnKind::HCA), hca.insert(x);
    }
    TREX_USER_CHECK(hca.size() <= 1, "use one heavily-compressed rate", where,
                    ": compress_ratios has several HCA rates; DeepSeek-V4 (and HF) use one");
    if (!hca.empty()) v.hca_rate = *hca.begin();
  } else {
    // HF default (V4-Pro): 2 x HCA, then CSA / HCA interleaved.
    for (int64_t l = 0; l < L; ++l)
      v.attn.push_back(l < 2 ? AttnKind::HCA : ((l - 2) % 2 ? AttnKind::CSA : AttnKind::HCA));
  }
  v.hash.assign(L, 0);
  if (r.has("mlp_layer_types")) {
    const json& mt = j["mlp_layer_types"];
    TREX_USER_CHECK(mt.is_array() && (int64_t)mt.size() == L, kFixHint, where,
                    ": mlp_layer_types must be a list of num_hidden_layers (", L, ") strings");
    for (int64_t l = 0; l < L; ++l) {
      TREX_USER_CHECK(mt[l].is_string() && (mt[l] == "hash_moe" || mt[l] == "moe"), "allowed: hash_moe, moe", where,
                      ": mlp_layer_types[", l, "] = ", cfgread::shown(mt[l]), " is not a DeepSeek-V4 MLP type");
      v.hash[l] = mt[l] == "hash_moe";
    }
  } else {
    const int64_t nh = r.i64("num_hash_layers", 3, false, 0);
    for (int64_t l = 0; l < std::min(nh, L); ++l) v.hash[l] = 1;
  }
}

void parse_ropes(const json& j, const std::string& where, ModelConfig& c, std::set<std::string>* used) {
  if (used) used->insert({"rope_parameters", "rope_scaling"});
  V4Config& v = c.v4;
  c.rope_scaling = RopeScaling{};
  v.compress_rope = RopeScaling{};
  c.rope_scaling.original_max_position_embeddings = c.max_position_embeddings;
  v.compress_rope.original_max_position_embeddings = c.max_position_embeddings;
  if (!j.contains("rope_parameters") || !j["rope_parameters"].is_object()) {
    if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) {
      double ignore = 0;
      parse_rope_block(j["rope_scaling"], where, "rope_scaling", v.compress_rope, &ignore);
      if (v.compress_rope.yarn && v.compress_rope.attention_factor < 0) v.compress_rope.attention_factor = 1.0;
    }
    return;
  }
  const json& rp = j["rope_parameters"];
  if (rp.contains("main") && rp["main"].is_object() && rp.contains("compress") && rp["compress"].is_object()) {
    // Nested, as HF writes it after __post_init__: used as given.
    parse_rope_block(rp["main"], where, "rope_parameters.main", c.rope_scaling, &c.rope_theta);
    parse_rope_block(rp["compress"], where, "rope_parameters.compress", v.compress_rope, &v.compress_rope_theta);
    return;
  }
  // Flat: the YaRN keys belong to the compressed layers, with attention_factor 1 unless given
  // (the V4 reference does not scale cos / sin); the main rope is plain RoPE at rope_theta.
  double ignore = 0;
  parse_rope_block(rp, where, "rope_parameters", v.compress_rope, &ignore);
  if (v.compress_rope.yarn && v.compress_rope.attention_factor < 0) v.compress_rope.attention_factor = 1.0;
}

}  // namespace

ModelConfig parse_config_v4(const json& j, const std::string& where, std::set<std::string>* used) {
  Reader r{j, where, used};
  ModelConfig c;
  V4Config& v = c.v4;
  c.model_type = "deepseek_v4";
  c.vocab_size = r.i64("vocab_size", 129280, false, 1);
  c.hidden_size = r.i64("hidden_size", 0, true, 1);
  c.num_hidden_layers = r.i64("num_hidden_layers", 0, true, 1);
  c.num_attention_heads = r.i64("num_attention_heads", 0, true, 1);
  const int64_t kvh = r.i64("num_key_value_heads", 1, false, 1);
  TREX_USER_CHECK(kvh == 1, "set num_key_value_heads = 1", where,
                  ": DeepSeek-V4 attention has one shared key/value head; num_key_value_heads = ", kvh,
                  " is not supported");
  v.head_dim = r.i64("head_dim", 512, false, 1);
  c.q_lora_rank = r.i64("q_lora_rank", 1024, false, 1);
  // Rotated dims: int(head_dim * partial_rotary_factor) exactly as HF (double product, truncated).
  if (r.has("partial_rotary_factor")) {
    const double f = r.f64("partial_rotary_factor", 0.125);
    TREX_USER_CHECK(f > 0 && f <= 1, kFixHint, where, ": partial_rotary_factor must be in (0, 1], got ", f);
    c.qk_rope_head_dim = (int64_t)(v.head_dim * f);
  } else if (r.has("qk_rope_head_dim")) {
    c.qk_rope_head_dim = r.i64("qk_rope_head_dim", 64, false, 1);
  } else {
    c.qk_rope_head_dim = (int64_t)(v.head_dim * (64.0 / 512.0));
  }
  TREX_USER_CHECK(c.qk_rope_head_dim >= 2 && c.qk_rope_head_dim % 2 == 0 && c.qk_rope_head_dim <= v.head_dim,
                  kFixHint, where, ": the rotated dims int(head_dim * partial_rotary_factor) = ", c.qk_rope_head_dim,
                  " must be even, >= 2 and <= head_dim (", v.head_dim, ")");
  v.o_groups = r.i64("o_groups", 8, false, 1);
  v.o_lora_rank = r.i64("o_lora_rank", 1024, false, 1);
  TREX_USER_CHECK(c.num_attention_heads * v.head_dim % v.o_groups == 0, kFixHint, where,
                  ": num_attention_heads * head_dim (", c.num_attention_heads * v.head_dim,
                  ") must be divisible by o_groups (", v.o_groups, ")");
  v.sliding_window = r.i64("sliding_window", 128, false, 1);
  v.index_n_heads = r.i64("index_n_heads", 64, false, 1);
  v.index_head_dim = r.i64("index_head_dim", 128, false, 1);
  v.index_topk = r.i64("index_topk", 512, false, 1);
  TREX_USER_CHECK(v.index_head_dim >= c.qk_rope_head_dim, kFixHint, where, ": index_head_dim (", v.index_head_dim,
                  ") must be >= the rotated dims (", c.qk_rope_head_dim, "): the indexer ropes its last ones");
  v.hc_mult = r.i64("hc_mult", 4, false, 1);
  v.hc_sinkhorn_iters = r.i64("hc_sinkhorn_iters", 20, false, 1);
  v.hc_eps = r.f64("hc_eps", 1e-6);
  TREX_USER_CHECK(v.hc_eps >= 0, kFixHint, where, ": hc_eps must be >= 0");
  v.swiglu_limit = r.f64("swiglu_limit", 10.0);
  TREX_USER_CHECK(v.swiglu_limit > 0, kFixHint, where, ": swiglu_limit must be > 0, got ", v.swiglu_limit);

  // MoE: every layer; hash layers route by tid2eid.
  c.moe_intermediate_size = r.i64("moe_intermediate_size", 2048, false, 1);
  c.intermediate_size = c.moe_intermediate_size;
  c.n_routed_experts = r.i64("n_routed_experts", 256, false, 1);
  c.num_experts_per_tok = r.i64("num_experts_per_tok", 6, false, 1);
  TREX_USER_CHECK(c.num_experts_per_tok <= c.n_routed_experts, kFixHint, where, ": num_experts_per_tok (",
                  c.num_experts_per_tok, ") exceeds n_routed_experts (", c.n_routed_experts, ")");
  c.n_shared_experts = r.i64("n_shared_experts", 1, false, 0);
  c.first_k_dense_replace = 0;
  c.n_group = c.topk_group = 1;
  TREX_USER_CHECK(r.i64("n_group", 1, false, 1) == 1 && r.i64("topk_group", 1, false, 1) == 1,
                  "remove n_group / topk_group", where, ": DeepSeek-V4 routing has no expert groups");
  const std::string tm = r.str("topk_method", "noaux_tc");
  TREX_USER_CHECK(tm == "noaux_tc", "remove topk_method", where, ": DeepSeek-V4 selects the top-k of the biased scores "
                  "(noaux_tc); topk_method '", tm, "' is not supported");
  c.topk_method = TopkMethod::NoauxTc;
  const std::string sf = r.str("scoring_func", "sqrtsoftplus");
  if (sf == "sqrtsoftplus") c.scoring_func = ScoringFunc::SqrtSoftplus;
  else if (sf == "sigmoid") c.scoring_func = ScoringFunc::Sigmoid;
  else if (sf == "softmax") c.scoring_func = ScoringFunc::Softmax;
  else TREX_USER_FAIL("allowed: sqrtsoftplus, sigmoid, softmax", where, ": scoring_func '", sf, "' is not supported");
  c.norm_topk_prob = r.boolean("norm_topk_prob", true);
  TREX_USER_CHECK(c.norm_topk_prob, "set norm_topk_prob = true", where,
                  ": the DeepSeek-V4 reference always normalizes the selected weights");
  c.routed_scaling_factor = r.f64("routed_scaling_factor", 1.5);
  TREX_USER_CHECK(!r.boolean("output_router_logits", false), "set output_router_logits = false and use "
                  "[train] aux_loss_alpha for the sequence-wise balance loss", where,
                  ": HF's Switch-style router loss is not implemented");

  c.max_position_embeddings = r.i64("max_position_embeddings", 1048576, false, 1);
  c.rope_theta = r.f64("rope_theta", 10000.0);
  v.compress_rope_theta = r.f64("compress_rope_theta", 160000.0);
  parse_ropes(j, where, c, used);
  TREX_USER_CHECK(c.rope_theta > 1.0 && v.compress_rope_theta > 1.0, kFixHint, where,
                  ": rope_theta and compress_rope_theta must be > 1");
  c.rope_interleave = true;
  c.rms_norm_eps = r.f64("rms_norm_eps", 1e-6);
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
  c.initializer_range = r.f64("initializer_range", 0.02);
  c.num_nextn_predict_layers = r.i64("num_nextn_predict_layers", 1, false, 0);
  parse_layer_types(j, where, c, used);
  const std::string act = r.str("hidden_act", "silu");
  TREX_USER_CHECK(act == "silu", "set hidden_act = \"silu\"", where, ": hidden_act '", act, "' is not supported");
  TREX_USER_CHECK(!r.boolean("attention_bias", false) && !r.boolean("mlp_bias", false),
                  "set attention_bias = mlp_bias = false", where, ": biases are not supported (V4 has none)");
  TREX_USER_CHECK(r.f64("attention_dropout", 0.0) == 0.0, "set attention_dropout = 0", where,
                  ": attention dropout is not supported");
  return c;  // MTP blocks (num_nextn_predict_layers) are instantiated by with_mtp when a run trains them
}

ModelConfig with_mtp(const ModelConfig& c, int64_t n) {
  if (n == 0) return c;
  TREX_USER_CHECK(n <= c.num_nextn_predict_layers, "set num_nextn_predict_layers in the model config",
                  "the run trains ", n, " MTP blocks but the model config has num_nextn_predict_layers = ",
                  c.num_nextn_predict_layers);
  ModelConfig m = c;
  if (!c.is_v4()) {  // DeepSeek-V3: decoder layers num_hidden_layers + k (model/mtp_v3.h)
    m.v3_mtp_layers = n;
    return m;
  }
  m.v4.mtp_layers = n;
  m.v4.attn.resize(c.num_hidden_layers, AttnKind::Sliding);
  m.v4.hash.resize(c.num_hidden_layers, 0);
  m.v4.attn.resize(c.num_hidden_layers + n, AttnKind::Sliding);
  m.v4.hash.resize(c.num_hidden_layers + n, 0);
  return m;
}

// Matmul parameters per layer that every token uses (attention, compressor, indexer, HC).
static int64_t v4_dense_layer_params(const ModelConfig& c, int64_t l, bool active) {
  const V4Config& v = c.v4;
  const int64_t d = c.hidden_size, H = c.num_attention_heads, hd = v.head_dim, n = v.hc_mult;
  int64_t p = d * c.q_lora_rank + c.q_lora_rank * H * hd + d * hd + H * hd * v.o_lora_rank +
              v.o_groups * v.o_lora_rank * d + 2 * (2 + n) * n * n * d;
  if (v.attn[l] != AttnKind::Sliding) {
    const int64_t cc = v.attn[l] == AttnKind::CSA ? 2 : 1;
    p += 2 * d * cc * hd;
    if (v.attn[l] == AttnKind::CSA)
      p += 2 * d * 2 * v.index_head_dim + c.q_lora_rank * v.index_n_heads * v.index_head_dim + d * v.index_n_heads;
  }
  if (!active) {  // vectors: norms, sinks, position biases, HC base / scale
    p += 2 * d + c.q_lora_rank + hd + H + 2 * ((2 + n) * n + 3);
    if (v.attn[l] != AttnKind::Sliding) {
      const int64_t cc = v.attn[l] == AttnKind::CSA ? 2 : 1;
      p += v.rate(l) * cc * hd + hd;
      if (v.attn[l] == AttnKind::CSA) p += v.rate(l) * 2 * v.index_head_dim + v.index_head_dim;
    }
  }
  return p;
}

int64_t v4_num_params(const ModelConfig& c, bool active) {
  const int64_t d = c.hidden_size, E = c.n_routed_experts, F = c.moe_intermediate_size, n = c.v4.hc_mult;
  int64_t total = active ? c.vocab_size * d : c.vocab_size * d * (c.tie_word_embeddings ? 1 : 2) + d + n * n * d + n + 1;
  if (active) total += n * n * d;
  for (int64_t l = 0; l < c.num_hidden_layers + c.v4.mtp_layers; ++l) {
    total += v4_dense_layer_params(c, l, active);
    total += (active ? c.num_experts_per_tok : E) * 3 * d * F + 3 * d * c.shared_intermediate() + E * d;
  }
  // MTP extras: e_proj, h_proj (active: once per stream), its hc_head, and the shared LM head once more.
  const int64_t mtp = c.v4.mtp_layers;
  total += mtp * (active ? (1 + n) * d * d + n * n * d + c.vocab_size * d : 2 * d * d + n * n * d + n + 1 + 3 * d);
  return total;
}

double v4_attn_flops_per_token(const ModelConfig& c, int64_t T) {
  // Keys each query actually attends (sliding window + visible compressed entries, CSA capped at
  // index_topk), averaged over the T positions of a sequence; 4 H hd FLOPs per key forward
  // (q.k and p.v), x3 with backward. The indexer scores every visible CSA entry: 2 nI dI FLOPs
  // forward only (its selection carries no gradient), and its projections run forward only, so
  // the 6 x active-parameter term is corrected by -4 x their parameters.
  const V4Config& v = c.v4;
  double attn = 0, index = 0;
  for (int64_t l = 0; l < c.num_hidden_layers + v.mtp_layers; ++l) {
    double keys = 0, scored = 0;
    for (int64_t t = 0; t < T; ++t) {
      keys += (double)std::min<int64_t>(t + 1, v.sliding_window);
      if (v.attn[l] == AttnKind::Sliding) continue;
      const int64_t vis = (t + 1) / v.rate(l);
      if (v.attn[l] == AttnKind::HCA) keys += (double)vis;
      else keys += (double)std::min<int64_t>(vis, v.index_topk), scored += (double)vis;
    }
    attn += 12.0 * c.num_attention_heads * v.head_dim * keys / (double)T;
    index += 2.0 * v.index_n_heads * v.index_head_dim * scored / (double)T;
    // The indexer's projections are in num_active_params (6 x), but run forward only (2 x).
    if (v.attn[l] == AttnKind::CSA)
      index -= 4.0 * (double)(c.q_lora_rank * v.index_n_heads * v.index_head_dim + c.hidden_size * v.index_n_heads +
                              2 * c.hidden_size * 2 * v.index_head_dim);
  }
  return attn + index;
}

}  // namespace trex::model
