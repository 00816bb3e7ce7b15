// CPLEX LP text -> LpModel, with the line number of the first error.
// Accepted (case-insensitive keywords, each section keyword first on its line):
//   Maximize|Maximise|Maximum|Max|Minimize|Minimise|Minimum|Min   [name:] expression
//   Subject To|Such That|st|s.t.   constraints  [name:] expr (<=|=<|<|>=|=>|>|=) constant
//                                               or [name:] constant <= expr <= constant (range)
//   Bounds     x <= u | x >= l | l <= x <= u | x = v | x free   (+-inf / infinity accepted)
//   General|Generals|Integer|Integers|Gen|Int   names          Binary|Binaries|Bin   names
//   End
// Terms: "3 x", "3x", "3 * x", "- x"; repeated variables in one expression are summed; a constant in
// a constraint's expression moves to the right-hand side; `\` starts a comment to end of line.
// Rejected with a message: variables on the right-hand side, quadratic terms, SOS and
// semi-continuous sections, names over 255 characters, missing operators, missing sense or rhs.
// Unlike CoinLpIO, this parser never aborts or misreads "3x" or a dangling "+": it reports
// the line instead.
#pragma once
#include <string>
#include "or/lp_model.h"

namespace trex::orx {

struct LpParseResult {
  bool ok = false;
  LpModel model;
  std::string error;  // "expected ... got ..." (without the line prefix)
  int line = 0;       // 1-based line of the error; 0 when ok
};

LpParseResult parse_lp(const std::string& text);

}  // namespace trex::orx
