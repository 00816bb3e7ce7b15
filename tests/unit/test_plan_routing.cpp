// Measured routing as a planner input (plan/routing.h): uniform loads give the forced-balance
// plan exactly; one hot expert makes the ep rank holding it set the pace; expert ranges split
// across ranks when the counts do not divide; the reader takes a real tiny run's metrics.jsonl
// ([log] expert_loads = true) and, without that key, falls back to the scalar balance.
#include <gtest/gtest.h>

#include <fstream>
#include <numeric>
#include <nlohmann/json.hpp>
#include "core/error.h"
#include "core/parallel.h"
#include "plan/planner.h"
#include "plan/report.h"
#include "plan/routing.h"
#include "train/loop.h"
#include "train/metrics.h"
#include "train/run_config.h"
#include "tests/unit/test_util.h"

using namespace trex;
using namespace trex::plan;
using nlohmann::json;

namespace {

constexpr const char* kLayout = "pp=2,vp=4,ep=32,gbs=4096,recompute=selective,overlap=ep+dp";

std::string write_loads(const test::TmpDir& dir, const std::string& name, const json& layers) {
  const std::string path = dir.file(name);
  std::ofstream(path) << json{{"expert_loads", layers}}.dump();
  return path;
}

Plan v3(const Routing* r) {
  return evaluate(resolve_model("deepseek-v3"), load_spec("h800"), 256, parse_layout(kLayout, Layout{}), 0, r);
}

}  // namespace

TEST(PlanRouting, UniformLoadsEqualForcedBalance) {
  test::TmpDir dir("trex_routing");
  // An all-zero layer (one another pipeline stage ran) is left out.
  const Routing r = read_routing(write_loads(
      dir, "u.json", {std::vector<int>(256, 1000), std::vector<int>(256, 0), std::vector<int>(256, 7)}));
  EXPECT_EQ(r.experts, 256);
  EXPECT_EQ(r.loads.size(), 2u);
  for (int64_t ep : {1, 2, 8, 32, 256}) EXPECT_DOUBLE_EQ(routing_expert_load(r, ep), 1.0) << ep;
  const Plan forced = v3(nullptr), measured = v3(&r);
  EXPECT_DOUBLE_EQ(measured.layout.expert_load, 1.0);
  EXPECT_DOUBLE_EQ(measured.time.step, forced.time.step);
  EXPECT_DOUBLE_EQ(measured.time.tokens_per_s, forced.time.tokens_per_s);
}

TEST(PlanRouting, HotExpertsRankBoundsTheStep) {
  test::TmpDir dir("trex_routing");
  std::vector<double> hot(256, 100.0);
  hot[37] = 100.0 * 50;  // rank 4 of 32 (experts 32..39) holds it
  const Routing r = read_routing(write_loads(dir, "hot.json", {hot}));
  const double total = std::accumulate(hot.begin(), hot.end(), 0.0);
  const double rank4 = 7 * 100.0 + 5000.0;
  EXPECT_NEAR(busiest_rank_share(hot, 32), rank4 / (total / 32), 1e-12);
  EXPECT_NEAR(routing_expert_load(r, 32), rank4 / (total / 32), 1e-12);
  // More ranks: the hot expert's rank carries a larger multiple of the mean; one rank: balanced.
  EXPECT_GT(busiest_rank_share(hot, 256), busiest_rank_share(hot, 32));
  EXPECT_DOUBLE_EQ(busiest_rank_share(hot, 1), 1.0);
  const Plan forced = v3(nullptr), measured = v3(&r);
  EXPECT_NEAR(measured.layout.expert_load, rank4 / (total / 32), 1e-12);
  // The expert GEMMs and the all-to-all of the busiest rank scale with its share (up to the
  // pipeline stages rebalancing around the heavier MoE layers); the step slows.
  const double gemm_ratio = measured.time.experts / forced.time.experts;
  EXPECT_GT(gemm_ratio, 0.9 * measured.layout.expert_load);
  EXPECT_LE(gemm_ratio, measured.layout.expert_load + 1e-9);
  EXPECT_GT(measured.time.comm_ep, forced.time.comm_ep);
  EXPECT_GT(measured.time.step, forced.time.step);
  EXPECT_LT(measured.time.tokens_per_s, forced.time.tokens_per_s);
  const std::string table = format_routing_compare(forced, measured);
  EXPECT_NE(table.find("forced balance"), std::string::npos);
  EXPECT_NE(table.find("expert GEMMs"), std::string::npos);
}

TEST(PlanRouting, ExpertRangesSplitWhenCountsDoNotDivide) {
  // 7 experts over 2 ranks: rank 0 holds experts 0..2 and half of 3.
  const std::vector<double> l = {1, 1, 1, 9, 1, 1, 1};  // total 15, mean rank 7.5
  EXPECT_NEAR(busiest_rank_share(l, 2), (3 + 4.5) / 7.5, 1e-12);
  // 10 measured experts over 4 ranks (2.5 each): rank 1 holds half of 2, 3, 4.
  const std::vector<double> m = {0, 0, 4, 4, 4, 0, 0, 0, 0, 0};
  EXPECT_NEAR(busiest_rank_share(m, 4), (2 + 4 + 4) / 3.0, 1e-12);
}

TEST(PlanRouting, ReaderRefusesWhatItCannotUse) {
  test::TmpDir dir("trex_routing");
  const std::string ragged = write_loads(dir, "ragged.json", {{1, 2, 3}, {1, 2}});
  EXPECT_THROW(read_routing(ragged), UserError);
  const std::string neg = write_loads(dir, "neg.json", {{1, -2, 3}});
  EXPECT_THROW(read_routing(neg), UserError);
  const std::string none = dir.file("none.json");
  std::ofstream(none) << json{{"step", 1}, {"loss", 2.0}}.dump() << "\n";
  EXPECT_THROW(read_routing(none), UserError);
  EXPECT_THROW(read_routing(dir.file("missing.jsonl")), UserError);
}

namespace {

json tiny_v3() {
  return {{"model_type", "deepseek_v3"}, {"vocab_size", 260}, {"hidden_size", 45}, {"num_hidden_layers", 3},
          {"first_k_dense_replace", 1}, {"intermediate_size", 37}, {"moe_intermediate_size", 11},
          {"n_routed_experts", 10}, {"n_shared_experts", 1}, {"num_experts_per_tok", 3}, {"n_group", 5},
          {"topk_group", 3}, {"topk_method", "noaux_tc"}, {"scoring_func", "sigmoid"}, {"norm_topk_prob", true},
          {"routed_scaling_factor", 2.5}, {"num_attention_heads", 5}, {"num_key_value_heads", 5},
          {"q_lora_rank", 13}, {"kv_lora_rank", 11}, {"qk_nope_head_dim", 6}, {"qk_rope_head_dim", 4},
          {"v_head_dim", 7}, {"max_position_embeddings", 64}, {"rope_theta", 10000.0}, {"rms_norm_eps", 1e-6},
          {"tie_word_embeddings", false}, {"initializer_range", 0.2}};
}

std::vector<json> train_tiny(const std::string& run_dir, const std::string& data, bool expert_loads) {
  json j;
  j["model"] = tiny_v3();
  j["data"] = {{"mode", "cpt"}, {"train", {data}}, {"seq_len", 19}};
  j["train"] = {{"steps", 3}, {"batch_size", 3}, {"precision", "fp32"}, {"seed", 7}};
  j["optim"] = {{"lr", 1e-3}};
  j["checkpoint"] = {{"run_dir", run_dir}};
  j["log"] = {{"expert_loads", expert_loads}, {"progress", "lines"}};
  train::TokenizerFns bytes;
  bytes.encode = [](std::string_view s) {
    std::vector<int32_t> v;
    for (unsigned char ch : s) v.push_back(ch);
    return v;
  };
  bytes.eos_id = 256;
  bytes.pad_id = 257;
  train::run_training(train::parse_run_config(j, "run.toml"), bytes);
  return train::read_metrics(run_dir + "/metrics.jsonl");
}

}  // namespace

TEST(PlanRouting, ReadsARealRunsMetrics) {
  init_threads();
  test::TmpDir dir("trex_routing");
  const std::string data = dir.file("corpus.jsonl");
  {
    std::ofstream f(data);
    for (int i = 0; i < 60; ++i) f << json{{"text", "item " + std::to_string(i) + " costs " + std::to_string(7 * i)}}.dump() << "\n";
  }
  // Opt-in: per MoE layer (2 of 3 layers) the tokens each of the 10 experts received, 3 each.
  const std::vector<json> recs = train_tiny(dir.str() + "/on", data, true);
  ASSERT_EQ(recs.size(), 3u);
  for (const json& r : recs) {
    ASSERT_TRUE(r.contains("expert_loads"));
    ASSERT_EQ(r["expert_loads"].size(), 2u);
    for (const json& layer : r["expert_loads"]) {
      ASSERT_EQ(layer.size(), 10u);
      int64_t sum = 0;
      for (const json& x : layer) sum += x.get<int64_t>();
      EXPECT_EQ(sum, r["tokens"].get<int64_t>() * 3);
    }
  }
  const Routing on = read_routing(dir.str() + "/on/metrics.jsonl");
  EXPECT_EQ(on.experts, 10);
  EXPECT_EQ(on.loads.size(), 6u);
  EXPECT_EQ(on.steps, 3);
  EXPECT_GE(on.scalar, 1.0);
  // The busiest rank's share lies between balance and the busiest expert's (one expert per rank).
  EXPECT_GE(routing_expert_load(on, 2), 1.0);
  EXPECT_LE(routing_expert_load(on, 2), routing_expert_load(on, 10) + 1e-12);
  EXPECT_NEAR(routing_expert_load(on, 10), on.scalar, 1e-9);
  // Default: no per-expert record; the reader falls back to the scalar.
  const std::vector<json> off = train_tiny(dir.str() + "/off", data, false);
  for (const json& r : off) EXPECT_FALSE(r.contains("expert_loads"));
  const Routing sc = read_routing(dir.str() + "/off/metrics.jsonl");
  EXPECT_TRUE(sc.loads.empty());
  EXPECT_NEAR(sc.scalar, on.scalar, 1e-9);  // same seed, same run
  EXPECT_DOUBLE_EQ(routing_expert_load(sc, 8), sc.scalar);
}
