#include "plan/planner.h"

#include <algorithm>
#include <cstdio>
#include "core/error.h"

namespace trex::plan {

namespace {

Plan evaluate_valid(const ArchModel& a, const ClusterSpec& s, int64_t devices, const Layout& l, double run_tokens) {
  Plan p;
  p.model = a.name;
  p.cluster = s.name;
  p.devices = devices;
  p.total_params = a.total_params();
  p.active_params = a.active_params();
  p.layout = l;
  p.memory = plan_memory(a, s, l);
  for (Recompute r : {Recompute::None, Recompute::Selective, Recompute::Full}) {
    Layout x = l;
    x.recompute = r;
    double mx = 0;
    for (const RankMemory& m : (r == l.recompute ? p.memory : plan_memory(a, s, x)).ranks) mx = std::max(mx, m.activations);
    p.activations_by_recompute[(int)r] = mx;
  }
  p.time = plan_time(a, s, l);
  p.limits = step_limits(s, l, p.time);
  p.cost = plan_cost(s, devices, p.time.tokens_per_s, run_tokens);
  return p;
}

void add_notes(Plan& p, const ArchModel& a, const ClusterSpec& s, const Routing* routing) {
  using detail::cat;
  const Layout& l = p.layout;
  if (!s.note.empty()) p.notes.push_back(cat("cluster: ", s.note));
  if (l.tp > s.devices_per_node)
    p.notes.push_back(cat("tp (", l.tp, ") spans nodes (", s.devices_per_node, " devices per node): TP collectives "
                          "run at inter-node bandwidth"));
  if (!p.memory.fits) {
    const RankMemory& r = p.memory.peak();
    p.notes.push_back(cat("DOES NOT FIT: pipeline rank ", r.rank, " needs ", r.total() / 1e9, " GB of ",
                          p.memory.usable / 1e9, " GB usable per device"));
  }
  if (routing && a.n_experts > 0)
    p.notes.push_back(routing_summary(*routing, l.ep, a.n_experts));
  else if (l.expert_load == 1.0 && a.n_experts > 0)
    p.notes.push_back("routing assumed balanced (expert_load=1); set expert_load > 1 for a skewed router");
  if (!s.host.modelled() && s.mx_formats)
    p.notes.push_back("the host is not modelled in this spec ([host]): on devices this fast, launch-bound software "
                      "(no CUDA graphs) can run well below this device-bound plan (docs/PLAN.md, the host)");
  if (p.time.host_wait > 0.01 * p.time.step) {
    char b[256];
    std::snprintf(b, sizeof b,
                  "host-bound: launching the kernels (%.0f per micro-batch, graphs %s) adds %.3g s a step (%.0f%%) to "
                  "the device's time",
                  p.time.launches_mb, graphs_name(l.graphs), p.time.host_wait, 100 * p.time.host_wait / p.time.step);
    p.notes.push_back(b);
  }
}

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i * i <= n; ++i)
    if (n % i == 0) {
      d.push_back(i);
      if (i != n / i) d.push_back(n / i);
    }
  std::sort(d.begin(), d.end());
  return d;
}

}  // namespace

Plan evaluate(const ArchModel& a, const ClusterSpec& s, int64_t devices, Layout l, double run_tokens,
              const Routing* routing) {
  validate_layout(l, a, devices);
  if (routing && a.n_experts > 0) l.expert_load = routing_expert_load(*routing, l.ep);
  Plan p = evaluate_valid(a, s, devices, l, run_tokens);
  add_notes(p, a, s, routing);
  return p;
}

SearchResult search(const ArchModel& a, const ClusterSpec& s, int64_t devices, const Layout& base, double run_tokens,
                    const SearchOptions& o) {
  TREX_USER_CHECK(devices >= 1, "give --devices >= 1", "search needs --devices >= 1, got ", devices);
  SearchResult res;
  std::vector<Plan> fit;
  const int64_t gbs = base.gbs > 0 ? base.gbs : 4 * devices;
  std::vector<int64_t> counts = {devices};
  if (o.vary_devices)
    for (int64_t n = devices; n % 2 == 0 && n / 2 >= std::max<int64_t>(1, o.min_devices);) {
      n /= 2;
      counts.push_back(n);
    }
  auto is_fixed = [&](const char* k) { return std::find(o.fixed.begin(), o.fixed.end(), k) != o.fixed.end(); };
  auto pick = [&](const char* k, std::vector<int64_t> all, int64_t base_value) {
    return is_fixed(k) ? std::vector<int64_t>{base_value} : all;
  };
  std::vector<int64_t> recs = pick("recompute", {0, 1, 2}, (int64_t)base.recompute);
  std::vector<int64_t> zeros = pick("zero", {1, 2, 3}, base.zero);
  std::vector<int64_t> mbss = pick("mbs", o.mbs, base.mbs);
  for (int64_t N : counts) {
    std::vector<int64_t> tps;
    for (int64_t tp = 1; tp <= std::min<int64_t>(s.devices_per_node, a.heads); tp *= 2) tps.push_back(tp);
    for (int64_t tp : pick("tp", tps, base.tp)) {
      if (N % tp || a.heads % tp) continue;
      for (int64_t pp : pick("pp", divisors(N / tp), base.pp)) {
        if ((N / tp) % (pp * base.cp) || pp > a.n_layers() || pp > o.max_pp) continue;
        const int64_t dp = N / (tp * pp * base.cp);  // (cp stays as given)
        if (is_fixed("dp") && base.dp != dp) continue;
        std::vector<int64_t> eps = {1};
        if (a.n_experts > 0) eps = divisors(a.n_experts);
        for (int64_t ep : pick("ep", eps, base.ep)) {
          if ((dp * base.cp * tp) % (ep * base.etp)) continue;
          for (int64_t rc : recs)
            for (int64_t zero : zeros)
              for (int64_t mbs : mbss) {
                Layout l = base;
                l.dp = dp, l.tp = tp, l.pp = pp, l.ep = ep, l.recompute = (Recompute)rc, l.zero = (int)zero;
                l.mbs = mbs, l.gbs = gbs;
                if (o.routing && a.n_experts > 0) l.expert_load = routing_expert_load(*o.routing, ep);
                ++res.tried;
                if (!layout_problems(l, a, N).empty()) continue;
                ++res.valid;
                MemoryReport mem = plan_memory(a, s, l);
                if (!mem.fits) continue;
                ++res.fit;
                fit.push_back(evaluate_valid(a, s, N, l, run_tokens));
              }
        }
      }
    }
  }
  auto speed = [](const Plan& x, const Plan& y) {
    if (x.time.tokens_per_s != y.time.tokens_per_s) return x.time.tokens_per_s > y.time.tokens_per_s;
    return x.memory.peak().total() < y.memory.peak().total();
  };
  auto cost = [&](const Plan& x, const Plan& y) {
    const double cx = s.price_per_device_hour > 0 ? x.cost.tokens_per_dollar : x.cost.tokens_per_kwh;
    const double cy = s.price_per_device_hour > 0 ? y.cost.tokens_per_dollar : y.cost.tokens_per_kwh;
    if (cx != cy) return cx > cy;
    return speed(x, y);
  };
  const size_t top = (size_t)std::max(1, o.top);
  std::sort(fit.begin(), fit.end(), speed);
  res.by_speed.assign(fit.begin(), fit.begin() + std::min(top, fit.size()));
  std::sort(fit.begin(), fit.end(), cost);
  res.by_cost.assign(fit.begin(), fit.begin() + std::min(top, fit.size()));
  for (auto* v : {&res.by_speed, &res.by_cost})
    for (Plan& p : *v) add_notes(p, a, s, o.routing);
  return res;
}

}  // namespace trex::plan
