// Numerical guard: a step whose gradients hold a NaN (injected) changes nothing (weights, AdamW
// moments, router biases), is reported as skipped, and the next step trains normally; the
// training loop counts skipped steps and stops after train.max_skipped_steps in a row.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include "core/error.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "model/model.h"
#include "train/loop.h"
#include "train/optimizer.h"
#include "train/run_config.h"
#include "train/trainer.h"
#include "tests/unit/test_util.h"

using namespace trex;
using nlohmann::json;

namespace {

json tiny_v4() {
  return {{"model_type", "deepseek_v4"}, {"vocab_size", 53}, {"hidden_size", 18}, {"num_hidden_layers", 2},
          {"num_attention_heads", 3}, {"head_dim", 10}, {"partial_rotary_factor", 0.4}, {"q_lora_rank", 7},
          {"o_groups", 3}, {"o_lora_rank", 5}, {"moe_intermediate_size", 6}, {"n_routed_experts", 5},
          {"num_experts_per_tok", 2}, {"sliding_window", 5},
          {"compress_rates", {{"compressed_sparse_attention", 3}, {"heavily_compressed_attention", 7}}},
          {"layer_types", {"compressed_sparse_attention", "heavily_compressed_attention"}},
          {"mlp_layer_types", {"hash_moe", "moe"}}, {"index_n_heads", 3}, {"index_head_dim", 6}, {"index_topk", 2},
          {"hc_mult", 3}, {"hc_sinkhorn_iters", 4}, {"initializer_range", 0.2}, {"num_nextn_predict_layers", 0}};
}

TEST(NanGuard, InjectedNanStepChangesNothingAndTrainingContinues) {
  init_threads();
  model::Model m(model::parse_config(tiny_v4(), "tiny"), kern::Prec::BF16);
  m.init_random(5);
  train::AdamW opt(m, {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f});
  Rng r(3);
  std::vector<int32_t> ids(2 * 21), tg(2 * 21);
  for (auto& x : ids) x = (int32_t)(r.next_u64() % 53);
  for (auto& x : tg) x = (int32_t)(r.next_u64() % 53);
  model::Batch b{2, 21, ids.data(), tg.data(), nullptr, nullptr};
  train::StepStats s0 = train::trainer_step(m, opt, {b}, 1e-2f, 0.01f);
  ASSERT_FALSE(s0.skipped);
  const std::vector<float> p(m.P(), m.P() + m.layout.total), bias = m.buffers;
  const std::vector<bf16> pb = m.params_bf16;
  train::StepStats s1 = train::trainer_step(m, opt, {b}, 1e-2f, 0.01f, nullptr, /*inject_nan=*/true);
  EXPECT_TRUE(s1.skipped);
  EXPECT_FALSE(std::isfinite(s1.grad_norm));
  EXPECT_EQ(0, std::memcmp(p.data(), m.P(), p.size() * sizeof(float)));
  EXPECT_EQ(bias, m.buffers);
  EXPECT_EQ(0, std::memcmp(pb.data(), m.params_bf16.data(), pb.size() * sizeof(bf16)));
  // The next step runs from the same weights and moments as if the bad step never happened.
  train::StepStats s2 = train::trainer_step(m, opt, {b}, 1e-2f, 0.01f);
  EXPECT_FALSE(s2.skipped);
  EXPECT_TRUE(std::isfinite(s2.loss));
  EXPECT_EQ(s2.loss, s1.loss);  // same weights, same batch
  EXPECT_NE(0, std::memcmp(p.data(), m.P(), p.size() * sizeof(float)));
}

json run_config(const std::string& dir, const std::string& data) {
  json j;
  j["model"] = tiny_v4();
  j["model"]["vocab_size"] = 260;
  j["data"] = {{"mode", "cpt"}, {"train", {data}}, {"seq_len", 24}, {"eval_fraction", 0.1}};
  j["train"] = {{"steps", 4}, {"batch_size", 2}, {"precision", "fp32"}, {"seed", 7}};
  j["optim"] = {{"lr", 1e-3}};
  j["checkpoint"] = {{"dir", dir}};
  return j;
}

TEST(NanGuard, LoopCountsSkippedStepsAndStopsAfterTooMany) {
  init_threads();
  test::TmpDir dir("trex_nan_guard");
  const std::string data = dir.file("corpus.jsonl");
  {
    std::ofstream f(data);
    for (int i = 0; i < 40; ++i) f << json{{"text", "item " + std::to_string(i) + " costs " + std::to_string(3 * i)}}.dump() << "\n";
  }
  train::TokenizerFns bytes;
  bytes.encode = [](std::string_view s) {
    std::vector<int32_t> v;
    for (unsigned char ch : s) v.push_back(ch);
    return v;
  };
  bytes.eos_id = 256;
  bytes.pad_id = 257;
  setenv("TREX_INJECT_NAN_STEP", "2", 1);
  train::TrainResult res = train::run_training(train::parse_run_config(run_config(dir.str() + "/a", data), "run.toml"), bytes);
  EXPECT_EQ(res.steps, 4);
  EXPECT_EQ(res.skipped_steps, 1);
  EXPECT_TRUE(std::isfinite(res.last_loss));
  EXPECT_THROW(train::run_training(train::parse_run_config(run_config(dir.str() + "/b", data), "run.toml",
                                                           {"train.max_skipped_steps=1"}),
                                   bytes),
               UserError);
  unsetenv("TREX_INJECT_NAN_STEP");
}

}  // namespace
