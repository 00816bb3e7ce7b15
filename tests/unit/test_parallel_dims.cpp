// ParallelDims: coordinates, groups, stage split, and every validation error (message checked).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <string>

#include "core/error.h"
#include "model/config.h"
#include "parallel/dims.h"
#include "train/layout.h"

using trex::UserError;
using trex::model::ModelConfig;
using trex::parallel::ParallelDims;

namespace {

ModelConfig tiny_moe() {
  ModelConfig c;
  c.num_attention_heads = 16;
  c.num_hidden_layers = 7;
  c.n_routed_experts = 30;
  c.first_k_dense_replace = 1;
  c.intermediate_size = 96;
  c.moe_intermediate_size = 24;
  return c;
}

ParallelDims dims(int dp, int tp, int pp, int ep) {
  ParallelDims d;
  d.dp = dp;
  d.tp = tp;
  d.pp = pp;
  d.ep = ep;
  return d;
}

// The UserError message of trex::train::validate_layout(), or "" when it passes. Checks the hint is not empty.
std::string validate_msg(const ParallelDims& d, int world, const ModelConfig& c) {
  try {
    trex::train::validate_layout(d, world, c);
  } catch (const UserError& e) {
    EXPECT_FALSE(e.hint.empty()) << e.what();
    return e.what();
  }
  return "";
}

#define EXPECT_MSG(d, world, cfg, sub)                                       \
  do {                                                                       \
    std::string m_ = validate_msg(d, world, cfg);                            \
    EXPECT_NE(m_.find(sub), std::string::npos) << "message: '" << m_ << "'"; \
  } while (0)

}  // namespace

TEST(ParallelDims, RankOrderTpFastestThenDpThenPp) {
  ParallelDims d = dims(3, 2, 2, 1);
  ASSERT_EQ(d.world(), 12);
  for (int r = 0; r < 12; ++r) {
    auto c = d.coord(r);
    EXPECT_EQ(d.rank_of(c.tp, c.dp, c.pp), r);
  }
  auto c = d.coord(7);
  EXPECT_EQ(c.tp, 1);
  EXPECT_EQ(c.dp, 0);
  EXPECT_EQ(c.pp, 1);
  EXPECT_EQ(d.rank_of(1, 2, 0), 5);
  EXPECT_EQ(d.rank_of(0, 0, 1), 6);
}

TEST(ParallelDims, ExplicitGroups) {
  ParallelDims d = dims(2, 2, 2, 1);
  using V = std::vector<int>;
  EXPECT_EQ(d.tp_group(5), (V{4, 5}));
  EXPECT_EQ(d.dp_group(5), (V{5, 7}));
  EXPECT_EQ(d.pp_group(5), (V{1, 5}));
  // ep inside dp: dp=4, ep=2 -> ep groups are consecutive dp ranks, edp groups strided by ep.
  ParallelDims e = dims(4, 1, 1, 2);
  EXPECT_EQ(e.edp(), 2);
  EXPECT_EQ(e.ep_group(0), (V{0, 1}));
  EXPECT_EQ(e.ep_group(3), (V{2, 3}));
  EXPECT_EQ(e.edp_group(0), (V{0, 2}));
  EXPECT_EQ(e.edp_group(3), (V{1, 3}));
  EXPECT_EQ(e.coord(3).ep, 1);
  EXPECT_EQ(e.coord(3).edp, 1);
  // With tp: dp ranks of tp rank 1 are 1, 3, 5, 7 (world 8 = tp 2 x dp 4).
  ParallelDims f = dims(4, 2, 1, 2);
  EXPECT_EQ(f.ep_group(3), (V{1, 3}));
  EXPECT_EQ(f.edp_group(3), (V{3, 7}));
  EXPECT_EQ(f.dp_group(3), (V{1, 3, 5, 7}));
}

TEST(ParallelDims, GroupsPartitionTheWorld) {
  for (ParallelDims d : {dims(6, 2, 2, 3), dims(3, 1, 3, 3), dims(4, 3, 1, 2), dims(5, 1, 1, 1), dims(1, 1, 1, 1)}) {
    const int W = d.world();
    struct G {
      const char* name;
      std::vector<int> (ParallelDims::*fn)(int) const;
      int size;
    };
    const G gs[] = {{"tp", &ParallelDims::tp_group, d.tp},
                    {"dp", &ParallelDims::dp_group, d.dp},
                    {"pp", &ParallelDims::pp_group, d.pp},
                    {"ep", &ParallelDims::ep_group, d.ep},
                    {"edp", &ParallelDims::edp_group, d.edp()}};
    for (const G& g : gs) {
      std::set<std::vector<int>> distinct;
      for (int r = 0; r < W; ++r) {
        auto m = (d.*g.fn)(r);
        EXPECT_EQ(static_cast<int>(m.size()), g.size) << g.name << " " << d.str();
        EXPECT_TRUE(std::is_sorted(m.begin(), m.end()));
        EXPECT_NE(std::find(m.begin(), m.end(), r), m.end()) << g.name << " group of " << r << " lacks it";
        for (int o : m) EXPECT_EQ((d.*g.fn)(o), m) << g.name << ": members disagree on their group";
        distinct.insert(m);
      }
      EXPECT_EQ(static_cast<int>(distinct.size()) * g.size, W) << g.name << " groups do not partition " << d.str();
    }
    // Coordinates inside each group: the group rank is the coordinate.
    for (int r = 0; r < W; ++r) {
      auto c = d.coord(r);
      auto tpg = d.tp_group(r), dpg = d.dp_group(r), epg = d.ep_group(r), edpg = d.edp_group(r);
      EXPECT_EQ(tpg[c.tp], r);
      EXPECT_EQ(dpg[c.dp], r);
      EXPECT_EQ(d.pp_group(r)[c.pp], r);
      EXPECT_EQ(epg[c.ep], r);
      EXPECT_EQ(edpg[c.edp], r);
    }
  }
}

// Context parallel: tp fastest, then cp, then dp, then pp; every group partitions the world and
// a rank's coordinate is its rank in each group.
TEST(ParallelDims, ContextParallelRankOrderAndGroups) {
  using V = std::vector<int>;
  ParallelDims d = dims(2, 1, 2, 1);  // dp 2 x pp 2
  d.cp = 3;                           // world 12: rank = cp + 3 (dp + 2 pp)
  ASSERT_EQ(d.world(), 12);
  for (int r = 0; r < 12; ++r) {
    const auto c = d.coord(r);
    EXPECT_EQ(d.rank_of(c.tp, c.dp, c.pp, c.cp), r);
    EXPECT_EQ(d.cp_group(r)[c.cp], r);
    EXPECT_EQ(d.dp_group(r)[c.dp], r);
    EXPECT_EQ(d.pp_group(r)[c.pp], r);
  }
  EXPECT_EQ(d.coord(7).cp, 1);
  EXPECT_EQ(d.coord(7).dp, 0);
  EXPECT_EQ(d.coord(7).pp, 1);
  EXPECT_EQ(d.cp_group(7), (V{6, 7, 8}));
  EXPECT_EQ(d.dp_group(7), (V{7, 10}));
  EXPECT_EQ(d.pp_group(7), (V{1, 7}));
  // ep inside dp, of one cp rank: dp 4, ep 2, cp 2 (world 8).
  ParallelDims e = dims(4, 1, 1, 2);
  e.cp = 2;
  EXPECT_EQ(e.ep_group(3), (V{1, 3}));
  EXPECT_EQ(e.edp_group(3), (V{3, 7}));
  EXPECT_EQ(e.cp_group(3), (V{2, 3}));
  EXPECT_EQ(e.str(), "dp=4 tp=1 pp=1 ep=2 cp=2 (edp=2, world=8)");
  // tp 2 x cp 2 x pp 2 (world 8): the ranks holding one tp slice, of every stage and of one stage
  // (tensor-parallel memory sharding, with pipeline sharding), any cp rank.
  ParallelDims f = dims(1, 2, 2, 1);
  f.cp = 2;
  EXPECT_EQ(f.tp_slice_group(5), (V{1, 3, 5, 7}));
  EXPECT_EQ(f.stage_tp_slice_group(5), (V{5, 7}));
  EXPECT_EQ(f.stage_tp_slice_group(2), (V{0, 2}));
  try {
    e.validate_world(4);
    FAIL() << "no error";
  } catch (const UserError& x) {
    EXPECT_NE(std::string(x.what()).find("parallel.tp * parallel.cp * parallel.pp * parallel.dp = 1 * 2 * 1 * 4 = 8"),
              std::string::npos) << x.what();
  }
}

TEST(ParallelDims, StageLayers) {
  using V = std::vector<int>;
  EXPECT_EQ(dims(1, 1, 3, 1).stage_layers(7), (V{2, 3, 2}));
  EXPECT_EQ(dims(1, 1, 4, 1).stage_layers(10), (V{2, 3, 3, 2}));  // middle stages first
  EXPECT_EQ(dims(1, 1, 4, 1).stage_layers(11), (V{3, 3, 3, 2}));  // then the first stage
  EXPECT_EQ(dims(1, 1, 2, 1).stage_layers(5), (V{3, 2}));
  EXPECT_EQ(dims(1, 1, 1, 1).stage_layers(5), (V{5}));
  auto v = dims(1, 1, 16, 1).stage_layers(61);
  EXPECT_EQ(std::accumulate(v.begin(), v.end(), 0), 61);
  EXPECT_EQ(v.front(), 3);
  EXPECT_EQ(v.back(), 3);
  ParallelDims d = dims(1, 1, 3, 1);
  d.pp_layers = {1, 5, 1};
  EXPECT_EQ(d.stage_layers(7), (V{1, 5, 1}));
  EXPECT_EQ(d.stage_first_layer(7, 2), 6);
  EXPECT_EQ(validate_msg(d, 3, tiny_moe()), "");
  d.pp_layers = {0, 7, 0};  // edges may be empty
  EXPECT_EQ(validate_msg(d, 3, tiny_moe()), "");
}

TEST(ParallelDims, ValidLayoutsPass) {
  ModelConfig c = tiny_moe();
  EXPECT_EQ(validate_msg(dims(1, 1, 1, 1), 1, c), "");
  EXPECT_EQ(validate_msg(dims(2, 1, 1, 2), 2, c), "");
  EXPECT_EQ(validate_msg(dims(3, 2, 1, 3), 6, c), "");
  EXPECT_EQ(validate_msg(dims(6, 2, 2, 6), 24, c), "");
  ModelConfig v4 = c;
  v4.model_type = "deepseek_v4";
  v4.num_attention_heads = 64;
  EXPECT_EQ(validate_msg(dims(1, 8, 1, 1), 8, v4), "");
  EXPECT_MSG(dims(1, 3, 1, 1), 3, v4, "parallel.tp = 3 does not divide model num_attention_heads = 64");
  v4.v4.o_groups = 12;  // V4 splits whole output groups too
  EXPECT_MSG(dims(1, 8, 1, 1), 8, v4, "parallel.tp = 8 does not divide model o_groups = 12");
  EXPECT_EQ(validate_msg(dims(1, 4, 1, 1), 4, v4), "");
}

TEST(ParallelDims, WorldSizeMismatch) {
  EXPECT_MSG(dims(3, 1, 1, 1), 4, tiny_moe(), "parallel.tp * parallel.pp * parallel.dp = 1 * 1 * 3 = 3");
  EXPECT_MSG(dims(3, 1, 1, 1), 4, tiny_moe(), "the run has 4 ranks");
  try {
    trex::train::validate_layout(dims(2, 2, 1, 1), 8, tiny_moe());
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(e.hint.find("mpirun -np 4"), std::string::npos) << e.hint;
  }
}

TEST(ParallelDims, SizesBelowOne) {
  EXPECT_MSG(dims(1, 0, 1, 1), 0, tiny_moe(), "parallel.tp = 0 must be >= 1");
  EXPECT_MSG(dims(-1, 1, 1, 1), 1, tiny_moe(), "parallel.dp = -1 must be >= 1");
  EXPECT_MSG(dims(1, 1, 0, 1), 1, tiny_moe(), "parallel.pp = 0 must be >= 1");
  EXPECT_MSG(dims(1, 1, 1, 0), 1, tiny_moe(), "parallel.ep = 0 must be >= 1");
}

TEST(ParallelDims, EpMustDivideDp) {
  EXPECT_MSG(dims(3, 1, 1, 2), 3, tiny_moe(), "parallel.ep = 2 does not divide parallel.dp = 3");
}

TEST(ParallelDims, HeadsAndWidthMustDivideByTp) {
  EXPECT_MSG(dims(1, 3, 1, 1), 3, tiny_moe(), "parallel.tp = 3 does not divide model num_attention_heads = 16");
  ModelConfig c = tiny_moe();
  c.intermediate_size = 100;
  EXPECT_MSG(dims(1, 8, 1, 1), 8, c, "parallel.tp = 8 does not divide model intermediate_size = 100");
  c.first_k_dense_replace = 0;  // all MoE: the dense width does not matter
  EXPECT_EQ(validate_msg(dims(1, 8, 1, 1), 8, c), "");
}

TEST(ParallelDims, ExpertsMustDivideByEp) {
  EXPECT_MSG(dims(4, 1, 1, 4), 4, tiny_moe(), "parallel.ep = 4 does not divide model n_routed_experts = 30");
  ModelConfig dense = tiny_moe();
  dense.n_routed_experts = 0;
  EXPECT_MSG(dims(2, 1, 1, 2), 2, dense, "parallel.ep = 2 but the model has no routed experts");
  EXPECT_EQ(validate_msg(dims(2, 1, 1, 1), 2, dense), "");
}

TEST(ParallelDims, PipelineStages) {
  ModelConfig c = tiny_moe();
  c.num_hidden_layers = 3;
  EXPECT_MSG(dims(1, 1, 4, 1), 4, c, "parallel.pp = 4 exceeds model num_hidden_layers = 3");
  ParallelDims d = dims(1, 1, 3, 1);
  d.pp_layers = {1, 1};
  EXPECT_MSG(d, 3, tiny_moe(), "parallel.pp_layers has 2 entries but parallel.pp = 3");
  d.pp_layers = {2, 2, 2};
  EXPECT_MSG(d, 3, tiny_moe(), "parallel.pp_layers sum to 6 but model num_hidden_layers = 7");
  d.pp_layers = {3, 0, 4};
  EXPECT_MSG(d, 3, tiny_moe(), "parallel.pp_layers[1] = 0 is not allowed for stage 1 of 3");
  d.pp_layers = {-1, 4, 4};
  EXPECT_MSG(d, 3, tiny_moe(), "parallel.pp_layers[0] = -1 is not allowed");
}

TEST(ParallelDims, CoordinateChecks) {
  ParallelDims d = dims(2, 1, 1, 1);
  EXPECT_THROW(d.coord(2), trex::Error);
  EXPECT_THROW(d.rank_of(0, 2, 0), trex::Error);
  EXPECT_EQ(d.str(), "dp=2 tp=1 pp=1 ep=1 (edp=2, world=2)");
  EXPECT_EQ(dims(4, 1, 1, 2).first_expert(30, 1), 15);
  EXPECT_EQ(dims(4, 1, 1, 2).experts_per_rank(30), 15);
}
