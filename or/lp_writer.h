// CPLEX LP text from an in-memory model (readable by CoinLpIO, CPLEX, Gurobi, HiGHS and the
// trex parser in or/lp_parser.h). Layout:
//   Maximize | Minimize
//    obj: 3 x + 2 y
//   Subject To
//    name: terms <= | >= | = rhs        (a Range row is written as name_lo: >= lo and name: <= hi)
//   Bounds                               (only non-default bounds; default is 0 <= x < inf)
//   General / Binary                     (integer variables; Binary for integer [0, 1])
//   End
// Lines stay under 256 characters (long expressions continue on the next line).
#pragma once
#include <cstdint>
#include <string>
#include "or/lp_model.h"

namespace trex::orx {

// `comment` (may be empty or multi-line) is written as leading `\ ` comment lines.
std::string write_lp(const LpModel& m, const std::string& comment = "");

// A number as the writer prints it: integers without a decimal point, otherwise up to 12
// significant digits ("12", "-3.5", "0.125").
std::string lp_num(double v);

// `s` made into a valid LP name: invalid characters become '_', a leading digit or '.' gets 'x'.
std::string lp_name(const std::string& s);

// 64-bit FNV-1a hash of text (used on the canonical LP to de-duplicate instances).
uint64_t fnv1a64(const std::string& s);

}  // namespace trex::orx
