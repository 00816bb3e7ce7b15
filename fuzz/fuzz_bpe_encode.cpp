// Fuzz target: BPE encoding of arbitrary bytes with a fixed tokenizer
// (tests/data/tokenizer/deepseek_v3_style.json: DeepSeek-V3's pre-tokenizer regexes, added
// special tokens, BOS post-processor). Checks, for every input:
//   - every id is in [0, vocab_size);
//   - decode(encode(x)) == utf8_lossy(x) (the tokenizer has no normalizer and no
//     lstrip / rstrip added tokens, so encoding is lossless up to U+FFFD repair);
//   - add_special_tokens adds exactly prefix_ids / suffix_ids around the same ids;
//   - a reused EncodeScratch (the data loaders' path) gives the same ids as a fresh one.
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "io/tokenizer.h"
#include "io/tokenizer_text.h"

using namespace trex;
using namespace trex::io;

namespace {

const Tokenizer& tokenizer() {
  static const Tokenizer t = Tokenizer::load(fuzz::repo_file("tests/data/tokenizer/deepseek_v3_style.json"));
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Tokenizer& t = tokenizer();
  static EncodeScratchPtr scratch = t.make_scratch();
  const std::string_view text = fuzz::as_text(data, size);
  const int64_t V = t.vocab_size();

  std::vector<int32_t> plain = t.encode(text, false);
  for (int32_t id : plain) FUZZ_ASSERT(id >= 0 && id < V, "id ", id);
  const std::string back = t.decode(plain, false);
  FUZZ_ASSERT(back == tok::utf8_lossy(text), "decode(encode(x)) != x");

  std::vector<int32_t> reused;
  t.encode(text, reused, false, scratch.get());
  FUZZ_ASSERT(reused == plain, "a reused EncodeScratch changed the ids");

  std::vector<int32_t> with = t.encode(text, true);
  const auto& pre = t.prefix_ids();
  const auto& suf = t.suffix_ids();
  FUZZ_ASSERT(with.size() == pre.size() + plain.size() + suf.size());
  FUZZ_ASSERT(std::equal(pre.begin(), pre.end(), with.begin()));
  FUZZ_ASSERT(std::equal(plain.begin(), plain.end(), with.begin() + static_cast<std::ptrdiff_t>(pre.size())));
  FUZZ_ASSERT(std::equal(suf.begin(), suf.end(), with.end() - static_cast<std::ptrdiff_t>(suf.size())));
  return 0;
}
