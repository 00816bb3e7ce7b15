// The run loop behind `trex train`: config parsing with overrides and errors, CPT and SFT runs
// that lower the loss, and a run stopped at step 3 and resumed to step 6 that reproduces the
// straight run's losses bit for bit; a resume cuts metrics.jsonl back to the checkpoint's step and
// `trex plot` reads one record per step.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include "core/error.h"
#include "train/loop.h"
#include "train/metrics.h"
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

std::vector<int64_t> steps_of(const std::string& dir) {
  std::vector<int64_t> out;
  std::ifstream f(dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(f, line)) out.push_back(json::parse(line)["step"].get<int64_t>());
  return out;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
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
  EXPECT_NE(msg({"train.recompute=partial"}).find("none, full"), std::string::npos);
  EXPECT_EQ(msg({"train.recompute=selective"}), "");
  EXPECT_NE(msg({"extra.key=1"}).find("[extra]"), std::string::npos);
  EXPECT_NE(msg({"nodot"}).find("section.key=value"), std::string::npos);
  // The two fault bounds: the heartbeat's (dead peer) below the watchdog's (slow step).
  EXPECT_EQ(msg({"parallel.peer_timeout_s=5", "parallel.watchdog_s=7"}), "");
  EXPECT_EQ(msg({"parallel.peer_timeout_s=900", "parallel.watchdog_s=0"}), "");  // watchdog off
  EXPECT_NE(msg({"parallel.peer_timeout_s=0"}).find("parallel.peer_timeout_s = 0 must be > 0"), std::string::npos);
  EXPECT_NE(msg({"parallel.peer_timeout_s=-1"}).find("parallel.peer_timeout_s"), std::string::npos);
  EXPECT_NE(msg({"parallel.peer_timeout_s=30", "parallel.watchdog_s=30"})
                .find("parallel.peer_timeout_s = 30 must be < parallel.watchdog_s = 30"),
            std::string::npos);
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

// A run that died after step 5 with its newest checkpoint at step 3: metrics.jsonl holds steps
// 1-5 (and the start of step 6's line). --resume auto cuts it back to steps 1-3 before steps 4-6
// run again, so each step has one line, and the losses equal the straight run's.
TEST(TrainLoop, ResumeCutsMetricsBackToTheCheckpoint) {
  std::string data = write_corpus("trex_loop_cut.jsonl", false);
  test::TmpDir a("trex_loop_cut_a"), b("trex_loop_cut_b");
  run_training(parse_run_config(base_config(a.str(), data, "cpt"), "run.toml"), bytes_tok());
  run_training(parse_run_config(base_config(b.str(), data, "cpt"), "run.toml", {"train.steps=5"}), bytes_tok());
  // Keep only the step-3 checkpoint (the step-5 one is the final checkpoint of that shorter run).
  for (const auto& e : fs::directory_iterator(b.path / "checkpoints"))
    if (e.path().filename().string() != "step-00000003") fs::remove_all(e.path());
  { std::ofstream(b.file("metrics.jsonl"), std::ios::app) << "{\"step\": 6, \"lo"; }  // cut by a kill
  ASSERT_EQ(steps_of(a.str()).size(), 6u);
  run_training(parse_run_config(base_config(b.str(), data, "cpt"), "run.toml", {"checkpoint.resume=auto"}),
               bytes_tok());
  EXPECT_EQ(steps_of(b.str()), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(losses(a.str()), losses(b.str()));
  // A fresh run (no resume) starts the file over.
  run_training(parse_run_config(base_config(b.str(), data, "cpt"), "run.toml", {"train.steps=2"}), bytes_tok());
  EXPECT_EQ(steps_of(b.str()), (std::vector<int64_t>{1, 2}));
}

TEST(Metrics, TruncateKeepsStepsUpToTheResumedOne) {
  test::TmpDir d("trex_metrics_cut");
  const std::string f = d.file("metrics.jsonl");
  EXPECT_EQ(truncate_metrics(f, 3), 0);  // no file: nothing to do, nothing created
  EXPECT_FALSE(fs::exists(f));
  const std::string kept = "{\"step\":1,\"loss\":5.0}\n{\"step\":2,\"loss\":4.0}\n";
  { std::ofstream(f) << kept << "{\"step\":3,\"loss\":3.0}\n{\"step\":4,\"loss\":2.0}\n{\"step\":5,\"lo"; }
  EXPECT_EQ(truncate_metrics(f, 2), 3);
  EXPECT_EQ(read_text(f), kept);
  EXPECT_EQ(truncate_metrics(f, 2), 0);  // already cut: unchanged
  EXPECT_EQ(read_text(f), kept);
  EXPECT_EQ(truncate_metrics(f, 0), 2);
  EXPECT_EQ(read_text(f), "");
}

// trex plot's reader: one record per step, step order, the last line of a step wins (files
// written before resumes cut them back); a cut last line is skipped, a bad middle line is an error.
TEST(Metrics, ReadKeepsTheLastRecordOfEachStep) {
  test::TmpDir d("trex_metrics_read");
  const std::string f = d.file("metrics.jsonl");
  { std::ofstream(f) << "{\"step\":1,\"loss\":5.0}\n{\"step\":2,\"loss\":4.0}\n{\"step\":3,\"loss\":3.5}\n"
                        "{\"step\":2,\"loss\":4.25}\n{\"step\":3,\"loss\":3.0}\n{\"step\":4,\"lo"; }
  const std::vector<json> r = read_metrics(f);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0]["step"], 1);
  EXPECT_EQ(r[1]["loss"].get<double>(), 4.25);
  EXPECT_EQ(r[2]["loss"].get<double>(), 3.0);
  { std::ofstream(f) << "{\"step\":1,\"loss\":5.0}\nnot json\n{\"step\":2,\"loss\":4.0}\n"; }
  const std::string msg = test::user_error([&] { read_metrics(f); });
  EXPECT_NE(msg.find("metrics.jsonl:2: not a metrics record"), std::string::npos) << msg;
  EXPECT_NE(test::user_error([&] { read_metrics(d.file("none.jsonl")); }).find("cannot open"), std::string::npos);
}

}  // namespace
