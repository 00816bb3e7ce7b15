#include "plan/limits.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include "core/error.h"
#include "plan/precision.h"

namespace trex::plan {

namespace {

std::string num(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// Three significant figures without an exponent (989, 2250, 8.00, 0.352): the CPU's rates are
// below 1 TFLOP/s and 1 TB/s.
std::string fig(double v) {
  return num(v >= 100 ? "%.0f" : v >= 10 ? "%.1f" : v >= 1 ? "%.2f" : "%.3g", v);
}

bool has_low_precision(const ClusterSpec& s) { return s.peak_fp8 > 0; }

}  // namespace

std::vector<Limit> step_limits(const ClusterSpec& s, const Layout& l, const StepTime& t) {
  std::vector<Limit> v;
  const double m = (double)t.micro_batches;
  const PrecisionModel p = precision_model(s, l.precision);
  const std::string prec = precision_name(l.precision);
  const std::string peak = fig(p.gemm_peak / 1e12) + " TFLOP/s " + (p.low ? prec : "bf16") + " peak";
  const bool bf16 = !p.low;
  const std::string lower = s.mx_formats ? "precision=mxfp8" : "precision=fp8";
  // Compute: forward + backward (2x forward) on the slowest pipeline rank; compute runs on the
  // critical path, so busy = exposed.
  auto compute = [&](const std::string& phase, double sec, std::string bound, std::string helps) {
    if (sec > 0) v.push_back({phase, sec, sec, std::move(bound), std::move(helps)});
  };
  const std::string clock =
      s.sustained_clock < 1 ? num(", at the power limit x %.2f", s.sustained_clock) : std::string();
  compute("dense GEMMs", 3 * m * t.gemm, "tensor cores: " + prec + " GEMMs at " + num("%.2f", p.gemm_eff) + " of the " + peak + clock,
          bf16 && has_low_precision(s) ? lower + " (dense GEMMs on the low-precision peak)"
          : l.tp > 1                   ? "compute-bound; tp=1 gives each device larger GEMMs"
                                       : "compute-bound: more devices, or a faster recipe");
  compute("expert GEMMs", m * (t.experts + t.experts_bwd),
          "tensor cores: grouped GEMMs at " + num("%.2f", p.grouped_eff) + " of the " + peak + clock +
              (t.expert_rows > 0 ? num(", %.0f rows per expert", t.expert_rows) : "") +
              (t.expert_tile_eff < 0.995 ? num(", tile grid %.2f", t.expert_tile_eff) : "") +
              (t.expert_memory_bound ? " (weight-gradient accumulation HBM-bound)" : "") +
              (l.expert_load > 1 ? num(", x %.2f for the busiest expert rank", l.expert_load) : ""),
          l.expert_load > 1 ? "balanced routing (expert_load toward 1): the busiest rank sets the pace"
          : bf16 && has_low_precision(s) ? lower + " (expert GEMMs on the low-precision peak)"
                                         : "compute-bound: larger mbs gives each expert larger GEMMs");
  compute("attention core", 3 * m * t.attention,
          "tensor cores at bf16 (the attention core stays bf16 under every recipe), " +
              num("%.2f", s.eff.attention) + " of the bf16 peak",
          l.cp > 1 ? "compute-bound at bf16; a larger cp splits each sequence's attention over more devices"
                   : "compute-bound at bf16; context parallelism (cp=2, 3, ...) splits each sequence's attention "
                     "over more devices");
  const double mem = 3 * m * (t.memory_bound - t.quant_fwd) + m * (t.quant_fwd + t.quant_bwd);
  compute("memory-bound kernels", mem,
          "HBM bandwidth (" + fig(s.mem_bw / 1e12) + " TB/s at " + num("%.2f", s.eff.memory) + ")" +
              (t.quant_fwd > 0 ? ", " + num("%.0f%%", 100 * m * (t.quant_fwd + t.quant_bwd) / mem) +
                                     " of it " + prec + " quantize / transpose kernels" +
                                     (s.eff.quantize > 0 ? num(" (at %.2f)", s.eff.quantize) : "") +
                                     (t.swizzle > 0 ? num(", of which %.0f%% scale swizzle", 100 * m * t.swizzle / mem) : "") +
                                     (t.pad_copies > 0 ? num(", %.0f%% expert padding copies", 100 * m * t.pad_copies / mem)
                                                       : "")
                               : ""),
          t.quant_fwd > 0 ? "fusing quantization into norms / SwiGLU (kernel work; does not speed up with the recipe)"
                          : "does not speed up with precision; fewer norms / permutes per token (kernel fusion)");
  compute("recompute", m * t.recompute, "the same units as the forward it replays",
          l.recompute == Recompute::Full ? "recompute=selective when memory allows" : "recompute=none when memory allows");

  // Communication per micro-batch: overlapped flags hide up to `overlap` of it.
  const bool ovl_ep = l.overlap_ep || l.schedule == Schedule::DualPipe;
  const bool ovl_pp = l.overlap_pp || l.schedule == Schedule::DualPipe;
  auto comm = [&](const std::string& phase, double busy, bool ovl, std::string bound, std::string helps) {
    if (busy <= 0) return;
    v.push_back({phase, busy, ovl ? busy * (1 - s.eff.overlap) : busy, std::move(bound), std::move(helps)});
  };
  const bool inter_bound = t.ep_inter_s > t.ep_intra_s;
  comm("expert all-to-all", m * t.comm_ep, ovl_ep,
       inter_bound ? "inter-node network: " + num("%.0f", s.inter_bw / 1e9) + " GB/s per device (" +
                         num("%.0f%%", 100 * t.ep_inter_s / std::max(1e-30, t.comm_ep)) + " of the a2a time on it)"
                   : "scale-up link: " + num("%.0f", s.intra_bw / 1e9) + " GB/s per device",
       !ovl_ep ? "overlap=ep+dp (hide the all-to-all behind compute) or schedule=dualpipe"
       : inter_bound
           ? "ep within one scale-up domain (ep <= " + std::to_string(s.devices_per_node) + "), dedup=1, fp8 dispatch"
           : "mostly hidden; fewer ep ranks if the hidden share is short of compute");
  comm("tensor-parallel collectives", m * t.comm_tp, l.overlap_tp,
       "scale-up link: " + num("%.0f", s.intra_bw / 1e9) + " GB/s per device",
       "tp=1 (or overlap=...+tp); keep tp inside a node");
  comm("pipeline transfers", m * t.comm_pp, ovl_pp, "the link between stages", "fewer stages (pp, vp)");
  comm("context-parallel exchange (keys and values)", m * t.comm_cp, l.overlap_cp,
       "the cp group's link (cp ranks next to the tp ranks)",
       "a smaller cp (more memory per device), overlap=...+cp, or cp inside one scale-up domain");
  if (t.bubble > 0)
    v.push_back({"pipeline bubble", t.bubble, t.bubble,
                 "pipeline depth: pp " + std::to_string(l.pp) + (l.vp > 1 ? " / vp " + std::to_string(l.vp) : "") +
                     " against " + std::to_string(t.micro_batches) + " micro-batches",
                 l.schedule == Schedule::DualPipe ? "more micro-batches per step (larger gbs or smaller dp)"
                 : l.vp > 1 ? "a larger vp, schedule=dualpipe, more micro-batches per step, or a smaller pp"
                            : "vp > 1 (interleaved) or schedule=dualpipe, more micro-batches per step, or a smaller pp"});
  if (t.dp_comm > 0)
    v.push_back({"data-parallel collectives", t.dp_comm, t.dp_exposed,
                 "gradient reduce-scatter + parameter all-gather over the dp / edp groups",
                 !l.overlap_dp ? "overlap=...+dp"
                 : !l.overlap_param_gather
                     ? "param_gather=overlap (the parameter all-gather behind the next forward)"
                     : std::string("more micro-batches per step to hide it") +
                           (l.grad_bytes > 2 ? "; bf16 gradients (grads=bf16)" : "")});
  if (t.optimizer + t.weight_cast > 0)
    v.push_back({"optimizer step", t.optimizer + t.weight_cast, t.optimizer + t.weight_cast,
                 "HBM bandwidth over the local shard (and the gradient buffer zeroed)" + std::string(t.weight_cast > 0 ? " (+ the weights' quantization)" : ""),
                 "ZeRO sharding (zero>=1), bf16 moments"});
  if (t.host_mb > 0) {
    const std::string helps =
        l.graphs == Graphs::Off       ? "graphs=partial or graphs=full (CUDA graphs), fused kernels, a larger ep (fewer "
                                        "local experts to launch GEMMs for) or a larger mbs (more work per launch)"
        : l.graphs == Graphs::Partial ? "graphs=full (needs a sync-free MoE), a larger ep (fewer local experts), a larger mbs"
                                      : "a larger mbs (more work per launch)";
    v.push_back({"host (kernel launches)", m * t.host_mb, t.host_wait,
                 "the " + (s.host.cpu.empty() ? std::string("host") : s.host.cpu) + " CPU: " +
                     num("%.0f", t.launches_mb) + " kernels per micro-batch at " + num("%.1f", s.host.op_s * 1e6) +
                     " us per op / " + num("%.1f", s.host.launch_s * 1e6) + " us per inner launch, " +
                     num("%.0f", t.host_syncs_mb) + " host syncs (graphs " + graphs_name(l.graphs) + ")",
                 helps});
  }
  std::stable_sort(v.begin(), v.end(), [](const Limit& a, const Limit& b) { return a.exposed > b.exposed; });
  return v;
}

std::string why_faster(const Layout& la, const StepTime& a, const Layout& lb, const StepTime& b) {
  // Seconds per token of each step component, b minus a: what a saves.
  struct Part {
    const char* name;
    double save;
  };
  const double ta = a.tokens_per_step, tb = b.tokens_per_step;
  auto per = [](double s, double tok) { return tok > 0 ? s / tok : 0; };
  std::vector<Part> parts = {
      {"compute", per(b.compute, tb) - per(a.compute, ta)},
      {"exposed communication", per(b.exposed_comm, tb) - per(a.exposed_comm, ta)},
      {"pipeline bubble", per(b.bubble, tb) - per(a.bubble, ta)},
      {"optimizer", per(b.optimizer + b.weight_cast, tb) - per(a.optimizer + a.weight_cast, ta)},
      {"host wait", per(b.host_wait, tb) - per(a.host_wait, ta)},
  };
  std::stable_sort(parts.begin(), parts.end(), [](const Part& x, const Part& y) { return x.save > y.save; });
  const double total = per(b.step, tb) - per(a.step, ta);
  // In seconds of this layout's step: what each component saves (+) or costs (-).
  std::string o;
  for (const Part& p : parts) {
    if (std::abs(p.save) < 0.05 * total) continue;
    if (!o.empty()) o += ", ";
    o += p.name;
    o += num(p.save > 0 ? " -%.3g s" : " +%.3g s", std::abs(p.save) * ta);
  }
  std::string diff;
  auto d = [&](const char* k, int64_t x, int64_t y) {
    if (x == y) return;
    if (!diff.empty()) diff += ' ';
    diff += k;
    diff += '=';
    diff += std::to_string(x);
  };
  d("tp", la.tp, lb.tp), d("pp", la.pp, lb.pp), d("ep", la.ep, lb.ep), d("mbs", la.mbs, lb.mbs), d("zero", la.zero, lb.zero);
  if (la.recompute != lb.recompute) {
    if (!diff.empty()) diff += ' ';
    diff += "recompute=";
    diff += recompute_name(la.recompute);
  }
  const std::string what = diff.empty() ? std::string("same shape") : diff;
  if (total <= 1e-6 * per(a.step, ta)) return what + ": as fast as the next";
  return what + num(": %.3g s", total * ta) + " a step faster than the next at its batch (" + o + ")";
}

}  // namespace trex::plan
