#include "io/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "io/tokenizer_bpe.h"
#include "io/tokenizer_pretok.h"
#include "io/tokenizer_text.h"

namespace trex::io {

namespace {

constexpr const char* kHint =
    "trex reads byte-level BPE tokenizer.json files (GPT-2 / Llama-3 / Qwen / DeepSeek style); "
    "see docs/TOKENIZER.md for the supported fields";

using json = nlohmann::json;

// Only identity normalizers are supported: null, or a (nested) Sequence of nothing.
void check_normalizer(const json& j, const std::string& where, const std::string& path) {
  if (j.is_null()) return;
  TREX_USER_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(), kHint, where, ": field ", path,
                  " must be null or an object with a \"type\"");
  std::string t = j["type"].get<std::string>();
  if (t == "Sequence") {
    auto it = j.find("normalizers");
    TREX_USER_CHECK(it != j.end() && it->is_array(), kHint, where, ": field ", path, ".normalizers must be an array");
    for (size_t k = 0; k < it->size(); ++k) check_normalizer((*it)[k], where, path + ".normalizers[" + std::to_string(k) + "]");
    return;
  }
  if (t == "NFC" || t == "NFD" || t == "NFKC" || t == "NFKD")
    TREX_USER_FAIL(kHint, where, ": field ", path, ".type: '", t,
                   "' is not supported: Unicode normalization needs the Unicode composition tables (ICU), "
                   "which trex does not link; supported normalizers: null or an empty Sequence");
  TREX_USER_FAIL(kHint, where, ": field ", path, ".type: '", t,
                 "' is not supported; supported normalizers: null or an empty Sequence");
}

void check_decoder(const json& j, const std::string& where) {
  TREX_USER_CHECK(!j.is_null(), kHint, where,
                  ": field decoder is null; trex supports the ByteLevel decoder (byte-level BPE) only");
  TREX_USER_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(), kHint, where,
                  ": field decoder must be an object with a \"type\"");
  std::string t = j["type"].get<std::string>();
  TREX_USER_CHECK(t == "ByteLevel", kHint, where, ": field decoder.type: '", t,
                  "' is not supported; trex supports the ByteLevel decoder only");
}

// id_limit: see tok::token_id_limit.
int32_t id_of(const json& j, const std::string& where, const std::string& path, int32_t id_limit) {
  TREX_USER_CHECK(j.is_number_integer() && j.get<int64_t>() >= 0, kHint, where,
                  ": field ", path, " must be a non-negative integer id, got ", j.dump());
  TREX_USER_CHECK(j.get<int64_t>() < id_limit, kHint, where, ": field ", path, ": id ", j.get<int64_t>(),
                  " is out of range (ids of this file must be below ", id_limit,
                  ": trex sizes its id tables by the largest id)");
  return (int32_t)j.get<int64_t>();
}

// Deepest nesting of [ and { outside strings; a linear scan run before parsing, so that the
// recursive readers below (Sequence of Sequences...) and JSON dumps in messages stay shallow.
int json_depth(std::string_view s) {
  int d = 0, deepest = 0;
  bool in_str = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_str) {
      if (c == '\\') ++i;
      else if (c == '"') in_str = false;
    } else if (c == '"') {
      in_str = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++d);
    } else if (c == ']' || c == '}') {
      --d;
    }
  }
  return deepest;
}
constexpr int kMaxJsonDepth = 64;  // a tokenizer.json nests about 5 deep

// One post_processor: ids it puts before and after a single sequence.
void parse_post(const json& j, const std::string& where, const std::string& path, std::vector<int32_t>& pre,
                std::vector<int32_t>& post, int32_t id_limit) {
  if (j.is_null()) return;
  TREX_USER_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(), kHint, where, ": field ", path,
                  " must be null or an object with a \"type\"");
  std::string t = j["type"].get<std::string>();
  if (t == "ByteLevel") return;  // offsets only
  if (t == "Sequence") {
    auto it = j.find("processors");
    TREX_USER_CHECK(it != j.end() && it->is_array(), kHint, where, ": field ", path, ".processors must be an array");
    for (size_t k = 0; k < it->size(); ++k) {
      // Each processor wraps the output of the previous ones.
      std::vector<int32_t> p2, s2;
      parse_post((*it)[k], where, path + ".processors[" + std::to_string(k) + "]", p2, s2, id_limit);
      pre.insert(pre.begin(), p2.begin(), p2.end());
      post.insert(post.end(), s2.begin(), s2.end());
    }
    return;
  }
  if (t == "RobertaProcessing" || t == "BertProcessing") {
    for (const char* k : {"cls", "sep"}) {
      auto it = j.find(k);
      TREX_USER_CHECK(it != j.end() && it->is_array() && it->size() == 2, kHint, where, ": field ", path, ".", k,
                      " must be [token, id]");
      (std::string(k) == "cls" ? pre : post).push_back(id_of((*it)[1], where, path + "." + k + "[1]", id_limit));
    }
    return;
  }
  TREX_USER_CHECK(t == "TemplateProcessing", kHint, where, ": field ", path, ".type: '", t,
                  "' is not supported; supported post-processors: null, ByteLevel, TemplateProcessing, "
                  "RobertaProcessing, BertProcessing, or a Sequence of them");
  auto st = j.find("special_tokens");
  TREX_USER_CHECK(st != j.end() && st->is_object(), kHint, where, ": field ", path, ".special_tokens must be an object");
  auto single = j.find("single");
  TREX_USER_CHECK(single != j.end() && single->is_array(), kHint, where, ": field ", path, ".single must be an array");
  bool seen_a = false;
  for (size_t k = 0; k < single->size(); ++k) {
    const json& item = (*single)[k];
    std::string ip = path + ".single[" + std::to_string(k) + "]";
    if (item.is_object() && item.contains("Sequence")) {
      const json& sq = item["Sequence"];
      TREX_USER_CHECK(sq.is_object() && sq.value("id", std::string()) == "A" && !seen_a, kHint, where, ": field ", ip,
                      ": the single template must contain the sequence A exactly once");
      seen_a = true;
      continue;
    }
    TREX_USER_CHECK(item.is_object() && item.contains("SpecialToken") && item["SpecialToken"].is_object() &&
                        item["SpecialToken"].contains("id") && item["SpecialToken"]["id"].is_string(),
                    kHint, where, ": field ", ip, " must be {\"SpecialToken\": {\"id\": ...}} or {\"Sequence\": ...}");
    std::string name = item["SpecialToken"]["id"].get<std::string>();
    auto sp = st->find(name);
    TREX_USER_CHECK(sp != st->end() && sp->is_object() && sp->contains("ids") && (*sp)["ids"].is_array(), kHint,
                    where, ": field ", path, ".special_tokens[\"", name, "\"] is missing or has no ids");
    auto& dst = seen_a ? post : pre;
    for (size_t q = 0; q < (*sp)["ids"].size(); ++q)
      dst.push_back(id_of((*sp)["ids"][q], where, path + ".special_tokens[\"" + name + "\"].ids", id_limit));
  }
  TREX_USER_CHECK(seen_a, kHint, where, ": field ", path, ".single has no {\"Sequence\": {\"id\": \"A\"}}");
}

}  // namespace

struct EncodeScratch {
  tok::PretokScratch pre;
  tok::BpeScratch bpe;
  std::vector<tok::AddedSeg> segs1, segs2;
  std::vector<std::string_view> pieces;
};
void EncodeScratchDeleter::operator()(EncodeScratch* p) const { delete p; }

struct Tokenizer::Impl {
  std::string name;
  tok::BpeModel model;
  tok::PreTokenizer pre;
  std::vector<AddedToken> added;  // tokenizers' assignment order
  std::unordered_map<std::string, int32_t, tok::StrHash, tok::StrEq> added_ids;
  tok::AddedMatcher raw_matcher, norm_matcher;  // normalized: false / true
  std::vector<int32_t> prefix, suffix;
  std::vector<std::string> dec_bytes;  // id -> bytes its token decodes to
  std::vector<uint8_t> has_token, special;
  int32_t max_id = -1;
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::load(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path p(path);
  if (fs::is_directory(p)) p /= "tokenizer.json";
  std::ifstream f(p, std::ios::binary);
  TREX_USER_CHECK(f.good(), "pass a tokenizer.json file or a directory that holds one", "cannot open tokenizer file ",
                  p.string());
  std::stringstream ss;
  ss << f.rdbuf();
  return from_json_string(ss.str(), p.string());
}

Tokenizer Tokenizer::from_json_string(const std::string& text, const std::string& where) {
  TREX_USER_CHECK(json_depth(text) <= kMaxJsonDepth, "the file is not a tokenizer.json; re-save it with tokenizers' "
                  "Tokenizer.save()", where, ": JSON nested deeper than ", kMaxJsonDepth, " levels");
  const int32_t id_limit = tok::token_id_limit(text.size());
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number like 1e999
    TREX_USER_FAIL("the file is not valid JSON; re-save it with tokenizers' Tokenizer.save()", where,
                   ": not valid JSON: ", e.what());
  }
  TREX_USER_CHECK(j.is_object(), kHint, where, ": the top level must be a JSON object");
  for (const char* k : {"truncation", "padding"})
    TREX_USER_CHECK(!j.contains(k) || j[k].is_null(), "set it to null in the file; trex packs and pads sequences itself",
                    where, ": field ", k, " is not null; trex does not apply tokenizer.json ", k);
  TREX_USER_CHECK(j.contains("model"), kHint, where, ": field model is missing");

  auto impl = std::make_unique<Impl>();
  Impl& im = *impl;
  im.name = where;
  check_normalizer(j.value("normalizer", json()), where, "normalizer");
  im.pre = tok::PreTokenizer::from_json(j.value("pre_tokenizer", json()), where);
  check_decoder(j.value("decoder", json()), where);
  im.model = tok::BpeModel::from_json(j["model"], where, id_limit);
  parse_post(j.value("post_processor", json()), where, "post_processor", im.prefix, im.suffix, id_limit);

  // Added tokens, with ids assigned as tokenizers' AddedVocabulary::add_tokens does.
  const json at = j.value("added_tokens", json::array());
  TREX_USER_CHECK(at.is_array(), kHint, where, ": field added_tokens must be an array");
  std::vector<AddedToken> specials, normals;
  std::unordered_set<std::string> special_set;
  int32_t max_added = -1;
  for (size_t k = 0; k < at.size(); ++k) {
    const json& t = at[k];
    std::string path = "added_tokens[" + std::to_string(k) + "]";
    TREX_USER_CHECK(t.is_object(), kHint, where, ": field ", path, " must be an object");
    AddedToken a;
    a.content = tok::json_get::string(t, "content", where, path);
    TREX_USER_CHECK(tok::utf8_valid(a.content), kHint, where, ": field ", path, ".content is not valid UTF-8");
    a.special = tok::json_get::boolean(t, "special", false, where, path);
    a.single_word = tok::json_get::boolean(t, "single_word", false, where, path);
    a.lstrip = tok::json_get::boolean(t, "lstrip", false, where, path);
    a.rstrip = tok::json_get::boolean(t, "rstrip", false, where, path);
    a.normalized = tok::json_get::boolean(t, "normalized", !a.special, where, path);
    int32_t file_id = t.contains("id") ? id_of(t["id"], where, path + ".id", id_limit) : -1;
    if (a.special) special_set.insert(a.content);
    if (a.content.empty() || im.added_ids.count(a.content)) continue;  // ignored, as tokenizers does
    int32_t mid = im.model.token_to_id(a.content);
    if (mid >= 0) {
      a.id = mid;
    } else {
      const int32_t vs = (int32_t)im.model.size();
      a.id = max_added < 0 ? vs : (max_added >= vs || vs == 0 ? max_added + 1 : vs);
    }
    if (file_id >= 0 && file_id != a.id)
      TREX_LOG_WARN(where, ": added token '", a.content, "' has id ", file_id, " in the file but gets id ", a.id,
                    " (as PyPI tokenizers assigns it)");
    max_added = std::max(max_added, a.id);
    im.added_ids.emplace(a.content, a.id);
    im.added.push_back(a);
  }
  // tokenizers matches special tokens and the others as one set, each with its own flags.
  std::vector<const AddedToken*> raw, norm;
  for (const AddedToken& a : im.added) (a.normalized ? norm : raw).push_back(&a);
  im.raw_matcher.build(raw);
  im.norm_matcher.build(norm);

  // Decoding tables: added tokens take precedence over the model vocab for an id.
  im.max_id = im.model.max_id();
  for (const AddedToken& a : im.added) im.max_id = std::max(im.max_id, a.id);
  for (int32_t id : im.prefix) im.max_id = std::max(im.max_id, id);
  for (int32_t id : im.suffix) im.max_id = std::max(im.max_id, id);
  const size_t n = (size_t)im.max_id + 1;
  im.dec_bytes.assign(n, {});
  im.has_token.assign(n, 0);
  im.special.assign(n, 0);
  auto set_token = [&](int32_t id, const std::string& tokstr) {
    std::string raw_bytes;
    im.dec_bytes[id] = tok::from_byte_level(tokstr, raw_bytes) ? raw_bytes : tokstr;
    im.has_token[id] = 1;
    im.special[id] = special_set.count(tokstr) ? 1 : 0;
  };
  for (int32_t id = 0; id <= im.model.max_id(); ++id)
    if (const std::string* t = im.model.id_to_token(id)) set_token(id, *t);
  for (const AddedToken& a : im.added) set_token(a.id, a.content);
  return Tokenizer(std::move(impl));
}

EncodeScratchPtr Tokenizer::make_scratch() const { return EncodeScratchPtr(new EncodeScratch()); }

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  encode(text, out, add_special_tokens, nullptr);
  return out;
}

void Tokenizer::encode(std::string_view text, std::vector<int32_t>& out, bool add_special_tokens,
                       EncodeScratch* scratch) const {
  const Impl& im = *impl_;
  EncodeScratchPtr own;
  if (!scratch) own = make_scratch(), scratch = own.get();
  EncodeScratch& s = *scratch;
  std::string repaired;
  if (!tok::utf8_valid(text)) {
    repaired = tok::utf8_lossy(text);
    text = repaired;
  }
  if (add_special_tokens) out.insert(out.end(), im.prefix.begin(), im.prefix.end());
  auto encode_text = [&](std::string_view piece) {
    s.pieces.clear();
    im.pre.run(piece, s.pre, s.pieces);
    for (std::string_view w : s.pieces) im.model.encode_word(w, s.bpe, out);
  };
  // Pass 1: tokens with normalized = false on the original text; pass 2: normalized = true
  // tokens on the (identity-)normalized remaining pieces.
  s.segs1.clear();
  im.raw_matcher.split(text, s.segs1);
  for (const tok::AddedSeg& g : s.segs1) {
    if (g.end <= g.begin) continue;
    if (g.id >= 0) {
      out.push_back(g.id);
      continue;
    }
    std::string_view sub = text.substr(g.begin, g.end - g.begin);
    if (im.norm_matcher.empty()) {
      encode_text(sub);
      continue;
    }
    s.segs2.clear();
    im.norm_matcher.split(sub, s.segs2);
    for (const tok::AddedSeg& h : s.segs2) {
      if (h.end <= h.begin) continue;
      if (h.id >= 0) out.push_back(h.id);
      else encode_text(sub.substr(h.begin, h.end - h.begin));
    }
  }
  if (add_special_tokens) out.insert(out.end(), im.suffix.begin(), im.suffix.end());
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const Impl& im = *impl_;
  std::string bytes;
  bytes.reserve(ids.size() * 4);
  for (int32_t id : ids) {
    if (id < 0 || id > im.max_id || !im.has_token[id]) continue;
    if (skip_special_tokens && im.special[id]) continue;
    bytes += im.dec_bytes[id];
  }
  return tok::utf8_valid(bytes) ? bytes : tok::utf8_lossy(bytes);
}

int32_t Tokenizer::token_to_id(std::string_view token) const {
  auto it = impl_->added_ids.find(token);
  return it != impl_->added_ids.end() ? it->second : impl_->model.token_to_id(token);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  for (const AddedToken& a : impl_->added)
    if (a.id == id) return a.content;
  const std::string* t = impl_->model.id_to_token(id);
  return t ? *t : std::string();
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id <= impl_->max_id && impl_->special[id];
}
int64_t Tokenizer::vocab_size() const { return (int64_t)impl_->max_id + 1; }
size_t Tokenizer::num_merges() const { return impl_->model.num_merges(); }
const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }
const std::vector<int32_t>& Tokenizer::prefix_ids() const { return impl_->prefix; }
const std::vector<int32_t>& Tokenizer::suffix_ids() const { return impl_->suffix; }
const std::string& Tokenizer::name() const { return impl_->name; }

}  // namespace trex::io
