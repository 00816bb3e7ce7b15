// Fuzz target: a Hugging Face config.json (DeepSeek-V3 / Kimi-K2, V2, V3.2 and V4 model_type),
// read by trex::model::load_config_json (JSON parse, then parse_config in model/config.cpp and
// model/config_v4.cpp) from a scratch file. On success the derived figures a run prints and
// plans with (parameter counts, FLOPs per token) are computed, and MTP blocks instantiated with
// with_mtp, as `trex train` does.
#include <nlohmann/json.hpp>

#include "fuzz/fuzz_util.h"
#include "model/config.h"

using namespace trex;
using namespace trex::model;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::write_scratch("config.json", fuzz::as_text(data, size));
  fuzz::accepts([&] {
    ModelConfig c = load_config_json(path);
    FUZZ_ASSERT(c.vocab_size > 0 && c.hidden_size > 0 && c.num_hidden_layers > 0);
    if (c.is_v4()) {
      FUZZ_ASSERT(static_cast<int64_t>(c.v4.attn.size()) == c.num_hidden_layers);
      FUZZ_ASSERT(static_cast<int64_t>(c.v4.hash.size()) == c.num_hidden_layers);
    }
    volatile double sink = static_cast<double>(c.num_params()) +
                           static_cast<double>(c.num_active_params()) + c.train_flops_per_token(4096);
    (void)sink;
    if (c.num_nextn_predict_layers > 0) {
      ModelConfig m = with_mtp(c, 1);
      if (c.is_v4()) FUZZ_ASSERT(static_cast<int64_t>(m.v4.attn.size()) == c.num_hidden_layers + 1);
    }
  });
  return 0;
}
