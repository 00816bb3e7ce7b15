// Pre-tokenized, memory-mapped document cache (the idea of Megatron-LM's indexed dataset).
// Tokenizing is the slow part of reading data; its result depends only on the data files, the
// tokenizer and how samples are rendered. The first run writes the documents to
//   <cache_dir>/<key>/tokens.bin  int32 ids of all documents, back to back
//                     loss.bin    uint8 per id: 1 = trained on
//                     index.bin   int64 [ndocs + 1] offsets into tokens.bin
//                     meta.json   what the key was made of, counts, the reader's DataStats
// and every later run with the same inputs maps those files instead of tokenizing. The key
// hashes the tokenizer file's bytes, each data file's path, size and modification time, the mode,
// the chat template, train_on_prompt and the EOS id, so any change makes a new entry. An entry
// is written under a temporary name, fsynced and renamed, so a crash never leaves a half entry
// under the key; an entry whose files do not match its meta.json is rebuilt with a warning.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>
#include "train/data.h"

namespace trex::train {

// A read-only file mapping (unmapped on destruction).
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // UserError naming the file when it cannot be mapped
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const void* data() const { return p_; }
  size_t size() const { return n_; }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

// Documents either owned (built in memory) or mapped from a cache entry.
class TokenDocs {
 public:
  TokenDocs() = default;
  TokenDocs(TokenDocs&&) = default;  // moving keeps the owned buffers where they are
  TokenDocs& operator=(TokenDocs&&) = default;
  TokenDocs(const TokenDocs&) = delete;
  int64_t size() const { return (int64_t)offsets_.size() - 1; }
  int64_t tokens() const { return offsets_.back(); }
  DocSpan doc(int64_t i) const {
    const int64_t b = offsets_[i], e = offsets_[i + 1];
    return {ids_ + b, loss_ + b, e - b};
  }
  std::vector<DocSpan> spans() const;
  bool mapped() const { return map_ids_ != nullptr; }

  static TokenDocs from_samples(std::vector<Sample> docs);
  static TokenDocs open(const std::string& entry_dir);  // maps an entry; UserError when inconsistent

 private:
  std::vector<int64_t> offsets_ = {0};
  std::vector<int32_t> own_ids_;
  std::vector<uint8_t> own_loss_;
  std::shared_ptr<MappedFile> map_ids_, map_loss_;
  const int32_t* ids_ = nullptr;
  const uint8_t* loss_ = nullptr;
};

// What turns files into documents.
struct DocsSpec {
  std::string mode = "cpt";  // cpt | sft
  ChatTemplate chat;
  bool train_on_prompt = false;
  int32_t eos_id = 0;
  EncodeFn encode;
  std::string tokenizer_file;  // its bytes are part of the key; "" = an encoder without a file: never cached
};

// The key of (files, spec) as 16 hex digits.
std::string cache_key(const std::vector<std::string>& files, const DocsSpec& spec);

// Reads `files` into documents: from the cache entry when cache_dir is set and the entry exists,
// else by tokenizing (and then writing the entry when cache_dir is set). `stats` receives the
// reader's counters either way; *hit says whether the cache served them.
TokenDocs load_docs(const std::vector<std::string>& files, const DocsSpec& spec, const std::string& cache_dir,
                    DataStats& stats, bool* hit = nullptr);

}  // namespace trex::train
