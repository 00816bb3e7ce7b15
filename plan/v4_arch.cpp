// DeepSeek-V4 description for the planner, until the V4 config parser lands (issue 3).
//
// Sources of the figures:
//  - transformers src/transformers/models/deepseek_v4/configuration_deepseek_v4.py
//    (DeepseekV4Config defaults = V4-Flash: hidden 4096, 43 layers, 64 heads, head_dim 512,
//    q_lora 1024, o_groups 8, o_lora 1024, 256 experts top-6, moe_intermediate 2048, window 128,
//    index 64 heads x 128 dim, top-512, hc_mult 4, 20 Sinkhorn iterations, 3 hash layers, 1 MTP).
//  - hicann/cann-recipes-train (torchtitan-npu) DeepSeek-V4 model registry: the V4-Pro flavour
//    (hidden 7168, 61 layers, 128 heads, q_lora 1536, o_groups 16, o_lora 1024, 384 experts
//    top-6, moe_inter 3072, index_topk 1024) and the per-layer compress ratios of both models:
//    Flash (0, 0, 4) + (128, 4) x 20, Pro (128,) + (128, 4) x 30.
//  - DeepSeek's announced sizes: Flash 284B total / 13B active, Pro 1.6T / 49B (test_plan_arch
//    checks the counts below against them).
// Parameter shapes follow the reference inference code as described by the HF config docstring:
// attention wq_a [d, q_lora], wq_b [q_lora, H*hd], wkv [d, hd] (single KV head), grouped output
// wo_a (H*hd -> o_groups*o_lora, block-diagonal) and wo_b [o_groups*o_lora, d]; a compressor per
// compressed layer (wkv and wgate [d, coff*hd], coff = 2 for the overlapping ratio-4 windows); the
// CSA indexer (wq_b [q_lora, Hi*di], weights_proj [d, Hi], its own compressor at di); per
// sublayer hyper-connection mixing [hc*d, (2+hc)*hc].
#include "plan/v4_arch.h"

#include <nlohmann/json.hpp>
#include "core/error.h"

namespace trex::plan {

using nlohmann::json;

V4Arch v4_flash() {
  V4Arch v;
  v.name = "deepseek-v4-flash";
  v.source = "transformers DeepseekV4Config defaults; torchtitan-npu (hicann/cann-recipes-train) V4-Flash flavour";
  v.hidden = 4096;
  v.layers = 43;
  v.heads = 64;
  v.q_lora = 1024;
  v.o_groups = 8;
  v.o_lora = 1024;
  v.n_routed = 256;
  v.topk = 6;
  v.moe_inter = 2048;
  v.index_topk = 512;
  v.compress_ratios = {0, 0, 4};
  for (int i = 0; i < 20; ++i) v.compress_ratios.insert(v.compress_ratios.end(), {128, 4});
  v.published_total = 284e9;
  v.published_active = 13e9;
  return v;
}

V4Arch v4_pro() {
  V4Arch v;
  v.name = "deepseek-v4-pro";
  v.source = "torchtitan-npu (hicann/cann-recipes-train) V4-Pro flavour; transformers DeepseekV4Config";
  v.hidden = 7168;
  v.layers = 61;
  v.heads = 128;
  v.q_lora = 1536;
  v.o_groups = 16;
  v.o_lora = 1024;
  v.n_routed = 384;
  v.topk = 6;
  v.moe_inter = 3072;
  v.index_topk = 1024;
  v.compress_ratios = {128};
  for (int i = 0; i < 30; ++i) v.compress_ratios.insert(v.compress_ratios.end(), {128, 4});
  v.published_total = 1.6e12;
  v.published_active = 49e9;
  return v;
}

V4Arch v4_from_json(const json& j, const std::string& where) {
  const char* hint = "fix the value in the deepseek_v4 config.json";
  V4Arch v = v4_flash();
  v.name = where;
  v.source = where + " (deepseek_v4 config.json, read by the planner until the V4 parser lands)";
  v.published_total = v.published_active = 0;
  auto i64 = [&](const char* k, int64_t def) -> int64_t {
    if (!j.contains(k) || j[k].is_null()) return def;
    TREX_USER_CHECK(j[k].is_number_integer() && j[k].get<int64_t>() >= 0, hint, where, ": field '", k,
                    "' must be a non-negative integer, got ", j[k].dump());
    return j[k].get<int64_t>();
  };
  v.vocab = i64("vocab_size", v.vocab);
  v.hidden = i64("hidden_size", v.hidden);
  v.layers = i64("num_hidden_layers", v.layers);
  v.heads = i64("num_attention_heads", v.heads);
  v.head_dim = i64("head_dim", v.head_dim);
  v.rope_dim = i64("qk_rope_head_dim", v.rope_dim);
  v.q_lora = i64("q_lora_rank", v.q_lora);
  v.o_groups = i64("o_groups", v.o_groups);
  v.o_lora = i64("o_lora_rank", v.o_lora);
  v.n_routed = i64("n_routed_experts", v.n_routed);
  v.n_shared = i64("n_shared_experts", v.n_shared);
  v.topk = i64("num_experts_per_tok", v.topk);
  v.moe_inter = i64("moe_intermediate_size", v.moe_inter);
  v.hash_layers = i64("num_hash_layers", v.hash_layers);
  v.window = i64("sliding_window", v.window);
  v.index_heads = i64("index_n_heads", v.index_heads);
  v.index_dim = i64("index_head_dim", v.index_dim);
  v.index_topk = i64("index_topk", v.index_topk);
  v.hc_mult = i64("hc_mult", v.hc_mult);
  v.hc_sinkhorn_iters = i64("hc_sinkhorn_iters", v.hc_sinkhorn_iters);
  v.mtp = i64("num_nextn_predict_layers", v.mtp);
  for (int64_t x : {v.hidden, v.layers, v.heads, v.head_dim, v.q_lora, v.o_groups, v.o_lora, v.n_routed, v.topk,
                    v.moe_inter, v.hc_mult})
    TREX_USER_CHECK(x > 0, hint, where, ": a required V4 size is 0");
  TREX_USER_CHECK(v.heads % v.o_groups == 0, hint, where, ": num_attention_heads (", v.heads,
                  ") must be divisible by o_groups (", v.o_groups, ")");
  // Per-layer schedule: compress_ratios (legacy ints) or layer_types (+ compress_rates).
  int64_t csa = 4, hca = 128;
  if (j.contains("compress_rates") && j["compress_rates"].is_object()) {
    csa = j["compress_rates"].value("compressed_sparse_attention", csa);
    hca = j["compress_rates"].value("heavily_compressed_attention", hca);
  }
  std::vector<int64_t> r;
  if (j.contains("compress_ratios") && j["compress_ratios"].is_array()) {
    for (auto& x : j["compress_ratios"]) r.push_back(x.get<int64_t>());
  } else if (j.contains("layer_types") && j["layer_types"].is_array()) {
    for (auto& x : j["layer_types"]) {
      std::string t = x.get<std::string>();
      if (t == "sliding_attention") r.push_back(0);
      else if (t == "compressed_sparse_attention") r.push_back(csa);
      else if (t == "heavily_compressed_attention") r.push_back(hca);
      else TREX_USER_FAIL(hint, where, ": layer type '", t, "' is not a DeepSeek-V4 attention type");
    }
  } else {  // transformers default: 2 x HCA, then HCA / CSA interleaved
    for (int64_t l = 0; l < v.layers; ++l) r.push_back(l < 2 ? hca : ((l - 2) % 2 ? csa : hca));
  }
  TREX_USER_CHECK((int64_t)r.size() >= v.layers, hint, where, ": ", r.size(),
                  " compress ratios for ", v.layers, " layers");
  r.resize(v.layers);  // extra entries describe MTP layers
  v.compress_ratios = r;
  return v;
}

namespace {

LayerCost v4_layer(const V4Arch& v, int64_t ratio, bool hash) {
  const double d = (double)v.hidden, H = (double)v.heads, hd = (double)v.head_dim, ql = (double)v.q_lora;
  const double hc = (double)v.hc_mult, g = (double)v.o_groups, ol = (double)v.o_lora;
  const double Hi = (double)v.index_heads, di = (double)v.index_dim, rope = (double)v.rope_dim;
  LayerCost L;
  L.attn.heads = v.heads;
  L.attn.qk_dim = v.head_dim;
  L.attn.v_dim = v.head_dim;  // K and V are the same shared head
  L.attn.window = v.window;
  L.attn.compress_ratio = ratio;
  L.attn.kind = ratio == 0 ? AttnKind::SlidingWindow : ratio <= 4 ? AttnKind::CSA : AttnKind::HCA;
  if (L.attn.kind == AttnKind::CSA) {
    L.attn.index_topk = v.index_topk;
    L.attn.index_heads = v.index_heads;
    L.attn.index_dim = v.index_dim;
  }
  L.moe = true;
  L.hash_routed = hash;
  L.kind = std::string(attn_kind_name(L.attn.kind)) + (hash ? "+moe(hash)" : "+moe");
  L.input_elems = hc * d;

  const double coff = ratio == 4 ? 2 : 1;
  double attn_mm = d * ql + ql * H * hd + d * hd + H * hd * ol + g * ol * d;
  double attn_other = ql + hd + H + 2 * d;  // q norm, kv norm, sinks, two sublayer norms
  if (ratio > 0) {
    attn_mm += 2 * d * coff * hd;
    attn_other += ratio * coff * hd + hd;  // absolute position bias, compressed-entry norm
  }
  if (L.attn.kind == AttnKind::CSA) {
    attn_mm += ql * Hi * di + d * Hi + 2 * d * 2 * di;
    attn_other += 4 * 2 * di + di;
  }
  const double hc_mm = 2 * (2 + hc) * hc * hc * d;  // mixing projection of both sublayers
  attn_other += 2 * ((2 + hc) * hc + 3);
  L.upproj_fwd = 2 * (ql * H * hd + (L.attn.kind == AttnKind::CSA ? ql * Hi * di : 0));

  const double I = (double)v.moe_inter, Is = (double)(v.moe_inter * v.n_shared);
  const double E = (double)v.n_routed, k = (double)v.topk;
  L.n_experts = v.n_routed;
  L.topk = v.topk;
  L.expert_params = E * 3 * d * I;
  const double mlp_mm = 3 * d * Is + E * d;
  L.dense_params = attn_mm + attn_other + hc_mm + mlp_mm;
  L.active_matmul_params = attn_mm + hc_mm + mlp_mm + k * 3 * d * I;
  L.gemm_fwd = 2 * (attn_mm + hc_mm + mlp_mm);
  L.expert_fwd = 2 * k * 3 * d * I;

  auto& S = L.saved;
  const double mix = (2 + hc) * hc;
  S.push_back({"hc.attn_in [hc*d]", hc * d, 2, false, false});
  S.push_back({"hc.attn_mix [(2+hc)*hc] f32", mix, 4, false, false});
  S.push_back({"attn.x_norm [d]", d, 2, true, true});
  S.push_back({"attn.q_a [q_lora]", ql, 2, false, false});
  S.push_back({"attn.q_a_norm [q_lora]", ql, 2, true, true});
  S.push_back({"attn.q [H*hd]", H * hd, 2, false, true});
  S.push_back({"attn.kv [hd]", hd, 2, false, false});
  if (ratio > 0) {
    S.push_back({"cmp.kv_gate [2*coff*hd]", 2 * coff * hd, 2, false, true});
    S.push_back({"cmp.entries [hd/ratio]", hd / ratio, 2, false, false});
  }
  if (L.attn.kind == AttnKind::CSA) {
    S.push_back({"idx.q [Hi*di]", Hi * di, 2, false, true});
    S.push_back({"idx.kv_gate [4*di]", 4 * di, 2, false, true});
    S.push_back({"idx.weights [Hi] f32", Hi, 4, false, false});
    S.push_back({"idx.topk [index_topk] i32", (double)v.index_topk, 4, false, false});
  }
  S.push_back({"attn.out [H*hd]", H * hd, 2, true, false});
  S.push_back({"attn.lse [H] f32", H, 4, false, false});
  S.push_back({"attn.o_a [o_groups*o_lora]", g * ol, 2, true, false});
  S.push_back({"hc.attn_out [d]", d, 2, false, false});
  S.push_back({"hc.ffn_in [hc*d]", hc * d, 2, false, false});
  S.push_back({"hc.ffn_mix [(2+hc)*hc] f32", mix, 4, false, false});
  S.push_back({"ffn.x_norm [d]", d, 2, true, true});
  S.push_back({"moe.router_scores [E] f32", E, 4, false, false});
  S.push_back({"moe.dispatched [k*d]", k * d, 2, true, false, true});
  S.push_back({"moe.gate_up [k*2I]", k * 2 * I, 2, true, false, true});
  S.push_back({"moe.act [k*I]", k * I, 2, true, true, true});
  S.push_back({"moe.expert_out [k*d]", k * d, 2, false, false, true});
  S.push_back({"shared.gate_up [2Is]", 2 * Is, 2, true, false});
  S.push_back({"shared.act [Is]", Is, 2, true, true});
  S.push_back({"hc.ffn_out [d]", d, 2, false, false});

  // Memory-bound forward traffic (bytes). Hyper-connections per sublayer: read the streams for
  // the mixing projection and the pre-combine, write the sublayer input, read its output and the
  // streams again, write the new streams; Sinkhorn iterations on the (hc x hc) matrix.
  const double hc_bytes = 2 * (2 * (4 * hc * d + 2 * d) + 2 * 8 * hc * hc * (double)v.hc_sinkhorn_iters / 2);
  const double norms = 2 * 4 * d + 4 * ql + 4 * H * hd + 4 * hd;
  const double rope_b = 4 * H * rope + 4 * rope + 4 * H * rope;  // q, k, inverse RoPE on the output
  const double cmp = ratio > 0 ? 4 * coff * hd + (L.attn.kind == AttnKind::CSA ? 8 * di : 0) : 0;
  const double swiglu = 6 * k * I + 6 * Is;
  const double moe = 12 * E + 2 * (d + k * d) + swiglu + 2 * (k * d + d);
  L.elem_bytes_fwd = hc_bytes + norms + rope_b + cmp + moe;
  L.elem_sel_bytes_fwd = norms + swiglu + hc_bytes / 2;
  return L;
}

}  // namespace

ArchModel arch_from_v4(const V4Arch& v) {
  ArchModel a;
  a.name = v.name;
  a.family = "deepseek_v4";
  a.source = v.source + " [planner-side V4 description until the V4 config parser lands]";
  a.hidden = v.hidden;
  a.vocab = v.vocab;
  a.heads = v.heads;
  a.hc_mult = v.hc_mult;
  a.n_experts = v.n_routed;
  a.topk = v.topk;
  TREX_USER_CHECK((int64_t)v.compress_ratios.size() == v.layers, "give one compress ratio per layer", v.name,
                  ": ", v.compress_ratios.size(), " compress ratios for ", v.layers, " layers");
  for (int64_t l = 0; l < v.layers; ++l) a.layers.push_back(v4_layer(v, v.compress_ratios[l], l < v.hash_layers));
  const double d = (double)v.hidden, V = (double)v.vocab, hc = (double)v.hc_mult;
  a.embed_params = V * d;
  a.head_params = V * d;
  a.final_norm_params = d + hc * hc * d + hc + 1;  // final norm + stream-collapse projection
  a.mtp_modules = v.mtp;
  a.mtp_block = v4_layer(v, 0, false);
  a.mtp_extra_params = 2 * d * d + 3 * d;  // e_proj, h_proj, enorm, hnorm, norm
  return a;
}

}  // namespace trex::plan
