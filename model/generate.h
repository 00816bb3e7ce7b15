// Generation with a KV cache (DeepSeek-V3.2: with the indexer's keys cached too; DeepSeek-V4:
// without one yet, each feed recomputes the row): a
// Decoder feeds tokens (a prompt chunk or one new token) through
// the model, keeping each layer's per-head keys (after RoPE) and values, and returns the logits
// of the last token fed. generate() adds greedy or temperature / top-p sampling, stop strings
// and a token limit. The model's training-time forward is untouched; tests check that the two
// paths give the same losses.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>
#include "core/rng.h"
#include "model/model.h"

namespace trex::model {

class Decoder {
 public:
  // max_len: the longest prompt + generation this decoder will hold.
  Decoder(Model& m, int64_t max_len);
  // ids: [n] tokens at positions len()..len()+n-1 -> logits [vocab] of the last one.
  const std::vector<float>& feed(const int32_t* ids, int64_t n);
  void reset() { len_ = 0; }
  int64_t len() const { return len_; }
  int64_t max_len() const { return max_len_; }

 private:
  Model& m_;
  int64_t max_len_, len_ = 0;
  std::vector<std::vector<float>> K_, V_;  // per layer [max_len, H, dqk] / [max_len, H, dv]
  std::vector<std::vector<float>> IK_;     // DeepSeek-V3.2: per layer the indexer keys [max_len, dI]
  std::vector<int32_t> ids_;               // DeepSeek-V4: the tokens so far (no cache: recomputed each feed)
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
int64_t generation_budget(const ModelConfig& c, int64_t prompt_len, int64_t max_tokens, bool* capped);

}  // namespace trex::model
