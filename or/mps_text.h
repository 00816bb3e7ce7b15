// Repairs of MPS text before COIN-OR's CoinMpsIO reads it (or/mps_reader.cpp): the OBJSENSE
// section it ignores, and the field lengths it does not check.
#pragma once
#include <string>

namespace trex::orx {

// Takes the OBJSENSE section out of MPS text, keeping line numbers (its lines become '*'
// comments); maximize is set when it said MAX / MAXIMIZE.
std::string strip_objsense(const std::string& text, bool& maximize);
// "" when every line and field of the text is within CoinMpsIO's buffers, else what is too long
// (line: its 1-based line).
std::string mps_limits(const std::string& text, int& line);

}  // namespace trex::orx
