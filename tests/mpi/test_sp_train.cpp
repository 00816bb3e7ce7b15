// Sequence parallel (model/seq_parallel.h, TensorParallel::sp), fp32, against one process: tp = 2
// on 2 ranks, tp = 3 on 3 ranks, and on 4 ranks dp 2 x tp 2 with ep 2 and tp 2 x pp 2 (CTest
// mpi_tp_np4). Token counts that do not split evenly (shards cut inside a sequence) and counts
// that do; V3 with a dense layer and the sequence-wise aux loss, V4 with CSA / HCA / sliding
// layers, hash routing and an MTP block.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "model/seq_parallel.h"
#include "tests/mpi/train_parity.h"
#include "train/activation_estimate.h"
#include "train/loop.h"

using namespace trex;
using namespace trex::train;
using namespace trex::testing;

namespace {

DpOptions sp_options(int64_t bucket, bool overlap) {
  DpOptions o{bucket, overlap};
  o.sequence_parallel = true;
  return o;
}

}  // namespace

// The shards of N tokens over P ranks: balanced, contiguous, covering [0, N) once.
TEST(SeqShard, BalancedContiguousCover) {
  for (int64_t N : {1, 5, 13, 21, 26, 97})
    for (int P = 1; P <= 5; ++P) {
      if (N < P) continue;
      int64_t next = 0;
      for (int r = 0; r < P; ++r) {
        const model::SeqShard s = model::seq_shard(N, r, P);
        EXPECT_EQ(s.n0, next) << N << " " << P << " " << r;
        EXPECT_GE(s.rows, N / P);
        EXPECT_LE(s.rows, s.block);
        EXPECT_LE(s.rows, N / P + 1);
        next += s.rows;
      }
      EXPECT_EQ(next, N);
    }
}

// The all-gather and reduce-scatter against plain sums, for counts that split evenly and not.
TEST(SeqShard, GatherAndReduceScatterAreAdjoint) {
  parallel::Communicator& w = parallel::test_world();
  const int P = w.size(), r = w.rank();
  StackArena A(1 << 20);
  for (int64_t N : {(int64_t)P * 4, (int64_t)P * 4 + 1, (int64_t)P * 3 + P - 1}) {
    const int64_t wd = 5;
    const model::SeqShard s = model::seq_shard(N, r, P);
    std::vector<float> local(s.rows * wd), full(N * wd, -1.f);
    for (int64_t i = 0; i < s.rows * wd; ++i) local[i] = (float)((s.n0 * wd + i) * 3 + 1);
    double waited = 0;
    model::sp_all_gather(w, s, local.data(), full.data(), wd, A, &waited);
    for (int64_t i = 0; i < N * wd; ++i) ASSERT_EQ(full[i], (float)(i * 3 + 1)) << "N " << N << " at " << i;
    // Every rank contributes (rank + 1) x the row index: the shard gets sum_r (r + 1) x row.
    for (int64_t i = 0; i < N * wd; ++i) full[i] = (float)((r + 1) * (i / wd));
    std::vector<float> out(s.rows * wd);
    model::sp_reduce_scatter(w, s, full.data(), out.data(), wd, A, &waited);
    const float k = (float)(P * (P + 1) / 2);
    for (int64_t i = 0; i < s.rows * wd; ++i) ASSERT_EQ(out[i], k * (float)(s.n0 + i / wd)) << "N " << N;
  }
}

// One forward_backward on the same batch on every tp rank with sequence parallel: the loss parts
// and expert loads equal the single model's on every rank, and every tensor's gradient summed over
// the tp ranks equals the single model's (each rank's share is its own tokens').
TEST(SpTrain, GradientsSumToTheSingleRank) {
  init_threads(1);
  parallel::Communicator& w = parallel::test_world();
  const int tp = tp_for(w.size());
  json v3_mtp = tp_v3();  // DeepSeek-V3 MTP layers (two depths)
  v3_mtp["num_nextn_predict_layers"] = 2;
  for (const json& mj : {tp_v3(), tp_v4(), v3_mtp})
    for (auto [B, T] : {std::pair<int64_t, int64_t>{2, 13}, {3, 7}}) {
      const bool mtp = mj.value("num_nextn_predict_layers", 0) > 0;
      Case su{mj, 0.01, mtp ? 0.3 : 0.0};
      const model::ModelConfig cfg = su.cfg();
      const Global g = make_global(1, 1, 1, B, T, cfg.vocab_size, 23);
      auto ref = su.make(3);
      const model::LossParts want = ref->forward_backward(g.batch(0, 0, 0));

      auto m = su.make(3);
      parallel::ParallelDims dims;
      dims.dp = w.size() / tp, dims.tp = tp;
      parallel::ProcessGroups groups = parallel::make_process_groups(w, dims);
      m->set_tensor_parallel(groups.tp.get(), /*sequence_parallel=*/true);
      ASSERT_TRUE(m->tensor_parallel().sp);
      const model::SeqShard sh = m->seq_shard_of(B * T);
      EXPECT_LT(sh.rows, B * T);
      const model::LossParts got = m->forward_backward(g.batch(0, 0, 0));
      const std::string what = cfg.model_type + " B " + std::to_string(B) + " T " + std::to_string(T);
      EXPECT_LT(rel(got.loss, want.loss), 1e-6) << what;
      EXPECT_LT(rel(got.ce, want.ce), 1e-6) << what;
      EXPECT_LT(std::fabs(got.aux - want.aux), 1e-6 * std::max(1e-3, want.aux)) << what;
      EXPECT_GT(want.aux, 0.0) << what;
      EXPECT_LT(std::fabs(got.mtp - want.mtp), 1e-6 * std::max(1e-3, want.mtp)) << what;
      EXPECT_EQ(got.n_valid, want.n_valid) << what;
      EXPECT_EQ(m->expert_load(), ref->expert_load()) << what;

      std::vector<float> sum(m->G(), m->G() + m->layout.total);
      groups.tp->all_reduce(sum.data(), sum.size());
      double total = 0;
      for (int64_t i = 0; i < ref->layout.total; ++i) total += (double)ref->G()[i] * ref->G()[i];
      const double floor = 1e-6 * std::sqrt(total);  // as TpTrain.GradientsSumToTheSingleRank
      int own_only = 0;
      for (const model::ParamEntry& e : m->layout.entries) {
        const float* got_g = sum.data() + e.offset;
        const float* want_g = ref->G() + e.offset;
        double dd = 0, nn = 0, mine = 0;
        for (int64_t i = 0; i < e.shape.numel(); ++i) {
          dd += (got_g[i] - want_g[i]) * (got_g[i] - want_g[i]), nn += want_g[i] * want_g[i];
          mine += std::fabs(m->G()[e.offset + i] - want_g[i]);
        }
        EXPECT_LE(std::sqrt(dd), 1e-5 * std::sqrt(nn) + floor) << what << " " << e.name;
        own_only += mine > 0;  // this rank alone does not hold the whole gradient
      }
      EXPECT_GT(own_only, (int)m->layout.entries.size() / 2) << what;
    }
}

// The start-up activation estimate (train/activation_estimate.h) replays the arena of a tensor-
// parallel step, with and without sequence parallel: it equals the measured peak on the rank
// holding the most token rows (rank 0) and is not below it on the others. bf16 and fp32, no and
// full recompute, token counts that split evenly over the ranks and counts that do not.
TEST(SpTrain, ActivationEstimateMatchesTheArena) {
  init_threads(1);
  parallel::Communicator& w = parallel::test_world();
  const int tp = tp_for(w.size());
  parallel::ParallelDims dims;
  dims.dp = w.size() / tp, dims.tp = tp;
  parallel::ProcessGroups groups = parallel::make_process_groups(w, dims);
  const int tp_rank = groups.tp->rank();
  json v3_mtp = tp_v3();  // DeepSeek-V3 MTP layers (two depths)
  v3_mtp["num_nextn_predict_layers"] = 2;
  for (const json& mj : {tp_v3(), tp_v4(), v3_mtp})
    for (auto [B, T] : {std::pair<int64_t, int64_t>{2, 12}, {3, 7}, {2, 11}})  // 24, 21, 22 tokens
      for (kern::Prec prec : {kern::Prec::BF16, kern::Prec::F32})
        for (model::Recompute rec : {model::Recompute::None, model::Recompute::Full, model::Recompute::Selective})
          for (bool sp : {false, true}) {
            const double mtp = mj.value("num_nextn_predict_layers", 0) > 0 ? 0.3 : 0.0;
            const model::ModelConfig cfg = model::parse_config(mj, "tiny");
            model::Model m(cfg, prec, {0.01, mtp, rec});
            m.init_random(3);
            m.set_tensor_parallel(groups.tp.get(), sp);
            const Global g = make_global(1, 1, 1, B, T, cfg.vocab_size, 29);
            m.forward_backward(g.batch(0, 0, 0));
            const double est = activation_peak_bytes(m.cfg, B, T, prec, rec, tp, 1, sp);
            const double got = (double)m.peak_activation_bytes();
            const std::string what = cfg.model_type + (prec == kern::Prec::BF16 ? " bf16" : " fp32") +
                                     recompute_label(rec) + (sp ? " sp" : " tp") +
                                     " B " + std::to_string(B) + " T " + std::to_string(T) + " tp rank " +
                                     std::to_string(tp_rank);
            if (tp_rank == 0 || !sp) EXPECT_EQ(est, got) << what;
            else EXPECT_GE(est, got) << what;
          }
}

TEST(SpTrain, V3MatchesSingleRank) {
  const int n = parallel::test_world().size();
  // 21 tokens a micro-batch: 11 + 10 on 2 ranks (a shard ends inside a sequence), 7 x 3 on 3.
  parity(tp_case(tp_v3(), 0.01, 0), sp_options(997, true), 4, 2, 3, 7, 1, tp_for(n));
}

TEST(SpTrain, V3TenStepsNoOverlap) {
  const int n = parallel::test_world().size();
  parity(tp_case(tp_v3(), 0.01, 0), sp_options(0, false), 10, 1, 2, 13, 1, tp_for(n));
}

// DeepSeek-V2 (plain q_proj, group-limited softmax router without a bias): the aux loss's expert
// counts are summed over the shards of a sequence.
TEST(SpTrain, V2MatchesSingleRank) {
  const int n = parallel::test_world().size();
  json m = tiny_v2();
  m["num_attention_heads"] = 6;
  m["intermediate_size"] = 54;
  parity(tp_case(m, 0.01, 0), sp_options(997, true), 4, 2, 3, 7, 1, tp_for(n));
}

// DeepSeek-V3.2: the indexer runs on the gathered tokens of the attention block. lr 1e-3 (at 3e-3
// the loss rises and the summation-order noise passes the bound: 1.1e-4 on one element).
TEST(SpTrain, V32MatchesSingleRank) {
  const int n = parallel::test_world().size();
  json m = tiny_v32();
  m["num_attention_heads"] = 6;
  m["num_key_value_heads"] = 6;
  m["intermediate_size"] = 54;
  Case su = tp_case(m, 0.01, 0);
  su.lr = su.ocfg.lr = 1e-3f;
  parity(su, sp_options(997, true), 4, 2, 3, 7, 1, tp_for(n));
}

// Full recompute: the replayed forwards repeat the gathers and reduce-scatters. lr 1e-3: at
// 3e-3 this tiny V4's loss rises and any change of summation order grows ~10x a step (the grad
// norm of plain tp differs by 2e-8, 6e-7, 9e-6 in steps 1-3; sequence parallel's by 5e-7, 1e-6,
// 1.05e-5), which measures AdamW's amplification, not the parallel layer.
// Two depths; lr 1e-3 for the reason V4MatchesSingleRankWithMtp gives (at 3e-3 the embedding, which
// three losses feed, ends 1.9e-5 apart in L2 after 3 steps).
TEST(SpTrain, V3MatchesSingleRankWithMtp) {
  const int n = parallel::test_world().size();
  json m = tp_v3();
  m["num_nextn_predict_layers"] = 2;
  Case su = tp_case(m, 0.01, 0.3);
  su.lr = su.ocfg.lr = 1e-3f;
  parity(su, sp_options(997, true), 3, 2, 3, 7, 1, tp_for(n));
}

// The tiny V4 with its MTP block under sequence parallel, recomputed as rec (selective: modules),
// against one rank.
static void v4_sp_parity(model::Recompute rec, unsigned modules = model::kRecomputeMoe) {
  const int n = parallel::test_world().size();
  Case su = tp_case(tp_v4(), 0.01, 0.3);
  su.lr = su.ocfg.lr = 1e-3f;
  su.recompute = rec;
  su.modules = modules;
  parity(su, sp_options(1500, true), 3, 2, 1, 13, 1, tp_for(n));
}

TEST(SpTrain, V4MatchesSingleRankWithMtp) { v4_sp_parity(model::Recompute::Full); }

// Selective recompute of the MoE blocks on each rank's token shard: the replays repeat the aux
// loss's count sums over the tp group.
TEST(SpTrain, V4SelectiveMoeRecomputeMatchesSingleRank) { v4_sp_parity(model::Recompute::Selective); }

// V4's own modules on each rank's token shard and heads: the mid-layer streams and the mixes'
// inputs rebuilt on the shard, q_b of the local heads run again.
TEST(SpTrain, V4SelectiveMhcUpProjRecomputeMatchesSingleRank) {
  v4_sp_parity(model::Recompute::Selective, model::kRecomputeMhc | model::kRecomputeMlaUpProj);
}

TEST(SpTrain, WithExpertParallel) {
  if (parallel::test_world().size() != 4) GTEST_SKIP() << "dp 2 x tp 2 with ep 2 needs 4 ranks";
  json m = tp_v3();
  m["n_routed_experts"] = 6;
  parity(tp_case(m, 0.01, 0), sp_options(997, true), 3, 2, 2, 11, 2, 2);
}

TEST(SpTrain, WithPipelineParallel) {
  if (parallel::test_world().size() != 4) GTEST_SKIP() << "tp 2 x pp 2 needs 4 ranks";
  parity(tp_case(tp_v3(), 0.01, 0), sp_options(997, true), 3, 4, 1, 13, 1, 2, 2);
  parity(tp_case(tp_v4(), 0.01, 0.3), sp_options(1500, true), 2, 3, 1, 11, 1, 2, 2);
}

// run_training with parallel.sequence_parallel equals one process with dp x B rows, eval
// included; its checkpoint resumes in one process.
TEST(SpTrain, RunLoopMatchesOneProcessAndResumesInOne) {
  parallel::Communicator& w = parallel::test_world();
  const int tp = tp_for(w.size());
  const std::filesystem::path root = loop_corpus(w, "trex_sp_loop_", 47, [](int i) {
    return "crew " + std::to_string(i) + " covers " + std::to_string(7 * i + 3) + " shifts " + std::string(i % 5, 'q') +
           " per week";
  });
  loop_matches_one_process_and_resumes_in_one(w, root, tp_v3(), "parallel.tp=" + std::to_string(tp), w.size() / tp,
                                              "tp rank", {"parallel.sequence_parallel=true"});
}

// data.seq_len below tp cannot be split: refused at load, naming the fields.
TEST(SpTrain, ShortSequencesAreRefusedAtLoad) {
  const json m = tp_v3();
  json c = loop_config("/tmp/unused", "/tmp/unused.jsonl", 1, 1, m);
  c["data"]["seq_len"] = 2;
  c["parallel"]["tp"] = 3;
  c["parallel"]["dp"] = 1;
  c["parallel"]["sequence_parallel"] = true;
  const RunConfig rc = parse_run_config(c, "run.toml");
  try {
    resolve_parallel(rc, 3);
    FAIL() << "seq_len 2 over tp 3 was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("data.seq_len"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("sequence_parallel"), std::string::npos) << e.what();
  }
  c["parallel"]["sequence_parallel"] = false;
  EXPECT_NO_THROW(resolve_parallel(parse_run_config(c, "run.toml"), 3));
}
