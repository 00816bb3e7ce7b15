// `trex tokenizer train` (io/bpe_train.h): deterministic (same file for 1 and 4 threads, and the
// committed tests/data/tokenizer/trex_trained.json reproduced byte for byte from the corpus), the
// result loads in trex and round-trips; PyPI parity of the trained file is in test_tokenizer.cpp.
#include "io/bpe_train.h"

#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/tokenizer.h"
#include "io/tokenizer_text.h"
#include "tests/unit/test_tokenizer_fixtures.h"

namespace fs = std::filesystem;
using namespace trex;
using namespace trex::io;
using namespace trex::test_tok;

namespace {

using test::TmpDir;

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

const char* kBos = "<｜begin▁of▁sentence｜>";
const char* kEos = "<｜end▁of▁sentence｜>";

}  // namespace

// make_fixtures.py trains trex_trained.json on the corpus records joined by '\n' (one file).
TEST(TokenizerTrain, ReproducesCommittedFixtureWithAnyThreadCount) {
  TmpDir d;
  std::vector<std::string> recs = read_corpus();
  {
    std::ofstream f(d.path / "train.txt", std::ios::binary);
    for (const auto& r : recs) f << r << '\n';
  }
  const std::string want = slurp(fixture("trex_trained.json"));
  ASSERT_FALSE(want.empty());
  BpeTrainOptions o;
  o.vocab_size = 3000;
  o.special_tokens = {kBos, kEos};
  o.bos_token = kBos;
  const int saved = omp_get_max_threads();
  for (int threads : {1, 4}) {
    omp_set_num_threads(threads);
    fs::path out = d.path / ("out" + std::to_string(threads));
    BpeTrainStats s = train_bpe_files({(d.path / "train.txt").string()}, o, out.string());
    EXPECT_EQ(s.vocab, 3000);
    const std::string got = slurp(out / "tokenizer.json");
    size_t at = 0;
    while (at < got.size() && at < want.size() && got[at] == want[at]) ++at;
    EXPECT_TRUE(got == want) << "training with " << threads << " threads differs from trex_trained.json at byte "
                             << at << ": \"" << escape(got.substr(at > 40 ? at - 40 : 0, 120)) << "\" vs \""
                             << escape(want.substr(at > 40 ? at - 40 : 0, 120)) << "\"";
  }
  omp_set_num_threads(saved);
}

TEST(TokenizerTrain, TrainedTokenizerLoadsAndRoundTrips) {
  BpeTrainOptions o;
  o.vocab_size = 400;
  o.special_tokens = {"<s>", "</s>", "<pad>"};
  o.bos_token = "<s>";
  BpeTrainer tr(o);
  std::vector<std::string> texts = {"the quick brown fox jumps over the lazy dog\n", "def f(x):\n    return x + 1\n",
                                    "数据并行与张量并行 12345 🚀🚀", "<s>special tokens are not trained on</s>",
                                    "bad \xff bytes \xe4\xb8 here"};
  for (int rep = 0; rep < 50; ++rep)
    for (const auto& t : texts) tr.add_text(t);
  std::string js = tr.train_json();
  EXPECT_EQ(tr.stats().sequences, 250);
  Tokenizer tok = Tokenizer::from_json_string(js, "trained");
  EXPECT_EQ(tok.token_to_id("<s>"), 0);
  EXPECT_EQ(tok.token_to_id("</s>"), 1);
  EXPECT_EQ(tok.prefix_ids(), std::vector<int32_t>{0});
  EXPECT_LE(tok.vocab_size(), 400);
  EXPECT_GT(tok.num_merges(), 50u);
  // A frequent word becomes one token; special tokens in the text are matched, not merged.
  EXPECT_EQ(tok.encode(" quick", false).size(), 1u);
  std::vector<int32_t> ids = tok.encode("<s>the fox</s>", false);
  EXPECT_EQ(ids.front(), 0);
  EXPECT_EQ(ids.back(), 1);
  for (const auto& t : texts) {
    std::string want = tok::utf8_valid(t) ? t : tok::utf8_lossy(t);
    EXPECT_EQ(tok.decode(tok.encode(t, false)), want);
  }
  // Determinism within one process, independent of the order texts were added in.
  BpeTrainer tr2(o);
  for (int rep = 0; rep < 50; ++rep)
    for (size_t k = texts.size(); k-- > 0;) tr2.add_text(texts[k]);
  EXPECT_EQ(tr2.train_json(), js);
}

TEST(TokenizerTrain, MinFrequencyStopsEarly) {
  BpeTrainOptions o;
  o.vocab_size = 10000;
  o.min_frequency = 3;
  BpeTrainer tr(o);
  tr.add_text("abab abab xyz");  // (a,b) x4, (b,a) x2, (x,y), (y,z) once
  tr.add_text("abab");
  Tokenizer tok = Tokenizer::from_json_string(tr.train_json(), "tiny");
  EXPECT_GE(tok.num_merges(), 1u);
  EXPECT_LT(tok.vocab_size(), 300);
  EXPECT_EQ(tok.encode("xyz", false).size(), 3u);  // never merged (count 1 < 3)
}

TEST(TokenizerTrain, BadOptionsAreUserErrors) {
  BpeTrainOptions o;
  o.vocab_size = 100;
  EXPECT_THROW(BpeTrainer{o}, UserError);  // below 256 byte characters
  o.vocab_size = 1000;
  o.special_tokens = {"<a>", "<a>"};
  EXPECT_THROW(BpeTrainer{o}, UserError);
  o.special_tokens = {"<a>", ""};
  EXPECT_THROW(BpeTrainer{o}, UserError);
  o.special_tokens = {"<a>"};
  o.bos_token = "<b>";
  EXPECT_THROW(BpeTrainer{o}, UserError);
  o.bos_token.clear();
  o.min_frequency = 0;
  EXPECT_THROW(BpeTrainer{o}, UserError);
  o.min_frequency = 2;
  TmpDir d;
  EXPECT_THROW(train_bpe_files({(d.path / "missing.txt").string()}, o, d.path.string()), UserError);
  EXPECT_THROW(train_bpe_files({}, o, d.path.string()), UserError);
}

// An empty training file used to give a tokenizer of bytes only, with no word of warning.
TEST(TokenizerTrain, EmptyFilesAreAUserError) {
  TmpDir d;
  const std::string empty = (d.path / "empty.txt").string(), blank = (d.path / "blank.txt").string();
  std::ofstream(empty).close();
  std::ofstream(blank) << "\n\n";
  BpeTrainOptions o;
  o.vocab_size = 300;
  for (const std::string& f : {empty, blank}) {
    try {
      train_bpe_files({f}, o, (d.path / "out").string());
      ADD_FAILURE() << f << ": no error";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("no text to train on"), std::string::npos) << e.what();
    }
  }
  EXPECT_FALSE(std::filesystem::exists(d.path / "out" / "tokenizer.json"));
}
