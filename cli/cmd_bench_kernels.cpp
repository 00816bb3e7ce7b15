// trex bench kernels --config FILE [--set K=V] [--threads N] [--seconds S] [--passes P] [--filter TEXT]
// [--json]: every hot kernel of one training step of the config's model, timed alone at exactly the
// shapes the step runs it, against the roofline of this machine (issue 8).
//
// What a step runs is enumerated here layer by layer, mirroring model/model.cpp (V3: MLA, dense
// MLP, MoE; the MTP layers of model/mtp_v3.cpp), model/model_v4.cpp and model/v4_attn.cpp (V4:
// mHC, sliding / CSA / HCA attention, compressors, indexer, MTP blocks), model/moe.cpp,
// model/linear.cpp and train/optimizer.cpp: keep the walk (walk_v3, walk_v4) in step with those
// files. Calls of one kernel at one shape are one row; calls/step counts them over the forward
// and backward of every layer (x grad_accum), the optimizer once. MoE rows use one random top-k
// routing (model::router_select on random logits, bias 0: not forced balanced) for every MoE
// layer.
//
// Per row: the median ms of repeated runs filling about --seconds (operands are allocated once, so
// small shapes run from cache, unlike in a step); FLOPs and bytes per call from the formula at the
// row's builder in cli/bench_kernels_rows.cpp (bytes = compulsory traffic: every operand read once,
// every output written once and also read when accumulated into); AI = FLOPs / byte; roofline time
// = max(FLOPs / peak, bytes / bandwidth), i.e. the roofline rate is min(peak, AI x bandwidth);
// roofline % = roofline time / measured time. Peak: kern::measure_peak (as `trex bench peak`), its
// best of fp32 / bf16 / AMX tiles for bf16 GEMMs (they may run on the fp32 FMA units or, where
// oneDNN uses them, the tiles, kernels/gemm.h: the MFU denominator of `bench step`) and the fp32
// FMA peak for every other kernel (all f32); bandwidth:
// the triad of `trex bench calibrate` (plan/measure.cpp), measured in the same run. Loops of the
// model that are not kernels (residual adds, embedding gather / scatter, MLA split copies) are not
// listed: the total is the step's kernel time, not its step time.
#include "cli/bench_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "cli/bench_kernels_rows.h"
#include "core/cpu.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "core/timer.h"
#include "kernels/peak.h"
#include "kernels/rope.h"
#include "model/params.h"
#include "model/router.h"
#include "plan/measure.h"
#include "train/run_config.h"

namespace trex::cli {

namespace {

using namespace kbench;
using plan::median_ms;
using plan::triad_gbs;
using model::AttnKind;
using ll = long long;

// ---- The step, layer by layer ---------------------------------------------------------------

// Dense SwiGLU MLP (model/mlp.cpp): gate|up, SwiGLU, down (x_cast false: x's bf16 copy made by the
// caller).
void mlp(Plan& p, const Run& r, const std::string& w, int64_t F, float limit, bool x_cast = true) {
  const int64_t N = r.N, d = r.c.hidden_size;
  linear(p, r, w + ".gate_up", N, d, 2 * F, true, x_cast);
  swiglu(p, w, N, F, limit);
  linear(p, r, w + ".down", N, F, d);
}

// MoE layer (model/moe.cpp): route, dispatch, grouped expert GEMMs, combine, shared experts.
void moe(Plan& p, const Run& r, float limit) {
  const model::ModelConfig& c = r.c;
  const int64_t N = r.N, d = c.hidden_size, F = c.moe_intermediate_size, R = N * c.num_experts_per_tok;
  router(p, r, "router");
  moe_glue(p, r, "moe");
  if (r.bf) {  // one rank: x rounded once in each pass for the routed rows and the shared experts
    for (int i = 0; i < 2; ++i) to_bf16(p, "moe", N * d);       // x (fwd), x (bwd)
    to_bf16(p, "experts", R * d);                               // dy
    for (int i = 0; i < 2; ++i) to_bf16(p, "experts", R * F);  // h (fwd), h (bwd); dgu: swiglu_bwd_bf16
  }
  experts(p, r, "experts.gate_up", 2 * F, d);
  swiglu(p, "experts", R, F, limit, r.bf);
  experts(p, r, "experts.down", d, F);
  if (c.n_shared_experts > 0) mlp(p, r, "shared", c.shared_intermediate(), limit, false);
}

// DeepSeek-V3 multi-head latent attention (model/mla.cpp).
void mla(Plan& p, const Run& r, float softmax_scale) {
  const model::ModelConfig& c = r.c;
  const int64_t N = r.N, d = c.hidden_size, H = c.num_attention_heads, dn = c.qk_nope_head_dim,
                dr = c.qk_rope_head_dim, dqk = c.qk_head_dim(), dv = c.v_head_dim, rk = c.kv_lora_rank,
                rq = c.q_lora_rank;
  if (rq) {
    linear(p, r, "q_a", N, d, rq);
    rmsnorm(p, "q_a_norm", N, rq);
    linear(p, r, "q_b", N, rq, H * dqk);
  } else {
    linear(p, r, "q", N, d, H * dqk);
  }
  linear(p, r, "kv_a", N, d, rk + dr);
  rmsnorm(p, "kv_a_norm", N, rk);
  if (dr) {
    rope(p, r, "q", N, (int)H, H * dqk, dqk, dn, (int)dr, false);
    rope(p, r, "dq", N, (int)H, H * dqk, dqk, dn, (int)dr, true);
    rope(p, r, "k_pe", N, 1, dr, dr, 0, (int)dr, false);
    rope(p, r, "dk_pe", N, 1, rk + dr, dr, rk, (int)dr, true);
  }
  linear(p, r, "kv_b", N, rk, H * (dn + dv));
  attention(p, r, "mla", (int)H, (int)dqk, (int)dv, softmax_scale);
  linear(p, r, "o", N, H * dv, d);
}

// DeepSeek-V4 attention block of layer l (model/v4_attn.cpp), with its compressor and indexer.
void v4_attention(Plan& p, const Run& r, int64_t l) {
  const model::ModelConfig& c = r.c;
  const model::V4Config& v = c.v4;
  const AttnKind kind = v.attn[l];
  const int64_t N = r.N, B = r.B, T = r.T, d = c.hidden_size, H = c.num_attention_heads, hd = v.head_dim,
                qr = c.q_lora_rank, rd = c.qk_rope_head_dim, m = v.rate(l);
  const int64_t nw = kind == AttnKind::Sliding ? 0 : T / m;
  const std::string k = kind_name(kind);
  // x rounded to bf16 once in each pass for q_a, kv and the compressor's kv and gate (one rank)
  if (r.bf)
    for (int i = 0; i < 2; ++i) to_bf16(p, "attn", N * d);
  linear(p, r, "q_a", N, d, qr, true, false);
  rmsnorm(p, "q_a_norm", N, qr);
  linear(p, r, "q_b", N, qr, H * hd);
  rmsnorm(p, "q_norm", N * H, hd);
  for (const char* u : {"q", "dO"}) rope(p, r, u, N, (int)H, H * hd, hd, hd - rd, (int)rd, false);
  for (const char* u : {"o", "dq"}) rope(p, r, u, N, (int)H, H * hd, hd, hd - rd, (int)rd, true);
  linear(p, r, "kv", N, d, hd, true, false);
  rmsnorm(p, "kv_norm", N, hd);
  rope(p, r, "kv", N, 1, hd, hd, hd - rd, (int)rd, false);
  rope(p, r, "dkv", N, 1, hd, hd, hd - rd, (int)rd, true);
  if (kind != AttnKind::Sliding) {
    const int cc = kind == AttnKind::CSA ? 2 : 1;
    linear(p, r, "c_kv." + k, N, d, cc * hd, nw > 0, false);
    linear(p, r, "c_gate." + k, N, d, cc * hd, nw > 0, false);
    if (nw > 0) {
      compress_pool(p, r, "compressor." + k, m, hd, cc, true);
      rmsnorm(p, "c_norm." + k, B * nw, hd);
      rope(p, r, "c." + k, B * nw, 1, hd, hd, hd - rd, (int)rd, false);
      rope(p, r, "dc." + k, B * nw, 1, hd, hd, hd - rd, (int)rd, true);
    }
  }
  if (kind == AttnKind::CSA) {  // the indexer: forward only
    const int64_t dI = v.index_head_dim, nI = v.index_n_heads;
    if (nw > 0) {
      linear(p, r, "i_kv", N, d, 2 * dI, false);
      linear(p, r, "i_gate", N, d, 2 * dI, false);
      compress_pool(p, r, "indexer", m, dI, 2, false);
      rmsnorm(p, "i_norm", B * nw, dI, false);
      rope(p, r, "i_k", B * nw, 1, dI, dI, dI - rd, (int)rd, false);
    }
    linear(p, r, "i_q_b", N, qr, nI * dI, false);
    rope(p, r, "i_q", N, (int)nI, nI * dI, dI, dI - rd, (int)rd, false);
    linear(p, r, "i_w", N, d, nI, false);
    indexer(p, r, "indexer", nw, (int)nI, (int)dI, m, (int)v.index_topk);
  }
  sparse_attn(p, r, "attn." + k, V4Keys{kind, v.sliding_window, m ? m : 1, nw, v.index_topk}, (int)H, (int)hd);
  grouped_oa(p, r, "o_a", v.o_groups, H * hd / v.o_groups, v.o_lora_rank);
  linear(p, r, "o_b", N, v.o_groups * v.o_lora_rank, d);
}

// Final norm (after hc_head in V4), the bf16 copy of its output, LM head fused with cross-entropy.
void head(Plan& p, const Run& r, const std::string& w) {
  rmsnorm(p, w + ".norm", r.N, r.c.hidden_size);
  if (r.bf) to_bf16(p, w, r.N * r.c.hidden_size);
  lm_head_ce(p, r, w);
}

// DeepSeek-V3 decoder layers, then the MTP layers the run trains (model/mtp_v3.h: decoder layer
// num_hidden_layers + k - 1 of depth k, with enorm, hnorm, eh_proj and its shared_head).
void walk_v3(Plan& p, const Run& r, float softmax_scale) {
  const model::ModelConfig& c = r.c;
  const int64_t N = r.N, d = c.hidden_size;
  for (int64_t l = 0; l < c.num_hidden_layers + c.v3_mtp_layers; ++l) {
    rmsnorm(p, "input_norm", N, d);
    mla(p, r, softmax_scale);
    rmsnorm(p, "post_attn_norm", N, d);
    if (c.is_moe_layer(l)) moe(p, r, 0.f);
    else mlp(p, r, "mlp", c.intermediate_size, 0.f);
  }
  head(p, r, "head");
  for (int64_t k = 0; k < c.v3_mtp_layers; ++k) {
    rmsnorm(p, "mtp.enorm", N, d);
    rmsnorm(p, "mtp.hnorm", N, d);
    linear(p, r, "mtp.eh_proj", N, 2 * d, d);
    head(p, r, "mtp.shared_head");
  }
}

void walk_v4(Plan& p, const Run& r) {
  const model::ModelConfig& c = r.c;
  const model::V4Config& v = c.v4;
  const int64_t N = r.N, d = c.hidden_size, n = v.hc_mult;
  for (int64_t l = 0; l < c.num_hidden_layers + v.mtp_layers; ++l) {
    // The backward runs the MoE's pre step and the attention's post step in one pass.
    hyper_conn(p, r, "attn_hc", "pre");
    hyper_conn(p, r, "ffn_hc", "pre", true, false);
    hyper_conn(p, r, "attn_hc", "post", true, false);
    hyper_conn(p, r, "ffn_hc", "post");
    hyper_conn(p, r, "ffn_hc + attn_hc", "pre_then_post");
    rmsnorm(p, "input_norm", N, d);
    v4_attention(p, r, l);
    rmsnorm(p, "post_attn_norm", N, d);
    moe(p, r, (float)v.swiglu_limit);
  }
  for (int64_t k = 0; k <= v.mtp_layers; ++k) {  // the main head, then one per MTP depth
    const std::string w = k ? "mtp.head" : "head";
    hyper_conn(p, r, w, "head");
    head(p, r, w);
  }
  for (int64_t k = 0; k < v.mtp_layers; ++k) {
    rmsnorm(p, "mtp.enorm", N, d);
    rmsnorm(p, "mtp.hnorm", N * n, d);
    linear(p, r, "mtp.e_proj", N, d, d);
    linear(p, r, "mtp.h_proj", N * n, d, d);
  }
}

// One random top-k routing of N tokens: model::router_select on random logits, bias 0.
void route(Run& r) {
  const model::ModelConfig& c = r.c;
  const int64_t N = r.N, E = c.n_routed_experts, K = c.num_experts_per_tok;
  std::vector<float> logits(N * E), scores(N * E);
  Rng rng(4242);
  for (float& x : logits) x = (float)rng.normal();
  r.idx.assign(N * K, 0);
  r.probs.assign(N * K, 0.f);
  model::RouterOut o{scores.data(), r.idx.data(), r.probs.data()};
  model::router_select(c, logits.data(), nullptr, N, o);
  r.rows.assign(E, 0);
  for (int32_t e : r.idx) r.rows[e]++;
}

// ---- Timing and the table -------------------------------------------------------------------

struct Machine {
  kern::Peak peak;
  double bw_gbs = 0;
  double peak_for(const Op& o) const { return o.gemm_bf16 ? peak.best_gflops() : peak.fp32_gflops; }
  // Seconds the roofline allows one call.
  double roof_s(const Op& o) const { return std::max(o.flops / (peak_for(o) * 1e9), o.bytes / (bw_gbs * 1e9)); }
  bool compute_bound(const Op& o) const { return o.flops / (peak_for(o) * 1e9) >= o.bytes / (bw_gbs * 1e9); }
};

std::string join(const std::vector<std::string>& v, size_t max_chars) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string add = (i ? ", " : "") + v[i];
    if (max_chars && s.size() + add.size() > max_chars) return s + ", ...";
    s += add;
  }
  return s;
}

struct Opts {
  std::string config, filter;
  std::vector<std::string> sets;
  int threads = 0, passes = 1;
  double seconds = 0.5;
  bool json = false;
};

void run(const Opts& o) {
  TREX_USER_CHECK(o.seconds > 0 && std::isfinite(o.seconds), "use --seconds > 0", "--seconds ", o.seconds,
                  " is not a positive time");
  train::RunConfig rc = train::load_run_config(o.config, o.sets);
  if (rc.parallel.ep > 1)
    std::fprintf(stderr, "[bench kernels] parallel.ep = %lld is not modelled: the rows are those of one rank that "
                 "runs every expert (ep = 1)\n", (ll)rc.parallel.ep);
  TREX_USER_CHECK(rc.train.mtp_loss_weight <= 0 || rc.model.num_nextn_predict_layers > 0,
                  "set mtp_loss_weight = 0, or use a config with num_nextn_predict_layers > 0", o.config,
                  ": [train] mtp_loss_weight = ", rc.train.mtp_loss_weight, " needs MTP layers");
  TREX_USER_CHECK(!rc.model.is_v32(), "time a DeepSeek-V3.2 step with `trex bench step --profile` instead", o.config,
                  ": model_type deepseek_v32: trex bench kernels does not model the lightning indexer and the "
                  "sparse attention over its top-k yet (its rows would be dense MLA's)");
  const int threads = init_threads(o.threads > 0 ? o.threads : (int)rc.train.threads);
  // The config as the model trains it (MTP blocks when the run trains them, as model::Model).
  const model::ModelConfig cfg =
      model::with_mtp(rc.model, rc.train.mtp_loss_weight > 0 ? rc.model.num_nextn_predict_layers : 0);
  const int64_t B = rc.train.batch_size, T = rc.data.seq_len;
  Run r{cfg, rc.train.precision == kern::Prec::BF16, B, T, B * T, {}, {}, {}};
  if (cfg.n_routed_experts > 0) route(r);

  Plan p;
  if (cfg.is_v4()) {
    walk_v4(p, r);
  } else {
    // The softmax scale of model::Model (1/sqrt(dqk) times the YaRN factor).
    kern::RopeParams rp{(int)std::max<int64_t>(cfg.qk_rope_head_dim, 2), cfg.rope_theta};
    rp.yarn = cfg.rope_scaling.yarn, rp.factor = cfg.rope_scaling.factor;
    rp.mscale = cfg.rope_scaling.mscale, rp.mscale_all_dim = cfg.rope_scaling.mscale_all_dim;
    walk_v3(p, r, (float)(std::pow((double)cfg.qk_head_dim(), -0.5) * kern::yarn_softmax_mscale(rp)));
  }
  for (Op& op : p.ops) op.calls *= rc.train.grad_accum;  // micro-batches per step
  const model::ParamLayout L = model::build_layout(cfg);
  int64_t all = 0, trained = 0;  // sum_squares runs over every gradient, AdamW skips frozen tensors
  for (const model::ParamEntry& e : L.entries) {
    all += e.shape.numel();
    if (!e.frozen) trained += e.shape.numel();
  }
  optimizer(p, r, all, trained);
  if (!o.filter.empty()) {  // only the rows whose kernel, shape or uses mention the filter text
    auto has = [&](const Op& op) {
      std::string t = op.kernel + " " + op.shape;
      for (const std::string& w : op.where) t += " " + w;
      return t.find(o.filter) != std::string::npos;
    };
    std::erase_if(p.ops, [&](const Op& op) { return !has(op); });
    TREX_USER_CHECK(!p.ops.empty(), "use a kernel name (e.g. grouped_gemm), a use (q_a) or a shape", "--filter '",
                    o.filter, "' matches no kernel row of ", o.config);
  }

  // Passes: every row is timed once per pass, the passes one after the other, and keeps its lowest
  // median, so that a burst of other work on a shared machine spoils one pass, not the figure. The
  // peak and the bandwidth are measured before every pass and after the last, keeping the highest:
  // a roofline measured low would flatter every row.
  TREX_USER_CHECK(o.passes >= 1, "use --passes >= 1", "--passes ", o.passes, " is not a positive count");
  Machine mc;
  auto measure_machine = [&] {
    const kern::Peak pk = kern::measure_peak(std::clamp(o.seconds, 0.05, 0.5));
    mc.peak.fp32_gflops = std::max(mc.peak.fp32_gflops, pk.fp32_gflops);
    mc.peak.bf16_gflops = std::max(mc.peak.bf16_gflops, pk.bf16_gflops);
    mc.peak.amx_bf16_gflops = std::max(mc.peak.amx_bf16_gflops, pk.amx_bf16_gflops);
    mc.bw_gbs = std::max(mc.bw_gbs, triad_gbs(o.seconds));
  };
  for (int pass = 0; pass < o.passes; ++pass) {
    measure_machine();
    for (size_t i = 0; i < p.ops.size(); ++i) {
      Op& op = p.ops[i];
      double ms;
      {
        Bufs b;
        const Runner fn = op.make(b);
        ms = std::max(median_ms(fn, o.seconds), 1e-6) * op.scale;
      }
      op.ms = pass ? std::min(op.ms, ms) : ms;
      std::fprintf(stderr, "[bench kernels] pass %d: %zu/%zu %s %s: %.3f ms\n", pass + 1, i + 1, p.ops.size(),
                   op.kernel.c_str(), op.shape.c_str(), ms);
    }
  }
  measure_machine();

  std::sort(p.ops.begin(), p.ops.end(), [](const Op& a, const Op& b) { return a.ms * a.calls > b.ms * b.calls; });
  double total_ms = 0, roof_ms = 0;
  int64_t total_calls = 0;
  for (const Op& op : p.ops) {
    total_ms += op.ms * op.calls;
    roof_ms += mc.roof_s(op) * 1000 * op.calls;
    total_calls += op.calls;
  }
  const char* prec = r.bf ? "bf16" : "fp32";
  const std::string isa = isa_name(cpu_isa());
  if (o.json) {
    nlohmann::json m = {{"record", "machine"}, {"config", o.config}, {"model_type", cfg.model_type},
                        {"precision", prec}, {"batch", B}, {"seq", T}, {"tokens", r.N},
                        {"grad_accum", rc.train.grad_accum}, {"threads", threads}, {"isa", isa},
                        {"fp32_gflops", mc.peak.fp32_gflops}, {"bf16_gflops", mc.peak.bf16_gflops},
                        {"amx_bf16_gflops", mc.peak.amx_bf16_gflops}, {"best_gflops", mc.peak.best_gflops()}, {"mem_bw_gbs", mc.bw_gbs}, {"seconds", o.seconds},
                        {"passes", o.passes}};
    std::printf("%s\n", m.dump().c_str());
    for (const Op& op : p.ops) {
      const double s = op.ms / 1000;
      nlohmann::json j = {{"record", "kernel"}, {"kernel", op.kernel}, {"shape", op.shape}, {"where", op.where},
                          {"precision", op.gemm_bf16 ? "bf16" : "fp32"}, {"calls", op.calls}, {"ms_call", op.ms},
                          {"flops", op.flops}, {"bytes", op.bytes}, {"gflops", op.flops / s / 1e9},
                          {"gbs", op.bytes / s / 1e9}, {"ai", op.flops / op.bytes},
                          {"bound", mc.compute_bound(op) ? "compute" : "memory"},
                          {"roofline_pct", 100 * mc.roof_s(op) / s}, {"ms_step", op.ms * op.calls},
                          {"share_pct", 100 * op.ms * op.calls / total_ms}};
      if (!op.note.empty()) j["note"] = op.note;
      std::printf("%s\n", j.dump().c_str());
    }
    nlohmann::json t = {{"record", "total"}, {"calls", total_calls}, {"ms_step", total_ms},
                        {"roofline_ms_step", roof_ms}, {"roofline_pct", 100 * roof_ms / total_ms}};
    std::printf("%s\n", t.dump().c_str());
    return;
  }
  std::printf("## trex bench kernels: %s\n\n", o.config.c_str());
  std::printf("%s, %s, %lld x %lld = %lld tokens per micro-batch, grad_accum %lld; %d threads, ISA %s; median of "
              "runs filling %g s per kernel, lowest of %d pass(es). Peak (kern::measure_peak): fp32 FMA %.1f "
              "GFLOP/s, bf16 dot %.1f GFLOP/s%s; bf16 GEMMs rated against %.1f, all else against fp32. Bandwidth "
              "(triad as `bench calibrate`): %.1f GB/s.",
              cfg.model_type.c_str(), prec, (ll)B, (ll)T, (ll)r.N, (ll)rc.train.grad_accum, threads, isa.c_str(),
              o.seconds, o.passes, mc.peak.fp32_gflops, mc.peak.bf16_gflops,
              mc.peak.amx_bf16_gflops > 0 ? fmt(", AMX bf16 tiles %.1f GFLOP/s", mc.peak.amx_bf16_gflops).c_str() : "",
              mc.peak.best_gflops(), mc.bw_gbs);
  if (!r.rows.empty())
    std::printf(" MoE rows: one random top-%lld routing (not balanced), %lld..%lld rows per expert.",
                (ll)cfg.num_experts_per_tok, (ll)*std::min_element(r.rows.begin(), r.rows.end()),
                (ll)*std::max_element(r.rows.begin(), r.rows.end()));
  std::printf("\n\n| kernel | where | shape | calls/step | ms/call | achieved | AI | roofline %% | ms/step | share |\n"
              "|---|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const Op& op : p.ops) {
    const double s = op.ms / 1000;
    const std::string rate = mc.compute_bound(op) ? fmt("%.4g GFLOP/s", op.flops / s / 1e9)
                                                  : fmt("%.4g GB/s", op.bytes / s / 1e9);
    std::printf("| %s | %s | %s%s | %lld | %.4g | %s | %.4g | %.3g%% | %.4g | %.3g%% |\n", op.kernel.c_str(),
                join(op.where, 48).c_str(), op.shape.c_str(), op.note.empty() ? "" : (" (" + op.note + ")").c_str(),
                (ll)op.calls, op.ms, rate.c_str(), op.flops / op.bytes, 100 * mc.roof_s(op) / s, op.ms * op.calls,
                100 * op.ms * op.calls / total_ms);
  }
  std::printf("| **total** | | | %lld | | | | %.1f%% | %.4g | 100%% |\n\n", (ll)total_calls, 100 * roof_ms / total_ms,
              total_ms);
  std::printf("Roofline %% = max(FLOPs / peak, bytes / bandwidth) / measured time; the total's is the step's roofline "
              "kernel time (%.4g ms) over its measured kernel time. achieved: GFLOP/s where the roofline is the "
              "peak, GB/s where it is the bandwidth. Above 100%%: the operands stayed in cache between the "
              "repeated runs (in a step they may come from memory).\n",
              roof_ms);
}

}  // namespace

void add_bench_kernels(CLI::App& bench) {
  auto* k = bench.add_subcommand("kernels", "time every hot kernel at a config's training-step shapes against "
                                            "this machine's roofline");
  auto o = std::make_shared<Opts>();
  k->add_option("--config", o->config, "trex TOML run config ([model] + [data] + [train])")->required();
  k->add_option("--set", o->sets, "override a config value, KEY=VALUE (repeatable), e.g. data.seq_len=4096");
  k->add_option("--threads", o->threads, "threads (default train.threads, then TREX_THREADS or all cores)");
  k->add_option("--seconds", o->seconds, "time per kernel (the median of its runs is kept; default 0.5)");
  k->add_option("--passes", o->passes, "time every kernel this many times, pass after pass, keeping its lowest "
                                      "median (default 1; more on a shared machine)");
  k->add_option("--filter", o->filter, "time only the rows whose kernel, uses or shape contain this text (shares are "
                                      "then of those rows)");
  k->add_flag("--json", o->json, "one JSON object per line (machine, one per kernel, total) instead of markdown");
  k->callback([o] { run(*o); });
}

}  // namespace trex::cli

