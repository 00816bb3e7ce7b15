// Context parallel (model/context_parallel.h, parallel.cp), fp32, against one process: cp = 2 on 2
// ranks and cp = 3 on 3 ranks; on 4 ranks (CTest mpi_cp_np4) cp 2 x dp 2, cp 2 x ep 2, cp 2 x pp 2
// and cp 2 x tp 2. V3 and V3.2 models of odd sizes with two MTP layers, the sequence-wise aux loss
// and the router-bias update, rows packed with several documents, 10 AdamW steps.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "model/context_parallel.h"
#include "tests/mpi/cp_cases.h"
#include "tests/mpi/train_parity.h"
#include "train/activation_estimate.h"
#include "train/loop.h"

using namespace trex;
using namespace trex::train;
using namespace trex::testing;
namespace fs = std::filesystem;

namespace {

json cp_v3() {  // hidden 45, 5 heads, 10 experts (top 3), two MTP layers
  json m = tiny_v3_mtp(2);
  m["hidden_size"] = 45;
  m["num_attention_heads"] = 5;
  m["n_routed_experts"] = 10;
  m["num_experts_per_tok"] = 3;
  return m;
}

// DeepSeek-V3.2: hidden 45, 5 heads, 3 indexer heads, index_topk 4 (below most documents' and
// every row's length, so the selection matters), two MTP layers.
json cp_v32() {
  json m = tiny_v32();
  m["hidden_size"] = 45;
  m["num_attention_heads"] = 5;
  m["num_key_value_heads"] = 5;
  m["index_n_heads"] = 3;
  m["index_topk"] = 4;
  m["num_nextn_predict_layers"] = 2;
  return m;
}

// cp x tp: the heads split by tp 2 (6 of them) and the dense width (54).
json cp_tp(json m) {
  m["num_attention_heads"] = 6;
  if (m.contains("num_key_value_heads")) m["num_key_value_heads"] = 6;
  m["intermediate_size"] = 54;
  return m;
}

Case cp_case(json model, bool packed, double mtp = 0.3) {
  Case su = tp_case(std::move(model), 0.01, mtp);
  su.packed = packed;
  return su;
}

// A sequence length with chunks of odd length for this cp (2 cp c).
int64_t seq_for(int cp) { return 2 * cp * (cp == 2 ? 7 : 3); }

}  // namespace

// The zigzag split covers every position of a row once; rank r holds chunks r and 2 cp - 1 - r.
TEST(CpSplit, ZigzagCoversEveryPosition) {
  for (int cp = 1; cp <= 4; ++cp) {
    const int64_t T = 2 * cp * 5;
    std::vector<int> seen(T, 0);
    for (int r = 0; r < cp; ++r) {
      model::ContextParallel c;
      c.rank = r, c.size = cp;
      const model::CpSplit s = model::cp_split(T, c);
      EXPECT_EQ(s.local(), 10);
      EXPECT_EQ(s.index(0), r * 5);
      EXPECT_EQ(s.index(5), (2 * cp - 1 - r) * 5);
      for (int64_t j = 0; j < s.local(); ++j) ++seen[s.index(j)];
    }
    for (int64_t t = 0; t < T; ++t) EXPECT_EQ(seen[t], 1) << "cp " << cp << " position " << t;
  }
}

// Sequence lengths that do not split in 2 cp chunks, and a cp below 1, are refused naming the
// field.
TEST(CpSplit, Refusals) {
  try {
    model::check_cp_seq_len(14, 3, "data.seq_len");
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("data.seq_len = 14 is not a multiple of 2 x parallel.cp = 6"),
              std::string::npos) << e.what();
  }
  try {
    model::check_context_parallel(0);
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.cp = 0"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(model::check_context_parallel(3));
}

// The same refusals when a run's layout is resolved (trex train, trex bench step): the message
// names the field, the value and the model.
TEST(CpSplit, RunConfigRefusals) {
  const auto refusal = cp_run_config_refusal;
  auto has = [](const std::string& msg, const std::string& part) { return msg.find(part) != std::string::npos; };
  std::string e = refusal(tiny_v3(), 26, {"parallel.cp=2"}, 2);
  EXPECT_TRUE(has(e, "data.seq_len = 26 is not a multiple of 2 x parallel.cp = 4")) << e;
  EXPECT_EQ(refusal(tiny_v4(), 24, {"parallel.cp=2"}, 2), "");
  EXPECT_EQ(refusal(tp_v4(), 24, {"parallel.cp=2", "parallel.tp=2"}, 4), "");  // every family composes with tp
  EXPECT_EQ(refusal(tiny_v32(), 24, {"parallel.cp=2"}, 2), "");
  EXPECT_EQ(refusal(tp_v3(), 24, {"parallel.cp=2", "parallel.tp=2"}, 4), "");
  e = refusal(tp_v3(), 24, {"parallel.cp=2", "parallel.tp=4"}, 8);
  EXPECT_TRUE(has(e, "parallel.tp = 4 does not divide")) << e;
  e = refusal(tiny_v3(), 24, {"parallel.cp=2"}, 3);
  EXPECT_TRUE(has(e, "parallel.tp * parallel.cp * parallel.pp * parallel.dp")) << e;
  e = refusal(tiny_v3(), 24, {"parallel.cp=0"}, 1);
  EXPECT_TRUE(has(e, "parallel.cp")) << e;
  EXPECT_EQ(refusal(tiny_v3(), 24, {"parallel.cp=3"}, 3), "");
}

// The whole world is one cp group (2 or 3 ranks; on 4 ranks cp 2 x dp 2): 10 steps, packed rows.
TEST(CpTrain, V3PackedMatchesOneProcess) {
  const int n = parallel::test_world().size();
  const int cp = n == 4 ? 2 : n;
  DpOptions o{997, true};
  parity(cp_case(cp_v3(), true), o, 10, 1, 2, seq_for(cp), 1, 1, 1, {}, cp);
}

// One document per row, two micro-batches per step, no overlap.
TEST(CpTrain, V3TwoMicroBatchesMatchesOneProcess) {
  const int n = parallel::test_world().size();
  const int cp = n == 4 ? 2 : n;
  DpOptions o{0, false};
  parity(cp_case(cp_v3(), false), o, 4, 2, 3, seq_for(cp), 1, 1, 1, {}, cp);
}

// DeepSeek-V2 (no q LoRA, softmax router with groups).
TEST(CpTrain, V2MatchesOneProcess) {
  const int n = parallel::test_world().size();
  const int cp = n == 4 ? 2 : n;
  json m = tiny_v2();
  m["hidden_size"] = 45;
  parity(cp_case(m, true, 0), DpOptions{997, true}, 4, 1, 2, seq_for(cp), 1, 1, 1, {}, cp);
}

// DeepSeek-V3.2: each local query ranks the keys of its document before it (the indexer keys
// all-gathered), the sparse attention reads the whole rows' keys; packed rows, two MTP layers.
TEST(CpTrain, V32PackedMatchesOneProcess) {
  const int n = parallel::test_world().size();
  const int cp = n == 4 ? 2 : n;
  parity(cp_case(cp_v32(), true), DpOptions{997, true}, 10, 1, 2, seq_for(cp), 1, 1, 1, {}, cp);
}

// DeepSeek-V3.2, one document a row (the top-k over rows longer than any packed document), two
// micro-batches a step.
TEST(CpTrain, V32TwoMicroBatchesMatchesOneProcess) {
  const int n = parallel::test_world().size();
  const int cp = n == 4 ? 2 : n;
  parity(cp_case(cp_v32(), false), DpOptions{0, false}, 4, 2, 2, seq_for(cp), 1, 1, 1, {}, cp);
}

// DeepSeek-V3.2 with the indexer loss, sparse stage and dense warm-up: the indexer keys'
// gradients reduce-scattered to their owners, the loss and recall summed over the cp group.
TEST(CpTrain, V32IndexerLossMatchesOneProcess) {
  const int n = parallel::test_world().size();
  const int cp = n == 4 ? 2 : n;
  for (model::IndexerStage st : {model::IndexerStage::Sparse, model::IndexerStage::DenseWarmup}) {
    Case su = cp_case(cp_v32(), true);
    su.ix_weight = 0.8, su.ix_stage = st;
    parity(su, DpOptions{997, true}, 4, 1, 2, seq_for(cp), 1, 1, 1, {}, cp);
  }
}

// 4 ranks: cp 2 x tp 2 (each tp rank gathers the latents over its cp group; the latent's
// gradient is partial over tp through the cp reduce-scatter), V3 and V3.2.
TEST(CpTrain, WithTensorParallel) {
  if (parallel::test_world().size() != 4) GTEST_SKIP() << "needs 4 ranks";
  parity(cp_case(cp_tp(cp_v3()), true), DpOptions{997, true}, 10, 1, 2, seq_for(2), 1, 2, 1, {}, 2);
  parity(cp_case(cp_tp(cp_v32()), true), DpOptions{997, true}, 6, 1, 2, seq_for(2), 1, 2, 1, {}, 2);
}

// 4 ranks: cp 2 x tp 2 with sequence parallel (the tp ranks shard the cp rank's tokens outside
// the attention and the dense MLP; the aux loss's counts summed over tp, then cp).
TEST(CpTrain, WithSequenceParallel) {
  if (parallel::test_world().size() != 4) GTEST_SKIP() << "needs 4 ranks";
  DpOptions o{997, true};
  o.sequence_parallel = true;
  parity(cp_case(cp_tp(cp_v3()), true), o, 10, 1, 2, seq_for(2), 1, 2, 1, {}, 2);
  parity(cp_case(cp_tp(cp_v32()), true), o, 6, 1, 2, seq_for(2), 1, 2, 1, {}, 2);
}

// 4 ranks: cp 2 x ep 2 (experts sharded over the dp ranks of each cp rank).
TEST(CpTrain, WithExpertParallel) {
  if (parallel::test_world().size() != 4) GTEST_SKIP() << "needs 4 ranks";
  parity(cp_case(cp_v3(), true), DpOptions{997, true}, 6, 1, 2, seq_for(2), 2, 1, 1, {}, 2);
}

// 4 ranks: cp 2 x pp 2 (the stages exchange each cp rank's chunks; 1F1B over 4 micro-batches),
// MTP layers on the last stage, with full recompute.
TEST(CpTrain, WithPipelineParallel) {
  if (parallel::test_world().size() != 4) GTEST_SKIP() << "needs 4 ranks";
  Case su = cp_case(cp_v3(), true);
  su.recompute = model::Recompute::Full;
  parity(su, DpOptions{997, true}, 4, 4, 1, seq_for(2), 1, 1, 2, {}, 2);
}

// The same with selective recompute of the MoE blocks (the replays repeat the aux loss's count
// sums over the cp group).
TEST(CpTrain, WithPipelineParallelSelectiveRecompute) {
  if (parallel::test_world().size() != 4) GTEST_SKIP() << "needs 4 ranks";
  Case su = cp_case(cp_v3(), true);
  su.recompute = model::Recompute::Selective;
  parity(su, DpOptions{997, true}, 4, 4, 1, seq_for(2), 1, 1, 2, {}, 2);
}

// The run loop under cp = world size (on 4 ranks cp 2 x dp 2): losses, tokens and eval losses of
// 6 steps equal one process's; its step-3 checkpoint resumed in one process gives the same losses.
TEST(CpTrain, RunLoopMatchesOneProcessAndResumesInOne) {
  parallel::Communicator& w = parallel::test_world();
  const int cp = w.size() == 4 ? 2 : w.size();
  const fs::path root = loop_corpus(w, "trex_cp_loop_", 53, [](int i) {
    return "crate " + std::to_string(i) + " holds " + std::to_string(11 * i + 5) + " parts " + std::string(i % 5, 'q') +
           " for plant " + std::to_string(i % 7);
  });
  loop_matches_one_process_and_resumes_in_one(w, root, tiny_v3(), "parallel.cp=" + std::to_string(cp), w.size() / cp,
                                              "cp rank");
}

// 4 ranks: the run loop at cp 2 x tp 2 (tp-sharded models, sequence parallel) equals one process,
// and its checkpoint resumes in one process. DeepSeek-V3.2. (MTP under cp x tp: the parity tests
// above; the helper's one-process run takes no overrides.)
TEST(CpTrain, RunLoopWithTensorParallel) {
  parallel::Communicator& w = parallel::test_world();
  if (w.size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const fs::path root = loop_corpus(w, "trex_cp_tp_loop_", 53, [](int i) {
    return "crate " + std::to_string(i) + " holds " + std::to_string(11 * i + 5) + " parts " + std::string(i % 5, 'q') +
           " for plant " + std::to_string(i % 7);
  });
  loop_matches_one_process_and_resumes_in_one(w, root, cp_tp(cp_v32()), "parallel.cp=2", 1, "cp x tp rank",
                                              {"parallel.tp=2", "parallel.sequence_parallel=true"});
}

// A checkpoint written at cp 2 (ranks 0 and 1) resumes at cp 1 (rank 0) and, on 3 ranks, at cp 3:
// the losses of steps 4-6 equal the uninterrupted one-process run's (cp does not change the state).
// ov: the run's other settings (MTP, the indexer loss). Collective; removes its folder.

// The resume tests' corpus.
static std::string route_line(int i) {
  return "route " + std::to_string(i) + " serves " + std::to_string(7 * i + 3) + " stops " + std::string(i % 4, 'k');
}

TEST(CpTrain, ResumesAcrossCpSizes) {
  if (parallel::test_world().size() == 4) GTEST_SKIP() << "2 and 3 ranks";
  resumes_across_cp_sizes(tiny_v3_mtp(1), "trex_cp_resume_", {"train.mtp_loss_weight=0.3"}, route_line);
}

// DeepSeek-V3.2 with an MTP layer and the indexer loss (the indexer's tensors train).
TEST(CpTrain, V32ResumesAcrossCpSizes) {
  if (parallel::test_world().size() == 4) GTEST_SKIP() << "2 and 3 ranks";
  json m = cp_v32();
  m["num_nextn_predict_layers"] = 1;
  resumes_across_cp_sizes(m, "trex_cp_resume_v32_", {"train.mtp_loss_weight=0.3", "train.indexer_loss_weight=0.5"},
                          route_line);
}

// The activation estimate (train/activation_estimate.h, cp) replays one context-parallel
// forward_backward: it equals the measured arena peak on every cp rank (every rank holds B x T / cp
// tokens). bf16 and fp32, no, full and selective recompute, with and without MTP layers. DeepSeek-V3.2 (one
// document a row; the ranks' key lists differ, the estimate is the largest rank's): with the
// indexer loss too.
TEST(CpTrain, ActivationEstimateMatchesTheArena) {
  init_threads(1);
  parallel::Communicator& w = parallel::test_world();
  const int cp = w.size() == 4 ? 2 : w.size();
  parallel::ParallelDims dims;
  dims.dp = w.size() / cp, dims.cp = cp;
  parallel::ProcessGroups groups = parallel::make_process_groups(w, dims);
  for (const json& mj : {tiny_v3(), cp_v3(), tiny_v2(), cp_v32()})
    for (double ix : {0.0, 0.5})
      for (int64_t B : {1, 3})
        for (kern::Prec prec : {kern::Prec::BF16, kern::Prec::F32})
          for (model::Recompute rec : {model::Recompute::None, model::Recompute::Full, model::Recompute::Selective}) {
            const double mtp = mj.value("num_nextn_predict_layers", 0) > 0 ? 0.3 : 0.0;
            const model::ModelConfig base = model::parse_config(mj, "tiny");
            if (ix > 0 && !base.is_v32()) continue;
            const model::ModelConfig cfg = model::with_mtp(base, mtp > 0 ? base.num_nextn_predict_layers : 0);
            const int64_t T = seq_for(cp);
            const model::TrainOptions o{0.01, mtp, rec, ix};
            model::Model m(base, prec, o);
            m.init_random(3);
            m.set_context_parallel(groups.cp.get());
            const Global g = make_global(1, 1, 1, B, T, cfg.vocab_size, 29, !cfg.is_v32());
            m.forward_backward(g.batch(0, 0, 0));
            const double est = activation_peak_bytes(m.cfg, B, T, prec, rec, 1, 1, false, {}, o, cp);
            int64_t peak = (int64_t)m.peak_activation_bytes();
            EXPECT_LE((double)peak, est);
            groups.cp->all_reduce(&peak, 1, parallel::ReduceOp::Max);
            EXPECT_EQ(est, (double)peak) << cfg.model_type << (prec == kern::Prec::BF16 ? " bf16" : " fp32")
                                         << recompute_label(rec) << " B " << B
                                         << " mtp " << mtp << " ix " << ix;
          }
}

// 4 ranks, cp 2 x tp 2 with and without sequence parallel: the estimate with the tp size (this
// rank's heads, the sequence-parallel shard) equals the largest measured peak.
TEST(CpTrain, ActivationEstimateWithTensorParallel) {
  parallel::Communicator& w = parallel::test_world();
  if (w.size() != 4) GTEST_SKIP() << "needs 4 ranks";
  init_threads(1);
  parallel::ParallelDims dims;
  dims.tp = 2, dims.cp = 2;
  parallel::ProcessGroups groups = parallel::make_process_groups(w, dims);
  for (const json& mj : {cp_tp(cp_v3()), cp_tp(cp_v32())})
    for (bool sp : {false, true})
      for (kern::Prec prec : {kern::Prec::BF16, kern::Prec::F32})
        for (model::Recompute rec : {model::Recompute::None, model::Recompute::Full, model::Recompute::Selective}) {
          const model::ModelConfig base = model::parse_config(mj, "tiny");
          expect_cp_tp_estimate(w, groups, base, prec, {0.01, 0.3, rec}, sp, 3, seq_for(2), !base.is_v32(),
                                base.model_type + (sp ? " sp" : "") + (prec == kern::Prec::BF16 ? " bf16" : " fp32") +
                                    recompute_label(rec));
        }
}
