#include "io/tokenizer_added.h"

#include <algorithm>

#include "io/tokenizer_text.h"

namespace trex::io::tok {

void AddedMatcher::build(const std::vector<const AddedToken*>& tokens) {
  tokens_ = tokens;
  edges_.clear();
  terminal_.assign(1, -1);
  std::fill(first_, first_ + 256, false);
  for (size_t t = 0; t < tokens_.size(); ++t) {
    const std::string& c = tokens_[t]->content;
    if (c.empty()) continue;
    first_[(unsigned char)c[0]] = true;
    int32_t node = 0;
    for (unsigned char ch : c) {
      int32_t nx = child(node, ch);
      if (nx < 0) {
        nx = (int32_t)terminal_.size();
        terminal_.push_back(-1);
        edges_.emplace((uint64_t(uint32_t(node)) << 8) | ch, nx);
      }
      node = nx;
    }
    terminal_[node] = (int32_t)t;
  }
}

bool AddedMatcher::find(std::string_view s, size_t pos, size_t* b, size_t* e, int32_t* tok) const {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = pos; i < s.size(); ++i) {
    if (!first_[p[i]]) continue;
    int32_t node = 0, best = -1;
    size_t best_end = 0;
    for (size_t j = i; j < s.size(); ++j) {
      node = child(node, p[j]);
      if (node < 0) break;
      if (terminal_[node] >= 0) best = terminal_[node], best_end = j + 1;
    }
    if (best >= 0) {
      *b = i;
      *e = best_end;
      *tok = best;
      return true;
    }
  }
  return false;
}

namespace {

bool ends_with_word(std::string_view s) { return !s.empty() && is_word_char(utf8_last(s)); }
bool starts_with_word(std::string_view s) {
  if (s.empty()) return false;
  uint32_t cp;
  utf8_next(s, 0, &cp);
  return is_word_char(cp);
}

}  // namespace

void AddedMatcher::split(std::string_view s, std::vector<AddedSeg>& out) const {
  size_t start_offset = 0, pos = 0, mb, me;
  int32_t t;
  while (!tokens_.empty() && find(s, pos, &mb, &me, &t)) {
    pos = me;  // the automaton continues after the raw match, whatever stripping does below
    const AddedToken& tk = *tokens_[t];
    size_t start = mb, stop = me;
    if (tk.single_word) {
      bool start_space = start == 0 || !ends_with_word(s.substr(0, start));
      bool stop_space = stop == s.size() || !starts_with_word(s.substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (tk.lstrip) {
      // Start after the last non-whitespace character before the match (never before start_offset).
      size_t ns = start;
      while (ns > 0) {
        size_t j = ns - 1;
        while (j > 0 && (static_cast<unsigned char>(s[j]) & 0xC0) == 0x80) --j;
        uint32_t cp;
        utf8_next(s, j, &cp);
        if (!is_white_space(cp)) break;
        ns = j;
      }
      start = std::max(ns, start_offset);
    }
    if (tk.rstrip) {
      while (stop < s.size()) {
        uint32_t cp;
        int len = utf8_next(s, stop, &cp);
        if (!is_white_space(cp)) break;
        stop += len;
      }
    }
    if (start > start_offset) out.push_back({(uint32_t)start_offset, (uint32_t)start, -1});
    out.push_back({(uint32_t)start, (uint32_t)stop, tk.id});
    start_offset = stop;
  }
  if (start_offset != s.size()) out.push_back({(uint32_t)start_offset, (uint32_t)s.size(), -1});
}

}  // namespace trex::io::tok
