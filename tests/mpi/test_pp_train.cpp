// Pipeline-parallel training (train/pipeline.h, model::PipelineStage), fp32, against one process
// computing every data rank's batches: pp = 2 on 2 ranks, pp = 3 on 3 ranks (one layer a stage),
// and on 4 ranks (CTest mpi_pp_np4) dp 2 x pp 2 (with ep 2 inside dp) and tp 2 x pp 2. Tiny
// DeepSeek-V3 (a dense first layer, MoE layers with an aux loss) and DeepSeek-V4 (hash routing,
// CSA / HCA / sliding layers, an MTP block on the last stage) over K AdamW steps with more
// micro-batches than stages (the 1F1B steady state); the gradients of one step directly; uneven
// stages (a first or last stage without layers); the run loop end to end with eval, and its
// checkpoint resumed by one process.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "train/loop.h"
#include "train/pipeline.h"
#include "tests/mpi/train_parity.h"

using namespace trex;
using namespace trex::train;
using namespace trex::testing;
namespace fs = std::filesystem;

namespace {

// pp for a world of 2, 3 or 4 ranks: the whole world, except 4 = 2 stages of 2 ranks.
int pp_for(int world) { return world == 4 ? 2 : world; }

}  // namespace

TEST(PpTrain, V3MatchesSingleRank) {
  const int n = parallel::test_world().size();
  Case su{tiny_v3(), 0.01, 0};
  parity(su, DpOptions{997, true}, 4, 5, 2, 11, 1, 1, pp_for(n));
}

// Ten AdamW steps, the reductions after the backward (no overlap), 2 micro-batches a step.
TEST(PpTrain, V3TenStepsNoOverlap) {
  const int n = parallel::test_world().size();
  Case su{tiny_v3(), 0.0, 0};
  parity(su, DpOptions{0, false}, 10, 2, 2, 9, 1, 1, pp_for(n));
}

// DeepSeek-V2 (no router biases: a stage holds none of other stages' layers either).
TEST(PpTrain, V2MatchesSingleRank) {
  const int n = parallel::test_world().size();
  Case su{tiny_v2(), 0.01, 0};
  parity(su, DpOptions{997, true}, 4, 5, 2, 11, 1, 1, pp_for(n));
}

// DeepSeek-V3's MTP layer and the embedding it reads live on the last stage; with full recompute.
TEST(PpTrain, V3MatchesSingleRankWithMtp) {
  const int n = parallel::test_world().size();
  Case su{tiny_v3_mtp(), 0.01, 0.3};
  su.recompute = model::Recompute::Full;
  parity(su, DpOptions{997, true}, 3, 4, 1, 13, 1, 1, pp_for(n));
}

// DeepSeek-V3.2 (each stage holds its layers' indexers).
TEST(PpTrain, V32MatchesSingleRank) {
  const int n = parallel::test_world().size();
  Case su{tiny_v32(), 0.01, 0};
  parity(su, DpOptions{997, true}, 4, 5, 2, 11, 1, 1, pp_for(n));
}

// The same with the indexer loss (sparse stage; each stage's layers add their indexer loss and
// recall, summed over the stages), under full activation recompute.
TEST(PpTrain, V32IndexerLossMatchesSingleRank) {
  const int n = parallel::test_world().size();
  Case su{tiny_v32(), 0.01, 0};
  su.ix_weight = 0.8;
  su.recompute = model::Recompute::Full;
  parity(su, DpOptions{997, true}, 3, 5, 2, 11, 1, 1, pp_for(n));
}

// The MTP block, the hc_head and the embedding it reads live on the last stage; with full
// activation recompute inside the stages' replayed forwards.
TEST(PpTrain, V4MatchesSingleRankWithMtp) {
  const int n = parallel::test_world().size();
  Case su{tiny_v4(), 0.0, 0.3};
  su.recompute = model::Recompute::Full;
  parity(su, DpOptions{1500, true}, 3, 4, 1, 13, 1, 1, pp_for(n));
}

// Selective recompute of the MoE blocks inside the stages (V3 with its MTP layer, V4 with its MTP
// block on the last stage).
TEST(PpTrain, SelectiveMoeRecomputeMatchesSingleRank) {
  const int n = parallel::test_world().size();
  Case v3{tiny_v3_mtp(), 0.01, 0.3};
  v3.recompute = model::Recompute::Selective;
  parity(v3, DpOptions{997, true}, 3, 4, 1, 13, 1, 1, pp_for(n));
  Case v4{tiny_v4(), 0.0, 0.3};
  v4.recompute = model::Recompute::Selective;
  parity(v4, DpOptions{1500, true}, 3, 4, 1, 13, 1, 1, pp_for(n));
}

// DeepSeek-V4's CSA indexer loss (sparse stage) with the MTP block: each stage's CSA layers add
// their indexer loss and recall; under full activation recompute.
TEST(PpTrain, V4IndexerLossMatchesSingleRank) {
  const int n = parallel::test_world().size();
  Case su{tiny_v4(), 0.0, 0.3};
  su.ix_weight = 0.8;
  su.recompute = model::Recompute::Full;
  parity(su, DpOptions{1500, true}, 3, 4, 1, 13, 1, 1, pp_for(n));
}

// Stages of other sizes: the first stage with the embedding only (2 ranks), or the last with the
// head and MTP only (3 ranks), as parallel.pp_layers allows.
TEST(PpTrain, UnevenStages) {
  const int n = parallel::test_world().size();
  if (n == 4) GTEST_SKIP() << "2 and 3 ranks";
  const std::vector<int> layers = n == 2 ? std::vector<int>{0, 3} : std::vector<int>{1, 2, 0};
  for (const json& mj : {tiny_v3(), tiny_v4()}) {
    const bool v4 = mj["model_type"] == "deepseek_v4";
    Case su{mj, v4 ? 0.0 : 0.01, v4 ? 0.3 : 0.0};
    parity(su, DpOptions{2000, true}, 2, 3, 2, 7, 1, 1, n, layers);
  }
}

// 4 ranks: dp 2 x pp 2 with expert parallel 2 inside dp (the (1,1,2,2) in this engine's
// convention, where ep divides dp), and tp 2 x pp 2.
TEST(PpTrain, WithDataExpertAndTensorParallel) {
  const int n = parallel::test_world().size();
  if (n != 4) GTEST_SKIP() << "4 ranks";
  json m = tiny_v3();
  m["n_routed_experts"] = 6;
  parity(Case{m, 0.01, 0}, DpOptions{997, true}, 3, 3, 2, 11, 2, 1, 2);
  json t = tiny_v3();
  t["num_attention_heads"] = 6;
  t["intermediate_size"] = 54;
  Case su{t, 0.01, 0};
  su.ocfg.eps = 1e-6f;  // as in test_tp_train.cpp: the tp sums reorder rounding noise
  parity(su, DpOptions{997, true}, 3, 3, 2, 11, 1, 2, 2);
}

// One step's forward and backward over the stages (pipeline_step, no data parallel): each
// stage's gradients are exactly 0 outside its own tensors, and their sum over the stages equals
// the single model's gradient of the same micro-batches (1e-5 of each tensor's norm, with a
// floor of 1e-6 of the whole gradient's); the loss parts add up to the single model's.
TEST(PpTrain, GradientsSumToTheSingleRank) {
  init_threads(1);
  parallel::Communicator& w = parallel::test_world();
  if (w.size() == 4) GTEST_SKIP() << "pp = world size: 2 and 3 ranks";
  const int P = w.size();
  for (const json& mj : {tiny_v3(), tiny_v4()}) {
    const bool v4 = mj["model_type"] == "deepseek_v4";
    Case su{mj, 0.01, v4 ? 0.3 : 0.0};
    const model::ModelConfig cfg = su.cfg();
    const Global g = make_global(1, 4, 1, 2, 11, cfg.vocab_size, 31);
    std::vector<model::Batch> micro;
    std::vector<float> scale;
    for (int a = 0; a < 4; ++a) micro.push_back(g.batch(0, a, 0)), scale.push_back(0.25f + 0.1f * a);
    auto ref = su.make(3);
    double ref_ce = 0, ref_aux = 0, ref_mtp = 0;
    for (size_t k = 0; k < micro.size(); ++k) {
      const model::LossParts lp = ref->forward_backward(micro[k], scale[k]);
      ref_ce += lp.ce, ref_aux += lp.aux, ref_mtp += lp.mtp;
    }

    auto m = su.make(3);
    parallel::ParallelDims dims;
    dims.pp = P;
    const int64_t L = cfg.num_hidden_layers, l0 = dims.stage_first_layer(L, w.rank());
    m->set_pipeline_stage({l0, l0 + dims.stage_layers(L)[w.rank()], w.rank() == 0, w.rank() == P - 1});
    EXPECT_THROW(m->forward(micro[0]), Error);  // a stage runs only through the stage calls
    double wait = 0;
    int before = 0, after = 0;
    const auto parts = pipeline_step(
        *m, w, micro, scale, [&](bool last) { before += last ? 100 : 1; }, [&](bool last) { after += last ? 100 : 1; },
        &wait);
    EXPECT_EQ(before, 100 + (int)micro.size() - 1);  // around every backward, the last one flagged
    EXPECT_EQ(after, 100 + (int)micro.size() - 1);
    double lp[3] = {0, 0, 0};
    for (const auto& p : parts) lp[0] += p.ce, lp[1] += p.aux, lp[2] += p.mtp;
    w.all_reduce(lp, 3);
    EXPECT_LT(rel(lp[0], ref_ce), 1e-6) << cfg.model_type;
    EXPECT_LT(std::fabs(lp[1] - ref_aux), 1e-6 * std::max(1.0, ref_aux)) << cfg.model_type;
    EXPECT_LT(std::fabs(lp[2] - ref_mtp), 1e-6 * std::max(1.0, ref_mtp)) << cfg.model_type;

    std::vector<float> sum(m->G(), m->G() + m->layout.total);
    w.all_reduce(sum.data(), sum.size());
    double total = 0;
    for (int64_t i = 0; i < ref->layout.total; ++i) total += (double)ref->G()[i] * ref->G()[i];
    const double floor = 1e-6 * std::sqrt(total);
    int own = 0;
    for (const model::ParamEntry& e : m->layout.entries) {
      const float* got = sum.data() + e.offset;
      const float* want = ref->G() + e.offset;
      double dd = 0, nn = 0, mine = 0;
      for (int64_t i = 0; i < e.shape.numel(); ++i) {
        dd += (got[i] - want[i]) * (got[i] - want[i]), nn += want[i] * want[i];
        mine += std::fabs(m->G()[e.offset + i]);
      }
      EXPECT_LE(std::sqrt(dd), 1e-5 * std::sqrt(nn) + floor) << cfg.model_type << " " << e.name;
      // Which stage computes this tensor's gradient: its layer's, the embedding on the first
      // (and, for V4's MTP, the last), the rest of the head and the MTP block on the last.
      const bool layer = e.name.rfind("model.layers.", 0) == 0;
      const int64_t li = layer ? std::stoll(e.name.substr(13)) : -1;
      const bool embed = e.name.rfind("model.embed_tokens.", 0) == 0;
      const bool owned = layer ? (li >= m->pipeline_stage().l0 && li < m->pipeline_stage().l1)
                               : embed ? (w.rank() == 0 || (v4 && w.rank() == P - 1)) : w.rank() == P - 1;
      if (!owned) {
        EXPECT_EQ(mine, 0.0) << "rank " << w.rank() << " touched " << e.name;
      }
      own += owned && mine > 0;
    }
    EXPECT_GT(own, 0);
    EXPECT_GT(wait, 0.0);
  }
}

// run_training under pp (dp = world / pp, B rows per data rank) equals one process with dp x B
// rows, eval included; its checkpoint at step 3 resumes in one process with the same losses.
TEST(PpTrain, RunLoopMatchesOneProcessAndResumesInOne) {
  parallel::Communicator& w = parallel::test_world();
  const int pp = pp_for(w.size());
  const fs::path root = loop_corpus(w, "trex_pp_loop_", 47, [](int i) {
    return "crate " + std::to_string(i) + " holds " + std::to_string(7 * i + 5) + " parts " + std::string(i % 5, 'q') +
           " for the depot";
  });
  loop_matches_one_process_and_resumes_in_one(w, root, tiny_v4(), "parallel.pp=" + std::to_string(pp),
                                              w.size() / pp, "stage");
}

// ZeRO-2 with pipeline stages: each stage's gradients are reduce-scattered over the stage's ranks
// every micro-batch, the shared embedding of V4's first and last stage once a step (ZeRO-1); V3
// and V4 with MTP against one process, and on 4 ranks dp 2 x pp 2 with ep 2 (6 experts).
TEST(PpTrain, Zero2MatchesSingleRank) {
  const int n = parallel::test_world().size();
  DpOptions o{997, true};
  o.zero_stage = 2;
  Case v3{tiny_v3(), 0.01, 0};
  parity(v3, o, 3, 4, 2, 11, 1, 1, pp_for(n));
  Case v4{tiny_v4(), 0.0, 0.3};
  parity(v4, o, 2, 3, 1, 13, 1, 1, pp_for(n));
  if (n != 4) return;
  json m = tiny_v3();
  m["n_routed_experts"] = 6;
  parity(Case{m, 0.01, 0}, o, 3, 3, 2, 11, 2, 1, 2);
}

// run_training with ZeRO-2 under pp equals one process; its checkpoint resumes in one process.
TEST(PpTrain, Zero2RunLoopMatchesOneProcessAndResumesInOne) {
  parallel::Communicator& w = parallel::test_world();
  const int pp = pp_for(w.size());
  const fs::path root = loop_corpus(w, "trex_pp_zero2_loop_", 47, [](int i) {
    return "bin " + std::to_string(3 * i + 1) + " takes " + std::string(i % 4, 'z') + " crates of " +
           std::to_string(i * i % 17) + " parts";
  });
  loop_matches_one_process_and_resumes_in_one(w, root, tiny_v3(), "parallel.pp=" + std::to_string(pp),
                                              w.size() / pp, "stage", {"parallel.zero_stage=2"});
}

// A layout the model cannot take is refused before anything runs, naming the field.
TEST(PpTrain, ImpossibleLayoutsAreRefused) {
  const model::ModelConfig cfg = model::parse_config(tiny_v3(), "tiny");
  parallel::ParallelDims d;
  d.pp = 4;  // 3 layers
  try {
    train::validate_layout(d, 4, cfg);
    ADD_FAILURE() << "pp = 4 over 3 layers was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.pp"), std::string::npos) << e.what();
  }
  d.pp = 2;
  d.pp_layers = {1, 1};  // sums to 2, not 3
  EXPECT_THROW(train::validate_layout(d, 2, cfg), UserError);
  model::Model m(cfg, kern::Prec::F32);
  EXPECT_THROW(m.set_pipeline_stage({1, 3, true, true}), Error);  // the first stage starts at layer 0
  // ZeRO-2 needs stage-sharded models: a model holding every stage would have to reduce each
  // micro-batch's gradients over every rank.
  parallel::Communicator& w = parallel::test_world();
  if (w.size() != 2) return;
  model::Model whole(cfg, kern::Prec::F32);
  if (w.rank() == 0) whole.set_pipeline_stage({0, 1, true, false});
  else whole.set_pipeline_stage({1, 3, false, true});
  DpOptions o;
  o.zero_stage = 2;
  o.pp = 2;
  o.pp_comm = &w;
  EXPECT_THROW(DataParallel(w, whole, AdamWConfig{}, o), Error);
}
