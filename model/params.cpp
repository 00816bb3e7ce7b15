#include "model/params.h"

#include <cstdlib>
#include "core/error.h"

namespace trex::model {

bool apply_expert_shard(const ModelConfig& c, const ExpertShard& s, ParamLayout& L) {
  const int64_t E = c.n_routed_experts;
  L.expert_first = 0;
  L.expert_count = E;
  if (s.count < 0 || (s.count == E && s.first == 0)) return false;
  TREX_CHECK(s.count > 0 && s.count <= E && s.first >= 0 && s.first % s.count == 0 && s.first + s.count <= E,
             "expert shard [", s.first, ", ", s.first + s.count, ") of ", E, " routed experts");
  TREX_CHECK(s.region_align > 0 && s.region_align % 16 == 0, "expert shard: region_align ", s.region_align,
             " is not a positive multiple of 16");
  L.expert_first = s.first;
  L.expert_count = s.count;
  return true;
}

bool apply_stage_shard(const ModelConfig& c, const StageShard& s, ParamLayout& L) {
  L.num_main_layers = c.num_hidden_layers;
  L.stage = StageShard{};
  if (!s.on()) return false;
  TREX_CHECK(0 <= s.l0 && s.l0 <= s.l1 && s.l1 <= c.num_hidden_layers, "stage shard: layers [", s.l0, ", ", s.l1,
             ") of ", c.num_hidden_layers);
  TREX_CHECK(!s.first || s.l0 == 0, "stage shard: the first stage starts at layer 0, not ", s.l0);
  TREX_CHECK(!s.last || s.l1 == c.num_hidden_layers, "stage shard: the last stage ends at layer ",
             c.num_hidden_layers, ", not ", s.l1);
  TREX_CHECK(s.region_align > 0 && s.region_align % 16 == 0, "stage shard: region_align ", s.region_align,
             " is not a positive multiple of 16");
  L.stage = s;
  return true;
}

bool apply_tp_shard(const ModelConfig& c, const TpShard& t, ParamLayout& L) {
  L.tp = TpShard{};
  if (!t.on()) return false;
  TREX_CHECK(t.rank >= 0 && t.rank < t.size, "tp shard: rank ", t.rank, " of ", t.size);
  TREX_CHECK(t.region_align > 0 && t.region_align % 16 == 0, "tp shard: region_align ", t.region_align,
             " is not a positive multiple of 16");
  TREX_CHECK(c.num_attention_heads % t.size == 0, "tp shard: ", c.num_attention_heads,
             " attention heads do not split over ", t.size, " ranks");
  TREX_CHECK(!c.is_v4() || c.v4.o_groups % t.size == 0, "tp shard: o_groups ", c.v4.o_groups,
             " does not split over ", t.size, " ranks");
  TREX_CHECK(!c.has_dense_mlp() || c.intermediate_size % t.size == 0, "tp shard: "
             "intermediate_size ", c.intermediate_size, " does not split over ", t.size, " ranks");
  L.tp = t;
  return true;
}

bool embedding_shared(const ModelConfig& c, const StageShard& s) {
  return s.on() && (c.tie_word_embeddings || (c.is_v4() && c.v4.mtp_layers > 0) || c.v3_mtp_layers > 0);
}

bool stage_holds_embedding(const ModelConfig& c, const StageShard& s) {
  return !s.on() || s.first || (s.last && embedding_shared(c, s));
}

int64_t expert_of_name(const std::string& name) {
  const std::string pre = "model.layers.", ex = ".mlp.experts.";
  if (name.rfind(pre, 0) != 0) return -1;
  const size_t k = name.find(ex);
  if (k == std::string::npos) return -1;
  const char* p = name.c_str() + k + ex.size();
  char* end = nullptr;
  const long long x = std::strtoll(p, &end, 10);
  return end != p && *end == '.' ? (int64_t)x : -1;
}

ParamLayout build_layout(const ModelConfig& c, ExpertShard shard, StageShard stage, TpShard tp) {
  if (c.is_v4()) return build_layout_v4(c, shard, stage, tp);
  ParamLayout L;
  LayoutBuilder b{L};
  const bool sharded = apply_expert_shard(c, shard, L);
  apply_stage_shard(c, stage, L);
  apply_tp_shard(c, tp, L);  // tp-sharded: the split tensors go after the other dense tensors
  std::vector<int64_t> moe_layers;  // sharded: their experts go into the expert region
  const int64_t d = c.hidden_size, H = c.num_attention_heads;
  // The routed experts held, [first, first + n): gate|up [n, 2F, d] and down [n, d, F] slabs, one
  // tensor per expert and projection under its global index.
  auto add_experts = [&](int64_t l) {
    LayerParams& p = L.layers[l];
    const int64_t F = c.moe_intermediate_size, n = L.expert_count;
    const std::string mlp = "model.layers." + std::to_string(l) + ".mlp.";
    p.exp_gu = b.slab(n * 2 * F * d);
    p.exp_down = b.slab(n * d * F);
    for (int64_t j = 0; j < n; ++j) {
      const std::string ex = mlp + "experts." + std::to_string(L.expert_first + j) + ".";
      b.sub(ex + "gate_proj.weight", p.exp_gu + j * 2 * F * d, {F, d}, true);
      b.sub(ex + "up_proj.weight", p.exp_gu + j * 2 * F * d + F * d, {F, d}, true);
      b.sub(ex + "down_proj.weight", p.exp_down + j * d * F, {d, F}, true);
    }
  };
  if (stage_holds_embedding(c, L.stage)) L.embed = b.add("model.embed_tokens.weight", {c.vocab_size, d}, true);
  if (embedding_shared(c, L.stage) && L.embed >= 0) b.end_shared_region(stage.region_align);
  // Decoder layer l (l >= num_hidden_layers: MTP layer l - num_hidden_layers, its body).
  auto add_layer = [&](int64_t l) {
    LayerParams& p = L.layers[l];
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    if (!L.holds_layer(l)) {  // another stage's layer: its buffers only (every rank keeps them all)
      if (c.is_moe_layer(l) && !c.is_v2())
        p.bias = b.buffer(pre + "mlp.gate.e_score_correction_bias", c.n_routed_experts);
      return;
    }
    const std::string at = pre + "self_attn.";
    p.in_norm = b.add(pre + "input_layernorm.weight", {d}, false);
    if (c.q_lora_rank) {
      p.q_a = b.add(at + "q_a_proj.weight", {c.q_lora_rank, d}, true);
      p.q_a_norm = b.add(at + "q_a_layernorm.weight", {c.q_lora_rank}, false);
      b.add_split(p.q_b, at + "q_b_proj.weight", {H * c.qk_head_dim(), c.q_lora_rank}, true, true);
    } else {
      b.add_split(p.q, at + "q_proj.weight", {H * c.qk_head_dim(), d}, true, true);
    }
    p.kv_a = b.add(at + "kv_a_proj_with_mqa.weight", {c.kv_lora_rank + c.qk_rope_head_dim, d}, true);
    p.kv_a_norm = b.add(at + "kv_a_layernorm.weight", {c.kv_lora_rank}, false);
    b.add_split(p.kv_b, at + "kv_b_proj.weight", {H * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank}, true,
                true);
    b.add_split(p.o, at + "o_proj.weight", {d, H * c.v_head_dim}, true, false);
    if (c.is_v32()) {  // the indexer: whole on every tp rank; frozen (torch leaves its .grad None)
      const int64_t nI = c.v32.index_n_heads, dI = c.v32.index_head_dim;
      const std::string ix = at + "indexer.";
      auto frozen = [&](int64_t& off, const std::string& name, Shape s, bool decay) {
        off = b.add(name, s, decay);
        L.entries.back().frozen = true;
      };
      frozen(p.ix_wq_b, ix + "wq_b.weight", {nI * dI, c.q_lora_rank}, true);
      frozen(p.ix_wk, ix + "wk.weight", {dI, d}, true);
      frozen(p.ix_knorm_w, ix + "k_norm.weight", {dI}, false);
      frozen(p.ix_knorm_b, ix + "k_norm.bias", {dI}, false);
      frozen(p.ix_w, ix + "weights_proj.weight", {nI, d}, true);
    }
    p.post_norm = b.add(pre + "post_attention_layernorm.weight", {d}, false);
    const std::string mlp = pre + "mlp.";
    auto swiglu_pair = [&](const std::string& prefix, int64_t F, int64_t& gu, int64_t& down) {
      gu = b.slab(2 * F * d);
      b.sub(prefix + "gate_proj.weight", gu, {F, d}, true);
      b.sub(prefix + "up_proj.weight", gu + F * d, {F, d}, true);
      down = b.add(prefix + "down_proj.weight", {d, F}, true);
    };
    if (!c.is_moe_layer(l)) {
      // The dense MLP: tp-sharded, this rank's rows of gate_proj and of up_proj stacked as one
      // [2 F / tp, d] slab (so one GEMM computes both), and its columns of down_proj.
      b.tp_defer([&b, &L, &p, mlp, d, F = c.intermediate_size, swiglu_pair] {
        if (!L.tp.on()) return swiglu_pair(mlp, F, p.mlp_gu, p.mlp_down);
        const int64_t Fl = F / L.tp.size, f0 = L.tp.rank * Fl;
        p.mlp_gu = b.slab(2 * Fl * d);
        b.sub(mlp + "gate_proj.weight", p.mlp_gu, {Fl, d}, true);
        L.entries.back().rows_first = f0, L.entries.back().rows_total = F;
        b.sub(mlp + "up_proj.weight", p.mlp_gu + Fl * d, {Fl, d}, true);
        L.entries.back().rows_first = f0, L.entries.back().rows_total = F;
        p.mlp_down = b.add_tp_slice(mlp + "down_proj.weight", {d, F}, true, false);
      });
      return;
    }
    const int64_t E = c.n_routed_experts;
    p.router = b.add(mlp + "gate.weight", {E, d}, true);
    if (sharded) moe_layers.push_back(l);
    else add_experts(l);
    if (c.n_shared_experts > 0) swiglu_pair(mlp + "shared_experts.", c.shared_intermediate(), p.sh_gu, p.sh_down);
    if (!c.is_v2()) p.bias = b.buffer(mlp + "gate.e_score_correction_bias", E);  // V2 routers have none
  };
  const int64_t Lm = c.num_hidden_layers, D = c.v3_mtp_layers;
  L.layers.resize(Lm + D);
  for (int64_t l = 0; l < Lm; ++l) add_layer(l);
  if (!L.stage_sharded() || L.stage.last) {
    L.final_norm = b.add("model.norm.weight", {d}, false);
    L.head = c.tie_word_embeddings ? L.embed : b.add("lm_head.weight", {c.vocab_size, d}, true);
  }
  // MTP layers (model/mtp_v3.h) after the head, so the main model's tensors keep the offsets and the
  // random-init order they have without them.
  L.mtp3.resize(D);
  for (int64_t k = 0; k < D; ++k) {
    const int64_t l = Lm + k;
    if (L.holds_layer(l)) {
      const std::string pre = "model.layers." + std::to_string(l) + ".";
      V3MtpParams& t = L.mtp3[k];
      t.enorm = b.add(pre + "enorm.weight", {d}, false);
      t.hnorm = b.add(pre + "hnorm.weight", {d}, false);
      t.eh_proj = b.add(pre + "eh_proj.weight", {d, 2 * d}, true);
      t.head_norm = b.add(pre + "shared_head.norm.weight", {d}, false);
      t.head = c.v3_mtp_head_tied ? L.head : b.add(pre + "shared_head.head.weight", {c.vocab_size, d}, true);
    }
    add_layer(l);
  }
  b.tp_region(tp.region_align);
  if (sharded) {
    b.begin_expert_region(shard.region_align);
    for (int64_t l : moe_layers) add_experts(l);
  }
  return L;
}

}  // namespace trex::model
