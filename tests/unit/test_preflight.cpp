// Start-up checks (train/preflight.h): a run that cannot fit in memory or write its checkpoints
// is refused before any data is read or any weight allocated.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include "core/error.h"
#include "model/params.h"
#include "parallel/dims.h"
#include "train/loop.h"
#include "train/preflight.h"
#include "train/run_config.h"
#include "tests/tiny_configs.h"
#include "tests/unit/test_util.h"

using namespace trex;
using json = nlohmann::json;

namespace {

// DeepSeek-V3's published shape (671B parameters): far beyond any machine these tests run on.
json v3_671b() {
  return {{"model_type", "deepseek_v3"}, {"vocab_size", 129280}, {"hidden_size", 7168},
          {"num_hidden_layers", 61}, {"first_k_dense_replace", 3}, {"intermediate_size", 18432},
          {"moe_intermediate_size", 2048}, {"n_routed_experts", 256}, {"n_shared_experts", 1},
          {"num_experts_per_tok", 8}, {"n_group", 8}, {"topk_group", 4}, {"num_attention_heads", 128},
          {"q_lora_rank", 1536}, {"kv_lora_rank", 512}, {"qk_nope_head_dim", 128},
          {"qk_rope_head_dim", 64}, {"v_head_dim", 128}};
}


}  // namespace

TEST(Preflight, EstimateParts) {
  json j = {{"model", v3_671b()}, {"data", {{"seq_len", 4096}}}, {"train", {{"batch_size", 1}}}};
  train::RunConfig rc = train::parse_run_config(j, "run.toml");
  const double P = (double)rc.model.num_params();
  train::MemoryEstimate e1 = train::estimate_train_memory(rc, 1), e8 = train::estimate_train_memory(rc, 8);
  EXPECT_DOUBLE_EQ(e1.weights, 6 * P);  // f32 master + bf16 shadow
  EXPECT_DOUBLE_EQ(e1.grads, 4 * P);
  EXPECT_DOUBLE_EQ(e1.optimizer, 8 * P);
  EXPECT_DOUBLE_EQ(e8.optimizer, P);     // ZeRO-1 over 8 ranks
  {  // Expert parallel: a rank holds its ep rank's routed experts only (weights and gradients); the
     // moments of everything are sharded over all ranks as before.
    train::RunConfig re = rc;
    re.parallel.ep = 8;
    const model::ModelConfig& c = re.model;
    const double routed = (double)(c.num_hidden_layers - c.first_k_dense_replace) * (double)c.n_routed_experts * 3.0 *
                          (double)c.hidden_size * (double)c.moe_intermediate_size;
    const double held = P - routed * (1.0 - 1.0 / 8);
    const train::MemoryEstimate ee = train::estimate_train_memory(re, 8);
    EXPECT_DOUBLE_EQ(ee.grads, 4 * held);
    EXPECT_DOUBLE_EQ(ee.weights, 6 * held);
    EXPECT_DOUBLE_EQ(ee.optimizer, P);
    EXPECT_LT(held, 0.2 * P);  // DeepSeek-V3: the routed experts are most of the model
  }
  {  // Pipeline parallel: a rank holds its stage's tensors only (the estimate counts the larger
     // stage); the moments of a stage are sharded over that stage's ranks.
    train::RunConfig rp = rc;
    rp.parallel.pp = 2;
    parallel::ParallelDims d;
    d.pp = 2;
    const int64_t cut = d.stage_layers(rc.model.num_hidden_layers)[0];
    double s0 = 0, s1 = 0;  // stage 0: the embedding and layers [0, cut); stage 1: the rest
    for (const model::ParamEntry& en : model::build_layout(rc.model).entries) {
      const bool first = en.name == "model.embed_tokens.weight" ||
                         (en.name.rfind("model.layers.", 0) == 0 && std::atoll(en.name.c_str() + 13) < cut);
      (first ? s0 : s1) += (double)en.shape.numel();
    }
    EXPECT_DOUBLE_EQ(s0 + s1, P);
    const train::MemoryEstimate ep = train::estimate_train_memory(rp, 8);  // 2 stages of 4 ranks
    EXPECT_DOUBLE_EQ(ep.grads, 4 * std::max(s0, s1));
    EXPECT_DOUBLE_EQ(ep.weights, 6 * std::max(s0, s1));
    EXPECT_DOUBLE_EQ(ep.optimizer, 8 * std::max(s0, s1) / 4);
  }
  {  // Tensor parallel: a rank holds its slice of the attention's q_b / kv_b / o and the dense
     // MLPs (1 / tp of them); the moments of a slice are sharded over its dp ranks (the same share).
    train::RunConfig rt = rc;
    rt.parallel.tp = 8;
    const model::ModelConfig& c = rt.model;
    const double H = (double)c.num_attention_heads, d = (double)c.hidden_size;
    const double attn = H * (double)c.qk_head_dim() * (double)c.q_lora_rank +
                        H * (double)(c.qk_nope_head_dim + c.v_head_dim) * (double)c.kv_lora_rank +
                        d * H * (double)c.v_head_dim;
    const double split = (double)c.num_hidden_layers * attn +
                         (double)c.first_k_dense_replace * 3.0 * d * (double)c.intermediate_size;
    const double held = P - split * (1.0 - 1.0 / 8);
    const train::MemoryEstimate et = train::estimate_train_memory(rt, 8);
    EXPECT_DOUBLE_EQ(et.grads, 4 * held);
    EXPECT_DOUBLE_EQ(et.weights, 6 * held);
    EXPECT_DOUBLE_EQ(et.optimizer, P);
  }
  EXPECT_GT(e1.activations, 4.0 * 4096 * 129280);  // at least the logits chunk
  // Twice the tokens, about twice the activations: not exactly, as the LM head workspace (at most
  // 32 MiB) does not scale (train/preflight.h).
  rc.data.seq_len = 8192;
  EXPECT_NEAR(train::estimate_train_memory(rc, 1).activations, 2 * e1.activations, 0.02 * e1.activations);
  rc.train.precision = kern::Prec::F32;
  EXPECT_DOUBLE_EQ(train::estimate_train_memory(rc, 1).weights, 4 * P);
  EXPECT_GT(machine_memory_bytes(), 0);
}

// ZeRO-2 (parallel.zero_stage = 2): a rank holds its shard of the gradients, the accumulator's
// with gradient accumulation, and during a backward at most the largest layer's gradients and
// the buckets at its edges and in flight (docs/PARALLEL.md, "ZeRO-2"); never more than ZeRO-1.
TEST(Preflight, Zero2HoldsTheShardAndOneLayer) {
  json j = {{"model", v3_671b()}, {"data", {{"seq_len", 4096}}}, {"train", {{"batch_size", 1}}}};
  train::RunConfig rc = train::parse_run_config(j, "run.toml");
  const double P = (double)rc.model.num_params();
  auto layer = [&](const train::RunConfig& r, const std::string& prefix) {
    double n = 0;
    const model::ExpertShard ex = r.parallel.ep > 1 ? model::ExpertShard{0, r.model.n_routed_experts / r.parallel.ep, 16}
                                                    : model::ExpertShard{};
    for (const model::ParamEntry& en : model::build_layout(r.model, ex).entries)
      if (en.name.rfind(prefix, 0) == 0) n += (double)en.shape.numel();
    return n;
  };
  const double moe = layer(rc, "model.layers.3."), dense = layer(rc, "model.layers.0.");
  ASSERT_GT(moe, 10 * dense);  // DeepSeek-V3: an MoE layer is the largest block
  ASSERT_GT(moe, 4.0 * 7168 * 129280);  // (larger than the embedding and the head too)
  const double bucket = 4.0 * (double)rc.parallel.bucket_size;
  rc.parallel.zero_stage = 2;
  const train::MemoryEstimate e8 = train::estimate_train_memory(rc, 8);
  EXPECT_DOUBLE_EQ(e8.optimizer, P);
  EXPECT_NEAR(e8.grads, 4 * P / 8 + 4 * moe + 4 * bucket, 1e-9 * P);
  rc.train.grad_accum = 3;  // the accumulator: a second shard
  EXPECT_NEAR(train::estimate_train_memory(rc, 8).grads, 2 * 4 * P / 8 + 4 * moe + 4 * bucket, 1e-9 * P);
  rc.train.grad_accum = 1;
  EXPECT_DOUBLE_EQ(train::estimate_train_memory(rc, 1).grads, 4 * P);  // one rank: nothing sharded
  EXPECT_NEAR(train::estimate_train_memory(rc, 2).grads, 4 * P / 2 + 4 * moe + 4 * bucket, 1e-9 * P);
  {  // Expert parallel: the largest block is the rank's layer, its ep rank's experts only.
    train::RunConfig re = rc;
    re.parallel.ep = 8;
    const train::MemoryEstimate ee = train::estimate_train_memory(re, 16);
    EXPECT_NEAR(ee.grads, 4 * P / 16 + 4 * layer(re, "model.layers.3.") + 4 * bucket, 1e-9 * P);
    re.parallel.zero_stage = 1;
    EXPECT_LT(ee.grads, 0.5 * train::estimate_train_memory(re, 16).grads);
  }
  {  // The MPI library's copies: of the 2 reduce-scatters ZeRO-2 keeps in flight, not of the backward's.
    train::RunConfig r1 = rc;
    r1.parallel.zero_stage = 1;
    EXPECT_LT(e8.buffers, train::estimate_train_memory(r1, 8).buffers - 2 * P);
  }
  {  // Pipeline parallel with a tied head: the embedding the first and last stage share stays whole.
    train::RunConfig rp = rc;
    rp.parallel.pp = 2;
    rp.model.tie_word_embeddings = true;
    const train::MemoryEstimate ep = train::estimate_train_memory(rp, 8);
    const double vd = (double)rp.model.vocab_size * (double)rp.model.hidden_size;
    EXPECT_NEAR(ep.grads, ep.optimizer / 2 + 4 * (vd + moe) + 4 * bucket, 1e-9 * P);
    rp.model.tie_word_embeddings = false;
    const train::MemoryEstimate eu = train::estimate_train_memory(rp, 8);
    EXPECT_NEAR(eu.grads, eu.optimizer / 2 + 4 * moe + 4 * bucket, 1e-9 * P);
  }
  rc.parallel.bucket_size = int64_t{1} << 40;  // never above ZeRO-1's whole gradients
  EXPECT_DOUBLE_EQ(train::estimate_train_memory(rc, 8).grads, 4 * P);
  rc.parallel.bucket_size = 0;  // one bucket: all of the gradients are written before any is sent
  EXPECT_DOUBLE_EQ(train::estimate_train_memory(rc, 8).grads, 4 * P);
}

TEST(Preflight, TooLargeForThisMachineIsRefusedBeforeAnyWork) {
  test::TmpDir dir("trex_preflight");
  json j = {{"model", v3_671b()},
            {"data", {{"train", {(dir.path / "missing.jsonl").string()}}, {"seq_len", 4096}}},
            {"checkpoint", {{"dir", (dir.path / "run").string()}}}};
  train::RunConfig rc = train::parse_run_config(j, "big.toml");
  const auto t0 = std::chrono::steady_clock::now();
  const std::string m =
      test::user_error([&] { train::run_training(rc, train::TokenizerFns{}); }, /*with_hint=*/true);
  // Refused on the estimate: the missing data file is never opened, no weight is allocated.
  EXPECT_NE(m.find("the run needs about"), std::string::npos) << m;
  EXPECT_NE(m.find("but this machine has"), std::string::npos) << m;
  EXPECT_NE(m.find("train.batch_size"), std::string::npos) << m;
  EXPECT_EQ(m.find("missing.jsonl"), std::string::npos) << m;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  // memory_check = false lets it through to the next problem (the data file).
  rc.train.memory_check = false;
  const std::string m2 =
      test::user_error([&] { train::run_training(rc, train::TokenizerFns{}); }, /*with_hint=*/true);
  EXPECT_NE(m2.find("missing.jsonl"), std::string::npos) << m2;
}

// Ranks started on one machine share its memory: the check counts each of them.
TEST(Preflight, RanksOnOneMachineShareItsMemory) {
  json mc = {{"model_type", "deepseek_v3"}, {"vocab_size", 1000}, {"hidden_size", 96}, {"num_hidden_layers", 3},
            {"first_k_dense_replace", 1}, {"intermediate_size", 200}, {"moe_intermediate_size", 40},
            {"n_routed_experts", 6}, {"n_shared_experts", 1}, {"num_experts_per_tok", 2}, {"n_group", 1},
            {"topk_group", 1}, {"num_attention_heads", 3}, {"q_lora_rank", 48}, {"kv_lora_rank", 24},
            {"qk_nope_head_dim", 16}, {"qk_rope_head_dim", 8}, {"v_head_dim", 16}};
  json j = {{"model", mc}, {"data", {{"seq_len", 4096}}}, {"train", {{"batch_size", 1}}}};
  const train::RunConfig rc = train::parse_run_config(j, "run.toml");
  const double one = train::estimate_train_memory(rc, 1).total(), have = available_memory_bytes();
  ASSERT_GT(have, 0);
  EXPECT_LE(have, machine_memory_bytes());
  // Ranks that fit now; halved and doubled, as other processes' memory moves while tests run.
  const int fit = (int)(have / one);
  ASSERT_GE(fit, 2) << "one rank of the test model needs " << one << " bytes; " << have << " available";
  EXPECT_NO_THROW(train::check_memory(rc, 1, fit / 2));
  const std::string m = test::user_error([&] { train::check_memory(rc, 1, 2 * fit); }, /*with_hint=*/true);
  EXPECT_NE(m.find("for the " + std::to_string(2 * fit) + " ranks on this machine"), std::string::npos) << m;
  EXPECT_NE(m.find("start fewer ranks on each machine"), std::string::npos) << m;
}

// A refusal that sharded gradients would lift names parallel.zero_stage = 2 (CPU ranks, ZeRO-1),
// with the per-rank figure; a run already on ZeRO-2, or on a GPU (no ZeRO-2 there), is not told so.
TEST(Preflight, RefusalNamesZero2WhenItFits) {
  json mc = {{"model_type", "deepseek_v3"}, {"vocab_size", 32000}, {"hidden_size", 512}, {"num_hidden_layers", 3},
             {"first_k_dense_replace", 1}, {"intermediate_size", 1024}, {"moe_intermediate_size", 512},
             {"n_routed_experts", 64}, {"n_shared_experts", 1}, {"num_experts_per_tok", 2}, {"n_group", 1},
             {"topk_group", 1}, {"num_attention_heads", 4}, {"q_lora_rank", 64}, {"kv_lora_rank", 32},
             {"qk_nope_head_dim", 32}, {"qk_rope_head_dim", 16}, {"v_head_dim", 32}};
  json j = {{"model", mc}, {"data", {{"seq_len", 256}}}, {"train", {{"batch_size", 1}}}};
  const train::RunConfig rc = train::parse_run_config(j, "run.toml");
  train::RunConfig r2 = rc;
  r2.parallel.zero_stage = 2;
  const int ranks = 64;
  const double one = train::estimate_train_memory(rc, ranks).total(), two = train::estimate_train_memory(r2, ranks).total();
  ASSERT_LT(two, 0.8 * one);  // the gradients and the MPI copies of every bucket: most of the model's memory
  const double have = available_memory_bytes();
  ASSERT_GT(have, 0);
  // Ranks on this machine for which ZeRO-1 does not fit and ZeRO-2 does (a margin of 5% of the
  // memory on both sides, as other processes' memory moves while tests run).
  const int local = (int)(0.95 * have / two);
  ASSERT_GT(local * one, 1.05 * have) << "one rank needs " << one << " bytes, " << two << " with ZeRO-2; " << have
                                      << " available";
  const std::string m = test::user_error([&] { train::check_memory(rc, ranks, local); }, /*with_hint=*/true);
  EXPECT_NE(m.find("set parallel.zero_stage = 2 (the gradients sharded over the ranks: about "), std::string::npos) << m;
  EXPECT_NO_THROW(train::check_memory(r2, ranks, local));
  train::RunConfig gpu = rc;
  gpu.train.device = "cuda";
  const std::string mg = test::user_error([&] { train::check_memory(gpu, ranks, local); }, /*with_hint=*/true);
  EXPECT_EQ(mg.find("zero_stage"), std::string::npos) << mg;
  // Where even ZeRO-2 does not fit, the hint does not name it.
  const std::string m3 = test::user_error([&] { train::check_memory(rc, ranks, (int)(1.1 * have / two) + 1); },
                                          /*with_hint=*/true);
  EXPECT_EQ(m3.find("zero_stage"), std::string::npos) << m3;
}

TEST(Preflight, UnwritableRunDirectoryIsRefused) {
  test::TmpDir dir("trex_preflight");
  const std::string file = (dir.path / "a_file").string();
  std::ofstream(file) << "x";
  const std::string m =
      test::user_error([&] { train::check_run_dir_writable(file + "/run"); }, /*with_hint=*/true);
  EXPECT_NE(m.find("checkpoint.run_dir '" + file + "/run'"), std::string::npos) << m;
  EXPECT_NE(m.find("cannot create"), std::string::npos) << m;
  EXPECT_NO_THROW(train::check_run_dir_writable((dir.path / "ok" / "deeper").string()));
}

// The refusal's hint names the selective modules of the model's family: DeepSeek-V4's "mhc" and
// "mla_up_proj" when the run does not use them yet, never for another model.
TEST(Preflight, HintNamesTheModelsRecomputeModules) {
  auto refusal = [](const json& model, const std::string& recompute, const json& modules) {
    json j = {{"model", model}, {"data", {{"seq_len", 1 << 22}}}, {"train", {{"recompute", recompute}}}};
    if (!modules.is_null()) j["train"]["recompute_modules"] = modules;
    const train::RunConfig rc = train::parse_run_config(j, "long.toml");
    return test::user_error([&] { train::check_memory(rc, 1); }, /*with_hint=*/true);
  };
  const json v4 = trex::testing::tiny_v4();
  for (const std::string& m : {refusal(v4, "none", nullptr), refusal(v4, "selective", {"moe"})})
    EXPECT_NE(m.find("recompute_modules = [\"moe\", \"mhc\", \"mla_up_proj\"]"), std::string::npos) << m;
  const std::string all = refusal(v4, "selective", {"moe", "mhc", "mla_up_proj"});
  EXPECT_EQ(all.find("\"mhc\""), std::string::npos) << all;
  EXPECT_NE(all.find("train.recompute = \"full\""), std::string::npos) << all;
  const std::string v3 = refusal(v3_671b(), "none", nullptr);
  EXPECT_NE(v3.find("recompute_modules = [\"moe\"]"), std::string::npos) << v3;
  EXPECT_EQ(v3.find("\"mhc\""), std::string::npos) << v3;
}

// The refusal names the fastest module set that fits: no MoE replay when its estimate fits, the
// replayed blocks when only they fit, nothing (then "full") when neither does. (On these tiny
// models either set may be the smaller: weights dominate.)
TEST(Preflight, FastestFittingRecomputeModules) {
  for (const json& model : {trex::testing::tiny_v4(), trex::testing::tiny_v3()})
    for (const int seq : {1031, 4099}) {
      const bool v4 = model["model_type"] == "deepseek_v4";
      json j = {{"model", model}, {"data", {{"seq_len", seq}}}, {"train", {{"recompute", "none"}}}};
      const train::RunConfig rc = train::parse_run_config(j, "long.toml");
      auto total = [&](unsigned mods) {
        train::RunConfig r = rc;
        r.train.recompute = model::Recompute::Selective;
        r.train.recompute_modules = mods;
        return train::estimate_train_memory(r, 1).total();
      };
      const unsigned extra = v4 ? model::kRecomputeMhc | model::kRecomputeMlaUpProj : 0u;
      const unsigned fast_m = model::kRecomputeMoeAct | model::kRecomputeMoeOut | model::kRecomputeSharedExperts | extra;
      const double fast = total(fast_m), replay = total(model::kRecomputeMoe | extra);
      const std::string fast_s = v4 ? "[\"moe_act\", \"moe_out\", \"shared_experts\", \"mla_up_proj\", \"mhc\"]"
                                    : "[\"moe_act\", \"moe_out\", \"shared_experts\"]";
      const std::string replay_s = v4 ? "[\"moe\", \"mla_up_proj\", \"mhc\"]" : "[\"moe\"]";
      const std::string where = model["model_type"].get<std::string>() + " seq " + std::to_string(seq);
      EXPECT_EQ(train::fitting_recompute_modules(rc, 1, 1, fast), fast_s) << where;
      EXPECT_EQ(train::fitting_recompute_modules(rc, 1, 2, 2 * fast), fast_s) << where << ": two ranks";
      EXPECT_NE(train::fitting_recompute_modules(rc, 1, 2, fast), fast_s) << where << ": two ranks";
      if (replay < fast) {
        EXPECT_EQ(train::fitting_recompute_modules(rc, 1, 1, (fast + replay) / 2), replay_s) << where;
      }
      EXPECT_EQ(train::fitting_recompute_modules(rc, 1, 1, std::min(fast, replay) - 1), "") << where;
      train::RunConfig sel = rc;  // a run already on the fast set: the replay when it fits, else nothing
      sel.train.recompute = model::Recompute::Selective;
      sel.train.recompute_modules = fast_m;
      EXPECT_EQ(train::fitting_recompute_modules(sel, 1, 1, fast), replay <= fast ? replay_s : "") << where;
    }
}
