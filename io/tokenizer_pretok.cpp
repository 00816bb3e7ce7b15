#include "io/tokenizer_pretok.h"

#include <stdexcept>

#include "core/error.h"

namespace trex::io::tok {

namespace {

constexpr const char* kHint =
    "trex reads byte-level BPE tokenizer.json files (GPT-2 / Llama-3 / Qwen / DeepSeek style); "
    "see docs/TOKENIZER.md for the supported fields";

// GPT-2 pattern that ByteLevel applies when use_regex is true (tokenizers' byte_level.rs).
constexpr const char* kGpt2Regex =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

std::string type_of(const nlohmann::json& j, const std::string& where, const std::string& path) {
  TREX_USER_CHECK(j.is_object(), kHint, where, ": field ", path, " must be an object, got ", j.type_name());
  return json_get::string(j, "type", where, path);
}

PreRegex compile(std::string_view pat, bool literal, const std::string& where, const std::string& path) {
  try {
    return PreRegex(pat, literal);
  } catch (const std::invalid_argument& e) {
    TREX_USER_FAIL(kHint, where, ": field ", path, ": pattern '", std::string(pat), "' is not supported: ", e.what());
  }
}

}  // namespace

namespace json_get {

bool boolean(const nlohmann::json& j, const char* key, bool dflt, const std::string& where, const std::string& path) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  TREX_USER_CHECK(it->is_boolean(), kHint, where, ": field ", path, ".", key, " must be true or false, got ",
                  it->dump());
  return it->get<bool>();
}

const std::string& string(const nlohmann::json& j, const char* key, const std::string& where, const std::string& path) {
  auto it = j.find(key);
  TREX_USER_CHECK(it != j.end(), kHint, where, ": field ", path, ".", key, " is missing");
  TREX_USER_CHECK(it->is_string(), kHint, where, ": field ", path, ".", key, " must be a string, got ",
                  it->type_name());
  return it->get_ref<const std::string&>();
}

}  // namespace json_get

PreTokenizer PreTokenizer::from_json(const nlohmann::json& j, const std::string& where) {
  PreTokenizer pt;
  const std::string root = "pre_tokenizer";
  TREX_USER_CHECK(!j.is_null(), kHint, where, ": field ", root,
                  " is null; trex needs a ByteLevel pre-tokenizer (alone or last in a Sequence)");
  std::string type = type_of(j, where, root);
  std::vector<std::pair<const nlohmann::json*, std::string>> items;
  if (type == "Sequence") {
    auto it = j.find("pretokenizers");
    TREX_USER_CHECK(it != j.end() && it->is_array(), kHint, where, ": field ", root,
                    ".pretokenizers must be an array");
    for (size_t k = 0; k < it->size(); ++k)
      items.push_back({&(*it)[k], root + ".pretokenizers[" + std::to_string(k) + "]"});
  } else {
    items.push_back({&j, root});
  }
  bool have_byte_level = false;
  for (auto& [pj, path] : items) {
    const nlohmann::json& p = *pj;
    std::string t = type_of(p, where, path);
    TREX_USER_CHECK(!have_byte_level, kHint, where, ": field ", path, ": '", t,
                    "' after ByteLevel is not supported; ByteLevel must be the last pre-tokenizer");
    if (t == "Split") {
      auto pit = p.find("pattern");
      TREX_USER_CHECK(pit != p.end() && pit->is_object() && pit->size() == 1, kHint, where, ": field ", path,
                      ".pattern must be {\"Regex\": ...} or {\"String\": ...}");
      bool literal = pit->contains("String");
      TREX_USER_CHECK(literal || pit->contains("Regex"), kHint, where, ": field ", path,
                      ".pattern must be {\"Regex\": ...} or {\"String\": ...}, got ", pit->dump());
      const std::string& pat = json_get::string(*pit, literal ? "String" : "Regex", where, path + ".pattern");
      const std::string& beh = json_get::string(p, "behavior", where, path);
      SplitBehavior b;
      if (beh == "Isolated") b = SplitBehavior::Isolated;
      else if (beh == "Removed") b = SplitBehavior::Removed;
      else if (beh == "MergedWithPrevious") b = SplitBehavior::MergedWithPrevious;
      else if (beh == "MergedWithNext") b = SplitBehavior::MergedWithNext;
      else if (beh == "Contiguous") b = SplitBehavior::Contiguous;
      else
        TREX_USER_FAIL(kHint, where, ": field ", path, ".behavior: '", beh,
                       "' is not one of Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous");
      bool invert = json_get::boolean(p, "invert", false, where, path);
      pt.steps_.push_back({compile(pat, literal, where, path + ".pattern"), b, invert});
    } else if (t == "Digits") {
      bool individual = json_get::boolean(p, "individual_digits", false, where, path);
      // Digits splits on char::is_numeric (Nd | Nl | No): runs, or each digit alone.
      pt.steps_.push_back({compile(individual ? "\\p{N}" : "\\p{N}+", false, where, path), SplitBehavior::Isolated,
                           false});
    } else if (t == "ByteLevel") {
      have_byte_level = true;
      pt.add_prefix_space_ = json_get::boolean(p, "add_prefix_space", true, where, path);
      if (json_get::boolean(p, "use_regex", true, where, path))
        pt.byte_level_split_.push_back({compile(kGpt2Regex, false, where, path), SplitBehavior::Isolated, false});
    } else {
      TREX_USER_FAIL(kHint, where, ": field ", path, ".type: '", t,
                     "' is not supported; supported pre-tokenizers: ByteLevel, or a Sequence of Split / Digits "
                     "steps ending in ByteLevel");
    }
  }
  TREX_USER_CHECK(have_byte_level, kHint, where, ": field ", root,
                  " has no ByteLevel step; trex supports byte-level BPE only (ByteLevel alone or last in a "
                  "Sequence)");
  return pt;
}

nlohmann::ordered_json PreTokenizer::deepseek_v3_json() {
  auto split = [](const char* re) {
    return nlohmann::ordered_json{{"type", "Split"}, {"pattern", {{"Regex", re}}}, {"behavior", "Isolated"},
                                  {"invert", false}};
  };
  // The three patterns of deepseek-ai/DeepSeek-V3's tokenizer.json, byte for byte (the third
  // holds literal CR and LF characters, as in the original).
  return {{"type", "Sequence"},
          {"pretokenizers",
           {split("\\p{N}{1,3}"), split("[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"),
            split("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
                  "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"),
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}};
}

void PreTokenizer::split(const SplitStep& st, std::string_view piece, PretokScratch& s, std::vector<Span>& out,
                         uint32_t base) const {
  // tokenizers' Pattern::find_matches: alternating (span, is_match) covering the piece.
  s.matches.clear();
  st.re.find_iter(piece, s.md, s.matches);
  using Part = SplitPart;
  std::vector<Part>& parts = s.parts;
  parts.clear();
  uint32_t prev = 0, n = (uint32_t)piece.size();
  for (const Span& m : s.matches) {
    if (prev != m.begin) parts.push_back({prev, m.begin, st.invert});
    parts.push_back({m.begin, m.end, !st.invert});
    prev = m.end;
  }
  if (prev != n) parts.push_back({prev, n, st.invert});

  auto emit = [&](uint32_t b, uint32_t e) {
    if (e > b) out.push_back({base + b, base + e});
  };
  switch (st.behavior) {
    case SplitBehavior::Isolated:
      for (const Part& p : parts) emit(p.b, p.e);
      break;
    case SplitBehavior::Removed:
      for (const Part& p : parts)
        if (!p.m) emit(p.b, p.e);
      break;
    case SplitBehavior::Contiguous:
    case SplitBehavior::MergedWithPrevious: {
      bool contiguous = st.behavior == SplitBehavior::Contiguous;
      std::vector<Span>& acc = s.acc;
      acc.clear();
      bool prev_match = false;
      for (const Part& p : parts) {
        bool join = contiguous ? (p.m == prev_match) : (p.m && !prev_match);
        if (join && !acc.empty()) acc.back().end = p.e;
        else acc.push_back({p.b, p.e});
        prev_match = p.m;
      }
      for (const Span& a : acc) emit(a.begin, a.end);
      break;
    }
    case SplitBehavior::MergedWithNext: {
      std::vector<Span>& acc = s.acc;
      acc.clear();
      bool prev_match = false;
      for (size_t k = parts.size(); k-- > 0;) {
        const Part& p = parts[k];
        if (p.m && !prev_match && !acc.empty()) acc.back().begin = p.b;
        else acc.push_back({p.b, p.e});
        prev_match = p.m;
      }
      for (size_t k = acc.size(); k-- > 0;) emit(acc[k].begin, acc[k].end);
      break;
    }
  }
}

void PreTokenizer::run(std::string_view text, PretokScratch& s, std::vector<std::string_view>& out) const {
  s.aux.clear();
  s.a.clear();
  if (!text.empty()) s.a.push_back({0, (uint32_t)text.size()});
  for (const SplitStep& st : steps_) {
    s.b.clear();
    for (const Span& p : s.a) split(st, text.substr(p.begin, p.end - p.begin), s, s.b, p.begin);
    std::swap(s.a, s.b);
  }
  for (const Span& p : s.a) {
    std::string_view piece = text.substr(p.begin, p.end - p.begin);
    if (add_prefix_space_ && piece[0] != ' ') {
      s.aux.push_back(" ");
      s.aux.back().append(piece);
      piece = s.aux.back();
    }
    if (byte_level_split_.empty()) {
      out.push_back(piece);
      continue;
    }
    s.b.clear();
    split(byte_level_split_[0], piece, s, s.b, 0);
    for (const Span& q : s.b) out.push_back(piece.substr(q.begin, q.end - q.begin));
  }
}

}  // namespace trex::io::tok
