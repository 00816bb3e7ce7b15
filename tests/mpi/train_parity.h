// Shared pieces of the data- and expert-parallel parity tests (tests/mpi/test_dp_train.cpp,
// test_ep_train.cpp): tiny odd-sized V3 / V4 configs, the global batches of K steps, the
// single-process reference run, the parallel run and the comparisons.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <unistd.h>
#include <vector>

#include "core/parallel.h"
#include "core/rng.h"
#include "parallel/comm.h"
#include "parallel/dims.h"
#include "train/layout.h"
#include "train/loop.h"
#include "train/trainer.h"
#include "tests/tiny_configs.h"

namespace trex::parallel {
Communicator& test_world();
}  // namespace trex::parallel

namespace trex::testing {

using nlohmann::json;
using namespace trex::train;

// The global batches of K steps: micro-batch (step s, accumulation a, rank r) holds B rows of T
// tokens; a different share of -100 targets per rank so the ranks' target counts differ.
// packed: every row holds several documents (document ids and positions from 0 in each, as
// train/data.cpp packs them), with boundaries at random places.
struct Global {
  int64_t K, ga, dp, B, T;
  std::vector<std::vector<int32_t>> ids, tg;  // [(s * ga + a) * dp + r]
  std::vector<std::vector<int32_t>> pos, seg;  // packed only, same indexing
  model::Batch batch(int64_t s, int64_t a, int64_t r) const {
    const size_t i = (size_t)((s * ga + a) * dp + r);
    if (!pos.empty()) return {B, T, ids[i].data(), tg[i].data(), pos[i].data(), seg[i].data()};
    return {B, T, ids[i].data(), tg[i].data(), nullptr, nullptr};
  }
};

inline Global make_global(int64_t K, int64_t ga, int64_t dp, int64_t B, int64_t T, int64_t V, uint64_t seed,
                          bool packed = false) {
  Global g{K, ga, dp, B, T, {}, {}, {}, {}};
  Rng r(seed);
  for (int64_t i = 0; i < K * ga * dp; ++i) {
    std::vector<int32_t> ids(B * T), tg(B * T);
    for (auto& x : ids) x = (int32_t)(r.next_u64() % V);
    for (int64_t j = 0; j < B * T; ++j) tg[j] = (j % (3 + i % 4) == 1) ? -100 : (int32_t)(r.next_u64() % V);
    if (packed) {
      std::vector<int32_t> pos(B * T), seg(B * T);
      for (int64_t b = 0; b < B; ++b) {
        int32_t doc = 0, p = 0;
        for (int64_t t = 0; t < T; ++t) {
          if (t > 0 && r.next_u64() % 5 == 0) ++doc, p = 0;  // a new document starts here
          pos[b * T + t] = p++, seg[b * T + t] = doc;
          // The last token of a document predicts nothing.
          if (t + 1 == T) tg[b * T + t] = -100;
        }
        for (int64_t t = 0; t + 1 < T; ++t)
          if (seg[b * T + t + 1] != seg[b * T + t]) tg[b * T + t] = -100;
      }
      g.pos.push_back(std::move(pos));
      g.seg.push_back(std::move(seg));
    }
    g.ids.push_back(std::move(ids));
    g.tg.push_back(std::move(tg));
  }
  return g;
}

struct Trace {
  std::vector<double> loss, ce, aux, mtp, norm, indexer, recall;
  std::vector<std::vector<double>> load;
  std::vector<char> skipped;
  void add(const StepStats& s) {
    loss.push_back(s.loss), ce.push_back(s.ce), aux.push_back(s.aux), mtp.push_back(s.mtp);
    indexer.push_back(s.indexer), recall.push_back(s.indexer_recall);
    norm.push_back(s.grad_norm), load.push_back(s.load_max_over_mean), skipped.push_back(s.skipped);
  }
};

// " none", " full" or " selective", for the messages of the cases.
inline const char* recompute_label(model::Recompute r) {
  return r == model::Recompute::Full ? " full" : r == model::Recompute::Selective ? " selective" : " none";
}

struct Case {
  json model;
  double aux = 0, mtp = 0;
  float lr = 3e-3f, gamma = 0.01f;
  AdamWConfig ocfg{3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
  model::Recompute recompute = model::Recompute::None;
  unsigned modules = model::kRecomputeMoe;  // selective recompute's (model::RecomputeModule bits)
  double ix_weight = 0;  // the indexer loss (DeepSeek-V3.2 model/v32_indexer_loss.h, V4 model/v4_indexer.h)
  model::IndexerStage ix_stage = model::IndexerStage::Sparse;
  bool ix_recall = false;  // compute the indexer's recall (train.indexer_recall)
  bool packed = false;  // the batches' rows hold several documents (Global)
  model::ModelConfig cfg() const { return model::parse_config(model, "tiny"); }
  // shard: the routed experts the model holds (expert-parallel memory sharding; default all).
  std::unique_ptr<model::Model> make(uint64_t seed, model::ExpertShard shard = {}, model::StageShard stage = {},
                                     model::TpShard tp = {}) const {
    model::TrainOptions o{aux, mtp, recompute, ix_weight, ix_stage, ix_recall};
    o.recompute_modules = modules;
    auto m = std::make_unique<model::Model>(cfg(), kern::Prec::F32, o, shard, stage, tp);
    m->init_random(seed);
    // Off the symmetric init (V4's HC bases 0, scales 1): there some gradients are exactly 0 in
    // exact arithmetic and pure rounding noise in f32, which AdamW turns into noise-sized steps.
    perturb_vectors(*m, seed + 1000);
    return m;
  }
};

// The reference: one process, every rank's micro-batches of a step in one trainer_step.
inline Trace run_single(model::Model& m, AdamW& opt, const Case& su, const Global& g, int64_t s0, int64_t s1,
                 int64_t nan_step = -1) {
  Trace t;
  for (int64_t s = s0; s < s1; ++s) {
    std::vector<model::Batch> micro;
    for (int64_t a = 0; a < g.ga; ++a)
      for (int64_t r = 0; r < g.dp; ++r) micro.push_back(g.batch(s, a, r));
    t.add(trainer_step(m, opt, micro, su.lr, su.gamma, nullptr, s == nan_step));
  }
  return t;
}

inline Trace run_dp(DataParallel& dp, const Case& su, const Global& g, int64_t s0, int64_t s1, int64_t nan_step = -1) {
  Trace t;
  for (int64_t s = s0; s < s1; ++s) {
    std::vector<model::Batch> micro;
    for (int64_t a = 0; a < g.ga; ++a) micro.push_back(g.batch(s, a, dp.data_rank()));
    t.add(trainer_step(dp, micro, su.lr, su.gamma, nullptr, s == nan_step));
  }
  dp.wait_params();  // overlap_params: the last step's all-gather is still in flight
  return t;
}

inline double rel(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-12); }

// DeepSeek-V4's first layer sees hc_mult identical copies of the embedding, so its attn_hc
// mixing is not identifiable (a doubly stochastic comb maps equal streams to themselves): parts of
// its gradient are 0 in exact arithmetic and rounding noise in f32, which AdamW's per-element
// normalization turns into lr-sized steps of random sign. Any change of summation order (thread
// count, micro-batch split, ranks) moves these tensors by ~1e-4 relative in 2 steps (measured: the
// same from a 1e-7 perturbation of a one-process run) while every other tensor agrees to ~1e-7;
// they are checked through the losses (which depend on them) instead.
inline bool degenerate(const model::Model& m, const std::string& name) {
  return m.cfg.is_v4() && name.rfind("model.layers.0.attn_hc.", 0) == 0;
}

// Parameter differences per tensor (tensors that degenerate() names are skipped): the largest
// ||a - b|| / ||b|| (L2 over the tensor) and the largest max|a - b| / max|b|.
struct ParamDiff {
  double l2 = 0, max = 0;
  std::string l2_at, max_at;
};
inline ParamDiff param_diff(const model::Model& a, const model::Model& b) {
  ParamDiff r;
  for (const model::ParamEntry& e : b.layout.entries) {
    if (degenerate(b, e.name)) continue;
    double mx = 0, d = 0, dd = 0, nn = 0;
    for (int64_t i = 0; i < e.shape.numel(); ++i) {
      const double x = a.P()[e.offset + i], y = b.P()[e.offset + i];
      mx = std::max(mx, std::fabs(y)), d = std::max(d, std::fabs(x - y));
      dd += (x - y) * (x - y), nn += y * y;
    }
    const double l2 = std::sqrt(dd / std::max(nn, 1e-30)), m = d / std::max(mx, 1e-6);
    if (l2 > r.l2) r.l2 = l2, r.l2_at = e.name;
    if (m > r.max) r.max = m, r.max_at = e.name;
  }
  return r;
}

// The whole model's weights gathered from a parallel run (DataParallel::gather_whole, which
// assembles expert-sharded slabs) into a one-rank model on every rank, buffers included.
// Collective.
inline std::unique_ptr<model::Model> gather_whole_model(DataParallel& dp, const Case& su) {
  DataParallel::Gathered g = dp.gather_whole();
  auto whole = su.make(5);
  if (dp.rank() == 0) {
    EXPECT_EQ(g.layout.total, whole->layout.total);
    std::memcpy(whole->P(), g.params, whole->layout.total * sizeof(float));
  }
  dp.comm().broadcast(whole->P(), (size_t)whole->layout.total, 0);
  whole->buffers = dp.model().buffers;
  whole->refresh_bf16();
  return whole;
}

// Every tensor m holds (all, or its expert shard's rows, its stage's, its tp slice) equals the
// whole model's, bit for bit.
inline void expect_holds_whole(const model::Model& m, const model::Model& whole) {
  std::vector<float> part;
  for (const model::ParamEntry& e : m.layout.entries) {
    const model::ParamEntry* w = whole.layout.find(e.name);
    ASSERT_TRUE(w) << e.name;
    part.resize((size_t)e.shape.numel());
    e.take_from_whole(whole.P() + w->offset, part.data());
    EXPECT_EQ(0, std::memcmp(part.data(), m.P() + e.offset, e.shape.numel() * sizeof(float))) << e.name;
  }
}

// Parameters equal to ~1e-5: L2 per tensor within 1e-5, no element off by more than 1e-4 of its
// tensor's largest value (AdamW normalizes each element: one whose gradient is small next to its
// tensor's carries more of the summation-order noise).
inline void expect_params_equal(const model::Model& a, const model::Model& b, const char* what = "") {
  const ParamDiff d = param_diff(a, b);
  EXPECT_LT(d.l2, 1e-5) << what << d.l2_at;
  EXPECT_LT(d.max, 1e-4) << what << d.max_at;
}

inline void expect_traces_equal(const Trace& dp, const Trace& ref, double tol) {
  ASSERT_EQ(dp.loss.size(), ref.loss.size());
  for (size_t s = 0; s < ref.loss.size(); ++s) {
    EXPECT_LT(rel(dp.loss[s], ref.loss[s]), tol) << "step " << s << ": " << dp.loss[s] << " vs " << ref.loss[s];
    EXPECT_LT(rel(dp.ce[s], ref.ce[s]), tol) << "step " << s;
    EXPECT_LT(std::fabs(dp.aux[s] - ref.aux[s]), tol * std::max(1e-3, std::fabs(ref.aux[s]))) << "step " << s;
    EXPECT_LT(std::fabs(dp.mtp[s] - ref.mtp[s]), tol * std::max(1e-3, std::fabs(ref.mtp[s]))) << "step " << s;
    EXPECT_LT(std::fabs(dp.indexer[s] - ref.indexer[s]), tol * std::max(1e-3, std::fabs(ref.indexer[s])))
        << "step " << s << ": indexer loss " << dp.indexer[s] << " vs " << ref.indexer[s];
    EXPECT_LT(std::fabs(dp.recall[s] - ref.recall[s]), tol * std::max(1e-3, std::fabs(ref.recall[s])))
        << "step " << s << ": indexer recall " << dp.recall[s] << " vs " << ref.recall[s];
    EXPECT_LT(rel(dp.norm[s], ref.norm[s]), tol) << "step " << s << ": " << dp.norm[s] << " vs " << ref.norm[s];
    EXPECT_EQ(dp.skipped[s], ref.skipped[s]) << "step " << s;
    EXPECT_EQ(dp.load[s], ref.load[s]) << "step " << s;
  }
}

// K steps data parallel vs one process on the same global batches.
// ep > 1: expert parallel inside the dp group (ep divides the world size and the model's experts).
// tp > 1: tensor parallel (tp divides the heads and the dense MLP width).
// pp > 1: pipeline parallel (1F1B over ga micro-batches), layers per stage pp_layers or even.
// cp > 1: context parallel (2 cp divides T).
// dp = world size / (tp x cp x pp).
inline void parity(const Case& su, DpOptions o, int64_t K, int64_t ga, int64_t B, int64_t T, int ep = 1, int tp = 1,
                   int pp = 1, std::vector<int> pp_layers = {}, int cp = 1) {
  init_threads(1);
  parallel::Communicator& w = parallel::test_world();
  const model::ModelConfig cfg = su.cfg();
  const int ndata = w.size() / (tp * pp * cp);
  const Global g = make_global(K, ga, ndata, B, T, cfg.vocab_size, 11, su.packed);
  auto refp = su.make(5);
  model::Model& ref = *refp;
  AdamW ropt(ref, su.ocfg);
  const Trace tr = run_single(ref, ropt, su, g, 0, K);

  // Ranks other than 0 start from other weights: DataParallel makes the replicas equal. Expert
  // parallel: each rank holds its ep rank's experts only, as trex train builds them, and the
  // replicas of an expert shard take the values of the first rank holding it (trex train inits
  // every rank from the same seed), so those ranks start from the reference's weights.
  parallel::ParallelDims dims;
  dims.dp = ndata, dims.ep = ep, dims.tp = tp, dims.pp = pp, dims.pp_layers = pp_layers, dims.cp = cp;
  train::validate_layout(dims, w.size(), cfg);
  // Pipeline parallel: each rank holds its stage's tensors only, and the first rank of each stage
  // (and of each stage's expert shard) gives them to the others.
  const auto lowest = [&](const std::vector<int>& group) { return group.front() == w.rank(); };
  // Tensor parallel: each rank holds its tp slice only, given to the others by the lowest rank
  // holding it.
  const bool first_holder =
      (ep > 1 && lowest(pp > 1 ? dims.stage_expert_group(w.rank()) : dims.expert_replica_group(w.rank()))) ||
      (pp > 1 && lowest(dims.stage_group(w.rank()))) ||
      (tp > 1 && lowest(pp > 1 ? dims.stage_tp_slice_group(w.rank()) : dims.tp_slice_group(w.rank())));
  auto mp = su.make(w.rank() == 0 || first_holder ? 5 : 99, expert_shard_of(dims, w.rank(), cfg),
                    stage_shard_of(dims, w.rank(), cfg), tp_shard_of(dims, w.rank()));
  model::Model& m = *mp;
  EXPECT_EQ(m.layout.expert_sharded(), ep > 1);
  EXPECT_EQ(m.layout.stage_sharded(), pp > 1);
  EXPECT_EQ(m.layout.tp_sharded(), tp > 1);
  o.overlap_params = o.overlap;  // with the buckets' overlap, the parameter all-gather's too
  ParallelRun par = make_parallel_run(w, dims, m, su.ocfg, o);
  DataParallel& dp = *par.dp;
  const Trace td = run_dp(dp, su, g, 0, K);
  expect_traces_equal(td, tr, 1e-5);
  // The whole model's weights (gathered from the expert shards) equal the reference's, and every
  // rank holds exactly its part of them (the replicas are equal).
  auto whole = gather_whole_model(dp, su);
  expect_params_equal(*whole, ref);
  expect_holds_whole(m, *whole);
  EXPECT_EQ(m.buffers, ref.buffers);  // router biases: the same +-gamma updates
  // The final weights compute the same loss on a batch neither run trained on (in a one-rank
  // model: m may be a pipeline stage or hold an expert shard).
  const Global fresh = make_global(1, 1, 1, 2, T, cfg.vocab_size, 999);
  const double lm = whole->forward(fresh.batch(0, 0, 0)).loss, lr_ = ref.forward(fresh.batch(0, 0, 0)).loss;
  EXPECT_LT(rel(lm, lr_), 1e-5) << lm << " vs " << lr_;
  // The update really happened.
  double moved = 0;
  auto init = su.make(5);
  for (int64_t i = 0; i < whole->layout.total; ++i)
    moved = std::max(moved, (double)std::fabs(whole->P()[i] - init->P()[i]));
  EXPECT_GT(moved, 1e-3);
  // Overlap: every bucket's reduce-scatter (of every region) was started from inside the backward.
  if (o.overlap) EXPECT_EQ(dp.buckets_started_in_backward(), dp.num_buckets());
  else EXPECT_EQ(dp.buckets_started_in_backward(), 0);
  const ParamDiff d = param_diff(*whole, ref);
  if (w.rank() == 0)
    std::printf("[dp parity] dp=%d tp=%d pp=%d ep=%d cp=%d %s: %d buckets, %lld steps, loss %.6f -> %.6f, params: "
                "worst L2 %.2e (%s), worst element %.2e (%s)\n",
                ndata, tp, pp, ep, cp, cfg.model_type.c_str(), dp.num_buckets(), (long long)K, tr.loss.front(),
                tr.loss.back(), d.l2, d.l2_at.c_str(), d.max, d.max_at.c_str());
}

// ---- tensor-parallel cases (test_tp_train.cpp, test_sp_train.cpp) ------------------------------

// tp for a world of 2, 3 or 4 ranks: the whole world, except 4 = dp 2 x tp 2.
inline int tp_for(int world) { return world == 4 ? 2 : world; }

inline json tp_v3() {  // 6 heads, dense width 54: split by 2 and by 3
  json m = tiny_v3();
  m["num_attention_heads"] = 6;
  m["intermediate_size"] = 54;
  return m;
}

inline json tp_v4() {  // 6 heads in 6 output groups
  json m = tiny_v4();
  m["num_attention_heads"] = 6;
  m["o_groups"] = 6;
  return m;
}

// AdamW with eps 1e-6: its first step is lr x g / (|g| + eps), so with eps 1e-8 an element whose
// gradient is rounding noise (measured on 4 ranks: 4e-9 against a tensor maximum of 8e-3) moves
// by up to lr in either run, one element of a 780-element tensor then differs by 1.6e-5 (L2). The
// tp sums add the heads' parts in another order than one process does; eps 1e-6 keeps such
// elements still in both runs, so the comparison measures the parallel layer, not AdamW's
// amplification of the last bit.
inline Case tp_case(json model, double aux, double mtp) {
  Case su{std::move(model), aux, mtp};
  su.ocfg.eps = 1e-6f;
  return su;
}

// ---- the run loop (run_training) ----------------------------------------------------------------

inline std::vector<int32_t> byte_encode(std::string_view s) {
  std::vector<int32_t> out;
  for (unsigned char c : s) out.push_back(c);
  return out;
}
inline TokenizerFns bytes_tok() { return {byte_encode, 256, 257, ""}; }

inline json loop_config(const std::string& dir, const std::string& data, int64_t B, int64_t steps,
                        json m = tiny_v3()) {
  m["vocab_size"] = 260;
  return {{"model", m},
          {"data", {{"mode", "cpt"}, {"train", {data}}, {"seq_len", 24}, {"eval_fraction", 0.2}, {"cache_dir", "none"}}},
          {"train", {{"batch_size", B}, {"grad_accum", 2}, {"steps", steps}, {"precision", "fp32"}, {"threads", 1},
                     {"eval_every", 3}, {"eval_batches", 3}}},
          {"optim", {{"lr", 3e-3}, {"warmup_steps", 2}, {"schedule", "cosine"}, {"decay_fraction", 0.5}}},
          {"parallel", {{"bucket_size", 3000}}},
          {"checkpoint", {{"dir", dir}, {"every", 3}, {"keep", 3}}},
          {"log", {{"progress", "lines"}}}};
}

inline std::vector<json> metrics(const std::string& dir) {
  std::vector<json> out;
  std::ifstream f(dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(f, line)) out.push_back(json::parse(line));
  return out;
}

// A run folder under the temp directory, named by prefix and rank 0's pid (the same on every
// rank), holding corpus.jsonl: n documents {"text": text(i)}, written by rank 0. Collective.
inline std::filesystem::path loop_corpus(parallel::Communicator& w, const std::string& prefix, int n,
                                         const std::function<std::string(int)>& text) {
  int64_t tag = (int64_t)::getpid();
  w.broadcast(&tag, 1, 0);
  const std::filesystem::path root = std::filesystem::temp_directory_path() / (prefix + std::to_string(tag));
  if (w.rank() == 0) {
    std::filesystem::create_directories(root);
    std::ofstream f(root / "corpus.jsonl");
    for (int i = 0; i < n; ++i) f << json{{"text", text(i)}}.dump() << "\n";
  }
  w.barrier();
  return root;
}

// run_training under a model-parallel layout (`layout`, e.g. "parallel.tp=2", leaving dp =
// world / (tp x pp) data ranks of 1 row) equals one process with dp rows: losses, tokens and eval
// losses of 6 steps; its step-3 checkpoint resumed by one process gives the same losses for steps
// 4-6. `what` names the layout's ranks in the token-count message. Collective; removes its folder.
inline void loop_matches_one_process_and_resumes_in_one(parallel::Communicator& w, const std::filesystem::path& root,
                                                        const json& model, const std::string& layout, int dp,
                                                        const char* what, std::vector<std::string> more = {}) {
  namespace fs = std::filesystem;
  const std::string data = (root / "corpus.jsonl").string();
  auto cfg = [&](const std::string& d, int64_t b, int64_t steps, std::vector<std::string> ov = {}) {
    return parse_run_config(loop_config((root / d).string(), data, b, steps, model), "run.toml", ov);
  };
  more.insert(more.begin(), layout);
  TrainResult rt = run_training(cfg("par", 1, 6, more), bytes_tok(), &w);
  EXPECT_EQ(rt.dp, dp);
  EXPECT_EQ(rt.steps, 6);
  if (w.rank() == 0) {
    run_training(cfg("one", dp, 6), bytes_tok());
    // Resume the parallel run's step-3 checkpoint in one process.
    fs::create_directories(root / "par_then_1" / "checkpoints");
    fs::copy(root / "par" / "checkpoints" / "step-00000003", root / "par_then_1" / "checkpoints" / "step-00000003",
             fs::copy_options::recursive);
    run_training(cfg("par_then_1", dp, 6, {"checkpoint.resume=auto"}), bytes_tok());
    const auto one = metrics((root / "one").string()), a = metrics((root / "par").string());
    ASSERT_EQ(one.size(), 6u);
    ASSERT_EQ(a.size(), 6u) << "metrics.jsonl is written once, by rank 0";
    int evals = 0;
    for (size_t s = 0; s < 6; ++s) {
      EXPECT_LT(rel(a[s]["loss"].get<double>(), one[s]["loss"].get<double>()), 1e-5) << "step " << s + 1;
      EXPECT_EQ(a[s]["tokens"].get<int64_t>(), one[s]["tokens"].get<int64_t>()) << "tokens are not counted per " << what;
      if (one[s].contains("eval_loss")) {
        ++evals;
        EXPECT_LT(rel(a[s]["eval_loss"].get<double>(), one[s]["eval_loss"].get<double>()), 1e-5) << "step " << s + 1;
      }
    }
    EXPECT_EQ(evals, 2);
    const auto b = metrics((root / "par_then_1").string());
    ASSERT_EQ(b.size(), 3u) << "steps 4-6 after the resume";
    for (size_t s = 3; s < 6; ++s) {
      EXPECT_EQ(b[s - 3]["step"].get<int64_t>(), (int64_t)s + 1);
      EXPECT_LT(rel(b[s - 3]["loss"].get<double>(), one[s]["loss"].get<double>()), 1e-5) << "resumed step " << s + 1;
    }
    fs::remove_all(root);
  }
  w.barrier();
}

}  // namespace trex::testing
