#include "io/tokenizer_text.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>

#include "core/error.h"

namespace trex::io::tok {

namespace {

// Length of the well-formed sequence starting at p[0..n), or 0 if it is ill-formed; on 0,
// *bad is the length of the maximal subpart to replace (>= 1). Unicode Table 3-7.
int utf8_seq(const unsigned char* p, size_t n, int* bad) {
  unsigned char c = p[0];
  if (c < 0x80) return 1;
  int len;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) len = 2;
  else if (c == 0xE0) len = 3, lo = 0xA0;
  else if (c >= 0xE1 && c <= 0xEC) len = 3;
  else if (c == 0xED) len = 3, hi = 0x9F;
  else if (c >= 0xEE && c <= 0xEF) len = 3;
  else if (c == 0xF0) len = 4, lo = 0x90;
  else if (c >= 0xF1 && c <= 0xF3) len = 4;
  else if (c == 0xF4) len = 4, hi = 0x8F;
  else {
    *bad = 1;
    return 0;
  }
  // Second byte has the restricted range; the rest are plain continuation bytes.
  for (int k = 1; k < len; ++k) {
    unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if ((size_t)k >= n || p[k] < l || p[k] > h) {
      *bad = k;
      return 0;
    }
  }
  return len;
}

const std::array<uint32_t, 256>& byte_table() {
  static const std::array<uint32_t, 256> t = [] {
    std::array<uint32_t, 256> a{};
    uint32_t n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      a[b] = printable ? (uint32_t)b : 256 + n++;
    }
    return a;
  }();
  return t;
}

const std::array<int16_t, 324>& cp_table() {
  static const std::array<int16_t, 324> t = [] {
    std::array<int16_t, 324> a;
    a.fill(-1);
    for (int b = 0; b < 256; ++b) a[byte_table()[b]] = (int16_t)b;
    return a;
  }();
  return t;
}

}  // namespace

bool utf8_valid(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0, n = s.size();
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      __builtin_memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    int bad, len = utf8_seq(p + i, n - i, &bad);
    if (!len) return false;
    i += len;
  }
  return true;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 16);
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0, n = s.size();
  while (i < n) {
    int bad, len = utf8_seq(p + i, n - i, &bad);
    if (len) {
      out.append(s.data() + i, len);
      i += len;
    } else {
      out.append("\xEF\xBF\xBD");
      i += bad;
    }
  }
  return out;
}

uint32_t utf8_last(std::string_view s) {
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  uint32_t cp;
  utf8_next(s, i, &cp);
  return cp;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back((char)cp);
  } else if (cp < 0x800) {
    out.push_back((char)(0xC0 | (cp >> 6)));
    out.push_back((char)(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back((char)(0xE0 | (cp >> 12)));
    out.push_back((char)(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back((char)(0x80 | (cp & 0x3F)));
  } else {
    out.push_back((char)(0xF0 | (cp >> 18)));
    out.push_back((char)(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back((char)(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back((char)(0x80 | (cp & 0x3F)));
  }
}

uint32_t byte_level_cp(uint8_t b) { return byte_table()[b]; }

int byte_of_cp(uint32_t cp) { return cp < 324 ? cp_table()[cp] : -1; }

std::string to_byte_level(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) utf8_append(out, byte_table()[b]);
  return out;
}

bool from_byte_level(std::string_view s, std::string& out) {
  out.clear();
  if (!utf8_valid(s)) return false;
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    i += utf8_next(s, i, &cp);
    int b = byte_of_cp(cp);
    if (b < 0) return false;
    out.push_back((char)b);
  }
  return true;
}

bool is_white_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

bool is_word_char(uint32_t cp) {
  if (cp < 0x80) return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
  // Rust regex's \w: Alphabetic | Mark | Decimal_Number | Connector_Punctuation | Join_Control.
  // The compiled pattern is immutable after first use and matched with per-call match data.
  struct Re {
    pcre2_code* code = nullptr;
    Re() {
      int err;
      PCRE2_SIZE off;
      const char* pat = "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]";
      code = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
      TREX_CHECK(code, "PCRE2 cannot compile the word-character class");
    }
    ~Re() { pcre2_code_free(code); }
  };
  static const Re re;
  std::string s;
  utf8_append(s, cp);
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> md(pcre2_match_data_create(1, nullptr),
                                                                     pcre2_match_data_free);
  return pcre2_match(re.code, (PCRE2_SPTR)s.data(), s.size(), 0, PCRE2_ANCHORED, md.get(), nullptr) >= 0;
}

}  // namespace trex::io::tok
