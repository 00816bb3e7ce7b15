#include "io/tokenizer_bpe.h"

#include <algorithm>
#include <mutex>

#include "core/error.h"
#include "io/tokenizer_text.h"

namespace trex::io::tok {

namespace {

constexpr const char* kHint =
    "trex reads byte-level BPE tokenizer.json files (GPT-2 / Llama-3 / Qwen / DeepSeek style); "
    "see docs/TOKENIZER.md for the supported fields";


// Higher priority = lower rank, then lower position (tokenizers' Merge ordering).
struct HeapLess {
  bool operator()(const BpeScratch::Item& a, const BpeScratch::Item& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  }
};

}  // namespace

// Word cache: 64 shards, each a bounded map behind its own mutex (cleared when full).
struct BpeModel::Cache {
  static constexpr size_t kShards = 64, kShardCap = 8192, kMinWord = 3, kMaxWord = 256;
  struct Shard {
    std::mutex m;
    std::unordered_map<std::string, std::vector<int32_t>, StrHash, StrEq> map;
  };
  Shard shards[kShards];
};

void MergeMap::reserve(size_t n) {
  size_t cap = 16;
  while (cap < 2 * n + 2) cap <<= 1;
  keys_.assign(cap, kEmpty);
  vals_.assign(cap, {});
  mask_ = cap - 1;
  shift_ = 64 - __builtin_ctzll(cap);
  size_ = 0;
}

void MergeMap::insert_or_assign(int32_t a, int32_t b, Val v) {
  uint64_t k = key(a, b);
  for (size_t i = slot(k);; i = (i + 1) & mask_) {
    if (keys_[i] == k) {
      vals_[i] = v;
      return;
    }
    if (keys_[i] == kEmpty) {
      TREX_CHECK(2 * (size_ + 1) <= keys_.size(), "MergeMap over capacity");
      keys_[i] = k;
      vals_[i] = v;
      ++size_;
      return;
    }
  }
}

BpeModel::BpeModel() : cache_(std::make_unique<Cache>()) { std::fill(byte_id_, byte_id_ + 256, -1); }
BpeModel::~BpeModel() = default;
BpeModel::BpeModel(BpeModel&&) noexcept = default;
BpeModel& BpeModel::operator=(BpeModel&&) noexcept = default;

BpeModel BpeModel::from_json(const nlohmann::json& j, const std::string& where, int32_t id_limit) {
  BpeModel m;
  m.where_ = where;
  TREX_USER_CHECK(j.is_object(), kHint, where, ": field model must be an object");
  auto str_field = [&](const char* key) -> std::string {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return {};
    TREX_USER_CHECK(it->is_string(), kHint, where, ": field model.", key, " must be a string or null");
    return it->get<std::string>();
  };
  auto bool_field = [&](const char* key) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return false;
    TREX_USER_CHECK(it->is_boolean(), kHint, where, ": field model.", key, " must be true or false");
    return it->get<bool>();
  };
  auto type = j.find("type");
  TREX_USER_CHECK(type != j.end() && type->is_string(), kHint, where,
                  ": field model.type is missing; trex supports \"BPE\" only");
  TREX_USER_CHECK(*type == "BPE", kHint, where, ": field model.type: '", type->get<std::string>(),
                  "' is not supported; trex supports byte-level \"BPE\" only");
  if (auto d = j.find("dropout"); d != j.end() && !d->is_null())
    TREX_USER_CHECK(d->is_number() && d->get<double>() == 0.0, kHint, where, ": field model.dropout: ", d->dump(),
                    " is not supported (only null or 0; BPE dropout is a training-time augmentation)");
  TREX_USER_CHECK(!bool_field("byte_fallback"), kHint, where,
                  ": field model.byte_fallback: true is not supported (SentencePiece-style <0xXX> fallback); "
                  "trex supports byte-level BPE with byte_fallback false");
  TREX_USER_CHECK(str_field("continuing_subword_prefix").empty(), kHint, where,
                  ": field model.continuing_subword_prefix is not supported (must be null)");
  TREX_USER_CHECK(str_field("end_of_word_suffix").empty(), kHint, where,
                  ": field model.end_of_word_suffix is not supported (must be null)");
  m.ignore_merges_ = bool_field("ignore_merges");
  m.fuse_unk_ = bool_field("fuse_unk");
  m.unk_token_ = str_field("unk_token");

  auto vit = j.find("vocab");
  TREX_USER_CHECK(vit != j.end() && vit->is_object(), kHint, where,
                  ": field model.vocab is missing or not an object of token -> id");
  m.vocab_.reserve(vit->size());
  int32_t max_id = -1;
  for (auto it = vit->begin(); it != vit->end(); ++it) {
    TREX_USER_CHECK(it->is_number_integer() && it->get<int64_t>() >= 0, kHint,
                    where, ": field model.vocab[\"", it.key(), "\"] must be a non-negative integer id, got ",
                    it->dump());
    TREX_USER_CHECK(it->get<int64_t>() < id_limit, kHint, where, ": field model.vocab[\"", it.key(), "\"]: id ",
                    it->get<int64_t>(), " is out of range (ids of this file must be below ", id_limit,
                    ": trex sizes its id tables by the largest id)");
    int32_t id = (int32_t)it->get<int64_t>();
    m.vocab_.emplace(it.key(), id);
    max_id = std::max(max_id, id);
  }
  m.id_to_tok_.assign((size_t)max_id + 1, nullptr);
  for (auto& [tok, id] : m.vocab_) {
    TREX_USER_CHECK(!m.id_to_tok_[id], kHint, where, ": field model.vocab: id ", id, " is given to both '",
                    *m.id_to_tok_[id], "' and '", tok, "'");
    m.id_to_tok_[id] = &tok;
  }
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    utf8_append(ch, byte_level_cp((uint8_t)b));
    m.byte_id_[b] = m.token_to_id(ch);
  }
  if (!m.unk_token_.empty()) m.unk_id_ = m.token_to_id(m.unk_token_);
  if (m.ignore_merges_) {
    std::string raw;
    for (auto& [tok, id] : m.vocab_)
      if (from_byte_level(tok, raw)) m.raw_vocab_.emplace(raw, id);
  }

  auto mit = j.find("merges");
  TREX_USER_CHECK(mit != j.end() && mit->is_array(), kHint, where, ": field model.merges is missing or not an array");
  m.merges_.reserve(mit->size());
  for (size_t r = 0; r < mit->size(); ++r) {
    const auto& e = (*mit)[r];
    std::string a, b;
    if (e.is_string()) {
      const std::string& s = e.get_ref<const std::string&>();
      size_t sp = s.find(' ');
      TREX_USER_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos, kHint, where,
                      ": field model.merges[", r, "]: '", s, "' must be two tokens separated by one space");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else {
      TREX_USER_CHECK(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string(), kHint, where,
                      ": field model.merges[", r, "] must be \"a b\" or [\"a\", \"b\"], got ", e.dump());
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    }
    int32_t ia = m.token_to_id(a), ib = m.token_to_id(b), in = m.token_to_id(a + b);
    TREX_USER_CHECK(ia >= 0, kHint, where, ": field model.merges[", r, "]: token '", a, "' is not in model.vocab");
    TREX_USER_CHECK(ib >= 0, kHint, where, ": field model.merges[", r, "]: token '", b, "' is not in model.vocab");
    TREX_USER_CHECK(in >= 0, kHint, where, ": field model.merges[", r, "]: merged token '", a + b,
                    "' is not in model.vocab");
    m.merges_.insert_or_assign(ia, ib, {(uint32_t)r, in});  // a later duplicate wins, as in tokenizers
  }
  return m;
}

int32_t BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  return id >= 0 && (size_t)id < id_to_tok_.size() ? id_to_tok_[id] : nullptr;
}

void BpeModel::merge_word(std::string_view bytes, BpeScratch& s, std::vector<int32_t>& out) const {
  auto& syms = s.syms;
  syms.clear();
  // Initial symbols: one per byte; bytes without a vocab entry become unk (fused if fuse_unk)
  // or are dropped when there is no unk_token, as in tokenizers' BPE::merge_word.
  int32_t pending_unk_len = 0;
  auto add = [&](int32_t id, uint32_t len) {
    int32_t n = (int32_t)syms.size();
    if (n) syms.back().next = n;
    syms.push_back({id, n - 1, -1, len});
  };
  for (unsigned char c : bytes) {
    int32_t id = byte_id_[c];
    if (id >= 0) {
      if (pending_unk_len) add(unk_id_, pending_unk_len), pending_unk_len = 0;
      add(id, 1);
    } else if (!unk_token_.empty()) {
      TREX_USER_CHECK(unk_id_ >= 0, "add the unk_token to model.vocab", where_, ": field model.unk_token: '",
                      unk_token_, "' is not in model.vocab but is needed for byte ", (int)c);
      if (pending_unk_len && !fuse_unk_) add(unk_id_, pending_unk_len), pending_unk_len = 0;
      pending_unk_len += 1;
    }
  }
  if (pending_unk_len) add(unk_id_, pending_unk_len);

  auto& heap = s.heap;
  heap.clear();
  for (size_t i = 0; i + 1 < syms.size(); ++i)
    if (const MergeMap::Val* v = merges_.find(syms[i].id, syms[i + 1].id))
      heap.push_back({v->rank, (uint32_t)i, v->new_id});
  std::make_heap(heap.begin(), heap.end(), HeapLess{});
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), HeapLess{});
    BpeScratch::Item top = heap.back();
    heap.pop_back();
    BpeScratch::Sym& cur = syms[top.pos];
    if (cur.len == 0 || cur.next == -1) continue;
    int32_t nxt = cur.next;
    BpeScratch::Sym right = syms[nxt];
    const MergeMap::Val* v = merges_.find(cur.id, right.id);
    if (!v || v->new_id != top.new_id) continue;  // stale entry
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    syms[nxt].len = 0;
    if (right.next >= 0) syms[right.next].prev = (int32_t)top.pos;
    if (cur.prev >= 0) {
      if (const MergeMap::Val* w = merges_.find(syms[cur.prev].id, cur.id)) {
        heap.push_back({w->rank, (uint32_t)cur.prev, w->new_id});
        std::push_heap(heap.begin(), heap.end(), HeapLess{});
      }
    }
    if (cur.next >= 0) {
      if (const MergeMap::Val* w = merges_.find(cur.id, syms[cur.next].id)) {
        heap.push_back({w->rank, top.pos, w->new_id});
        std::push_heap(heap.begin(), heap.end(), HeapLess{});
      }
    }
  }
  for (const auto& sym : syms)
    if (sym.len) out.push_back(sym.id);
}

void BpeModel::encode_word(std::string_view bytes, BpeScratch& s, std::vector<int32_t>& out) const {
  if (bytes.empty()) return;
  if (ignore_merges_) {
    auto it = raw_vocab_.find(bytes);
    if (it != raw_vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (bytes.size() == 1 && byte_id_[(unsigned char)bytes[0]] >= 0) {
    out.push_back(byte_id_[(unsigned char)bytes[0]]);
    return;
  }
  // Short words merge faster than a cache lookup; very long ones are not worth keeping.
  if (bytes.size() <= Cache::kMinWord || bytes.size() >= Cache::kMaxWord) {
    merge_word(bytes, s, out);
    return;
  }
  size_t h = StrHash{}(bytes);
  Cache::Shard& sh = cache_->shards[(h >> 7) % Cache::kShards];
  {
    std::lock_guard<std::mutex> lk(sh.m);
    auto it = sh.map.find(bytes);
    if (it != sh.map.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  size_t start = out.size();
  merge_word(bytes, s, out);
  std::lock_guard<std::mutex> lk(sh.m);
  if (sh.map.size() >= Cache::kShardCap) sh.map.clear();
  sh.map.emplace(std::string(bytes), std::vector<int32_t>(out.begin() + start, out.end()));
}

}  // namespace trex::io::tok
