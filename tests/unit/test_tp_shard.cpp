// Tensor-parallel-sharded parameter layouts (model/params.h TpShard): what a tp rank allocates,
// initializes and loads. Tiny V3 (with and without q_lora, a dense first layer of width 54) and V4
// (6 heads in 3 output groups, an MTP block), cut over 3 tp ranks (and 2 where the sizes allow),
// alone and with an expert shard and a pipeline stage; each rank against the whole model, tensor
// by tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>

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
  nlohmann::json j;
  double mtp;                // TrainOptions::mtp_loss_weight (V4: trains the MTP block)
  std::vector<int64_t> tps;  // tp sizes that split this config
};

std::vector<Named> configs() {
  nlohmann::json v3 = tiny_v3();
  v3["num_attention_heads"] = 6;
  v3["intermediate_size"] = 54;
  nlohmann::json v3q = v3;  // q_proj instead of q_a / q_b
  v3q["q_lora_rank"] = nullptr;
  nlohmann::json v4 = tiny_v4();
  v4["num_attention_heads"] = 6;  // 3 output groups of 2 heads
  return {{"v3", v3, 0.0, {2, 3}}, {"v3 no q_lora", v3q, 0.0, {3}}, {"v4 mtp", v4, 0.3, {3}}};
}

// The tensors a tp-sharded layout splits, by rows (true) or columns (false).
std::map<std::string, bool> split_tensors(const model::ModelConfig& c) {
  std::map<std::string, bool> out;
  for (int64_t l = 0; l < c.num_hidden_layers + (c.is_v4() ? c.v4.mtp_layers : 0); ++l) {
    const std::string pre = l < c.num_hidden_layers ? "model.layers." + std::to_string(l) + "."
                                                    : "mtp." + std::to_string(l - c.num_hidden_layers) + ".";
    const std::string at = pre + "self_attn.";
    if (c.is_v4()) {
      out[at + "q_b_proj.weight"] = true;
      out[at + "o_a_proj.weight"] = true;
      out[at + "sinks"] = true;
      out[at + "o_b_proj.weight"] = false;
      continue;
    }
    out[at + (c.q_lora_rank ? "q_b_proj.weight" : "q_proj.weight")] = true;
    out[at + "kv_b_proj.weight"] = true;
    out[at + "o_proj.weight"] = false;
    if (!c.is_moe_layer(l)) {
      out[pre + "mlp.gate_proj.weight"] = true;
      out[pre + "mlp.up_proj.weight"] = true;
      out[pre + "mlp.down_proj.weight"] = false;
    }
  }
  return out;
}

}  // namespace

// A tp rank holds its rows of the column-parallel tensors and its columns of the row-parallel
// ones, after every other dense tensor in an aligned region; every other tensor whole, in the
// whole model's order. Over the tp ranks, every element of every split tensor is held exactly
// once. Sizes that do not split are refused.
TEST(TpShard, LayoutHoldsTheRanksSlices) {
  for (const Named& n : configs()) {
    SCOPED_TRACE(n.what);
    const model::ModelConfig c = model::with_mtp(model::parse_config(n.j, "tiny"), n.mtp > 0 ? 1 : 0);
    const model::ParamLayout whole = model::build_layout(c);
    EXPECT_FALSE(whole.tp_sharded());
    const std::map<std::string, bool> split = split_tensors(c);
    for (int64_t tp : n.tps) {
      std::map<std::string, std::vector<int>> seen;  // per split tensor: times each element is held
      for (int64_t r = 0; r < tp; ++r) {
        SCOPED_TRACE(::testing::Message() << "tp rank " << r << " of " << tp);
        const model::ParamLayout L = model::build_layout(c, {}, {}, {r, tp, 48});
        ASSERT_TRUE(L.tp_sharded());
        EXPECT_EQ(L.tp_begin % 48, 0);
        EXPECT_EQ(L.entries.size(), whole.entries.size());
        size_t prev = 0;
        for (const model::ParamEntry& e : L.entries) {
          const model::ParamEntry* w = whole.find(e.name);
          ASSERT_TRUE(w) << e.name;
          EXPECT_EQ(e.whole_shape(), w->shape) << e.name;
          EXPECT_EQ(e.decay, w->decay) << e.name;
          const auto it = split.find(e.name);
          if (it == split.end()) {  // whole, in the whole model's order, before the tp region
            EXPECT_FALSE(e.sliced()) << e.name;
            EXPECT_LT(e.offset, L.tp_begin) << e.name;
            EXPECT_GE(whole.index.at(e.name), prev) << e.name << ": not in the whole model's order";
            prev = whole.index.at(e.name);
            continue;
          }
          EXPECT_GE(e.offset, L.tp_begin) << e.name;
          EXPECT_EQ(e.shape.numel() * tp, w->shape.numel()) << e.name;
          EXPECT_EQ(e.rows_total > 0, it->second) << e.name;
          EXPECT_EQ(e.cols_total > 0, !it->second) << e.name;
          std::vector<int>& s = seen[e.name];
          s.resize((size_t)w->shape.numel());
          e.for_each_run([&](int64_t, int64_t wb, int64_t k) {
            for (int64_t i = wb; i < wb + k; ++i) ++s[(size_t)i];
          });
        }
        // Within the tp region, tensors do not overlap.
        std::vector<std::pair<int64_t, int64_t>> spans;
        for (const model::ParamEntry& e : L.entries)
          if (e.sliced()) spans.push_back({e.offset, e.offset + e.shape.numel()});
        std::sort(spans.begin(), spans.end());
        for (size_t i = 1; i < spans.size(); ++i) EXPECT_LE(spans[i - 1].second, spans[i].first);
        ASSERT_FALSE(spans.empty());
        EXPECT_LE(spans.back().second, L.total);
      }
      EXPECT_EQ(seen.size(), split.size());
      for (const auto& [name, s] : seen)
        for (size_t i = 0; i < s.size(); ++i) ASSERT_EQ(s[i], 1) << name << " element " << i;
    }
    EXPECT_THROW(model::build_layout(c, {}, {}, {0, 4, 16}), std::exception);  // 6 heads do not split by 4
    EXPECT_THROW(model::build_layout(c, {}, {}, {3, 3, 16}), std::exception);  // no rank 3 of 3
    EXPECT_THROW(model::build_layout(c, {}, {}, {0, 3, 24}), std::exception);  // not 64-byte aligned
  }
  nlohmann::json odd = tiny_v3();
  odd["num_attention_heads"] = 6;  // heads split by 3, the dense width 50 does not
  EXPECT_THROW(model::build_layout(model::parse_config(odd, "tiny"), {}, {}, {1, 3, 16}), std::exception);
}

// A tp rank's random init draws what the whole model draws for its slice; the weights loaded from
// a whole checkpoint (HF layout, V4's original release layout) and a training checkpoint's moments
// are the whole model's slices, alone and together with an expert shard and a pipeline stage.
TEST(TpShard, InitAndLoadGiveTheWholeModelsSlices) {
  for (const Named& n : configs()) {
    SCOPED_TRACE(n.what);
    const test::WholeCheckpoints w(model::parse_config(n.j, "tiny"), {0.01, n.mtp}, "trex_tp_shard_", /*perturb=*/true);
    const int64_t tp = n.tps.back();
    for (int64_t r = 0; r < tp; ++r)
      for (const bool more : {false, true}) {  // alone; with experts [0, 1) of 5 and the last of 2 stages
        SCOPED_TRACE(::testing::Message() << "tp rank " << r << " of " << tp << (more ? ", expert and stage shard" : ""));
        const model::ExpertShard ex = more ? model::ExpertShard{0, 1, 32} : model::ExpertShard{};
        const model::StageShard st = more ? model::StageShard{1, 3, false, true, 32} : model::StageShard{};
        w.expect_shard_matches(ex, st, {r, tp, 32});
      }
  }
}

// A tp slice alone cannot compute a forward, run as another tp rank, or be written as a whole
// checkpoint: each is refused instead of running on missing weights.
TEST(TpShard, ASliceAloneIsRefused) {
  nlohmann::json j = tiny_v3();
  j["num_attention_heads"] = 6;
  j["intermediate_size"] = 54;
  const model::ModelConfig c = model::parse_config(j, "tiny");
  model::Model m(c, kern::Prec::F32, {}, {}, {}, {1, 3, 16});
  m.init_random(3);
  std::vector<int32_t> ids(5, 1), tg(5, 2);
  try {
    m.forward({1, 5, ids.data(), tg.data(), nullptr, nullptr});
    FAIL() << "a forward on a tp slice's model must be refused";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("holds tensor-parallel slice 1 of 3 only"), std::string::npos) << e.what();
  }
  EXPECT_THROW(m.set_tensor_parallel(nullptr), std::exception);
  const test::TmpDir tmp("trex_tp_shard_save_");
  const fs::path& dir = tmp.path;
  EXPECT_THROW(model::save_hf_checkpoint(m, (dir / "hf").string()), std::exception);
  train::AdamW o(m, {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f});
  EXPECT_THROW(train::save_checkpoint(dir.string(), m, o, train::TrainState{}, 1), std::exception);
}
