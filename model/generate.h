// Generation with a KV cache: a Decoder feeds tokens (a prompt chunk or one new token) through
// the model and returns the logits of the last token fed. DeepSeek-V3: each layer's per-head keys
// (after RoPE) and values are kept; V3.2: the indexer's keys too; DeepSeek-V4: the sliding
// window, the compressors' running windows and entries and the indexer's keys
// (model/v4_decode.h). A Decoder holds `batch` sequences; feed_batch advances several at once,
// one forward over all their new tokens (the attention per sequence over its own cache). generate() and
// generate_batch() add greedy or temperature / top-p sampling, stop strings and a token limit.
// The model's training-time forward is untouched; tests check that the paths agree.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>
#include "core/rng.h"
#include "model/model.h"
#include "model/v4_decode.h"

namespace trex::model {

// One sequence's part of a batched feed: n >= 1 tokens ids for sequence seq.
struct DecoderPart {
  int64_t seq;
  const int32_t* ids;
  int64_t n;
};

class Decoder {
 public:
  // max_len: the longest prompt + generation each sequence holds; batch: the sequences it holds.
  Decoder(Model& m, int64_t max_len, int64_t batch = 1);
  // Sequence 0: ids [n] tokens at positions len()..len()+n-1 -> logits [vocab] of the last one.
  const std::vector<float>& feed(const int32_t* ids, int64_t n);
  // parts (distinct sequences) -> logits [parts, vocab]: row k after part k's last token.
  const std::vector<float>& feed_batch(const std::vector<DecoderPart>& parts);
  void reset();                       // every sequence back to empty
  int64_t len(int64_t seq = 0) const { return seqs_.at(seq).len; }
  int64_t max_len() const { return max_len_; }
  int64_t batch() const { return (int64_t)seqs_.size(); }

 private:
  struct Seq {
    int64_t len = 0;
    std::vector<std::vector<float>> K, V;  // per layer [max_len, H, dqk] / [max_len, H, dv]
    std::vector<std::vector<float>> IK;    // DeepSeek-V3.2: per layer the indexer keys [max_len, dI]
    V4Cache v4;                            // DeepSeek-V4
  };
  // DeepSeek-V3 / V3.2: parts -> logits [parts, vocab] (one forward over all their new tokens).
  void feed_v3(const std::vector<DecoderPart>& parts, float* logits);
  Model& m_;
  int64_t max_len_;
  std::vector<Seq> seqs_;
  std::vector<float> logits_;
};

struct SampleParams {
  float temperature = 0.f;  // 0: greedy
  float top_p = 1.f;
  int64_t max_tokens = 256;
  uint64_t seed = 0;
  std::vector<std::string> stop;  // stop strings (checked on the decoded text)
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated tokens (without the prompt)
  std::string text;             // decoded, cut before a stop string
  std::string finish;           // "eos" | "stop" | "length"
};

// decode: tokens -> text (for stop strings and the result); eos_ids end generation. Logits that
// hold a NaN or Inf are a UserError (greedy argmax over NaN would pick token 0 and the output
// would silently be empty or garbage).
GenerateResult generate(Decoder& dec, const std::vector<int32_t>& prompt, const SampleParams& sp,
                        const std::function<std::string(const std::vector<int32_t>&)>& decode,
                        const std::vector<int32_t>& eos_ids);

// The tokens a generation may add after a prompt of prompt_len tokens: max_tokens, capped so that
// prompt + generation stays within the model's max_position_embeddings (positions past it were
// never trained, and the KV cache grows with them). *capped: whether the cap applied. A prompt
// that alone fills max_position_embeddings is a UserError.
// Several prompts decoded together (dec.batch() >= prompts.size(); prompt k in sequence k, every
// sequence reset first), max_tokens[k] the limit of prompt k: each result is what generate() gives
// for that prompt alone with sp.max_tokens = max_tokens[k] (each prompt samples with its own
// Rng(sp.seed)). generate() is this with one prompt.
std::vector<GenerateResult> generate_batch(Decoder& dec, const std::vector<std::vector<int32_t>>& prompts,
                                           const SampleParams& sp, const std::vector<int64_t>& max_tokens,
                                           const std::function<std::string(const std::vector<int32_t>&)>& decode,
                                           const std::vector<int32_t>& eos_ids);

int64_t generation_budget(const ModelConfig& c, int64_t prompt_len, int64_t max_tokens, bool* capped);

}  // namespace trex::model
