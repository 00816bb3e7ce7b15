// Several samples per problem (or/pass_at_k.h, evaluate() with EvalOptions::samples): the pass@k
// estimator against its definition counted over every k-subset, the majority vote's grouping, and
// an evaluation from a predictions file with repeated ids and sample lists.
#include <gtest/gtest.h>
#include <filesystem>
#include <fstream>
#include <sstream>
#include "core/error.h"
#include "or/judge.h"
#include "or/pass_at_k.h"

namespace fs = std::filesystem;
using namespace trex::orx;

namespace {

// The share of the k-subsets of n samples (the first c passing) that hold a passing sample.
double pass_at_k_by_subsets(int n, int c, int k) {
  int64_t all = 0, hit = 0;
  for (uint32_t m = 0; m < (1u << n); ++m) {
    if (__builtin_popcount(m) != k) continue;
    ++all;
    hit += (m & ((1u << c) - 1)) != 0;
  }
  return (double)hit / (double)all;
}

const char* kRight = "```lp\nMaximize\n obj: 3 x1 + 5 x2\nSubject To\n c1: x1 <= 4\n c2: 2 x2 <= 12\n c3: 3 x1 + 2 x2 <= 18\nEnd\n```";
const char* kWrong = "```lp\nMaximize\n obj: 3 x1 + 5 x2\nSubject To\n c1: x1 <= 4\n c2: 2 x2 <= 12\nEnd\n```";  // 42
const char* kInfeasible = "```lp\nMinimize\n obj: t + v\nSubject To\n need: t + v >= 10\nBounds\n t <= 3\n v <= 4\nEnd\n```";

std::string write(const std::string& name, const std::string& text) {
  const fs::path p = fs::temp_directory_path() / ("trex_passk_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(p) << text;
  return p.string();
}

std::string line(const nlohmann::json& j) { return j.dump() + "\n"; }

}  // namespace

TEST(OrPassAtK, EqualsTheShareOfSubsetsWithAPass) {
  for (int n = 1; n <= 9; ++n)
    for (int c = 0; c <= n; ++c)
      for (int k = 1; k <= n; ++k)
        EXPECT_NEAR(pass_at_k(n, c, k), pass_at_k_by_subsets(n, c, k), 1e-12) << n << " " << c << " " << k;
  EXPECT_DOUBLE_EQ(pass_at_k(10, 3, 1), 0.3);  // pass@1 is the share of right samples
  EXPECT_DOUBLE_EQ(pass_at_k(200, 0, 100), 0.0);
  EXPECT_DOUBLE_EQ(pass_at_k(200, 101, 100), 1.0);
  EXPECT_NEAR(pass_at_k(200, 1, 100), 0.5, 1e-12);
  EXPECT_THROW(pass_at_k(5, 6, 1), trex::Error);
  EXPECT_THROW(pass_at_k(5, 1, 6), trex::Error);
  EXPECT_THROW(pass_at_k(5, 1, 0), trex::Error);
}

TEST(OrPassAtK, MajorityGroupsEqualAnswers) {
  using S = SolveResult;
  EXPECT_EQ(majority_sample({}), -1);
  EXPECT_EQ(majority_sample({{S::ParseError, 0}, {S::TimeLimit, 0}}), -1);  // nobody votes
  // 36 (twice, within 1e-6 relative), 42 once: 36 wins, represented by its first sample.
  EXPECT_EQ(majority_sample({{S::Optimal, 42}, {S::Optimal, 36}, {S::ParseError, 0}, {S::Optimal, 36.00000001}}), 1);
  // Ties: the earliest group.
  EXPECT_EQ(majority_sample({{S::Optimal, 42}, {S::Infeasible, 0}}), 0);
  // Infeasible answers vote together; unbounded is another answer.
  EXPECT_EQ(majority_sample({{S::Optimal, 1}, {S::Infeasible, 0}, {S::Unbounded, 0}, {S::Infeasible, 0}}), 1);
}

TEST(OrPassAtK, EvaluateSamplesFromPredictions) {
  const std::string data = write("data.jsonl",
                                 line({{"id", "a"}, {"question", "glass"}, {"answer", "36"}}) +
                                     line({{"id", "b"}, {"question", "ship"}, {"answer", "infeasible"}}) +
                                     line({{"id", "c"}, {"question", "none"}, {"answer", "7"}}));
  // a: 4 samples over two lines (2 right); b: a list of 4 (3 right: infeasible); c: 2 of 4 given, both garbage.
  const std::string preds = write(
      "preds.jsonl", line({{"id", "a"}, {"outputs", {kRight, kWrong}}}) + line({{"id", "a"}, {"output", kWrong}}) +
                         line({{"id", "a"}, {"output", kRight}}) +
                         line({{"id", "b"}, {"outputs", {kInfeasible, "no model", kInfeasible, kInfeasible}}}) +
                         line({{"id", "c"}, {"outputs", {"garbage", "```lp\nnot an lp\n```"}}}));
  EvalOptions o;
  o.samples = 4;
  o.ks = {2, 4};
  const std::vector<Problem> probs = load_problems(data, o);
  PredictionsSource src(preds);
  EXPECT_TRUE(src.match(probs, true).ok()) << src.match(probs, true).str();
  EXPECT_FALSE(src.match(probs).ok());  // as single predictions, the repeated ids are duplicates
  std::ostringstream res;
  const EvalSummary s = evaluate(probs, src, o, &res);
  EXPECT_EQ(src.short_samples(), 1);  // c
  EXPECT_EQ(s.all.n, 3);
  EXPECT_EQ(s.all.outputs, 12);
  EXPECT_EQ(s.all.strict, 5);
  const double p1 = (pass_at_k(4, 2, 1) + pass_at_k(4, 3, 1) + 0) / 3, p2 = (pass_at_k(4, 2, 2) + pass_at_k(4, 3, 2)) / 3;
  EXPECT_NEAR(s.all.passk_strict.at(1) / s.all.n, p1, 1e-12);
  EXPECT_NEAR(s.all.passk_strict.at(2) / s.all.n, p2, 1e-12);
  EXPECT_NEAR(s.all.passk_strict.at(4) / s.all.n, 2.0 / 3, 1e-12);
  // Majority: a ties 36 / 42 (the first sample's 36 wins), b infeasible, c no vote.
  EXPECT_EQ(s.all.maj_strict, 2);
  std::istringstream is(res.str());
  std::string l;
  int n = 0;
  while (std::getline(is, l)) {
    const nlohmann::json j = nlohmann::json::parse(l);
    ASSERT_EQ(j["samples"].size(), 4u);
    if (j["id"] == "a") {
      EXPECT_EQ(j["n_strict"], 2);
    }
    if (j["id"] == "c") {
      EXPECT_EQ(j["majority_sample"], -1);
    }
    ++n;
  }
  EXPECT_EQ(n, 3);
  const nlohmann::ordered_json js = summary_json(s);
  EXPECT_NEAR(js["pass_at_k"]["4"]["strict"].get<double>(), 100.0 * 2 / 3, 1e-9);
  EXPECT_NEAR(js["majority_strict"].get<double>(), 100.0 * 2 / 3, 1e-9);
  EXPECT_NE(format_summary(s).find("pass@4"), std::string::npos);
  // A k past the samples is refused.
  o.ks = {5};
  PredictionsSource again(preds);
  EXPECT_THROW(evaluate(probs, again, o, nullptr), trex::UserError);
  fs::remove(data);
  fs::remove(preds);
}
