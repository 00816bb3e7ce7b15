// OR generators (or/generator.h, or/dataset.h): labels re-derived from the LP text by a fresh
// solver and by COIN's own LP reader, statement/LP number agreement, the train/test split,
// de-duplication, determinism, and the written data set.
#include <gtest/gtest.h>
#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <coin/CbcModel.hpp>
#include <coin/CoinLpIO.hpp>
#include <coin/CoinMessageHandler.hpp>
#include <coin/OsiClpSolverInterface.hpp>
#include "or/dataset.h"
#include "or/generator.h"
#include "or/judge.h"
#include "or/lp_parser.h"

namespace fs = std::filesystem;
using namespace trex::orx;

namespace {

// One shared generation run for the tests below: ~3000 instances over all families.
const std::vector<Instance>& corpus() {
  static const std::vector<Instance> v = [] {
    GenOptions o;
    o.n_train = 2600;
    o.n_test = 500;
    o.seed = 12345;
    GenStats st;
    return generate(o, st);
  }();
  return v;
}

bool close(double a, double b) { return std::fabs(a - b) <= 1e-6 * (1 + std::fabs(b)); }

// Independent path: COIN's CoinLpIO reads the text, CLP / CBC solve it.
SolveResult coin_reference(const std::string& text) {
  SolveResult r;
  FILE* f = fmemopen((void*)text.data(), text.size(), "r");
  CoinMessageHandler quiet;
  quiet.setLogLevel(0);
  CoinLpIO io;
  io.passInMessageHandler(&quiet);
  io.readLp(f);  // CoinLpIO takes the FILE and closes it
  OsiClpSolverInterface si;
  si.messageHandler()->setLogLevel(0);
  si.loadProblem(*io.getMatrixByRow(), io.getColLower(), io.getColUpper(), io.getObjCoefficients(), io.getRowLower(), io.getRowUpper());
  bool mip = false;
  for (int j = 0; j < io.getNumCols(); ++j)
    if (io.isInteger(j)) si.setInteger(j), mip = true;
  const double sign = io.wasMaximization() ? -1 : 1;  // CoinLpIO stores a maximisation as min of -obj
  si.initialSolve();
  if (si.isProvenPrimalInfeasible()) r.status = SolveResult::Infeasible;
  else if (si.isProvenDualInfeasible()) r.status = SolveResult::Unbounded;  // all generated ones are feasible
  else if (!mip) {
    r.status = SolveResult::Optimal;
    r.objective = sign * (si.getObjValue() + io.objectiveOffset());
  } else {
    CbcModel cbc(si);
    cbc.setLogLevel(0);
    cbc.branchAndBound();
    if (cbc.isProvenOptimal()) {
      r.status = SolveResult::Optimal;
      r.objective = sign * (cbc.getObjValue() + io.objectiveOffset());
    } else {
      r.status = cbc.isProvenInfeasible() ? SolveResult::Infeasible : SolveResult::Error;
    }
  }
  return r;
}

// Every number written in the statement; "30%" also gives 0.3.
std::vector<double> statement_numbers(const std::string& s) {
  std::vector<double> v;
  static const std::regex num("[0-9][0-9,]*(\\.[0-9]+)?%?");
  for (auto it = std::sregex_iterator(s.begin(), s.end(), num); it != std::sregex_iterator(); ++it) {
    std::string t = it->str();
    const bool pct = t.back() == '%';
    if (pct) t.pop_back();
    t.erase(std::remove(t.begin(), t.end(), ','), t.end());
    if (t.empty()) continue;
    const double x = std::stod(t);
    v.push_back(x);
    if (pct) v.push_back(x / 100);
  }
  return v;
}

std::string masked(std::string s) {
  for (auto& c : s)
    if (std::isdigit((unsigned char)c)) c = '#';
  return s;
}

std::vector<std::string> sentences(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : text) {
    if (c == '\n') {
      cur.clear();
      continue;
    }
    cur += c;
    if ((c == '.' || c == '?') && cur.size() > 1) {
      size_t b = cur.find_first_not_of(' ');
      if (b != std::string::npos && cur[b] != '|' && cur.size() - b > 30) out.push_back(masked(cur.substr(b)));
      cur.clear();
    }
  }
  return out;
}

}  // namespace

// Coverage, de-duplication and the share of infeasible / unbounded labels.
TEST(OrGen, CorpusCoverageAndLabels) {
  std::set<std::string> cats, fams;
  for (const auto& in : corpus()) cats.insert(in.category), fams.insert(in.family);
  EXPECT_EQ(cats, (std::set<std::string>{"lp", "ip", "network", "scheduling"}));
  EXPECT_EQ(fams.size(), all_families().size());
  std::map<std::string, int> per_cat;
  for (const auto& f : all_families()) ++per_cat[f.category];
  for (const auto& [c, n] : per_cat) EXPECT_GE(n, 3) << c;
  EXPECT_EQ(corpus().size(), 3100u);
  std::set<uint64_t> h;
  std::map<std::string, int> status;
  for (const auto& in : corpus()) {
    EXPECT_TRUE(h.insert(in.hash).second) << "duplicate LP " << in.tmpl;
    ++status[status_name(in.result.status)];
  }
  const double n = (double)corpus().size();
  EXPECT_GT(status["infeasible"] / n, 0.02);
  EXPECT_LT(status["infeasible"] / n, 0.08);
  EXPECT_GT(status["unbounded"] / n, 0.003);
  EXPECT_LT(status["unbounded"] / n, 0.03);
  std::printf("[or gen] %zu instances: %d optimal, %d infeasible, %d unbounded\n", corpus().size(), status["optimal"],
              status["infeasible"], status["unbounded"]);
}

// Every label re-derived from the LP text by a fresh solver call and by COIN's own reader.
TEST(OrGen, LabelsReSolveFromTheLpText) {
  int n = 0;
  for (const auto& in : corpus()) {
    auto s = make_cbc_solver();  // fresh solver per instance
    SolveResult r = s->solve_lp_text(in.lp, 20);
    ASSERT_EQ(r.status, in.result.status) << in.tmpl << "\n" << in.lp;
    if (r.status == SolveResult::Optimal) {
      ASSERT_TRUE(close(r.objective, in.result.objective)) << in.tmpl << " " << r.objective << " vs " << in.result.objective;
      // The published label (text) carries the optimum to the strict rule.
      EXPECT_TRUE(strict_match(r.objective, std::stod(label_text(in.result))));
    }
    // The same text read by COIN's CoinLpIO and solved by CLP / CBC directly.
    SolveResult c = coin_reference(in.lp);
    ASSERT_EQ(c.status, in.result.status) << "CoinLpIO path: " << in.tmpl << "\n" << in.lp;
    if (c.status == SolveResult::Optimal) {
      ASSERT_TRUE(close(c.objective, in.result.objective)) << in.tmpl << " " << c.objective << " vs " << in.result.objective << "\n" << in.lp;
    }
    ++n;
  }
  EXPECT_GE(n, 3000);
}

void check_split() {
  std::set<std::string> train_t, test_t, train_sent;
  std::set<std::string> train_q;
  for (const auto& in : corpus()) {
    (in.split == "train" ? train_t : test_t).insert(in.tmpl);
    if (in.split == "train")
      for (const auto& s : sentences(in.statement)) train_sent.insert(s);
  }
  for (const auto& t : test_t) EXPECT_FALSE(train_t.count(t)) << t << " is used by both splits";
  for (const auto& f : all_families()) {
    for (int k = 0; k < f.train_templates + f.test_templates; ++k) {
      const std::string t = std::string(f.name) + "/t" + std::to_string(k);
      EXPECT_TRUE(k < f.train_templates ? train_t.count(t) : test_t.count(t)) << t << " never used";
    }
  }
  // Wording: the share of test sentences (digits masked) that also occur in train statements.
  int64_t total = 0, seen = 0, last_seen = 0, tests = 0;
  for (const auto& in : corpus()) {
    if (in.split != "test") continue;
    auto ss = sentences(in.statement);
    for (const auto& s : ss) total++, seen += train_sent.count(s);
    if (!ss.empty()) ++tests, last_seen += train_sent.count(ss.back());  // the question itself
  }
  const double share = (double)seen / total;
  std::printf("[or split] %lld test sentences, %.1f%% also in train; test questions seen in train: %lld of %lld\n", (long long)total,
              100 * share, (long long)last_seen, (long long)tests);
  EXPECT_LT(share, 0.10);
  EXPECT_EQ(last_seen, 0);
}

// Statement and LP agree (every LP number is in the statement), and the split is by template
// and wording.
TEST(OrGen, StatementAgreesAndSplitHolds) {
  check_split();
  for (const auto& in : corpus()) {
    LpParseResult p = parse_lp(in.lp);
    ASSERT_TRUE(p.ok) << p.error;
    std::vector<double> lp_nums;
    for (const auto& t : p.model.obj) lp_nums.push_back(t.coef);
    for (const auto& row : p.model.rows) {
      for (const auto& t : row.terms) lp_nums.push_back(t.coef);
      lp_nums.push_back(row.rhs);
    }
    for (const auto& v : p.model.vars) {
      if (!lp_is_inf(v.lb)) lp_nums.push_back(v.lb);
      if (!lp_is_inf(v.ub)) lp_nums.push_back(v.ub);
    }
    const std::vector<double> st = statement_numbers(in.statement);
    for (double x : lp_nums) {
      const double a = std::fabs(x);
      if (a == 0 || a == 1) continue;  // structural coefficients (sums, flow balance, binaries)
      bool found = false;
      for (double y : st) found |= std::fabs(a - y) <= 1e-9 * (1 + a);
      ASSERT_TRUE(found) << in.tmpl << ": " << a << " is in the LP but not in the statement\n" << in.statement << "\n" << in.lp;
    }
  }
}

TEST(OrGen, DeterministicInTheSeed) {
  GenOptions o;
  o.n_train = 60;
  o.n_test = 12;
  o.seed = 99;
  GenStats a, b, c;
  auto x = generate(o, a), y = generate(o, b);
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(x[i].lp, y[i].lp);
    EXPECT_EQ(x[i].statement, y[i].statement);
  }
  o.seed = 100;
  auto z = generate(o, c);
  int same = 0;
  for (size_t i = 0; i < std::min(x.size(), z.size()); ++i) same += x[i].lp == z[i].lp;
  EXPECT_LT(same, 3);
}

TEST(OrGen, WritesTheDataSet) {
  const fs::path dir = fs::temp_directory_path() / ("trex_or_gen_" + std::to_string(::getpid()));
  GenOptions o;
  o.n_train = 90;
  o.n_test = 15;
  o.seed = 5;
  DatasetReport rep = write_dataset(o, dir.string());
  EXPECT_EQ(rep.n_sft, 90);
  EXPECT_EQ(rep.n_cpt, 90);
  EXPECT_EQ(rep.n_test, 15);
  auto lines = [&](const char* f) {
    std::vector<nlohmann::json> v;
    std::ifstream in(dir / f);
    std::string l;
    while (std::getline(in, l)) v.push_back(nlohmann::json::parse(l));
    return v;
  };
  auto sft = lines("sft.jsonl"), cpt = lines("cpt.jsonl"), test = lines("test.jsonl");
  ASSERT_EQ(sft.size(), 90u);
  ASSERT_EQ(cpt.size(), 90u);
  ASSERT_EQ(test.size(), 15u);
  std::map<std::string, int> tasks;
  for (const auto& j : sft) {
    ++tasks[j["task"]];
    ASSERT_EQ(j["messages"].size(), 2u);
    EXPECT_EQ(j["messages"][0]["role"], "user");
    const std::string a = j["messages"][1]["content"];
    // The assistant's LP block, judged like a model output, reproduces the label.
    Truth t = parse_truth(j["answer"]);
    auto s = make_cbc_solver();
    Verdict v = judge_output(a, t, *s, 20);
    EXPECT_TRUE(v.strict) << j["template"] << " " << a;
    EXPECT_EQ(v.lp.how, "fenced_lp");
  }
  EXPECT_EQ(tasks.size(), 3u);
  for (const auto& j : cpt) {
    const std::string text = j["text"];
    EXPECT_NE(text.find("## Mathematical formulation"), std::string::npos);
    EXPECT_NE(text.find("```lp\n"), std::string::npos);
  }
  for (const auto& j : test) {
    EXPECT_TRUE(j["question"].is_string());
    EXPECT_TRUE(j["answer"].is_number() || j["answer"] == "infeasible" || j["answer"] == "unbounded");
  }
  std::ifstream st(dir / "stats.json");
  nlohmann::json stats = nlohmann::json::parse(st);
  EXPECT_EQ(stats["sft_samples"], 90);
  EXPECT_TRUE(stats.contains("dedup_drops"));
  fs::remove_all(dir);
}
