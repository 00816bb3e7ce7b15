// Each output kind the judge reads (or/judge.h): an LP block, an MPS block, a PuLP program and a
// Pyomo program (CBC / GLPK). For each: the right model passes, a model of another problem fails
// as wrong_value, garbage fails as parse_error. Also what a missing solver or module gives
// (solver_unavailable, never a pass) and how the objective's source is reported. The Python cases
// are skipped, with the reason, where PuLP / Pyomo / GLPK are missing (scripts/setup_orpy.sh).
#include <gtest/gtest.h>
#include <unistd.h>
#include <cstdlib>
#include "or/code_judge.h"
#include "or/judge.h"

using namespace trex::orx;

namespace {

// The problem: maximize x + y with x + 2y <= 4, x <= 3 (optimum 3.5 at x = 3, y = 0.5).
const Truth kTruth = parse_truth(nlohmann::json(3.5));

const PythonEnv& python() {
  static const PythonEnv py = find_python("");
  return py;
}
bool has(const std::string& check) {
  if (!python().ok) return false;
  return std::system(("'" + python().python + "' -c '" + check + "' >/dev/null 2>&1").c_str()) == 0;
}

Verdict judge(const std::string& out) {
  auto solver = make_cbc_solver();
  JudgeSetup setup;
  setup.python = &python();
  setup.sandbox.wall_s = 30;
  return judge_output(out, kTruth, *solver, 10, setup);
}

void expect_kind(const std::string& right, const std::string& other, const std::string& garbage, const char* kind) {
  const Verdict r = judge(right);
  EXPECT_EQ(r.kind, kind);
  EXPECT_TRUE(r.strict) << kind << " right: " << r.failure << " " << r.result.message;
  EXPECT_EQ(r.failure, "");
  const Verdict o = judge(other);
  EXPECT_FALSE(o.strict || o.lenient) << kind;
  EXPECT_EQ(o.failure, "wrong_value") << kind << ": " << o.result.message;
  const Verdict g = judge(garbage);
  EXPECT_FALSE(g.strict) << kind;
  EXPECT_EQ(g.failure, "parse_error") << kind << ": " << g.result.message;
}

std::string pulp_program(int cap) {
  return "```python\nimport pulp\nm = pulp.LpProblem('p', pulp.LpMaximize)\nx = pulp.LpVariable('x', 0)\n"
         "y = pulp.LpVariable('y', 0)\nm += x + y\nm += x + 2 * y <= " + std::to_string(cap) + "\nm += x <= 3\n"
         "m.solve(pulp.PULP_CBC_CMD(msg=0))\nprint('Objective:', 1234)\n```\n";
}
std::string pyomo_program(int cap, const char* solver) {
  return std::string("Here is the model.\n```python\nfrom pyomo.environ import *\nm = ConcreteModel()\n"
                     "m.x = Var(within=NonNegativeReals)\nm.y = Var(within=NonNegativeReals)\n"
                     "m.obj = Objective(expr=m.x + m.y, sense=maximize)\nm.c1 = Constraint(expr=m.x + 2 * m.y <= ") +
         std::to_string(cap) + ")\nm.c2 = Constraint(expr=m.x <= 3)\nSolverFactory('" + solver + "').solve(m)\n```\n";
}

// The same problem in gurobipy / coptpy, the model built and solved inside a function (so it is
// in no global), with a misleading print: the objective must come from the solved model.
std::string gurobipy_program(int cap) {
  return "```python\nimport gurobipy as gp\nfrom gurobipy import GRB\n\ndef solve():\n    m = gp.Model('p')\n"
         "    m.Params.OutputFlag = 0\n    x = m.addVar(lb=0, name='x')\n    y = m.addVar(lb=0, name='y')\n"
         "    m.setObjective(x + y, GRB.MAXIMIZE)\n    m.addConstr(x + 2 * y <= " + std::to_string(cap) + ")\n"
         "    m.addConstr(x <= 3)\n    m.optimize()\n\nsolve()\nprint('Objective:', 1234)\n```\n";
}
std::string coptpy_program(int cap) {
  return "```python\nimport coptpy as cp\nfrom coptpy import COPT\n\ndef solve():\n    env = cp.Envr()\n"
         "    m = env.createModel('p')\n    m.setParam(COPT.Param.Logging, 0)\n    x = m.addVar(lb=0, name='x')\n"
         "    y = m.addVar(lb=0, name='y')\n    m.setObjective(x + y, COPT.MAXIMIZE)\n    m.addConstr(x + 2 * y <= " +
         std::to_string(cap) + ")\n    m.addConstr(x <= 3)\n    m.solve()\n\nsolve()\nprint('Objective:', 1234)\n```\n";
}
// Whether `module` runs a small model here (installed, and its size-limited licence works), run
// directly, outside the sandbox and the harness, so that a fault of the judge fails the test
// instead of skipping it.
bool solver_runs(const char* module) {
  if (!has(std::string("import ") + module)) return false;
  const std::string prog = std::string(module) == "gurobipy" ? gurobipy_program(4) : coptpy_program(4);
  char path[] = "/tmp/trex-or-code-test-XXXXXX";
  const int fd = ::mkstemp(path);
  if (fd < 0) return false;
  const std::string code = extract_code(prog).code;
  const bool written = ::write(fd, code.data(), code.size()) == (ssize_t)code.size();
  ::close(fd);
  const bool ok = written && std::system(("'" + python().python + "' " + path + " >/dev/null 2>&1").c_str()) == 0;
  ::unlink(path);
  return ok;
}
// An interpreter without `module`: the test's own if it lacks it, else python3 on PATH if that does.
const PythonEnv* python_without(const char* module) {
  static PythonEnv system = find_python("python3");
  auto lacks = [&](const PythonEnv& p) {
    return p.ok && std::system(("'" + p.python + "' -c 'import " + module + "' >/dev/null 2>&1").c_str()) != 0;
  };
  if (lacks(python())) return &python();
  if (lacks(system)) return &system;
  return nullptr;
}

}  // namespace

TEST(OrCode, LpOutputs) {
  expect_kind("```lp\nMaximize\n obj: x + y\nSubject To\n c1: x + 2 y <= 4\n c2: x <= 3\nEnd\n```",
              "```lp\nMaximize\n obj: x + y\nSubject To\n c1: x + 2 y <= 6\n c2: x <= 3\nEnd\n```",
              "```lp\nMaximize\n obj: x + + y\nSubject To\n c1: x + 2 y <=\nEnd\n```", "lp");
}

TEST(OrCode, MpsOutputs) {
  const std::string head = "```mps\nNAME P\nOBJSENSE\n    MAX\nROWS\n N  obj\n L  c1\n L  c2\nCOLUMNS\n    x  obj  1  c1  1\n"
                           "    x  c2  1\n    y  obj  1  c1  2\nRHS\n    rhs  c1  ";
  expect_kind(head + "4  c2  3\nENDATA\n```", head + "6  c2  3\nENDATA\n```",
              "```mps\nNAME P\nROWS\n N obj\nCOLUMNS\n    x  nowhere  1\nRHS\nENDATA\n```", "mps");
  // An unlabelled fence that starts with NAME is read as MPS too.
  EXPECT_TRUE(extract_lp("```\n" + head.substr(7) + "4  c2  3\nENDATA\n```").mps);
}

TEST(OrCode, PulpOutputs) {
  if (!has("import pulp")) GTEST_SKIP() << "PuLP is not installed (scripts/setup_orpy.sh): " << python().why;
  expect_kind(pulp_program(4), pulp_program(6), "```python\nimport pulp\nm = pulp.LpProblem('p' pulp.LpMaximize)\n```", "python");
  // The objective comes from the solved model, not from the printed 1234.
  const Verdict r = judge(pulp_program(4));
  EXPECT_EQ(r.objective_source, "pulp");
  EXPECT_DOUBLE_EQ(r.result.objective, 3.5);
}

TEST(OrCode, PyomoOutputs) {
  if (!has("import pyomo.environ")) GTEST_SKIP() << "Pyomo is not installed (scripts/setup_orpy.sh)";
  if (std::system("command -v glpsol >/dev/null 2>&1") != 0) GTEST_SKIP() << "glpsol (Debian glpk-utils) is not installed";
  expect_kind(pyomo_program(4, "glpk"), pyomo_program(6, "glpk"), "```python\nfrom pyomo.environ import *\nm = ConcreteModel(\n```",
              "python");
  const Verdict r = judge(pyomo_program(4, "glpk"));
  EXPECT_EQ(r.objective_source, "pyomo");
  if (std::system("command -v cbc >/dev/null 2>&1") == 0) {
    const Verdict c = judge(pyomo_program(4, "cbc"));
    EXPECT_TRUE(c.strict) << c.failure << " " << c.result.message;
  }
}

// gurobipy and coptpy from PyPI (scripts/setup_orpy.sh), each with the size-limited licence of its
// wheel: right, other problem, garbage; the objective from ObjVal / objval, not the print.
TEST(OrCode, GurobipyOutputs) {
  if (!solver_runs("gurobipy"))
    GTEST_SKIP() << "gurobipy is not installed, or its wheel's licence does not run a 2-variable model here "
                    "(scripts/setup_orpy.sh installs it from PyPI)";
  expect_kind(gurobipy_program(4), gurobipy_program(6), "```python\nimport gurobipy as gp\nm = gp.Model('p'\n```", "python");
  const Verdict r = judge(gurobipy_program(4));
  EXPECT_EQ(r.objective_source, "gurobipy");
  EXPECT_DOUBLE_EQ(r.result.objective, 3.5);
  // Infeasible: the status, not a number.
  const Verdict inf = judge("```python\nimport gurobipy as gp\nm = gp.Model()\nm.Params.OutputFlag = 0\nx = m.addVar(ub=1)\n"
                            "m.addConstr(x >= 2)\nm.optimize()\n```");
  EXPECT_EQ(inf.result.status, SolveResult::Infeasible) << inf.failure << " " << inf.result.message;
}

TEST(OrCode, CoptpyOutputs) {
  if (!solver_runs("coptpy"))
    GTEST_SKIP() << "coptpy is not installed, or it does not run a 2-variable model here without a licence file "
                    "(scripts/setup_orpy.sh installs it from PyPI)";
  expect_kind(coptpy_program(4), coptpy_program(6), "```python\nimport coptpy as cp\nm = cp.Envr().createModel(\n```", "python");
  const Verdict r = judge(coptpy_program(4));
  EXPECT_EQ(r.objective_source, "coptpy");
  EXPECT_DOUBLE_EQ(r.result.objective, 3.5);
}

TEST(OrCode, MissingSolverIsUnavailableNeverAPass) {
  if (!python().ok) GTEST_SKIP() << python().why;
  auto judge_with = [](const PythonEnv& py, const std::string& out) {
    auto solver = make_cbc_solver();
    JudgeSetup setup;
    setup.python = &py;
    setup.sandbox.wall_s = 30;
    return judge_output(out, kTruth, *solver, 10, setup);
  };
  for (const char* module : {"gurobipy", "coptpy"}) {
    SCOPED_TRACE(module);
    const PythonEnv* py = python_without(module);
    if (!py) {
      std::printf("[ note ] every interpreter here has %s: its absence is not tested\n", module);
      continue;
    }
    const std::string m = module;
    // The import fails: solver_unavailable, whatever the program meant to print.
    const Verdict g = judge_with(*py, "```python\nimport " + m + "\nprint('Optimal objective: 3.5')\n```");
    EXPECT_EQ(g.failure, "solver_unavailable") << g.result.message;
    EXPECT_FALSE(g.strict || g.lenient);
    // The program catches the ImportError and prints the right answer: still unavailable, no pass.
    const Verdict c = judge_with(*py, "```python\ntry:\n    import " + m + "\nexcept ImportError:\n    pass\n"
                                      "print('Optimal objective value:', 3.5)\n```");
    EXPECT_EQ(c.failure, "solver_unavailable") << c.result.message;
    EXPECT_FALSE(c.strict || c.lenient);
  }
  // The same with a solver module no interpreter here is likely to have, so it runs everywhere.
  for (const char* module : {"xpress", "mosek", "docplex"}) {
    if (has(std::string("import ") + module)) continue;
    const Verdict c = judge("```python\ntry:\n    import " + std::string(module) + "\nexcept ImportError:\n    pass\n"
                            "print('Optimal objective value:', 3.5)\n```");
    EXPECT_EQ(c.failure, "solver_unavailable") << module << ": " << c.result.message;
    EXPECT_FALSE(c.strict || c.lenient);
    break;
  }
  // A module that is no solver's is the program's own error.
  const Verdict o = judge("```python\nimport no_such_module_for_trex_tests\n```");
  EXPECT_EQ(o.failure, "runtime_error") << o.result.message;
  if (has("import pyomo.environ")) {
    const Verdict p = judge(pyomo_program(4, "no_such_solver_xyz"));
    EXPECT_EQ(p.failure, "solver_unavailable") << p.result.message;
  }
  // Without an interpreter, Python outputs are unavailable too.
  auto solver = make_cbc_solver();
  const Verdict n = judge_output(pulp_program(4), kTruth, *solver, 10, JudgeSetup{});
  EXPECT_EQ(n.failure, "solver_unavailable");
}

TEST(OrCode, PrintedObjectiveIsTheLastResort) {
  if (!python().ok) GTEST_SKIP() << python().why;
  const Verdict v = judge("```python\nbest = 3 + 0.5\nprint('Optimal objective value:', best)\n```");
  EXPECT_TRUE(v.strict) << v.failure << " " << v.result.message;
  EXPECT_EQ(v.objective_source, "printed");
  const Verdict n = judge("```python\nx = 1\n```");
  EXPECT_EQ(n.failure, "no_answer");
  const Verdict e = judge("```python\nraise ValueError('bad data')\n```");
  EXPECT_EQ(e.failure, "runtime_error");
  EXPECT_NE(e.result.message.find("bad data"), std::string::npos);
  EXPECT_EQ(judge("The answer is 3.5.").failure, "no_model");
}
