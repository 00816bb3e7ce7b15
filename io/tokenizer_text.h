// Text helpers for the byte-level BPE tokenizer: UTF-8 validation and lossy repair (the
// "maximal subpart" rule that Python's errors='replace' and Rust's from_utf8_lossy both use),
// the GPT-2 byte <-> character table of ByteLevel, and the character classes Hugging Face
// `tokenizers` uses outside its regexes (Rust char::is_whitespace, regex \w).
#pragma once
#include <array>
#include <functional>
#include <cstdint>
#include <string>
#include <string_view>

namespace trex::io::tok {

// True if s is well-formed UTF-8 (no overlongs, no surrogates, <= U+10FFFF).
bool utf8_valid(std::string_view s);

// s with every maximal ill-formed subsequence replaced by one U+FFFD (bytes EF BF BD).
// Identical to Python bytes.decode('utf-8', 'replace') and Rust String::from_utf8_lossy.
std::string utf8_lossy(std::string_view s);

// Decodes the code point at s[i] of VALID UTF-8; returns its byte length.
inline int utf8_next(std::string_view s, size_t i, uint32_t* cp) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  if (p[0] < 0x80) {
    *cp = p[0];
    return 1;
  }
  if (p[0] < 0xE0) {
    *cp = (uint32_t(p[0] & 0x1F) << 6) | (p[1] & 0x3F);
    return 2;
  }
  if (p[0] < 0xF0) {
    *cp = (uint32_t(p[0] & 0x0F) << 12) | (uint32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    return 3;
  }
  *cp = (uint32_t(p[0] & 0x07) << 18) | (uint32_t(p[1] & 0x3F) << 12) | (uint32_t(p[2] & 0x3F) << 6) |
        (p[3] & 0x3F);
  return 4;
}

// Code point of the last character of VALID UTF-8 s (s non-empty).
uint32_t utf8_last(std::string_view s);

void utf8_append(std::string& out, uint32_t cp);

// GPT-2 / ByteLevel table: byte b -> code point (printable bytes map to themselves, the rest
// to U+0100 + k). byte_level_cp(b) and its inverse byte_of_cp(cp) (-1 if cp is not in the table).
uint32_t byte_level_cp(uint8_t b);
int byte_of_cp(uint32_t cp);

// Raw bytes -> ByteLevel string (each byte one character).
std::string to_byte_level(std::string_view bytes);
// ByteLevel string -> raw bytes; false (out unspecified) if a character is outside the table.
bool from_byte_level(std::string_view s, std::string& out);

// Rust char::is_whitespace (Unicode White_Space), used by added-token lstrip / rstrip.
bool is_white_space(uint32_t cp);
// Rust regex \w (Unicode word character), used by added-token single_word. Approximated as
// Letter | Mark | Decimal_Number | Letter_Number | Connector_Punctuation | ZWNJ | ZWJ.
bool is_word_char(uint32_t cp);

// Transparent string hashing, so maps keyed by std::string can be searched with string_view.
struct StrHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
struct StrEq {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const { return a == b; }
};

}  // namespace trex::io::tok
