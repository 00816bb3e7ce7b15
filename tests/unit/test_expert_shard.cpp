// Expert-sharded parameter layouts (model/params.h ExpertShard): what an expert-parallel rank
// allocates, initializes and loads. Tiny V3 (per-expert tensors) and V4 (merged [E, ...] tensors,
// MTP block) with 6 experts, cut into shards of 2 and of 3; each shard against the whole model,
// tensor by tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"
#include "model/checkpoint.h"
#include "tests/tiny_configs.h"
#include "tests/unit/shard_checks.h"
#include "tests/unit/test_util.h"
#include "train/checkpoint.h"
#include "train/optimizer.h"
#include "train/trainer.h"

using namespace trex;
using namespace trex::testing;
using trex::test::expect_slices_of;
namespace fs = std::filesystem;

namespace {

model::ModelConfig six(nlohmann::json j) {
  j["n_routed_experts"] = 6;
  return model::parse_config(j, "tiny");
}

std::vector<model::ModelConfig> configs() { return {six(tiny_v3()), six(tiny_v4())}; }

bool is_expert(const std::string& name) { return name.find(".mlp.experts.") != std::string::npos; }

}  // namespace

// The dense tensors keep their shapes and order; the experts move into a region of their own at
// the end, aligned, holding exactly the shard's experts; the shards together hold every expert once.
TEST(ExpertShard, LayoutHoldsTheShardsExpertsAtTheEnd) {
  for (const model::ModelConfig& c : configs()) {
    SCOPED_TRACE(c.model_type);
    const model::ParamLayout whole = model::build_layout(c);
    EXPECT_FALSE(whole.expert_sharded());
    int64_t whole_expert = 0;
    for (const model::ParamEntry& e : whole.entries)
      if (is_expert(e.name)) whole_expert += e.shape.numel();
    for (int64_t per : {2, 3}) {
      std::map<std::string, std::set<int64_t>> rows;  // V4: rows of each merged tensor held by some shard
      std::set<std::string> names;
      for (int64_t first = 0; first < 6; first += per) {
        const model::ParamLayout L = model::build_layout(c, {first, per, 48});
        ASSERT_TRUE(L.expert_sharded());
        EXPECT_EQ(L.expert_begin % 48, 0);
        EXPECT_EQ(L.expert_first, first);
        EXPECT_EQ(L.expert_count, per);
        std::vector<std::string> dense_w, dense_s;
        for (const model::ParamEntry& e : whole.entries)
          if (!is_expert(e.name)) dense_w.push_back(e.name);
        int64_t held = 0;
        for (const model::ParamEntry& e : L.entries) {
          if (!is_expert(e.name)) {
            dense_s.push_back(e.name);
            EXPECT_LT(e.offset, L.expert_begin) << e.name;
            EXPECT_EQ(e.shape, whole.find(e.name)->shape) << e.name;
            continue;
          }
          EXPECT_GE(e.offset, L.expert_begin) << e.name;
          EXPECT_LE(e.offset + e.shape.numel(), L.total) << e.name;
          held += e.shape.numel();
          names.insert(e.name);
          if (c.is_v4()) {
            EXPECT_EQ(e.rows_total, 6) << e.name;
            EXPECT_EQ(e.rows_first, first) << e.name;
            EXPECT_EQ(e.shape[0], per) << e.name;
            for (int64_t r = 0; r < per; ++r) EXPECT_TRUE(rows[e.name].insert(first + r).second) << e.name;
          } else {
            const int64_t x = model::expert_of_name(e.name);
            EXPECT_TRUE(x >= first && x < first + per) << e.name;
          }
        }
        EXPECT_EQ(dense_s, dense_w) << "dense tensors in the whole model's order";
        EXPECT_EQ(held * (6 / per), whole_expert);
      }
      std::set<std::string> want;
      for (const model::ParamEntry& e : whole.entries)
        if (is_expert(e.name)) want.insert(e.name);
      EXPECT_EQ(names, want) << "the shards hold every expert tensor";
      for (const auto& [n, r] : rows) EXPECT_EQ(r.size(), 6u) << n;
    }
    EXPECT_THROW(model::build_layout(c, {1, 2, 16}), std::exception);  // not at a multiple of the count
    EXPECT_THROW(model::build_layout(c, {4, 4, 16}), std::exception);  // past the last expert
    EXPECT_THROW(model::build_layout(c, {0, 2, 24}), std::exception);  // region not 64-byte aligned
  }
  EXPECT_EQ(model::expert_of_name("model.layers.2.mlp.experts.13.up_proj.weight"), 13);
  EXPECT_EQ(model::expert_of_name("model.layers.2.mlp.shared_experts.up_proj.weight"), -1);
}

// A shard's random init draws what the whole model draws for its tensors; the weights loaded from
// a whole checkpoint (HF layout, and V4's original release layout) and a training checkpoint's
// moments are the whole model's rows.
TEST(ExpertShard, InitAndLoadGiveTheWholeModelsRows) {
  for (const model::ModelConfig& c : configs()) {
    SCOPED_TRACE(c.model_type);
    const test::WholeCheckpoints w(c, {0.01, c.is_v4() ? 0.3 : 0.0}, "trex_expert_shard_");
    for (int64_t per : {2, 3})
      for (int64_t first = 0; first < 6; first += per) {
        SCOPED_TRACE(::testing::Message() << "shard [" << first << ", " << first + per << ")");
        w.expect_shard_matches({first, per, 16});
      }
  }
}

// A shard alone cannot compute (its other experts live on other ranks) or be written as a whole
// checkpoint: both are refused instead of running on missing weights.
TEST(ExpertShard, AShardAloneIsRefused) {
  const model::ModelConfig c = six(tiny_v3());
  model::Model m(c, kern::Prec::F32, {}, {2, 2, 16});
  m.init_random(3);
  std::vector<int32_t> ids(5, 1), tg(5, 2);
  try {
    m.forward({1, 5, ids.data(), tg.data(), nullptr, nullptr});
    FAIL() << "a forward on an expert shard without its expert-parallel group must be refused";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("holds routed experts [2, 4) only"), std::string::npos) << e.what();
  }
  const test::TmpDir tmp("trex_expert_shard_save_");
  const fs::path& dir = tmp.path;
  EXPECT_THROW(model::save_hf_checkpoint(m, (dir / "hf").string()), std::exception);
  train::AdamW o(m, {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f});
  EXPECT_THROW(train::save_checkpoint(dir.string(), m, o, train::TrainState{}, 1), std::exception);
}
