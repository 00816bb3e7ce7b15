// Pass@1 judge (or/judge.h) on hand-written predictions (tests/data/or/judge_*.jsonl): right,
// wrong, unparsable, infeasible, unbounded, within-5%-but-not-strict, bare and truncated blocks.
#include <gtest/gtest.h>
#include <filesystem>
#include <sstream>
#include "core/error.h"
#include "or/judge.h"

namespace fs = std::filesystem;
using namespace trex::orx;

namespace {

std::string data(const std::string& name) {
  const fs::path candidates[] = {fs::path(__FILE__).parent_path().parent_path() / "data/or", fs::path("tests/data/or")};
  for (const auto& p : candidates)
    if (fs::exists(p / name)) return (p / name).string();
  ADD_FAILURE() << name << " not found (run from the repository root)";
  return name;
}

struct Expect {
  bool found, parsed, solved, strict, lenient;
  const char* how;
};

}  // namespace

TEST(OrJudge, Rules) {
  EXPECT_TRUE(strict_match(36, 36));
  EXPECT_TRUE(strict_match(36.00003, 36));   // 3e-5 / 37 < 1e-6
  EXPECT_FALSE(strict_match(36.0001, 36));
  EXPECT_TRUE(strict_match(1e-7, 0));
  EXPECT_TRUE(lenient_match(103, 100));
  EXPECT_TRUE(lenient_match(95, 100));
  EXPECT_FALSE(lenient_match(94.9, 100));
  EXPECT_FALSE(lenient_match(0.5, 0));       // at zero only the strict rule can pass
  EXPECT_TRUE(lenient_match(-102, -100));
}

TEST(OrJudge, TruthParsing) {
  EXPECT_EQ(parse_truth(nlohmann::json(12.5)).kind, Truth::Number);
  Truth t = parse_truth(nlohmann::json("$1,234.5"));
  EXPECT_EQ(t.kind, Truth::Number);
  EXPECT_DOUBLE_EQ(t.value, 1234.5);
  EXPECT_EQ(parse_truth(nlohmann::json("Infeasible")).kind, Truth::Infeasible);
  EXPECT_EQ(parse_truth(nlohmann::json("No Best Solution")).kind, Truth::Infeasible);
  EXPECT_EQ(parse_truth(nlohmann::json("unbounded")).kind, Truth::Unbounded);
  EXPECT_EQ(parse_truth(nlohmann::json("about twelve")).kind, Truth::Unreadable);
  EXPECT_EQ(parse_truth(nlohmann::json(nullptr)).kind, Truth::Unreadable);
}

TEST(OrJudge, Extraction) {
  EXPECT_FALSE(extract_lp("no model here").found);
  ExtractedLp a = extract_lp("text\n```python\nprint(1)\n```\n```lp\nMin\n obj: x\nst\n c: x >= 1\nEnd\n```\ntail");
  EXPECT_EQ(a.how, "fenced_lp");
  EXPECT_EQ(a.lp, "Min\n obj: x\nst\n c: x >= 1\nEnd\n");
  ExtractedLp b = extract_lp("```\nMaximize\n obj: x\nSubject To\n c: x <= 1\nEnd\n```");
  EXPECT_EQ(b.how, "fenced");
  // A bare block ends at End; the prose after it is not part of the LP.
  ExtractedLp c = extract_lp("We maximize profit.\nMaximize\n obj: x\nSubject To\n c: x <= 1\nEnd\nSo the answer is 1.");
  EXPECT_EQ(c.how, "bare");
  EXPECT_EQ(c.lp, "Maximize\n obj: x\nSubject To\n c: x <= 1\nEnd\n");
  // Windows line ends.
  ExtractedLp d = extract_lp("```lp\r\nMaximize\r\n obj: x\r\nSubject To\r\n c: x <= 1\r\nEnd\r\n```\r\n");
  EXPECT_EQ(d.lp, "Maximize\n obj: x\nSubject To\n c: x <= 1\nEnd\n");
}

TEST(OrJudge, HandWrittenPredictions) {
  EvalOptions o;
  std::vector<Problem> probs = load_problems(data("judge_data.jsonl"), o);
  PredictionsSource src(data("judge_predictions.jsonl"));
  ASSERT_EQ(probs.size(), 14u);
  const std::map<std::string, Expect> want = {
      {"right", {true, true, true, true, true, "fenced_lp"}},
      {"wrong", {true, true, true, false, false, "fenced_lp"}},
      {"no_lp", {false, false, false, false, false, "none"}},
      {"syntax", {true, false, false, false, false, "fenced_lp"}},
      {"infeasible_ok", {true, true, true, true, true, "fenced_lp"}},
      {"infeasible_missed", {true, true, true, false, false, "fenced_lp"}},
      {"near", {true, true, true, false, true, "fenced_lp"}},
      {"bare", {true, true, true, true, true, "bare"}},
      {"last_block", {true, true, true, true, true, "fenced_lp"}},
      {"unbounded_ok", {true, true, true, true, true, "fenced_lp"}},
      {"plain_fence", {true, true, true, true, true, "fenced"}},
      {"truncated", {true, true, true, true, true, "fenced_lp"}},
      {"integer_answer", {true, true, true, true, true, "fenced_lp"}},
      {"empty", {false, false, false, false, false, "none"}},
  };
  for (size_t i = 0; i < probs.size(); ++i) {
    const Problem& p = probs[i];
    auto s = make_cbc_solver();
    Verdict v = judge_output(src.output(p, i), p.truth, *s, 10);
    const Expect& e = want.at(p.id);
    EXPECT_EQ(v.lp.found, e.found) << p.id;
    EXPECT_EQ(v.parsed, e.parsed) << p.id << ": " << v.result.message;
    EXPECT_EQ(v.solved, e.solved) << p.id;
    EXPECT_EQ(v.strict, e.strict) << p.id << " objective " << v.result.objective;
    EXPECT_EQ(v.lenient, e.lenient) << p.id << " objective " << v.result.objective;
    EXPECT_EQ(v.lp.how, e.how) << p.id;
    if (p.id == "syntax") {
      EXPECT_EQ(v.result.status, SolveResult::ParseError);
      EXPECT_EQ(v.result.line, 6) << v.result.message;  // line within the extracted block
    }
  }
}

TEST(OrJudge, EvaluateSummaryAndResultsFile) {
  EvalOptions o;
  std::vector<Problem> probs = load_problems(data("judge_data.jsonl"), o);
  PredictionsSource src(data("judge_predictions.jsonl"));
  std::ostringstream res;
  EvalSummary s = evaluate(probs, src, o, &res);
  EXPECT_EQ(s.all.n, 14);
  EXPECT_EQ(s.all.strict, 8);
  EXPECT_EQ(s.all.lenient, 9);
  EXPECT_EQ(s.all.lp_found, 12);
  EXPECT_EQ(s.all.parsed, 11);
  EXPECT_EQ(s.all.solved, 11);
  EXPECT_EQ(s.per_category.at("lp").n, 10);
  EXPECT_EQ(s.per_category.at("ip").lenient, 2);
  std::istringstream is(res.str());
  std::string line;
  int n = 0;
  while (std::getline(is, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    for (const char* k : {"id", "truth", "output", "lp_found", "parsed", "status", "objective", "strict", "lenient"}) EXPECT_TRUE(j.contains(k)) << k;
    ++n;
  }
  EXPECT_EQ(n, 14);
  const std::string table = format_summary(s);
  EXPECT_NE(table.find("all"), std::string::npos);
  nlohmann::ordered_json js = summary_json(s);
  EXPECT_NEAR(js["pass1_strict"].get<double>(), 100.0 * 8 / 14, 1e-9);
}

TEST(OrJudge, PublicBenchmarkFieldNamesAndLineOrder) {
  EvalOptions o;
  std::vector<Problem> probs = load_problems(data("judge_public.jsonl"), o);
  ASSERT_EQ(probs.size(), 2u);
  EXPECT_EQ(probs[0].truth.kind, Truth::Number);
  EXPECT_EQ(probs[1].truth.kind, Truth::Infeasible);
  PredictionsSource src(data("judge_public_predictions.jsonl"));
  EvalSummary s = evaluate(probs, src, o, nullptr);
  EXPECT_EQ(s.all.strict, 2);
  // Explicit field names.
  o.question_field = "en_question";
  o.answer_field = "en_answer";
  EXPECT_EQ(load_problems(data("judge_public.jsonl"), o).size(), 2u);
  o.question_field = "nope";
  EXPECT_THROW(load_problems(data("judge_public.jsonl"), o), trex::UserError);
}
