// DeepSeek-V4 config.json in the form transformers' DeepseekV4Config writes it (explicit
// layer_types / mlp_layer_types, compress_rates, nested rope_parameters {main, compress}), so a
// checkpoint trex saves loads in transformers and back in trex unchanged.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include "core/log.h"
#include "model/checkpoint.h"

namespace trex::model {

namespace {

nlohmann::ordered_json rope_json(double theta, const RopeScaling& y, double partial) {
  nlohmann::ordered_json r;
  r["rope_type"] = y.yarn ? "yarn" : "default";
  r["rope_theta"] = theta;
  r["partial_rotary_factor"] = partial;
  if (y.yarn) {
    r["factor"] = y.factor;
    r["original_max_position_embeddings"] = y.original_max_position_embeddings;
    r["beta_fast"] = y.beta_fast;
    r["beta_slow"] = y.beta_slow;
    r["mscale"] = y.mscale;
    r["mscale_all_dim"] = y.mscale_all_dim;
    r["truncate"] = y.truncate;
    if (y.attention_factor > 0) r["attention_factor"] = y.attention_factor;
  }
  return r;
}

void replace_all(std::string& s, const std::string& a, const std::string& b) {
  for (size_t p = s.find(a); p != std::string::npos; p = s.find(a, p + b.size())) s.replace(p, a.size(), b);
}

// "model.layers.N.mlp.experts.gate_up_proj" -> "layers.N.", "mtp.K.mlp.experts.gate_up_proj" ->
// "mtp.K." (the original-layout prefix of its per-expert tensors); "" if not a merged expert tensor.
std::string merged_expert_prefix(const std::string& hf, const char* leaf) {
  const std::string suf = std::string(".mlp.experts.") + leaf;
  if (hf.size() <= suf.size() || hf.compare(hf.size() - suf.size(), suf.size(), suf) != 0) return "";
  const std::string head = hf.substr(0, hf.size() - suf.size());
  if (head.rfind("model.layers.", 0) == 0) return head.substr(6) + ".";
  if (head.rfind("mtp.", 0) == 0) return head + ".";
  return "";
}

std::string expert_name(const std::string& prefix, int64_t e, const char* w) {
  return prefix + "ffn.experts." + std::to_string(e) + "." + w + ".weight";
}

}  // namespace

std::string v4_hf_name(const std::string& orig) {
  if (orig.rfind("mtp.", 0) == 0) {  // MTP blocks: trex's convention (transformers has none)
    const size_t dot = orig.find('.', 4);
    if (dot == std::string::npos) return orig;
    const std::string pre = orig.substr(0, dot + 1), rest = orig.substr(dot + 1);
    for (const char* k : {"e_proj.weight", "h_proj.weight", "enorm.weight", "hnorm.weight", "norm.weight"})
      if (rest == k) return orig;
    if (rest.rfind("hc_head_", 0) == 0) return pre + "hc_head.hc_" + rest.substr(8);
    const std::string h = v4_hf_name("layers.0." + rest);
    return pre + h.substr(std::string("model.layers.0.").size());
  }
  // transformers' conversion_mapping.py "deepseek_v4" WeightRenaming list, applied in order.
  static const std::vector<std::pair<std::regex, std::string>> rules = [] {
    const char* r[][2] = {
        {R"(\.attn\.)", ".self_attn."}, {R"(\.ffn\.)", ".mlp."},
        {R"(\.indexer\.compressor\.)", ".compressor.indexer."},
        {R"(^embed\.weight)", "embed_tokens.weight"}, {R"(^head\.weight)", "lm_head.weight"},
        {R"(^hc_head_fn)", "hc_head.hc_fn"}, {R"(^hc_head_base)", "hc_head.hc_base"},
        {R"(^hc_head_scale)", "hc_head.hc_scale"}, {R"(\.attn_norm\.)", ".input_layernorm."},
        {R"(\.ffn_norm\.)", ".post_attention_layernorm."}, {R"(\.hc_attn_fn)", ".attn_hc.fn"},
        {R"(\.hc_attn_base)", ".attn_hc.base"}, {R"(\.hc_attn_scale)", ".attn_hc.scale"},
        {R"(\.hc_ffn_fn)", ".ffn_hc.fn"}, {R"(\.hc_ffn_base)", ".ffn_hc.base"},
        {R"(\.hc_ffn_scale)", ".ffn_hc.scale"}, {R"(\.attn_sink)", ".sinks"},
        {R"(\.indexer\.weights_proj\.)", ".compressor.indexer.scorer.weights_proj."},
        {R"(\.indexer\.wq_b\.)", ".compressor.indexer.q_b_proj."}, {R"(\.norm\.)", ".kv_norm."},
        {R"(\.ape)", ".position_bias"}, {R"(\.wq_a\.)", ".q_a_proj."},
        {R"(\.self_attn\.wq_b\.)", ".self_attn.q_b_proj."}, {R"(\.wkv\.)", ".kv_proj."},
        {R"(\.wgate\.)", ".gate_proj."}, {R"(\.wo_a\.)", ".o_a_proj."}, {R"(\.wo_b\.)", ".o_b_proj."},
        {R"(\.q_norm\.)", ".q_a_norm."}, {R"(\.gate\.bias)", ".gate.e_score_correction_bias"},
        {R"(\.shared_experts\.w1\.)", ".shared_experts.gate_proj."},
        {R"(\.shared_experts\.w2\.)", ".shared_experts.down_proj."},
        {R"(\.shared_experts\.w3\.)", ".shared_experts.up_proj."}};
    std::vector<std::pair<std::regex, std::string>> v;
    for (auto& x : r) v.emplace_back(std::regex(x[0]), x[1]);
    return v;
  }();
  std::string s = orig;
  for (const auto& [re, to] : rules) s = std::regex_replace(s, re, to);
  return s == "lm_head.weight" ? s : "model." + s;
}

std::string v4_original_name(const std::string& hf) {
  if (hf == "lm_head.weight") return "head.weight";
  std::string s = hf.rfind("model.", 0) == 0 ? hf.substr(6) : hf;
  if (s == "embed_tokens.weight") return "embed.weight";
  if (s.rfind("hc_head.hc_", 0) == 0) return "hc_head_" + s.substr(11);
  const char* r[][2] = {{".self_attn.compressor.indexer.scorer.weights_proj.", ".attn.indexer.weights_proj."},
                        {".self_attn.compressor.indexer.q_b_proj.", ".attn.indexer.wq_b."},
                        {".self_attn.compressor.indexer.", ".attn.indexer.compressor."},
                        {".self_attn.", ".attn."}, {".mlp.", ".ffn."},
                        {".input_layernorm.", ".attn_norm."}, {".post_attention_layernorm.", ".ffn_norm."},
                        {".attn_hc.fn", ".hc_attn_fn"}, {".attn_hc.base", ".hc_attn_base"},
                        {".attn_hc.scale", ".hc_attn_scale"}, {".ffn_hc.fn", ".hc_ffn_fn"},
                        {".ffn_hc.base", ".hc_ffn_base"}, {".ffn_hc.scale", ".hc_ffn_scale"},
                        {".sinks", ".attn_sink"}, {".compressor.kv_norm.", ".compressor.norm."},
                        {".compressor.gate_proj.", ".compressor.wgate."}, {".position_bias", ".ape"},
                        {".q_a_proj.", ".wq_a."}, {".q_b_proj.", ".wq_b."}, {".kv_proj.", ".wkv."},
                        {".o_a_proj.", ".wo_a."}, {".o_b_proj.", ".wo_b."}, {".q_a_norm.", ".q_norm."},
                        {".gate.e_score_correction_bias", ".gate.bias"},
                        {".shared_experts.gate_proj.", ".shared_experts.w1."},
                        {".shared_experts.up_proj.", ".shared_experts.w3."},
                        {".shared_experts.down_proj.", ".shared_experts.w2."}, {".hc_head.hc_", ".hc_head_"}};
  for (auto& x : r) replace_all(s, x[0], x[1]);
  return s;
}

namespace {

// A stage-sharded layout: whether the original-format tensor n belongs to another pipeline stage
// (another stage's layer, the MTP blocks or the model's ends).
bool held_by_another_stage(const ParamLayout& L, const std::string& n) {
  if (!L.stage_sharded()) return false;
  if (n.rfind("layers.", 0) == 0) {
    const long long l = std::atoll(n.c_str() + 7);
    return !L.holds_layer((int64_t)l);
  }
  if (n.rfind("mtp.", 0) == 0) return !L.stage.last;
  if (n == "embed.weight") return L.embed < 0;
  if (n == "head.weight" || n == "norm.weight" || n.rfind("hc_head_", 0) == 0) return L.final_norm < 0;
  return false;
}

}  // namespace

bool v4_saved_naming(const std::vector<std::string>& names) {
  for (const std::string& n : names)
    if (n.rfind("model.layers.", 0) == 0 &&
        (n.find(".attn.") != std::string::npos || n.find(".ffn.") != std::string::npos))
      return true;
  return false;
}

std::string v4_original_of_saved(const std::string& saved) {
  const std::string s = saved.rfind("model.", 0) == 0 ? saved.substr(6) : saved;
  return v4_original_name(v4_hf_name(s));
}

std::string v4_saved_name(const std::string& n) {
  if (n.rfind("mtp.", 0) == 0 || n == "head.weight") return n;  // ^head\.weight: written as is
  // The mapping's anchored rules (^embed\.weight, ^hc_head_*) do not match behind model.: their
  // in-memory names stay.
  if (n == "embed.weight") return "model.embed_tokens.weight";
  if (n.rfind("hc_head_", 0) == 0) return "model.hc_head.hc_" + n.substr(8);
  // The attention's kv_norm: in memory self_attn.kv_norm, which the reversed rule
  // .norm. -> .kv_norm. writes as attn.norm.
  std::string s = "model." + n;
  if (const size_t p = s.find(".attn.kv_norm."); p != std::string::npos) s.replace(p, 14, ".attn.norm.");
  return s;
}

void load_v4_original(Model& m, const std::string& dir) {
  io::SafetensorsDir ck = io::SafetensorsDir::open(dir);
  if (v4_saved_naming(ck.names())) ck.rename(v4_original_of_saved);
  io::QuantConfig qc = detail::quant_config_of(dir);
  io::QuantizedTensorReader q(ck, qc);
  const int64_t E = m.cfg.n_routed_experts, F = m.cfg.moe_intermediate_size, d = m.cfg.hidden_size;
  std::set<std::string> used;
  auto read = [&](const std::string& name, const Shape& s, float* dst) {
    detail::read_tensor(ck, q, name, s, dst);
    used.insert(name);
  };
  const bool fresh_mtp = m.cfg.v4.mtp_layers > 0 && !detail::has_mtp_tensors(ck);
  if (fresh_mtp) {
    TREX_LOG_WARN(dir, ": no MTP tensors (mtp.*); the MTP blocks start from random init");
    m.init_mtp_random(0x5eed);
  }
  std::vector<float> whole;
  for (const ParamEntry& e : m.layout.entries) {
    if (fresh_mtp && e.name.rfind("mtp.", 0) == 0) continue;
    float* dst = m.P() + e.offset;
    // The experts this model holds (all, or an expert-parallel shard's rows).
    const int64_t x0 = m.layout.expert_first, nx = m.layout.expert_count;
    if (std::string l = merged_expert_prefix(e.name, "gate_up_proj"); !l.empty()) {
      for (int64_t x = x0; x < x0 + nx; ++x) {
        read(expert_name(l, x, "w1"), Shape{F, d}, dst + (x - x0) * 2 * F * d);
        read(expert_name(l, x, "w3"), Shape{F, d}, dst + (x - x0) * 2 * F * d + F * d);
      }
    } else if (std::string l2 = merged_expert_prefix(e.name, "down_proj"); !l2.empty()) {
      for (int64_t x = x0; x < x0 + nx; ++x) read(expert_name(l2, x, "w2"), Shape{d, F}, dst + (x - x0) * d * F);
    } else if (e.sliced()) {  // a tensor-parallel slice
      whole.resize((size_t)e.whole_numel());
      read(v4_original_name(e.name), e.whole_shape(), whole.data());
      e.take_from_whole(whole.data(), dst);
    } else {
      read(v4_original_name(e.name), e.shape, dst);
    }
  }
  for (const BufferEntry& b : m.layout.buffers) {
    if (fresh_mtp && b.name.rfind("mtp.", 0) == 0) continue;
    const std::string on = v4_original_name(b.name);
    BufferEntry ob = b;
    ob.name = on;
    if (b.cols > 0) {
      TREX_USER_CHECK(ck.find(on), "a DeepSeek-V4 checkpoint holds the hash routing table of each hash_moe layer", dir,
                      ": '", on, "' is missing");
      detail::read_id_table(ck, ob, E, m.buffers.data() + b.offset);
      used.insert(on);
    } else if (ck.find(on)) {
      read(on, Shape{b.size}, m.buffers.data() + b.offset);
    } else {
      TREX_LOG_WARN(dir, ": '", on, "' absent; router bias starts at 0");
    }
  }
  int64_t mtp = 0, unknown = 0;
  for (const std::string& n : ck.names()) {
    if (used.count(n) || q.is_scale(n)) continue;
    if (m.cfg.tie_word_embeddings && n == "head.weight") continue;
    if (m.layout.expert_sharded() && n.find(".ffn.experts.") != std::string::npos) continue;  // another rank's
    if (held_by_another_stage(m.layout, n)) continue;
    if (n.rfind("mtp.", 0) == 0 && m.cfg.v4.mtp_layers == 0) {
      ++mtp;
      continue;
    }
    if (++unknown <= 5) {
      const std::string st = ck.stored_name(n);
      TREX_LOG_WARN(dir, ": unexpected tensor '", st, "'", st == n ? "" : " (original name '" + n + "')", " ignored");
    }
  }
  if (mtp) TREX_LOG_INFO(dir, ": skipped ", mtp, " MTP tensors (mtp.*)");
  TREX_USER_CHECK(unknown == 0, "the checkpoint does not match config.json", dir, ": ", unknown,
                  " tensors do not belong to this model config");
  check_finite_weights(m, dir);
  m.refresh_bf16();
}

void save_v4_original(const Model& m, const std::string& dir, DType dtype, bool quantize, uint64_t max_shard_bytes,
                      bool saved_names) {
  TREX_CHECK(!(quantize && saved_names), "save_v4_original: quantized weights are written in the release layout only");
  TREX_CHECK(!m.layout.sharded(), "save_v4_original: the model holds an expert shard or a pipeline stage only");
  detail::TensorList tl(dtype);
  detail::make_output_dir(dir);
  const int64_t E = m.cfg.n_routed_experts, F = m.cfg.moe_intermediate_size, d = m.cfg.hidden_size;
  TREX_USER_CHECK(!quantize || (d % 2 == 0 && F % 2 == 0), "quantize a model with even hidden_size and "
                  "moe_intermediate_size, or convert without --quantize", "FP4 experts pack two values per byte (rows "
                  "of hidden_size and moe_intermediate_size values); ", d % 2 ? "hidden_size " : "moe_intermediate_size ",
                  d % 2 ? d : F, " is odd");
  std::vector<io::QuantizedTensor> qts;
  auto plain = [&](const std::string& name, const Shape& s, const float* src) { tl.add(name, s, src); };
  auto quant = [&](const std::string& name, const Shape& s, const float* src, io::QuantScheme sc) {
    for (io::QuantizedTensor& t : io::quantize_weight(name, src, s, sc)) qts.push_back(std::move(t));
  };
  // Which matrices the release ships in FP8 (attention, indexer query, shared experts).
  auto fp8 = [](const std::string& on) {
    for (const char* k : {".attn.wq_a.", ".attn.wq_b.", ".attn.wkv.", ".attn.wo_a.", ".attn.wo_b.", ".indexer.wq_b.",
                          ".shared_experts.w"})
      if (on.find(k) != std::string::npos) return true;
    return false;
  };
  for (const ParamEntry& e : m.layout.entries) {
    const float* src = m.P() + e.offset;
    if (std::string l = merged_expert_prefix(e.name, "gate_up_proj"); !l.empty()) {
      for (int64_t x = 0; x < E; ++x)
        for (int k = 0; k < 2; ++k) {
          const std::string n = expert_name(l, x, k ? "w3" : "w1");
          const float* p = src + x * 2 * F * d + k * F * d;
          quantize ? quant(n, Shape{F, d}, p, io::QuantScheme::Fp4V4) : plain(n, Shape{F, d}, p);
        }
    } else if (std::string l2 = merged_expert_prefix(e.name, "down_proj"); !l2.empty()) {
      for (int64_t x = 0; x < E; ++x) {
        const std::string n = expert_name(l2, x, "w2");
        quantize ? quant(n, Shape{d, F}, src + x * d * F, io::QuantScheme::Fp4V4) : plain(n, Shape{d, F}, src + x * d * F);
      }
    } else {
      const std::string on = v4_original_name(e.name);
      quantize && fp8(on) ? quant(on, e.shape, src, io::QuantScheme::Fp8V4) : plain(on, e.shape, src);
    }
  }
  for (const BufferEntry& b : m.layout.buffers) tl.add_buffer(v4_original_name(b.name), b, m.buffers.data());
  for (const io::QuantizedTensor& t : qts) tl.ts.push_back(t.to_write());
  if (saved_names)
    for (io::TensorToWrite& t : tl.ts) t.name = v4_saved_name(t.name);
  io::write_safetensors_dir(dir, tl.ts, max_shard_bytes);
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(config_to_json_v4(m.cfg));
  if (quantize) {
    j["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {128, 128}},
                                {"scale_fmt", "ue8m0"}};
    j["expert_dtype"] = "fp4";
  }
  detail::write_config(dir, j.dump(2));
}

std::string config_to_json_v4(const ModelConfig& c) {
  const V4Config& v = c.v4;
  nlohmann::ordered_json j;
  j["architectures"] = {"DeepseekV4ForCausalLM"};
  j["model_type"] = "deepseek_v4";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = 1;
  j["head_dim"] = v.head_dim;
  j["q_lora_rank"] = c.q_lora_rank;
  // Exact: HF recomputes int(head_dim * factor), and rope / head_dim round-trips through double.
  double partial = (double)c.qk_rope_head_dim / (double)v.head_dim;
  while ((int64_t)(v.head_dim * partial) < c.qk_rope_head_dim) partial = std::nextafter(partial, 2.0);
  j["partial_rotary_factor"] = partial;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["n_routed_experts"] = c.n_routed_experts;
  j["n_shared_experts"] = c.n_shared_experts;
  j["scoring_func"] = scoring_name(c.scoring_func);
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["routed_scaling_factor"] = c.routed_scaling_factor;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rope_theta"] = c.rope_theta;
  j["compress_rope_theta"] = v.compress_rope_theta;
  j["rope_parameters"] = {{"main", rope_json(c.rope_theta, c.rope_scaling, partial)},
                          {"compress", rope_json(v.compress_rope_theta, v.compress_rope, partial)}};
  nlohmann::ordered_json lt = nlohmann::ordered_json::array(), mt = nlohmann::ordered_json::array();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    lt.push_back(v.attn[l] == AttnKind::Sliding ? "sliding_attention"
                 : v.attn[l] == AttnKind::CSA   ? "compressed_sparse_attention"
                                                : "heavily_compressed_attention");
    mt.push_back(v.hash[l] ? "hash_moe" : "moe");
  }
  j["layer_types"] = lt;
  j["compress_rates"] = {{"compressed_sparse_attention", v.csa_rate}, {"heavily_compressed_attention", v.hca_rate}};
  j["mlp_layer_types"] = mt;
  j["hc_mult"] = v.hc_mult;
  j["hc_sinkhorn_iters"] = v.hc_sinkhorn_iters;
  j["hc_eps"] = v.hc_eps;
  j["swiglu_limit"] = v.swiglu_limit;
  j["sliding_window"] = v.sliding_window;
  j["o_groups"] = v.o_groups;
  j["o_lora_rank"] = v.o_lora_rank;
  j["index_n_heads"] = v.index_n_heads;
  j["index_head_dim"] = v.index_head_dim;
  j["index_topk"] = v.index_topk;
  j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["initializer_range"] = c.initializer_range;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  return j.dump(2);
}

}  // namespace trex::model
