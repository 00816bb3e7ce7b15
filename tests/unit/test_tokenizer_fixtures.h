// Readers for tests/data/tokenizer (written by make_fixtures.py): the corpus, PyPI ids and PyPI
// decode cases, gzip-compressed, with unsigned LEB128 varints.
#pragma once
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>
#include "tests/unit/test_util.h"

namespace trex::test_tok {

inline std::filesystem::path fixture_dir() { return test::data_dir("tokenizer", "corpus.bin.gz"); }
inline std::string fixture(const std::string& name) { return (fixture_dir() / name).string(); }

inline std::string read_gz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) {
    ADD_FAILURE() << "cannot open " << path;
    return {};
  }
  std::string out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, (size_t)n);
  gzclose(f);
  return out;
}

struct Reader {
  const std::string& b;
  size_t pos = 0;
  uint64_t v() {
    uint64_t n = 0;
    int shift = 0;
    while (pos < b.size()) {
      uint8_t c = (uint8_t)b[pos++];
      n |= uint64_t(c & 0x7F) << shift;
      shift += 7;
      if (!(c & 0x80)) return n;
    }
    ADD_FAILURE() << "truncated fixture";
    return 0;
  }
  std::string bytes(size_t n) {
    std::string s = b.substr(pos, n);
    pos += n;
    return s;
  }
  bool magic(const char* m) {
    bool ok = b.compare(0, 4, m) == 0;
    pos = 4;
    return ok;
  }
};

inline std::vector<std::string> read_corpus() {
  std::string buf = read_gz(fixture("corpus.bin.gz"));
  Reader r{buf};
  EXPECT_TRUE(r.magic("TRXC"));
  std::vector<std::string> recs(r.v());
  for (auto& s : recs) s = r.bytes(r.v());
  return recs;
}

struct ExpectedIds {
  size_t first = 0;
  std::vector<std::vector<int32_t>> ids;
};
inline ExpectedIds read_ids(const std::string& name) {
  std::string buf = read_gz(fixture(name));
  Reader r{buf};
  EXPECT_TRUE(r.magic("TRXI"));
  ExpectedIds e;
  e.first = r.v();
  e.ids.resize(r.v());
  for (auto& v : e.ids) {
    v.resize(r.v());
    for (auto& id : v) id = (int32_t)r.v();
  }
  return e;
}

struct DecodeCase {
  bool skip_special;
  std::vector<int32_t> ids;
  std::string text;
};
inline std::vector<DecodeCase> read_decode(const std::string& name) {
  std::string buf = read_gz(fixture(name));
  Reader r{buf};
  EXPECT_TRUE(r.magic("TRXD"));
  std::vector<DecodeCase> cases(r.v());
  for (auto& c : cases) {
    c.skip_special = r.b[r.pos++] != 0;
    c.ids.resize(r.v());
    for (auto& id : c.ids) id = (int32_t)r.v();
    c.text = r.bytes(r.v());
  }
  return cases;
}

// Printable form of bytes for failure messages.
inline std::string escape(const std::string& s, size_t max = 300) {
  std::string o;
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    unsigned char c = (unsigned char)s[i];
    if (c == '\n') o += "\\n";
    else if (c == '\r') o += "\\r";
    else if (c == '\t') o += "\\t";
    else if (c < 0x20 || c == 0x7F) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      o += b;
    } else o += (char)c;
  }
  if (s.size() > max) o += "...";
  return o;
}

inline std::string join(const std::vector<int32_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? " " : "") + std::to_string(v[i]);
  return s;
}

}  // namespace trex::test_tok
