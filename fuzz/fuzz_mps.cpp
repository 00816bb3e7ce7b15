// Fuzz target: MPS text, as `trex or solve --mps` and Solver::solve_mps_text read it
// (or/mps_text.cpp, or/mps_reader.cpp: OBJSENSE pre-pass, then COIN-OR CoinMpsIO through a temporary file, then
// the model is solved by CLP/CBC with a 1 s limit). CoinMpsIO is the system library (not
// instrumented): the target checks that trex turns whatever it reports into a status and never
// crashes or aborts.
#include <memory>
#include <string>

#include "fuzz/fuzz_util.h"
#include "or/solver.h"

using namespace trex;
using namespace trex::orx;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static std::unique_ptr<Solver> solver = make_cbc_solver();
  SolveResult r = solver->solve_mps_text(std::string(fuzz::as_text(data, size)), 1.0);
  if (r.status == SolveResult::ParseError) FUZZ_ASSERT(!r.message.empty());
  return 0;
}
