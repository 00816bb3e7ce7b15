// Cases shared by the context-parallel tests of every model family (tests/mpi/test_cp_train.cpp,
// test_cp_v4.cpp).
//
// resumes_across_cp_sizes: a run of 6 steps at cp 2 (ranks 0 and 1) whose
// step-3 checkpoint resumes at cp 1 (rank 0) and, on 3 ranks, at cp 3; every loss equals the
// uninterrupted one-process run's to 1e-5. ov: overrides of every run; text: the corpus's
// document i. Collective over the test world (2 or 3 ranks).
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "tests/mpi/train_parity.h"
#include "train/activation_estimate.h"
#include "train/loop.h"

namespace trex::testing {

// What resolving the run's layout throws (its message; "" if nothing) for a run of `model` at
// seq_len over `world` ranks with the overrides ov.
inline std::string cp_run_config_refusal(json model, int64_t seq_len, const std::vector<std::string>& ov, int world) {
  model["vocab_size"] = 260;
  json j = loop_config("/nonexistent", "corpus.jsonl", 1, 2, model);
  j["data"]["seq_len"] = seq_len;
  try {
    (void)train::resolve_parallel(train::parse_run_config(j, "run.toml", ov), world);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

inline void resumes_across_cp_sizes(const json& model, const std::string& prefix, std::vector<std::string> ov,
                                    const std::function<std::string(int)>& text) {
  namespace fs = std::filesystem;
  using train::parse_run_config;
  using train::run_training;
  parallel::Communicator& w = parallel::test_world();
  const fs::path root = loop_corpus(w, prefix, 41, text);
  const std::string data = (root / "corpus.jsonl").string();
  auto cfg = [&](const std::string& d, std::vector<std::string> more) {
    more.insert(more.end(), ov.begin(), ov.end());
    return parse_run_config(loop_config((root / d).string(), data, 1, 6, model), "run.toml", more);
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

// One forward_backward of cfg with options o under cp 2 x tp 2 (groups of dims tp 2, cp 2 over
// w), B rows of T tokens: the activation estimate bounds this rank's arena peak and equals the
// largest of the 4 ranks' peaks.
inline void expect_cp_tp_estimate(parallel::Communicator& w, const parallel::ProcessGroups& groups,
                                  const model::ModelConfig& cfg, kern::Prec prec, const model::TrainOptions& o,
                                  bool sp, int64_t B, int64_t T, bool packed, const std::string& what) {
  model::Model m(cfg, prec, o);
  m.init_random(3);
  m.set_tensor_parallel(groups.tp.get(), sp);
  m.set_context_parallel(groups.cp.get());
  const Global g = make_global(1, 1, 1, B, T, cfg.vocab_size, 29, packed);
  m.forward_backward(g.batch(0, 0, 0));
  const double est = train::activation_peak_bytes(m.cfg, B, T, prec, o.recompute, 2, 1, sp, {}, o, 2);
  int64_t peak = (int64_t)m.peak_activation_bytes();
  EXPECT_LE((double)peak, est) << what;
  w.all_reduce(&peak, 1, parallel::ReduceOp::Max);
  EXPECT_EQ(est, (double)peak) << what;
}

// CpV4Train's DeepSeek-V4 model (tests/mpi/test_cp_v4.cpp; test_cp_tp_v4.cpp splits its heads):
// tiny_v4 with a sliding window of 7, CSA of rate 3 and HCA of rate 5 (neither divides a rank's
// chunks of 7 tokens), 6 routed experts (split by ep 2).
inline json cp_v4() {
  json m = tiny_v4();
  m["sliding_window"] = 7;
  m["compress_rates"] = {{"compressed_sparse_attention", 3}, {"heavily_compressed_attention", 5}};
  m["n_routed_experts"] = 6;
  return m;
}

// The parity case of a cp V4 model at lr 1e-3 (as the V4 sequence-parallel tests): cp computes the
// same sums in other shapes and orders, and this tiny V4 model amplifies such rounding differences
// through AdamW (measured at lr 3e-3 on cp 3: gradient norms 5e-5 apart by step 6 while the
// one-step gradients agree to 6e-6, CpV4Train.GradientsMatchOneProcess); at 1e-3 the runs stay
// within 1e-5.
inline Case cp_v4_case(const json& model, bool packed, model::Recompute rec = model::Recompute::None) {
  Case su = tp_case(model, 0.01, 0.3);
  su.packed = packed;
  su.recompute = rec;
  su.lr = su.ocfg.lr = 1e-3f;
  return su;
}

}  // namespace trex::testing
