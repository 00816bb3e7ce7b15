#include "plan/arch.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include "core/error.h"
#include "io/toml_json.h"
#include "plan/v4_arch.h"

namespace trex::plan {

using nlohmann::json;

const char* attn_kind_name(AttnKind k) {
  switch (k) {
    case AttnKind::MLA: return "mla";
    case AttnKind::SlidingWindow: return "swa";
    case AttnKind::CSA: return "csa";
    case AttnKind::HCA: return "hca";
  }
  return "?";
}

namespace {

// sum_{p=1..T} min(p, w)
double sum_min(double T, double w) {
  if (w <= 0) return 0;
  if (T <= w) return T * (T + 1) / 2;
  return w * (w + 1) / 2 + (T - w) * w;
}
// sum_{p=1..T} floor(p / m)
double sum_floor(int64_t T, int64_t m) {
  if (T <= 0) return 0;
  const double q = (double)(T / m);
  return m * q * (q - 1) / 2 + q * (double)(T - (T / m) * m + 1);
}
// sum_{p=1..T} min(K, floor(p / m))
double sum_min_floor(int64_t T, int64_t m, int64_t K) {
  if (T / m <= K) return sum_floor(T, m);
  const int64_t p0 = K * m;  // first position with K entries
  return sum_floor(p0 - 1, m) + (double)K * (double)(T - p0 + 1);
}

}  // namespace

double mean_attended_keys(const AttnShape& a, int64_t T) {
  TREX_CHECK(T > 0);
  if (a.kind == AttnKind::MLA) return (T + 1) / 2.0;
  double s = sum_min((double)T, (double)a.window);
  if (a.kind == AttnKind::CSA) s += sum_min_floor(T, a.compress_ratio, a.index_topk);
  if (a.kind == AttnKind::HCA) s += sum_floor(T, a.compress_ratio);
  return s / (double)T;
}

double attn_core_fwd_flops(const AttnShape& a, int64_t T) {
  double f = 2.0 * a.heads * (a.qk_dim + a.v_dim) * mean_attended_keys(a, T);
  if (a.kind == AttnKind::CSA)  // indexer scores every compressed entry formed so far
    f += 2.0 * a.index_heads * a.index_dim * sum_floor(T, a.compress_ratio) / (double)T;
  return f;
}

double ArchModel::total_params() const {
  double p = embed_params + (tied_embeddings ? 0 : head_params) + final_norm_params;
  for (const LayerCost& l : layers) p += l.dense_params + l.expert_params;
  return p;
}

double ArchModel::active_params() const {
  double p = head_params;
  for (const LayerCost& l : layers) p += l.active_matmul_params;
  return p;
}

double ArchModel::model_flops_per_token(int64_t T) const {
  double attn = 0;
  for (const LayerCost& l : layers) attn += attn_core_fwd_flops(l.attn, T);
  return 6.0 * active_params() + 3.0 * attn;
}

namespace {

LayerCost v3_layer(const model::ModelConfig& c, int64_t l) {
  const double d = (double)c.hidden_size, H = (double)c.num_attention_heads;
  const double qk = (double)c.qk_head_dim(), nope = (double)c.qk_nope_head_dim, rope = (double)c.qk_rope_head_dim;
  const double vd = (double)c.v_head_dim, ql = (double)c.q_lora_rank, kl = (double)c.kv_lora_rank;
  LayerCost L;
  L.attn = {AttnKind::MLA, c.num_attention_heads, c.qk_head_dim(), c.v_head_dim};
  L.moe = c.is_moe_layer(l);
  L.kind = L.moe ? "mla+moe" : "mla+dense";
  L.input_elems = d;

  // Attention matmuls: q (low-rank or plain), kv_a, kv_b (up-projection to heads), o.
  const double q_mm = ql > 0 ? d * ql + ql * H * qk : d * H * qk;
  const double kv_mm = d * (kl + rope) + kl * H * (nope + vd);
  const double o_mm = H * vd * d;
  const double attn_mm = q_mm + kv_mm + o_mm;
  const double attn_norms = 2 * d + kl + (ql > 0 ? ql : 0);  // input, post-attention, kv_a, q_a norms
  L.upproj_fwd = 2 * ((ql > 0 ? ql * H * qk : 0) + kl * H * (nope + vd));

  auto& S = L.saved;
  S.push_back({"attn.norm_in [d]", d, 2, false, false});
  S.push_back({"attn.x_norm [d]", d, 2, true, true});
  if (ql > 0) {
    S.push_back({"attn.q_a [q_lora]", ql, 2, false, false});
    S.push_back({"attn.q_a_norm [q_lora]", ql, 2, true, true});
  }
  S.push_back({"attn.kv_a [kv_lora+rope]", kl + rope, 2, false, false});
  S.push_back({"attn.kv_a_norm [kv_lora]", kl, 2, true, true});
  S.push_back({"attn.q [H*(nope+rope)]", H * qk, 2, false, true});
  S.push_back({"attn.k [H*(nope+rope)]", H * qk, 2, false, true});
  S.push_back({"attn.v [H*v]", H * vd, 2, false, true});
  S.push_back({"attn.out [H*v]", H * vd, 2, true, false});
  S.push_back({"attn.lse [H] f32", H, 4, false, false});
  S.push_back({"mlp.norm_in [d]", d, 2, false, false});
  S.push_back({"mlp.x_norm [d]", d, 2, true, true});

  // Memory-bound forward traffic (bytes): two RMSNorms with residual adds, latent norms, RoPE.
  const double norm_bytes = 2 * 10 * d + 4 * kl + 4 * ql;
  L.elem_bytes_fwd = norm_bytes + 4 * H * rope + 4 * rope;
  L.elem_sel_bytes_fwd = norm_bytes;

  double mlp_mm_active, mlp_dense_params;
  if (L.moe) {
    const double I = (double)c.moe_intermediate_size, Is = (double)c.shared_intermediate();
    const double E = (double)c.n_routed_experts, k = (double)c.num_experts_per_tok;
    L.n_experts = c.n_routed_experts;
    L.topk = c.num_experts_per_tok;
    L.n_group = c.n_group;
    L.topk_group = c.topk_group;
    L.expert_params = E * 3 * d * I;
    mlp_dense_params = 3 * d * Is + E * d;  // shared experts + router
    mlp_mm_active = 3 * d * Is + E * d;
    L.expert_fwd = 2 * k * 3 * d * I;
    S.push_back({"moe.router_scores [E] f32", E, 4, false, false});
    S.push_back({"moe.dispatched [k*d]", k * d, 2, true, false, true});
    S.push_back({"moe.gate_up [k*2I]", k * 2 * I, 2, true, false, true});
    S.push_back({"moe.act [k*I]", k * I, 2, true, true, true});
    S.push_back({"moe.expert_out [k*d]", k * d, 2, false, false, true});
    if (Is > 0) {
      S.push_back({"shared.gate_up [2Is]", 2 * Is, 2, true, false});
      S.push_back({"shared.act [Is]", Is, 2, true, true});
    }
    const double swiglu = 6 * k * I + 6 * Is;
    L.elem_bytes_fwd += 12 * E + 2 * (d + k * d) + swiglu + 2 * (k * d + d);
    L.elem_sel_bytes_fwd += swiglu;
  } else {
    const double I = (double)c.intermediate_size;
    mlp_dense_params = 3 * d * I;
    mlp_mm_active = 3 * d * I;
    S.push_back({"mlp.gate_up [2I]", 2 * I, 2, true, false});
    S.push_back({"mlp.act [I]", I, 2, true, true});
    L.elem_bytes_fwd += 6 * I;
    L.elem_sel_bytes_fwd += 6 * I;
  }
  L.dense_params = attn_mm + attn_norms + mlp_dense_params;
  L.active_matmul_params = attn_mm + mlp_mm_active + (L.moe ? (double)c.num_experts_per_tok * 3 * d * c.moe_intermediate_size : 0);
  L.gemm_fwd = 2 * (attn_mm + mlp_mm_active);
  return L;
}

}  // namespace

ArchModel arch_from_config(const model::ModelConfig& c, const std::string& name) {
  ArchModel a;
  a.name = name;
  a.family = "deepseek_v3";
  a.source = "model::ModelConfig (" + c.model_type + ")";
  a.hidden = c.hidden_size;
  a.vocab = c.vocab_size;
  a.heads = c.num_attention_heads;
  a.n_experts = c.n_routed_experts;
  a.topk = c.num_experts_per_tok;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) a.layers.push_back(v3_layer(c, l));
  const double d = (double)c.hidden_size, V = (double)c.vocab_size;
  a.embed_params = V * d;
  a.head_params = V * d;
  a.tied_embeddings = c.tie_word_embeddings;
  a.final_norm_params = d;
  a.mtp_modules = c.num_nextn_predict_layers;
  // V3 MTP module: embedding/head shared; eh_proj [d, 2d], enorm, hnorm, one MoE decoder block.
  model::ModelConfig last = c;
  a.mtp_block = v3_layer(last, c.num_hidden_layers - 1);
  a.mtp_extra_params = 2 * d * d + 2 * d;
  return a;
}

model::ModelConfig deepseek_v3_config() {
  // huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json
  json j = {{"model_type", "deepseek_v3"}, {"vocab_size", 129280}, {"hidden_size", 7168},
            {"intermediate_size", 18432}, {"moe_intermediate_size", 2048}, {"num_hidden_layers", 61},
            {"num_attention_heads", 128}, {"num_key_value_heads", 128}, {"n_shared_experts", 1},
            {"n_routed_experts", 256}, {"routed_scaling_factor", 2.5}, {"kv_lora_rank", 512},
            {"q_lora_rank", 1536}, {"qk_rope_head_dim", 64}, {"v_head_dim", 128}, {"qk_nope_head_dim", 128},
            {"topk_method", "noaux_tc"}, {"n_group", 8}, {"topk_group", 4}, {"num_experts_per_tok", 8},
            {"first_k_dense_replace", 3}, {"norm_topk_prob", true}, {"scoring_func", "sigmoid"},
            {"max_position_embeddings", 163840}, {"rope_theta", 10000.0}, {"rms_norm_eps", 1e-6},
            {"tie_word_embeddings", false},
            {"rope_scaling", {{"type", "yarn"}, {"factor", 40.0}, {"beta_fast", 32.0}, {"beta_slow", 1.0},
                              {"mscale", 1.0}, {"mscale_all_dim", 1.0}, {"original_max_position_embeddings", 4096}}}};
  model::ModelConfig c = model::parse_config(j, "deepseek-v3 (built-in)");
  c.num_nextn_predict_layers = 1;  // set after parsing: the parser logs that MTP is not trained
  return c;
}

std::vector<std::string> builtin_model_names() { return {"deepseek-v3", "deepseek-v4-flash", "deepseek-v4-pro"}; }

namespace {

json read_json_file(const std::string& path) {
  std::ifstream f(path);
  TREX_USER_CHECK(f.good(), "give a config.json, a trex TOML run config, a model directory or a built-in name",
                  path, ": cannot open model config");
  try {
    return json::parse(f);
  } catch (const json::parse_error& e) {
    TREX_USER_FAIL("the file must be valid JSON", path, ": not valid JSON: ", e.what());
  }
}

ArchModel arch_from_json(const json& j, const std::string& where) {
  if (j.is_object() && j.value("model_type", std::string()) == "deepseek_v4")
    return arch_from_v4(v4_from_json(j, where));
  return arch_from_config(model::parse_config(j, where), where);
}

}  // namespace

ArchModel resolve_model(const std::string& s) {
  if (s == "deepseek-v3") return arch_from_config(deepseek_v3_config(), s);
  if (s == "deepseek-v4-flash") return arch_from_v4(v4_flash());
  if (s == "deepseek-v4-pro") return arch_from_v4(v4_pro());
  namespace fs = std::filesystem;
  std::string names;
  for (auto& n : builtin_model_names()) names += (names.empty() ? "" : ", ") + n;
  TREX_USER_CHECK(fs::exists(s), "built-in models: " + names + "; or a config.json / trex TOML / model directory",
                  "model '", s, "' is neither a built-in name nor an existing path");
  if (fs::is_directory(s)) return arch_from_json(read_json_file((fs::path(s) / "config.json").string()), s);
  if (fs::path(s).extension() == ".toml") {
    json t = io::load_toml_as_json(s);
    TREX_USER_CHECK(t.contains("model") && t["model"].is_object(), "add a [model] table", s,
                    ": a trex TOML run config needs a [model] table");
    json m = t["model"];
    if (m.contains("path")) {
      fs::path p = m["path"].get<std::string>();
      if (fs::is_directory(p)) p /= "config.json";
      return arch_from_json(read_json_file(p.string()), p.string());
    }
    return arch_from_json(m, s);
  }
  return arch_from_json(read_json_file(s), s);
}

}  // namespace trex::plan
