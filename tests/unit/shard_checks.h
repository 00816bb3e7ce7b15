// Checks shared by the expert-, stage- and tp-shard tests (test_expert_shard.cpp, test_stage_shard.cpp,
// test_tp_shard.cpp).
#pragma once
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "model/checkpoint.h"
#include "model/model.h"
#include "model/params.h"
#include "tests/tiny_configs.h"
#include "tests/unit/test_util.h"
#include "train/checkpoint.h"
#include "train/optimizer.h"

namespace trex::test {

// Every tensor of a shard's slab (mp, laid out by ml) equals the whole model's (wp, wl; its part,
// for an expert shard's rows or a tp slice), bit for bit.
inline void expect_slices_of(const float* mp, const model::ParamLayout& ml, const float* wp,
                             const model::ParamLayout& wl, const char* what) {
  std::vector<float> part;
  for (const model::ParamEntry& e : ml.entries) {
    const model::ParamEntry* w = wl.find(e.name);
    ASSERT_TRUE(w) << what << ": " << e.name;
    part.resize((size_t)e.shape.numel());
    e.take_from_whole(wp + w->offset, part.data());
    EXPECT_EQ(0, std::memcmp(part.data(), mp + e.offset, e.shape.numel() * sizeof(float))) << what << ": " << e.name;
  }
}

// A whole model (random init from seed 17) after one AdamW step, so that its moments are not zero,
// written as a Hugging Face checkpoint, as V4's original release layout (V4) and as a training
// checkpoint; expect_shard_matches checks what a sharded model initializes and loads against it.
struct WholeCheckpoints {
  model::ModelConfig cfg;
  model::TrainOptions to;
  model::Model whole;
  train::AdamW opt;
  TmpDir tmp;
  std::string ck;  // the training checkpoint's directory

  // perturb: the 1-d tensors (norms, sinks, ...) off their constant init (testing::perturb_vectors),
  // so that the loads of a slice of them are checked too.
  WholeCheckpoints(const model::ModelConfig& c, const model::TrainOptions& o, const std::string& prefix,
                   bool perturb = false)
      : cfg(c), to(o), whole(c, kern::Prec::F32, o), opt(whole, {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f}), tmp(prefix) {
    whole.init_random(17);
    if (perturb) testing::perturb_vectors(whole, 3);
    std::vector<int32_t> ids(2 * 9), tg(2 * 9);
    for (size_t i = 0; i < ids.size(); ++i)
      ids[i] = (int32_t)(i * 7 % c.vocab_size), tg[i] = (int32_t)(i * 5 % c.vocab_size);
    whole.forward_backward({2, 9, ids.data(), tg.data(), nullptr, nullptr});
    opt.step(whole, 1e-3f);
    ck = train::save_checkpoint(tmp.path.string(), whole, opt, train::TrainState{1, 0, 0, {}}, 1);
    model::save_hf_checkpoint(whole, tmp.file("hf"));
    if (c.is_v4()) model::save_v4_original(whole, tmp.file("orig"), DType::F32, false);
  }

  // A model holding the given shards: its random init (seed 17) draws what the whole model draws
  // for its tensors, and what it loads from each checkpoint (weights; the training checkpoint's
  // moments into a one-rank AdamW over its slab) is the whole model's part, bit for bit.
  void expect_shard_matches(model::ExpertShard ex, model::StageShard st = {}, model::TpShard tp = {}) const {
    model::Model m(cfg, kern::Prec::F32, to, ex, st, tp);
    m.init_random(17);
    model::Model w2(cfg, kern::Prec::F32, to);
    w2.init_random(17);
    expect_slices_of(m.P(), m.layout, w2.P(), w2.layout, "init");
    EXPECT_EQ(m.buffers, w2.buffers);  // V4's random hash tables too
    std::memset(m.P(), 0, m.layout.total * sizeof(float));
    model::load_hf_weights(m, tmp.file("hf"));
    expect_slices_of(m.P(), m.layout, whole.P(), whole.layout, "hf");
    if (cfg.is_v4()) {
      std::memset(m.P(), 0, m.layout.total * sizeof(float));
      model::load_hf_weights(m, tmp.file("orig"));
      expect_slices_of(m.P(), m.layout, whole.P(), whole.layout, "original layout");
    }
    train::AdamW so(m, opt.cfg);
    std::memset(m.P(), 0, m.layout.total * sizeof(float));
    const train::TrainState ts = train::load_checkpoint(ck, m, so);
    EXPECT_EQ(ts.step, 1);
    EXPECT_EQ(so.steps(), 1);
    expect_slices_of(m.P(), m.layout, whole.P(), whole.layout, "training checkpoint");
    expect_slices_of(so.M1(), m.layout, opt.M1(), whole.layout, "exp_avg");
    expect_slices_of(so.M2(), m.layout, opt.M2(), whole.layout, "exp_avg_sq");
    EXPECT_EQ(m.buffers, whole.buffers);
  }
};

}  // namespace trex::test
