// OR instance generation: the registry of scenario families (four task categories), the
// de-duplicated, solver-labelled instance stream, and the train/test split.
//
// Split: every family has statement templates 0..T-1; the last `test_templates` of them, and
// the test-side alternatives of every split phrase (GenCtx::P), are used only by test
// instances, which also draw their numbers from a separate seed stream. Instances whose
// canonical LP text (hash) was seen before are dropped and regenerated.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>
#include "or/gen_common.h"

namespace trex::orx {

struct Family {
  const char* category;
  const char* name;
  int train_templates;
  int test_templates;
  bool can_infeasible;
  bool can_unbounded;
  void (*build)(GenCtx& ctx, Instance& out);  // fills statement, formulation, model, descriptions
};

// Every family, in a fixed order. Category order: lp, ip, network, scheduling.
const std::vector<Family>& all_families();
// Registered by or/gen_lp.cpp, gen_ip.cpp, gen_network.cpp, gen_sched.cpp.
void add_lp_families(std::vector<Family>& out);
void add_ip_families(std::vector<Family>& out);
void add_network_families(std::vector<Family>& out);
void add_sched_families(std::vector<Family>& out);

struct GenOptions {
  int64_t n_train = 100;
  int64_t n_test = 10;
  uint64_t seed = 1;
  double infeasible_share = 0.04;  // intended share of infeasible instances (where a family can)
  double unbounded_share = 0.01;   // overall intended share of unbounded instances
  double time_limit_s = 10;        // per solve; instances that hit it are dropped
  std::vector<std::string> families;  // restrict to these family names (empty: all)
};

struct GenStats {
  int64_t generated = 0, kept = 0;
  int64_t dup_drops = 0;        // same canonical LP as an earlier instance
  int64_t mismatch_drops = 0;   // solver verdict differs from the construction's intent
  int64_t unsolved_drops = 0;   // time limit or solver error
  double seconds = 0, solve_seconds = 0;
  std::map<std::string, int64_t> per_category, per_family, per_status, per_template;
  std::map<std::string, int64_t> drops_by_family;  // "<family>/<intended>-><got>" for mismatches and unsolved
};

// One instance of family `f` from `seed` (not solved, `lp` and `hash` filled).
Instance build_instance(const Family& f, uint64_t seed, bool test, Intent intent, int tmpl);

// The train instances (n_train) followed by the test instances (n_test), all solved and
// de-duplicated. Deterministic in opts. Each instance's result is the solver's verdict on
// its `lp` text.
std::vector<Instance> generate(const GenOptions& opts, GenStats& stats);

// A value for JSON: the optimum as a number, or "infeasible" / "unbounded".
std::string label_text(const SolveResult& r);

}  // namespace trex::orx
