// The BPE model of a byte-level tokenizer.json ("model": {"type": "BPE", ...}). Works on byte
// ids: each byte of a pre-token starts as the id of its ByteLevel character, then merges are
// applied lowest rank first (leftmost on ties) with a min-heap and lazy invalidation, exactly
// the algorithm of tokenizers' Word::merge_all, so results are identical even for vocabularies
// with several merges producing the same string. A sharded, bounded word cache sits in front.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>
#include <nlohmann/json.hpp>

#include "io/tokenizer_text.h"

namespace trex::io::tok {

// Largest token id + 1 accepted from a tokenizer.json of `json_bytes` bytes. Id tables are
// sized by the largest id, so an id is bounded by the file that states it: a file can densely
// describe fewer tokens than it has bytes. The floor of 2^20 leaves room for sparse ids in small
// files; the cap keeps ids assigned after the largest one (added tokens) inside int32.
inline int32_t token_id_limit(size_t json_bytes) {
  const size_t lim = std::max<size_t>(json_bytes, size_t{1} << 20);
  return static_cast<int32_t>(std::min<size_t>(lim, size_t{1} << 30));
}

// Per-thread scratch for BpeModel::encode_word.
struct BpeScratch {
  struct Sym {
    int32_t id, prev, next;
    uint32_t len;
  };
  struct Item {
    uint32_t rank, pos;
    int32_t new_id;
  };
  std::vector<Sym> syms;
  std::vector<Item> heap;
};

// Open-addressing map (left id, right id) -> (rank, merged id).
class MergeMap {
 public:
  struct Val {
    uint32_t rank;
    int32_t new_id;
  };
  void reserve(size_t n);
  void insert_or_assign(int32_t a, int32_t b, Val v);
  const Val* find(int32_t a, int32_t b) const {
    if (keys_.empty()) return nullptr;
    uint64_t k = key(a, b);
    for (size_t i = slot(k);; i = (i + 1) & mask_) {
      if (keys_[i] == k) return &vals_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  static uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  size_t slot(uint64_t k) const { return (size_t)((k * 0x9E3779B97F4A7C15ull) >> shift_); }
  std::vector<uint64_t> keys_;
  std::vector<Val> vals_;
  size_t mask_ = 0, size_ = 0;
  int shift_ = 64;
};

class BpeModel {
 public:
  BpeModel();
  ~BpeModel();
  BpeModel(BpeModel&&) noexcept;
  BpeModel& operator=(BpeModel&&) noexcept;

  // j: the "model" value of tokenizer.json; `where` names the file. Throws UserError naming the
  // field for anything unsupported or inconsistent (merge tokens missing from the vocab, ...).
  // Ids must be below id_limit (see token_id_limit): tables are sized by the largest id.
  static BpeModel from_json(const nlohmann::json& j, const std::string& where, int32_t id_limit);

  int32_t token_to_id(std::string_view token) const;  // -1 if absent
  const std::string* id_to_token(int32_t id) const;   // nullptr if absent
  size_t size() const { return vocab_.size(); }       // entries of model.vocab
  int32_t max_id() const { return (int32_t)id_to_tok_.size() - 1; }
  size_t num_merges() const { return merges_.size(); }

  // BPE of one pre-token (raw bytes, non-empty); appends its ids to `out`.
  void encode_word(std::string_view bytes, BpeScratch& s, std::vector<int32_t>& out) const;

 private:
  void merge_word(std::string_view bytes, BpeScratch& s, std::vector<int32_t>& out) const;
  struct Cache;
  std::unordered_map<std::string, int32_t, StrHash, StrEq> vocab_;
  std::vector<const std::string*> id_to_tok_;        // into vocab_'s keys; nullptr for gaps
  std::unordered_map<std::string, int32_t, StrHash, StrEq> raw_vocab_;  // raw bytes -> id (ignore_merges only)
  int32_t byte_id_[256];
  MergeMap merges_;
  bool ignore_merges_ = false, fuse_unk_ = false;
  std::string unk_token_;  // empty: none
  int32_t unk_id_ = -1;
  std::string where_;
  std::unique_ptr<Cache> cache_;
};

}  // namespace trex::io::tok
