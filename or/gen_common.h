// Shared pieces of the OR problem generators (or/gen_*.cpp): the generated Instance, the
// per-instance generation context (random numbers, phrasing choices split between train-only
// and test-only wording, number and money formatting, markdown tables) and the algebraic
// formulation builder.
#pragma once
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>
#include "core/rng.h"
#include "or/lp_model.h"
#include "or/solver.h"

namespace trex::orx {

enum class Intent { Normal, Infeasible, Unbounded };

// One generated problem in its three representations plus the solver's verdict.
struct Instance {
  std::string category;     // "lp" | "ip" | "network" | "scheduling"
  std::string family;       // "production", "knapsack", ...
  std::string tmpl;         // "<family>/t<k>": the statement template
  std::string split;        // "train" | "test"
  std::string statement;    // natural-language problem
  std::string formulation;  // sets, parameters, variables, objective, constraints
  LpModel model;
  std::string lp;           // CPLEX LP text of `model` (the canonical form, hashed for dedup)
  std::vector<std::string> var_desc;  // per model variable: what it means ("tons of Alkyd made")
  std::vector<std::string> row_desc;  // per model row: what it enforces
  std::string obj_desc;     // "total weekly profit"
  bool money = true;        // objective is an amount of money (formatted with the currency)
  std::string currency = "$";
  Intent intent = Intent::Normal;
  std::string reason;       // why it is infeasible / unbounded (set with the intent)
  SolveResult result;       // the label: the solver's verdict on `lp`
  uint64_t hash = 0;        // fnv1a64(lp)
  uint64_t seed = 0;        // per-instance seed
};

// Generation context for one instance.
struct GenCtx {
  Rng rng;
  bool test = false;   // test split: test-only templates and phrasings
  int tmpl = 0;        // statement template index for this instance
  Intent intent = Intent::Normal;
  std::string cur = "$";  // currency symbol
  bool commas = true;     // thousands separators in prose numbers

  explicit GenCtx(uint64_t seed) : rng(seed) {}
  int uni(int lo, int hi) { return hi <= lo ? lo : lo + (int)(rng.next_u64() % (uint64_t)(hi - lo + 1)); }  // [lo, hi]
  double unif(double lo, double hi) { return lo + (hi - lo) * rng.uniform(); }
  bool coin(double p = 0.5) { return rng.uniform() < p; }
  // A multiple of `step` in [lo, hi].
  double stepped(double lo, double hi, double step) { return step * uni((int)std::ceil(lo / step), (int)std::floor(hi / step)); }
  template <class T>
  const T& pick(const std::vector<T>& v) { return v[rng.next_u64() % v.size()]; }
  std::string pick(std::initializer_list<std::string> v) { return *(v.begin() + rng.next_u64() % v.size()); }
  // Phrase choice whose alternatives are split: `tr` ones appear only in train instances,
  // `te` ones only in test instances.
  std::string P(std::initializer_list<std::string> tr, std::initializer_list<std::string> te) { return pick(test ? te : tr); }
  // k distinct entries of `pool` (k <= pool.size()), in random order.
  std::vector<std::string> sample(const std::vector<std::string>& pool, int k);
  void shuffle(std::vector<int>& v);

  std::string num(double v) const;     // "12", "2.5", "1,200" (commas when enabled and |v| >= 10000)
  std::string money(double v) const;   // "$12", "$2.50", "€1,200"
  std::string pct(double v) const;     // "4.5%"

  // Question sentences (split phrasings): ask for the optimum of `what` ("total profit").
  std::string ask_max(const std::string& what);
  std::string ask_min(const std::string& what);
  // Optional trailing remark asking to report infeasibility (independent of the intent).
  std::string maybe_infeasible_note();
};

// "a", "a and b", "a, b and c".
std::string join_and(const std::vector<std::string>& v, const std::string& conj = "and");
std::string join(const std::vector<std::string>& v, const std::string& sep);
std::string bullets(const std::vector<std::string>& v);  // "- a\n- b\n"
std::string cap1(std::string s);   // first letter upper case
std::string a_an(const std::string& noun);  // "a plant", "an electronics plant"
std::string count_word(int n);     // "two", ..., "twelve", then digits
// Markdown table.
std::string md_table(const std::vector<std::string>& head, const std::vector<std::vector<std::string>>& rows);
// LP-safe identifier from a display name: "Solvent A" -> "solvent_a".
std::string ident(const std::string& s);

// Algebraic formulation as readable text.
struct Formulation {
  std::vector<std::string> sets, params, vars, constraints;
  std::string objective;
  std::string render() const;
  // "profit[p]: tables 50, chairs 30" (numbers in plain LP format).
  static std::string param1(const std::string& head, const std::vector<std::string>& keys, const std::vector<double>& vals);
  // "use[r,p]: carpentry (tables 4, chairs 3); finishing (...)"
  static std::string param2(const std::string& head, const std::vector<std::string>& rk, const std::vector<std::string>& ck,
                            const std::vector<std::vector<double>>& m);
  static std::string set(const std::string& sym, const std::vector<std::string>& members, const std::string& what);
};

}  // namespace trex::orx
