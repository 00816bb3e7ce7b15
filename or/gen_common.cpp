#include "or/gen_common.h"
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include "or/lp_writer.h"

namespace trex::orx {

std::vector<std::string> GenCtx::sample(const std::vector<std::string>& pool, int k) {
  std::vector<int> idx(pool.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = (int)i;
  shuffle(idx);
  std::vector<std::string> out;
  for (int i = 0; i < k && i < (int)idx.size(); ++i) out.push_back(pool[idx[i]]);
  return out;
}

void GenCtx::shuffle(std::vector<int>& v) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng.next_u64() % i]);
}

namespace {
std::string group(const std::string& digits) {
  std::string out;
  int n = (int)digits.size();
  for (int i = 0; i < n; ++i) {
    out += digits[i];
    if ((n - i - 1) % 3 == 0 && i + 1 < n) out += ',';
  }
  return out;
}
std::string fmt(double v, bool commas, int max_dec, bool fixed2) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", max_dec, std::fabs(v));
  std::string s = buf;
  if (!fixed2 && s.find('.') != std::string::npos) {
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
  }
  size_t dot = s.find('.');
  std::string ip = s.substr(0, dot), fp = dot == std::string::npos ? "" : s.substr(dot);
  if (commas && std::fabs(v) >= 10000) ip = group(ip);
  return (v < 0 ? "-" : "") + ip + fp;
}
}  // namespace

std::string GenCtx::num(double v) const { return fmt(v, commas, 4, false); }

std::string GenCtx::money(double v) const {
  const bool cents = std::fabs(v - std::round(v)) > 1e-9;
  std::string body = fmt(v, commas || std::fabs(v) >= 10000, 2, cents);
  if (cur == "EUR") return body + " euros";
  return (v < 0 ? "-" : "") + cur + (v < 0 ? body.substr(1) : body);
}

std::string GenCtx::pct(double v) const { return fmt(v, false, 4, false) + "%"; }

std::string GenCtx::ask_max(const std::string& what) {
  std::string s = P({"What is the maximum " + what + "?", "How large can the " + what + " be made?",
                     "Find the largest possible " + what + ".", "Determine the optimal plan and the resulting maximum " + what + ".",
                     "What plan maximizes the " + what + ", and what is that maximum?"},
                    {"Report the best attainable " + what + ".", "What is the highest " + what + " that can be reached?",
                     "Give the optimal value of the " + what + "."});
  return s;
}

std::string GenCtx::ask_min(const std::string& what) {
  return P({"What is the minimum " + what + "?", "How small can the " + what + " be made?",
            "Find the smallest possible " + what + ".", "Determine the optimal plan and the resulting minimum " + what + ".",
            "What plan minimizes the " + what + ", and what is that minimum?"},
           {"Report the lowest attainable " + what + ".", "What is the least " + what + " that can be achieved?",
            "Give the optimal value of the " + what + "."});
}

std::string GenCtx::maybe_infeasible_note() {
  if (!coin(0.3)) return "";
  return " " + P({"If no plan can meet every requirement, say that the problem is infeasible.",
                  "If the requirements cannot all be met, answer that the problem is infeasible."},
                 {"Should the conditions be impossible to satisfy together, state that no feasible plan exists."});
}

std::string join_and(const std::vector<std::string>& v, const std::string& conj) {
  if (v.empty()) return "";
  if (v.size() == 1) return v[0];
  std::string s;
  for (size_t i = 0; i + 1 < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s + " " + conj + " " + v.back();
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

std::string bullets(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += "- " + x + "\n";
  return s;
}

std::string a_an(const std::string& noun) {
  const char c = noun.empty() ? 'x' : (char)std::tolower((unsigned char)noun[0]);
  return (c == 'a' || c == 'e' || c == 'i' || c == 'o' || c == 'u' ? "an " : "a ") + noun;
}

std::string cap1(std::string s) {
  if (!s.empty()) s[0] = (char)std::toupper((unsigned char)s[0]);
  return s;
}

std::string count_word(int n) {
  static const char* w[] = {"zero", "one", "two", "three", "four", "five", "six",
                            "seven", "eight", "nine", "ten", "eleven", "twelve"};
  return n >= 0 && n <= 12 ? w[n] : std::to_string(n);
}

std::string md_table(const std::vector<std::string>& head, const std::vector<std::vector<std::string>>& rows) {
  std::string s = "|";
  for (const auto& h : head) s += " " + h + " |";
  s += "\n|";
  for (size_t i = 0; i < head.size(); ++i) s += i == 0 ? "---|" : "---:|";
  s += "\n";
  for (const auto& r : rows) {
    s += "|";
    for (const auto& c : r) s += " " + c + " |";
    s += "\n";
  }
  return s + "\n";
}

std::string ident(const std::string& s) {
  std::string r;
  for (char c : s) {
    if (std::isalnum((unsigned char)c)) r += (char)std::tolower((unsigned char)c);
    else if (!r.empty() && r.back() != '_') r += '_';
  }
  while (!r.empty() && r.back() == '_') r.pop_back();
  return lp_name(r);
}

std::string Formulation::set(const std::string& sym, const std::vector<std::string>& members, const std::string& what) {
  std::string s = sym + " = {";
  for (size_t i = 0; i < members.size(); ++i) s += (i ? ", " : "") + members[i];
  return s + "}: " + what;
}

std::string Formulation::param1(const std::string& head, const std::vector<std::string>& keys, const std::vector<double>& vals) {
  std::string s = head + ": ";
  for (size_t i = 0; i < keys.size(); ++i) s += (i ? ", " : "") + keys[i] + " " + lp_num(vals[i]);
  return s;
}

std::string Formulation::param2(const std::string& head, const std::vector<std::string>& rk, const std::vector<std::string>& ck,
                                const std::vector<std::vector<double>>& m) {
  std::string s = head + ":";
  for (size_t i = 0; i < rk.size(); ++i) {
    s += "\n    " + rk[i] + ": ";
    for (size_t j = 0; j < ck.size(); ++j) s += (j ? ", " : "") + ck[j] + " " + lp_num(m[i][j]);
  }
  return s;
}

std::string Formulation::render() const {
  std::string s;
  auto section = [&](const char* title, const std::vector<std::string>& items) {
    if (items.empty()) return;
    s += title;
    s += "\n";
    for (const auto& it : items) s += "  - " + it + "\n";
  };
  section("Sets:", sets);
  section("Parameters:", params);
  section("Decision variables:", vars);
  s += "Objective:\n  " + objective + "\n";
  section("Constraints:", constraints);
  return s;
}

}  // namespace trex::orx
