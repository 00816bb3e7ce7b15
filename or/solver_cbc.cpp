// CBC/CLP implementation of or/solver.h (the MPS reader: or/mps_reader.cpp).
#include <cmath>
#include <algorithm>
#include <cstdio>
#include <string>
#include <coin/CbcHeuristic.hpp>
#include <coin/CbcModel.hpp>
#include <coin/CglClique.hpp>
#include <coin/CglFlowCover.hpp>
#include <coin/CglGomory.hpp>
#include <coin/CglKnapsackCover.hpp>
#include <coin/CglMixedIntegerRounding2.hpp>
#include <coin/CglProbing.hpp>
#include <coin/ClpSimplex.hpp>
#include <coin/CoinError.hpp>
#include <coin/CoinPackedMatrix.hpp>
#include <coin/OsiClpSolverInterface.hpp>
#include "core/timer.h"
#include "or/lp_parser.h"
#include "or/mps_reader.h"
#include "or/solver.h"

namespace trex::orx {

const char* status_name(SolveResult::Status s) {
  switch (s) {
    case SolveResult::Optimal: return "optimal";
    case SolveResult::Infeasible: return "infeasible";
    case SolveResult::Unbounded: return "unbounded";
    case SolveResult::TimeLimit: return "time_limit";
    case SolveResult::ParseError: return "parse_error";
    case SolveResult::Error: return "error";
  }
  return "error";
}

namespace {

void quiet(OsiClpSolverInterface& si) {
  si.messageHandler()->setLogLevel(0);
  si.getModelPtr()->messageHandler()->setLogLevel(0);
  si.setHintParam(OsiDoReducePrint, true, OsiHintTry);
}

double to_coin(double v) {
  if (lp_is_inf(v)) return v < 0 ? -COIN_DBL_MAX : COIN_DBL_MAX;
  return v;
}

// Loads `m` into a fresh CLP interface (objective constant not included).
void load(const LpModel& m, OsiClpSolverInterface& si) {
  const int n = (int)m.vars.size();
  CoinPackedMatrix mat(false, 0, 0);  // row-ordered
  mat.setDimensions(0, n);
  std::vector<double> rlo, rhi;
  for (const auto& r : m.rows) {
    std::vector<int> idx;
    std::vector<double> val;
    for (const auto& t : r.terms) {
      idx.push_back(t.var);
      val.push_back(t.coef);
    }
    mat.appendRow((int)idx.size(), idx.data(), val.data());
    rlo.push_back(to_coin(r.lower()));
    rhi.push_back(to_coin(r.upper()));
  }
  std::vector<double> clo(n), chi(n), obj(n, 0.0);
  for (int j = 0; j < n; ++j) {
    clo[j] = to_coin(m.vars[j].lb);
    chi[j] = to_coin(m.vars[j].ub);
  }
  for (const auto& t : m.obj) obj[t.var] += t.coef;
  si.loadProblem(mat, clo.data(), chi.data(), obj.data(), rlo.data(), rhi.data());
  for (int j = 0; j < n; ++j) {
    si.setColName(j, m.vars[j].name);
    if (m.vars[j].integer) si.setInteger(j);
  }
  si.setObjSense(m.maximize ? -1.0 : 1.0);
}

std::string check_numbers(const LpModel& m) {
  auto bad = [](double v) { return !std::isfinite(v) || lp_is_inf(v); };
  for (const auto& t : m.obj)
    if (bad(t.coef)) return "objective coefficient out of range";
  for (const auto& r : m.rows)
    for (const auto& t : r.terms)
      if (bad(t.coef)) return "coefficient out of range in row '" + r.name + "'";
  for (const auto& v : m.vars)
    if (std::isnan(v.lb) || std::isnan(v.ub)) return "bad bound on '" + v.name + "'";
  for (const auto& r : m.rows)
    if (std::isnan(r.rhs) || std::isnan(r.range_lo)) return "bad right-hand side in row '" + r.name + "'";
  if (!std::isfinite(m.obj_const) || lp_is_inf(m.obj_const)) return "objective constant out of range";
  if (m.vars.empty()) return "the model has no variables";
  return "";
}

// A row or variable bounded by an infinity on the wrong side (a x >= +inf, x <= -inf) has no
// feasible point. CLP asserts (aborts the process) on such bounds, so they are settled here.
std::string infinite_bound(const LpModel& m) {
  for (const auto& r : m.rows) {
    if (lp_is_inf(r.lower()) && r.lower() > 0) return "row '" + r.name + "' must be >= +infinity";
    if (lp_is_inf(r.upper()) && r.upper() < 0) return "row '" + r.name + "' must be <= -infinity";
  }
  for (const auto& v : m.vars) {
    if (lp_is_inf(v.lb) && v.lb > 0) return "variable '" + v.name + "' has lower bound +infinity";
    if (lp_is_inf(v.ub) && v.ub < 0) return "variable '" + v.name + "' has upper bound -infinity";
  }
  return "";
}

void add_cuts(CbcModel& cbc) {
  CglProbing probing;
  probing.setUsingObjective(true);
  probing.setMaxPass(1);
  probing.setMaxProbe(10);
  probing.setMaxLook(10);
  CglGomory gomory;
  gomory.setLimit(100);
  CglKnapsackCover knap;
  CglClique clique;
  clique.setStarCliqueReport(false);
  clique.setRowCliqueReport(false);
  CglMixedIntegerRounding2 mir;
  CglFlowCover flow;
  cbc.addCutGenerator(&probing, -1, "Probing");
  cbc.addCutGenerator(&gomory, -1, "Gomory");
  cbc.addCutGenerator(&knap, -1, "Knapsack");
  cbc.addCutGenerator(&clique, -1, "Clique");
  cbc.addCutGenerator(&mir, -1, "MIR2");
  cbc.addCutGenerator(&flow, -1, "FlowCover");
  CbcRounding rounding(cbc);
  cbc.addHeuristic(&rounding);
}

// Branch and cut on `si` (already loaded). Returns the CBC verdict.
SolveResult run_cbc(const OsiClpSolverInterface& si, double seconds, const LpModel& m) {
  SolveResult r;
  CbcModel cbc(si);
  cbc.setLogLevel(0);
  cbc.messageHandler()->setLogLevel(0);
  cbc.solver()->messageHandler()->setLogLevel(0);
  cbc.setMaximumSeconds(std::max(0.01, seconds));
  add_cuts(cbc);
  cbc.branchAndBound();
  if (cbc.isProvenOptimal() && cbc.bestSolution()) {
    r.status = SolveResult::Optimal;
    r.objective = cbc.getObjValue() + m.obj_const;
    const double* x = cbc.bestSolution();
    for (size_t j = 0; j < m.vars.size(); ++j) r.values.emplace_back(m.vars[j].name, x[j]);
  } else if (cbc.isProvenInfeasible()) {
    r.status = SolveResult::Infeasible;
  } else if (cbc.isContinuousUnbounded()) {
    r.status = SolveResult::Unbounded;
  } else if (cbc.isSecondsLimitReached()) {
    r.status = SolveResult::TimeLimit;
    // CBC keeps a best solution buffer and an objective of 1e50 (its "infinity") before it has
    // found any integer solution: only a counted solution with a finite objective is an incumbent.
    const double obj = cbc.getObjValue();
    r.has_incumbent = cbc.bestSolution() && cbc.getSolutionCount() > 0 && std::isfinite(obj) && std::fabs(obj) < 1e49;
    if (r.has_incumbent) r.incumbent = obj + m.obj_const;
    r.message = r.has_incumbent ? "time limit with an incumbent of objective " + std::to_string(r.incumbent)
                                : "time limit before any integer solution (no incumbent)";
  } else {
    r.status = SolveResult::Error;
    r.message = "CBC stopped with status " + std::to_string(cbc.status()) + "/" + std::to_string(cbc.secondaryStatus());
  }
  return r;
}

// The relaxation is dual infeasible: the problem is unbounded if it has any feasible point.
SolveResult unbounded_or_infeasible(const LpModel& m, double seconds) {
  LpModel z = m;
  z.obj.clear();
  OsiClpSolverInterface si;
  quiet(si);
  load(z, si);
  si.getModelPtr()->setMaximumSeconds(seconds);
  si.initialSolve();
  SolveResult r;
  if (si.isProvenPrimalInfeasible()) {
    r.status = SolveResult::Infeasible;
    return r;
  }
  if (!si.isProvenOptimal()) {
    r.status = SolveResult::TimeLimit;
    r.message = "could not settle feasibility of the unbounded relaxation";
    return r;
  }
  if (!m.has_integers()) {
    r.status = SolveResult::Unbounded;
    return r;
  }
  SolveResult f = run_cbc(si, seconds, z);
  if (f.status == SolveResult::Optimal) r.status = SolveResult::Unbounded;
  else if (f.status == SolveResult::Infeasible) r.status = SolveResult::Infeasible;
  else {
    r.status = SolveResult::TimeLimit;
    r.message = "relaxation unbounded; integer feasibility not settled in time";
  }
  return r;
}

SolveResult solve_impl(const LpModel& m, double seconds) {
  SolveResult r;
  if (std::string bad = check_numbers(m); !bad.empty()) {
    r.status = SolveResult::Error;
    r.message = bad;
    return r;
  }
  if (std::string inf = infinite_bound(m); !inf.empty()) {
    r.status = SolveResult::Infeasible;
    r.message = inf;
    return r;
  }
  const double t0 = now_ms();
  OsiClpSolverInterface si;
  quiet(si);
  load(m, si);
  si.getModelPtr()->setMaximumSeconds(seconds);
  si.initialSolve();
  const double left = seconds - (now_ms() - t0) / 1000.0;
  if (si.isProvenOptimal()) {
    if (!m.has_integers()) {
      r.status = SolveResult::Optimal;
      r.objective = si.getObjValue() + m.obj_const;
      const double* x = si.getColSolution();
      for (size_t j = 0; j < m.vars.size(); ++j) r.values.emplace_back(m.vars[j].name, x[j]);
      return r;
    }
    return run_cbc(si, left, m);
  }
  if (si.isProvenPrimalInfeasible()) {
    r.status = SolveResult::Infeasible;
    return r;
  }
  if (si.isProvenDualInfeasible()) return unbounded_or_infeasible(m, std::max(0.5, left));
  const int st = si.getModelPtr()->status();
  if (st == 3 || si.isIterationLimitReached()) {
    r.status = SolveResult::TimeLimit;
    r.message = "LP relaxation hit the time or iteration limit";
  } else {
    r.status = SolveResult::Error;
    r.message = "CLP stopped with status " + std::to_string(st);
  }
  return r;
}

template <class F>
SolveResult guarded(F&& f) {
  const double t0 = now_ms();
  SolveResult r;
  try {
    r = f();
  } catch (const CoinError& e) {
    r = SolveResult{};
    r.status = SolveResult::Error;
    r.message = "COIN error in " + e.className() + "::" + e.methodName() + ": " + e.message();
  } catch (const std::exception& e) {
    r = SolveResult{};
    r.status = SolveResult::Error;
    r.message = e.what();
  } catch (...) {
    r = SolveResult{};
    r.status = SolveResult::Error;
    r.message = "unknown exception from the solver library";
  }
  r.seconds = (now_ms() - t0) / 1000.0;
  return r;
}

class CbcSolver final : public Solver {
 public:
  std::string name() const override { return "cbc"; }
  SolveResult solve_model(const LpModel& m, double time_limit_s) override {
    return guarded([&] { return solve_impl(m, time_limit_s); });
  }
  SolveResult solve_lp_text(const std::string& text, double time_limit_s) override {
    return guarded([&] {
      LpParseResult p = parse_lp(text);
      if (!p.ok) {
        SolveResult r;
        r.status = SolveResult::ParseError;
        r.message = "line " + std::to_string(p.line) + ": " + p.error;
        r.line = p.line;
        return r;
      }
      return solve_impl(p.model, time_limit_s);
    });
  }
  SolveResult solve_mps_text(const std::string& text, double time_limit_s) override {
    return guarded([&] {
      LpModel m;
      SolveResult rd = read_mps(text, m);
      if (rd.status != SolveResult::Optimal) return rd;
      return solve_impl(m, time_limit_s);
    });
  }
};

}  // namespace

std::unique_ptr<Solver> make_cbc_solver() { return std::make_unique<CbcSolver>(); }

}  // namespace trex::orx
