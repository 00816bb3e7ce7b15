// Stage-sharded parameter layouts (model/params.h StageShard): what a pipeline stage allocates,
// initializes and loads. Tiny V3 (untied and tied head) and V4 (with and without an MTP block),
// 3 layers cut into stages of every kind the config allows (a first or last stage without layers,
// a middle stage), alone and with an expert shard; each stage against the whole model, tensor by
// tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>

#include "core/error.h"
#include "model/checkpoint.h"
#include "tests/tiny_configs.h"
#include "tests/unit/shard_checks.h"
#include "tests/unit/test_util.h"
#include "train/checkpoint.h"
#include "train/optimizer.h"

using namespace trex;
using namespace trex::testing;
using trex::test::expect_slices_of;
namespace fs = std::filesystem;

namespace {

struct Named {
  const char* what;
  model::ModelConfig cfg;  // as the model builds it (V4: with its MTP blocks or without)
  double mtp;              // TrainOptions::mtp_loss_weight giving that config
};

std::vector<Named> configs() {
  nlohmann::json tied = tiny_v3();
  tied["tie_word_embeddings"] = true;
  const model::ModelConfig v4 = model::parse_config(tiny_v4(), "tiny");
  return {{"v3", model::parse_config(tiny_v3(), "tiny"), 0.0},
          {"v3 tied", model::parse_config(tied, "tiny"), 0.0},
          {"v4 mtp", model::with_mtp(v4, 1), 0.3},
          {"v4", model::with_mtp(v4, 0), 0.0}};
}

// Pipelines of the 3-layer tiny models: [l0, l1) per stage.
std::vector<std::vector<std::pair<int64_t, int64_t>>> pipelines() {
  return {{{0, 1}, {1, 3}}, {{0, 0}, {0, 3}}, {{0, 3}, {3, 3}}, {{0, 1}, {1, 2}, {2, 3}}};
}

model::StageShard stage_of(const std::vector<std::pair<int64_t, int64_t>>& p, size_t s, int64_t align = 32) {
  return {p[s].first, p[s].second, s == 0, s + 1 == p.size(), align};
}

// The decoder layer a tensor belongs to (V4 MTP block k: num_hidden_layers + k), or -1.
int64_t layer_of(const model::ModelConfig& c, const std::string& n) {
  if (n.rfind("model.layers.", 0) == 0) return std::atoll(n.c_str() + 13);
  if (n.rfind("mtp.", 0) == 0) return c.num_hidden_layers + std::atoll(n.c_str() + 4);
  return -1;
}

}  // namespace

// A stage holds exactly its layers' tensors, in the whole model's order and shapes; the first the
// embedding, the last the final norm and head (V4: hc_head, MTP blocks), both the embedding when
// it is shared (tied head, MTP), then alone in an aligned region at the start. The stages together
// hold every tensor once (the shared embedding twice). Buffers stay whole on every stage.
TEST(StageShard, LayoutHoldsTheStagesTensors) {
  for (const Named& n : configs()) {
    SCOPED_TRACE(n.what);
    const model::ModelConfig& c = n.cfg;
    const model::ParamLayout whole = model::build_layout(c);
    EXPECT_FALSE(whole.stage_sharded());
    const bool shared = c.tie_word_embeddings || (c.is_v4() && c.v4.mtp_layers > 0);
    for (const auto& p : pipelines()) {
      std::map<std::string, int> holders;
      for (size_t s = 0; s < p.size(); ++s) {
        const model::StageShard st = stage_of(p, s);
        SCOPED_TRACE(::testing::Message() << "stage [" << st.l0 << ", " << st.l1 << ")");
        const model::ParamLayout L = model::build_layout(c, {}, st);
        ASSERT_TRUE(L.stage_sharded());
        size_t prev = 0;
        for (const model::ParamEntry& e : L.entries) {
          const model::ParamEntry* w = whole.find(e.name);
          ASSERT_TRUE(w) << e.name;
          EXPECT_EQ(e.shape, w->shape) << e.name;
          EXPECT_GE(whole.index.at(e.name), prev) << e.name << ": not in the whole model's order";
          prev = whole.index.at(e.name);
          ++holders[e.name];
          const int64_t l = layer_of(c, e.name);
          if (l >= 0) EXPECT_TRUE(L.holds_layer(l)) << e.name;
          else if (e.name == "model.embed_tokens.weight") EXPECT_TRUE(st.first || (st.last && shared));
          else EXPECT_TRUE(st.last) << e.name;
        }
        for (int64_t l = 0; l < (int64_t)L.layers.size(); ++l)
          EXPECT_EQ(L.holds_layer(l), (l >= st.l0 && l < st.l1) || (l >= c.num_hidden_layers && st.last)) << l;
        EXPECT_EQ(L.embed >= 0, st.first || (st.last && shared));
        EXPECT_EQ(L.final_norm >= 0, st.last);
        if (shared && L.embed >= 0) {  // alone at the start, the region aligned
          EXPECT_EQ(L.embed, 0);
          EXPECT_EQ(L.shared_end % 32, 0);
          EXPECT_GE(L.shared_end, c.vocab_size * c.hidden_size);
          for (const model::ParamEntry& e : L.entries) {
            if (e.name != "model.embed_tokens.weight") {
              EXPECT_GE(e.offset, L.shared_end) << e.name;
            }
          }
        } else {
          EXPECT_EQ(L.shared_end, -1);
        }
        ASSERT_EQ(L.buffers.size(), whole.buffers.size());
        for (size_t i = 0; i < L.buffers.size(); ++i) {
          EXPECT_EQ(L.buffers[i].name, whole.buffers[i].name);
          EXPECT_EQ(L.buffers[i].offset, whole.buffers[i].offset);
        }
      }
      for (const model::ParamEntry& e : whole.entries)
        EXPECT_EQ(holders[e.name], e.name == "model.embed_tokens.weight" && shared ? 2 : 1) << e.name;
    }
    EXPECT_THROW(model::build_layout(c, {}, {1, 3, true, false, 16}), std::exception);  // first must start at 0
    EXPECT_THROW(model::build_layout(c, {}, {0, 2, false, true, 16}), std::exception);  // last must end at L
    EXPECT_THROW(model::build_layout(c, {}, {2, 1, false, false, 16}), std::exception);
    EXPECT_THROW(model::build_layout(c, {}, {0, 1, true, false, 24}), std::exception);  // not 64-byte aligned
  }
}

// A stage's random init draws what the whole model draws for its tensors; the weights loaded from
// a whole checkpoint (HF layout, V4's original release layout) and a training checkpoint's moments
// are the whole model's, alone and with an expert shard.
TEST(StageShard, InitAndLoadGiveTheWholeModelsTensors) {
  for (const Named& n : configs()) {
    SCOPED_TRACE(n.what);
    nlohmann::json j = n.cfg.is_v4() ? tiny_v4() : tiny_v3();
    if (n.cfg.tie_word_embeddings) j["tie_word_embeddings"] = true;
    j["n_routed_experts"] = 6;
    const test::WholeCheckpoints w(model::parse_config(j, "tiny"), {0.01, n.mtp}, "trex_stage_shard_");
    for (const auto& p : {pipelines()[1], pipelines()[3]})
      for (size_t s = 0; s < p.size(); ++s)
        for (const model::ExpertShard ex : {model::ExpertShard{}, model::ExpertShard{2, 2, 32}}) {
          const model::StageShard st = stage_of(p, s);
          SCOPED_TRACE(::testing::Message() << "stage [" << st.l0 << ", " << st.l1 << "), experts " << ex.count);
          w.expect_shard_matches(ex, st);
        }
  }
}

// A stage alone cannot compute a whole forward, run as another stage, or be written as a whole
// checkpoint: each is refused instead of running on missing weights.
TEST(StageShard, AStageAloneIsRefused) {
  const model::ModelConfig c = model::parse_config(tiny_v3(), "tiny");
  model::Model m(c, kern::Prec::F32, {}, {}, {1, 3, false, true, 16});
  m.init_random(3);
  std::vector<int32_t> ids(5, 1), tg(5, 2);
  try {
    m.forward({1, 5, ids.data(), tg.data(), nullptr, nullptr});
    FAIL() << "a forward on a pipeline stage's model must be refused";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("holds the pipeline stage of layers [1, 3) only"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(m.set_pipeline_stage({2, 3, false, true}), std::exception);
  m.set_pipeline_stage({1, 3, false, true});
  const test::TmpDir tmp("trex_stage_shard_save_");
  const fs::path& dir = tmp.path;
  EXPECT_THROW(model::save_hf_checkpoint(m, (dir / "hf").string()), std::exception);
  train::AdamW o(m, {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f});
  EXPECT_THROW(train::save_checkpoint(dir.string(), m, o, train::TrainState{}, 1), std::exception);
}
