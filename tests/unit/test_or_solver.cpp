// CBC/CLP solver interface on hand-written LP and MPS files (tests/data/or) with known optima,
// infeasible and unbounded models, MILPs, and malformed files (parse error with a line, no crash).
#include <gtest/gtest.h>
#include <unistd.h>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include "or/lp_parser.h"
#include "or/solver.h"

namespace fs = std::filesystem;
using namespace trex::orx;

namespace {

fs::path data_dir() {
  const fs::path candidates[] = {fs::path(__FILE__).parent_path().parent_path() / "data/or", fs::path("tests/data/or")};
  for (const auto& p : candidates)
    if (fs::exists(p / "wyndor.lp")) return p;
  ADD_FAILURE() << "tests/data/or not found (run from the repository root)";
  return candidates[1];
}

std::string read(const std::string& name) {
  std::ifstream f(data_dir() / name, std::ios::binary);
  EXPECT_TRUE(f.good()) << name;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

SolveResult solve_file(const std::string& name) {
  auto s = make_cbc_solver();
  const std::string text = read(name);
  return name.size() > 4 && name.substr(name.size() - 4) == ".mps" ? s->solve_mps_text(text, 10) : s->solve_lp_text(text, 10);
}

double value_of(const SolveResult& r, const std::string& name) {
  for (const auto& [n, v] : r.values)
    if (n == name) return v;
  ADD_FAILURE() << "no variable " << name;
  return NAN;
}

}  // namespace

TEST(OrSolver, KnownOptima) {
  struct Case {
    const char* file;
    double objective;
  } cases[] = {{"wyndor.lp", 36}, {"diet_small.lp", 2.25}, {"free_range.lp", 2}, {"knapsack4.lp", 23},
               {"integer_vertex.lp", 20}, {"wyndor.mps", 36}, {"knapsack4.mps", -23}};
  for (const auto& c : cases) {
    SolveResult r = solve_file(c.file);
    ASSERT_EQ(r.status, SolveResult::Optimal) << c.file << ": " << r.message;
    EXPECT_NEAR(r.objective, c.objective, 1e-7) << c.file;
  }
}

TEST(OrSolver, SolutionValues) {
  SolveResult w = solve_file("wyndor.lp");
  EXPECT_NEAR(value_of(w, "x1"), 2, 1e-7);
  EXPECT_NEAR(value_of(w, "x2"), 6, 1e-7);
  SolveResult k = solve_file("knapsack4.lp");
  EXPECT_NEAR(value_of(k, "a"), 1, 1e-7);
  EXPECT_NEAR(value_of(k, "b"), 1, 1e-7);
  EXPECT_NEAR(value_of(k, "c") + value_of(k, "d"), 0, 1e-7);
  SolveResult iv = solve_file("integer_vertex.lp");  // integral, not the LP vertex (3, 1.5)
  EXPECT_NEAR(value_of(iv, "x"), 4, 1e-7);
  EXPECT_NEAR(value_of(iv, "y"), 0, 1e-7);
  SolveResult d = solve_file("diet_small.lp");
  EXPECT_NEAR(value_of(d, "a"), 3.75, 1e-7);
}

TEST(OrSolver, InfeasibleAndUnbounded) {
  EXPECT_EQ(solve_file("infeasible.lp").status, SolveResult::Infeasible);
  EXPECT_EQ(solve_file("infeasible_int.lp").status, SolveResult::Infeasible);  // LP relaxation is feasible
  EXPECT_EQ(solve_file("unbounded.lp").status, SolveResult::Unbounded);
  EXPECT_EQ(solve_file("unbounded_int.lp").status, SolveResult::Unbounded);
}

TEST(OrSolver, MalformedFilesGiveTheLine) {
  struct Case {
    const char* file;
    int line;
  } cases[] = {{"bad_missing_sense.lp", 4}, {"bad_rhs_variable.lp", 5}, {"bad_no_operator.lp", 3}, {"bad_no_objective.lp", 1},
               {"bad_quadratic.lp", 2},     {"bad_prose.lp", 1},        {"bad_semicolon.lp", 4},   {"bad_sos.lp", 5},
               {"bad_long_name.lp", 4},     {"bad_dangling_plus.lp", 4}, {"bad_section.mps", 7}};
  for (const auto& c : cases) {
    SolveResult r = solve_file(c.file);
    EXPECT_EQ(r.status, SolveResult::ParseError) << c.file;
    EXPECT_EQ(r.line, c.line) << c.file << ": " << r.message;
    EXPECT_FALSE(r.message.empty()) << c.file;
  }
}

// The solver prints nothing to stdout, even for MILPs with cuts and for MPS with OBJSENSE.
TEST(OrSolver, QuietOnStdout) {
  std::fflush(stdout);
  char path[] = "/tmp/trex_or_stdout_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  const int saved = dup(1);
  dup2(fd, 1);
  for (const char* f : {"knapsack4.lp", "integer_vertex.lp", "wyndor.mps", "knapsack4.mps", "bad_section.mps", "unbounded_int.lp", "infeasible_int.lp"})
    solve_file(f);
  std::fflush(stdout);
  dup2(saved, 1);
  close(saved);
  close(fd);
  EXPECT_EQ(fs::file_size(path), 0u) << "solver wrote to stdout";
  fs::remove(path);
}

TEST(OrSolver, TimeLimitIsReported) {
  // A 40-item equality knapsack with no solution and weak bounds: stopped by the limit, not hung.
  LpModel m;
  Terms t;
  for (int j = 0; j < 40; ++j) t.push_back({m.add_var("x" + std::to_string(j), 0, 1, true), (double)(2 * (1000 + 37 * j))});
  m.obj = t;
  m.add_row("eq", t, RowSense::EQ, 2 * 20000 + 1);  // even coefficients, odd right-hand side
  auto s = make_cbc_solver();
  SolveResult r = s->solve_model(m, 0.3);
  EXPECT_TRUE(r.status == SolveResult::TimeLimit || r.status == SolveResult::Infeasible) << status_name(r.status);
  EXPECT_LT(r.seconds, 5.0);
}

TEST(OrSolver, MaximizeSenseAndValuesInModelOrder) {
  LpModel m;
  m.maximize = true;
  int a = m.add_var("a", 0, 4), b = m.add_var("b", 0, 3, true);
  m.obj = {{a, 1.5}, {b, 2}};
  m.obj_const = 10;
  m.add_row("cap", {{a, 1}, {b, 1}}, RowSense::LE, 5.5);
  auto s = make_cbc_solver();
  SolveResult r = s->solve_model(m, 5);
  ASSERT_EQ(r.status, SolveResult::Optimal);
  EXPECT_NEAR(r.objective, 10 + 2 * 3 + 1.5 * 2.5, 1e-9);
  ASSERT_EQ(r.values.size(), 2u);
  EXPECT_EQ(r.values[0].first, "a");
  EXPECT_EQ(r.values[1].first, "b");
}
