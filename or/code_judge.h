// Solver-code outputs: a Python program (PuLP, Pyomo, gurobipy, coptpy) in a model's output, run
// in the sandbox (or/sandbox.h) under a small harness that reads the objective from the solved
// model itself, the last one solved: a pulp.LpProblem (LpStatus, objective.value()), a Pyomo model
// a solver was called on (termination condition, value() of its active objective), a gurobipy
// Model optimized (Status, ObjVal) or a coptpy Model solved (status, objval), wherever the program
// kept it; only when none exists, the last printed line naming an objective / optimum / best value
// (objective_source "printed"). A solver module the program could not import (even where it
// caught the error) with no model solved makes the output "solver_unavailable", never a pass.
#pragma once
#include <string>
#include <vector>
#include "or/sandbox.h"
#include "or/solver.h"

namespace trex::orx {

struct ExtractedCode {
  bool found = false;
  std::string code;
  std::string how;  // "fenced_python" | "fenced" (another fence importing a solver library) | "none"
};
// The last ```python / ```py / ```python3 fence; else the last fence that imports pulp, pyomo,
// gurobipy, coptpy, docplex, pyscipopt, mip or ortools. An unclosed final fence counts.
ExtractedCode extract_code(const std::string& output);

// The interpreter the programs run with, and the folders it needs in the sandbox's view.
struct PythonEnv {
  bool ok = false;
  std::string python;                       // absolute path
  std::vector<std::string> readonly_paths;  // sys.prefix, sys.base_prefix, the interpreter's folder
  std::string why;                          // !ok: what is missing and what to do
};
// `requested` empty: $TREX_OR_PYTHON, else .venv/bin/python (from the working directory), else
// python3 on PATH. Runs it once (trusted, outside the sandbox) to read its prefixes and its
// sys.executable, which becomes `python` (so a launcher script such as a pyenv shim is not what
// the sandbox runs).
PythonEnv find_python(const std::string& requested);

struct CodeVerdict {
  // failure: "" (ran and gave an answer) | "parse_error" (syntax error) | "runtime_error" |
  // "timeout" | "solver_unavailable" (module or solver executable missing) | "no_answer" (ran,
  // solved no model and printed no objective) | "sandbox_error"
  std::string failure;
  SolveResult result;             // Optimal / Infeasible / Unbounded (or Error with failure set)
  std::string objective_source;   // "pulp" | "pyomo" | "gurobipy" | "coptpy" | "printed" | ""
  std::string limit;              // failure "timeout": "cpu" | "wall" (the program's), "solver" (the
                                  // solver's own time limit, from its status)
  std::string isolation;          // SandboxResult::isolation
  double seconds = 0;
  int pgid = 0;                   // the run's process group (gone when run_solver_code returns)
};
CodeVerdict run_solver_code(const std::string& code, const PythonEnv& py, const SandboxLimits& limits);

}  // namespace trex::orx
