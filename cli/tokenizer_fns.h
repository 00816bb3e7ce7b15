// The bridge from io::Tokenizer to the data code: encode without template tokens, the
// end-of-document id (data.eos_token or the first of the usual names the tokenizer knows).
#pragma once
#include <algorithm>
#include <filesystem>
#include <string>
#include "core/error.h"
#include "io/tokenizer.h"
#include "train/loop.h"

namespace trex::cli {

inline int32_t find_eos(const io::Tokenizer& tok, const std::string& wanted, const std::string& where) {
  if (!wanted.empty()) {
    int32_t id = tok.token_to_id(wanted);
    TREX_USER_CHECK(id >= 0, "set data.eos_token to a token of the tokenizer", where, ": eos_token '", wanted,
                    "' is not in the tokenizer");
    return id;
  }
  for (const char* name : {"<｜end▁of▁sentence｜>", "</s>", "<|endoftext|>", "<|im_end|>", "<eos>"}) {
    int32_t id = tok.token_to_id(name);
    if (id >= 0) return id;
  }
  TREX_USER_FAIL("set data.eos_token", where, ": the tokenizer has none of the usual end-of-text tokens");
}

// Tokens that end a generated reply: the tokenizer's end-of-text token and the template's end of
// turn when that is a different token.
inline std::vector<int32_t> stop_ids(const io::Tokenizer& tok, const train::ChatTemplate& t) {
  std::vector<int32_t> ids = {find_eos(tok, "", "tokenizer")};
  if (int32_t e = tok.token_to_id(t.eos); e >= 0 && e != ids[0]) ids.push_back(e);
  return ids;
}

// The chat template's markers (BOS, end of turn, user and assistant headers: their leading
// "<...>" token) that are not tokens of the tokenizer: those are encoded as ordinary text, which
// trains and generates, but not with the ids the template means.
inline std::vector<std::string> missing_template_tokens(const io::Tokenizer& tok, const train::ChatTemplate& t) {
  std::vector<std::string> missing;
  for (const std::string& m : {t.bos, t.eos, t.user, t.assistant}) {
    const size_t end = m.find('>');
    if (m.empty() || end == std::string::npos) continue;
    const std::string head = m.substr(0, end + 1);
    if (tok.token_to_id(head) < 0 && std::find(missing.begin(), missing.end(), head) == missing.end())
      missing.push_back(head);
  }
  return missing;
}

// A user turn wrapped in the chat template, ready for generation.
inline std::vector<int32_t> chat_prompt_ids(const io::Tokenizer& tok, const train::ChatTemplate& t,
                                            const std::string& user) {
  return train::render_generation_prompt({{"user", user}}, t,
                                         [&tok](std::string_view s) { return tok.encode(s, false); });
}

inline train::TokenizerFns tokenizer_fns(const io::Tokenizer& tok, const std::string& eos, const std::string& where) {
  train::TokenizerFns f;
  f.encode = [&tok](std::string_view s) { return tok.encode(s, false); };
  f.eos_id = find_eos(tok, eos, where);
  f.pad_id = f.eos_id;
  f.file = std::filesystem::is_directory(where) ? where + "/tokenizer.json" : where;
  return f;
}

}  // namespace trex::cli
