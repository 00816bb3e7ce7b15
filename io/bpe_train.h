// Byte-level BPE trainer (`trex tokenizer train`). Pre-tokenizes like DeepSeek-V3 (the same
// three Split regexes + ByteLevel), starts from the 256 byte characters, and repeatedly merges
// the most frequent adjacent pair (ties: smallest (left id, right id)), weighted by word counts.
// The result is a tokenizer.json that PyPI `tokenizers` loads and encodes identically to trex.
// Deterministic: the same texts and options give a byte-identical file, whatever the threads.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace trex::io {

struct BpeTrainOptions {
  int64_t vocab_size = 32000;   // total ids: special tokens + 256 byte characters + merged tokens
  int64_t min_frequency = 2;    // pairs seen fewer times are never merged (training may stop early)
  std::vector<std::string> special_tokens;  // ids 0.. in this order; split out of training text
  std::string bos_token;        // optional (one of special_tokens): post_processor prepends it
};

struct BpeTrainStats {
  int64_t sequences = 0, words = 0, unique_words = 0, merges = 0, vocab = 0;
  double count_ms = 0, merge_ms = 0;
};

class BpeTrainer {
 public:
  // Throws UserError for inconsistent options (vocab too small, duplicate or empty specials...).
  explicit BpeTrainer(BpeTrainOptions opts);
  ~BpeTrainer();

  // One training sequence (invalid UTF-8 is replaced by U+FFFD first, as encode does).
  void add_text(std::string_view text);
  // Each line of the file, with its '\n', is one sequence; lines are counted in parallel.
  void add_file(const std::string& path);

  // Runs the merges and returns the tokenizer.json text.
  std::string train_json();
  const BpeTrainStats& stats() const { return stats_; }

 private:
  void count_lines(const std::vector<std::string_view>& lines);
  struct Impl;
  std::unique_ptr<Impl> impl_;
  BpeTrainOptions opts_;
  BpeTrainStats stats_;
};

// Trains on `files` and writes out_dir/tokenizer.json (creating out_dir). Returns the stats.
BpeTrainStats train_bpe_files(const std::vector<std::string>& files, const BpeTrainOptions& opts,
                              const std::string& out_dir);

}  // namespace trex::io
