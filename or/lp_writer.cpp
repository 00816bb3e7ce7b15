#include "or/lp_writer.h"
#include <cctype>
#include <cmath>
#include <cstdio>
#include <sstream>
#include "core/error.h"

namespace trex::orx {

namespace {

constexpr size_t kMaxLine = 200;  // break before this; lines stay well under 256

bool name_char(char c) {
  return std::isalnum((unsigned char)c) || c == '_' || c == '.' || c == '[' || c == ']';
}

// Appends " + 3 x" style pieces to `out`, breaking lines when `line` grows too long.
struct ExprWriter {
  std::string& out;
  size_t line_len;
  bool first = true;
  void piece(const std::string& p) {
    if (line_len + p.size() + 1 > kMaxLine) {
      out += "\n   ";
      line_len = 3;
    }
    out += p;
    line_len += p.size();
  }
  void term(double coef, const std::string& name) {
    std::string p;
    if (!first) p += ' ';
    if (coef < 0) p += first ? "- " : "- ";
    else if (!first) p += "+ ";
    double a = std::fabs(coef);
    if (a != 1) p += lp_num(a) + " ";
    p += name;
    piece(p);
    first = false;
  }
};

void write_expr(std::string& out, const LpModel& m, const std::vector<LpTerm>& terms, size_t line_len) {
  ExprWriter w{out, line_len};
  for (const auto& t : terms) w.term(t.coef, m.vars[t.var].name);
  if (terms.empty()) {
    TREX_CHECK(!m.vars.empty(), "LP without variables");
    w.piece("0 " + m.vars[0].name);
  }
  out += ' ';
}

}  // namespace

std::string lp_num(double v) {
  if (v == 0) return "0";
  char buf[64];
  if (std::fabs(v) < 1e15 && v == std::round(v)) std::snprintf(buf, sizeof buf, "%.0f", v);
  else std::snprintf(buf, sizeof buf, "%.12g", v);
  return buf;
}

std::string lp_name(const std::string& s) {
  std::string r;
  for (char c : s) r += name_char(c) ? c : '_';
  if (r.empty() || std::isdigit((unsigned char)r[0]) || r[0] == '.') r = "x" + r;
  // A name equal to a keyword of the format would be read back as that keyword when it starts a
  // line ("bin <= 1" in Bounds opens a Binary section) or as a number ("x + inf"): suffix it.
  static const char* const kKeywords[] = {
      "max", "maximize", "maximise", "maximum", "min", "minimize", "minimise", "minimum", "st", "s.t.",
      "st.", "s.t", "subject", "such", "bound", "bounds", "gen", "general", "generals", "int", "integer",
      "integers", "bin", "binary", "binaries", "end", "sos", "sos1", "sos2", "semi", "semis", "free",
      "inf", "infinity"};
  std::string low;
  for (char c : r) low += (char)std::tolower((unsigned char)c);
  for (const char* k : kKeywords)
    if (low == k) return r + "_";
  return r;
}

uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string write_lp(const LpModel& m, const std::string& comment) {
  for (const auto& v : m.vars) TREX_CHECK(!v.name.empty() && lp_name(v.name) == v.name, "invalid LP name '", v.name, "'");
  std::string out;
  if (!comment.empty()) {
    std::istringstream is(comment);
    std::string l;
    while (std::getline(is, l)) out += "\\ " + l.substr(0, kMaxLine) + "\n";
  }
  out += m.maximize ? "Maximize\n" : "Minimize\n";
  std::string head = " " + (m.obj_name.empty() ? std::string("obj") : m.obj_name) + ": ";
  out += head;
  write_expr(out, m, m.obj, head.size());
  if (m.obj_const != 0) out += (m.obj_const < 0 ? "- " : "+ ") + lp_num(std::fabs(m.obj_const));
  while (!out.empty() && out.back() == ' ') out.pop_back();
  out += "\nSubject To\n";
  auto row_line = [&](const std::string& name, const std::vector<LpTerm>& terms, const char* sense, double rhs) {
    std::string h = " " + name + ": ";
    out += h;
    write_expr(out, m, terms, h.size());
    out += sense;
    out += ' ';
    out += lp_num(rhs);
    out += '\n';
  };
  for (const auto& r : m.rows) {
    switch (r.sense) {
      case RowSense::LE: row_line(r.name, r.terms, "<=", r.rhs); break;
      case RowSense::GE: row_line(r.name, r.terms, ">=", r.rhs); break;
      case RowSense::EQ: row_line(r.name, r.terms, "=", r.rhs); break;
      case RowSense::Range:
        row_line(r.name + "_lo", r.terms, ">=", r.range_lo);
        row_line(r.name, r.terms, "<=", r.rhs);
        break;
    }
  }
  // Which variables appear somewhere (others need a Bounds line to exist at all).
  std::vector<char> used(m.vars.size(), 0);
  for (const auto& t : m.obj) used[t.var] = 1;
  for (const auto& r : m.rows)
    for (const auto& t : r.terms) used[t.var] = 1;
  std::string bounds, gen, bin;
  auto list = [](std::string& s, const std::string& name) {  // names, several per line
    const size_t last = s.rfind('\n');
    const size_t len = last == std::string::npos ? s.size() : s.size() - last - 1;
    if (!s.empty() && len + name.size() + 1 > kMaxLine) s += "\n";
    s += " " + name;
  };
  for (size_t j = 0; j < m.vars.size(); ++j) {
    const LpVar& v = m.vars[j];
    if (v.is_binary()) {
      list(bin, v.name);
      continue;
    }
    if (v.integer) list(gen, v.name);
    const bool lo_inf = lp_is_inf(v.lb) && v.lb < 0, hi_inf = lp_is_inf(v.ub);
    if (lo_inf && hi_inf) bounds += " " + v.name + " free\n";
    else if (v.lb == v.ub) bounds += " " + v.name + " = " + lp_num(v.lb) + "\n";
    else if (lo_inf) bounds += " -inf <= " + v.name + " <= " + lp_num(v.ub) + "\n";
    else if (hi_inf && (v.lb != 0 || !used[j])) bounds += " " + v.name + " >= " + lp_num(v.lb) + "\n";
    else if (!hi_inf && v.lb == 0) bounds += " " + v.name + " <= " + lp_num(v.ub) + "\n";
    else if (!hi_inf) bounds += " " + lp_num(v.lb) + " <= " + v.name + " <= " + lp_num(v.ub) + "\n";
  }
  if (!bounds.empty()) out += "Bounds\n" + bounds;
  if (!gen.empty()) out += "General\n" + gen + "\n";
  if (!bin.empty()) out += "Binary\n" + bin + "\n";
  out += "End\n";
  return out;
}

}  // namespace trex::orx
