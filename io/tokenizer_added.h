// Added tokens of a tokenizer.json ("added_tokens"): their ids as PyPI tokenizers assigns them,
// and the matcher that splits them out of the text before pre-tokenization (leftmost-longest,
// like tokenizers' aho-corasick MatchKind::LeftmostLongest), honouring single_word, lstrip and
// rstrip the way tokenizers' AddedVocabulary::find_matches does.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace trex::io {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool single_word = false, lstrip = false, rstrip = false, normalized = true, special = false;
};

namespace tok {

struct AddedSeg {
  uint32_t begin, end;  // byte range of the piece in the sentence
  int32_t id;           // added token id, or -1 for text
};

class AddedMatcher {
 public:
  // Builds the trie over the given tokens (pointers must outlive the matcher's use).
  void build(const std::vector<const AddedToken*>& tokens);
  bool empty() const { return tokens_.empty(); }
  // tokenizers' find_matches on `sentence`: appends the pieces covering it, in order.
  void split(std::string_view sentence, std::vector<AddedSeg>& out) const;

 private:
  // Leftmost-longest match starting at or after pos: true with [*b, *e) and token index.
  bool find(std::string_view s, size_t pos, size_t* b, size_t* e, int32_t* tok) const;
  int32_t child(int32_t node, unsigned char c) const {
    auto it = edges_.find((uint64_t(uint32_t(node)) << 8) | c);
    return it == edges_.end() ? -1 : it->second;
  }
  std::vector<const AddedToken*> tokens_;
  std::unordered_map<uint64_t, int32_t> edges_;  // (node << 8 | byte) -> child node
  std::vector<int32_t> terminal_;                // node -> token index or -1
  bool first_[256] = {};
};

}  // namespace tok
}  // namespace trex::io
