// Hugging Face tokenizer.json, byte-level BPE kind (GPT-2, Llama-3, Qwen, DeepSeek-V2/V3/V4):
// load, encode, decode, with ids identical to PyPI `tokenizers` (tested on a 10,000-line corpus,
// tests/unit/test_tokenizer.cpp). What is supported and what is rejected at load is listed in
// docs/TOKENIZER.md; anything else is a UserError naming the file and the field.
//
// Pipeline of encode (as tokenizers' encode(text, add_special_tokens).ids):
//   invalid UTF-8 -> U+FFFD  ->  added tokens split out (non-normalized ones, then normalized
//   ones; leftmost-longest)  ->  pre_tokenizer (Split... + ByteLevel)  ->  BPE per piece
//   ->  post_processor prefix/suffix ids (e.g. DeepSeek's BOS) when add_special_tokens.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/tokenizer_added.h"

namespace trex::io {

// Per-thread scratch for Tokenizer::encode (regex match data, BPE heap, piece lists). Reusing
// one per worker thread avoids a few allocations per call; it is optional.
struct EncodeScratch;
struct EncodeScratchDeleter {
  void operator()(EncodeScratch* p) const;
};
using EncodeScratchPtr = std::unique_ptr<EncodeScratch, EncodeScratchDeleter>;

class Tokenizer {
 public:
  // path: a tokenizer.json file, or a directory containing tokenizer.json.
  static Tokenizer load(const std::string& path);
  // json_text: the file's content; name: how messages refer to it (usually the path).
  static Tokenizer from_json_string(const std::string& json_text, const std::string& name);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Ids of `text`. Bytes that are not valid UTF-8 are first replaced by U+FFFD, one per
  // maximal ill-formed subsequence (what Python's bytes.decode('utf-8', 'replace') gives).
  // add_special_tokens: apply the post_processor's template (DeepSeek: BOS first). Thread-safe.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // Appends to `out`; `scratch` may be null (one is made for the call).
  void encode(std::string_view text, std::vector<int32_t>& out, bool add_special_tokens,
              EncodeScratch* scratch) const;
  EncodeScratchPtr make_scratch() const;

  // Text of `ids` (tokenizers' decode): ids with no token are skipped; with
  // skip_special_tokens, so are tokens whose content is a special added token; byte-level
  // tokens become bytes and the result is made valid UTF-8 (U+FFFD) like from_utf8_lossy.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  int32_t token_to_id(std::string_view token) const;  // added tokens first, then vocab; -1 if none
  std::string id_to_token(int32_t id) const;          // "" if the id has no token
  bool is_special(int32_t id) const;                  // content of a special added token
  // Max id + 1 over the vocab and the added tokens: rows an embedding needs to cover every id.
  int64_t vocab_size() const;
  size_t num_merges() const;
  // Added tokens with the ids tokenizers assigns (normally those of the file; if the file's ids
  // disagree, tokenizers' own assignment wins and a warning is logged, as tokenizers does).
  const std::vector<AddedToken>& added_tokens() const;
  // Ids the post_processor puts before / after the text for one sequence (add_special_tokens).
  const std::vector<int32_t>& prefix_ids() const;
  const std::vector<int32_t>& suffix_ids() const;
  const std::string& name() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace trex::io
