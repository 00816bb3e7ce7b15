// Context parallel x tensor parallel for DeepSeek-V4 (model/v4_context_parallel.h, parallel.cp with
// parallel.tp), fp32, against one process, on 4 ranks (CTest mpi_cp_np4): cp 2 x tp 2, with and
// without sequence parallel. Each tp rank holds 3 of the 6 heads and 1 of the 2 output groups and
// exchanges the key side (the MQA kv, the compressors, the CSA indexer's keys) over the cp group
// of its tp slice. CpV4Train's model (every attention kind: CSA of rate 3 and top-2, HCA of rate
// 5, sliding window 7, sinks; a hash layer, hc_mult 3, an MTP layer) with 6 heads in 2 output
// groups; rows packed with several documents; chunks of 7 tokens, so no rate divides a rank's
// share and compressor windows cross the rank boundaries. 10 AdamW steps.
#include <gtest/gtest.h>

#include <filesystem>

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

json cp_tp_v4() {  // CpV4Train's model, the heads and output groups split by tp 2
  json m = cp_v4();
  m["num_attention_heads"] = 6;
  m["o_groups"] = 2;
  return m;
}

Case cp_tp_v4_case(bool packed, model::Recompute rec = model::Recompute::None) {
  return cp_v4_case(cp_tp_v4(), packed, rec);
}

constexpr int64_t kSeq = 2 * 2 * 7;  // rows of 2 cp chunks of 7 tokens

bool four_ranks() { return parallel::test_world().size() == 4; }

}  // namespace

// cp 2 x tp 2: 10 steps of packed rows equal one process (losses and every parameter).
TEST(CpTpV4Train, MatchesOneProcess) {
  if (!four_ranks()) GTEST_SKIP() << "needs 4 ranks";
  parity(cp_tp_v4_case(true), DpOptions{997, true}, 10, 1, 2, kSeq, 1, 2, 1, {}, 2);
}

// cp 2 x tp 2 with sequence parallel (the tp ranks shard the cp rank's tokens outside the
// attention; the aux loss's counts summed over tp, then cp); two micro-batches of one document a
// row, full recompute.
TEST(CpTpV4Train, WithSequenceParallel) {
  if (!four_ranks()) GTEST_SKIP() << "needs 4 ranks";
  DpOptions o{997, true};
  o.sequence_parallel = true;
  parity(cp_tp_v4_case(true), o, 10, 1, 2, kSeq, 1, 2, 1, {}, 2);
  parity(cp_tp_v4_case(false, model::Recompute::Full), o, 4, 2, 3, kSeq, 1, 2, 1, {}, 2);
}

// A run config with cp 2 x tp 2 is accepted for DeepSeek-V4 (it was refused before V4's key side
// was exchanged per tp slice).
TEST(CpTpV4Train, RunConfigAccepted) {
  EXPECT_EQ(cp_run_config_refusal(cp_tp_v4(), 28, {"parallel.cp=2", "parallel.tp=2"}, 4), "");
  EXPECT_EQ(cp_run_config_refusal(cp_tp_v4(), 28, {"parallel.cp=2", "parallel.tp=2", "parallel.sequence_parallel=true"}, 4), "");
}

// The run loop at cp 2 x tp 2 (tp-sharded models, sequence parallel) equals one process, and its
// checkpoint resumes in one process.
TEST(CpTpV4Train, RunLoopMatchesOneProcessAndResumesInOne) {
  parallel::Communicator& w = parallel::test_world();
  if (w.size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const fs::path root = loop_corpus(w, "trex_cp_tp_v4_loop_", 53, [](int i) {
    return "lane " + std::to_string(i) + " feeds " + std::to_string(9 * i + 4) + " bins " + std::string(i % 6, 'v');
  });
  loop_matches_one_process_and_resumes_in_one(w, root, cp_tp_v4(), "parallel.cp=2", 1, "cp x tp rank",
                                              {"parallel.tp=2", "parallel.sequence_parallel=true"});
}

// The activation estimate with cp 2 and tp 2 (this rank's heads and groups, the whole rows' key
// side; sequence parallel: the rank's shard outside the attention) equals the largest measured
// arena peak of the 4 ranks, and no rank's peak exceeds it. bf16 and fp32, no, full and selective
// recompute, with and without the MTP layer, one document a row.
TEST(CpTpV4Train, ActivationEstimateMatchesTheArena) {
  parallel::Communicator& w = parallel::test_world();
  if (w.size() != 4) GTEST_SKIP() << "needs 4 ranks";
  init_threads(1);
  parallel::ParallelDims dims;
  dims.tp = 2, dims.cp = 2;
  parallel::ProcessGroups groups = parallel::make_process_groups(w, dims);
  for (const double mtp : {0.0, 0.3})
    for (bool sp : {false, true})
      for (int64_t B : {1, 3})
        for (kern::Prec prec : {kern::Prec::BF16, kern::Prec::F32})
          for (model::Recompute rec : {model::Recompute::None, model::Recompute::Full, model::Recompute::Selective})
            for (unsigned mods : {unsigned(model::kRecomputeMoe),
                                  unsigned(model::kRecomputeMhc | model::kRecomputeMlaUpProj | model::kRecomputeMoeAct),
                                  unsigned(model::kRecomputeMoeOut | model::kRecomputeSharedExperts)}) {
              if (rec != model::Recompute::Selective && mods != model::kRecomputeMoe) continue;
              json mj = cp_tp_v4();
              if (mtp == 0) mj["num_nextn_predict_layers"] = 0;
              const model::ModelConfig cfg = model::parse_config(mj, "tiny");
              model::TrainOptions o{0.01, mtp, rec};
              o.recompute_modules = mods;
              expect_cp_tp_estimate(w, groups, cfg, prec, o, sp, B, kSeq, false,
                                    std::string(sp ? "sp " : "") + (prec == kern::Prec::BF16 ? "bf16" : "fp32") +
                                        recompute_label(rec) + " modules " + std::to_string(mods) + " B " +
                                        std::to_string(B) + " mtp " + std::to_string(mtp));
            }
}
