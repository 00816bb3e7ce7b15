#include "plan/timing.h"

#include <algorithm>
#include <cmath>
#include "core/error.h"
#include "plan/gemm.h"
#include "plan/host.h"
#include "plan/precision.h"

namespace trex::plan {

double bubble_fraction_1f1b(int64_t pp, int64_t m) { return (double)(pp - 1) / (double)(m + pp - 1); }

Group place_group(const ClusterSpec& s, int64_t size, int64_t stride) {
  Group g;
  g.size = size;
  const int64_t per_node = std::max<int64_t>(1, s.devices_per_node / std::max<int64_t>(1, stride));
  g.nodes = (size + per_node - 1) / per_node;
  if (size <= 1) g.nodes = 1;
  const bool inter = g.nodes > 1;
  g.bw = inter ? s.inter_bw * s.eff.net_inter : s.intra_bw * s.eff.net_intra;
  g.lat = inter ? s.inter_lat : s.intra_lat;
  return g;
}

double ring_all_reduce(const Group& g, double bytes) { return 2 * ring_reduce_scatter(g, bytes); }

double ring_reduce_scatter(const Group& g, double bytes) {
  if (g.size <= 1 || bytes <= 0) return 0;
  const double n = (double)g.size;
  return (n - 1) / n * bytes / g.bw + (n - 1) * g.lat;
}

namespace {

// P(a given one of `nodes` nodes receives none of a token's experts).
double p_node_missed(const LayerCost& L, int64_t nodes) {
  auto ratio = [](double n, double g, double k) {  // C(n - g, k) / C(n, k)
    double p = 1;
    for (int i = 0; i < (int)k; ++i) p *= std::max(0.0, (n - g - i)) / (n - i);
    return p;
  };
  if (!L.hash_routed && L.n_group > 1 && L.topk_group < L.n_group && L.n_group % nodes == 0)
    return ratio((double)L.n_group, (double)(L.n_group / nodes), (double)L.topk_group);  // node-limited routing
  return ratio((double)L.n_experts, (double)L.n_experts / nodes, (double)L.topk);
}

}  // namespace

A2A ep_all_to_all(const ClusterSpec& s, const Layout& l, const LayerCost& L, int64_t hidden, double tokens,
                  double eb) {
  A2A r;
  if (l.ep <= 1 || !L.moe) return r;
  const Group g = place_group(s, l.ep, l.etp);
  const double nn = (double)g.nodes, dl = (double)l.ep / nn, k = (double)L.topk, d = (double)hidden;
  r.intra_bytes = tokens * k * d * eb * (dl - 1) / dl;
  if (g.nodes > 1) {
    const double remote = l.ep_dedup ? (nn - 1) * (1 - p_node_missed(L, g.nodes)) : k * (nn - 1) / nn;
    r.inter_bytes = tokens * remote * d * eb;
  }
  const double intra_bw = s.intra_bw * s.eff.net_intra, inter_bw = s.inter_bw * s.eff.net_inter;
  r.seconds = std::max(r.intra_bytes / intra_bw, g.nodes > 1 ? r.inter_bytes / inter_bw : 0.0) +
              (g.nodes > 1 ? s.inter_lat : s.intra_lat);
  return r;
}

namespace {

struct RankTime {
  double fwd = 0, bwd = 0, rec = 0, weight_grad = 0;
  double fwd_only = 0;  // forward work without a backward (the V4 CSA indexer: its selection has no gradient)
  // The routed experts' backward at their shapes (plan/gemm.h) minus the 2 x forward the backward
  // is otherwise charged; of it, the weight-gradient GEMMs minus 1 x forward.
  double expert_bwd_adj = 0, expert_wgrad_adj = 0;
  double experts_bwd = 0;                        // the routed experts' backward GEMMs
  double expert_rows = 0, expert_tile_eff = 1;   // of the chunk's first MoE layer (plan/gemm.h)
  bool expert_memory_bound = false;
  double quant_fwd = 0, quant_bwd = 0;  // low-precision quantize / transpose kernels, forward and backward
  // Of quant_fwd + quant_bwd: the experts' padding copies (each direction), the MX scale swizzle
  // (activations and weights, both directions).
  double pad_copies = 0, swizzle = 0;
  double gemm = 0, experts = 0, attention = 0, memory = 0;  // forward, by class
  double tp = 0, ep = 0, pp = 0, cp = 0;
  double ep_inter = 0, ep_intra = 0;
  double dense = 0, expert_params = 0;  // parameters held
  // The host (plan/host.h): seconds it spends launching the micro-batch's kernels, the kernels
  // launched, and the forward stretches that end at a host sync (one per dropless MoE layer).
  struct Window {
    double host = 0, device = 0, comm = 0;  // host s; device compute s (before slowdown); fwd comm s
    double restart = 0;                       // host s after the sync before the device is busy again
  };
  double host = 0, launches = 0, syncs = 0;
  std::vector<Window> windows;
};

struct Rates {
  double gemm, experts, attention, memory;
  double quantize;                   // bytes/s of the quantize / transpose kernels
  double swizzle;                    // bytes/s of the MX scale-swizzle kernels
  double sparse_attention, indexer;  // V4 attention core over key lists; CSA indexer scoring
  double optimizer;                  // bytes/s of the optimizer step
  double head;  // bf16 GEMM rate: the LM head and router stay bf16 under every recipe (DeepSeek-V3 sec. 3.3.1)
  PrecisionModel prec;
  GemmDevice grouped;  // the routed experts' grouped GEMMs at their shapes (plan/gemm.h)
  int64_t slot_pad;    // ClusterSpec::sparse_slot_pad
};

// Forward time of one layer for `tokens` tokens on one device, split by class.
void layer_fwd(const LayerCost& L, const Rates& R, const Layout& l, int64_t hidden, double tokens, RankTime& t,
               double& fwd) {
  const double expert_load = l.expert_load;
  const int64_t seq = l.seq;
  // Under a low-precision recipe the router (and V4's hyper-connection mixing) stay bf16.
  const double g = R.prec.low ? tokens * ((L.gemm_fwd - L.bf16_gemm_fwd) / R.gemm + L.bf16_gemm_fwd / R.head)
                              : tokens * L.gemm_fwd / R.gemm;
  // Routed experts at their shapes (roofline and tile grid, plan/gemm.h); their backward is charged
  // at its own shapes (expert_bwd_adj corrects the 2 x forward below).
  // Under a low-precision recipe each expert's rows are padded to the recipe's alignment.
  const ExpertGemms xg = expert_gemms(L, l, hidden, tokens, R.grouped,
                                      R.prec.cached_bytes > 0 ? R.prec.cached_bytes : 2.0, expert_pad_rows(R.prec));
  const double e = xg.fwd;
  t.expert_bwd_adj += xg.dgrad + xg.wgrad - 2 * xg.fwd;
  t.experts_bwd += xg.dgrad + xg.wgrad;
  if (L.moe && t.expert_rows == 0) t.expert_rows = xg.rows, t.expert_tile_eff = xg.tile_eff;
  t.expert_memory_bound = t.expert_memory_bound || xg.memory_bound;
  t.expert_wgrad_adj += xg.wgrad - xg.fwd;
  // The attention core and the CSA indexer as their kernels run them (plan/arch.h).
  const double idx = indexer_kernel_flops(L.attn, seq, R.slot_pad);
  const double attn_rate = L.attn.kind == AttnKind::MLA ? R.attention : R.sparse_attention;
  const double core = tokens * 2.0 * L.attn.heads * (L.attn.qk_dim + L.attn.v_dim) *
                      kernel_attended_keys(L.attn, seq, R.slot_pad) / attn_rate;
  double at = core + tokens * idx / R.indexer;
  // The indexer's KL loss (Layout::indexer_loss): the main attention's scores over the selected
  // keys once more for the target (forward only), and a backward through the indexer: its scoring
  // (2 x its forward, as any op here) and its projections' weight gradients only (1 x: their
  // inputs are detached). Without it the indexer runs forward only.
  if (l.indexer_loss && L.attn.index_topk > 0) {
    const int64_t entries = L.attn.kind == AttnKind::MLA ? seq : seq / std::max<int64_t>(L.attn.compress_ratio, 1);
    const double target =
        tokens * 2.0 * L.attn.heads * L.attn.qk_dim * (double)std::min(L.attn.index_topk, entries) / attn_rate;
    at += target;
    t.fwd_only += target + tokens * L.fwd_only_matmul_params / R.gemm;
  } else {
    t.fwd_only += tokens * idx / R.indexer + tokens * 2 * L.fwd_only_matmul_params / R.gemm;
  }
  // Quantize kernels (plan/precision.h): the linear layers' inputs forward, their output gradients
  // (and, for the 1x128 recipe, the inputs' transposed copies) backward; the MX scale swizzle.
  const PrecisionModel& P = R.prec;
  const double qi = tokens * (L.q_in + expert_load * L.q_in_routed);
  const double qg = tokens * (L.q_grad + expert_load * L.q_grad_routed);
  const double sw_f = qi * P.swizzle_fwd / R.swizzle, sw_b = (qi * P.swizzle_bwd + qg * P.swizzle_grad) / R.swizzle;
  t.quant_fwd += qi * P.quant_fwd / R.quantize + sw_f;
  t.quant_bwd += (qi * P.quant_bwd + qg * P.quant_grad) / R.quantize + sw_b;
  t.swizzle += sw_f + sw_b;
  // Padding copies (plan/precision.h): with the all-to-all dispatcher (no dedup) the routed
  // experts' input is copied into the padded buffer and their output back (each read and written
  // at 2 B an element, k d per token and load), and the two mirrored in the backward.
  const double pad = (R.prec.align_rows > 1 && !l.ep_dedup && L.moe && L.topk > 0)
                         ? tokens * expert_load * (double)L.topk * (double)hidden * 8.0 / R.memory
                         : 0.0;
  t.quant_fwd += pad;
  t.quant_bwd += pad;
  t.pad_copies += pad;
  const double m = tokens * L.elem_bytes_fwd / R.memory + qi * P.quant_fwd / R.quantize + sw_f + pad;
  t.gemm += g;
  t.experts += e;
  t.attention += at;
  t.memory += m;
  fwd += g + e + at + m;
}

Rates make_rates(const ClusterSpec& s, const Layout& l) {
  const PrecisionModel p = precision_model(s, l.precision);
  const Efficiency& e = s.eff;
  const double c = s.sustained_clock;  // the tensor rates at the power limit's clock
  return {c * p.gemm_peak * p.gemm_eff,
          c * p.gemm_peak * p.grouped_eff,
          c * s.peak_bf16 * e.attention,
          s.mem_bw * e.memory,
          s.mem_bw * e.quantize_or_memory(),
          s.mem_bw * e.swizzle_or_quantize(),
          c * s.peak_bf16 * e.sparse_attention_or_dense(),
          c * s.peak_bf16 * e.indexer_or_dense(),
          s.mem_bw * e.optimizer_or_memory(),
          c * s.peak_bf16 * e.gemm,
          p,
          gemm_device(s, c * p.gemm_peak * p.grouped_eff),
          s.sparse_slot_pad};
}

RankTime chunk_time(const ArchModel& a, const ClusterSpec& s, const Layout& l, const Chunk& c, const Rates& R) {
  RankTime t;
  const double tokens = l.local_tokens();
  const Group tp = place_group(s, l.tp, 1);
  const Group cpg = place_group(s, l.cp, l.tp);
  const Group pp = place_group(s, l.pp, l.tp * l.cp * l.dp);
  const int dirs = 2 + (l.recompute == Recompute::Full ? 1 : 0);  // fwd, bwd (+ replayed fwd)
  double fwd_layers = 0;
  const HostCost& hcost = s.host;
  const bool eager = l.graphs == Graphs::Off;
  auto host_ops = [&](double fwd_ops, double bwd_ops, double bwd_inner) {  // head, embedding, MTP glue
    if (!hcost.modelled() || l.graphs == Graphs::Full) return;
    t.host += (fwd_ops + bwd_ops) * hcost.op_s + bwd_inner * hcost.launch_s;
    t.launches += fwd_ops + bwd_ops + bwd_inner;
  };
  auto layer = [&](const LayerCost& L) {
    double f = 0;
    layer_fwd(L, R, l, a.hidden, tokens, t, f);
    fwd_layers += f;
    if (l.recompute == Recompute::Selective)
      t.rec += tokens * (L.upproj_fwd / R.gemm + L.elem_sel_bytes_fwd / R.memory);
    if (l.recompute_mlp && l.recompute != Recompute::Full) {  // the dense MLP replayed; SwiGLU (selective has it)
      t.rec += tokens * L.mlp_gemm_fwd / R.gemm;
      if (l.recompute == Recompute::None)
        t.rec += tokens * (L.swiglu_bytes_fwd + l.expert_load * L.swiglu_routed_bytes_fwd) / R.memory;
    }
    t.dense += L.dense_params;
    t.expert_params += L.expert_params;
    // MX: every local weight's row-wise (forward) and column-wise (data gradient) scales swizzled
    // before each GEMM, each micro-batch; half in each direction.
    const double ws = (L.dense_params / (double)l.tp + L.expert_params / (double)(l.ep * l.etp)) *
                      R.prec.weight_swizzle / R.swizzle;
    t.swizzle += ws;
    t.quant_fwd += ws / 2, t.quant_bwd += ws / 2;
    t.memory += ws / 2;
    f += ws / 2;
    fwd_layers += ws / 2;
    double comm = 0;  // this layer's communication, one direction
    if (l.tp > 1) {
      const double c = L.tp_collectives * ring_all_reduce(tp, (double)l.mbs * l.seq / l.cp * a.hidden * 2.0);
      t.tp += dirs * c;
      comm += c;
    }
    if (l.cp > 1) {  // keys and values (gradients backward) over the cp group
      const CpExchange x = cp_exchange_elems(L.attn, l.seq, l.tp);
      double c = ring_reduce_scatter(cpg, (double)l.mbs * x.gathered * 2.0);
      if (x.halo > 0) c += (double)l.mbs * x.halo * 2.0 / cpg.bw + cpg.lat;
      t.cp += dirs * c;
      comm += c;
    }
    if (L.moe && l.ep > 1) {
      const double tok = tokens * l.expert_load;
      A2A dis = ep_all_to_all(s, l, L, a.hidden, tok, R.prec.dispatch_bytes);
      A2A com = ep_all_to_all(s, l, L, a.hidden, tok, 2.0);
      t.ep += dirs * (dis.seconds + com.seconds);
      t.ep_inter += dis.inter_bytes + com.inter_bytes;
      t.ep_intra += dis.intra_bytes + com.intra_bytes;
      comm += dis.seconds + com.seconds;
    }
    if (!hcost.modelled()) return;
    const LayerLaunches k = layer_launches(L, l, std::max<int64_t>(1, L.n_experts / l.ep));
    const double hf = layer_host_seconds(k, false, l, hcost), hb = layer_host_seconds(k, true, l, hcost);
    t.launches += k.total_fwd().total() + k.total_bwd().total();
    double hr = 0;  // recompute: full replays the forward; selective its norms, up-projections and SwiGLU
    const RecipeLaunches q = precision_launches(l.precision);
    if (l.recompute == Recompute::Full) hr = hf;
    else if (l.recompute == Recompute::Selective && eager)
      hr = (4 + (L.moe ? 2 : 1) + 2) * hcost.op_s + 2 * (q.q_f + q.s_f) * hcost.launch_s;
    if (l.recompute_mlp && l.recompute != Recompute::Full && eager)  // dense fc1, act, fc2; routed act
      hr += L.moe ? hcost.op_s : 3 * hcost.op_s + 2 * (q.q_f + q.s_f) * hcost.launch_s;
    t.host += hf + hb + hr;
    if (k.sync) {
      const double restart = host_seconds(k.after_sync, hcost);
      t.windows.push_back({hf, f, comm, restart});
      if (l.recompute == Recompute::Full) t.windows.push_back({hr, f, comm, restart});
      t.syncs += l.recompute == Recompute::Full ? 2 : 1;
    }
  };
  for (int64_t i = 0; i < c.n_layers; ++i) layer(a.layers[c.first_layer + i]);
  if (l.recompute == Recompute::Full) t.rec += fwd_layers;
  double fwd_other = 0;
  const double d = (double)a.hidden, V = (double)a.vocab;
  if (c.embed) {
    host_ops(1, 1, 0);  // lookup; its gradient's scatter-add
    t.dense += a.embed_params;
    const double m = tokens * 4 * d / R.memory;  // gather rows, write activations
    t.memory += m;
    fwd_other += m;
  }
  if (c.head) {
    t.dense += a.final_norm_params + ((a.tied_embeddings && c.embed) ? 0 : a.head_params);
    const int64_t heads = 1 + (l.mtp ? a.mtp_modules : 0);
    host_ops(3.0 * heads, 3.0 * heads, 2.0 * heads);  // final norm, head linear, fused cross-entropy
    for (int64_t h = 0; h < heads; ++h) {
      // A calibrated fused head (Efficiency::head) includes its logit traffic.
      const bool fused = s.eff.head > 0;
      const double g = tokens * 2 * V * d / (fused ? s.sustained_clock * s.peak_bf16 * s.eff.head : R.head);
      const double m = fused ? 0.0 : tokens * 12 * V / R.memory;
      t.gemm += g;
      t.memory += m;
      fwd_other += g + m;
    }
    const double gm = tokens * 2 * a.final_mix_params / R.gemm;  // V4 hc_head stream collapse
    t.gemm += gm;
    fwd_other += gm;
    if (l.mtp)
      for (int64_t i = 0; i < a.mtp_modules; ++i) {
        layer(a.mtp_block);
        host_ops(4, 4, 3);  // two norms, concat, projection
        t.dense += a.mtp_extra_params;
        const double g = tokens * 2 * a.mtp_extra_matmul_params / R.gemm;
        t.gemm += g;
        fwd_other += g;
      }
  }
  t.fwd = fwd_layers + fwd_other;
  // Backward: twice the forward's work, except the quantize kernels, which have their own traffic,
  // and the routed experts, charged at their backward shapes (expert_bwd_adj).
  t.bwd = 2 * (t.fwd - t.fwd_only - t.quant_fwd) + t.quant_bwd + t.expert_bwd_adj;
  t.weight_grad = t.fwd - t.fwd_only - t.quant_fwd + t.expert_wgrad_adj;  // the weight-gradient half of the backward GEMMs
  if (hcost.modelled() && l.graphs == Graphs::Full) {
    t.host += 2 * l.vp * hcost.op_s;  // one graph replay per model chunk, forward and backward
    t.launches += 2 * l.vp;
  }
  if (l.pp > 1) {
    host_ops(2.0 * l.vp, 2.0 * l.vp, 0);  // send / receive per model chunk, each way
    const double bytes = tokens * (double)a.residual_width() * 2.0;
    t.pp = 2 * l.vp * (bytes / pp.bw + pp.lat);  // activation forward, its gradient backward, per model chunk
  }
  return t;
}

// Time of one micro-batch on a rank: compute slowed by the units lent to overlapped
// communication, plus the communication the overlap flags leave exposed.
struct MbTime {
  double slow = 1, exposed = 0, t_mb = 0;
};
MbTime mb_time(const RankTime& t, double dp_mb, const Layout& l, const Efficiency& e) {
  const bool ovl_ep = l.overlap_ep || l.schedule == Schedule::DualPipe;
  const bool ovl_pp = l.overlap_pp || l.schedule == Schedule::DualPipe;
  MbTime r;
  const double raw = t.fwd + t.bwd + t.rec;
  const double ovl = (ovl_ep ? t.ep : 0) + (l.overlap_tp ? t.tp : 0) + (ovl_pp ? t.pp : 0) + (l.overlap_dp ? dp_mb : 0) +
                     (l.overlap_cp ? t.cp : 0);
  const double share = e.comm_compute_share;
  r.slow = raw > 0 ? 1 + share / (1 - share) * std::min(1.0, ovl / raw) : 1;
  const double compute = raw * r.slow;
  const double hidden = std::min(ovl * e.overlap, compute);
  r.exposed = t.tp + t.ep + t.pp + t.cp + dp_mb - hidden;
  r.t_mb = compute + r.exposed;
  return r;
}

}  // namespace

std::vector<Chunk> pipeline_chunks(const ArchModel& a, const ClusterSpec& s, const Layout& l) {
  // Weights: the micro-batch time of each layer alone, and of the embedding and of the head (+ MTP)
  // alone, so that stages balance on the time they will take (communication included).
  const Rates R = make_rates(s, l);
  auto alone = [&](int64_t first, int64_t n, bool embed, bool head) {
    Layout one = l;
    one.pp = 1;  // no pipeline transfers in the weights
    RankTime t = chunk_time(a, s, one, Chunk{0, first, n, embed, head}, R);
    return mb_time(t, 0, l, s.eff).t_mb;
  };
  std::vector<double> w;
  for (int64_t i = 0; i < a.n_layers(); ++i) w.push_back(alone(i, 1, false, false));
  std::vector<int64_t> n = stage_layers(w, alone(0, 0, true, false), alone(0, 0, false, true), l.pp,
                                        l.schedule == Schedule::DualPipe);
  std::vector<Chunk> c(l.pp);
  int64_t first = 0;
  for (int64_t k = 0; k < l.pp; ++k) {
    c[k] = {k, first, n[k], k == 0, k == l.pp - 1};
    first += n[k];
  }
  return c;
}

StepTime plan_time(const ArchModel& a, const ClusterSpec& s, const Layout& l) {
  StepTime st;
  const Efficiency& e = s.eff;
  const Rates R = make_rates(s, l);
  const std::vector<Chunk> chunks = pipeline_chunks(a, s, l);
  std::vector<RankTime> ct;
  for (const Chunk& c : chunks) ct.push_back(chunk_time(a, s, l, c, R));
  const int64_t m = l.micro_batches();
  st.micro_batches = m;
  // Dense gradients over dp x cp (cp next to tp in the rank order), experts over edp.
  const Group dpg = place_group(s, l.dpcp(), l.tp), edpg = place_group(s, l.edp(), l.ep * l.etp);

  double worst = -1, dense_max = 0, exp_max = 0;
  for (int64_t r = 0; r < l.pp; ++r) {
    // A rank's time per micro-batch: its chunk, or the mean of its two DualPipe chunks.
    RankTime t;
    std::vector<int64_t> own = rank_chunks(l, r);
    const double w = 1.0 / (double)own.size();
    double dense = 0, experts = 0;
    for (int64_t ci : own) {
      const RankTime& c = ct[ci];
      t.fwd += w * c.fwd, t.bwd += w * c.bwd, t.rec += w * c.rec, t.weight_grad += w * c.weight_grad;
      t.gemm += w * c.gemm, t.experts += w * c.experts, t.attention += w * c.attention, t.memory += w * c.memory;
      t.experts_bwd += w * c.experts_bwd;
      if (t.expert_rows == 0) t.expert_rows = c.expert_rows, t.expert_tile_eff = c.expert_tile_eff;
      t.expert_memory_bound = t.expert_memory_bound || c.expert_memory_bound;
      t.tp += w * c.tp, t.ep += w * c.ep, t.pp += w * c.pp, t.cp += w * c.cp;
      t.quant_fwd += w * c.quant_fwd, t.quant_bwd += w * c.quant_bwd;
      t.swizzle += w * c.swizzle, t.pad_copies += w * c.pad_copies;
      t.ep_inter += w * c.ep_inter, t.ep_intra += w * c.ep_intra;
      t.host += w * c.host, t.launches += w * c.launches, t.syncs += w * c.syncs;
      for (const RankTime::Window& x : c.windows) t.windows.push_back({w * x.host, w * x.device, w * x.comm, w * x.restart});
      dense += c.dense, experts += c.expert_params;
    }
    const double G_d = dense / l.tp, G_e = experts / (double)(l.ep * l.etp);
    dense_max = std::max(dense_max, G_d);
    exp_max = std::max(exp_max, G_e);
    double dp_mb = 0;  // ZeRO-3: gather parameters for forward and backward, scatter gradients
    if (l.zero >= 3)
      dp_mb = 2 * ring_reduce_scatter(dpg, 2.0 * G_d) + ring_reduce_scatter(dpg, l.grad_bytes * G_d) +
              2 * ring_reduce_scatter(edpg, 2.0 * G_e) + ring_reduce_scatter(edpg, l.grad_bytes * G_e);
    const MbTime mt = mb_time(t, dp_mb, l, e);
    const double slow = mt.slow, exposed = mt.exposed, device_t_mb = mt.t_mb;
    // The host: between two syncs a stretch takes the longer of its launches and its device work
    // (the host runs ahead, up to the sync); the rest of the micro-batch likewise as one stretch.
    double t_mb = device_t_mb;
    if (s.host.modelled()) {
      const double comm_all = t.tp + t.ep + t.pp + t.cp + dp_mb;
      const double xf = comm_all > 0 ? exposed / comm_all : 0;  // exposed share of the communication
      double bound = 0, dev = 0, host = 0;
      for (const RankTime::Window& x : t.windows) {
        const double d = x.device * slow + xf * x.comm;
        bound += std::max(x.host, x.restart + d), dev += d, host += x.host;
      }
      t_mb = bound + std::max(t.host - host, device_t_mb - dev);
    }
    st.rank_t_mb.push_back(t_mb);
    if (t_mb > worst) {
      worst = t_mb;
      st.slow_rank = r;
      st.fwd = t.fwd * slow, st.bwd = t.bwd * slow, st.recompute = t.rec * slow;
      st.gemm = t.gemm, st.experts = t.experts, st.attention = t.attention, st.memory_bound = t.memory;
      st.experts_bwd = t.experts_bwd;
      st.expert_rows = t.expert_rows, st.expert_tile_eff = t.expert_tile_eff, st.expert_memory_bound = t.expert_memory_bound;
      st.quant_fwd = t.quant_fwd, st.quant_bwd = t.quant_bwd;
      st.swizzle = t.swizzle, st.pad_copies = 2 * t.pad_copies;
      const int dirs = 2 + (l.recompute == Recompute::Full ? 1 : 0);
      st.ep_intra_s = dirs * t.ep_intra / (s.intra_bw * s.eff.net_intra);
      st.ep_inter_s = dirs * t.ep_inter / (s.inter_bw * s.eff.net_inter);
      st.comm_tp = t.tp, st.comm_ep = t.ep, st.comm_pp = t.pp, st.comm_cp = t.cp, st.comm_dp_mb = dp_mb;
      st.exposed_mb = exposed;
      st.t_mb = t_mb;
      st.device_t_mb = device_t_mb;
      st.host_mb = t.host, st.launches_mb = t.launches, st.host_syncs_mb = t.syncs;
      st.ep_inter_bytes_mb = t.ep_inter, st.ep_intra_bytes_mb = t.ep_intra;
      // DualPipe bubble terms: F, B (full backward incl. recompute), W (weight-gradient part).
      const double F = t.fwd * slow + exposed / 3, B = (t.bwd + t.rec) * slow + 2 * exposed / 3;
      const double W = t.weight_grad * slow;
      st.bubble = l.schedule == Schedule::DualPipe ? (l.pp / 2.0 - 1) * std::max(0.0, F + 2 * B - 3 * W)
                                                   : (double)(l.pp - 1) * t_mb / (double)l.vp;
    }
  }
  st.compute = m * (st.fwd + st.bwd + st.recompute);
  st.exposed_comm = m * st.exposed_mb;

  // Gradient and parameter collectives once per step (ZeRO-0: all-reduce; 1-2: reduce-scatter of
  // gradients + all-gather of updated bf16 parameters), dense over dp and experts over edp.
  if (l.zero < 3) {
    double grads, params = 0;
    if (l.zero == 0) grads = ring_all_reduce(dpg, l.grad_bytes * dense_max) + ring_all_reduce(edpg, l.grad_bytes * exp_max);
    else {
      grads = ring_reduce_scatter(dpg, l.grad_bytes * dense_max) + ring_reduce_scatter(edpg, l.grad_bytes * exp_max);
      const double pbytes = s.replicated_f32_master ? 4.0 : 2.0;  // what the all-gather moves
      params = ring_reduce_scatter(dpg, pbytes * dense_max) + ring_reduce_scatter(edpg, pbytes * exp_max);
    }
    st.dp_comm = grads + params;
    st.dp_exposed = l.overlap_dp ? std::max(0.0, grads - e.overlap * st.bwd) +
                                       (l.overlap_param_gather ? std::max(0.0, params - e.overlap * st.fwd) : params)
                                 : grads + params;
  } else {
    st.dp_comm = m * st.comm_dp_mb;
  }
  // AdamW over the local shard: read grad, master, 2 moments; write master, 2 moments, bf16 param.
  const double local = l.zero >= 1 ? dense_max / l.dpcp() + exp_max / l.edp() : dense_max + exp_max;
  st.optimizer = local * (l.grad_bytes + 4 + 2 * l.moment_bytes + 4 + 2 * l.moment_bytes + 2) / R.optimizer;
  // The local gradient buffer is zeroed for the next step: one write of it (trex: kern::zero_bytes;
  // Megatron: zero_grad_buffer). Up to ZeRO-2 it holds every local parameter's gradient (the
  // backward writes all of them before the reduce-scatter); ZeRO-3 keeps the shard only.
  st.optimizer += (l.zero >= 3 ? local : dense_max + exp_max) * l.grad_bytes / R.optimizer;
  // Low precision: the updated weights are quantized once per step (cached across the step's
  // micro-batches): read bf16, write the row- and column-wise copies.
  if (R.prec.low) st.weight_cast = (dense_max + exp_max) * 4.0 / R.quantize;
  st.exposed_comm += st.dp_exposed;
  st.host_wait = m * (st.t_mb - st.device_t_mb);
  st.step = m * st.t_mb + st.bubble + st.dp_exposed + st.optimizer + st.weight_cast;
  st.tokens_per_step = (double)l.tokens_per_step();
  st.goodput = e.goodput;
  st.tokens_per_s = st.tokens_per_step / st.step * st.goodput;
  st.model_flops_per_token = a.model_flops_per_token(l.seq);
  st.mfu = st.model_flops_per_token * st.tokens_per_s / ((double)l.world() * s.peak_bf16);
  return st;
}

}  // namespace trex::plan
