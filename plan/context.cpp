// The longest context per context-parallel size. See context.h.
#include "plan/context.h"

#include <cstdio>
#include <numeric>
#include "core/error.h"
#include "plan/memory.h"

namespace trex::plan {

namespace {

// The layout at seq tokens with context parallel size cp, or false when it is not valid here.
bool at(const ArchModel& a, int64_t devices, const Layout& base, int64_t cp, int64_t seq, Layout& out) {
  out = base;
  out.cp = cp;
  out.seq = seq;
  out.dp = 0;  // devices / (tp pp cp); gbs as the layout gives it (0: derived)
  return layout_problems(out, a, devices).empty();
}

}  // namespace

ContextResult longest_context(const ArchModel& a, const ClusterSpec& s, int64_t devices, const Layout& base,
                              int64_t step, int64_t max_seq) {
  TREX_USER_CHECK(devices >= 1, "give --devices >= 1", "--longest-context needs --devices >= 1, got ", devices);
  TREX_USER_CHECK(step >= 1 && max_seq >= step, "e.g. --context-step 1024", "--context-step (", step,
                  ") must be >= 1 and <= the longest sequence tried (", max_seq, ")");
  ContextResult r;
  r.model = a.name, r.cluster = s.name, r.devices = devices, r.step = step, r.max_seq = max_seq;
  const int64_t rest = devices / std::max<int64_t>(1, base.tp * base.pp);
  if (devices % (base.tp * base.pp) != 0) return r;
  for (int64_t cp = 1; cp <= rest; ++cp) {
    if (rest % cp != 0) continue;
    const int64_t q = std::lcm(step, 2 * cp);  // seq granularity
    Layout l;
    if (!at(a, devices, base, cp, q, l)) continue;  // not a valid layout at any seq (ep, heads, ...)
    auto fits = [&](int64_t k) {
      Layout x;
      return at(a, devices, base, cp, k * q, x) && plan_memory(a, s, x).fits;
    };
    ContextRow row;
    row.cp = cp;
    if (fits(1)) {
      int64_t lo = 1, hi = 2;  // lo fits; find hi that does not (or the cap)
      const int64_t cap = max_seq / q;
      while (hi <= cap && fits(hi)) lo = hi, hi *= 2;
      hi = std::min(hi, cap + 1);
      while (hi - lo > 1) {
        const int64_t mid = lo + (hi - lo) / 2;
        (fits(mid) ? lo : hi) = mid;
      }
      row.seq = lo * q;
      Layout x;
      at(a, devices, base, cp, row.seq, x);
      row.plan = evaluate(a, s, devices, x);
    }
    r.rows.push_back(std::move(row));
    const ContextRow& b = r.rows.back();
    if (b.seq > 0 && (r.best < 0 || b.seq > r.rows[r.best].seq)) r.best = (int)r.rows.size() - 1;
  }
  return r;
}

std::string format_context(const ContextResult& r) {
  std::string o;
  char b[512];
  std::snprintf(b, sizeof b, "longest context: %s on %lld x %s (seq in steps of %lld, up to %lld)\n", r.model.c_str(),
                (long long)r.devices, r.cluster.c_str(), (long long)r.step, (long long)r.max_seq);
  o += b;
  if (r.rows.empty()) return o + "  no valid layout: check tp, pp and ep against the devices and the model\n";
  o += "      cp     dp         seq   peak memory   step (s)   tokens/s      MFU\n";
  for (size_t i = 0; i < r.rows.size(); ++i) {
    const ContextRow& x = r.rows[i];
    if (x.seq == 0) {
      std::snprintf(b, sizeof b, "  %6lld      -           -   does not fit at the shortest seq\n", (long long)x.cp);
      o += b;
      continue;
    }
    const Plan& p = x.plan;
    std::snprintf(b, sizeof b, "  %6lld %6lld %11lld   %8.1f GiB %10.2f %10.0f %7.1f%%%s\n", (long long)x.cp,
                  (long long)p.layout.dp, (long long)x.seq, p.memory.peak().total() / 1073741824.0, p.time.step,
                  p.time.tokens_per_s, 100 * p.time.mfu, (int)i == r.best ? "   <- longest" : "");
    o += b;
  }
  if (r.best < 0) o += "no cp size fits even the shortest seq: more devices, recompute=full, or a larger tp / pp\n";
  else if (r.rows[r.best].seq >= r.max_seq)
    o += "(the longest seq tried fits: raise --context-max to look further)\n";
  return o;
}

nlohmann::json context_to_json(const ContextResult& r) {
  nlohmann::json rows = nlohmann::json::array();
  for (const ContextRow& x : r.rows) {
    nlohmann::json j = {{"cp", x.cp}, {"seq", x.seq}};
    if (x.seq > 0)
      j.update({{"dp", x.plan.layout.dp}, {"layout", layout_string(x.plan.layout)},
                {"peak_memory_bytes", x.plan.memory.peak().total()}, {"step_s", x.plan.time.step},
                {"tokens_per_s", x.plan.time.tokens_per_s}, {"mfu", x.plan.time.mfu}});
    rows.push_back(std::move(j));
  }
  return {{"model", r.model}, {"cluster", r.cluster}, {"devices", r.devices}, {"step", r.step},
          {"max_seq", r.max_seq}, {"rows", rows},
          {"longest", r.best >= 0 ? nlohmann::json(r.rows[r.best].seq) : nlohmann::json(0)},
          {"longest_cp", r.best >= 0 ? nlohmann::json(r.rows[r.best].cp) : nlohmann::json(nullptr)}};
}

}  // namespace trex::plan
