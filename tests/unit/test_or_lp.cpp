// CPLEX LP writer and parser (or/lp_writer.h, or/lp_parser.h): round trips, accepted dialects,
// error lines, and a fuzz run that must never crash or throw.
#include <gtest/gtest.h>
#include <cmath>
#include <sstream>
#include "core/rng.h"
#include "or/lp_parser.h"
#include "or/lp_writer.h"
#include "or/solver.h"

using namespace trex;
using namespace trex::orx;

namespace {

LpModel random_model(Rng& r, int n, int m, int terms_per_row) {
  LpModel md;
  md.maximize = r.next_u64() % 2;
  for (int j = 0; j < n; ++j) {
    const int kind = (int)(r.next_u64() % 6);
    const std::string name = "v" + std::to_string(j) + (j % 3 ? "_q" : "");
    switch (kind) {
      case 0: md.add_var(name); break;
      case 1: md.add_var(name, -kLpInf, kLpInf); break;
      case 2: md.add_var(name, -3.5, 7); break;
      case 3: md.add_var(name, 0, 12, true); break;
      case 4: md.add_binary(name); break;
      default: md.add_var(name, 2, kLpInf); break;
    }
  }
  for (int j = 0; j < n; ++j)
    if (r.next_u64() % 3) md.obj.push_back({j, std::round(r.normal() * 400) / 100});
  for (int i = 0; i < m; ++i) {
    LpRow row;
    row.name = "r" + std::to_string(i);
    std::vector<char> used(n, 0);
    for (int k = 0; k < terms_per_row; ++k) {
      const int j = (int)(r.next_u64() % n);
      if (used[j]) continue;
      used[j] = 1;
      double c = std::round(r.normal() * 1000) / 100;
      if (c == 0) c = 1;
      row.terms.push_back({j, c});
    }
    const int s = (int)(r.next_u64() % 3);
    row.sense = s == 0 ? RowSense::LE : s == 1 ? RowSense::GE : RowSense::EQ;
    row.rhs = std::round(r.normal() * 1000) / 10;
    md.rows.push_back(row);
  }
  return md;
}

void expect_same(const LpModel& a, const LpModel& b) {
  ASSERT_EQ(a.maximize, b.maximize);
  ASSERT_EQ(a.rows.size(), b.rows.size());
  // Variables that appear nowhere and keep default bounds may be listed in a different order;
  // compare by name.
  for (const auto& v : a.vars) {
    const int k = b.find(v.name);
    ASSERT_GE(k, 0) << v.name;
    EXPECT_EQ(v.lb, b.vars[k].lb) << v.name;
    EXPECT_EQ(v.ub, b.vars[k].ub) << v.name;
    EXPECT_EQ(v.integer, b.vars[k].integer) << v.name;
  }
  auto dense = [](const LpModel& m, const std::vector<LpTerm>& t) {
    std::map<std::string, double> d;
    for (const auto& x : t) d[m.vars[x.var].name] += x.coef;
    return d;
  };
  EXPECT_EQ(dense(a, a.obj), dense(b, b.obj));
  for (size_t i = 0; i < a.rows.size(); ++i) {
    EXPECT_EQ(a.rows[i].name, b.rows[i].name);
    EXPECT_EQ(a.rows[i].sense, b.rows[i].sense);
    EXPECT_EQ(a.rows[i].rhs, b.rows[i].rhs);
    EXPECT_EQ(dense(a, a.rows[i].terms), dense(b, b.rows[i].terms)) << a.rows[i].name;
  }
}

LpParseResult parse_ok(const std::string& text) {
  LpParseResult p = parse_lp(text);
  EXPECT_TRUE(p.ok) << "line " << p.line << ": " << p.error << "\n" << text;
  return p;
}

}  // namespace

TEST(OrLp, WriteParseRoundTrip) {
  Rng r(11);
  for (int t = 0; t < 200; ++t) {
    LpModel m = random_model(r, 3 + (int)(r.next_u64() % 17), 1 + (int)(r.next_u64() % 9), 1 + (int)(r.next_u64() % 8));
    const std::string text = write_lp(m, "round trip " + std::to_string(t));
    LpParseResult p = parse_ok(text);
    if (!p.ok) return;
    expect_same(m, p.model);
    // Variables are numbered in order of first appearance when read back, so the second
    // write is the fixed point.
    const std::string text2 = write_lp(p.model);
    LpParseResult p2 = parse_ok(text2);
    if (!p2.ok) return;
    expect_same(m, p2.model);
    EXPECT_EQ(write_lp(p2.model), text2) << "writer/parser have no fixed point";
  }
}

TEST(OrLp, LongRowsStayUnder256Characters) {
  LpModel m;
  Terms t;
  for (int j = 0; j < 500; ++j) t.push_back({m.add_var("a_rather_long_variable_name_" + std::to_string(j), 0, kLpInf, j % 2), 1.0 + j});
  m.obj = t;
  m.add_row("big", t, RowSense::LE, 1e6);
  const std::string text = write_lp(m);
  std::istringstream is(text);
  std::string line;
  while (std::getline(is, line)) EXPECT_LT(line.size(), 256u) << line;
  LpParseResult p = parse_ok(text);
  ASSERT_TRUE(p.ok);
  EXPECT_EQ(p.model.rows[0].terms.size(), 500u);
}

TEST(OrLp, RangeRowsAndConstants) {
  LpModel m;
  int x = m.add_var("x"), y = m.add_var("y", -kLpInf, kLpInf);
  m.obj = {{x, 1}, {y, -2}};
  m.obj_const = 4.5;
  LpRow& r = m.add_row("rng", {{x, 1}, {y, 1}}, RowSense::Range, 9);
  r.range_lo = -2;
  const std::string text = write_lp(m);
  EXPECT_NE(text.find("rng_lo: x + y >= -2"), std::string::npos) << text;
  EXPECT_NE(text.find("rng: x + y <= 9"), std::string::npos) << text;
  EXPECT_NE(text.find("+ 4.5"), std::string::npos) << text;
  LpParseResult p = parse_ok(text);
  ASSERT_TRUE(p.ok);
  EXPECT_DOUBLE_EQ(p.model.obj_const, 4.5);
  // Solving both gives the same optimum.
  auto s = make_cbc_solver();
  SolveResult a = s->solve_model(m, 5), b = s->solve_lp_text(text, 5);
  ASSERT_EQ(a.status, SolveResult::Optimal);
  ASSERT_EQ(b.status, SolveResult::Optimal);
  EXPECT_NEAR(a.objective, b.objective, 1e-9);
}

TEST(OrLp, AcceptsCommonDialects) {
  const char* variants[] = {
      "Maximize\n obj: 3 x + 2 y\nSubject To\n c1: x + y <= 4\n c2: x + 3 y <= 6\nBounds\n x <= 3\nEnd\n",
      "MAX\n 3x + 2y\nST\n x + y <= 4\n x + 3y <= 6\nBOUNDS\n x <= 3\nEND",
      "maximise: 3 * x + 2 * y\nsuch that\n c1: x + y =< 4\n c2: x + 3 y < 6\nbound\n 0 <= x <= 3\nend\n",
      "\\ comment line\nMaximum\n profit: +3 x\n   + 2 y \\ trailing comment\ns.t.\n c1: x +\n     y <= 4\n c2: 6 >= x + 3 y\nBounds\n -0 <= x <= 3\n y >= 0\nEnd\n",
      "Maximize\n obj: 3 x + 2 y + 0 z\nSubject To\n c1: x + y + 0 z <= 4\n c2: x + x - x + 3 y <= 6\nBounds\n x <= 3\n z = 0\nEnd\n",
      "Maximize\n obj: 3 x + 2 y\nSubject To:\n c1: x + y - 4 <= 0\n c2: x + 3 y <= 6\nBounds\n x <= 3\n y >= -infinity\n y <= +inf\nEnd\n",
  };
  auto s = make_cbc_solver();
  for (const char* v : variants) {
    SolveResult r = s->solve_lp_text(v, 5);
    // y free in the last variant does not change the optimum: x + 3y <= 6 and x + y <= 4 bind.
    ASSERT_EQ(r.status, SolveResult::Optimal) << v << "\n" << r.message;
    EXPECT_NEAR(r.objective, 11, 1e-9) << v;
  }
}

TEST(OrLp, ErrorsCarryTheLine) {
  struct Case {
    const char* text;
    int line;
    const char* needle;
  } cases[] = {
      {"Maximize\n obj: 3 x + 2 y\nSubject To\n c1: x + y 4\nEnd\n", 4, "comparison"},
      {"Maximize\n obj: 3 x 2 y\nSubject To\n c1: x <= 4\nEnd\n", 2, "between objective terms"},
      {"Maximize\n obj: x\n c1: x <= 4\nEnd\n", 3, "Subject To"},
      {"Maximize\n obj: x\nSubject To\n c1: x <= y\nEnd\n", 4, "constant right-hand side"},
      {"Maximize\n obj: x\nSubject To\n c1: x <= 4 x\nEnd\n", 4, "after the right-hand side"},
      {"Maximize\n obj: x\nSubject To\n c1: x <= 4\n c1: x <= 5\nEnd\n", 5, "duplicate"},
      {"Maximize\n obj: x\nSubject To\n c1: x <= 4\nBounds\n x <= \nEnd\n", 7, "number"},
      {"Maximize\n obj: x\nSubject To\n c1: x <= 4\nBounds\n x fre\nEnd\n", 6, "comparison or 'free'"},
      {"Maximize\n obj: x\nSubject To\n c1: x <= 4\nGeneral\n 3\nEnd\n", 6, "variable name"},
      {"Minimize\n obj: x + [ x ^ 2 ]\nSubject To\n c1: x >= 1\nEnd\n", 2, "quadratic"},
      {"Minimize\n obj: x * 3\nSubject To\n c1: x >= 1\nEnd\n", 2, "coefficient must come before"},
      {"Minimize\n obj: x\nSubject To\n c1: <= 4\nEnd\n", 4, "no variables"},
      {"Minimize\n obj: 1e400 x\nSubject To\n c1: x >= 1\nEnd\n", 2, "too large"},
      {"\n\n  hello\n", 3, "Maximize or Minimize"},
      {"", 1, "Maximize or Minimize"},
      {"Minimize\n obj: x\nSubject To\n c1: x >= 1\n\\* never closed\nEnd\n", 5, "unterminated"},
      {"Minimize\n obj: x\nSubject To\n c1: x >= 1.2.3\nEnd\n", 4, "malformed number"},
      {"Minimize\n obj: x\nSubject To\n c1: 2 <= x >= 1\nEnd\n", 4, "range"},
  };
  for (const auto& c : cases) {
    LpParseResult p = parse_lp(c.text);
    EXPECT_FALSE(p.ok) << c.text;
    EXPECT_EQ(p.line, c.line) << c.text << "\n" << p.error;
    EXPECT_NE(p.error.find(c.needle), std::string::npos) << "'" << p.error << "' lacks '" << c.needle << "'";
  }
}

// Random edits of valid LP text and random bytes: the parser and the solver must always return.
TEST(OrLp, FuzzNeverCrashes) {
  Rng r(2024);
  const std::string base =
      "Maximize\n obj: 3 x + 2 y - z\nSubject To\n c1: x + y + z <= 4\n c2: -2 <= x - 3 y <= 6\nBounds\n x <= 3\n z free\nGeneral\n y\nEnd\n";
  const std::string alphabet = "xyz0123456789.+-*<>=: \n\\[]^eE_:;!MaxSubjectToBoundsEndGeneralBinaryfree";
  auto s = make_cbc_solver();
  int ok = 0, bad = 0;
  for (int t = 0; t < 20000; ++t) {
    std::string text = base;
    const int edits = 1 + (int)(r.next_u64() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t pos = r.next_u64() % (text.size() + 1);
      switch (r.next_u64() % 3) {
        case 0: if (pos < text.size()) text.erase(pos, 1 + r.next_u64() % 5); break;
        case 1: text.insert(pos, 1, alphabet[r.next_u64() % alphabet.size()]); break;
        default: if (pos < text.size()) text[pos] = (char)(r.next_u64() % 256); break;
      }
    }
    if (t % 10 == 0) {  // pure noise
      text.clear();
      for (int k = (int)(r.next_u64() % 200); k > 0; --k) text += (char)(r.next_u64() % 256);
    }
    LpParseResult p = parse_lp(text);
    if (p.ok) ++ok;
    else {
      ++bad;
      EXPECT_GE(p.line, 1);
      EXPECT_FALSE(p.error.empty());
    }
    if (t % 10 == 0) {
      SolveResult res = s->solve_lp_text(text, 2);
      EXPECT_TRUE(res.status != SolveResult::ParseError || res.line >= 1);
    }
  }
  EXPECT_GT(ok, 100);
  EXPECT_GT(bad, 100);
  // Very long tokens (CoinLpIO aborts on these).
  for (const std::string& t : {std::string(100000, '7'), std::string(100000, 'x'), "Maximize\n obj: " + std::string(5000, '9') + " x\nEnd\n"}) {
    LpParseResult p = parse_lp(t);
    EXPECT_FALSE(p.ok);
    EXPECT_GE(p.line, 1);
  }
}
