// Fuzz target: a tokenizer.json, loaded by trex::io::Tokenizer::from_json_string (the loader
// behind Tokenizer::load: model, added tokens, normalizer, pre-tokenizer with PCRE2 regexes,
// post-processor, decoder). A tokenizer that loads is then used: it encodes the input itself
// (so the fuzzed regexes and merges run on fuzzed text), decodes the ids, and looks tokens up.
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "io/tokenizer.h"

using namespace trex;
using namespace trex::io;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(fuzz::as_text(data, size));
  fuzz::accepts([&] {
    Tokenizer t = Tokenizer::from_json_string(text, "fuzz/tokenizer.json");
    const int64_t V = t.vocab_size();
    FUZZ_ASSERT(V >= 0);
    // The text to encode: the first 256 bytes of the input (keeps one run fast).
    const std::string_view sample = std::string_view(text).substr(0, 256);
    for (bool special : {false, true}) {
      std::vector<int32_t> ids = t.encode(sample, special);
      for (int32_t id : ids) FUZZ_ASSERT(id >= 0 && id < V, "id ", id, " outside [0, ", V, ")");
      std::string back = t.decode(ids, !special);
      for (int32_t id : ids) {
        std::string tok = t.id_to_token(id);
        if (!tok.empty()) FUZZ_ASSERT(t.token_to_id(tok) >= 0, "token of id ", id, " not found back");
      }
      (void)back;
    }
    for (const AddedToken& a : t.added_tokens()) FUZZ_ASSERT(a.id >= 0 && a.id < V);
    for (int32_t id : t.prefix_ids()) FUZZ_ASSERT(id >= 0 && id < V);
    for (int32_t id : t.suffix_ids()) FUZZ_ASSERT(id >= 0 && id < V);
    // Ids that do not exist decode to nothing rather than crash.
    const int32_t odd[] = {-1, static_cast<int32_t>(V), 0x7fffffff};
    (void)t.decode(odd, false);
  });
  return 0;
}
