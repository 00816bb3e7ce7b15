#include "plan/report.h"

#include <cmath>
#include <algorithm>
#include <cstdio>

namespace trex::plan {

using nlohmann::json;

namespace {

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}
// 1234567 -> "1.23M"
std::string si(double v) {
  const char* u[] = {"", "K", "M", "G", "T", "P"};
  int i = 0;
  while (std::fabs(v) >= 1000 && i < 5) v /= 1000, ++i;
  return fmt(std::fabs(v) < 10 ? "%.2f" : std::fabs(v) < 100 ? "%.1f" : "%.0f", v) + u[i];
}
std::string params(double n) { return n >= 1e12 ? fmt("%.2fT", n / 1e12) : fmt("%.1fB", n / 1e9); }
std::string gb(double bytes) { return fmt("%8.2f", bytes / 1e9); }
std::string secs(double s) {
  if (s >= 1) return fmt("%.3f s", s);
  if (s >= 1e-3) return fmt("%.2f ms", s * 1e3);
  return fmt("%.1f us", s * 1e6);
}
std::string pct(double x) { return fmt("%.1f%%", 100 * x); }

std::string layout_line(const Layout& l) {
  std::string ov;
  for (auto [on, n] : {std::pair{l.overlap_ep, "ep"}, {l.overlap_tp, "tp"}, {l.overlap_dp, "dp"}, {l.overlap_pp, "pp"},
                       {l.overlap_cp && l.cp > 1, "cp"}})
    if (on) ov += (ov.empty() ? "" : "+") + std::string(n);
  const std::string cp = l.cp > 1 ? " cp=" + std::to_string(l.cp) : "";
  char b[512];
  std::snprintf(b, sizeof b,
                "dp=%lld tp=%lld pp=%lld%s ep=%lld (edp=%lld) etp=%lld | mbs %lld, gbs %lld (%lld micro-batches), seq %lld | "
                "recompute %s, ZeRO-%d, %s%s, %s, overlap %s%s",
                (long long)l.dp, (long long)l.tp, (long long)l.pp, cp.c_str(), (long long)l.ep, (long long)l.edp(),
                (long long)l.etp,
                (long long)l.mbs, (long long)l.gbs, (long long)l.micro_batches(), (long long)l.seq,
                recompute_label(l).c_str(), l.zero, schedule_name(l.schedule),
                (l.vp > 1 ? (" vp " + std::to_string(l.vp)).c_str() : ""), precision_name(l.precision),
                ov.empty() ? "none" : ov.c_str(), l.mtp ? ", mtp on" : "");
  return b;
}

}  // namespace

std::string format_plan(const Plan& p) {
  const Layout& l = p.layout;
  const StepTime& t = p.time;
  const RankMemory& r = p.memory.peak();
  std::string o;
  o += "trex plan: " + p.model + " on " + p.cluster + " x " + std::to_string(p.devices) + "\n";
  o += "model       " + params(p.total_params) + " params, " + params(p.active_params) + " active; " +
       fmt("%.1f", t.model_flops_per_token / 1e9) + " GFLOP per token at seq " + std::to_string(l.seq) +
       " (6 x active + attention over the attended context)\n";
  o += "layout      " + layout_line(l) + "\n";
  o += "memory per device, GB (pipeline rank " + std::to_string(r.rank) + ", the largest; " +
       std::to_string(r.layers) + " layers" + (r.embed ? ", embedding" : "") + (r.head ? ", head" : "") + ")\n";
  o += "  parameters  " + gb(r.params) + "   (" + params(r.dense_params / l.tp) + " dense, " +
       params(r.expert_params / (double)(l.ep * l.etp)) + " expert parameters on this device)\n";
  o += "  gradients   " + gb(r.grads) + "\n";
  o += "  optimizer   " + gb(r.optimizer) + "\n";
  o += "  activations " + gb(r.activations) + "   (" + fmt("%.1f", r.inflight) + " micro-batches in flight; " +
       (p.memory.engine ? std::string("as trex train's start-up memory check counts them")
                        : "per token per layer: none " + fmt("%.0f", p.memory.act_per_token_layer[0] / 1e3) +
                              " KB, selective " + fmt("%.0f", p.memory.act_per_token_layer[1] / 1e3) + " KB, full " +
                              fmt("%.1f", p.memory.act_per_token_layer[2] / 1e3) + " KB") +
       ")\n";
  o += "              by recompute mode, largest rank: none " + fmt("%.2f", p.activations_by_recompute[0] / 1e9) +
       ", selective " + fmt("%.2f", p.activations_by_recompute[1] / 1e9) + ", full " +
       fmt("%.2f", p.activations_by_recompute[2] / 1e9) + " GB\n";
  o += "  buffers     " + gb(r.buffers) + "\n";
  o += "  total       " + gb(r.total()) + "   of " + fmt("%.1f", p.memory.usable / 1e9) + " usable: " +
       (p.memory.fits ? "fits" : "DOES NOT FIT") + "\n";
  if (p.memory.ranks.size() > 1) {
    o += "  by rank    ";
    for (const RankMemory& m : p.memory.ranks) o += " " + fmt("%.1f", m.total() / 1e9);
    o += "\n";
  }
  const double st = t.step;
  o += "step time   " + secs(st) + "\n";
  o += "  compute          " + secs(t.compute) + "  " + pct(t.compute / st) + "   (per micro-batch fwd: gemm " +
       secs(t.gemm) + ", experts " + secs(t.experts) + ", attention " + secs(t.attention) + ", memory-bound " +
       secs(t.memory_bound) + "; recompute " + secs(t.recompute) + ")\n";
  o += "  exposed comm     " + secs(t.exposed_comm) + "  " + pct(t.exposed_comm / st) + "   (per micro-batch: tp " +
       secs(t.comm_tp) + ", ep " + secs(t.comm_ep) + ", pp " + secs(t.comm_pp) +
       (t.comm_cp > 0 ? ", cp " + secs(t.comm_cp) : std::string()) + " -> exposed " + secs(t.exposed_mb) +
       "; dp per step " + secs(t.dp_comm) + " -> exposed " + secs(t.dp_exposed) + ")\n";
  o += "  pipeline bubble  " + secs(t.bubble) + "  " + pct(t.bubble / st) + "\n";
  o += "  optimizer        " + secs(t.optimizer) + "  " + pct(t.optimizer / st) + "\n";
  if (t.weight_cast > 0) o += "  weight cast      " + secs(t.weight_cast) + "  " + pct(t.weight_cast / st) + "\n";
  if (t.host_mb > 0)
    o += "  host wait        " + secs(t.host_wait) + "  " + pct(t.host_wait / st) + "   (per micro-batch: " +
         fmt("%.0f", t.launches_mb) + " kernel launches, " + secs(t.host_mb) + " of host, " +
         fmt("%.0f", t.host_syncs_mb) + " host syncs; device alone " + secs(t.device_t_mb) + "; graphs " +
         graphs_name(l.graphs) + ")\n";
  o += "what limits the step (per step: exposed / busy; bound by; what would help)\n";
  for (const Limit& lim : p.limits) {
    char b[96];
    std::snprintf(b, sizeof b, "  %-28s %10s / %-10s ", lim.phase.c_str(), secs(lim.exposed).c_str(), secs(lim.busy).c_str());
    o += b + lim.bound_by + "; helps: " + lim.helps + "\n";
  }
  o += "throughput  " + si(t.tokens_per_s) + " tokens/s (" + fmt("%.1f", t.tokens_per_s / p.devices) +
       " per device), MFU " + pct(t.mfu) + " of bf16 peak" +
       (t.goodput < 1 ? " (over wall time: steady-state x goodput " + pct(t.goodput) + ")" : "") + "\n";
  const Cost& c = p.cost;
  o += "cost        ";
  if (c.priced) o += "$" + si(c.dollars_per_hour) + "/h, " + si(c.tokens_per_dollar) + " tokens per $";
  else o += "no price in the spec";
  if (c.powered) o += "; " + fmt("%.1f", c.kw) + " kW, " + si(c.tokens_per_kwh) + " tokens per kWh";
  o += "\n";
  if (c.run_tokens > 0) {
    o += "run of " + si(c.run_tokens) + " tokens: " + fmt("%.2f", c.run_hours) + " h wall";
    if (c.priced) o += ", $" + si(c.run_dollars);
    if (c.powered) o += ", " + si(c.run_kwh) + " kWh";
    o += "\n";
  }
  for (const std::string& n : p.notes) o += "note: " + n + "\n";
  return o;
}

json plan_to_json(const Plan& p) {
  const Layout& l = p.layout;
  const StepTime& t = p.time;
  json ranks = json::array();
  for (const RankMemory& m : p.memory.ranks)
    ranks.push_back({{"rank", m.rank}, {"layers", m.layers}, {"embed", m.embed}, {"head", m.head},
                     {"params_gb", m.params / 1e9}, {"grads_gb", m.grads / 1e9}, {"optimizer_gb", m.optimizer / 1e9},
                     {"activations_gb", m.activations / 1e9}, {"buffers_gb", m.buffers / 1e9},
                     {"total_gb", m.total() / 1e9}, {"inflight_micro_batches", m.inflight}});
  const Cost& c = p.cost;
  json limits = json::array();
  for (const Limit& lim : p.limits)
    limits.push_back({{"phase", lim.phase}, {"busy_s", lim.busy}, {"exposed_s", lim.exposed}, {"bound_by", lim.bound_by},
                      {"helps", lim.helps}});
  return {
      {"model", p.model},
      {"cluster", p.cluster},
      {"devices", p.devices},
      {"total_params", p.total_params},
      {"active_params", p.active_params},
      {"model_flops_per_token", t.model_flops_per_token},
      {"layout",
       {{"string", layout_string(l)}, {"dp", l.dp}, {"tp", l.tp}, {"pp", l.pp}, {"cp", l.cp}, {"ep", l.ep}, {"etp", l.etp},
        {"edp", l.edp()}, {"mbs", l.mbs}, {"gbs", l.gbs}, {"seq", l.seq}, {"micro_batches", l.micro_batches()},
        {"recompute", recompute_label(l)}, {"zero", l.zero}, {"schedule", schedule_name(l.schedule)},
        {"precision", precision_name(l.precision)}, {"graphs", graphs_name(l.graphs)}, {"vp", l.vp}, {"mtp", l.mtp}, {"expert_load", l.expert_load},
        {"overlap", {{"ep", l.overlap_ep}, {"tp", l.overlap_tp}, {"dp", l.overlap_dp}, {"pp", l.overlap_pp}}}}},
      {"memory",
       {{"fits", p.memory.fits}, {"usable_gb", p.memory.usable / 1e9}, {"peak_rank", p.memory.worst},
        {"memory_from", p.memory.engine ? "engine_check" : "formula"},
        {"peak_total_gb", p.memory.peak().total() / 1e9},
        {"activations_gb_by_recompute",
         {{"none", p.activations_by_recompute[0] / 1e9}, {"selective", p.activations_by_recompute[1] / 1e9},
          {"full", p.activations_by_recompute[2] / 1e9}}},
        {"activation_bytes_per_token_layer",
         {{"none", p.memory.act_per_token_layer[0]}, {"selective", p.memory.act_per_token_layer[1]},
          {"full", p.memory.act_per_token_layer[2]}}},
        {"ranks", ranks}}},
      {"time",
       {{"step_s", t.step}, {"compute_s", t.compute}, {"exposed_comm_s", t.exposed_comm}, {"bubble_s", t.bubble},
        {"optimizer_s", t.optimizer}, {"weight_cast_s", t.weight_cast}, {"host_wait_s", t.host_wait},
        {"slow_rank", t.slow_rank},
        {"rank_micro_batch_s", t.rank_t_mb},
        {"per_micro_batch",
         {{"fwd_s", t.fwd}, {"bwd_s", t.bwd}, {"recompute_s", t.recompute}, {"gemm_fwd_s", t.gemm},
          {"experts_fwd_s", t.experts}, {"experts_bwd_s", t.experts_bwd}, {"expert_rows", t.expert_rows},
          {"expert_tile_eff", t.expert_tile_eff}, {"expert_memory_bound", t.expert_memory_bound},
          {"attention_fwd_s", t.attention}, {"memory_bound_fwd_s", t.memory_bound},
          {"quantize_fwd_s", t.quant_fwd}, {"quantize_bwd_s", t.quant_bwd}, {"scale_swizzle_s", t.swizzle},
          {"expert_padding_copies_s", t.pad_copies},
          {"comm_tp_s", t.comm_tp}, {"comm_ep_s", t.comm_ep}, {"comm_pp_s", t.comm_pp}, {"comm_cp_s", t.comm_cp},
          {"comm_dp_s", t.comm_dp_mb},
          {"exposed_s", t.exposed_mb}, {"device_s", t.device_t_mb}, {"total_s", t.t_mb}, {"host_s", t.host_mb},
          {"kernel_launches", t.launches_mb}, {"host_syncs", t.host_syncs_mb}, {"ep_inter_node_bytes", t.ep_inter_bytes_mb},
          {"ep_intra_node_bytes", t.ep_intra_bytes_mb}}},
        {"dp_comm_s", t.dp_comm}, {"dp_exposed_s", t.dp_exposed}}},
      {"throughput",
       {{"tokens_per_step", t.tokens_per_step}, {"tokens_per_s", t.tokens_per_s},
        {"tokens_per_s_per_device", t.tokens_per_s / p.devices}, {"mfu", t.mfu}, {"goodput", t.goodput}}},
      {"cost",
       {{"dollars_per_hour", c.dollars_per_hour}, {"kw", c.kw}, {"tokens_per_dollar", c.tokens_per_dollar},
        {"tokens_per_kwh", c.tokens_per_kwh}, {"run_tokens", c.run_tokens}, {"run_hours", c.run_hours},
        {"run_dollars", c.run_dollars}, {"run_kwh", c.run_kwh}}},
      {"limits", limits},
      {"notes", p.notes}};
}

std::string format_search(const SearchResult& r, const ClusterSpec& s) {
  std::string o = "search: " + std::to_string(r.tried) + " layouts tried, " + std::to_string(r.valid) + " valid, " +
                  std::to_string(r.fit) + " fit in memory\n";
  if (r.by_speed.empty()) return o + "no layout fits: add devices, or allow recompute / a larger ZeRO stage\n";
  auto table = [&](const std::vector<Plan>& v, const char* title, bool cost) {
    o += std::string("\n") + title + "\n";
    o += "  #  devices  dp   tp  pp   ep  mbs recompute  zero  mem GB   step s   tokens/s    MFU   tokens/$  tokens/kWh\n";
    int i = 0;
    for (const Plan& p : v) {
      const Layout& l = p.layout;
      char b[256];
      std::snprintf(b, sizeof b, " %2d %7lld %4lld %3lld %3lld %4lld %3lld %-10s %4d %7.1f %8.3f %10s %5.1f%% %9s %10s\n",
                    ++i, (long long)p.devices, (long long)l.dp, (long long)l.tp, (long long)l.pp, (long long)l.ep,
                    (long long)l.mbs, recompute_name(l.recompute), l.zero, p.memory.peak().total() / 1e9, p.time.step,
                    si(p.time.tokens_per_s).c_str(), 100 * p.time.mfu,
                    p.cost.priced ? si(p.cost.tokens_per_dollar).c_str() : "-",
                    p.cost.powered ? si(p.cost.tokens_per_kwh).c_str() : "-");
      o += b;
    }
    // Why each of the top layouts is where it is: against the next one in the same ranking.
    const size_t n = std::min<size_t>(v.size(), 3);
    for (size_t k = 0; k < n; ++k) {
      const Plan& p = v[k];
      const Limit* top = p.limits.empty() ? nullptr : &p.limits.front();
      o += "  #" + std::to_string(k + 1) + " ";
      if (cost && k + 1 < v.size())
        o += fmt("%.3f", p.cost.priced ? p.cost.tokens_per_dollar / std::max(1e-30, v[k + 1].cost.tokens_per_dollar)
                                       : p.cost.tokens_per_kwh / std::max(1e-30, v[k + 1].cost.tokens_per_kwh)) +
             "x the next one's tokens per " + (p.cost.priced ? "$" : "kWh") + " (" + std::to_string(p.devices) +
             " devices at " + si(p.time.tokens_per_s / p.devices) + " tokens/s each); ";
      else if (k + 1 < v.size())
        o += why_faster(p.layout, p.time, v[k + 1].layout, v[k + 1].time) + "; ";
      if (top) o += "its step is bound by " + top->phase + " (" + top->bound_by + ")";
      o += "\n";
    }
  };
  table(r.by_speed, "fastest (tokens/s)", false);
  table(r.by_cost, s.price_per_device_hour > 0 ? "cheapest (tokens per $)" : "most efficient (tokens per kWh)", true);
  o += "\nbest: --layout " + layout_string(r.by_speed.front().layout) + "\n";
  return o;
}

json search_to_json(const SearchResult& r) {
  json a = json::array(), b = json::array();
  for (const Plan& p : r.by_speed) a.push_back(plan_to_json(p));
  for (const Plan& p : r.by_cost) b.push_back(plan_to_json(p));
  return {{"tried", r.tried}, {"valid", r.valid}, {"fit", r.fit}, {"by_speed", a}, {"by_cost", b}};
}

std::string format_routing_compare(const Plan& b, const Plan& m) {
  auto row = [](const char* name, const std::string& x, const std::string& y, double ratio) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "  %-34s %14s %14s   x %.3f\n", name, x.c_str(), y.c_str(), ratio);
    return std::string(buf);
  };
  auto ratio = [](double x, double y) { return x > 0 ? y / x : 1.0; };
  const StepTime &x = b.time, &y = m.time;
  std::string o = "routing: forced balance vs measured (" + layout_line(m.layout) + ")\n";
  char head[160];
  std::snprintf(head, sizeof head, "  %-34s %14s %14s   %s\n", "", "forced balance", "measured", "measured/forced");
  o += head;
  o += row("expert_load (busiest ep rank)", fmt("%.3f", b.layout.expert_load), fmt("%.3f", m.layout.expert_load),
           ratio(b.layout.expert_load, m.layout.expert_load));
  o += row("step time", secs(x.step), secs(y.step), ratio(x.step, y.step));
  o += row("expert GEMMs, fwd per micro-batch", secs(x.experts), secs(y.experts), ratio(x.experts, y.experts));
  o += row("ep all-to-all per micro-batch", secs(x.comm_ep), secs(y.comm_ep), ratio(x.comm_ep, y.comm_ep));
  o += row("exposed comm per step", secs(x.exposed_comm), secs(y.exposed_comm), ratio(x.exposed_comm, y.exposed_comm));
  o += row("tokens/s", si(x.tokens_per_s), si(y.tokens_per_s), ratio(x.tokens_per_s, y.tokens_per_s));
  o += row("MFU", pct(x.mfu), pct(y.mfu), ratio(x.mfu, y.mfu));
  return o;
}

json routing_compare_json(const Plan& b, const Plan& m) {
  auto side = [](const Plan& p) {
    const StepTime& t = p.time;
    return json{{"expert_load", p.layout.expert_load}, {"step_s", t.step},       {"experts_fwd_mb_s", t.experts},
                {"comm_ep_mb_s", t.comm_ep},           {"exposed_comm_s", t.exposed_comm},
                {"tokens_per_s", t.tokens_per_s},      {"mfu", t.mfu}};
  };
  return {{"forced_balance", side(b)}, {"measured", side(m)}, {"plan", plan_to_json(m)}};
}

}  // namespace trex::plan
