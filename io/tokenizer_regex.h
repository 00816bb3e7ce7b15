// Pre-tokenizer regexes. tokenizer.json patterns are Oniguruma (Ruby syntax) regexes, which is
// what PyPI `tokenizers` compiles them with; trex compiles them with PCRE2 (UTF + UCP, JIT when
// available) after translating the few constructs whose meaning differs (see translate_onig).
// Matches are enumerated exactly like the onig crate's find_iter that `tokenizers` uses.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

struct pcre2_real_code_8;
struct pcre2_real_match_data_8;

namespace trex::io::tok {

// Oniguruma (Ruby syntax, UTF-8, Unicode classes) -> equivalent PCRE2 pattern:
//   \p{X} \P{X} \p{^X} -> X by its short name, plus the code points Oniguruma's Unicode 16.0
//                         tables add to general category X (PCRE2 10.42 has Unicode 14.0)
//   \s \S   -> Oniguruma's whitespace set (it includes U+0085, which PCRE2's \s does not)
//   \w \W   -> Oniguruma's word set (L, M, Nd, Pc, Nl, circled letters, Latin-1 digits/fractions)
//   \d \D   -> \p{Nd} with the newer digits;  \b \B -> lookarounds on Oniguruma's \w
//   \h \H   -> hex digit (PCRE2 reads \h as horizontal space)
//   (?m)    -> (?s) (Ruby's m is dot-all); ^ and $ are line anchors in Ruby: compiled MULTILINE.
// Throws std::invalid_argument for constructs with no PCRE2 equivalent (nested classes,
// class intersection &&, \S \W \H inside a class). Not adjusted: script properties (\p{Han})
// and case folding use PCRE2's Unicode 14.0 data; \P{X} inside a class lacks the newer code points.
std::string translate_onig(std::string_view pattern);

// Per-thread match state (one per encode call or per worker).
class MatchData {
 public:
  MatchData();
  ~MatchData();
  MatchData(const MatchData&) = delete;
  MatchData& operator=(const MatchData&) = delete;
  pcre2_real_match_data_8* get() const { return md_; }

 private:
  pcre2_real_match_data_8* md_;
};

struct Span {
  uint32_t begin, end;  // byte offsets
};

class PreRegex {
 public:
  // pattern: a tokenizer.json "Regex" (Oniguruma syntax) or, with literal = true, a "String".
  // Throws std::invalid_argument (with PCRE2's message and offset) if it does not compile.
  PreRegex(std::string_view pattern, bool literal);
  ~PreRegex();
  PreRegex(PreRegex&& o) noexcept;
  PreRegex& operator=(PreRegex&& o) noexcept;
  PreRegex(const PreRegex&) = delete;
  PreRegex& operator=(const PreRegex&) = delete;

  // Appends to `out` the matches in s (valid UTF-8) in the order onig's find_iter yields them:
  // leftmost-first; an empty match right at the end of the previous match is skipped by one
  // character.
  void find_iter(std::string_view s, MatchData& md, std::vector<Span>& out) const;
  const std::string& source() const { return source_; }

 private:
  int match(std::string_view s, size_t start, MatchData& md) const;
  pcre2_real_code_8* code_ = nullptr;
  bool jit_ = false;
  std::string source_;
};

}  // namespace trex::io::tok
