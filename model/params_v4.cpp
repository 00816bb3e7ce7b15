// DeepSeek-V4 parameter layout under the Hugging Face DeepseekV4ForCausalLM names (MTP blocks,
// which transformers does not model, under mtp.<k>. with the same inner names as a layer). Experts are
// stored merged as HF does: experts.gate_up_proj [E, 2F, d] (gate rows first) and
// experts.down_proj [E, d, F]. Buffers: e_score_correction_bias [E] (top-k layers) and
// tid2eid [vocab, K] (hash layers).
#include "model/params.h"

namespace trex::model {

ParamLayout build_layout_v4(const ModelConfig& c, ExpertShard shard, StageShard stage, TpShard tp) {
  ParamLayout L;
  LayoutBuilder b{L};
  const bool sharded = apply_expert_shard(c, shard, L);
  apply_stage_shard(c, stage, L);
  // tp-sharded: the split tensors (q_b_proj, o_a_proj and sinks by rows, o_b_proj by columns) go
  // after the other dense tensors.
  apply_tp_shard(c, tp, L);
  const V4Config& v = c.v4;
  const int64_t d = c.hidden_size, H = c.num_attention_heads, hd = v.head_dim, n = v.hc_mult, qr = c.q_lora_rank;
  const int64_t E = c.n_routed_experts, F = c.moe_intermediate_size, K = c.num_experts_per_tok;
  const int64_t nmix = (2 + n) * n;
  // The routed experts held: gate_up_proj [count, 2F, d] (gate rows first) and down_proj
  // [count, d, F], rows [expert_first, ...) of the checkpoint's [E, ...] when sharded.
  auto add_experts = [&](int64_t l, const std::string& mlp) {
    LayerParams& p = L.layers[l];
    const int64_t ne = L.expert_count;
    p.exp_gu = b.add(mlp + "experts.gate_up_proj", {ne, 2 * F, d}, true);
    if (sharded) L.entries.back().rows_first = L.expert_first, L.entries.back().rows_total = E;
    p.exp_down = b.add(mlp + "experts.down_proj", {ne, d, F}, true);
    if (sharded) L.entries.back().rows_first = L.expert_first, L.entries.back().rows_total = E;
  };
  std::vector<std::pair<int64_t, std::string>> moe_layers;  // sharded: experts go into the expert region
  if (stage_holds_embedding(c, L.stage)) L.embed = b.add("model.embed_tokens.weight", {c.vocab_size, d}, true);
  if (embedding_shared(c, L.stage) && L.embed >= 0) b.end_shared_region(stage.region_align);
  const int64_t nl = c.num_hidden_layers + v.mtp_layers;
  L.layers.resize(nl);
  L.v4.resize(nl);
  L.mtp.resize(v.mtp_layers);
  for (int64_t l = 0; l < nl; ++l) {
    LayerParams& p = L.layers[l];
    V4LayerParams& q = L.v4[l];
    const bool is_mtp = l >= c.num_hidden_layers;
    const std::string pre = is_mtp ? "mtp." + std::to_string(l - c.num_hidden_layers) + "."
                                   : "model.layers." + std::to_string(l) + ".";
    if (!L.holds_layer(l)) {  // another stage's layer: its buffers only (every rank keeps them all)
      if (v.hash[l]) q.tid2eid = b.buffer(pre + "mlp.gate.tid2eid", c.vocab_size * K, K);
      else p.bias = b.buffer(pre + "mlp.gate.e_score_correction_bias", E);
      continue;
    }
    if (is_mtp) {  // MTP block extras (DeepSeek-V4 inference/model.py MTPBlock)
      V4MtpParams& t = L.mtp[l - c.num_hidden_layers];
      t.e_proj = b.add(pre + "e_proj.weight", {d, d}, true);
      t.h_proj = b.add(pre + "h_proj.weight", {d, d}, true);
      t.enorm = b.add(pre + "enorm.weight", {d}, false);
      t.hnorm = b.add(pre + "hnorm.weight", {d}, false);
      t.norm = b.add(pre + "norm.weight", {d}, false);
      t.hc_fn = b.add(pre + "hc_head.hc_fn", {n, n * d}, true);
      t.hc_base = b.add(pre + "hc_head.hc_base", {n}, false);
      t.hc_scale = b.add(pre + "hc_head.hc_scale", {1}, false);
    }
    const std::string at = pre + "self_attn.";
    p.in_norm = b.add(pre + "input_layernorm.weight", {d}, false);
    p.post_norm = b.add(pre + "post_attention_layernorm.weight", {d}, false);
    q.attn_hc_fn = b.add(pre + "attn_hc.fn", {nmix, n * d}, true);
    q.attn_hc_base = b.add(pre + "attn_hc.base", {nmix}, false);
    q.attn_hc_scale = b.add(pre + "attn_hc.scale", {3}, false);
    q.ffn_hc_fn = b.add(pre + "ffn_hc.fn", {nmix, n * d}, true);
    q.ffn_hc_base = b.add(pre + "ffn_hc.base", {nmix}, false);
    q.ffn_hc_scale = b.add(pre + "ffn_hc.scale", {3}, false);
    q.q_a = b.add(at + "q_a_proj.weight", {qr, d}, true);
    q.q_a_norm = b.add(at + "q_a_norm.weight", {qr}, false);
    b.add_split(q.q_b, at + "q_b_proj.weight", {H * hd, qr}, true, true);
    q.kv = b.add(at + "kv_proj.weight", {hd, d}, true);
    q.kv_norm = b.add(at + "kv_norm.weight", {hd}, false);
    b.add_split(q.o_a, at + "o_a_proj.weight", {v.o_groups * v.o_lora_rank, H * hd / v.o_groups}, true, true);
    b.add_split(q.o_b, at + "o_b_proj.weight", {d, v.o_groups * v.o_lora_rank}, true, false);
    b.add_split(q.sinks, at + "sinks", {H}, false, true);
    if (v.attn[l] != AttnKind::Sliding) {
      const int64_t cc = v.attn[l] == AttnKind::CSA ? 2 : 1, m = v.rate(l);
      const std::string cp = at + "compressor.";
      q.c_kv = b.add(cp + "kv_proj.weight", {cc * hd, d}, true);
      q.c_gate = b.add(cp + "gate_proj.weight", {cc * hd, d}, true);
      q.c_pb = b.add(cp + "position_bias", {m, cc * hd}, true);
      q.c_norm = b.add(cp + "kv_norm.weight", {hd}, false);
      if (v.attn[l] == AttnKind::CSA) {
        const std::string ip = cp + "indexer.";
        const int64_t dI = v.index_head_dim;
        q.i_kv = b.add(ip + "kv_proj.weight", {2 * dI, d}, true);
        q.i_gate = b.add(ip + "gate_proj.weight", {2 * dI, d}, true);
        q.i_pb = b.add(ip + "position_bias", {m, 2 * dI}, true);
        q.i_norm = b.add(ip + "kv_norm.weight", {dI}, false);
        q.i_qb = b.add(ip + "q_b_proj.weight", {v.index_n_heads * dI, qr}, true);
        q.i_w = b.add(ip + "scorer.weights_proj.weight", {v.index_n_heads, d}, true);
      }
    }
    const std::string mlp = pre + "mlp.";
    p.router = b.add(mlp + "gate.weight", {E, d}, true);
    if (sharded) moe_layers.push_back({l, mlp});
    else add_experts(l, mlp);
    if (c.n_shared_experts > 0) {
      const int64_t Fs = c.shared_intermediate();
      const std::string sp = mlp + "shared_experts.";
      p.sh_gu = b.slab(2 * Fs * d);
      b.sub(sp + "gate_proj.weight", p.sh_gu, {Fs, d}, true);
      b.sub(sp + "up_proj.weight", p.sh_gu + Fs * d, {Fs, d}, true);
      p.sh_down = b.add(sp + "down_proj.weight", {d, Fs}, true);
    }
    if (v.hash[l]) q.tid2eid = b.buffer(mlp + "gate.tid2eid", c.vocab_size * K, K);
    else p.bias = b.buffer(mlp + "gate.e_score_correction_bias", E);
  }
  if (!L.stage_sharded() || L.stage.last) {
    L.final_norm = b.add("model.norm.weight", {d}, false);
    L.hc_head_fn = b.add("model.hc_head.hc_fn", {n, n * d}, true);
    L.hc_head_base = b.add("model.hc_head.hc_base", {n}, false);
    L.hc_head_scale = b.add("model.hc_head.hc_scale", {1}, false);
    L.head = c.tie_word_embeddings ? L.embed : b.add("lm_head.weight", {c.vocab_size, d}, true);
  }
  b.tp_region(tp.region_align);
  if (sharded) {
    b.begin_expert_region(shard.region_align);
    for (const auto& [l, mlp] : moe_layers) add_experts(l, mlp);
  }
  // The indexer only selects (top-k): autograd gives its weights no gradient at all.
  for (ParamEntry& e : L.entries)
    if (e.name.find(".compressor.indexer.") != std::string::npos) e.frozen = true;
  return L;
}

}  // namespace trex::model
