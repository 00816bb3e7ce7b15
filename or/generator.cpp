#include "or/generator.h"
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <unordered_set>
#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "or/lp_writer.h"

namespace trex::orx {

const std::vector<Family>& all_families() {
  static const std::vector<Family> fams = [] {
    std::vector<Family> f;
    add_lp_families(f);
    add_ip_families(f);
    add_network_families(f);
    add_sched_families(f);
    return f;
  }();
  return fams;
}

namespace {
uint64_t mix(uint64_t a, uint64_t b) {
  Rng r(a * 0x9E3779B97F4A7C15ull + b + 0x632BE59BD9B4E019ull);
  return r.next_u64();
}
}  // namespace

namespace {
// Tidy the generated prose: no spaces at line starts or doubled, at most one blank line.
std::string tidy(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const char ch = s[i];
    if (ch == ' ' && (out.empty() || out.back() == ' ' || out.back() == '\n')) continue;
    if (ch == '\n') {
      while (!out.empty() && out.back() == ' ') out.pop_back();
      if (out.size() >= 2 && out[out.size() - 1] == '\n' && out[out.size() - 2] == '\n') continue;
    }
    out += ch;
  }
  while (!out.empty() && (out.back() == ' ' || out.back() == '\n')) out.pop_back();
  return out;
}
}  // namespace

Instance build_instance(const Family& f, uint64_t seed, bool test, Intent intent, int tmpl) {
  GenCtx c(seed);
  c.test = test;
  c.tmpl = tmpl;
  c.intent = intent;
  c.cur = c.pick({"$", "$", "$", "€", "£", "EUR"});
  c.commas = c.coin(0.7);
  Instance in;
  in.category = f.category;
  in.family = f.name;
  in.tmpl = std::string(f.name) + "/t" + std::to_string(tmpl);
  in.split = test ? "test" : "train";
  in.intent = intent;
  in.seed = seed;
  f.build(c, in);
  in.statement = tidy(in.statement);
  in.currency = c.cur;
  TREX_CHECK(in.var_desc.size() == in.model.vars.size(), f.name, ": ", in.var_desc.size(), " descriptions for ", in.model.vars.size(), " variables");
  TREX_CHECK(in.row_desc.size() == in.model.rows.size(), f.name, ": ", in.row_desc.size(), " descriptions for ", in.model.rows.size(), " rows");
  in.lp = write_lp(in.model);
  in.hash = fnv1a64(in.lp);
  return in;
}

std::string label_text(const SolveResult& r) {
  if (r.status == SolveResult::Infeasible) return "infeasible";
  if (r.status == SolveResult::Unbounded) return "unbounded";
  char buf[64];
  double v = r.objective;
  if (std::fabs(v - std::round(v)) < 1e-7 * std::max(1.0, std::fabs(v))) v = std::round(v);
  std::snprintf(buf, sizeof buf, "%.12g", v);
  return buf;
}

std::vector<Instance> generate(const GenOptions& opts, GenStats& st) {
  const double t0 = now_ms();
  for (const auto& name : opts.families) {
    bool known = false;
    for (const auto& f : all_families()) known |= name == f.name;
    TREX_USER_CHECK(known, "family names are listed in docs/OR.md", "unknown OR family '", name, "'");
  }
  std::vector<const Family*> fams;
  for (const auto& f : all_families())
    if (opts.families.empty() || std::find(opts.families.begin(), opts.families.end(), std::string(f.name)) != opts.families.end()) fams.push_back(&f);
  TREX_USER_CHECK(!fams.empty(), "see docs/OR.md for the family names", "no OR family matches the selection");
  std::vector<std::string> cats;
  std::map<std::string, std::vector<const Family*>> by_cat;
  int n_inf = 0, n_unb = 0;
  for (const Family* f : fams) {
    if (!by_cat.count(f->category)) cats.push_back(f->category);
    by_cat[f->category].push_back(f);
    n_inf += f->can_infeasible;
    n_unb += f->can_unbounded;
  }
  for (auto [name, v] : {std::pair{"--infeasible-share", opts.infeasible_share}, {"--unbounded-share", opts.unbounded_share}})
    TREX_USER_CHECK(v >= 0 && v <= 1, "give a share in [0, 1]", name, " = ", v, " is not a share");
  TREX_USER_CHECK(opts.infeasible_share + opts.unbounded_share <= 1,
                  "lower --infeasible-share and --unbounded-share so that they sum to at most 1",
                  "--infeasible-share ", opts.infeasible_share, " + --unbounded-share ", opts.unbounded_share, " = ",
                  opts.infeasible_share + opts.unbounded_share, " exceeds 1");
  // Each share is drawn among the families that can make such instances: a selection with few of
  // them cannot reach a large share.
  const double nf = (double)fams.size();
  TREX_USER_CHECK(opts.infeasible_share == 0 || (n_inf > 0 && opts.infeasible_share * nf <= n_inf),
                  detail::cat("lower --infeasible-share to at most ", n_inf / nf, ", or select more families"),
                  "--infeasible-share ", opts.infeasible_share, ": only ", n_inf, " of the ", fams.size(),
                  " selected families can be made infeasible");
  TREX_USER_CHECK(opts.unbounded_share == 0 || (n_unb > 0 && opts.unbounded_share * nf <= n_unb),
                  detail::cat("lower --unbounded-share to at most ", n_unb / nf, ", or select more families"),
                  "--unbounded-share ", opts.unbounded_share, ": only ", n_unb, " of the ", fams.size(),
                  " selected families can be made unbounded");
  const double p_inf = n_inf ? opts.infeasible_share * nf / n_inf : 0;
  const double p_unb = n_unb ? opts.unbounded_share * nf / n_unb : 0;
  for (const Family* f : fams)
    TREX_USER_CHECK(!(f->can_infeasible && f->can_unbounded) || p_inf + p_unb <= 1,
                    "lower --infeasible-share or --unbounded-share, or select more families",
                    "the shares ask family ", f->name, " for ", p_inf, " infeasible and ", p_unb,
                    " unbounded instances per instance (more than 1)");
  std::unordered_set<uint64_t> seen;
  std::vector<Instance> out;
  auto solver = make_cbc_solver();
  for (int split = 0; split < 2; ++split) {
    const bool test = split == 1;
    const int64_t n = test ? opts.n_test : opts.n_train;
    const uint64_t stream = mix(opts.seed, test ? 0x7E57ull : 0x7A1Aull);
    for (int64_t k = 0; k < n; ++k) {
      bool done = false;
      for (int attempt = 0; attempt < 64 && !done; ++attempt) {
        const uint64_t s = mix(mix(stream, (uint64_t)k), (uint64_t)attempt);
        Rng r(s);
        const auto& fl = by_cat[cats[(size_t)(k % (int64_t)cats.size())]];
        const Family& f = *fl[r.next_u64() % fl.size()];
        Intent intent = Intent::Normal;
        const double u = r.uniform();
        if (f.can_infeasible && u < p_inf) intent = Intent::Infeasible;
        else if (f.can_unbounded && u >= p_inf && u < p_inf + p_unb) intent = Intent::Unbounded;
        const int tmpl = test ? f.train_templates + (int)(r.next_u64() % f.test_templates) : (int)(r.next_u64() % f.train_templates);
        Instance in = build_instance(f, r.next_u64(), test, intent, tmpl);
        ++st.generated;
        if (seen.count(in.hash)) {
          ++st.dup_drops;
          continue;
        }
        in.result = solver->solve_lp_text(in.lp, opts.time_limit_s);
        st.solve_seconds += in.result.seconds;
        const auto want = intent == Intent::Normal ? SolveResult::Optimal : intent == Intent::Infeasible ? SolveResult::Infeasible : SolveResult::Unbounded;
        const auto got = in.result.status;
        if (got == SolveResult::TimeLimit || got == SolveResult::Error || got == SolveResult::ParseError) {
          TREX_CHECK(got != SolveResult::ParseError, "generated LP does not parse: ", in.result.message, "\n", in.lp);
          ++st.unsolved_drops;
          ++st.drops_by_family[std::string(f.name) + "/" + status_name(want) + "->" + status_name(got)];
          continue;
        }
        if (got != want) {
          ++st.mismatch_drops;
          ++st.drops_by_family[std::string(f.name) + "/" + status_name(want) + "->" + status_name(got)];
          continue;
        }
        seen.insert(in.hash);
        ++st.kept;
        ++st.per_category[in.split + "/" + in.category];
        ++st.per_family[in.split + "/" + in.family];
        ++st.per_status[in.split + "/" + status_name(got)];
        ++st.per_template[in.tmpl];
        out.push_back(std::move(in));
        done = true;
      }
      if (!done) TREX_LOG_WARN("or gen: slot ", k, " of the ", test ? "test" : "train", " split found no new instance in 64 attempts");
    }
  }
  st.seconds = (now_ms() - t0) / 1000.0;
  return out;
}

}  // namespace trex::orx
