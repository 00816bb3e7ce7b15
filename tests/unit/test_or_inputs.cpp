// Bad input to the OR commands is named, never silently scored or reported as a number:
// predictions that do not pair with the problems (or/judge.h PredictionsSource::match), shares
// that cannot be met (or/generator.h), an output folder that cannot be made (or/dataset.h), and a
// time limit reached before any incumbent (or/solver.h).
#include <gtest/gtest.h>
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <string>
#include "core/error.h"
#include "or/dataset.h"
#include "or/generator.h"
#include "or/judge.h"
#include "or/solver.h"

namespace fs = std::filesystem;
using namespace trex::orx;

namespace {

// A temporary JSONL file with the given lines, removed by the destructor.
struct TmpFile {
  fs::path p;
  explicit TmpFile(const std::string& name, const std::vector<std::string>& lines) {
    p = fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()) + ".jsonl");
    std::ofstream f(p);
    for (const auto& l : lines) f << l << "\n";
  }
  ~TmpFile() { fs::remove(p); }
};

std::vector<Problem> problems(const std::vector<std::string>& ids) {
  std::vector<Problem> v;
  for (const auto& id : ids) {
    Problem p;
    p.id = id;
    p.question = "q";
    v.push_back(p);
  }
  return v;
}

}  // namespace

TEST(OrInputs, PredictionsPairedByLineOrder) {
  TmpFile two("preds_two", {R"({"output": "a"})", R"({"output": "b"})"});
  PredictionsSource src(two.p.string());
  PredictionsSource::Match m = src.match(problems({"0", "1"}));
  EXPECT_TRUE(m.ok()) << m.str();
  m = src.match(problems({"0", "1", "2"}));  // fewer predictions than problems
  EXPECT_FALSE(m.ok());
  EXPECT_EQ(m.missing, 1u);
  EXPECT_EQ(m.extra, 0u);
  EXPECT_NE(m.str().find("1 problems without a prediction"), std::string::npos) << m.str();
  m = src.match(problems({"0"}));  // more predictions than problems
  EXPECT_EQ(m.extra, 1u);
  EXPECT_EQ(m.missing, 0u);
}

TEST(OrInputs, PredictionsPairedById) {
  TmpFile f("preds_ids", {R"({"id": "p1", "output": "a"})", R"({"id": "p9", "output": "b"})",
                          R"({"id": "p1", "output": "c"})", R"({"output": "no id"})"});
  PredictionsSource src(f.p.string());
  const PredictionsSource::Match m = src.match(problems({"p1", "p2"}));
  EXPECT_TRUE(m.by_id);
  EXPECT_EQ(m.predictions, 4u);
  EXPECT_EQ(m.missing, 1u);        // p2
  EXPECT_EQ(m.extra, 1u);          // p9
  EXPECT_EQ(m.duplicate_ids, 1u);  // p1 twice
  EXPECT_EQ(m.without_id, 1u);
  EXPECT_FALSE(m.ok());
  EXPECT_NE(m.str().find("id p2 has no prediction"), std::string::npos) << m.str();
  EXPECT_NE(m.str().find("id p9 is not in the data"), std::string::npos) << m.str();
}

TEST(OrInputs, SharesThatCannotBeMetAreRefused) {
  GenStats st;
  GenOptions o;
  o.n_train = 1;
  o.infeasible_share = 0.9, o.unbounded_share = 0.9;  // sum 1.8
  try {
    generate(o, st);
    FAIL() << "shares summing to 1.8 were accepted";
  } catch (const trex::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds 1"), std::string::npos) << e.what();
  }
  o.infeasible_share = -0.1, o.unbounded_share = 0;
  EXPECT_THROW(generate(o, st), trex::UserError);
  // A selection whose families cannot be made infeasible cannot give any infeasible share.
  for (const Family& f : all_families())
    if (!f.can_infeasible) {
      o.families = {f.name};
      break;
    }
  ASSERT_FALSE(o.families.empty()) << "every family can be made infeasible: pick another case";
  o.infeasible_share = 0.1, o.unbounded_share = 0;
  EXPECT_THROW(generate(o, st), trex::UserError);
}

TEST(OrInputs, OutputFolderThatCannotBeMadeIsAUserError) {
  GenOptions o;
  o.n_train = 1;
  try {
    write_dataset(o, "/proc/trex_cannot_create_this/x");
    FAIL() << "no error for an output folder under /proc";
  } catch (const trex::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("/proc/trex_cannot_create_this/x"), std::string::npos) << e.what();
  }
}

TEST(OrInputs, TimeLimitWithoutIncumbentIsNotANumber) {
  // An equality knapsack with no integer solution (even coefficients, odd right-hand side) and a
  // tight limit: CBC stops before it has any incumbent (or proves infeasibility).
  LpModel m;
  Terms t;
  for (int j = 0; j < 40; ++j) t.push_back({m.add_var("x" + std::to_string(j), 0, 1, true), (double)(2 * (1000 + 37 * j))});
  m.obj = t;
  m.add_row("eq", t, RowSense::EQ, 2 * 20000 + 1);
  SolveResult r = make_cbc_solver()->solve_model(m, 0.2);
  ASSERT_TRUE(r.status == SolveResult::TimeLimit || r.status == SolveResult::Infeasible) << status_name(r.status);
  EXPECT_FALSE(r.has_incumbent) << "incumbent " << r.incumbent << " reported for a problem with no integer point";
  if (r.status == SolveResult::TimeLimit) {
    EXPECT_NE(r.message.find("no incumbent"), std::string::npos) << r.message;
    EXPECT_EQ(r.message.find("e+"), std::string::npos) << r.message;
  }
}
