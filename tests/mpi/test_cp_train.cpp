// Context parallel (model/context_parallel.h, parallel.cp), fp32, against one process: cp = 2 on 2
// ranks and cp = 3 on 3 ranks; on 4 ranks (CTest mpi_cp_np4) cp 2 x dp 2, cp 2 x ep 2 and
// cp 2 x pp 2. A V3 model of odd sizes with two MTP layers, the sequence-wise aux loss and the
// router-bias update, rows packed with several documents, 10 AdamW steps.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "model/context_parallel.h"
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

// Sequence lengths that do not split in 2 cp chunks, and the models without context parallelism
// (DeepSeek-V3.2), are refused naming the field.
TEST(CpSplit, Refusals) {
  try {
    model::check_cp_seq_len(14, 3, "data.seq_len");
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("data.seq_len = 14 is not a multiple of 2 x parallel.cp = 6"),
              std::string::npos) << e.what();
  }
  for (const json& m : {tiny_v32()}) {
    const model::ModelConfig cfg = model::parse_config(m, "tiny");
    try {
      model::check_context_parallel(cfg, 2);
      FAIL() << "no error for " << cfg.model_type;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("parallel.cp = 2"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(cfg.model_type), std::string::npos) << e.what();
    }
  }
  EXPECT_NO_THROW(model::check_context_parallel(model::parse_config(tiny_v3(), "tiny"), 2));
  EXPECT_NO_THROW(model::check_context_parallel(model::parse_config(tiny_v4(), "tiny"), 2));
}

// The same refusals when a run's layout is resolved (trex train, trex bench step): the message
// names the field, the value and the model.
TEST(CpSplit, RunConfigRefusals) {
  auto refusal = [](json model, int64_t seq_len, std::vector<std::string> ov, int world) -> std::string {
    model["vocab_size"] = 260;
    json j = loop_config("/nonexistent", "corpus.jsonl", 1, 2, model);
    j["data"]["seq_len"] = seq_len;
    try {
      (void)resolve_parallel(parse_run_config(j, "run.toml", ov), world);
    } catch (const UserError& e) {
      return e.what();
    }
    return "";
  };
  auto has = [](const std::string& msg, const std::string& part) { return msg.find(part) != std::string::npos; };
  std::string e = refusal(tiny_v3(), 26, {"parallel.cp=2"}, 2);
  EXPECT_TRUE(has(e, "data.seq_len = 26 is not a multiple of 2 x parallel.cp = 4")) << e;
  EXPECT_EQ(refusal(tiny_v4(), 24, {"parallel.cp=2"}, 2), "");
  e = refusal(tiny_v32(), 24, {"parallel.cp=2"}, 2);
  EXPECT_TRUE(has(e, "parallel.cp = 2") && has(e, "deepseek_v32")) << e;
  e = refusal(tp_v3(), 24, {"parallel.cp=2", "parallel.tp=2"}, 4);
  EXPECT_TRUE(has(e, "parallel.cp = 2 with parallel.tp = 2")) << e;
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

// A checkpoint written at cp 2 (ranks 0 and 1) resumes at cp 1 (rank 0) and, on 3 ranks, at cp 3:
// the losses of steps 4-6 equal the uninterrupted one-process run's (cp does not change the state).
TEST(CpTrain, ResumesAcrossCpSizes) {
  parallel::Communicator& w = parallel::test_world();
  if (w.size() == 4) GTEST_SKIP() << "2 and 3 ranks";
  const fs::path root = loop_corpus(w, "trex_cp_resume_", 41, [](int i) {
    return "route " + std::to_string(i) + " serves " + std::to_string(7 * i + 3) + " stops " + std::string(i % 4, 'k');
  });
  const std::string data = (root / "corpus.jsonl").string();
  auto cfg = [&](const std::string& d, std::vector<std::string> ov) {
    ov.push_back("train.mtp_loss_weight=0.3");
    return parse_run_config(loop_config((root / d).string(), data, 1, 6, tiny_v3_mtp(1)), "run.toml", ov);
  };
  auto copy_step3 = [&](const std::string& to) {
    fs::create_directories(root / to / "checkpoints");
    fs::copy(root / "cp2" / "checkpoints" / "step-00000003", root / to / "checkpoints" / "step-00000003",
             fs::copy_options::recursive);
  };
  std::unique_ptr<parallel::Communicator> two = w.split(w.rank() < 2 ? 0 : -1, w.rank());
  if (two) run_training(cfg("cp2", {"parallel.cp=2"}), bytes_tok(), two.get());
  w.barrier();
  if (w.rank() == 0) {
    run_training(cfg("one", {}), bytes_tok());
    copy_step3("cp2_then_1");
    run_training(cfg("cp2_then_1", {"checkpoint.resume=auto"}), bytes_tok());
    if (w.size() == 3) copy_step3("cp2_then_3");
  }
  w.barrier();
  if (w.size() == 3) run_training(cfg("cp2_then_3", {"checkpoint.resume=auto", "parallel.cp=3"}), bytes_tok(), &w);
  if (w.rank() == 0) {
    const auto one = metrics((root / "one").string()), two_m = metrics((root / "cp2").string());
    ASSERT_EQ(one.size(), 6u);
    ASSERT_EQ(two_m.size(), 6u);
    for (size_t s = 0; s < 6; ++s)
      EXPECT_LT(rel(two_m[s]["loss"].get<double>(), one[s]["loss"].get<double>()), 1e-5) << "cp 2 step " << s + 1;
    for (const char* d : {"cp2_then_1", "cp2_then_3"}) {
      if (std::string(d) == "cp2_then_3" && w.size() != 3) continue;
      const auto b = metrics((root / d).string());
      ASSERT_EQ(b.size(), 3u) << d << ": steps 4-6 after the resume";
      for (size_t s = 3; s < 6; ++s) {
        EXPECT_EQ(b[s - 3]["step"].get<int64_t>(), (int64_t)s + 1) << d;
        EXPECT_LT(rel(b[s - 3]["loss"].get<double>(), one[s]["loss"].get<double>()), 1e-5) << d << " step " << s + 1;
      }
    }
    fs::remove_all(root);
  }
  w.barrier();
}

// The activation estimate (train/activation_estimate.h, cp) replays one context-parallel
// forward_backward: it equals the measured arena peak on every cp rank (every rank holds B x T / cp
// tokens). bf16 and fp32, no and full recompute, with and without MTP layers.
TEST(CpTrain, ActivationEstimateMatchesTheArena) {
  init_threads(1);
  parallel::Communicator& w = parallel::test_world();
  const int cp = w.size() == 4 ? 2 : w.size();
  parallel::ParallelDims dims;
  dims.dp = w.size() / cp, dims.cp = cp;
  parallel::ProcessGroups groups = parallel::make_process_groups(w, dims);
  for (const json& mj : {tiny_v3(), cp_v3(), tiny_v2()})
    for (int64_t B : {1, 3})
      for (kern::Prec prec : {kern::Prec::BF16, kern::Prec::F32})
        for (model::Recompute rec : {model::Recompute::None, model::Recompute::Full}) {
          const double mtp = mj.value("num_nextn_predict_layers", 0) > 0 ? 0.3 : 0.0;
          const model::ModelConfig cfg = model::parse_config(mj, "tiny");
          const int64_t T = seq_for(cp);
          model::Model m(cfg, prec, {0.01, mtp, rec});
          m.init_random(3);
          m.set_context_parallel(groups.cp.get());
          const Global g = make_global(1, 1, 1, B, T, cfg.vocab_size, 29, true);
          m.forward_backward(g.batch(0, 0, 0));
          const double est = activation_peak_bytes(m.cfg, B, T, prec, rec, 1, 1, false, {}, {}, cp);
          EXPECT_EQ(est, (double)m.peak_activation_bytes())
              << cfg.model_type << (prec == kern::Prec::BF16 ? " bf16" : " fp32")
              << (rec == model::Recompute::Full ? " full" : " none") << " B " << B << " mtp " << mtp;
        }
}
