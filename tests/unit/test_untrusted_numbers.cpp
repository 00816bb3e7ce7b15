// Numbers that cannot be trusted are errors, not silent output: NaN / Inf weights at load (the
// tensor named), non-finite logits in generation (greedy argmax over NaN picked token 0 and
// printed nothing), and generation capped at the model's max_position_embeddings.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include "core/error.h"
#include "core/parallel.h"
#include "model/checkpoint.h"
#include "model/generate.h"
#include "tests/tiny_configs.h"
#include "tests/unit/test_util.h"

using namespace trex;
using namespace trex::model;

namespace {

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(UntrustedNumbers, NonFiniteWeightsAreRefusedAtLoadWithTheTensorNamed) {
  init_threads();
  for (const nlohmann::json& j : {trex::testing::tiny_v3(), trex::testing::tiny_v4()}) {
    const ModelConfig cfg = parse_config(j, "test");
    Model m(cfg, kern::Prec::F32);
    m.init_random(3);
    const ParamEntry* e = m.layout.find("model.layers.1.self_attn.o_proj.weight");
    if (!e) e = &m.layout.entries[m.layout.entries.size() / 2];
    test::TmpDir good("trex_nan_good"), bad("trex_nan_bad");
    save_hf_checkpoint(m, good.str());
    m.P()[e->offset + 3] = std::numeric_limits<float>::quiet_NaN();
    m.P()[e->offset + 5] = std::numeric_limits<float>::infinity();
    save_hf_checkpoint(m, bad.str());
    Model r(cfg, kern::Prec::F32);
    EXPECT_NO_THROW(load_hf_weights(r, good.str()));
    try {
      load_hf_weights(r, bad.str());
      ADD_FAILURE() << "NaN weights loaded";
    } catch (const UserError& err) {
      const std::string w = err.what();
      EXPECT_TRUE(has(w, "'" + e->name + "'")) << w;
      EXPECT_TRUE(has(w, "2 NaN / Inf values")) << w;
      EXPECT_TRUE(has(w, bad.str())) << w;
    }
  }
}

TEST(UntrustedNumbers, NonFiniteLogitsInGenerationAreAnError) {
  init_threads();
  const ModelConfig cfg = parse_config(trex::testing::tiny_v3(), "test");
  Model m(cfg, kern::Prec::F32);
  m.init_random(5);
  auto decode = [](const std::vector<int32_t>& t) { return std::string(t.size(), 'x'); };
  SampleParams sp;
  sp.max_tokens = 4;
  {
    Decoder dec(m, 8);
    EXPECT_EQ(generate(dec, {1, 2, 3}, sp, decode, {}).tokens.size(), 4u);
  }
  m.P()[m.layout.find("model.norm.weight")->offset] = std::numeric_limits<float>::quiet_NaN();
  m.refresh_bf16();
  for (float temperature : {0.f, 0.7f}) {
    sp.temperature = temperature;
    Decoder dec(m, 8);
    try {
      generate(dec, {1, 2, 3}, sp, decode, {});
      ADD_FAILURE() << "generated from NaN logits";
    } catch (const UserError& err) {
      EXPECT_TRUE(has(err.what(), "logits at position 2")) << err.what();
    }
  }
}

TEST(UntrustedNumbers, GenerationIsCappedAtMaxPositionEmbeddings) {
  const ModelConfig cfg = parse_config(trex::testing::tiny_v3(), "test");  // max_position_embeddings 64
  bool capped = true;
  EXPECT_EQ(generation_budget(cfg, 10, 20, &capped), 20);
  EXPECT_FALSE(capped);
  EXPECT_EQ(generation_budget(cfg, 10, 100000, &capped), 54);
  EXPECT_TRUE(capped);
  EXPECT_EQ(generation_budget(cfg, 10, 54, &capped), 54);
  EXPECT_FALSE(capped);
  EXPECT_THROW(generation_budget(cfg, 64, 1, &capped), UserError);
  EXPECT_THROW(generation_budget(cfg, 3, 0, &capped), UserError);
}

}  // namespace
