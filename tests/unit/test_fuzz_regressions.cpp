// Regression tests for bugs found by the fuzz targets in fuzz/ (issue 9; RELIABILITY.md lists
// each finding). Each test failed (or crashed) before its fix. Inputs are small and built here;
// the original crashing files are under fuzz/regressions/.
#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include <cstdio>
#include <fstream>

#include "core/error.h"
#include "model/config.h"
#include "train/data.h"
#include "train/run_config.h"
#include "io/tokenizer.h"
#include "io/tokenizer_text.h"
#include "or/lp_parser.h"
#include "or/lp_writer.h"
#include "or/solver.h"

using namespace trex;
using json = nlohmann::json;

namespace {

// A small valid byte-level BPE tokenizer.json: [CLS] [SEP], the 256 byte characters, one merge.
json small_tokenizer() {
  json vocab = json::object();
  vocab["[CLS]"] = 0;
  vocab["[SEP]"] = 1;
  int id = 2;
  for (int b = 0; b < 256; ++b) vocab[io::tok::to_byte_level(std::string(1, (char)b))] = id++;
  vocab["he"] = id++;
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"post_processor", {{"type", "BertProcessing"}, {"sep", {"[SEP]", 1}}, {"cls", {"[CLS]", 0}}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"h e"}}}}};
}

std::string tokenizer_error(const std::string& text) {
  try {
    io::Tokenizer::from_json_string(text, "fuzz-regression.json");
  } catch (const UserError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected trex::UserError, got " << e.what();
    return "";
  }
  ADD_FAILURE() << "loaded; expected a UserError";
  return "";
}

}  // namespace

TEST(FuzzRegressions, TokenizerBaseLoads) {
  io::Tokenizer t = io::Tokenizer::from_json_string(small_tokenizer().dump(), "ok.json");
  EXPECT_EQ(t.encode("hello", true).front(), 0);
}

// fuzz_tokenizer_json: a vocab id of 2^31 - 1 sized the id -> token table (16 GB) and the decode
// tables (64 GB) from one number of the file: std::bad_alloc or the OOM killer instead of a
// message. Ids are now bounded by the file's size (floor 2^20); 2^20 is past it for a small file
// (and cheap enough to have loaded before the fix).
TEST(FuzzRegressions, TokenizerVocabIdBoundedByFileSize) {
  json j = small_tokenizer();
  j["model"]["vocab"]["he"] = 1 << 20;
  const std::string m = tokenizer_error(j.dump());
  EXPECT_NE(m.find("model.vocab[\"he\"]"), std::string::npos) << m;
  EXPECT_NE(m.find("out of range"), std::string::npos) << m;
  // Just below the bound still loads (a sparse id in a small file).
  j["model"]["vocab"]["he"] = (1 << 20) - 1;
  EXPECT_EQ(io::Tokenizer::from_json_string(j.dump(), "sparse.json").vocab_size(), 1 << 20);
}

TEST(FuzzRegressions, TokenizerPostProcessorIdBounded) {
  json j = small_tokenizer();
  j["post_processor"]["cls"] = {"[CLS]", 1 << 20};
  const std::string m = tokenizer_error(j.dump());
  EXPECT_NE(m.find("post_processor.cls[1]"), std::string::npos) << m;
  EXPECT_NE(m.find("out of range"), std::string::npos) << m;
}

// A number outside double range makes nlohmann::json::parse throw json::out_of_range (406),
// which the loader did not catch (it caught json::parse_error only).
TEST(FuzzRegressions, TokenizerNumberOverflowIsUserError) {
  std::string text = small_tokenizer().dump();
  text.replace(text.find("\"version\":\"1.0\""), 15, "\"version\":1e999");
  const std::string m = tokenizer_error(text);
  EXPECT_NE(m.find("not valid JSON"), std::string::npos) << m;
  EXPECT_NE(m.find("1e999"), std::string::npos) << m;
}

// Nested Sequence post-processors (and normalizers) were read recursively with a growing path
// string per level: a few thousand levels overflowed the stack. JSON deeper than 64 levels is
// now refused before parsing; 100 levels used to load.
TEST(FuzzRegressions, TokenizerDeepNestingRefused) {
  json post = {{"type", "ByteLevel"}};
  for (int i = 0; i < 100; ++i) post = {{"type", "Sequence"}, {"processors", json::array({post})}};
  json j = small_tokenizer();
  j["post_processor"] = post;
  const std::string m = tokenizer_error(j.dump());
  EXPECT_NE(m.find("nested deeper than 64"), std::string::npos) << m;
  json norm = nullptr;
  for (int i = 0; i < 100; ++i) norm = {{"type", "Sequence"}, {"normalizers", norm.is_null() ? json::array() : json::array({norm})}};
  j = small_tokenizer();
  j["normalizer"] = norm;
  EXPECT_NE(tokenizer_error(j.dump()).find("nested deeper"), std::string::npos);
}

// fuzz_lp: an infinite constant inside an expression ("x -infinity + y") became the row bounds
// lo = hi = +1e30; CLP then failed an assertion in ClpNonLinearCost::checkInfeasibilities and
// aborted the whole process (the OR judge solves model-written LP text). The parser now rejects
// it with the line; infinity stays allowed in bounds and right-hand sides.
TEST(FuzzRegressions, LpInfiniteConstantInExpression) {
  const std::string crash = "Minimize\n cost: x - y + 10\nSubject To\n -5 <= x -infinity+ y <= 5\n r2: x - y >= -8\n"
                            "Bounds\n x free\n -3 <= y <= 2\nEnd\n";
  orx::LpParseResult p = orx::parse_lp(crash);
  ASSERT_FALSE(p.ok);
  EXPECT_EQ(p.line, 4);
  EXPECT_NE(p.error.find("infinite constant 'infinity'"), std::string::npos) << p.error;
  EXPECT_FALSE(orx::parse_lp("Minimize\n obj: x + inf\nEnd\n").ok);
  EXPECT_FALSE(orx::parse_lp("Minimize\n obj: x\nSubject To\n c: x + 1e30 <= 4\nEnd\n").ok);
  // inf - inf used to cancel to 0 (or NaN for 1e999 - 1e999).
  EXPECT_FALSE(orx::parse_lp("Minimize\n obj: x\nSubject To\n c: x + 1e999 - 1e999 <= 4\nEnd\n").ok);
  // Still accepted: infinite right-hand sides, bounds and range ends.
  orx::LpParseResult ok = orx::parse_lp("Minimize\n obj: x\nSubject To\n r: -inf <= x + y <= 5\n c: x <= inf\n"
                                        "Bounds\n -inf <= y <= 1e30\nEnd\n");
  ASSERT_TRUE(ok.ok) << ok.error;
  EXPECT_EQ(ok.model.rows[0].range_lo, -orx::kLpInf);
  auto solver = orx::make_cbc_solver();
  orx::SolveResult r = solver->solve_lp_text(crash, 5.0);
  EXPECT_EQ(r.status, orx::SolveResult::ParseError);
}

// fuzz_lp: a variable named like a keyword of the format ("sos1", "bin", "End", "free", "inf")
// was written by write_lp as is, and the parser read it back as a section keyword or a number
// (write_lp's output must parse). lp_name now suffixes such names.
TEST(FuzzRegressions, LpWriterEscapesKeywordNames) {
  for (const char* k : {"sos1", "bin", "End", "free", "inf", "st", "Max", "general", "bounds"}) {
    const std::string n = orx::lp_name(k);
    EXPECT_NE(n, k);
    orx::LpModel m;
    const int x = m.add_var(n, 1, 5, true);  // in Bounds and General, first on its line
    const int y = m.add_var("y");
    m.obj = {{x, 1}, {y, 2}};
    m.add_row(orx::lp_name(std::string(k) + "_row"), {{x, 1}}, orx::RowSense::LE, 4);
    m.add_row("r2", {{x, 1}, {y, 1}}, orx::RowSense::GE, 1);
    const std::string text = orx::write_lp(m);
    orx::LpParseResult p = orx::parse_lp(text);
    ASSERT_TRUE(p.ok) << k << ": line " << p.line << ": " << p.error << "\n" << text;
    ASSERT_EQ(p.model.vars.size(), 2u) << text;
    EXPECT_EQ(p.model.vars[p.model.find(n)].ub, 5) << text;
    EXPECT_TRUE(p.model.vars[p.model.find(n)].integer) << text;
  }
}

// A row or bound that must be >= +inf (or <= -inf) reached CLP with a +DBL_MAX lower bound, the
// same assertion. The solver now settles it as infeasible before calling CLP.
TEST(FuzzRegressions, SolverInfiniteBoundOnWrongSideIsInfeasible) {
  auto solver = orx::make_cbc_solver();
  for (const char* lp : {"Minimize\n obj: x\nSubject To\n c: x + y >= inf\nEnd\n",
                         "Maximize\n obj: x\nSubject To\n c: x - y <= -infinity\nEnd\n",
                         "Minimize\n obj: x\nSubject To\n r: inf <= x + y <= inf\nEnd\n",
                         "Minimize\n obj: x\nSubject To\n c: x <= 3\nBounds\n x >= inf\nEnd\n",
                         "Minimize\n obj: x\nSubject To\n c: x <= 3\nBounds\n x <= -inf\nEnd\n"}) {
    orx::SolveResult r = solver->solve_lp_text(lp, 5.0);
    EXPECT_EQ(r.status, orx::SolveResult::Infeasible) << lp << "\n" << r.message;
    EXPECT_NE(r.message.find("infinity"), std::string::npos) << r.message;
  }
}

// fuzz_mps: CoinMpsIO copies each field into a 160-byte buffer unchecked; a 290-byte name
// corrupted the heap and crashed later in ~CoinMpsCardReader. trex now refuses long fields and
// lines (with the line number) before calling CoinMpsIO.
TEST(FuzzRegressions, MpsLongFieldRefusedBeforeCoinMpsIO) {
  auto solver = orx::make_cbc_solver();
  const std::string head = "NAME          T\nROWS\n N  obj\n L  c1\nCOLUMNS\n";
  const std::string tail = "RHS\n    RHS       c1        4.0\nENDATA\n";
  auto column = [](const std::string& name) { return "    " + name + std::string(name.size() < 10 ? 10 - name.size() : 1, ' ') + "obj       -1.0         c1        1.0"; };
  orx::SolveResult r = solver->solve_mps_text(head + column(std::string(300, 'x')) + "\n" + tail, 5.0);
  EXPECT_EQ(r.status, orx::SolveResult::ParseError);
  EXPECT_EQ(r.line, 6);
  EXPECT_NE(r.message.find("field of 300 characters"), std::string::npos) << r.message;
  r = solver->solve_mps_text(head + column("x") + std::string(2000, ' ') + "\n" + tail, 5.0);
  EXPECT_EQ(r.status, orx::SolveResult::ParseError);
  EXPECT_NE(r.message.find("line longer than"), std::string::npos) << r.message;
  // The same model with a normal name solves: min -x s.t. x <= 4.
  r = solver->solve_mps_text(head + column("x") + "\n" + tail, 5.0);
  EXPECT_EQ(r.status, orx::SolveResult::Optimal) << r.message;
  EXPECT_DOUBLE_EQ(r.objective, -4.0);
}

// fuzz_mps: CoinMpsIO dereferences NULL in CoinMpsCardReader::nextField on a COLUMNS line with a
// stray 'MARKER' (fuzz/regressions/mps_coinmpsio_null_deref.mps): SIGSEGV of the whole process.
// The reader now runs in a forked child; its crash becomes a ParseError.
TEST(FuzzRegressions, MpsReaderCrashIsParseError) {
  auto solver = orx::make_cbc_solver();
  const std::string text =
      "NAME          BROKEN\nROWS\n N  obj\n L  c0\nCOLUMNS\n"
      "    x         obj      'INTORG' 1.0          c1     %  1.0\n"
      "    x         nosuchro'MARKER'S\n    RHS       c1        4.0\nENDATA\n";
  orx::SolveResult r = solver->solve_mps_text(text, 5.0);
  EXPECT_EQ(r.status, orx::SolveResult::ParseError) << r.message;
  EXPECT_FALSE(r.message.empty());
  // The reader still works afterwards (and reports ordinary errors with their line).
  r = solver->solve_mps_text("NAME T\nROWS\n N  obj\nCOLUMNS\n    x  obj  1.0\nRHS\nBOUNDS\n UP BND x 2.0\n XX BND x\nENDATA\n", 5.0);
  EXPECT_EQ(r.status, orx::SolveResult::ParseError) << r.message;
}


// F1: a number outside double range (1e999) is json::out_of_range, not json::parse_error; every
// reader of outside JSON must turn it into its usual rejection.
TEST(FuzzRegressions, JsonNumberOverflowIsUserError) {
  const std::string path = ::testing::TempDir() + "trex_f1_config.json";
  {
    std::ofstream f(path);
    f << "{\"model_type\": \"deepseek_v3\", \"vocab_size\": 1e999}";
  }
  try {
    model::load_config_json(path);
    ADD_FAILURE() << "loaded";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos) << e.what();
  }
  std::remove(path.c_str());

  // One such SFT line is counted as malformed, not an exception out of the data load.
  train::DataStats st;
  std::vector<train::Message> msgs;
  EXPECT_FALSE(train::parse_sft_line(
      R"({"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}],"x":1e999})", "d.jsonl:1",
      &msgs, st));
  EXPECT_EQ(st.skipped_malformed, 1);

  // --set optim.lr=1e999: the value is not a number (it is kept as the word "1e999").
  json run = {{"model", {{"model_type", "deepseek_v3"}}}};
  EXPECT_THROW(train::parse_run_config(run, "run.toml", {"optim.lr=1e999"}), UserError);
}

// F2: a value nested 100,000 deep in config.json; quoting it in the message recursed that deep.
TEST(FuzzRegressions, ConfigDeepNestingNamesTheType) {
  std::string deep = "{\"model_type\": \"deepseek_v3\", \"vocab_size\": ";
  deep += std::string(100000, '[') + std::string(100000, ']') + "}";
  const json j = json::parse(deep);
  try {
    model::parse_config(j, "config.json");
    ADD_FAILURE() << "parsed";
  } catch (const UserError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("'vocab_size' must be an integer, got an array"), std::string::npos) << m;
  }
}

// F3: an integer field given as a float outside int64 range was cast (undefined behaviour).
TEST(FuzzRegressions, ConfigFloatOutsideInt64IsUserError) {
  for (const char* v : {"1e19", "-1e19", "4.8e82", "2.5"}) {
    const json j = json::parse(std::string("{\"model_type\": \"deepseek_v3\", \"vocab_size\": ") + v + "}");
    try {
      model::parse_config(j, "config.json");
      ADD_FAILURE() << v << " parsed";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("'vocab_size' must be an integer"), std::string::npos) << e.what();
    }
  }
}
