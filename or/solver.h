// Solver interface: LP / MILP from CPLEX LP text, MPS text or an in-memory LpModel, with a time
// limit. Implementations: CBC/CLP (make_cbc_solver). Another solver (HiGHS, ...) is one more
// subclass. A solver never prints to stdout and never aborts the process: every failure comes
// back as a status with a message (and the line for parse errors).
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>
#include "or/lp_model.h"

namespace trex::orx {

struct SolveResult {
  enum Status { Optimal, Infeasible, Unbounded, TimeLimit, ParseError, Error } status = Error;
  double objective = 0;  // in the model's own sense, constant term included; Optimal only
  std::vector<std::pair<std::string, double>> values;  // every variable, in model order; Optimal only
  bool has_incumbent = false;  // TimeLimit: an integer-feasible solution was found
  double incumbent = 0;        // TimeLimit with has_incumbent: its objective (not proven optimal)
  std::string message;   // parse error text, solver diagnostics
  int line = 0;          // ParseError: 1-based line of the error (0 if unknown)
  double seconds = 0;    // wall time of the call
};

// "optimal", "infeasible", "unbounded", "time_limit", "parse_error", "error".
const char* status_name(SolveResult::Status s);

class Solver {
 public:
  virtual ~Solver() = default;
  virtual std::string name() const = 0;
  virtual SolveResult solve_model(const LpModel& m, double time_limit_s) = 0;
  virtual SolveResult solve_lp_text(const std::string& text, double time_limit_s) = 0;
  virtual SolveResult solve_mps_text(const std::string& text, double time_limit_s) = 0;
};

// CLP for pure LPs; for MILPs CLP first solves the relaxation (which settles infeasible and
// unbounded), then CBC branch and cut within the time limit. LP text goes through
// or/lp_parser.h, MPS text through CoinMpsIO.
std::unique_ptr<Solver> make_cbc_solver();

}  // namespace trex::orx
