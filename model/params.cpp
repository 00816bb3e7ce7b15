#include "model/params.h"

namespace trex::model {

ParamLayout build_layout(const ModelConfig& c) {
  if (c.is_v4()) return build_layout_v4(c);
  ParamLayout L;
  LayoutBuilder b{L};
  const int64_t d = c.hidden_size, H = c.num_attention_heads;
  L.embed = b.add("model.embed_tokens.weight", {c.vocab_size, d}, true);
  L.layers.resize(c.num_hidden_layers);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    LayerParams& p = L.layers[l];
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    const std::string at = pre + "self_attn.";
    p.in_norm = b.add(pre + "input_layernorm.weight", {d}, false);
    if (c.q_lora_rank) {
      p.q_a = b.add(at + "q_a_proj.weight", {c.q_lora_rank, d}, true);
      p.q_a_norm = b.add(at + "q_a_layernorm.weight", {c.q_lora_rank}, false);
      p.q_b = b.add(at + "q_b_proj.weight", {H * c.qk_head_dim(), c.q_lora_rank}, true);
    } else {
      p.q = b.add(at + "q_proj.weight", {H * c.qk_head_dim(), d}, true);
    }
    p.kv_a = b.add(at + "kv_a_proj_with_mqa.weight", {c.kv_lora_rank + c.qk_rope_head_dim, d}, true);
    p.kv_a_norm = b.add(at + "kv_a_layernorm.weight", {c.kv_lora_rank}, false);
    p.kv_b = b.add(at + "kv_b_proj.weight", {H * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank}, true);
    p.o = b.add(at + "o_proj.weight", {d, H * c.v_head_dim}, true);
    p.post_norm = b.add(pre + "post_attention_layernorm.weight", {d}, false);
    const std::string mlp = pre + "mlp.";
    auto swiglu_pair = [&](const std::string& prefix, int64_t F, int64_t& gu, int64_t& down) {
      gu = b.slab(2 * F * d);
      b.sub(prefix + "gate_proj.weight", gu, {F, d}, true);
      b.sub(prefix + "up_proj.weight", gu + F * d, {F, d}, true);
      down = b.add(prefix + "down_proj.weight", {d, F}, true);
    };
    if (!c.is_moe_layer(l)) {
      swiglu_pair(mlp, c.intermediate_size, p.mlp_gu, p.mlp_down);
      continue;
    }
    const int64_t E = c.n_routed_experts, F = c.moe_intermediate_size;
    p.router = b.add(mlp + "gate.weight", {E, d}, true);
    p.exp_gu = b.slab(E * 2 * F * d);
    p.exp_down = b.slab(E * d * F);
    for (int64_t e = 0; e < E; ++e) {
      const std::string ex = mlp + "experts." + std::to_string(e) + ".";
      b.sub(ex + "gate_proj.weight", p.exp_gu + e * 2 * F * d, {F, d}, true);
      b.sub(ex + "up_proj.weight", p.exp_gu + e * 2 * F * d + F * d, {F, d}, true);
      b.sub(ex + "down_proj.weight", p.exp_down + e * d * F, {d, F}, true);
    }
    if (c.n_shared_experts > 0) swiglu_pair(mlp + "shared_experts.", c.shared_intermediate(), p.sh_gu, p.sh_down);
    p.bias = b.buffer(mlp + "gate.e_score_correction_bias", E);
  }
  L.final_norm = b.add("model.norm.weight", {d}, false);
  L.head = c.tie_word_embeddings ? L.embed : b.add("lm_head.weight", {c.vocab_size, d}, true);
  return L;
}

}  // namespace trex::model
