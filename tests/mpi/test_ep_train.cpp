// Expert-parallel training (model/moe.h, model/moe_dispatch_a2a.cpp) inside the data-parallel group, fp32,
// against one process computing every rank's batches: ep = 2 on 2 ranks (edp 1), ep = 3 on 3
// ranks, ep = 2 on 4 ranks (edp 2). Tiny DeepSeek-V3 (odd sizes, 6 experts, aux loss) and
// DeepSeek-V4 (hash routing, CSA/HCA, MTP) over K AdamW steps; the gradients of one backward
// directly (each rank computes only its own experts' gradients); the run loop end to end.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "train/loop.h"
#include "tests/mpi/train_parity.h"

using namespace trex;
using namespace trex::train;
using namespace trex::testing;
namespace fs = std::filesystem;

namespace {

int ep_for(int world) { return world % 2 == 0 ? 2 : world; }  // divides 6 for 2, 3, 4 ranks

json six_experts(json m) {
  m["n_routed_experts"] = 6;
  return m;
}

}  // namespace

TEST(EpTrain, V3MatchesSingleRank) {
  Case su{six_experts(tiny_v3()), 0.01, 0};
  parity(su, DpOptions{997, true}, 4, 2, 2, 11, ep_for(parallel::test_world().size()));
}

TEST(EpTrain, V2MatchesSingleRank) {  // 6 experts in 3 groups
  Case su{tiny_v2(), 0.01, 0};
  parity(su, DpOptions{997, true}, 4, 2, 2, 11, ep_for(parallel::test_world().size()));
}

// lr 1e-3: at 3e-3 this run's loss rises and AdamW amplifies the summation-order noise (4 ranks:
// layer 0 ends 1.4e-5 apart in L2 after 3 steps, while GradientsEqualTheSingleRankSum shows the
// gradients with the MTP layer within 1e-6).
TEST(EpTrain, V3MatchesSingleRankWithMtp) {
  Case su{six_experts(tiny_v3_mtp()), 0.01, 0.3};
  su.lr = su.ocfg.lr = 1e-3f;
  parity(su, DpOptions{997, true}, 3, 2, 2, 11, ep_for(parallel::test_world().size()));
}

// lr 1e-3: at 3e-3 this tiny V3.2's loss barely falls and the summation-order noise of the
// expert combine passes the 1e-5 bound in 4 steps (1.4e-5 measured). T = 9: with 11 tokens the
// 4-rank batches hold a near-tie of the indexer that the combine's rounding flips (a 1.3e-5 L2
// difference from the first steps on); with 9 the worst is 1e-6 on 2, 3 and 4 ranks.
TEST(EpTrain, V32MatchesSingleRank) {  // 6 experts in 2 groups, the indexer's top-k attention
  Case su{tiny_v32(), 0.01, 0};
  su.lr = su.ocfg.lr = 1e-3f;
  parity(su, DpOptions{997, true}, 4, 2, 2, 9, ep_for(parallel::test_world().size()));
}

TEST(EpTrain, V4MatchesSingleRankWithMtp) {
  Case su{six_experts(tiny_v4()), 0.0, 0.3};
  parity(su, DpOptions{1500, true}, 3, 2, 1, 13, ep_for(parallel::test_world().size()));
}

// Selective recompute of the MoE blocks: the replayed forwards repeat the dispatch and combine
// all-to-alls before each block's backward (lr 1e-3 as V3MatchesSingleRankWithMtp).
TEST(EpTrain, SelectiveMoeRecomputeMatchesSingleRank) {
  Case v3{six_experts(tiny_v3_mtp()), 0.01, 0.3};
  v3.lr = v3.ocfg.lr = 1e-3f;
  v3.recompute = model::Recompute::Selective;
  parity(v3, DpOptions{997, true}, 3, 2, 2, 11, ep_for(parallel::test_world().size()));
  Case v4{six_experts(tiny_v4()), 0.0, 0.3};
  v4.recompute = model::Recompute::Selective;
  parity(v4, DpOptions{1500, true}, 3, 2, 1, 13, ep_for(parallel::test_world().size()));
}

// "moe_act": the routed experts' SwiGLU output computed again from the received rows' gate|up
// product (V3 alone, V4 inside the replayed blocks).
TEST(EpTrain, SelectiveMoeActRecomputeMatchesSingleRank) {
  Case v3{six_experts(tiny_v3_mtp()), 0.01, 0.3};
  v3.lr = v3.ocfg.lr = 1e-3f;
  v3.recompute = model::Recompute::Selective;
  v3.modules = model::kRecomputeMoeAct;
  parity(v3, DpOptions{997, true}, 3, 2, 2, 11, ep_for(parallel::test_world().size()));
  Case v4{six_experts(tiny_v4()), 0.0, 0.3};
  v4.recompute = model::Recompute::Selective;
  v4.modules = model::kRecomputeMoe | model::kRecomputeMoeAct;
  parity(v4, DpOptions{1500, true}, 3, 2, 1, 13, ep_for(parallel::test_world().size()));
}

// "moe_out" and "shared_experts": the routed experts' down projection computed again on the rows'
// rank, its q = dy . y sent back along the combine route; the shared experts' gate|up again while
// dy is in flight (V3 with "moe_act", V4 alone).
TEST(EpTrain, SelectiveMoeOutSharedExpertsRecomputeMatchesSingleRank) {
  Case v3{six_experts(tiny_v3_mtp()), 0.01, 0.3};
  v3.lr = v3.ocfg.lr = 1e-3f;
  v3.recompute = model::Recompute::Selective;
  v3.modules = model::kRecomputeMoeAct | model::kRecomputeMoeOut | model::kRecomputeSharedExperts;
  parity(v3, DpOptions{997, true}, 3, 2, 2, 11, ep_for(parallel::test_world().size()));
  Case v4{six_experts(tiny_v4()), 0.0, 0.3};
  v4.recompute = model::Recompute::Selective;
  v4.modules = model::kRecomputeMoeOut | model::kRecomputeSharedExperts;
  parity(v4, DpOptions{1500, true}, 3, 2, 1, 13, ep_for(parallel::test_world().size()));
}

// One forward_backward per rank on its own batch: the loss is the single model's on that batch;
// the rank's gradient has nothing outside its own experts' slab ranges (and the dense part), and
// the sum over ranks equals the single model's gradient accumulated over all the batches. Also
// with a DeepSeek-V3 MTP layer (a third MoE layer).
TEST(EpTrain, GradientsEqualTheSingleRankSum) {
  for (const bool with_mtp : {false, true}) {
  SCOPED_TRACE(with_mtp ? "with an MTP layer" : "without MTP");
  init_threads(1);
  parallel::Communicator& w = parallel::test_world();
  const int ep = ep_for(w.size());
  Case su{six_experts(with_mtp ? tiny_v3_mtp() : tiny_v3()), 0.01, with_mtp ? 0.3 : 0.0};
  const model::ModelConfig cfg = su.cfg();
  const Global g = make_global(1, 1, w.size(), 2, 9, cfg.vocab_size, 21);
  auto ref = su.make(3);
  std::vector<double> ref_loss;
  for (int r = 0; r < w.size(); ++r) ref_loss.push_back(ref->forward_backward(g.batch(0, 0, r)).loss);

  auto m = su.make(3);
  parallel::ParallelDims dims;
  dims.dp = w.size(), dims.ep = ep;
  parallel::ProcessGroups groups = parallel::make_process_groups(w, dims);
  m->set_expert_parallel(groups.ep.get());
  const model::ExpertParallel& X = m->expert_parallel();
  ASSERT_TRUE(X.on());
  EXPECT_EQ(X.count, 6 / ep);
  EXPECT_EQ(X.first, (w.rank() % ep) * (6 / ep));
  const double loss = m->forward_backward(g.batch(0, 0, w.rank())).loss;
  EXPECT_LT(rel(loss, ref_loss[w.rank()]), 1e-6) << loss << " vs " << ref_loss[w.rank()];
  EXPECT_GE(X.wait_ms, 0.0);

  // Other ranks' experts: no gradient here; own experts: some.
  const int64_t F = cfg.moe_intermediate_size, d = cfg.hidden_size;
  int64_t moe_layers = 0;
  for (const model::LayerParams& lp : m->layout.layers) {
    if (lp.exp_gu < 0) continue;
    ++moe_layers;
    for (int64_t e = 0; e < 6; ++e) {
      const bool mine = e >= X.first && e < X.first + X.count;
      double a = 0;
      for (int64_t i = 0; i < 2 * F * d; ++i) a += std::fabs(m->G()[lp.exp_gu + e * 2 * F * d + i]);
      for (int64_t i = 0; i < d * F; ++i) a += std::fabs(m->G()[lp.exp_down + e * d * F + i]);
      if (!mine) {
        EXPECT_EQ(a, 0.0) << "expert " << e << " is not this rank's";
      }
    }
  }
  EXPECT_EQ(moe_layers, with_mtp ? 3 : 2);

  std::vector<float> sum(m->G(), m->G() + m->layout.total);
  w.all_reduce(sum.data(), sum.size());
  double worst = 0;
  std::string at;
  for (const model::ParamEntry& e : m->layout.entries) {
    double dd = 0, nn = 0;
    for (int64_t i = 0; i < e.shape.numel(); ++i) {
      const double a = sum[e.offset + i], b = ref->G()[e.offset + i];
      dd += (a - b) * (a - b), nn += b * b;
    }
    if (nn == 0) continue;
    const double r = std::sqrt(dd / nn);
    if (r > worst) worst = r, at = e.name;
  }
  EXPECT_LT(worst, 1e-5) << at;
  // The expert loads are this rank's tokens' (summed over ranks by the trainer).
  for (int64_t l = 1; l < (int64_t)m->layout.layers.size(); ++l) {
    std::vector<int64_t> mine = m->expert_load()[l], all = mine;
    w.all_reduce(all.data(), all.size());
    EXPECT_EQ(all, ref->expert_load()[l]) << "layer " << l;
  }
  if (w.rank() == 0) std::printf("[ep grads%s] worst %.2e (%s)\n", with_mtp ? " mtp" : "", worst, at.c_str());
  }
}

TEST(EpTrain, ExpertsMustSplitEvenly) {
  parallel::Communicator& w = parallel::test_world();
  Case su{tiny_v3(), 0, 0};  // 5 experts
  auto m = su.make(1);
  if (w.size() == 5) GTEST_SKIP();
  try {
    m->set_expert_parallel(&w);
    FAIL() << "5 experts over " << w.size() << " ranks must be refused";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("does not divide n_routed_experts = 5"), std::string::npos) << e.what();
  }
  m->set_expert_parallel(nullptr);
  EXPECT_FALSE(m->expert_parallel().on());
}

// run_training with parallel.ep equals run_training data parallel only (same ranks, same data):
// the losses and the eval losses. 31 eval sequences: the last global eval batch is partial on 2, 3
// and 4 ranks, so some rank runs the forward collective on a row it does not count.
TEST(EpTrain, RunLoopMatchesDataParallel) {
  parallel::Communicator& w = parallel::test_world();
  const fs::path root = loop_corpus(w, "trex_ep_loop_", 47, [](int i) {
    return "crate " + std::to_string(i) + " weighs " + std::to_string(11 * i + 5) + " kg, " + std::string(i % 7, 'y') +
           " then more";
  });
  const std::string data = (root / "corpus.jsonl").string();
  auto run = [&](const std::string& d, int ep) {
    json m = six_experts(tiny_v3());
    m["vocab_size"] = 260;
    json j = {{"model", m},
              {"data", {{"mode", "cpt"}, {"train", {data}}, {"seq_len", 19}, {"eval_fraction", 0.3}, {"cache_dir", "none"}}},
              {"train", {{"batch_size", 1}, {"grad_accum", 2}, {"steps", 4}, {"precision", "fp32"}, {"threads", 1},
                         {"eval_every", 2}, {"eval_batches", 20}}},
              {"optim", {{"lr", 3e-3}, {"warmup_steps", 1}}},
              {"parallel", {{"bucket_size", 2500}, {"ep", ep}}},
              {"checkpoint", {{"dir", (root / d).string()}, {"every", 4}}},
              {"log", {{"progress", "lines"}}}};
    return run_training(parse_run_config(j, "run.toml"), bytes_tok(), &w);
  };
  run("dp", 1);
  run("ep", ep_for(w.size()));
  if (w.rank() == 0) {
    const auto a = metrics((root / "dp").string()), b = metrics((root / "ep").string());
    ASSERT_EQ(a.size(), 4u);
    ASSERT_EQ(b.size(), 4u);
    int evals = 0;
    for (size_t s = 0; s < 4; ++s) {
      EXPECT_LT(rel(b[s]["loss"].get<double>(), a[s]["loss"].get<double>()), 1e-5) << "step " << s + 1;
      if (a[s].contains("eval_loss")) {
        ++evals;
        EXPECT_LT(rel(b[s]["eval_loss"].get<double>(), a[s]["eval_loss"].get<double>()), 1e-5) << "step " << s + 1;
      }
    }
    EXPECT_EQ(evals, 2);
    fs::remove_all(root);
  }
  w.barrier();
}

// run_training under expert parallel over every rank (V4: merged [E, ...] expert tensors, hash and
// top-k layers, each rank holding its experts only) equals one process with dp rows, eval included;
// its step-3 checkpoint (the experts gathered from every rank) resumes in one process.
TEST(EpTrain, ShardedRunLoopMatchesOneProcessAndResumesInOne) {
  parallel::Communicator& w = parallel::test_world();
  const int n = w.size();
  if (6 % n != 0) GTEST_SKIP() << "6 experts over " << n << " ranks";
  const fs::path root = loop_corpus(w, "trex_ep_resume_", 47, [](int i) {
    return "bin " + std::to_string(i) + " stores " + std::to_string(13 * i + 2) + " bolts " + std::string(i % 6, 'z') +
           " in the yard";
  });
  loop_matches_one_process_and_resumes_in_one(w, root, six_experts(tiny_v4()), "parallel.ep=" + std::to_string(n), n,
                                              "rank");
}
