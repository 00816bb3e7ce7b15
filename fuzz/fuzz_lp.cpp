// Fuzz target: CPLEX LP text, as the OR evaluator receives it from a model's answer
// (or/judge.cpp: Solver::solve_lp_text). The text is parsed by trex::orx::parse_lp
// (or/lp_parser.cpp); a model that parses (and whose names write_lp can print) is written back
// with write_lp and parsed again (the writer's output must be accepted by the parser), then solved by CBC/CLP through
// make_cbc_solver()->solve_lp_text with a 1 s limit (or/solver_cbc.cpp must turn every solver
// failure into a status, never abort).
#include <cmath>
#include <memory>
#include <string>

#include "fuzz/fuzz_util.h"
#include "or/lp_parser.h"
#include "or/lp_writer.h"
#include "or/solver.h"

using namespace trex;
using namespace trex::orx;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static std::unique_ptr<Solver> solver = make_cbc_solver();
  const std::string text(fuzz::as_text(data, size));
  LpParseResult p = parse_lp(text);
  if (!p.ok) {
    FUZZ_ASSERT(!p.error.empty() && p.line >= 1, "a parse error needs a message and a line");
    return 0;
  }
  const LpModel& m = p.model;
  for (const LpVar& v : m.vars) FUZZ_ASSERT(!std::isnan(v.lb) && !std::isnan(v.ub), "NaN bound on ", v.name);
  for (const LpRow& r : m.rows)
    for (const LpTerm& t : r.terms) FUZZ_ASSERT(t.var >= 0 && t.var < static_cast<int>(m.vars.size()));
  for (const LpTerm& t : m.obj) FUZZ_ASSERT(t.var >= 0 && t.var < static_cast<int>(m.vars.size()));
  // Round trip through the writer, for models whose names the writer can print (the parser
  // also takes CPLEX names with characters such as { } ! that write_lp, conservatively, refuses).
  bool writable = !m.vars.empty();
  for (const LpVar& v : m.vars) writable = writable && lp_name(v.name) == v.name;
  for (const LpRow& r : m.rows) writable = writable && (r.name.empty() || lp_name(r.name) == r.name);
  writable = writable && (m.obj_name.empty() || lp_name(m.obj_name) == m.obj_name);
  if (writable) {
    const std::string w = write_lp(m);
    LpParseResult q = parse_lp(w);
    FUZZ_ASSERT(q.ok, "write_lp output does not parse: line ", q.line, ": ", q.error, "\n", w);
    FUZZ_ASSERT(q.model.maximize == m.maximize);
    FUZZ_ASSERT(q.model.rows.size() >= m.rows.size());  // a Range row is written as two rows
  }
  SolveResult r = solver->solve_lp_text(text, 1.0);
  FUZZ_ASSERT(r.status != SolveResult::ParseError, "parse_lp accepted the text but the solver did not");
  if (r.status == SolveResult::Optimal) FUZZ_ASSERT(r.values.size() == m.vars.size());
  return 0;
}
