// Checkpoints and resume: 20 steps straight equal 10 steps + checkpoint + fresh process state +
// resume + 10 steps, bit for bit; a SIGKILL at random moments while checkpoints are being
// written always leaves a loadable newest checkpoint; retention keeps the last K.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include "core/parallel.h"
#include "core/rng.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "tests/unit/test_util.h"

using namespace trex;
namespace fs = std::filesystem;

namespace {

model::ModelConfig config(int64_t hidden = 32) {
  nlohmann::json j = {{"vocab_size", 71}, {"hidden_size", hidden}, {"num_hidden_layers", 3},
                      {"num_attention_heads", 2}, {"q_lora_rank", 18}, {"kv_lora_rank", 12},
                      {"qk_nope_head_dim", 8}, {"qk_rope_head_dim", 4}, {"v_head_dim", 6},
                      {"intermediate_size", 44}, {"moe_intermediate_size", 10}, {"n_routed_experts", 5},
                      {"n_shared_experts", 1}, {"num_experts_per_tok", 2}, {"first_k_dense_replace", 1},
                      {"initializer_range", 0.1}};
  return model::parse_config(j, "resume test config");
}

struct TrainRun {
  model::Model m;
  train::AdamW opt;
  Rng data;
  int64_t step = 0;
  TrainRun(const model::ModelConfig& c, uint64_t seed, kern::Prec p)
      : m(c, p), opt(m, {3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f}), data(99) {
    m.init_random(seed);
  }
  double train_step() {
    const int64_t B = 2, T = 9;
    std::vector<int32_t> ids(B * T), tg(B * T);
    for (auto& x : ids) x = data.next_u64() % m.cfg.vocab_size;
    for (auto& x : tg) x = data.next_u64() % m.cfg.vocab_size;
    ++step;
    return train::trainer_step(m, opt, {{B, T, ids.data(), tg.data(), nullptr, nullptr}}, 3e-3f, 1e-3f).loss;
  }
};

TEST(Resume, BitIdenticalLosses) {
  init_threads();
  for (kern::Prec prec : {kern::Prec::F32, kern::Prec::BF16}) {
    model::ModelConfig c = config();
    TrainRun straight(c, 5, prec);
    std::vector<double> a;
    for (int i = 0; i < 20; ++i) a.push_back(straight.train_step());

    test::TmpDir dir("trex_resume");
    std::vector<double> b;
    {
      TrainRun first(c, 5, prec);
      for (int i = 0; i < 10; ++i) b.push_back(first.train_step());
      train::save_checkpoint(dir.str(), first.m, first.opt, {first.step, first.step, first.data.state(), {}}, 2);
    }
    TrainRun second(c, 12345, prec);  // different init: everything must come from the checkpoint
    auto latest = train::latest_checkpoint(dir.str());
    ASSERT_TRUE(latest);
    train::TrainState st = train::load_checkpoint(*latest, second.m, second.opt);
    second.data = Rng::from_state(st.rng_state);
    second.step = st.step;
    EXPECT_EQ(st.step, 10);
    for (int i = 0; i < 10; ++i) b.push_back(second.train_step());
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i;
  }
}

TEST(Resume, RetentionKeepsLastK) {
  model::ModelConfig c = config();
  TrainRun r(c, 1, kern::Prec::F32);
  test::TmpDir dir("trex_keep");
  for (int s = 1; s <= 5; ++s) train::save_checkpoint(dir.str(), r.m, r.opt, {s, s, 7, {}}, 2);
  int n = 0;
  for (auto& e : fs::directory_iterator(dir.path / "checkpoints")) n += e.path().filename().string().rfind("step-", 0) == 0;
  EXPECT_EQ(n, 2);
  EXPECT_EQ(fs::path(*train::latest_checkpoint(dir.str())).filename(), "step-00000005");
}

TEST(Resume, SigkillDuringCheckpointWritesLeavesALoadableCheckpoint) {
  model::ModelConfig c = config(96);  // a few MB per checkpoint, so kills land mid-write
  Rng r(2024);
  for (int trial = 0; trial < 6; ++trial) {
    test::TmpDir dir("trex_kill");
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // Child: no OpenMP team after fork (libgomp is not fork-safe); write checkpoints forever.
      omp_set_num_threads(1);
      TrainRun w(c, 3, kern::Prec::F32);
      for (int64_t s = 1;; ++s) train::save_checkpoint(dir.str(), w.m, w.opt, {s, s, 11, {}}, 2);
    }
    // Wait for the first complete checkpoint, then kill at a random moment.
    for (int i = 0; i < 3000 && !train::latest_checkpoint(dir.str()); ++i) ::usleep(2000);
    ::usleep(1000 + r.next_u64() % 40000);
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    auto latest = train::latest_checkpoint(dir.str());
    ASSERT_TRUE(latest) << "trial " << trial;
    TrainRun back(c, 77, kern::Prec::F32);
    train::TrainState st;
    ASSERT_NO_THROW(st = train::load_checkpoint(*latest, back.m, back.opt)) << *latest;
    EXPECT_GE(st.step, 1);
    TrainRun ref(c, 3, kern::Prec::F32);
    EXPECT_EQ(0, std::memcmp(back.m.P(), ref.m.P(), ref.m.layout.total * sizeof(float))) << *latest;
  }
}

}  // namespace
