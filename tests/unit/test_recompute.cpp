// Full activation recompute (TrainOptions::recompute, [train] recompute = "full"): the replayed
// layer forwards rebuild exactly the activations the backward needs, so the loss, every gradient
// and the expert loads are bitwise those of a step that kept them, in fp32 and bf16, on tiny
// DeepSeek-V3 (dense + MoE layers, aux loss) and DeepSeek-V4 (hash routing, CSA / HCA / sliding,
// an MTP block) configs with odd sizes and packed rows; the activation peak is lower.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "model/model.h"
#include "train/run_config.h"
#include "tests/tiny_configs.h"

using namespace trex;
using nlohmann::json;

namespace {

struct Run {
  model::LossParts loss;
  std::vector<float> grads;
  model::ExpertLoad load;
  size_t peak = 0;
};

Run step(const json& mj, kern::Prec prec, model::Recompute rc, double mtp) {
  model::Model m(model::parse_config(mj, "tiny"), prec, {0.01, mtp, rc});
  m.init_random(7);
  const int64_t B = 2, T = 17, N = B * T;
  std::vector<int32_t> ids(N), tg(N), seg(N);
  Rng r(3);
  for (int64_t i = 0; i < N; ++i) {
    ids[i] = (int32_t)(r.next_u64() % m.cfg.vocab_size);
    tg[i] = i % 5 == 2 ? -100 : (int32_t)(r.next_u64() % m.cfg.vocab_size);
    seg[i] = (int32_t)((i % T) < 9 ? 0 : 1);  // two documents in every row
  }
  Run out;
  out.loss = m.forward_backward({B, T, ids.data(), tg.data(), nullptr, seg.data()});
  out.grads.assign(m.G(), m.G() + m.layout.total);
  out.load = m.expert_load();
  out.peak = m.peak_activation_bytes();
  return out;
}

void expect_same_step(const json& mj, kern::Prec prec, double mtp) {
  const Run keep = step(mj, prec, model::Recompute::None, mtp);
  const Run full = step(mj, prec, model::Recompute::Full, mtp);
  EXPECT_EQ(keep.loss.loss, full.loss.loss);
  EXPECT_EQ(keep.loss.aux, full.loss.aux) << "the replay must not add the aux loss again";
  EXPECT_EQ(keep.loss.mtp, full.loss.mtp);
  EXPECT_EQ(keep.load, full.load) << "the replay must not count the expert loads again";
  ASSERT_EQ(keep.grads.size(), full.grads.size());
  EXPECT_EQ(0, std::memcmp(keep.grads.data(), full.grads.data(), keep.grads.size() * sizeof(float)))
      << "gradients differ";
  double norm = 0;
  for (float g : keep.grads) norm += (double)g * g;
  EXPECT_GT(norm, 0.0);
  EXPECT_LT(full.peak, keep.peak) << "recompute must lower the activation peak";
  std::printf("[recompute] %s %s: activation peak %zu -> %zu bytes\n", mj["model_type"].get<std::string>().c_str(),
              prec == kern::Prec::BF16 ? "bf16" : "fp32", keep.peak, full.peak);
}

json deeper_v3() {  // 5 layers (1 dense + 4 MoE) so that kept inputs are well below the saved activations
  json m = trex::testing::tiny_v3();
  m["num_hidden_layers"] = 5;
  return m;
}

json deeper_v4() {
  json m = trex::testing::tiny_v4();
  m["num_hidden_layers"] = 5;
  m["layer_types"] = {"compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention",
                      "compressed_sparse_attention", "sliding_attention"};
  m["mlp_layer_types"] = {"hash_moe", "moe", "moe", "moe", "moe"};
  return m;
}

}  // namespace

TEST(Recompute, FullIsBitwiseTheSameV3) {
  expect_same_step(deeper_v3(), kern::Prec::F32, 0);
  expect_same_step(deeper_v3(), kern::Prec::BF16, 0);
}

TEST(Recompute, FullIsBitwiseTheSameV4WithMtp) {
  expect_same_step(deeper_v4(), kern::Prec::F32, 0.3);
  expect_same_step(deeper_v4(), kern::Prec::BF16, 0.3);
}

// Forward only (eval) under full recompute keeps nothing of the layers it has passed.
TEST(Recompute, ForwardOnlyGivesTheSameLoss) {
  for (const json& mj : {deeper_v3(), deeper_v4()}) {
    const model::ModelConfig cfg = model::parse_config(mj, "tiny");
    model::Model a(cfg, kern::Prec::F32, {0.01, 0, model::Recompute::None});
    model::Model b(cfg, kern::Prec::F32, {0.01, 0, model::Recompute::Full});
    a.init_random(5), b.init_random(5);
    std::vector<int32_t> ids(23), tg(23);
    for (int i = 0; i < 23; ++i) ids[i] = (i * 7 + 3) % (int)cfg.vocab_size, tg[i] = (i * 5 + 1) % (int)cfg.vocab_size;
    const model::Batch bt{1, 23, ids.data(), tg.data(), nullptr, nullptr};
    EXPECT_EQ(a.forward(bt).loss, b.forward(bt).loss);
  }
}

TEST(Recompute, RunConfigKey) {
  json j = {{"model", trex::testing::tiny_v3()}, {"train", {{"recompute", "full"}}}};
  EXPECT_EQ(train::parse_run_config(j, "run.toml").train.recompute, model::Recompute::Full);
  j["train"]["recompute"] = "none";
  EXPECT_EQ(train::parse_run_config(j, "run.toml").train.recompute, model::Recompute::None);
  j["train"]["recompute"] = "selective";
  try {
    train::parse_run_config(j, "run.toml");
    FAIL() << "selective recompute is not implemented and must be refused";
  } catch (const UserError& e) {
    const std::string msg = std::string(e.what()) + " | " + e.hint;
    EXPECT_NE(msg.find("recompute"), std::string::npos) << msg;
    EXPECT_NE(msg.find("full"), std::string::npos) << msg;
  }
}
