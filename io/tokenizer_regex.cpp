#include "io/tokenizer_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cctype>
#include <stdexcept>

#include "core/error.h"
#include "io/tokenizer_unicode.h"

namespace trex::io::tok {

namespace {

// Oniguruma's Unicode \s: U+0009-000D, 0020, 0085, 00A0, 1680, 2000-200A, 2028, 2029, 202F,
// 205F, 3000 (its documentation, and checked against PyPI tokenizers).
constexpr const char* kSpaceItems =
    "\\x{09}-\\x{0D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";
constexpr const char* kHexItems = "0-9a-fA-F";

[[noreturn]] void bad(std::string_view what, size_t at) {
  throw std::invalid_argument(std::string(what) + " at offset " + std::to_string(at) +
                              " has no PCRE2 equivalent");
}

// Oniguruma accepts general categories by short or long name, case- and separator-insensitively;
// PCRE2 10.42 only by the exact short name. Returns the short name, or "" if `name` is not one.
std::string category_short_name(std::string_view name) {
  std::string k;
  for (char c : name)
    if (c != '_' && c != ' ' && c != '-') k += (char)std::tolower((unsigned char)c);
  static const char* const kNames[][2] = {
      {"l", "L"}, {"letter", "L"}, {"lu", "Lu"}, {"uppercaseletter", "Lu"}, {"ll", "Ll"}, {"lowercaseletter", "Ll"},
      {"lt", "Lt"}, {"titlecaseletter", "Lt"}, {"lm", "Lm"}, {"modifierletter", "Lm"}, {"lo", "Lo"},
      {"otherletter", "Lo"}, {"m", "M"}, {"mark", "M"}, {"combiningmark", "M"}, {"mn", "Mn"},
      {"nonspacingmark", "Mn"}, {"mc", "Mc"}, {"spacingmark", "Mc"}, {"me", "Me"}, {"enclosingmark", "Me"},
      {"n", "N"}, {"number", "N"}, {"nd", "Nd"}, {"decimalnumber", "Nd"}, {"nl", "Nl"}, {"letternumber", "Nl"},
      {"no", "No"}, {"othernumber", "No"}, {"p", "P"}, {"punctuation", "P"}, {"punct", "P"}, {"pc", "Pc"},
      {"connectorpunctuation", "Pc"}, {"pd", "Pd"}, {"dashpunctuation", "Pd"}, {"ps", "Ps"},
      {"openpunctuation", "Ps"}, {"pe", "Pe"}, {"closepunctuation", "Pe"}, {"pi", "Pi"},
      {"initialpunctuation", "Pi"}, {"pf", "Pf"}, {"finalpunctuation", "Pf"}, {"po", "Po"},
      {"otherpunctuation", "Po"}, {"s", "S"}, {"symbol", "S"}, {"sm", "Sm"}, {"mathsymbol", "Sm"}, {"sc", "Sc"},
      {"currencysymbol", "Sc"}, {"sk", "Sk"}, {"modifiersymbol", "Sk"}, {"so", "So"}, {"othersymbol", "So"},
      {"z", "Z"}, {"separator", "Z"}, {"zs", "Zs"}, {"spaceseparator", "Zs"}, {"zl", "Zl"},
      {"lineseparator", "Zl"}, {"zp", "Zp"}, {"paragraphseparator", "Zp"}, {"c", "C"}, {"other", "C"},
      {"cc", "Cc"}, {"control", "Cc"}, {"cf", "Cf"}, {"format", "Cf"}, {"co", "Co"}, {"privateuse", "Co"},
      {"cn", "Cn"}, {"unassigned", "Cn"}};
  for (const auto& e : kNames)
    if (k == e[0]) return e[1];
  return "";
}

}  // namespace

std::string translate_onig(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  const std::string word = onig_word_items();
  const std::string digit = std::string("\\p{Nd}") + onig_category_extras("Nd");
  bool in_class = false;
  size_t i = 0, n = p.size();
  while (i < n) {
    char c = p[i];
    if (c == '\\') {
      if (i + 1 >= n) throw std::invalid_argument("pattern ends with a lone backslash");
      char e = p[i + 1];
      if (e == 'p' || e == 'P') {
        // \p{Name}, \p{^Name}, \P{Name}: general categories get Oniguruma's newer code points.
        size_t close = p.find('}', i);
        if (i + 2 >= n || p[i + 2] != '{' || close == std::string_view::npos) bad("\\p without {name}", i);
        std::string_view name = p.substr(i + 3, close - i - 3);
        bool neg = e == 'P';
        if (!name.empty() && name[0] == '^') neg = !neg, name.remove_prefix(1);
        std::string gc = category_short_name(name);
        std::string prop = "\\p{" + (gc.empty() ? std::string(name) : gc) + "}";
        std::string extras = gc.empty() ? "" : onig_category_extras(gc);
        if (in_class) {
          out += neg ? "\\P{" + prop.substr(3) : prop + extras;  // a negation inside a class stays PCRE2's
        } else {
          out += (neg ? "[^" : "[") + prop + extras + "]";
        }
        i = close + 1;
        continue;
      }
      if ((e == 'b' || e == 'B') && !in_class) {
        // Word boundary on Oniguruma's \w (PCRE2's \b uses its own, narrower \w).
        std::string w = "[" + word + "]";
        out += e == 'b' ? "(?:(?<=" + w + ")(?!" + w + ")|(?<!" + w + ")(?=" + w + "))"
                        : "(?:(?<=" + w + ")(?=" + w + ")|(?<!" + w + ")(?!" + w + "))";
        i += 2;
        continue;
      }
      std::string items = e == 's' || e == 'S' ? kSpaceItems : e == 'w' || e == 'W' ? word
                          : e == 'h' || e == 'H'             ? kHexItems
                          : e == 'd' || (e == 'D' && !in_class) ? digit
                                                             : "";
      bool negated = e == 'S' || e == 'W' || e == 'H' || e == 'D';
      if (!items.empty()) {
        if (in_class) {
          if (negated) bad(std::string("\\") + e + " inside a character class", i);
          out += items;
        } else {
          out += negated ? "[^" : "[";
          out += items;
          out += ']';
        }
      } else {
        out += c;
        out += e;
      }
      i += 2;
      continue;
    }
    if (in_class) {
      if (c == ']') {
        in_class = false;
      } else if (c == '[') {
        if (i + 1 < n && p[i + 1] == ':') {  // POSIX class [:name:]
          size_t close = p.find(":]", i + 2);
          if (close == std::string_view::npos) bad("unterminated POSIX class", i);
          out.append(p.substr(i, close + 2 - i));
          i = close + 2;
          continue;
        }
        bad("a nested character class", i);
      } else if (c == '&' && i + 1 < n && p[i + 1] == '&') {
        bad("character class intersection (&&)", i);
      }
      out += c;
      ++i;
      continue;
    }
    if (c == '[') {
      in_class = true;
      out += c;
      ++i;
      if (i < n && p[i] == '^') out += p[i++];
      if (i < n && p[i] == ']') out += p[i++];  // a leading ] is a literal
      continue;
    }
    if (c == '(' && i + 2 < n && p[i + 1] == '?') {
      // Inline options (?imx-imx) or (?imx-imx:...): Ruby's m is PCRE2's s (dot matches \n).
      size_t j = i + 2;
      while (j < n && (p[j] == 'i' || p[j] == 'm' || p[j] == 'x' || p[j] == '-')) ++j;
      if (j > i + 2 && j < n && (p[j] == ':' || p[j] == ')')) {
        out += "(?";
        for (size_t k = i + 2; k < j; ++k) out += p[k] == 'm' ? 's' : p[k];
        i = j;
        continue;
      }
    }
    out += c;
    ++i;
  }
  if (in_class) throw std::invalid_argument("unterminated character class");
  return out;
}

MatchData::MatchData() : md_(pcre2_match_data_create(1, nullptr)) {
  TREX_CHECK(md_, "out of memory creating PCRE2 match data");
}
MatchData::~MatchData() { pcre2_match_data_free(md_); }

PreRegex::PreRegex(std::string_view pattern, bool literal) : source_(pattern) {
  std::string pat = literal ? std::string(pattern) : translate_onig(pattern);
  pcre2_compile_context* cc = pcre2_compile_context_create(nullptr);
  pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
  uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP | PCRE2_MULTILINE);
  int err = 0;
  PCRE2_SIZE off = 0;
  code_ = pcre2_compile((PCRE2_SPTR)pat.data(), pat.size(), opts, &err, &off, cc);
  pcre2_compile_context_free(cc);
  if (!code_) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof buf);
    throw std::invalid_argument(std::string("PCRE2 cannot compile it (") + (const char*)buf + " at offset " +
                                std::to_string(off) + " of the translated pattern)");
  }
  jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
}

PreRegex::~PreRegex() {
  if (code_) pcre2_code_free(code_);
}
PreRegex::PreRegex(PreRegex&& o) noexcept : code_(o.code_), jit_(o.jit_), source_(std::move(o.source_)) {
  o.code_ = nullptr;
}
PreRegex& PreRegex::operator=(PreRegex&& o) noexcept {
  if (this != &o) {
    if (code_) pcre2_code_free(code_);
    code_ = o.code_;
    jit_ = o.jit_;
    source_ = std::move(o.source_);
    o.code_ = nullptr;
  }
  return *this;
}

int PreRegex::match(std::string_view s, size_t start, MatchData& md) const {
  int rc = pcre2_match(code_, (PCRE2_SPTR)s.data(), s.size(), start, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT)  // very long input for the JIT stack: use the interpreter
    rc = pcre2_match(code_, (PCRE2_SPTR)s.data(), s.size(), start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md.get(),
                     nullptr);
  if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(rc, buf, sizeof buf);
    TREX_FAIL("PCRE2 match failed for pre-tokenizer pattern '", source_, "': ", (const char*)buf);
  }
  return rc;
}

void PreRegex::find_iter(std::string_view s, MatchData& md, std::vector<Span>& out) const {
  size_t last_end = 0, n = s.size();
  bool have_last = false;
  size_t last_match_end = 0;
  PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
  while (last_end <= n) {
    if (match(s, last_end, md) == PCRE2_ERROR_NOMATCH) break;
    size_t b = ov[0], e = ov[1];
    if (b == e && have_last && last_match_end == e) {
      // onig's find_iter: no empty match right after the previous match; step one character.
      if (last_end < n) {
        unsigned char c = (unsigned char)s[last_end];
        last_end += c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
      } else {
        last_end += 1;
      }
      continue;
    }
    last_end = e;
    last_match_end = e;
    have_last = true;
    out.push_back({(uint32_t)b, (uint32_t)e});
  }
}

}  // namespace trex::io::tok
