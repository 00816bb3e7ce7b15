// The run loop behind `trex train`: config parsing with overrides and errors, CPT and SFT runs
// that lower the loss, and a run stopped at step 3 and resumed to step 6 that reproduces the
// straight run's losses bit for bit.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include "core/error.h"
#include "train/loop.h"
#include "tests/run_config_error.h"
#include "tests/unit/test_util.h"

using namespace trex;
using namespace trex::train;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::vector<int32_t> byte_encode(std::string_view s) {
  std::vector<int32_t> out;
  for (unsigned char c : s) out.push_back(c);
  return out;
}
TokenizerFns bytes_tok() { return {byte_encode, 256, 257, ""}; }

json base_config(const std::string& dir, const std::string& data, const std::string& mode) {
  return {{"model",
           {{"vocab_size", 260}, {"hidden_size", 32}, {"num_hidden_layers", 2}, {"num_attention_heads", 2},
            {"q_lora_rank", 16}, {"kv_lora_rank", 12}, {"qk_nope_head_dim", 8}, {"qk_rope_head_dim", 4},
            {"v_head_dim", 8}, {"intermediate_size", 48}, {"moe_intermediate_size", 12}, {"n_routed_experts", 4},
            {"n_shared_experts", 1}, {"num_experts_per_tok", 2}, {"first_k_dense_replace", 1},
            {"initializer_range", 0.05}}},
          {"data", {{"mode", mode}, {"train", {data}}, {"seq_len", 48}, {"eval_fraction", 0.2}}},
          {"train", {{"batch_size", 2}, {"grad_accum", 2}, {"steps", 6}, {"precision", "fp32"}, {"eval_every", 3}}},
          {"optim", {{"lr", 3e-3}, {"warmup_steps", 2}, {"schedule", "cosine"}}},
          {"checkpoint", {{"dir", dir}, {"every", 3}, {"keep", 2}}},
          {"log", {{"progress", "lines"}}}};
}

std::string write_corpus(const std::string& name, bool sft) {
  fs::path p = fs::temp_directory_path() / name;
  std::ofstream f(p);
  for (int i = 0; i < 40; ++i) {
    std::string a = "item " + std::to_string(i) + " costs " + std::to_string(3 * i + 1) + " dollars";
    if (sft)
      f << json{{"messages", {{{"role", "user"}, {"content", "price of item " + std::to_string(i)}},
                              {{"role", "assistant"}, {"content", a}}}}}.dump()
        << "\n";
    else
      f << json{{"text", a + ". The next item is cheaper."}}.dump() << "\n";
  }
  return p.string();
}

std::vector<double> losses(const std::string& dir) {
  std::vector<double> out;
  std::ifstream f(dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(f, line)) out.push_back(json::parse(line)["loss"].get<double>());
  return out;
}

TEST(TrainLoop, ConfigOverridesAndErrors) {
  json j = base_config("/tmp/x", "a.jsonl", "cpt");
  RunConfig r = parse_run_config(j, "run.toml", {"optim.lr=0.5", "data.mode=sft", "train.steps=9"});
  EXPECT_DOUBLE_EQ(r.optim.schedule.lr, 0.5);
  EXPECT_EQ(r.data.mode, "sft");
  EXPECT_EQ(r.optim.schedule.total_steps, 9);
  auto msg = [&](std::vector<std::string> ov) { return trex::testing::run_config_error(j, ov); };
  EXPECT_NE(msg({"train.stpes=3"}).find("train.stpes"), std::string::npos);
  EXPECT_NE(msg({"train.stpes=3"}).find("steps"), std::string::npos);  // the hint lists the allowed keys
  EXPECT_NE(msg({"data.mode=pretrain"}).find("cpt, sft"), std::string::npos);
  EXPECT_NE(msg({"optim.schedule=exp"}).find("wsd"), std::string::npos);
  EXPECT_NE(msg({"train.batch_size=0"}).find("train.batch_size"), std::string::npos);
  EXPECT_EQ(msg({"parallel.tp=2"}), "");  // tensor parallel: checked against the world at launch
  EXPECT_EQ(msg({"parallel.pp=2"}), "");  // pipeline parallel: checked against the world at launch
  EXPECT_NE(msg({"parallel.pp_layers=3"}).find("parallel.pp_layers must be a list"), std::string::npos);
  EXPECT_NE(msg({"parallel.pp_layers=[1, -1]"}).find("pp_layers"), std::string::npos);
  EXPECT_NE(msg({"train.recompute=selective"}).find("none, full"), std::string::npos);
  EXPECT_NE(msg({"extra.key=1"}).find("[extra]"), std::string::npos);
  EXPECT_NE(msg({"nodot"}).find("section.key=value"), std::string::npos);
}

TEST(TrainLoop, CptAndSftLowerTheLoss) {
  for (const char* mode : {"cpt", "sft"}) {
    test::TmpDir dir(std::string("trex_loop_") + mode);
    std::string data = write_corpus(std::string("trex_loop_") + mode + ".jsonl", std::string(mode) == "sft");
    RunConfig r = parse_run_config(base_config(dir.str(), data, mode), "run.toml",
                                   {"train.steps=12", std::string("data.seq_len=") + (std::string(mode) == "sft" ? "128" : "48")});
    TrainResult res = run_training(r, bytes_tok());
    EXPECT_EQ(res.steps, 12);
    EXPECT_LT(res.last_loss, res.first_loss) << mode;
    EXPECT_GE(res.last_eval_loss, 0) << mode;
    EXPECT_TRUE(fs::exists(fs::path(res.last_checkpoint) / "model.safetensors"));
    EXPECT_EQ(losses(dir.str()).size(), 12u);
  }
}

TEST(TrainLoop, StopAndResumeReproducesTheStraightRun) {
  std::string data = write_corpus("trex_loop_resume.jsonl", false);
  test::TmpDir a("trex_loop_a"), b("trex_loop_b");
  run_training(parse_run_config(base_config(a.str(), data, "cpt"), "run.toml"), bytes_tok());
  run_training(parse_run_config(base_config(b.str(), data, "cpt"), "run.toml", {"train.steps=3"}), bytes_tok());
  run_training(parse_run_config(base_config(b.str(), data, "cpt"), "run.toml", {"checkpoint.resume=auto"}),
               bytes_tok());
  std::vector<double> la = losses(a.str()), lb = losses(b.str());
  ASSERT_EQ(la.size(), 6u);
  ASSERT_EQ(lb.size(), 6u);
  for (size_t i = 0; i < la.size(); ++i) EXPECT_EQ(la[i], lb[i]) << "step " << i + 1;
}

}  // namespace
