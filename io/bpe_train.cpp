#include "io/bpe_train.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <queue>
#include <sstream>
#include <unordered_set>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "core/parallel.h"
#include "core/timer.h"
#include "io/atomic_file.h"
#include "io/tokenizer_added.h"
#include "io/tokenizer_pretok.h"
#include "io/tokenizer_text.h"

namespace trex::io {

namespace {

using WordCounts = std::unordered_map<std::string, int64_t, tok::StrHash, tok::StrEq>;

uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
int32_t pair_a(uint64_t k) { return (int32_t)(k >> 32); }
int32_t pair_b(uint64_t k) { return (int32_t)(k & 0xffffffffu); }

// Pre-tokenizes texts into word counts; one per thread.
struct Counter {
  const tok::PreTokenizer& pre;
  const tok::AddedMatcher& specials;
  tok::PretokScratch scratch;
  std::vector<tok::AddedSeg> segs;
  std::vector<std::string_view> pieces;
  WordCounts counts;
  int64_t words = 0;

  void add(std::string_view text) {
    std::string repaired;
    if (!tok::utf8_valid(text)) text = repaired = tok::utf8_lossy(text);
    segs.clear();
    specials.split(text, segs);
    for (const tok::AddedSeg& g : segs) {
      if (g.id >= 0 || g.end <= g.begin) continue;
      pieces.clear();
      pre.run(text.substr(g.begin, g.end - g.begin), scratch, pieces);
      for (std::string_view w : pieces) {
        auto it = counts.find(w);
        if (it == counts.end()) counts.emplace(std::string(w), 1);
        else ++it->second;
        ++words;
      }
    }
  }
};

// Max-heap entry: larger count first, then the smaller pair.
struct HeapItem {
  int64_t count;
  uint64_t pair;
  bool operator<(const HeapItem& o) const { return count != o.count ? count < o.count : pair > o.pair; }
};

}  // namespace

struct BpeTrainer::Impl {
  tok::PreTokenizer pre = tok::PreTokenizer::from_json(tok::PreTokenizer::deepseek_v3_json(), "<trainer>");
  std::vector<AddedToken> special_tokens;
  tok::AddedMatcher specials;
  WordCounts counts;
};

BpeTrainer::BpeTrainer(BpeTrainOptions opts) : impl_(std::make_unique<Impl>()), opts_(std::move(opts)) {
  const char* hint = "check the trex tokenizer train options";
  std::unordered_set<std::string> seen;
  for (size_t i = 0; i < opts_.special_tokens.size(); ++i) {
    const std::string& s = opts_.special_tokens[i];
    TREX_USER_CHECK(!s.empty() && tok::utf8_valid(s), hint, "special token ", i, " is empty or not UTF-8");
    TREX_USER_CHECK(seen.insert(s).second, hint, "special token '", s, "' is given twice");
    AddedToken a;
    a.content = s;
    a.id = (int32_t)i;
    a.normalized = false;
    a.special = true;
    impl_->special_tokens.push_back(a);
  }
  std::vector<const AddedToken*> ptrs;
  for (const AddedToken& a : impl_->special_tokens) ptrs.push_back(&a);
  impl_->specials.build(ptrs);
  const int64_t base = (int64_t)opts_.special_tokens.size() + 256;
  TREX_USER_CHECK(opts_.vocab_size >= base, hint, "--vocab-size ", opts_.vocab_size, " is below the ", base,
                  " ids taken by the special tokens and the 256 byte characters");
  TREX_USER_CHECK(opts_.vocab_size < (1ll << 31), hint, "--vocab-size ", opts_.vocab_size, " is too large");
  TREX_USER_CHECK(opts_.min_frequency >= 1, hint, "--min-frequency must be >= 1, got ", opts_.min_frequency);
  TREX_USER_CHECK(opts_.bos_token.empty() || seen.count(opts_.bos_token), hint, "--bos '", opts_.bos_token,
                  "' must be one of the special tokens");
}

BpeTrainer::~BpeTrainer() = default;

void BpeTrainer::add_text(std::string_view text) {
  double t0 = now_ms();
  Counter c{impl_->pre, impl_->specials, {}, {}, {}, {}, 0};
  c.add(text);
  for (auto& [w, n] : c.counts) impl_->counts[w] += n;
  stats_.words += c.words;
  stats_.sequences += 1;
  stats_.count_ms += now_ms() - t0;
}

void BpeTrainer::count_lines(const std::vector<std::string_view>& lines) {
  double t0 = now_ms();
  const int64_t n = (int64_t)lines.size();
  const int T = std::max(1, std::min<int>(num_threads(), (int)(n / 256 + 1)));
  std::vector<WordCounts> parts(T);
  std::vector<int64_t> words(T, 0);
  parallel_dynamic(T, [&](int64_t t) {
    Counter c{impl_->pre, impl_->specials, {}, {}, {}, {}, 0};
    for (int64_t i = t * n / T; i < (t + 1) * n / T; ++i) c.add(lines[i]);
    parts[t] = std::move(c.counts);
    words[t] = c.words;
  });
  for (int t = 0; t < T; ++t) {
    for (auto& [w, k] : parts[t]) impl_->counts[w] += k;
    stats_.words += words[t];
  }
  stats_.sequences += n;
  stats_.count_ms += now_ms() - t0;
}

void BpeTrainer::add_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  TREX_USER_CHECK(f.good(), "check the --files paths", "cannot open training file ", path);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string data = ss.str();
  std::vector<std::string_view> lines;
  std::string_view all = data;
  for (size_t b = 0; b < all.size();) {
    size_t e = all.find('\n', b);
    e = e == std::string_view::npos ? all.size() : e + 1;
    lines.push_back(all.substr(b, e - b));
    b = e;
  }
  count_lines(lines);
}

std::string BpeTrainer::train_json() {
  double t0 = now_ms();
  // Vocabulary: special tokens, then the 256 byte characters in code point order.
  std::vector<std::string> id_tok;
  std::unordered_map<std::string, int32_t, tok::StrHash, tok::StrEq> tok_id;
  for (const AddedToken& a : impl_->special_tokens) {
    tok_id.emplace(a.content, (int32_t)id_tok.size());
    id_tok.push_back(a.content);
  }
  std::vector<uint32_t> cps;
  for (int b = 0; b < 256; ++b) cps.push_back(tok::byte_level_cp((uint8_t)b));
  std::sort(cps.begin(), cps.end());
  int32_t byte_id[256];
  for (uint32_t cp : cps) {
    std::string s;
    tok::utf8_append(s, cp);
    int32_t id = (int32_t)id_tok.size();
    auto [it, fresh] = tok_id.emplace(s, id);
    if (fresh) id_tok.push_back(s);
    byte_id[tok::byte_of_cp(cp)] = it->second;
  }

  // Words in byte order (determinism), as symbol sequences.
  std::vector<std::pair<std::string, int64_t>> wc(impl_->counts.begin(), impl_->counts.end());
  std::sort(wc.begin(), wc.end());
  stats_.unique_words = (int64_t)wc.size();
  std::vector<std::vector<int32_t>> words(wc.size());
  std::vector<int64_t> freq(wc.size());
  std::unordered_map<uint64_t, int64_t> pair_count;
  std::unordered_map<uint64_t, std::vector<int32_t>> where;
  auto note_where = [&](uint64_t p, int32_t w) {
    auto& v = where[p];
    if (v.empty() || v.back() != w) v.push_back(w);
  };
  for (size_t w = 0; w < wc.size(); ++w) {
    freq[w] = wc[w].second;
    for (unsigned char c : wc[w].first) words[w].push_back(byte_id[c]);
    for (size_t i = 0; i + 1 < words[w].size(); ++i) {
      uint64_t p = pair_key(words[w][i], words[w][i + 1]);
      pair_count[p] += freq[w];
      note_where(p, (int32_t)w);
    }
  }
  std::priority_queue<HeapItem> heap;
  {
    std::vector<HeapItem> items;
    for (auto& [p, c] : pair_count) items.push_back({c, p});
    std::sort(items.begin(), items.end());
    for (auto& it : items) heap.push(it);
  }

  std::vector<std::pair<int32_t, int32_t>> merges;
  std::vector<uint32_t> stamp(words.size(), 0);
  uint32_t round = 0;
  std::vector<uint64_t> touched;
  while ((int64_t)id_tok.size() < opts_.vocab_size && !heap.empty()) {
    HeapItem top = heap.top();
    heap.pop();
    auto pc = pair_count.find(top.pair);
    int64_t cur = pc == pair_count.end() ? 0 : pc->second;
    if (cur != top.count) {  // stale: re-queue with the current count
      if (cur > 0) heap.push({cur, top.pair});
      continue;
    }
    if (top.count < opts_.min_frequency) break;
    const int32_t a = pair_a(top.pair), b = pair_b(top.pair);
    std::string s = id_tok[a] + id_tok[b];
    auto [it, fresh] = tok_id.emplace(s, (int32_t)id_tok.size());
    if (fresh) id_tok.push_back(s);
    const int32_t nid = it->second;
    merges.push_back({a, b});

    ++round;
    touched.clear();
    std::vector<int32_t> wl = std::move(where[top.pair]);
    where.erase(top.pair);
    auto add = [&](int32_t x, int32_t y, int64_t d, int32_t w) {
      uint64_t p = pair_key(x, y);
      int64_t& c = pair_count[p];
      c += d;
      if (d > 0) {
        note_where(p, w);
        touched.push_back(p);
      }
    };
    for (int32_t w : wl) {
      if (stamp[w] == round) continue;
      stamp[w] = round;
      auto& v = words[w];
      const int64_t f = freq[w];
      for (size_t i = 0; i + 1 < v.size();) {
        if (v[i] != a || v[i + 1] != b) {
          ++i;
          continue;
        }
        if (i > 0) add(v[i - 1], a, -f, w), add(v[i - 1], nid, f, w);
        if (i + 2 < v.size()) add(b, v[i + 2], -f, w), add(nid, v[i + 2], f, w);
        add(a, b, -f, w);
        v[i] = nid;
        v.erase(v.begin() + (ptrdiff_t)i + 1);
        ++i;
      }
    }
    pair_count.erase(top.pair);
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (uint64_t p : touched) {
      auto q = pair_count.find(p);
      if (q != pair_count.end() && q->second > 0) heap.push({q->second, p});
    }
  }
  stats_.merges = (int64_t)merges.size();
  stats_.vocab = (int64_t)id_tok.size();
  stats_.merge_ms = now_ms() - t0;

  using oj = nlohmann::ordered_json;
  oj added = oj::array();
  for (const AddedToken& a : impl_->special_tokens)
    added.push_back({{"id", a.id}, {"content", a.content}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  oj vocab = oj::object();
  for (size_t i = 0; i < id_tok.size(); ++i) vocab[id_tok[i]] = (int64_t)i;
  oj mj = oj::array();
  for (auto& [a, b] : merges) mj.push_back(id_tok[a] + " " + id_tok[b]);  // byte-level tokens hold no space
  oj post = nullptr;
  if (!opts_.bos_token.empty()) {
    int64_t bos = tok_id.at(opts_.bos_token);
    post = {{"type", "TemplateProcessing"},
            {"single", {{{"SpecialToken", {{"id", opts_.bos_token}, {"type_id", 0}}}},
                        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
            {"pair", {{{"SpecialToken", {{"id", opts_.bos_token}, {"type_id", 0}}}},
                      {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                      {{"SpecialToken", {{"id", opts_.bos_token}, {"type_id", 1}}}},
                      {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
            {"special_tokens", {{opts_.bos_token, {{"id", opts_.bos_token}, {"ids", {bos}}, {"tokens", {opts_.bos_token}}}}}}};
  }
  oj j = {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", tok::PreTokenizer::deepseek_v3_json()},
          {"post_processor", post},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"vocab", vocab},
            {"merges", mj}}}};
  return j.dump(1) + "\n";
}

BpeTrainStats train_bpe_files(const std::vector<std::string>& files, const BpeTrainOptions& opts,
                              const std::string& out_dir) {
  TREX_USER_CHECK(!files.empty(), "pass --files", "no training files given");
  BpeTrainer tr(opts);
  for (const std::string& f : files) tr.add_file(f);
  // Some byte other than white space in some file (stops at the first one).
  auto has_text = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    char buf[1 << 16];
    while (in.read(buf, sizeof buf) || in.gcount() > 0)
      for (std::streamsize i = 0; i < in.gcount(); ++i)
        if (!std::isspace((unsigned char)buf[i])) return true;
    return false;
  };
  std::string names;
  bool any = false;
  for (const std::string& f : files) names += (names.empty() ? "" : ", ") + f, any = any || has_text(f);
  TREX_USER_CHECK(any, "give --files with text to learn merges from", names,
                  ": no text to train on (the files are empty or hold only white space)");
  std::string js = tr.train_json();
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  TREX_USER_CHECK(!ec, "check --out", "cannot create directory ", out_dir, ": ", ec.message());
  io::write_file_atomic((fs::path(out_dir) / "tokenizer.json").string(), js);
  return tr.stats();
}

}  // namespace trex::io
