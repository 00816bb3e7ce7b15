#include "train/run_config.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <set>
#include <type_traits>
#include "core/error.h"
#include "core/log.h"
#include "core/suggest.h"
#include "model/context_parallel.h"
#include "train/device.h"
#include "io/toml_json.h"
#include "train/layout.h"

namespace trex::train {

using nlohmann::json;

kern::Prec parse_precision(const std::string& s, const std::string& where) {
  if (s == "fp32" || s == "f32") return kern::Prec::F32;
  if (s == "bf16") return kern::Prec::BF16;
  TREX_USER_FAIL("allowed: fp32, bf16", where, ": precision '", s, "' is not supported");
}

namespace {

struct Ctx {
  std::string where;
  int64_t i64(const json& v, const std::string& key, int64_t lo) const {
    TREX_USER_CHECK(v.is_number_integer(), "use an integer", where, ": ", key, " must be an integer, got ", v.dump());
    int64_t x = v.get<int64_t>();
    TREX_USER_CHECK(x >= lo, "use a value >= " + std::to_string(lo), where, ": ", key, " = ", x, " is out of range");
    return x;
  }
  double f64(const json& v, const std::string& key, double lo, double hi = 1e300) const {
    TREX_USER_CHECK(v.is_number(), "use a number", where, ": ", key, " must be a number, got ", v.dump());
    double x = v.get<double>();
    TREX_USER_CHECK(x >= lo && x <= hi, "use a value in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]",
                    where, ": ", key, " = ", x, " is out of range");
    return x;
  }
  bool boolean(const json& v, const std::string& key) const {
    TREX_USER_CHECK(v.is_boolean(), "use true or false", where, ": ", key, " must be true or false");
    return v.get<bool>();
  }
  std::string str(const json& v, const std::string& key, const std::vector<std::string>& allowed = {}) const {
    TREX_USER_CHECK(v.is_string(), "use a string", where, ": ", key, " must be a string, got ", v.dump());
    std::string s = v.get<std::string>();
    if (allowed.empty()) return s;
    std::string list;
    for (const std::string& a : allowed) {
      if (s == a) return s;
      list += (list.empty() ? "" : ", ") + a;
    }
    TREX_USER_FAIL("allowed: " + list, where, ": ", key, " = '", s, "' is not allowed");
  }
  std::vector<std::string> files(const json& v, const std::string& key) const {
    if (v.is_string()) return {v.get<std::string>()};
    TREX_USER_CHECK(v.is_array(), "use a path or a list of paths", where, ": ", key, " must be a list of paths");
    std::vector<std::string> out;
    for (const json& e : v) out.push_back(str(e, key));
    return out;
  }
};

// One key of the run config: how the parser checks it, what docs/CONFIG.md says of it, and how
// it is stored. The parser and `trex config reference` both read this table.
enum class Kind { Int, Num, Bool, Str, Choice, Paths, Custom };
struct KeySpec {
  std::string key;
  Kind kind = Kind::Str;
  std::string doc;
  std::function<void(RunConfig&, const json&)> set;  // the value as checked (Paths: a list)
  std::function<json(const RunConfig&)> get;         // the value stored (of RunConfig{}: the default)
  double lo = 0, hi = 1e300;                          // Int, Num
  std::vector<std::string> choices;                   // Choice
  std::string type;                                   // Custom: the type as documented
  std::function<json(const Ctx&, const json&, const std::string&)> check;  // Custom
};
KeySpec key_spec(const char* key, Kind kind, const char* doc, std::function<void(RunConfig&, const json&)> set,
                 std::function<json(const RunConfig&)> get) {
  KeySpec k;
  k.key = key, k.kind = kind, k.doc = doc, k.set = std::move(set), k.get = std::move(get);
  return k;
}

struct SectionSpec {
  std::string name, doc;
  std::vector<KeySpec> keys;
};

template <class T>
json stored(const T& x) {
  if constexpr (std::is_same_v<T, float>) {  // 0.1f as 0.1, not 0.10000000149...
    char b[32];
    std::snprintf(b, sizeof b, "%.7g", x);
    return json(std::strtod(b, nullptr));
  } else {
    return json(x);
  }
}

// A key stored in field f of section s of the RunConfig.
template <class S, class T>
KeySpec field(const char* key, Kind kind, S RunConfig::*s, T S::*f, const char* doc, double lo = 0, double hi = 1e300,
              std::vector<std::string> choices = {}) {
  KeySpec k = key_spec(key, kind, doc, [s, f](RunConfig& r, const json& v) { (r.*s).*f = v.get<T>(); },
                       [s, f](const RunConfig& r) { return stored((r.*s).*f); });
  k.lo = lo, k.hi = hi, k.choices = std::move(choices);
  return k;
}

// A key whose stored form differs from what the file says (enums, nested structs).
KeySpec mapped(const char* key, Kind kind, const char* doc, std::function<void(RunConfig&, const json&)> set,
               std::function<json(const RunConfig&)> get, double lo = 0, double hi = 1e300,
               std::vector<std::string> choices = {}) {
  KeySpec k = key_spec(key, kind, doc, std::move(set), std::move(get));
  k.lo = lo, k.hi = hi, k.choices = std::move(choices);
  return k;
}

const char* recompute_name(model::Recompute r) {
  switch (r) {
    case model::Recompute::None: return "none";
    case model::Recompute::Full: return "full";
    case model::Recompute::Selective: return "selective";
  }
  return "?";
}
// train.recompute_modules: each name's model::RecomputeModule bit (0: not supported).
const std::vector<std::pair<std::string, unsigned>>& recompute_modules_table() {
  static const std::vector<std::pair<std::string, unsigned>> t = {
      {"moe", model::kRecomputeMoe},
      {"moe_act", model::kRecomputeMoeAct},
      {"moe_out", model::kRecomputeMoeOut},
      {"shared_experts", model::kRecomputeSharedExperts},
      {"mla_up_proj", model::kRecomputeMlaUpProj},
      {"mhc", model::kRecomputeMhc}};
  return t;
}
unsigned recompute_module_bit(const std::string& name) {
  for (const auto& [n, b] : recompute_modules_table())
    if (n == name) return b;
  return 0;
}
json recompute_module_names(unsigned bits) {
  json a = json::array();
  for (const auto& [n, b] : recompute_modules_table())
    if (bits & b) a.push_back(n);
  return a;
}
std::string supported_recompute_modules() {
  std::string s;
  for (const auto& [n, b] : recompute_modules_table()) s += (s.empty() ? "\"" : ", \"") + n + "\"";
  return s;
}

const char* precision_name(kern::Prec p) { return p == kern::Prec::F32 ? "fp32" : "bf16"; }
const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::Constant: return "constant";
    case Schedule::Linear: return "linear";
    case Schedule::Cosine: return "cosine";
    case Schedule::Wsd: return "wsd";
  }
  return "?";
}

const std::vector<SectionSpec>& sections() {
  using R = RunConfig;
  static const std::vector<SectionSpec> S = {
      {"data", "What to train on and how it becomes token sequences (docs/DATA.md).",
       {
           field("mode", Kind::Choice, &R::data, &DataConfig::mode,
                 "cpt: continued pretraining on documents, every token a target; sft: chats, loss on the "
                 "assistant replies",
                 0, 0, {"cpt", "sft"}),
           field("train", Kind::Paths, &R::data, &DataConfig::train,
                 "training files: .jsonl, or plain text (cpt: one document per blank-line separated block)"),
           field("eval", Kind::Paths, &R::data, &DataConfig::eval,
                 "held-out files for the eval loss (same formats as train); empty: see eval_fraction"),
           field("eval_fraction", Kind::Num, &R::data, &DataConfig::eval_fraction,
                 "with no eval files: this share of the training documents is held out for the eval loss "
                 "(0 = no eval; needs at least 2 documents)",
                 0, 0.9),
           field("seq_len", Kind::Int, &R::data, &DataConfig::seq_len,
                 "tokens per packed training sequence (documents are packed greedily; longer CPT documents "
                 "are cut into seq_len pieces)",
                 2),
           field("chat_template", Kind::Choice, &R::data, &DataConfig::chat_template,
                 "sft: how chats are rendered to tokens (docs/DATA.md lists each template's special tokens)", 0, 0,
                 {"deepseek", "deepseek-v2", "chatml"}),
           field("train_on_prompt", Kind::Bool, &R::data, &DataConfig::train_on_prompt,
                 "sft: also train on the system and user turns (default: assistant replies only)"),
           mapped("overflow", Kind::Choice,
                  "sft: a chat longer than seq_len is truncated (keeps its start) or dropped (counted)",
                  [](R& r, const json& v) {
                    r.data.overflow = v == "drop" ? OverflowPolicy::Drop : OverflowPolicy::Truncate;
                  },
                  [](const R& r) { return json(r.data.overflow == OverflowPolicy::Drop ? "drop" : "truncate"); },
                  0, 0, {"truncate", "drop"}),
           field("tokenizer", Kind::Str, &R::data, &DataConfig::tokenizer,
                 "tokenizer.json, or a directory holding it (\"\": <model.path>/tokenizer.json)"),
           field("eos_token", Kind::Str, &R::data, &DataConfig::eos_token,
                 "the token appended to every document and used as padding (\"\": the first of "
                 "<｜end▁of▁sentence｜>, </s>, <|endoftext|>, <|im_end|>, <eos> the tokenizer has)"),
           field("cache_dir", Kind::Str, &R::data, &DataConfig::cache_dir,
                 "pre-tokenized document cache: a directory, \"auto\" ($TREX_CACHE_DIR/tokens, else "
                 "$XDG_CACHE_HOME/trex/tokens, else ~/.cache/trex/tokens) or \"none\""),
       }},
      {"train", "The training loop.",
       {
           field("batch_size", Kind::Int, &R::train, &TrainConfig::batch_size,
                 "sequences per micro-batch (per data-parallel rank)", 1),
           field("grad_accum", Kind::Int, &R::train, &TrainConfig::grad_accum,
                 "micro-batches accumulated into one optimizer step", 1),
           field("steps", Kind::Int, &R::train, &TrainConfig::steps, "optimizer steps of the run (counted from 0, "
                 "also when resuming)", 1),
           field("threads", Kind::Int, &R::train, &TrainConfig::threads,
                 "compute threads per process (0: TREX_THREADS, else all cores)", 0),
           field("seed", Kind::Int, &R::train, &TrainConfig::seed,
                 "seed of the data order, initialization of fresh models and the eval split", 0),
           field("eval_every", Kind::Int, &R::train, &TrainConfig::eval_every,
                 "eval loss every this many steps and at the last step (0 = never)", 0),
           field("eval_batches", Kind::Int, &R::train, &TrainConfig::eval_batches,
                 "batches the eval loss averages over", 1),
           mapped("precision", Kind::Choice, "compute precision of the matmuls (master weights and optimizer "
                  "state are always f32)",
                  [](R& r, const json& v) { r.train.precision = parse_precision(v.get<std::string>(), "precision"); },
                  [](const R& r) { return json(precision_name(r.train.precision)); }, 0, 0, {"fp32", "bf16"}),
           mapped("device", Kind::Str,
                  "where the step computes: cpu, cuda (the first CUDA device; under mpirun or srun each rank "
                  "takes the device of its local rank) or cuda:N. On cuda a DeepSeek-V3-family or DeepSeek-V4 "
                  "model trains on one process or data-parallel over NCCL, one rank per GPU (docs/BACKENDS.md); "
                  "DeepSeek-V3.2, V4's indexer loss, expert / tensor / pipeline parallelism and zero_stage 2 are "
                  "refused when the run starts, naming why",
                  [](R& r, const json& v) { r.train.device = parse_device(v.get<std::string>(), "train.device"); },
                  [](const R& r) { return json(r.train.device); }),
           field("bias_update_gamma", Kind::Num, &R::train, &TrainConfig::bias_update_gamma,
                 "speed of the aux-loss-free router bias update (noaux_tc routing; 0 = frozen biases)", 0, 1),
           field("aux_loss_alpha", Kind::Num, &R::train, &TrainConfig::aux_loss_alpha,
                 "weight of the sequence-wise expert balance loss (0 = off)", 0, 10),
           mapped("recompute", Kind::Choice,
                  "activation recompute (README.md, BENCHMARKS.md; the gradients are bitwise the same in every "
                  "mode): none keeps every activation; full keeps only each layer's input and replays its whole "
                  "forward before its backward (least memory, the forward runs twice); selective drops and "
                  "replays only the modules of recompute_modules, never the attention core (Megatron-Core's "
                  "selective granularity)",
                  [](R& r, const json& v) {
                    r.train.recompute = v == "full"        ? model::Recompute::Full
                                        : v == "selective" ? model::Recompute::Selective
                                                           : model::Recompute::None;
                  },
                  [](const R& r) { return json(recompute_name(r.train.recompute)); }, 0, 0,
                  {"none", "full", "selective"}),
           [] {
             KeySpec k = key_spec(
                 "recompute_modules", Kind::Custom,
                 "used with recompute = \"selective\" only (ignored, with a warning, otherwise): the modules "
                 "dropped after their forward and replayed before their backward, named as Megatron-Core's "
                 "--recompute-modules. moe: a MoE "
                 "layer's whole block (router, dispatch, routed and shared experts, combine) keeps only its input; "
                 "under expert parallelism the replay repeats the dispatch and combine all-to-alls. moe_act: the "
                 "routed experts' SwiGLU output is not kept and the backward computes it again from the kept "
                 "gate|up product (one elementwise pass; with moe, also inside the replayed block). moe_out: "
                 "the routed experts' outputs (kept only for the router probabilities' gradient) are not kept "
                 "and the experts' backward takes that gradient from the down projection's input gradient "
                 "(dy . y = dh . h: no GEMM more; the same value up to rounding, not bitwise). "
                 "shared_experts: the shared experts' gate|up product and SwiGLU output are not kept and the "
                 "backward runs their gate|up GEMM and SwiGLU again (a third of their forward; nothing, with a "
                 "warning, on a model without shared experts). DeepSeek-V4 only: mla_up_proj: the query up-projection's output (q_b) is not kept and the "
                 "backward runs q_b again (one GEMM a layer); mhc: of the hyper-connections only each layer's "
                 "input streams, block outputs and post/comb mixes are kept, the streams between the attention "
                 "and the MoE and each mix's input row are computed again in the backward (elementwise passes "
                 "and the small mix projection)",
                 [](R& r, const json& v) {
                   r.train.recompute_modules = 0;
                   for (const json& e : v) r.train.recompute_modules |= recompute_module_bit(e.get<std::string>());
                 },
                 [](const R& r) { return recompute_module_names(r.train.recompute_modules); });
             k.type = "list of module names: " + supported_recompute_modules();
             k.check = [](const Ctx& c, const json& v, const std::string& key) {
               TREX_USER_CHECK(v.is_array() && !v.empty(),
                               "list the modules to recompute, e.g. [\"moe\"] (supported: " +
                                   supported_recompute_modules() + ")",
                               c.where, ": ", key, " must be a non-empty list of module names, got ", v.dump());
               for (const json& e : v) {
                 TREX_USER_CHECK(e.is_string() && recompute_module_bit(e.get<std::string>()) != 0,
                                 std::string(e.is_string() && e.get<std::string>() == "core_attn"
                                                 ? "the attention core already keeps only its output and "
                                                   "log-sum-exp (flash attention); "
                                                 : "") +
                                     "supported modules: " + supported_recompute_modules(),
                                 c.where, ": ", key, " = ", e.dump(), " is not a module trex recomputes");
               }
               return v;
             };
             return k;
           }(),
           field("mtp_loss_weight", Kind::Num, &R::train, &TrainConfig::mtp_loss_weight,
                 "DeepSeek-V3 / V4: > 0 trains the config's MTP layers (num_nextn_predict_layers), loss += weight x mean MTP cross-entropy; 0 keeps V3 MTP layers unchanged", 0, 10),
           mapped("indexer_loss_weight", Kind::Num,
                  "DeepSeek-V3.2 / V4 (CSA layers): > 0 trains the lightning indexer (else frozen, as transformers) "
                  "with its KL loss against the main attention (docs/V32.md, docs/V4.md), loss += weight x indexer "
                  "loss; metrics.jsonl then "
                  "reports indexer_loss and indexer_recall",
                  [](R& r, const json& v) { r.train.indexer_loss_weight = v; },
                  [](const R& r) { return json(r.train.indexer_loss_weight); }, 0, 100),
           mapped("indexer_stage", Kind::Choice,
                  "with indexer_loss_weight > 0: sparse (attention over the indexer's top-k, every tensor trains, "
                  "the indexer's KL over its selected keys) or dense_warmup (dense attention, only the indexer "
                  "trains, KL over every causal key; V4: every visible compressed entry)",
                  [](R& r, const json& v) {
                    r.train.indexer_stage =
                        v == "dense_warmup" ? model::IndexerStage::DenseWarmup : model::IndexerStage::Sparse;
                  },
                  [](const R& r) {
                    return json(r.train.indexer_stage == model::IndexerStage::DenseWarmup ? "dense_warmup" : "sparse");
                  },
                  0, 0, {"sparse", "dense_warmup"}),
           field("indexer_recall", Kind::Bool, &R::train, &TrainConfig::indexer_recall,
                 "DeepSeek-V3.2 / V4 (CSA layers) with indexer_loss_weight = 0: compute the indexer loss and "
                 "recall anyway (forward only; the sparse stage's recall costs one more pass over every visible "
                 "key's attention scores) and report them in metrics.jsonl, to compare with a run that trains "
                 "the indexer"),
           field("max_skipped_steps", Kind::Int, &R::train, &TrainConfig::max_skipped_steps,
                 "stop the run after this many steps in a row skipped for a NaN / Inf loss or gradient", 1),
           field("memory_check", Kind::Bool, &R::train, &TrainConfig::memory_check,
                 "refuse at start a run whose memory estimate, times the ranks on this machine, exceeds the memory "
                 "available (MemAvailable, at most the cgroup limit); the error names the fastest set of "
                 "recompute_modules whose estimate fits, when one does, and parallel.zero_stage = 2 when sharded "
                 "gradients fit"),
           field("exit_signal_save", Kind::Bool, &R::train, &TrainConfig::exit_signal_save,
                 "SIGTERM / SIGINT finish the current step, write a checkpoint and exit with code 75 (a second "
                 "signal exits at once); false: the signals end the process as usual"),
       }},
      {"optim", "AdamW and the learning-rate schedule.",
       {
           mapped("lr", Kind::Num, "peak learning rate", [](R& r, const json& v) { r.optim.schedule.lr = v; },
                  [](const R& r) { return json(r.optim.schedule.lr); }, 0, 10),
           mapped("min_lr", Kind::Num, "learning rate at the end of the decay",
                  [](R& r, const json& v) { r.optim.schedule.min_lr = v; },
                  [](const R& r) { return json(r.optim.schedule.min_lr); }, 0, 10),
           mapped("schedule", Kind::Choice,
                  "after the warmup: constant, linear or cosine decay to min_lr, or wsd (warmup-stable-decay: "
                  "constant, then a linear decay over the last decay_fraction of the steps)",
                  [](R& r, const json& v) { r.optim.schedule.kind = parse_schedule(v.get<std::string>(), "schedule"); },
                  [](const R& r) { return json(schedule_name(r.optim.schedule.kind)); }, 0, 0,
                  {"constant", "linear", "cosine", "wsd"}),
           mapped("warmup_steps", Kind::Int, "steps of linear warmup from 0",
                  [](R& r, const json& v) { r.optim.schedule.warmup_steps = v; },
                  [](const R& r) { return json(r.optim.schedule.warmup_steps); }, 0),
           mapped("decay_fraction", Kind::Num, "wsd: share of the steps spent decaying at the end",
                  [](R& r, const json& v) { r.optim.schedule.decay_fraction = v; },
                  [](const R& r) { return json(r.optim.schedule.decay_fraction); }, 0, 1),
           field("weight_decay", Kind::Num, &R::optim, &OptimConfig::weight_decay, "decoupled weight decay", 0, 10),
           field("beta1", Kind::Num, &R::optim, &OptimConfig::beta1, "AdamW first-moment decay", 0, 0.999999),
           field("beta2", Kind::Num, &R::optim, &OptimConfig::beta2, "AdamW second-moment decay", 0, 0.999999),
           field("eps", Kind::Num, &R::optim, &OptimConfig::eps, "AdamW epsilon", 0, 1),
           field("clip_grad_norm", Kind::Num, &R::optim, &OptimConfig::clip_grad_norm,
                 "clip the global gradient norm to this (0 = no clipping)", 0),
       }},
      {"parallel", "Data, tensor, pipeline and expert parallelism over MPI ranks (docs/PARALLEL.md).",
       {
           field("dp", Kind::Int, &R::parallel, &ParallelConfig::dp,
                 "data-parallel size (0: the number of ranks / (tp x cp x pp))", 0),
           field("tp", Kind::Int, &R::parallel, &ParallelConfig::tp,
                 "tensor-parallel size: splits the attention heads and dense MLPs", 1),
           field("pp", Kind::Int, &R::parallel, &ParallelConfig::pp,
                 "pipeline-parallel size: splits the layers into stages (1F1B schedule)", 1),
           field("ep", Kind::Int, &R::parallel, &ParallelConfig::ep,
                 "expert-parallel size (divides dp): the routed experts are split over ep ranks", 1),
           field("cp", Kind::Int, &R::parallel, &ParallelConfig::cp,
                 "context-parallel size: every sequence is cut in 2 cp chunks, rank r of a cp group holds chunks r "
                 "and 2 cp - 1 - r; the attention gathers the keys (DeepSeek-V3 / V3.2 / V2 and V4 models; data.seq_len "
                 "a multiple of 2 cp)",
                 1),
           [] {
             KeySpec k = key_spec(
                 "pp_layers", Kind::Custom, "decoder layers per pipeline stage, one count per stage ([]: an even split)",
                 [](R& r, const json& v) { r.parallel.pp_layers = v.get<std::vector<int64_t>>(); },
                 [](const R& r) { return json(r.parallel.pp_layers); });
             k.type = "list of integers >= 0";
             k.check = [](const Ctx& c, const json& v, const std::string& key) {
               TREX_USER_CHECK(v.is_array(), "use a list of layer counts, one per pipeline stage, e.g. [3, 4, 3]",
                               c.where, ": ", key, " must be a list of integers");
               json out = json::array();
               for (const json& e : v) out.push_back(c.i64(e, key, 0));
               return out;
             };
             return k;
           }(),
           field("bucket_size", Kind::Int, &R::parallel, &ParallelConfig::bucket_size,
                 "slab elements per gradient bucket (0: one bucket)", 0),
           field("overlap", Kind::Bool, &R::parallel, &ParallelConfig::overlap,
                 "reduce-scatter each gradient bucket as soon as the backward completes it"),
           field("overlap_params", Kind::Bool, &R::parallel, &ParallelConfig::overlap_params,
                 "with overlap: the parameter all-gather runs on into the next forward"),
           field("sequence_parallel", Kind::Bool, &R::parallel, &ParallelConfig::sequence_parallel,
                 "with tp > 1: norms, MoE layers, embedding and head on each tp rank's share of the tokens "
                 "(needs data.seq_len >= tp)"),
           field("watchdog_s", Kind::Num, &R::parallel, &ParallelConfig::watchdog_s,
                 "more than one rank: no finished step for this many seconds ends the job with an error (0 = off)",
                 0),
           field("peer_timeout_s", Kind::Num, &R::parallel, &ParallelConfig::peer_timeout_s,
                 "more than one rank: a peer rank whose heartbeat is silent this long (dead process, lost host, cut "
                 "network) ends the job with an error; > 0 and < watchdog_s (a slow step with live peers waits up "
                 "to watchdog_s)",
                 0),
           [] {
             KeySpec k = key_spec("zero_stage", Kind::Custom,
                                  "1: optimizer state sharded over dp; 2: gradients sharded too (with pp: per stage, the shared embedding at 1)",
                                  [](R& r, const json& v) { r.parallel.zero_stage = v.get<int64_t>(); },
                                  [](const R& r) { return json(r.parallel.zero_stage); });
             k.type = "1 or 2";
             k.check = [](const Ctx& c, const json& v, const std::string& key) {
               TREX_USER_CHECK(v.is_number_integer() && (v.get<int64_t>() == 1 || v.get<int64_t>() == 2),
                               "allowed values: 1 (sharded optimizer state), 2 (gradients sharded too)", c.where,
                               ": ", key, " must be 1 or 2, got ", v.dump());
               return v;
             };
             return k;
           }(),
       }},
      {"checkpoint", "Checkpoints (RUN_DIR/checkpoints/step-NNNNNNNN/, each written atomically) and resuming.",
       {
           field("run_dir", Kind::Str, &R::checkpoint, &CheckpointConfig::run_dir,
                 "the run directory: checkpoints/step-NNNNNNNN/, metrics.jsonl and config.resolved.json go here "
                 "(torchtitan's job.dump_folder, Hugging Face's output_dir)"),
           [] {
             KeySpec k = mapped(
                 "dir", Kind::Str, "deprecated name of run_dir (a warning says so; setting both is an error)",
                 [](R& r, const json& v) {
                   r.checkpoint.run_dir = v.get<std::string>();
                   TREX_LOG_WARN("checkpoint.dir is deprecated; name it checkpoint.run_dir (same meaning: the run "
                                 "directory, holding checkpoints/, metrics.jsonl and config.resolved.json)");
                 },
                 [](const R& r) { return json(r.checkpoint.run_dir); });
             return k;
           }(),
           field("every", Kind::Int, &R::checkpoint, &CheckpointConfig::every,
                 "save every this many steps (0: only at the end; the last step is always saved)", 0),
           field("keep", Kind::Int, &R::checkpoint, &CheckpointConfig::keep, "newest checkpoints kept", 1),
           field("resume", Kind::Str, &R::checkpoint, &CheckpointConfig::resume,
                 "none, auto (the newest checkpoint under run_dir that verifies, if any) or a checkpoint directory"),
       }},
      {"log", "Progress output and diagnostics.",
       {
           field("every", Kind::Int, &R::log, &LogConfig::every, "print a progress line every this many steps", 1),
           field("progress", Kind::Choice, &R::log, &LogConfig::progress,
                 "bar: one updating line; lines: a line per report (auto: bar on a terminal)", 0, 0,
                 {"auto", "bar", "lines"}),
           field("spike_window", Kind::Int, &R::log, &LogConfig::spike_window,
                 "recent losses the loss-spike detector compares against", 2),
           field("spike_z", Kind::Num, &R::log, &LogConfig::spike_z,
                 "a loss above window mean + spike_z x std is reported as a spike (0 = off)", 0, 1000),
           field("trace", Kind::Str, &R::log, &LogConfig::trace,
                 "Chrome / Perfetto trace file of the first trace_steps steps (\"\" = off)"),
           field("trace_steps", Kind::Int, &R::log, &LogConfig::trace_steps, "steps the trace covers", 1),
           field("expert_loads", Kind::Bool, &R::log, &LogConfig::expert_loads,
                 "write each step's tokens per routed expert (global batch, one list per MoE layer) to "
                 "metrics.jsonl as \"expert_loads\" (input to trex plan --routing)"),
       }},
  };
  return S;
}

std::string type_of(const KeySpec& k) {
  auto num = [](double x) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", x);
    return std::string(b);
  };
  switch (k.kind) {
    case Kind::Int: return "integer >= " + num(k.lo);
    case Kind::Num: return k.hi >= 1e300 ? "number >= " + num(k.lo) : "number in [" + num(k.lo) + ", " + num(k.hi) + "]";
    case Kind::Bool: return "true or false";
    case Kind::Str: return "string";
    case Kind::Paths: return "path or list of paths";
    case Kind::Choice: {
      std::string t = "one of ";
      for (size_t i = 0; i < k.choices.size(); ++i) t += (i ? ", " : "") + ("\"" + k.choices[i] + "\"");
      return t;
    }
    case Kind::Custom: return k.type;
  }
  return "?";
}

// The value of key k as written in the file, checked (Paths: always a list).
json checked(const Ctx& c, const KeySpec& k, const json& v, const std::string& key) {
  switch (k.kind) {
    case Kind::Int: return c.i64(v, key, (int64_t)k.lo);
    case Kind::Num: return c.f64(v, key, k.lo, k.hi);
    case Kind::Bool: return c.boolean(v, key);
    case Kind::Str: return c.str(v, key);
    case Kind::Choice: return c.str(v, key, k.choices);
    case Kind::Paths: return c.files(v, key);
    case Kind::Custom: return k.check(c, v, key);
  }
  return v;
}

std::string allowed_keys(const SectionSpec& s) {
  std::string a;
  for (const KeySpec& k : s.keys) a += (a.empty() ? "" : ", ") + k.key;
  return a;
}

// "section.key=value", or "section.key.sub=value" for a key inside a table (model.compress_rates,
// model.rope_parameters). The value is read as JSON, else as a TOML table, array or string
// ({a = 1}, ['x'], 'text'), else taken as a bare string.
void apply_override(json& j, const std::string& ov) {
  size_t eq = ov.find('='), dot = ov.find('.');
  TREX_USER_CHECK(eq != std::string::npos && dot != std::string::npos && dot < eq,
                  "write --set section.key=value", "--set '", ov, "' is not section.key=value");
  std::vector<std::string> path;
  for (size_t a = 0; a <= eq;) {
    size_t b = std::min(ov.find('.', a), eq);
    path.push_back(ov.substr(a, b - a));
    a = b + 1;
  }
  for (const std::string& part : path)
    TREX_USER_CHECK(!part.empty(), "write --set section.key=value", "--set '", ov, "' has an empty key part");
  const std::string val = ov.substr(eq + 1);
  json v;
  try {
    v = json::parse(val);
  } catch (const json::exception&) {
    // TOML for what JSON cannot write (inline tables, arrays and strings in single quotes); a
    // bare word, or a TOML date or inf / nan, stays the string it was.
    std::optional<json> t = io::parse_toml_value(val);
    v = t && (t->is_object() || t->is_array() || t->is_string()) ? *t : json(val);
  }
  json* at = &j;
  std::string walked;
  for (size_t i = 0; i + 1 < path.size(); ++i) {
    walked += (i ? "." : "") + path[i];
    json& next = (*at)[path[i]];
    if (next.is_null()) next = json::object();
    TREX_USER_CHECK(next.is_object(), "set " + walked + " itself, or a key of a table",
                    "--set '", ov, "': ", walked, " is not a table");
    at = &next;
  }
  (*at)[path.back()] = v;
}

// [model] inline: every key must be one a supported config class knows (a typo would otherwise
// leave the default in place); known keys trex does not use are listed (info).
void check_inline_model_keys(const json& mj, const std::string& where) {
  const std::vector<std::string>& known = model::known_config_keys();
  for (auto& [k, v] : mj.items()) {
    if (std::find(known.begin(), known.end(), k) != known.end()) continue;
    const std::string near = nearest_name(k, known);
    TREX_USER_FAIL((near.empty() ? std::string("remove it") : "did you mean '" + near + "'?") +
                       " ([model] holds the Hugging Face config.json keys of DeepSeek-V3 / Kimi-K2 / DeepSeek-V4; "
                       "docs/CONFIG.md lists them)",
                   where, ": unknown key model.", k);
  }
}

// [train] indexer_loss_weight / indexer_stage against the model and the layout.
void check_indexer_loss(const RunConfig& r, const std::string& where) {
  const TrainConfig& t = r.train;
  TREX_USER_CHECK(t.indexer_stage != model::IndexerStage::DenseWarmup || t.indexer_loss_weight > 0,
                  "set train.indexer_loss_weight > 0 (the dense warm-up trains only the indexer), or "
                  "train.indexer_stage = \"sparse\"",
                  where, ": train.indexer_stage = \"dense_warmup\" with train.indexer_loss_weight = 0 trains nothing");
  TREX_USER_CHECK(!t.indexer_recall || r.model.indexer_layers() > 0,
                  "set train.indexer_recall = false, or use a deepseek_v32 model or a deepseek_v4 model with a "
                  "compressed_sparse_attention layer",
                  where, ": train.indexer_recall = true needs a lightning indexer, but model_type ", r.model.model_type,
                  " has none");
  TREX_USER_CHECK(!t.indexer_recall || r.parallel.tp <= 1, "set parallel.tp = 1, or train.indexer_recall = false",
                  where, ": train.indexer_recall = true with parallel.tp = ", r.parallel.tp,
                  ": the recall needs every attention head's probabilities on one rank");
  if (t.indexer_loss_weight <= 0) return;
  TREX_USER_CHECK(r.model.is_v32() || r.model.is_v4(), "set train.indexer_loss_weight = 0, or use a deepseek_v32 or "
                  "deepseek_v4 model", where, ": train.indexer_loss_weight = ", t.indexer_loss_weight,
                  " needs a lightning indexer, but model_type ", r.model.model_type, " has none");
  TREX_USER_CHECK(r.model.indexer_layers() > 0, "set train.indexer_loss_weight = 0, or give the model a "
                  "compressed_sparse_attention layer (model.layer_types)", where, ": train.indexer_loss_weight = ",
                  t.indexer_loss_weight, ": model.layer_types has no compressed_sparse_attention layer, so this "
                  "DeepSeek-V4 model has no indexer to train");
  TREX_USER_CHECK(r.parallel.tp <= 1, "set parallel.tp = 1, or train.indexer_loss_weight = 0",
                  where, ": train.indexer_loss_weight = ", t.indexer_loss_weight, " with parallel.tp = ", r.parallel.tp,
                  ": the indexer loss needs every attention head's probabilities on one rank");
}

// [train] recompute_modules is used only with recompute = "selective"; a list given with another
// mode is ignored, with a warning (every key at its default parses: docs/CONFIG.md).
void check_recompute(const RunConfig& r, const std::string& where) {
  const json& t = r.raw.contains("train") ? r.raw["train"] : json::object();
  if (t.is_object() && t.contains("recompute_modules") && r.train.recompute != model::Recompute::Selective)
    TREX_LOG_WARN(where, ": train.recompute_modules is ignored: train.recompute = \"", recompute_name(r.train.recompute),
                  "\" (the modules are used only with \"selective\")");
  // The DeepSeek-V4 modules: its query up-projection (no KV up-projection: one shared KV head) and
  // its hyper-connection streams; other models have neither.
  const unsigned v4_only = model::kRecomputeMlaUpProj | model::kRecomputeMhc;
  if (r.train.recompute == model::Recompute::Selective && (r.train.recompute_modules & v4_only))
    TREX_USER_CHECK(r.model.is_v4(),
                    "remove " + recompute_module_names(r.train.recompute_modules & v4_only).dump() +
                        " from train.recompute_modules (\"moe\", \"moe_act\", \"moe_out\" and \"shared_experts\" "
                        "apply to every MoE model)",
                    where, ": train.recompute_modules = ", recompute_module_names(r.train.recompute_modules).dump(),
                    ": ", recompute_module_names(r.train.recompute_modules & v4_only).dump(),
                    " recompute DeepSeek-V4's query up-projection and hyper-connection streams; model_type ",
                    r.model.model_type, " has none");
  if (r.train.recompute == model::Recompute::Selective &&
      (r.train.recompute_modules & model::kRecomputeSharedExperts) && r.model.n_shared_experts == 0)
    TREX_LOG_WARN(where, ": train.recompute_modules names \"shared_experts\", which changes nothing: the model has "
                  "no shared experts (n_shared_experts = 0)");
}

// The two fault bounds (docs/PARALLEL.md, "Dead or slow"): the heartbeat's must be the shorter,
// else a slow step would end the job before a dead peer is told apart from it.
void check_fault_timeouts(const RunConfig& r, const std::string& where) {
  const ParallelConfig& p = r.parallel;
  TREX_USER_CHECK(p.peer_timeout_s > 0, "set parallel.peer_timeout_s to a number of seconds > 0 (default 30)",
                  where, ": parallel.peer_timeout_s = ", p.peer_timeout_s, " must be > 0");
  TREX_USER_CHECK(p.watchdog_s <= 0 || p.peer_timeout_s < p.watchdog_s,
                  "lower parallel.peer_timeout_s below parallel.watchdog_s (e.g. 30 and 600): a dead peer ends the "
                  "job after peer_timeout_s, a slow step after watchdog_s",
                  where, ": parallel.peer_timeout_s = ", p.peer_timeout_s, " must be < parallel.watchdog_s = ",
                  p.watchdog_s);
}

}  // namespace

RunConfig parse_run_config(json j, const std::string& where, const std::vector<std::string>& overrides) {
  for (const std::string& ov : overrides) apply_override(j, ov);
  RunConfig r;
  r.raw = j;
  Ctx c{where};
  TREX_USER_CHECK(j.is_object(), "a run config is a TOML table", where, ": not a table");
  TREX_USER_CHECK(j.contains("model") && j["model"].is_object(), "add a [model] section (path = checkpoint dir, or "
                  "Hugging Face config.json keys)", where, ": missing [model]");

  const std::vector<SectionSpec>& S = sections();
  for (auto& [sec, body] : j.items()) {
    if (sec == "model") continue;
    auto it = std::find_if(S.begin(), S.end(), [&](const SectionSpec& s) { return s.name == sec; });
    if (it == S.end()) {
      std::string all = "model";
      for (const SectionSpec& s : S) all += ", " + s.name;
      TREX_USER_FAIL("allowed sections: " + all, where, ": unknown section [", sec, "]");
    }
    TREX_USER_CHECK(body.is_object(), "a section is a table", where, ": [", sec, "] is not a table");
    TREX_USER_CHECK(sec != "checkpoint" || !(body.contains("dir") && body.contains("run_dir")),
                    "keep checkpoint.run_dir only (dir is its old name)", where,
                    ": both checkpoint.dir and checkpoint.run_dir are set");
    for (auto& [k, v] : body.items()) {
      auto kt = std::find_if(it->keys.begin(), it->keys.end(), [&](const KeySpec& s) { return s.key == k; });
      if (kt == it->keys.end()) {
        std::vector<std::string> names;
        for (const KeySpec& s : it->keys) names.push_back(s.key);
        const std::string near = nearest_name(k, names);
        TREX_USER_FAIL((near.empty() ? std::string() : "did you mean '" + near + "'? ") + "allowed keys in [" + sec +
                           "]: " + allowed_keys(*it),
                       where, ": unknown key ", sec, ".", k);
      }
      kt->set(r, checked(c, *kt, v, sec + "." + k));
    }
  }

  json mj = j["model"];
  if (mj.contains("path")) {
    TREX_USER_CHECK(mj["path"].is_string(), "model.path must be a string", where, ": bad model.path");
    r.model_path = mj["path"].get<std::string>();
    // The checkpoint's config.json describes its weights: no inline key overrides it (a key next
    // to path would otherwise be silently ignored).
    for (auto& [k, v] : mj.items())
      TREX_USER_CHECK(k == "path",
                      "remove model." + k + ": with model.path, [model] takes no other key (to change the "
                      "model, edit config.json in a copy of the checkpoint; docs/CONFIG.md)",
                      where, ": model.", k, " is set next to model.path, whose config.json defines the model");
    std::string cfg = r.model_path;
    if (cfg.size() < 5 || cfg.compare(cfg.size() - 5, 5, ".json") != 0) cfg += "/config.json";
    r.model = model::load_config_json(cfg);
    if (r.data.tokenizer.empty()) r.data.tokenizer = r.model_path + "/tokenizer.json";
  } else {
    check_inline_model_keys(mj, where);
    std::set<std::string> used;
    r.model = model::parse_config(mj, where + " [model]", &used);
    std::string unused;
    for (const std::string& k : model::not_used(mj, used)) unused += (unused.empty() ? "" : ", ") + k;
    if (!unused.empty()) TREX_LOG_INFO(where, ": [model] keys trex does not use (ignored): ", unused);
  }
  r.optim.schedule.total_steps = r.train.steps;
  check_indexer_loss(r, where);
  check_fault_timeouts(r, where);
  check_recompute(r, where);
  return r;
}

std::string run_config_reference() {
  auto cell = [](std::string s) {  // a Markdown table cell
    std::string o;
    for (char ch : s) o += ch == '|' ? std::string("\\|") : std::string(1, ch);
    return o;
  };
  std::string md =
      "# Run config reference\n\n"
      "<!-- Generated by `trex config reference` from the table the parser reads (train/run_config.cpp).\n"
      "     Do not edit by hand: change the table, then `trex config reference > docs/CONFIG.md`.\n"
      "     The config_reference test fails when this file and the binary differ. -->\n\n"
      "`trex train --config run.toml` reads a TOML file with the sections below. Every key except the\n"
      "model's is optional. An unknown section or key, a wrong type or an out-of-range value is an error\n"
      "that names the file and the key (and the nearest known key, for a typo).\n"
      "`--set section.key=value` overrides any key from the command line; the value is read as JSON\n"
      "when it parses, else as a TOML value, else as a string (`--set data.train='[\"a.jsonl\", \"b.jsonl\"]'`,\n"
      "`--set 'model.compress_rates={compressed_sparse_attention = 4, heavily_compressed_attention = 128}'`,\n"
      "`--set optim.schedule=wsd`); `section.table.key=value` sets one key of a table\n"
      "(`--set model.rope_parameters.factor=32`). `--resume` and `--trace` of `trex train` set\n"
      "checkpoint.resume and log.trace.\n\n"
      "```toml\n"
      "[model]\npath = \"base/checkpoints/step-00000250\"   # or the config.json keys inline\n\n"
      "[data]\nmode = \"sft\"\ntrain = [\"chats.jsonl\"]\neval_fraction = 0.02\nseq_len = 1024\n\n"
      "[train]\nbatch_size = 4\nsteps = 1000\n\n"
      "[optim]\nlr = 1e-5\nwarmup_steps = 50\n\n"
      "[checkpoint]\ndir = \"runs/sft\"\nevery = 200\n"
      "```\n\n"
      "## [model]\n\n"
      "The model to train, in one of two forms:\n\n"
      "- `path = \"DIR\"`: a checkpoint directory (config.json + safetensors; a trex checkpoint or a\n"
      "  Hugging Face one), or a config.json file (weights start from random init). The weights and\n"
      "  `DIR/tokenizer.json` (the default data.tokenizer) come from there. With `path`, the table takes\n"
      "  no other key: the checkpoint's config.json describes its weights and no inline key overrides\n"
      "  it; to change the model, edit config.json in a copy of the checkpoint.\n"
      "- the keys of a Hugging Face config.json inline (a fresh model, random init). `model_type` is\n"
      "  `deepseek_v3` (the default; also DeepSeek-R1, V3.1, Kimi-K2, Moonlight), `kimi_k2`,\n"
      "  `deepseek_v2` (DeepSeek-V2, V2-Lite, V2.5; keys left out take transformers' DeepseekV2Config\n"
      "  defaults, `q_lora_rank = 0` stands for null: docs/V2.md), `deepseek_v32` (DeepSeek-V3.2; keys\n"
      "  left out take transformers' DeepseekV32Config defaults: docs/V32.md) or `deepseek_v4`.\n\n"
      "A key that no supported config class knows is an error that names the nearest known key. Known\n"
      "keys trex does not use are listed once at start (an info line), for inline keys and for a\n"
      "checkpoint's config.json alike.\n\n"
      "Keys trex reads (which of them a model needs depends on model_type; the DeepSeek-V3, V2, V3.2\n"
      "and V4 Hugging Face configs document their meaning):\n\n";
  auto key_list = [](const std::vector<std::string>& keys) {
    std::vector<std::string> k = keys;
    std::sort(k.begin(), k.end());
    std::string out;
    for (const std::string& x : k) out += (out.empty() ? "`" : ", `") + x + "`";
    return out + "\n\n";
  };
  md += key_list(model::read_config_keys());
  md += "Keys known to the Hugging Face classes that trex does not use (accepted and listed at start,\n"
        "file metadata such as `architectures` excepted; `aux_loss_alpha` here is Hugging Face's: trex's\n"
        "balance loss is [train] aux_loss_alpha):\n\n";
  md += key_list(model::ignored_config_keys());
  for (const SectionSpec& s : sections()) {
    md += "## [" + s.name + "]\n\n" + s.doc + "\n\n| key | type | default | meaning |\n|---|---|---|---|\n";
    const RunConfig defaults;
    for (const KeySpec& k : s.keys)
      md += "| `" + k.key + "` | " + cell(type_of(k)) + " | `" + cell(k.get(defaults).dump()) + "` | " + cell(k.doc) +
            " |\n";
    md += "\n";
  }
  return md;
}

parallel::ParallelDims resolve_parallel(const RunConfig& rc, int world_size) {
  parallel::ParallelDims d;
  d.tp = (int)rc.parallel.tp, d.pp = (int)rc.parallel.pp, d.ep = (int)rc.parallel.ep, d.cp = (int)rc.parallel.cp;
  for (int64_t n : rc.parallel.pp_layers) d.pp_layers.push_back((int)n);
  d.dp = rc.parallel.dp > 0 ? (int)rc.parallel.dp : std::max(1, world_size / std::max(1, d.tp * d.cp * d.pp));
  TREX_USER_CHECK(world_size > 1 || d.world() == 1,
                  "launch with mpirun -np " + std::to_string(d.world()) + " trex ...",
                  d.cp > 1 ? "parallel.dp x tp x cp x pp = " : "parallel.dp x tp x pp = ", d.world(), " needs ",
                  d.world(), " MPI ranks but trex runs as one process");
  validate_layout(d, world_size, rc.model);
  if (d.cp > 1) model::check_cp_seq_len(rc.data.seq_len, d.cp, "data.seq_len");
  TREX_USER_CHECK(!rc.parallel.sequence_parallel || d.tp == 1 || rc.data.seq_len >= d.tp,
                  "set data.seq_len >= parallel.tp, or parallel.sequence_parallel = false",
                  "parallel.sequence_parallel splits every sequence's tokens over the tp = ", d.tp,
                  " ranks, but data.seq_len = ", rc.data.seq_len);
  return d;
}

RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides) {
  return parse_run_config(io::load_toml_as_json(path), path, overrides);
}

std::string recompute_modules_toml(unsigned bits) {
  std::string s;
  for (const json& n : recompute_module_names(bits)) s += (s.empty() ? "[\"" : ", \"") + n.get<std::string>() + "\"";
  return s.empty() ? "[]" : s + "]";
}

}  // namespace trex::train
