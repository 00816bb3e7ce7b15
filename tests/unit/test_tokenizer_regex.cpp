// Pre-tokenizer regex semantics: Oniguruma (what PyPI tokenizers uses) emulated on PCRE2. Each
// expectation below was observed with PyPI tokenizers 0.23 (pre_tokenizers.Split(Regex(p),
// "isolated").pre_tokenize_str); the corpus tests cover the rest.
#include <gtest/gtest.h>

#include <stdexcept>

#include "core/error.h"
#include "io/tokenizer_pretok.h"
#include "io/tokenizer_regex.h"

using namespace trex;
using namespace trex::io::tok;

namespace {

std::vector<std::string> pieces(const std::string& regex, const std::string& text, const std::string& behavior = "Isolated") {
  nlohmann::json j = {{"type", "Sequence"},
                      {"pretokenizers",
                       {{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", behavior}, {"invert", false}},
                        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  PreTokenizer pt = PreTokenizer::from_json(j, "test");
  PretokScratch s;
  std::vector<std::string_view> out;
  pt.run(text, s, out);
  return {out.begin(), out.end()};
}

using V = std::vector<std::string>;

}  // namespace

TEST(TokenizerRegex, EmptyMatchesStepOneCharacterLikeOnig) {
  EXPECT_EQ(pieces("", "abc"), (V{"a", "b", "c"}));
  EXPECT_EQ(pieces("x*", "abxxc"), (V{"a", "b", "xx", "c"}));
  EXPECT_EQ(pieces("\\b", "ab cd"), (V{"ab", " ", "cd"}));
}

TEST(TokenizerRegex, AnchorsAreLineAnchorsAndDotStopsAtNewline) {
  EXPECT_EQ(pieces("\\s+$", "a \nb  \nc  "), (V{"a", " ", "\nb", "  ", "\nc", "  "}));
  EXPECT_EQ(pieces("^\\w", "ab\ncd"), (V{"a", "b\n", "c", "d"}));
  EXPECT_EQ(pieces("a.b", "a\nb a b"), (V{"a\nb ", "a b"}));
}

TEST(TokenizerRegex, OnigCharacterClasses) {
  // \s has U+0085, not U+180E / U+200B / U+FEFF / U+001C.
  EXPECT_EQ(pieces("\\s+", "a\xC2\x85" "b"), (V{"a", "\xC2\x85", "b"}));
  EXPECT_EQ(pieces("\\s+", "a\xE1\xA0\x8E" "b"), (V{"a\xE1\xA0\x8E" "b"}));
  EXPECT_EQ(pieces("\\s+", "a\x1c" "b"), (V{"a\x1c" "b"}));
  // \w takes marks, Pc, superscript two and letter numbers; \d only Nd; \h is a hex digit.
  EXPECT_EQ(pieces("\\w+", "a\u0301b_c\u203fd\u00b2e\u2160f"), (V{"a\u0301b_c\u203fd\u00b2e\u2160f"}));
  EXPECT_EQ(pieces("\\d+", "1\u0663\u00b2\u2160"), (V{"1\u0663", "\u00b2\u2160"}));
  EXPECT_EQ(pieces("\\h+", "xyz09af "), (V{"xyz", "09af", " "}));
  // U+1FA88 (Unicode 15.0) is a symbol for Oniguruma; PCRE2 10.42 alone would call it unassigned.
  EXPECT_EQ(pieces("\\p{S}+", "a\U0001FA88b"), (V{"a", "\U0001FA88", "b"}));
  EXPECT_EQ(pieces("[^\\p{L}\\p{S}]+", "1\U0001FA88\U00031350"), (V{"1", "\U0001FA88\U00031350"}));
  // Long category names, as Oniguruma accepts them.
  EXPECT_EQ(pieces("\\p{Letter}+", "ab12"), (V{"ab", "12"}));
}

TEST(TokenizerRegex, SplitBehaviours) {
  EXPECT_EQ(pieces("-", "a-b--c", "Removed"), (V{"a", "b", "c"}));
  EXPECT_EQ(pieces("-", "a-b--c", "MergedWithPrevious"), (V{"a-", "b-", "-", "c"}));
  EXPECT_EQ(pieces("-", "a-b--c", "MergedWithNext"), (V{"a", "-b", "-", "-c"}));
  EXPECT_EQ(pieces("-", "a-b--c", "Contiguous"), (V{"a", "-", "b", "--", "c"}));
}

TEST(TokenizerRegex, TranslationRejectsWhatPcre2CannotDo) {
  EXPECT_THROW(translate_onig("[a[b]]"), std::invalid_argument);
  EXPECT_THROW(translate_onig("[a-z&&[^c]]"), std::invalid_argument);
  EXPECT_THROW(translate_onig("[\\S]"), std::invalid_argument);
  EXPECT_NO_THROW(translate_onig("[[:alpha:]]"));
  EXPECT_EQ(translate_onig("(?m:a.b)"), "(?s:a.b)");
  EXPECT_EQ(translate_onig("\\h"), "[0-9a-fA-F]");
  EXPECT_THROW(PreRegex("(unclosed", false), std::invalid_argument);
  EXPECT_NO_THROW(PreRegex("(unclosed", true));  // a "String" pattern is literal
}

TEST(TokenizerRegex, DeepSeekV3Pieces) {
  // The three DeepSeek-V3 Splits on a mixed line (expected pieces from PyPI tokenizers).
  PreTokenizer pt = PreTokenizer::from_json(PreTokenizer::deepseek_v3_json(), "test");
  PretokScratch s;
  std::vector<std::string_view> out;
  pt.run("Hello, 世界! 12345 #include <x>\n\n\tfoo", s, out);
  EXPECT_EQ(V(out.begin(), out.end()),
            (V{"Hello", ",", " ", "世界", "!", " ", "123", "45", " #", "include", " <", "x", ">\n\n", "\tfoo"}));
}
