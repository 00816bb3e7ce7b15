// Activation recompute (TrainOptions::recompute, [train] recompute = "full" / "selective"): the
// replayed layer forwards (full) or the selective modules (recompute_modules: "moe" replays MoE
// blocks, "moe_act" the experts' SwiGLU, "shared_experts" the shared experts' gate|up and SwiGLU,
// DeepSeek-V4's "mla_up_proj" its q_b and "mhc" its hyper-connection streams) rebuild exactly the
// activations the backward needs, so the loss, every gradient and the expert loads are bitwise
// those of a step that kept them, in fp32 and bf16, on tiny DeepSeek-V3 (dense + MoE layers, aux
// loss, MTP layers) and DeepSeek-V4 (hash routing, CSA / HCA / sliding, an MTP block) configs with
// odd sizes and packed rows; "moe_out" (the router probabilities' gradient from the down
// projection's input gradient, no y kept) gives the same loss and loads and gradients within
// rounding. The activation peak is lower, and under selective recompute equal to the estimate
// (train/activation_estimate.h) to the byte.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "model/model.h"
#include "train/activation_estimate.h"
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
  std::vector<model::ParamEntry> tensors;  // the gradient slab's layout
};

constexpr int64_t kB = 2, kT = 17;
// "moe_out" against the kept run (expect_same_step's tol). fp32: the dot over F columns instead of
// d moves each gradient by ~1e-6 of its largest element; bf16: dh from dy rounded to bf16 moves
// it by less than bf16 rounding itself does.
constexpr double kMoeOutTolF32 = 1e-4, kMoeOutTolBf16 = 1.0;

// The model as `trex train` builds it with mtp_loss_weight mtp (with_mtp: its MTP layers / blocks).
model::ModelConfig config(const json& mj, double mtp) {
  const model::ModelConfig c = model::parse_config(mj, "tiny");
  return model::with_mtp(c, mtp > 0 ? c.num_nextn_predict_layers : 0);
}

// packed: two documents in every row (else one; the estimate counts DeepSeek-V4's key lists for one
// document a row, an upper bound for packed rows).
// modules: selective recompute's (model::RecomputeModule bits).
Run step(const json& mj, kern::Prec prec, model::Recompute rc, double mtp, bool packed = true,
         unsigned modules = model::kRecomputeMoe) {
  model::TrainOptions o{0.01, mtp, rc};
  o.recompute_modules = modules;
  model::Model m(config(mj, mtp), prec, o);
  m.init_random(7);
  const int64_t B = kB, T = kT, N = B * T;
  std::vector<int32_t> ids(N), tg(N), seg(N);
  Rng r(3);
  for (int64_t i = 0; i < N; ++i) {
    ids[i] = (int32_t)(r.next_u64() % m.cfg.vocab_size);
    tg[i] = i % 5 == 2 ? -100 : (int32_t)(r.next_u64() % m.cfg.vocab_size);
    seg[i] = (int32_t)((i % T) < 9 ? 0 : 1);  // two documents in every row
  }
  Run out;
  out.loss = m.forward_backward({B, T, ids.data(), tg.data(), nullptr, packed ? seg.data() : nullptr});
  out.grads.assign(m.G(), m.G() + m.layout.total);
  out.load = m.expert_load();
  out.peak = m.peak_activation_bytes();
  out.tensors = m.layout.entries;
  return out;
}

// tol 0: the gradients bitwise the same; else (modules holding "moe_out", whose router
// probabilities' gradient is dh . h instead of dy . y) close to the kept run's, in each parameter
// tensor of the layout: fp32, max |a - b| within tol of max |a|; bf16, max |a - b| within tol
// times the largest difference bf16 itself makes there (the kept run against the kept fp32 run).
void expect_same_step(const json& mj, kern::Prec prec, double mtp, model::Recompute rc = model::Recompute::Full,
                      unsigned modules = model::kRecomputeMoe, double tol = 0) {
  const Run keep = step(mj, prec, model::Recompute::None, mtp);
  const Run full = step(mj, prec, rc, mtp, true, modules);
  EXPECT_EQ(keep.loss.loss, full.loss.loss);
  EXPECT_EQ(keep.loss.aux, full.loss.aux) << "the replay must not add the aux loss again";
  EXPECT_EQ(keep.loss.mtp, full.loss.mtp);
  EXPECT_EQ(keep.load, full.load) << "the replay must not count the expert loads again";
  ASSERT_EQ(keep.grads.size(), full.grads.size());
  if (tol == 0) {
    EXPECT_EQ(0, std::memcmp(keep.grads.data(), full.grads.data(), keep.grads.size() * sizeof(float)))
        << "gradients differ";
  } else {
    const bool bf = prec == kern::Prec::BF16;
    const Run f32 = bf ? step(mj, kern::Prec::F32, model::Recompute::None, mtp) : Run{};
    double worst = 0;
    std::string at;
    for (const model::ParamEntry& t : keep.tensors) {
      double dmax = 0, ref = 0;  // ref: max |a| (fp32), or bf16's own largest difference
      for (int64_t i = t.offset; i < t.offset + t.shape.numel(); ++i) {
        dmax = std::max(dmax, (double)std::abs(keep.grads[i] - full.grads[i]));
        ref = std::max(ref, (double)std::abs(bf ? keep.grads[i] - f32.grads[i] : keep.grads[i]));
      }
      const double rel = ref > 0 ? dmax / ref : dmax > 0 ? HUGE_VAL : 0.0;
      if (rel > worst) worst = rel, at = t.name;
    }
    EXPECT_LE(worst, tol) << "gradient " << at;
    std::printf("[recompute] %s %s modules %u: gradients within %.3g of the kept run's (of %s; worst %s)\n",
                mj["model_type"].get<std::string>().c_str(), prec == kern::Prec::BF16 ? "bf16" : "fp32", modules,
                worst, bf ? "bf16's own difference" : "the largest gradient", at.c_str());
  }
  double norm = 0;
  for (float g : keep.grads) norm += (double)g * g;
  EXPECT_GT(norm, 0.0);
  EXPECT_LT(full.peak, keep.peak) << "recompute must lower the activation peak";
  std::printf("[recompute] %s %s %s (modules %u): activation peak %zu -> %zu bytes\n",
              mj["model_type"].get<std::string>().c_str(), prec == kern::Prec::BF16 ? "bf16" : "fp32",
              rc == model::Recompute::Full ? "full" : "selective", modules, keep.peak, full.peak);
  if (rc == model::Recompute::Selective) {  // the estimate replays the arena: to the byte (one document a row)
    model::TrainOptions o{0.01, mtp, rc};
    o.recompute_modules = modules;
    for (model::Recompute r : {model::Recompute::None, rc})
      EXPECT_EQ((double)step(mj, prec, r, mtp, false, modules).peak,
                train::activation_peak_bytes(config(mj, mtp), kB, kT, prec, r, 1, 1, false, {}, o))
          << (r == rc ? "selective" : "none");
    EXPECT_LE((double)full.peak, train::activation_peak_bytes(config(mj, mtp), kB, kT, prec, rc, 1, 1, false, {}, o));
  }
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

TEST(Recompute, SelectiveMoeIsBitwiseTheSameV3WithMtp) {
  json m = deeper_v3();
  m["num_nextn_predict_layers"] = 1;
  expect_same_step(m, kern::Prec::F32, 0.3, model::Recompute::Selective);
  expect_same_step(m, kern::Prec::BF16, 0.3, model::Recompute::Selective);
}

TEST(Recompute, SelectiveMoeIsBitwiseTheSameV4WithMtp) {
  expect_same_step(deeper_v4(), kern::Prec::F32, 0.3, model::Recompute::Selective);
  expect_same_step(deeper_v4(), kern::Prec::BF16, 0.3, model::Recompute::Selective);
}

// "moe_act": the routed experts' SwiGLU output computed again in the backward, alone and inside
// the replayed MoE blocks.
TEST(Recompute, SelectiveMoeActIsBitwiseTheSameV3WithMtp) {
  json m = deeper_v3();
  m["num_nextn_predict_layers"] = 1;
  for (unsigned mods : {unsigned(model::kRecomputeMoeAct), unsigned(model::kRecomputeMoe | model::kRecomputeMoeAct)}) {
    expect_same_step(m, kern::Prec::F32, 0.3, model::Recompute::Selective, mods);
    expect_same_step(m, kern::Prec::BF16, 0.3, model::Recompute::Selective, mods);
  }
}

TEST(Recompute, SelectiveMoeActIsBitwiseTheSameV4WithMtp) {
  for (unsigned mods : {unsigned(model::kRecomputeMoeAct), unsigned(model::kRecomputeMoe | model::kRecomputeMoeAct)}) {
    expect_same_step(deeper_v4(), kern::Prec::F32, 0.3, model::Recompute::Selective, mods);
    expect_same_step(deeper_v4(), kern::Prec::BF16, 0.3, model::Recompute::Selective, mods);
  }
}

// "shared_experts" (the shared experts' gate|up GEMM and SwiGLU run again in the backward; bitwise)
// and "moe_out" (the router probabilities' gradient dy . y taken as dh . h without y; within
// rounding): alone, together, with "moe_act" and inside the replayed blocks of "moe".
TEST(Recompute, SelectiveSharedExpertsAndMoeOutGiveTheSameStep) {
  json v3 = deeper_v3();
  v3["num_nextn_predict_layers"] = 1;
  const unsigned sh = model::kRecomputeSharedExperts, out = model::kRecomputeMoeOut, act = model::kRecomputeMoeAct;
  for (const json& mj : {v3, deeper_v4()}) {
    for (unsigned mods : {sh, sh | act, sh | act | model::kRecomputeMoe}) {
      expect_same_step(mj, kern::Prec::F32, 0.3, model::Recompute::Selective, mods);
      expect_same_step(mj, kern::Prec::BF16, 0.3, model::Recompute::Selective, mods);
    }
    // "moe_out": the router probabilities' gradient is dh . h, the same value up to rounding.
    for (unsigned mods : {out, sh | out | act, sh | out | act | model::kRecomputeMoe}) {
      expect_same_step(mj, kern::Prec::F32, 0.3, model::Recompute::Selective, mods, kMoeOutTolF32);
      expect_same_step(mj, kern::Prec::BF16, 0.3, model::Recompute::Selective, mods, kMoeOutTolBf16);
    }
  }
}

// "shared_experts" and "moe_out" each keep less than no recompute and, with "moe_act", less than
// "moe_act" alone.
TEST(Recompute, SharedExpertsAndMoeOutLowerThePeak) {
  for (const json& mj : {deeper_v3(), deeper_v4()}) {
    ASSERT_GT(mj.value("n_shared_experts", 0), 0);
    auto peak = [&](model::Recompute r, unsigned mods) { return step(mj, kern::Prec::BF16, r, 0, true, mods).peak; };
    EXPECT_LT(peak(model::Recompute::Selective, model::kRecomputeSharedExperts), peak(model::Recompute::None, 0))
        << mj["model_type"];
    EXPECT_LT(peak(model::Recompute::Selective, model::kRecomputeMoeOut), peak(model::Recompute::None, 0))
        << mj["model_type"];
    const size_t act = peak(model::Recompute::Selective, model::kRecomputeMoeAct);
    EXPECT_LT(peak(model::Recompute::Selective, model::kRecomputeSharedExperts | model::kRecomputeMoeAct), act)
        << mj["model_type"];
    EXPECT_LT(peak(model::Recompute::Selective, model::kRecomputeMoeOut | model::kRecomputeMoeAct), act)
        << mj["model_type"];
  }
}

// DeepSeek-V4's "mla_up_proj" (q_b run again) and "mhc" (the mid-layer streams and the mixes'
// inputs computed again), alone, together and with the MoE modules.
TEST(Recompute, SelectiveMhcAndUpProjAreBitwiseTheSameV4WithMtp) {
  const unsigned up = model::kRecomputeMlaUpProj, mhc = model::kRecomputeMhc;
  const unsigned all = up | mhc | model::kRecomputeMoe | model::kRecomputeMoeAct;
  const unsigned no_moe = up | mhc | model::kRecomputeMoeAct | model::kRecomputeSharedExperts;
  for (unsigned mods : {up, mhc, up | mhc, all, no_moe}) {
    expect_same_step(deeper_v4(), kern::Prec::F32, 0.3, model::Recompute::Selective, mods);
    expect_same_step(deeper_v4(), kern::Prec::BF16, 0.3, model::Recompute::Selective, mods);
  }
  const unsigned out = no_moe | model::kRecomputeMoeOut;  // the 32768-token bench-v4 row's set
  expect_same_step(deeper_v4(), kern::Prec::F32, 0.3, model::Recompute::Selective, out, kMoeOutTolF32);
  expect_same_step(deeper_v4(), kern::Prec::BF16, 0.3, model::Recompute::Selective, out, kMoeOutTolBf16);
}

// Each V4 module lowers the peak on its own, and all four keep less than "moe" alone.
TEST(Recompute, MhcAndUpProjLowerThePeak) {
  const json mj = deeper_v4();
  auto peak = [&](model::Recompute r, unsigned mods) { return step(mj, kern::Prec::BF16, r, 0.3, true, mods).peak; };
  const size_t none = peak(model::Recompute::None, 0);
  EXPECT_LT(peak(model::Recompute::Selective, model::kRecomputeMhc), none);
  EXPECT_LT(peak(model::Recompute::Selective, model::kRecomputeMlaUpProj), none);
  EXPECT_LT(peak(model::Recompute::Selective, model::kRecomputeMoe | model::kRecomputeMoeAct | model::kRecomputeMhc |
                                                  model::kRecomputeMlaUpProj),
            peak(model::Recompute::Selective, model::kRecomputeMoe));
}

// "moe_act" with "moe" keeps less than "moe" alone (the replayed block's h is a scratch one).
TEST(Recompute, MoeActLowersThePeak) {
  for (const json& mj : {deeper_v3(), deeper_v4()}) {
    const size_t none = step(mj, kern::Prec::BF16, model::Recompute::None, 0).peak;
    const size_t act = step(mj, kern::Prec::BF16, model::Recompute::Selective, 0, true, model::kRecomputeMoeAct).peak;
    EXPECT_LT(act, none) << mj["model_type"];
  }
}

// Selective keeps the attention's activations: its peak lies between full's and none's.
TEST(Recompute, SelectiveSitsBetweenNoneAndFull) {
  for (const json& mj : {deeper_v3(), deeper_v4()}) {
    const size_t none = step(mj, kern::Prec::BF16, model::Recompute::None, 0).peak;
    const size_t sel = step(mj, kern::Prec::BF16, model::Recompute::Selective, 0).peak;
    const size_t full = step(mj, kern::Prec::BF16, model::Recompute::Full, 0).peak;
    EXPECT_LT(sel, none) << mj["model_type"];
    EXPECT_GT(sel, full) << mj["model_type"];
  }
}

// Grad accumulation: two micro-batches into the same gradients, bitwise as without recompute.
TEST(Recompute, SelectiveAccumulatesTheSameGradients) {
  for (const json& mj : {deeper_v3(), deeper_v4()}) {
    std::vector<std::vector<float>> g;
    for (model::Recompute rc : {model::Recompute::None, model::Recompute::Selective}) {
      model::Model m(model::parse_config(mj, "tiny"), kern::Prec::F32, {0.01, 0, rc});
      m.init_random(9);
      std::vector<int32_t> ids(2 * 19), tg(2 * 19);
      const int V = (int)m.cfg.vocab_size;
      for (int i = 0; i < 38; ++i) ids[i] = (i * 11 + 2) % V, tg[i] = (i * 3 + 5) % V;
      m.forward_backward({1, 19, ids.data(), tg.data(), nullptr, nullptr});
      m.forward_backward({1, 19, ids.data() + 19, tg.data() + 19, nullptr, nullptr});
      g.emplace_back(m.G(), m.G() + m.layout.total);
    }
    ASSERT_EQ(g[0].size(), g[1].size());
    EXPECT_EQ(0, std::memcmp(g[0].data(), g[1].data(), g[0].size() * sizeof(float))) << mj["model_type"];
  }
}

TEST(Recompute, RunConfigKey) {
  json j = {{"model", trex::testing::tiny_v3()}, {"train", {{"recompute", "full"}}}};
  EXPECT_EQ(train::parse_run_config(j, "run.toml").train.recompute, model::Recompute::Full);
  j["train"]["recompute"] = "none";
  EXPECT_EQ(train::parse_run_config(j, "run.toml").train.recompute, model::Recompute::None);
  j["train"]["recompute"] = "selective";
  train::RunConfig rc = train::parse_run_config(j, "run.toml");
  EXPECT_EQ(rc.train.recompute, model::Recompute::Selective);
  EXPECT_EQ(rc.train.recompute_modules, model::kRecomputeMoe) << "default: [\"moe\"]";
  j["train"]["recompute_modules"] = {"moe"};
  EXPECT_EQ(train::parse_run_config(j, "run.toml").train.recompute_modules, model::kRecomputeMoe);
  auto refused = [&](const json& jj, std::vector<std::string> words) {
    try {
      train::parse_run_config(jj, "run.toml");
      ADD_FAILURE() << "accepted: " << jj["train"].dump();
    } catch (const UserError& e) {
      const std::string msg = std::string(e.what()) + " | " + e.hint;
      for (const std::string& w : words) EXPECT_NE(msg.find(w), std::string::npos) << w << " not in: " << msg;
    }
  };
  // Modules trex does not recompute: the field, the value and the supported names.
  for (const char* name : {"core_attn", "layernorm", "mlp", "Moe"}) {
    json k = j;
    k["train"]["recompute_modules"] = {"moe", name};
    refused(k, {"train.recompute_modules", std::string("\"") + name + "\"", "\"moe\"", "\"moe_act\"",
                "\"moe_out\"", "\"shared_experts\"", "\"mla_up_proj\"", "\"mhc\""});
  }
  // DeepSeek-V4's modules: refused for a V3 model (the field, the module, the model type), read for V4.
  for (const char* name : {"mla_up_proj", "mhc"}) {
    json k = j;
    k["train"]["recompute_modules"] = {"moe", name};
    refused(k, {"train.recompute_modules", std::string("\"") + name + "\"", "deepseek_v3", "remove"});
    k["model"] = trex::testing::tiny_v4();
    EXPECT_EQ(train::parse_run_config(k, "run.toml").train.recompute_modules,
              model::kRecomputeMoe | (std::string(name) == "mhc" ? model::kRecomputeMhc : model::kRecomputeMlaUpProj));
  }
  json k = j;
  k["train"]["recompute_modules"] = {"moe_act"};
  EXPECT_EQ(train::parse_run_config(k, "run.toml").train.recompute_modules, model::kRecomputeMoeAct);
  k["train"]["recompute_modules"] = {"moe_act", "moe"};
  EXPECT_EQ(train::parse_run_config(k, "run.toml").train.recompute_modules,
            model::kRecomputeMoe | model::kRecomputeMoeAct);
  k["train"]["recompute_modules"] = {"moe_act", "moe_out", "shared_experts"};
  EXPECT_EQ(train::parse_run_config(k, "run.toml").train.recompute_modules,
            model::kRecomputeMoeAct | model::kRecomputeMoeOut | model::kRecomputeSharedExperts);
  k["train"]["recompute_modules"] = json::array();
  refused(k, {"train.recompute_modules", "\"moe\""});
  k["train"]["recompute_modules"] = "moe";
  refused(k, {"train.recompute_modules", "list"});
  // recompute_modules is used only with "selective": ignored (a warning) with the other modes.
  for (const char* mode : {"none", "full"}) {
    k = j;
    k["train"]["recompute"] = mode;
    const train::RunConfig r = train::parse_run_config(k, "run.toml");
    EXPECT_EQ(r.train.recompute, std::string(mode) == "full" ? model::Recompute::Full : model::Recompute::None);
    model::TrainOptions o{0, 0, r.train.recompute};
    o.recompute_modules = r.train.recompute_modules;
    EXPECT_FALSE(o.recomputes(model::kRecomputeMoe)) << mode;
  }
  j["train"]["recompute"] = "partial";
  refused(j, {"recompute", "selective", "full"});
}
