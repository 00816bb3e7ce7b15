// Public benchmark layouts (or/formats.h) read as they ship, from small files of our own in each
// layout (tests/data/or/public/): JSON arrays, an object holding the array, JSONL; en_question /
// en_answer and question / answer; answers as numbers or strings; "No Best Solution", -99999 and
// "infeasible"; detection from the file name and the fields; a file mixing sets; each set's rule.
#include <gtest/gtest.h>
#include <filesystem>
#include <fstream>
#include "core/error.h"
#include "or/formats.h"
#include "or/judge.h"

namespace fs = std::filesystem;
using namespace trex::orx;

namespace {

std::string data(const std::string& name) {
  const fs::path candidates[] = {fs::path(__FILE__).parent_path().parent_path() / "data/or/public", fs::path("tests/data/or/public")};
  for (const auto& p : candidates)
    if (fs::exists(p / name)) return (p / name).string();
  ADD_FAILURE() << name << " not found (run from the repository root)";
  return name;
}

}  // namespace

TEST(OrFormats, EachLayoutLoads) {
  const std::pair<const char*, const char*> files[] = {
      {"NL4OPT_sample.jsonl", "nl4opt"},         {"MAMO_EasyLP_sample.json", "mamo_easylp"},
      {"MAMO_ComplexLP_sample.jsonl", "mamo_complexlp"}, {"IndustryOR_sample.json", "industryor"},
      {"OptMATH_Bench_sample.jsonl", "optmath"}, {"OptiBench_sample.jsonl", "optibench"},
      {"ComplexOR_sample.json", "complexor"}};
  for (const auto& [file, set] : files) {
    SCOPED_TRACE(file);
    const std::vector<Problem> ps = load_problems(data(file), EvalOptions{});
    ASSERT_EQ(ps.size(), 3u);
    EXPECT_EQ(ps[0].category, set);
    EXPECT_EQ(ps[0].truth.kind, Truth::Number);
    EXPECT_DOUBLE_EQ(ps[0].truth.value, 120);
    EXPECT_DOUBLE_EQ(ps[1].truth.value, 1170);
    EXPECT_EQ(ps[2].truth.kind, Truth::Infeasible);  // "No Best Solution", -99999 or "infeasible"
    EXPECT_NE(ps[0].question.find("bakery"), std::string::npos);
    EXPECT_EQ(ps[0].rule.name, format_by_name(set).rule.name);
  }
}

TEST(OrFormats, DetectionAndForcing) {
  EXPECT_EQ(format_from_name("MAMO_ComplexLP_fixed.jsonl"), "mamo_complexlp");
  EXPECT_EQ(format_from_name("IndustryOR_fixedV2"), "industryor");
  EXPECT_EQ(format_from_name("test.jsonl"), "");
  EXPECT_EQ(detect_format("auto", "x/test.jsonl", nlohmann::json{{"en_question", "q"}}).name, "orlm");
  EXPECT_EQ(detect_format("", "x/test.jsonl", nlohmann::json{{"question", "q"}}).name, "trex");
  EXPECT_EQ(detect_format("optibench", "x/NL4OPT.jsonl", nlohmann::json{}).name, "optibench");
  EXPECT_THROW(format_by_name("nosuchset"), trex::UserError);
  // --format overrides the file name: NL4OPT's file judged with the optibench rule.
  EvalOptions o;
  o.format = "optibench";
  EXPECT_EQ(load_problems(data("NL4OPT_sample.jsonl"), o)[0].rule.name, "abs1e-4");
}

TEST(OrFormats, MixedFileCountsEachSet) {
  const std::vector<Problem> ps = load_problems(data("mixed_sets.jsonl"), EvalOptions{});
  ASSERT_EQ(ps.size(), 3u);
  EXPECT_EQ(ps[0].category, "nl4opt");
  EXPECT_EQ(ps[1].category, "optmath");
  EXPECT_EQ(ps[2].category, "industryor");
  EXPECT_EQ(ps[0].id, "NL4OPT_0000");
  PredictionsSource src(data("predictions_lp.jsonl"));
  EvalSummary s = evaluate(ps, src, EvalOptions{}, nullptr);
  EXPECT_EQ(s.all.strict, 3);
  EXPECT_EQ(s.per_category.size(), 3u);
  EXPECT_EQ(s.rules["nl4opt"], "orlm");
  EXPECT_EQ(s.rules["optmath"], "optmath");
}

TEST(OrFormats, AnswerRules) {
  const MatchRule orlm = format_by_name("industryor").rule, optmath = format_by_name("optmath").rule,
                  optibench = format_by_name("optibench").rule, complexor = format_by_name("complexor").rule,
                  trex = MatchRule{};
  // ORLM lenient: both rounded to integers, then 5% relative (inclusive); strict: 1e-6 relative.
  EXPECT_TRUE(rule_match(orlm, false, 105.4, 100));   // round: 105, 5%
  EXPECT_FALSE(rule_match(trex, false, 105.4, 100));  // trex: 5.4% > 5%
  EXPECT_FALSE(rule_match(orlm, false, 105.6, 100));  // round: 106
  EXPECT_TRUE(rule_match(orlm, false, 0.4, 0));       // rounds to 0
  EXPECT_FALSE(rule_match(orlm, true, 100.001, 100));
  EXPECT_TRUE(rule_match(orlm, true, 100.00005, 100));
  EXPECT_TRUE(rule_match(orlm, true, 1e6 + 0.5, 1e6));  // relative 1e-6 of a large optimum
  EXPECT_FALSE(rule_match(trex, true, 1e6 + 1.5, 1e6));
  // OptMATH's own rule (eval/executor.py) is ORLM's: rounded, then 5% relative, 0.05 at 0.
  for (const auto& [p, t] : {std::pair{105.4, 100.0}, {105.6, 100.0}, {0.4, 0.0}, {0.6, 0.0}, {-95.4, -100.0}})
    EXPECT_EQ(rule_match(optmath, false, p, t), rule_match(orlm, false, p, t)) << p << " vs " << t;
  // OptiBench (ReSocratic's eval scripts): strict |p - t| < 1e-4 absolute, at any magnitude.
  EXPECT_TRUE(rule_match(optibench, true, 3600.00009, 3600));
  EXPECT_FALSE(rule_match(optibench, true, 3600.0001, 3600));   // not < 1e-4
  EXPECT_FALSE(rule_match(optibench, true, 1e6 + 0.5, 1e6));    // relative 5e-7, absolute 0.5
  EXPECT_TRUE(rule_match(optibench, true, 0.00005, 0));
  EXPECT_TRUE(rule_match(optibench, false, 104.9, 100));       // lenient: trex's relative 5%
  EXPECT_FALSE(rule_match(optibench, false, 0.4, 0));
  // ComplexOR (Chain-of-Experts' test_generated_code.py): output == expected, no tolerance.
  EXPECT_TRUE(rule_match(complexor, true, 10, 10));
  EXPECT_FALSE(rule_match(complexor, true, 10.000000001, 10));
  EXPECT_FALSE(rule_match(complexor, true, 1e-12, 0));
  EXPECT_TRUE(rule_match(complexor, false, 10.4, 10));
}

TEST(OrFormats, ClearErrors) {
  const fs::path dir = fs::temp_directory_path() / "trex_or_formats_test";
  fs::create_directories(dir);
  std::ofstream(dir / "broken.json") << "[{\"en_question\": \"q\", ";
  EXPECT_THROW(load_problems((dir / "broken.json").string(), EvalOptions{}), trex::UserError);
  std::ofstream(dir / "noq.json") << "[{\"text\": \"q\", \"answer\": 3}]";
  try {
    load_problems((dir / "noq.json").string(), EvalOptions{});
    ADD_FAILURE() << "no error";
  } catch (const trex::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("record 1"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}
