// Tensor-parallel training (model/model.h TensorParallel, train/dist.h DpOptions::tp), fp32,
// against one process computing every data rank's batches: tp = 2 on 2 ranks, tp = 3 on 3 ranks,
// dp 2 x tp 2 on 4 ranks (CTest mpi_tp_np4). Tiny DeepSeek-V3 (6 heads, a dense first layer, MoE
// layers with an aux loss) and DeepSeek-V4 (6 heads in 6 output groups, hash routing, CSA / HCA /
// sliding layers, an MTP block) over K AdamW steps; the gradients of one backward directly; the
// run loop end to end, with a checkpoint written under tp resumed by one process.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "train/loop.h"
#include "tests/mpi/train_parity.h"

using namespace trex;
using namespace trex::train;
using namespace trex::testing;
namespace fs = std::filesystem;

TEST(TpTrain, V3MatchesSingleRank) {
  const int n = parallel::test_world().size();
  Case su = tp_case(tp_v3(), 0.01, 0);
  parity(su, DpOptions{997, true}, 4, 2, 2, 11, 1, tp_for(n));
}

// Ten AdamW steps (the bar: losses within 1e-4 after 10 steps; checked at 1e-5).
TEST(TpTrain, V3TenStepsNoOverlap) {
  const int n = parallel::test_world().size();
  Case su = tp_case(tp_v3(), 0.0, 0);
  parity(su, DpOptions{0, false}, 10, 1, 2, 9, 1, tp_for(n));
}

// DeepSeek-V2: q_proj (no q_lora) split by heads, 6 heads, dense width 54.
TEST(TpTrain, V2MatchesSingleRank) {
  const int n = parallel::test_world().size();
  json m = tiny_v2();
  m["num_attention_heads"] = 6;
  m["intermediate_size"] = 54;
  Case su = tp_case(m, 0.01, 0);
  parity(su, DpOptions{997, true}, 4, 2, 2, 11, 1, tp_for(n));
}

// DeepSeek-V3 MTP layer: its attention split like a main layer's, eh_proj and shared_head whole.
TEST(TpTrain, V3MatchesSingleRankWithMtp) {
  const int n = parallel::test_world().size();
  json m = tp_v3();
  m["num_nextn_predict_layers"] = 1;
  parity(tp_case(m, 0.01, 0.3), DpOptions{997, true}, 3, 2, 2, 11, 1, tp_for(n));
}

// DeepSeek-V3.2: q_b split by heads (6), the indexer whole on every tp rank (the same selection).
TEST(TpTrain, V32MatchesSingleRank) {
  const int n = parallel::test_world().size();
  json m = tiny_v32();
  m["num_attention_heads"] = 6;
  m["num_key_value_heads"] = 6;
  m["intermediate_size"] = 54;
  Case su = tp_case(m, 0.01, 0);
  parity(su, DpOptions{997, true}, 4, 2, 2, 11, 1, tp_for(n));
}

// With full activation recompute: the replayed forwards repeat the tp all-reduces.
TEST(TpTrain, V4MatchesSingleRankWithMtp) {
  const int n = parallel::test_world().size();
  Case su = tp_case(tp_v4(), 0.0, 0.3);
  su.recompute = model::Recompute::Full;
  parity(su, DpOptions{1500, true}, 3, 2, 1, 13, 1, tp_for(n));
}

// Selective recompute of the MoE blocks (the MoE runs on all tokens of every tp rank).
TEST(TpTrain, V4SelectiveMoeRecomputeMatchesSingleRank) {
  const int n = parallel::test_world().size();
  Case su = tp_case(tp_v4(), 0.0, 0.3);
  su.recompute = model::Recompute::Selective;
  parity(su, DpOptions{1500, true}, 3, 2, 1, 13, 1, tp_for(n));
}

// Expert parallel inside the dp group and tensor parallel together (4 ranks: dp 2 x tp 2, ep 2).
TEST(TpTrain, V3WithExpertParallel) {
  const int n = parallel::test_world().size();
  if (n != 4) GTEST_SKIP() << "dp 2 x tp 2 with ep 2 needs 4 ranks";
  json m = tp_v3();
  m["n_routed_experts"] = 6;
  Case su = tp_case(m, 0.01, 0);
  parity(su, DpOptions{997, true}, 3, 2, 2, 11, 2, 2);
}

// One forward_backward on the same batch on every tp rank: the loss equals the single model's;
// summed over the tp ranks, each tp_partial_grad tensor's gradient equals the single model's;
// every other tensor's gradient equals it on every rank; the sliced tensors (q_b, kv_b, o_proj,
// the dense MLP; V4 q_b, o_a, o_b, sinks) have nothing outside this rank's rows or columns; and a
// model holding only this rank's slice gives the same loss and gradients.
TEST(TpTrain, GradientsSumToTheSingleRank) {
  init_threads(1);
  parallel::Communicator& w = parallel::test_world();
  const int tp = tp_for(w.size());
  json v3_mtp = tp_v3();  // DeepSeek-V3 MTP layers (two depths)
  v3_mtp["num_nextn_predict_layers"] = 2;
  for (const json& mj : {tp_v3(), tp_v4(), v3_mtp}) {
    Case su{mj, 0.01, mj.value("num_nextn_predict_layers", 0) > 0 ? 0.3 : 0.0};
    const model::ModelConfig cfg = su.cfg();
    const Global g = make_global(1, 1, 1, 2, 13, cfg.vocab_size, 23);
    auto ref = su.make(3);
    const double ref_loss = ref->forward_backward(g.batch(0, 0, 0)).loss;

    auto m = su.make(3);
    parallel::ParallelDims dims;
    dims.dp = w.size() / tp, dims.tp = tp;
    parallel::ProcessGroups groups = parallel::make_process_groups(w, dims);
    m->set_tensor_parallel(groups.tp.get());
    ASSERT_TRUE(m->tensor_parallel().on());
    const double loss = m->forward_backward(g.batch(0, 0, 0)).loss;
    EXPECT_LT(rel(loss, ref_loss), 1e-6) << cfg.model_type;
    EXPECT_GT(m->tensor_parallel().wait_ms, 0.0);

    std::vector<float> sum(m->G(), m->G() + m->layout.total);
    groups.tp->all_reduce(sum.data(), sum.size());
    const int64_t r = m->tensor_parallel().slice.rank;
    // 1e-5 relative per tensor, with a floor at 1e-6 of the whole gradient's norm: a tensor whose
    // gradient nearly cancels (V4's hc_head scale: 2e-3 of the total) keeps the rounding of its
    // terms, and the tp sum adds its parts in another order.
    double total = 0;
    for (int64_t i = 0; i < ref->layout.total; ++i) total += (double)ref->G()[i] * ref->G()[i];
    const double floor = 1e-6 * std::sqrt(total);
    int partial = 0;
    for (const model::ParamEntry& e : m->layout.entries) {
      const bool part = model::tp_partial_grad(e.name);
      partial += part;
      const float* got = part ? sum.data() + e.offset : m->G() + e.offset;
      const float* want = ref->G() + e.offset;
      double dd = 0, nn = 0;
      for (int64_t i = 0; i < e.shape.numel(); ++i) dd += (got[i] - want[i]) * (got[i] - want[i]), nn += want[i] * want[i];
      EXPECT_LE(std::sqrt(dd), 1e-5 * std::sqrt(nn) + floor) << cfg.model_type << " " << e.name;
    }
    EXPECT_GT(partial, 4);
    // Rows / columns of this rank's slice of a [rows, cols] tensor cut into tp row blocks (by_rows)
    // or column blocks; the gradient must be 0 elsewhere.
    auto only_own = [&](const char* name, bool by_rows, int64_t parts) {
      const model::ParamEntry* e = m->layout.find(name);
      ASSERT_NE(e, nullptr) << name;
      const int64_t rows = e->shape.ndim == 1 ? e->shape.numel() : e->shape.d[0];
      const int64_t cols = e->shape.numel() / rows;
      const int64_t n = by_rows ? rows : cols, blk = n / parts;
      int64_t outside = 0, inside = 0;
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) {
          const int64_t k = by_rows ? i : j;
          const bool own = k / blk / (parts / tp) == r;
          const float v = m->G()[e->offset + i * cols + j];
          (own ? inside : outside) += v != 0.f;
        }
      EXPECT_EQ(outside, 0) << name;
      EXPECT_GT(inside, 0) << name;
    };
    // A model holding only its slice (model::TpShard, as trex train builds it) computes the same
    // loss and the same gradients (its slice's, for the split tensors) as the whole model under tp.
    {
      auto ms = su.make(3, {}, {}, model::TpShard{r, tp, 16});
      ASSERT_TRUE(ms->layout.tp_sharded());
      EXPECT_LT(ms->layout.total, m->layout.total);
      ms->set_tensor_parallel(groups.tp.get());
      const double loss_s = ms->forward_backward(g.batch(0, 0, 0)).loss;
      EXPECT_LT(rel(loss_s, loss), 1e-6) << cfg.model_type;
      std::vector<float> part;
      int sliced = 0;
      for (const model::ParamEntry& e : ms->layout.entries) {
        const model::ParamEntry* we = m->layout.find(e.name);
        ASSERT_NE(we, nullptr) << e.name;
        part.resize((size_t)e.shape.numel());
        e.take_from_whole(m->G() + we->offset, part.data());
        sliced += e.sliced();
        double dd = 0, nn = 0;
        for (int64_t i = 0; i < e.shape.numel(); ++i) {
          const double a = ms->G()[e.offset + i], b = part[(size_t)i];
          dd += (a - b) * (a - b), nn += b * b;
        }
        EXPECT_LE(std::sqrt(dd), 1e-6 * std::sqrt(nn) + 1e-7 * floor) << cfg.model_type << " " << e.name;
      }
      EXPECT_GE(sliced, cfg.is_v4() ? 4 : 5) << cfg.model_type;
    }
    if (cfg.is_v4()) {
      const int64_t H = cfg.num_attention_heads, G = cfg.v4.o_groups;
      only_own("model.layers.1.self_attn.q_b_proj.weight", true, H);
      only_own("model.layers.1.self_attn.sinks", true, H);
      only_own("model.layers.1.self_attn.o_a_proj.weight", true, G);
      only_own("model.layers.1.self_attn.o_b_proj.weight", false, G);
    } else {
      const int64_t H = cfg.num_attention_heads;
      only_own("model.layers.1.self_attn.q_b_proj.weight", true, H);
      only_own("model.layers.1.self_attn.kv_b_proj.weight", true, H);
      only_own("model.layers.1.self_attn.o_proj.weight", false, H);
      only_own("model.layers.0.mlp.down_proj.weight", false, tp);
      only_own("model.layers.0.mlp.gate_proj.weight", true, tp);
    }
  }
}

// run_training under tp (dp = world / tp, B rows per data rank) equals one process with dp x B
// rows, eval included; its checkpoint at step 3 resumes in one process with the same losses.
TEST(TpTrain, RunLoopMatchesOneProcessAndResumesInOne) {
  parallel::Communicator& w = parallel::test_world();
  const int tp = tp_for(w.size());
  const fs::path root = loop_corpus(w, "trex_tp_loop_", 53, [](int i) {
    return "lot " + std::to_string(i) + " ships " + std::to_string(13 * i + 2) + " pallets " + std::string(i % 6, 'z') +
           " by rail";
  });
  loop_matches_one_process_and_resumes_in_one(w, root, tp_v3(), "parallel.tp=" + std::to_string(tp), w.size() / tp,
                                              "tp rank");
}
