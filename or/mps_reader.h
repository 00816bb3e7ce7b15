// MPS text -> LpModel through COIN-OR's CoinMpsIO, run in a forked child process: CoinMpsIO is
// not robust against malformed text (fuzz/fuzz_mps.cpp found a heap overflow and NULL
// dereferences inside it), so a crash there becomes a ParseError instead of ending trex.
#pragma once
#include <string>
#include "or/lp_model.h"
#include "or/solver.h"

namespace trex::orx {

// status Optimal: read fine (m filled, m.maximize from OBJSENSE); ParseError with the message and
// line; Error when the child could not run.
SolveResult read_mps(const std::string& text, LpModel& m);

}  // namespace trex::orx
