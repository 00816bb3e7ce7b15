// MPS text repairs (see mps_text.h).
#include "or/mps_text.h"

#include <cctype>
#include <vector>
#include <coin/CoinMpsIO.hpp>

namespace trex::orx {

// CoinMpsIO ignores OBJSENSE (and printf's that it does): take the section out here, keeping
// line numbers (the lines become '*' comments), and return the sense it gave.
std::string strip_objsense(const std::string& text, bool& maximize) {
  std::vector<std::string> lines;
  size_t b = 0;
  while (b <= text.size()) {
    size_t e = text.find('\n', b);
    if (e == std::string::npos) e = text.size();
    lines.push_back(text.substr(b, e - b));
    b = e + 1;
  }
  auto upper_words = [](const std::string& l) {
    std::vector<std::string> w;
    std::string cur;
    for (char c : l + " ") {
      if (std::isspace((unsigned char)c)) {
        if (!cur.empty()) w.push_back(cur);
        cur.clear();
      } else {
        cur += (char)std::toupper((unsigned char)c);
      }
    }
    return w;
  };
  auto sense_word = [](const std::string& w) { return w.rfind("MAX", 0) == 0 ? 1 : w.rfind("MIN", 0) == 0 ? 0 : -1; };
  for (size_t i = 0; i < lines.size(); ++i) {
    auto w = upper_words(lines[i]);
    if (w.empty() || w[0] != "OBJSENSE") continue;
    lines[i] = "*";
    if (w.size() > 1 && sense_word(w[1]) >= 0) {
      maximize = sense_word(w[1]) == 1;
    } else {
      for (size_t k = i + 1; k < lines.size(); ++k) {
        auto w2 = upper_words(lines[k]);
        if (w2.empty()) continue;
        if (sense_word(w2[0]) >= 0 && std::isspace((unsigned char)lines[k][0])) {
          maximize = sense_word(w2[0]) == 1;
          lines[k] = "*";
        }
        break;
      }
    }
  }
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) out += lines[i] + (i + 1 < lines.size() ? "\n" : "");
  return out;
}

// CoinMpsIO (CoinUtils 2.11) reads a line into a buffer of MAX_CARD_LENGTH bytes and copies
// each field into buffers of COIN_MAX_FIELD_LENGTH bytes without a length check: a longer field
// corrupts memory (found by fuzz/fuzz_mps.cpp). Such text is refused here, with its line (the
// reader also runs in a child process, see read_mps). Returns "" if the text is within limits.
std::string mps_limits(const std::string& text, int& line) {
  line = 1;
  size_t b = 0;
  while (b < text.size()) {
    size_t e = text.find('\n', b);
    if (e == std::string::npos) e = text.size();
    if (e - b >= MAX_CARD_LENGTH - 2)
      return "line longer than " + std::to_string(MAX_CARD_LENGTH - 3) + " characters";
    for (size_t i = b; i < e;) {
      if (text[i] == '\0') return "NUL byte in MPS text";
      if (std::isspace((unsigned char)text[i])) {
        ++i;
        continue;
      }
      size_t f = i;
      while (i < e && !std::isspace((unsigned char)text[i]) && text[i] != '\0') ++i;
      if (i - f >= COIN_MAX_FIELD_LENGTH - 1)
        return "field of " + std::to_string(i - f) + " characters (the MPS reader takes at most " +
               std::to_string(COIN_MAX_FIELD_LENGTH - 2) + ")";
    }
    b = e + 1;
    ++line;
  }
  return "";
}

}  // namespace trex::orx
