#include "train/preflight.h"

#include <algorithm>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <vector>
#include "core/error.h"
#include "plan/arch.h"
#include "plan/calibration.h"
#include "plan/memory.h"
#include "model/params.h"
#include "parallel/dims.h"

namespace trex::train {

namespace fs = std::filesystem;

namespace {

double gib(double b) { return b / (1024.0 * 1024 * 1024); }

std::string gib_str(double b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f GiB", gib(b));
  return s;
}

// The parameters of the largest block whose backward writes its gradients at once: a layer
// (decoder or MTP: "model.layers.N." / "mtp.N."), or a tensor of its own (embedding, head, final
// norm).
double largest_block(const model::ParamLayout& L) {
  std::map<std::string, double> block;
  for (const model::ParamEntry& en : L.entries) {
    std::string key = en.name;
    for (const char* pre : {"model.layers.", "mtp."})
      if (key.rfind(pre, 0) == 0) key = key.substr(0, key.find('.', std::strlen(pre)));
    block[key] += (double)en.shape.numel();
  }
  double n = 0;
  for (const auto& [name, m] : block) n = std::max(n, m);
  return n;
}

}  // namespace

MemoryEstimate estimate_train_memory(const RunConfig& rc, int ranks) {
  // The model as the run builds it: with its MTP blocks when they are trained (model/model.cpp).
  const bool mtp = rc.model.num_nextn_predict_layers > 0 && rc.train.mtp_loss_weight > 0;
  const model::ModelConfig& c = rc.model;
  const model::ModelConfig run_cfg = model::with_mtp(c, mtp ? c.num_nextn_predict_layers : 0);
  const double P = (double)run_cfg.num_params();
  // What one rank holds, the largest share over the pipeline stages: expert parallel keeps its ep
  // rank's routed experts only (model::ExpertShard), pipeline parallel its stage's tensors only
  // (model::StageShard); the moments of a stage's tensors are sharded over that stage's ranks (a
  // tp slice's over its dp ranks: the same share).
  parallel::ParallelDims dims;
  dims.pp = std::max<int>(1, (int)rc.parallel.pp);
  dims.ep = std::max<int>(1, (int)rc.parallel.ep);
  dims.dp = dims.ep;  // (only the stage split and the experts per rank are read below)
  for (int64_t n : rc.parallel.pp_layers) dims.pp_layers.push_back((int)n);
  const int64_t E = run_cfg.n_routed_experts;
  const bool by_expert = dims.ep > 1 && E > 0 && E % dims.ep == 0;
  const bool by_stage = dims.pp > 1 && (dims.pp_layers.empty() || (int)dims.pp_layers.size() == dims.pp) &&
                        dims.pp <= run_cfg.num_hidden_layers;
  // Tensor parallel keeps its tp rank's slice of the attention and dense-MLP tensors
  // (model::TpShard); a layout that does not split is refused later by train::validate_layout.
  const int64_t tp = std::max<int64_t>(1, rc.parallel.tp);
  const bool by_tp = tp > 1 && run_cfg.num_attention_heads % tp == 0 &&
                     (!run_cfg.is_v4() || run_cfg.v4.o_groups % tp == 0) &&
                     (!run_cfg.has_dense_mlp() || run_cfg.intermediate_size % tp == 0);
  double held = P, stage_all = P;
  double acts = 0;  // the activation arena's peak, the largest over the stages
  auto stage_acts = [&](const model::StageShard& st) {
    const model::TrainOptions ix = train_options(rc);
    return activation_peak_bytes(run_cfg, rc.train.batch_size, rc.data.seq_len, rc.train.precision,
                                 rc.train.recompute, rc.parallel.tp, rc.parallel.ep, rc.parallel.sequence_parallel, st,
                                 ix, rc.data.seq_len % (2 * std::max<int64_t>(rc.parallel.cp, 1))
                                         ? 1 : rc.parallel.cp);  // (layouts refused later: cp 1)
  };
  if (!by_stage) acts = stage_acts({});
  // ZeRO-2's gradients (below) need the largest block of the rank's layout.
  const bool zero2 = rc.parallel.zero_stage == 2 && ranks > 1 && rc.parallel.bucket_size > 0;
  double block = 0;
  const bool sharded = by_expert || by_stage || by_tp;
  if (zero2 && !sharded) block = largest_block(model::build_layout(run_cfg));
  if (sharded) {
    held = stage_all = 0;
    auto count = [](const model::ParamLayout& L) {
      double n = 0;
      for (const model::ParamEntry& en : L.entries) n += (double)en.shape.numel();
      return n;
    };
    for (int s = 0; s < (by_stage ? dims.pp : 1); ++s) {
      model::StageShard st;
      if (by_stage) {
        const int64_t L = run_cfg.num_hidden_layers;
        st.l0 = dims.stage_first_layer(L, s);
        st.l1 = st.l0 + dims.stage_layers(L)[(size_t)s];
        st.first = s == 0, st.last = s == dims.pp - 1;
      }
      const model::ExpertShard ex = by_expert ? model::ExpertShard{0, E / dims.ep, 16} : model::ExpertShard{};
      const model::TpShard ts = by_tp ? model::TpShard{0, tp, 16} : model::TpShard{};
      const model::ParamLayout L = model::build_layout(run_cfg, ex, st, ts);
      held = std::max(held, count(L));
      if (zero2) block = std::max(block, largest_block(L));
      stage_all = std::max(stage_all, count(model::build_layout(run_cfg, {}, st)));
      if (by_stage) acts = std::max(acts, stage_acts(st));
    }
  }
  MemoryEstimate e;
  e.weights = 4 * held + (rc.train.precision == kern::Prec::BF16 ? 2 * held : 0);
  e.grads = 4 * held;
  e.optimizer = 8 * stage_all * (by_stage ? dims.pp : 1) / std::max(ranks, 1);
  // ZeRO-2 (docs/PARALLEL.md): this rank's shard of the gradients (the moments' share, 4 bytes
  // where they take 8), a second one for the accumulator with gradient accumulation, and during a
  // backward the buckets being written (at most the largest block's, plus a partial bucket at
  // each edge) and the 2 reduce-scatters in flight. Under pp the embedding that the first and last
  // stage share (tied head, V4's MTP blocks) stays whole (ZeRO-1 there, train/dist.cpp).
  if (zero2) {
    const double shard = e.optimizer / 2 * (rc.train.grad_accum > 1 ? 2 : 1);
    const double shared = by_stage && (c.tie_word_embeddings || (mtp && c.is_v4()))
                              ? (double)c.vocab_size * (double)c.hidden_size : 0.0;
    e.grads = std::min(e.grads, shard + 4 * (shared + block + 4.0 * (double)rc.parallel.bucket_size));
  }
  // Activations: the peak of the activation arena as the engine allocates it (above; under pp,
  // the largest stage's: each part is the largest over the stages, an upper bound when those
  // are different stages). The planner (plan/memory.h) models a bf16 GPU run; here it gives the
  // communication buffers only.
  e.activations = acts;
  const plan::ArchModel a = plan::arch_from_config(c, "run");
  plan::ClusterSpec s = plan::cpu_spec_from_calibration(plan::default_calibration());
  // ZeRO-2 keeps at most 2 reduce-scatters in flight (parallel/grad_sync.h), so the MPI library
  // holds copies of 2 buckets, not of every bucket of the backward.
  const double reduce_temp = s.dp_reduce_temp;
  if (zero2) s.dp_reduce_temp = 0;
  plan::Layout l;
  l.dp = std::max(ranks, 1);
  l.mbs = rc.train.batch_size;
  l.gbs = rc.train.batch_size * l.dp;
  l.seq = rc.data.seq_len;
  l.mtp = mtp && c.is_v4();  // (the planner models V4's MTP blocks; V3's are in P and the arena above)
  l.recompute = rc.train.recompute == model::Recompute::Full ? plan::Recompute::Full : plan::Recompute::None;
  const plan::MemoryReport r = plan::plan_memory(a, s, l);
  e.buffers = r.peak().buffers;
  if (zero2) e.buffers += reduce_temp * 2 * 4.0 * (double)rc.parallel.bucket_size;
  return e;
}

bool layout_memory(const plan::ArchModel& a, const plan::Layout& l, plan::RankMemory& out) {
  if (!a.config || l.schedule != plan::Schedule::OneF1B || l.vp > 1 || l.etp > 1 ||
      l.precision != plan::Precision::BF16 || l.zero < 1 || l.zero > 2)
    return false;
  RunConfig rc;
  rc.model = *a.config;
  rc.data.seq_len = l.seq;
  rc.train.batch_size = l.mbs;
  rc.train.grad_accum = std::max<int64_t>(1, l.micro_batches());
  rc.train.precision = kern::Prec::BF16;
  rc.train.mtp_loss_weight = l.mtp && a.config->num_nextn_predict_layers > 0 ? 1.0 : 0.0;
  rc.train.indexer_loss_weight = l.indexer_loss ? 1.0 : 0.0;
  const bool sel = l.recompute == plan::Recompute::Selective;
  rc.train.recompute = l.recompute == plan::Recompute::Full ? model::Recompute::Full
                       : sel || l.recompute_mlp               ? model::Recompute::Selective
                                                              : model::Recompute::None;
  rc.train.recompute_modules = (sel ? model::kRecomputeMoe : 0u) |
                               (l.recompute_mlp ? model::kRecomputeMoeAct | model::kRecomputeSharedExperts : 0u);
  rc.parallel.dp = l.dp, rc.parallel.tp = l.tp, rc.parallel.cp = l.cp, rc.parallel.ep = l.ep, rc.parallel.pp = l.pp;
  rc.parallel.sequence_parallel = l.tp > 1;
  rc.parallel.zero_stage = l.zero;
  const MemoryEstimate e = estimate_train_memory(rc, (int)l.world());
  out.params = e.weights, out.grads = e.grads, out.optimizer = e.optimizer;
  out.activations = e.activations, out.buffers = e.buffers;
  return true;
}

model::TrainOptions train_options(const RunConfig& rc) {
  const TrainConfig& t = rc.train;
  return {t.aux_loss_alpha, t.mtp_loss_weight, t.recompute,        t.indexer_loss_weight,
          t.indexer_stage,  t.indexer_recall,  t.recompute_modules};
}

std::string fitting_recompute_modules(const RunConfig& rc, int ranks, int local_ranks, double have) {
  const unsigned v4 = rc.model.is_v4() ? model::kRecomputeMhc | model::kRecomputeMlaUpProj : 0u;
  const unsigned sets[] = {model::kRecomputeMoeAct | model::kRecomputeMoeOut | model::kRecomputeSharedExperts | v4,
                           model::kRecomputeMoe | v4};
  for (unsigned mods : sets) {
    if (rc.train.recompute == model::Recompute::Selective && rc.train.recompute_modules == mods) continue;
    RunConfig r = rc;
    r.train.recompute = model::Recompute::Selective;
    r.train.recompute_modules = mods;
    if (estimate_train_memory(r, ranks).total() * std::max(local_ranks, 1) <= have) return recompute_modules_toml(mods);
  }
  return "";
}

MemoryEstimate check_memory(const RunConfig& rc, int ranks, int local_ranks) {
  const MemoryEstimate e = estimate_train_memory(rc, ranks);
  const double have = available_memory_bytes();
  if (!rc.train.memory_check || have <= 0) return e;
  const int local = std::max(local_ranks, 1);
  // DeepSeek-V4's own selective modules, when the run does not use them all yet.
  const unsigned v4_mods = model::kRecomputeMoe | model::kRecomputeMhc | model::kRecomputeMlaUpProj;
  const bool v4_more = rc.model.is_v4() && (rc.train.recompute == model::Recompute::None ||
                                            (rc.train.recompute_modules & v4_mods) != v4_mods);
  const std::string selective = rc.model.is_v4() ? "[\"moe\", \"mhc\", \"mla_up_proj\"]" : "[\"moe\"]";
  // The fastest module set that fits, when one does (computed only for a refusal).
  const std::string fits = e.total() * local <= have ? "" : fitting_recompute_modules(rc, ranks, local, have);
  // More than one rank on the CPU with ZeRO-1: sharded gradients (ZeRO-2), when they make it fit.
  std::string zero2;
  if (e.total() * local > have && ranks > 1 && rc.parallel.zero_stage == 1 && rc.train.device == "cpu") {
    RunConfig r2 = rc;
    r2.parallel.zero_stage = 2;
    const double t2 = estimate_train_memory(r2, ranks).total();
    if (t2 * local <= have)
      zero2 = "set parallel.zero_stage = 2 (the gradients sharded over the ranks: about " + gib_str(t2) +
              " per rank), ";
  }
  TREX_USER_CHECK(e.total() * local <= have,
                  zero2 + std::string(!fits.empty()
                                  ? "set train.recompute = \"selective\" with train.recompute_modules = " + fits +
                                        " (the fastest set of modules whose estimate fits this machine), "
                                  : rc.train.recompute == model::Recompute::None
                                  ? "set train.recompute = \"selective\" (recompute_modules = " + selective + ") or "
                                    "\"full\" (activations are most of a long sequence's memory), "
                                  : rc.train.recompute == model::Recompute::Selective
                                      ? (v4_more ? "set train.recompute_modules = " + selective + " or " : "set ") +
                                            "train.recompute = \"full\" (keeps only each layer's input), "
                                      : "") +
                      (local > 1 ? "start fewer ranks on each machine, " : "") +
                      "lower train.batch_size or data.seq_len, use a smaller model, add data-parallel ranks (the "
                      "optimizer state is sharded) or context-parallel ranks (parallel.cp), or set "
                      "train.memory_check = false to try anyway",
                  "the run needs about ", gib_str(e.total()), " per rank (weights ", gib_str(e.weights), ", gradients ",
                  gib_str(e.grads), ", optimizer ", gib_str(e.optimizer), ", activations ", gib_str(e.activations),
                  e.buffers > 0 ? ", communication buffers " + gib_str(e.buffers) : std::string(), ", runtime ",
                  gib_str(e.runtime),
                  " for ", rc.train.batch_size, " x ", rc.data.seq_len, " tokens)",
                  local > 1 ? ", " + gib_str(e.total() * local) + " for the " + std::to_string(local) +
                                  " ranks on this machine,"
                            : std::string(),
                  " but this machine has ", gib_str(have), " available (", gib_str(machine_memory_bytes()), " in all)");
  return e;
}

void check_run_dir_writable(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  TREX_USER_CHECK(!ec, "set checkpoint.run_dir to a directory this user may create and write", "checkpoint.run_dir '", dir,
                  "': cannot create: ", ec.message());
  const std::string probe = dir + "/.write_test";
  {
    std::ofstream f(probe);
    f << "trex\n";
    f.close();
    TREX_USER_CHECK(f.good(), "set checkpoint.run_dir to a writable directory", "checkpoint.run_dir '", dir,
                    "': not writable");
  }
  fs::remove(probe, ec);
}

}  // namespace trex::train
