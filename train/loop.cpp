#include "train/loop.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <thread>
#include "core/log.h"
#include "core/timer.h"
#include "core/trace.h"
#include "core/parallel.h"
#include "io/atomic_file.h"
#include "kernels/peak.h"
#include "model/checkpoint.h"
#include "train/checkpoint.h"
#include "train/device.h"
#include "train/job_guard.h"
#include "train/layout.h"
#include "train/loss_spikes.h"
#include "train/metrics.h"
#include "train/pipeline.h"
#include "train/preflight.h"
#include "train/stop_signal.h"
#include "train/token_cache.h"
#include "train/trainer.h"

namespace trex::train {

namespace fs = std::filesystem;

namespace {

// Where the token cache lives: data.cache_dir, "auto" = $TREX_CACHE_DIR, $XDG_CACHE_HOME/trex or
// ~/.cache/trex (then /tokens), "none" = no cache.
std::string resolve_cache_dir(const std::string& c) {
  if (c == "none") return "";
  if (c != "auto") return c;
  if (const char* e = std::getenv("TREX_CACHE_DIR"); e && *e) return std::string(e) + "/tokens";
  if (const char* e = std::getenv("XDG_CACHE_HOME"); e && *e) return std::string(e) + "/trex/tokens";
  if (const char* e = std::getenv("HOME"); e && *e) return std::string(e) + "/.cache/trex/tokens";
  return "";
}

// Mean loss over up to n batches of the eval split (no gradients). Data parallel: the batches are
// global (dp x batch rows, as a one-process run with batch_size dp x batch sees them); rank r
// evaluates its `batch` rows of each, and the sums are reduced.
double eval_loss(model::Model& m, const std::vector<PackedSeq>& seqs, int64_t batch, int64_t n, DataParallel* dp) {
  double sum = 0;
  int64_t valid = 0;
  const int64_t R = dp ? dp->data_size() : 1, r = dp ? dp->data_rank() : 0, gbatch = R * batch;
  for (int64_t b = 0; b < n && b * gbatch < (int64_t)seqs.size(); ++b) {
    std::vector<int64_t> which;
    const int64_t lo = b * gbatch + r * batch;
    const int64_t hi = std::min<int64_t>({lo + batch, (b + 1) * gbatch, (int64_t)seqs.size()});
    for (int64_t i = lo; i < hi; ++i) which.push_back(i);
    // Expert parallel: the forward is a collective over the ep group, so a rank without rows in
    // the last (partial) global batch still runs one, on a row it does not count.
    // Pipeline parallel too: the stages' forward is a chain of sends and receives.
    const bool count = !which.empty();
    if (!count && !m.expert_parallel().on() && !m.pipeline_stage().on()) continue;
    if (!count) which.push_back(b * gbatch);
    BatchBuffer bb = make_batch(seqs, which);
    const model::Batch batch = bb.batch(which.size(), seqs[0].ids.size());
    model::LossParts lp = dp && dp->pipeline() ? pipeline_forward(m, *dp->pipeline(), batch, &dp->pipeline_wait_ms())
                                               : m.forward(batch);
    if (!count) continue;
    sum += lp.ce * lp.n_valid;
    valid += lp.n_valid;
  }
  if (dp) {
    double v[2] = {sum, (double)valid};
    dp->sum(v, 2, Count::PerStage);  // pipeline parallel: the last stage's (the others have 0)
    sum = v[0], valid = (int64_t)v[1];
  }
  return valid ? sum / valid : 0.0;
}

// The hint when NaN / Inf steps stop the run. A run that resumed loaded its moments from a
// checkpoint: when they are what went bad, --resume auto would load the same state again, so
// name the checkpoint before the one it resumed from.
std::string nan_hint(const std::string& run_dir, const std::string& resumed_from) {
  std::string h = "lower the learning rate or check the data";
  if (resumed_from.empty())
    return h + "; the newest checkpoint in " + run_dir + " holds the last good weights (--resume auto)";
  const fs::path from(resumed_from);
  std::optional<std::string> older;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(run_dir) / "checkpoints", ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("step-", 0) == 0 && n.size() == from.filename().string().size() && n < from.filename().string() &&
        (!older || n > fs::path(*older).filename().string()))
      older = e.path().string();
  }
  h += "; this run resumed from " + resumed_from + ", whose weights or optimizer moments may be what went bad";
  return older ? h + ": resume from the checkpoint before it (--resume " + *older + ")"
               : h + ": start over from the initial weights (--resume none)";
}

}  // namespace

TrainResult run_training(const RunConfig& rc, const TokenizerFns& tok, parallel::Communicator* world,
                         int local_ranks) {
  TrainResult res;
  // Parallel layout: data parallel over the ranks of `world` (parallel.dp = 0: all of them).
  const parallel::ParallelDims dims = resolve_parallel(rc, world ? world->size() : 1);
  const int dp_size = dims.dp, rank = world ? world->rank() : 0, data_rank = dims.coord(rank).dp;
  const bool root = rank == 0;
  res.dp = dp_size;
  const int threads = init_threads((int)rc.train.threads);
  const std::string run_dir = rc.checkpoint.run_dir;
  // Start-up checks, before any data is read or memory allocated: the device can run the step
  // (train/device.h), the run directory takes a write, and the run's memory estimate fits this
  // machine (train/preflight.h).
  const std::unique_ptr<kern::Backend> device = open_device(rc.train.device, "train.device");
  if (root) check_run_dir_writable(run_dir);
  const MemoryEstimate mem = check_memory(rc, dims.world(), world ? local_ranks : 1);
  res.memory_estimate = mem.total();
  // Rank 0 reads (and caches) the data first; the others then read the token cache.
  if (world && !root) world->barrier();

  // Data.
  TREX_USER_CHECK(!rc.data.train.empty(), "set data.train to one or more files", "[data] train is empty");
  DataStats& st = res.data;
  DocsSpec spec;
  spec.mode = rc.data.mode;
  spec.chat = ChatTemplate::by_name(rc.data.chat_template);
  spec.train_on_prompt = rc.data.train_on_prompt;
  spec.eos_id = tok.eos_id;
  spec.encode = tok.encode;
  spec.tokenizer_file = tok.file;
  const std::string cache_dir = resolve_cache_dir(rc.data.cache_dir);
  bool hit = false;
  TokenDocs train_store = load_docs(rc.data.train, spec, cache_dir, st, &hit), eval_store;
  std::vector<DocSpan> train_docs = train_store.spans(), eval_docs;
  if (!rc.data.eval.empty()) {
    DataStats est;
    eval_store = load_docs(rc.data.eval, spec, cache_dir, est);
    eval_docs = eval_store.spans();
  } else if (rc.data.eval_fraction > 0 && train_docs.size() > 1) {
    std::vector<int64_t> order = epoch_order(train_docs.size(), rc.train.seed, -1);
    int64_t n_eval = std::max<int64_t>(1, (int64_t)(rc.data.eval_fraction * train_docs.size()));
    std::vector<char> is_eval(train_docs.size(), 0);
    for (int64_t i = 0; i < n_eval; ++i) is_eval[order[i]] = 1;
    std::vector<DocSpan> keep;
    for (size_t i = 0; i < train_docs.size(); ++i) (is_eval[i] ? eval_docs : keep).push_back(train_docs[i]);
    train_docs.swap(keep);
  } else if (rc.data.eval_fraction > 0 && root) {
    TREX_LOG_WARN("data.eval_fraction = ", rc.data.eval_fraction, " but the training data hold ", train_docs.size(),
                  " document(s): no eval split (plain text: separate documents by a blank line, docs/DATA.md; or "
                  "give data.eval files)");
  }
  res.data_from_cache = hit;
  const bool cpt = rc.data.mode == "cpt";
  std::vector<PackedSeq> seqs = pack(train_docs, rc.data.seq_len, rc.data.overflow, cpt, tok.pad_id, st);
  DataStats est;
  std::vector<PackedSeq> eval_seqs = pack(eval_docs, rc.data.seq_len, rc.data.overflow, cpt, tok.pad_id, est);
  if (world && root) world->barrier();
  TREX_USER_CHECK(!seqs.empty(), "give more data or a shorter seq_len", "no training sequences after packing");

  // Model, optimizer, resume.
  // Expert / pipeline / tensor parallel: this rank allocates and loads only its ep rank's routed
  // experts, its stage's tensors and its tp rank's slice of the attention and dense MLPs.
  const model::TrainOptions topt = train_options(rc);
  model::Model m(rc.model, rc.train.precision, topt,
                 expert_shard_of(dims, rank, rc.model), stage_shard_of(dims, rank, rc.model), tp_shard_of(dims, rank));
  if (device) m.use_backend(*device);
  m.acts.reserve((size_t)mem.activations);  // a device's arena: the step in one block (host memory grows in place)
  if (!rc.model_path.empty()) {
    model::load_hf_weights(m, rc.model_path);
  } else {
    m.init_random(rc.train.seed);
  }
  const AdamWConfig ocfg{(float)rc.optim.schedule.lr, rc.optim.beta1, rc.optim.beta2, rc.optim.eps,
                         rc.optim.weight_decay, rc.optim.clip_grad_norm};
  // One rank: AdamW over the whole slab. Data parallel: the ZeRO-1 shard inside DataParallel
  // (which also makes the replicas equal).
  std::unique_ptr<AdamW> opt1;
  // Expert / tensor parallel: the groups, set on the model; DataParallel over the dp x tp ranks.
  ParallelRun par;
  if (world && world->size() > 1) {
    DpOptions o{rc.parallel.bucket_size, rc.parallel.overlap};
    o.overlap_params = rc.parallel.overlap && rc.parallel.overlap_params;  // all-gather into the next forward
    o.sequence_parallel = rc.parallel.sequence_parallel;
    o.zero_stage = (int)rc.parallel.zero_stage;
    par = make_parallel_run(*world, dims, m, ocfg, o);
  }
  std::unique_ptr<DataParallel>& dp = par.dp;
  if (!dp)
    opt1 = std::make_unique<AdamW>(m, ocfg);
  TrainState state;
  std::string resume_dir;
  bool verified = false;
  if (rc.checkpoint.resume == "auto") {
    // The newest checkpoint whose files match their manifest; damaged newer ones are skipped.
    const ResumePick pick = newest_verified_checkpoint(run_dir);
    for (const std::string& s : pick.skipped)
      if (root) TREX_LOG_WARN("--resume auto: skipping damaged checkpoint ", s);
    if (pick.dir) resume_dir = *pick.dir, verified = true;
    if (root && !pick.skipped.empty())
      TREX_LOG_WARN("--resume auto: ", pick.dir ? "resuming from " + *pick.dir : "no checkpoint verifies; starting over",
                    " (", pick.skipped.size(), " newer checkpoint(s) skipped)");
  } else if (rc.checkpoint.resume != "none") {
    resume_dir = rc.checkpoint.resume;
  }
  if (world && world->size() > 1) {  // every rank must resume from the same checkpoint
    const std::string name = fs::path(resume_dir).filename().string();
    const int64_t mine = resume_dir.empty() ? -1 : (int64_t)(std::hash<std::string>{}(name) & 0x7fffffff);
    const int64_t hi = world->all_reduce_value(mine, parallel::ReduceOp::Max);
    const int64_t lo = -world->all_reduce_value(-mine, parallel::ReduceOp::Max);
    TREX_USER_CHECK(hi == lo, "put the run directory on a file system every rank sees alike",
                    "rank ", rank, ": the ranks chose different checkpoints to resume from (this rank: '", resume_dir, "')");
  }
  if (!resume_dir.empty())
    state = dp ? load_checkpoint(resume_dir, *dp, !verified) : load_checkpoint(resume_dir, m, *opt1, !verified);
  // The tokenizer travels with every checkpoint (generate, or eval --model and runs that start
  // from the checkpoint find it there), with its tokenizer_config.json when it has one.
  if (!tok.file.empty() && fs::is_regular_file(tok.file)) {
    state.carry.push_back({tok.file, "tokenizer.json"});
    const fs::path tc = fs::path(tok.file).parent_path() / "tokenizer_config.json";
    if (fs::is_regular_file(tc)) state.carry.push_back({tc.string(), "tokenizer_config.json"});
  }
  // Loss spikes against a running window; the window travels in checkpoints so that a resumed
  // run flags the same steps.
  SpikeDetector spikes(rc.log.spike_window, rc.log.spike_z);
  if (state.extra.is_object() && state.extra.contains("loss_window")) spikes.restore(state.extra["loss_window"]);

  // Rank 0 alone writes metrics.jsonl, the resolved config and the live view.
  std::unique_ptr<MetricsLog> log_owner;
  if (root) {
    // A resumed run cuts metrics.jsonl back to the checkpoint's step: the steps after it run again.
    log_owner = std::make_unique<MetricsLog>(run_dir, rc.log.progress, rc.log.every,
                                             resume_dir.empty() ? -1 : state.step);
    io::write_file_atomic(run_dir + "/config.resolved.json", rc.raw.dump(2) + "\n");
  }
  auto message = [&](const std::string& msg) {
    if (log_owner) log_owner->message(msg);
  };
  const std::string dp_note = dp ? detail::cat(" per rank, data parallel dp=", dp_size,
                                               dims.ep > 1 ? detail::cat(" expert parallel ep=", dims.ep, " (",
                                                                         dims.experts_per_rank(rc.model.n_routed_experts),
                                                                         " experts per rank)") : "",
                                               dims.tp > 1 ? detail::cat(" tensor parallel tp=", dims.tp) : "",
                                               dims.pp > 1 ? detail::cat(" pipeline parallel pp=", dims.pp, " (1F1B)") : "",
                                               dims.cp > 1 ? detail::cat(" context parallel cp=", dims.cp, " (",
                                                                         rc.data.seq_len / dims.cp,
                                                                         " positions of each sequence per rank)") : "",
                                               " (ZeRO-", rc.parallel.zero_stage, ", ",
                                               dp->num_buckets(), " buckets",
                                               rc.parallel.overlap ? ", overlapped" : "", ")")
                                 : "";
  message(detail::cat("trex train: ", rc.data.mode, ", ", train_docs.size(), " documents -> ", seqs.size(),
                          " sequences of ", rc.data.seq_len, " (", st.skipped_malformed, " malformed, ",
                          st.skipped_no_target, " without targets, ", st.truncated, " truncated, ", st.dropped_too_long,
                          " dropped), eval ", eval_seqs.size(), " sequences",
                          cache_dir.empty() || tok.file.empty() ? "" : (hit ? " (tokens from the cache)" : " (tokens cached)"), "; ", m.cfg.num_params(), " params, ",
                          threads, " threads", dp_note, resume_dir.empty() ? "" : ", resumed from " + resume_dir));
  for (const std::string& e : st.first_errors) message("  skipped: " + e);
  if (log_owner && log_owner->dropped() > 0)
    message(detail::cat("metrics.jsonl: ", log_owner->dropped(), " line(s) past step ", state.step,
                        " dropped (this run writes those steps again)"));

  const double peak = kern::measure_peak(0.1).best_gflops() * dims.world();  // every rank's (assumed equal)
  const double fpt = m.cfg.train_flops_per_token(rc.data.seq_len);  // with the MTP blocks it trains
  const int64_t nseq = seqs.size(), B = rc.train.batch_size;
  int64_t cached_epoch = -1;
  std::vector<int64_t> order;
  // Debug hook (tests of the NaN guard): TREX_INJECT_NAN_STEP=k puts a NaN into step k's gradients.
  const char* inj = std::getenv("TREX_INJECT_NAN_STEP");
  const int64_t inject_nan_step = inj ? std::atoll(inj) : 0;
  int64_t bad_in_a_row = 0;
  Profiler prof;
  TraceLog tlog;
  const int64_t first_step = state.step;
  // A stuck or stopped rank, a dead peer, a lost host or a cut network would leave the others
  // waiting in a collective forever: the watchdog (no finished step, with its eval and checkpoint,
  // for parallel.watchdog_s) and the heartbeat (parallel.peer_timeout_s of silence) end the job,
  // every rank (train/job_guard.h). Collective: every rank constructs it here.
  JobGuard guard(world, rc.parallel, "training step",
                 "; the newest checkpoint in " + run_dir + " is complete (--resume auto).", state.step);
  // Debug hook (tests of the watchdog with live peers): TREX_INJECT_HANG=R:K makes rank R stop
  // before step K, its heartbeat still answering, as a deadlocked or very slow step would.
  int64_t hang_step = 0;
  if (const char* h = std::getenv("TREX_INJECT_HANG"); h && std::atoi(h) == rank && std::strchr(h, ':'))
    hang_step = std::atoll(std::strchr(h, ':') + 1);
  // SIGTERM / SIGINT: finish the step, save, stop (train/stop_signal.h); the ranks agree on the step.
  std::optional<StopSignals> stop;
  if (rc.train.exit_signal_save) stop.emplace();
  for (int64_t step = state.step; step < rc.train.steps; ++step) {
    std::vector<BatchBuffer> bufs;
    std::vector<model::Batch> micro;
    // The global batch is dp x grad_accum x B sequences at data positions [data_position, + that):
    // rank r's micro-batch a takes B of them (train/dist.h: dp_data_position); data_position is global.
    for (int64_t a = 0; a < rc.train.grad_accum; ++a) {
      std::vector<int64_t> which;
      for (int64_t i = 0; i < B; ++i) {
        const int64_t p = dp_data_position(state.data_position, a, data_rank, dp_size, B, i);
        const int64_t epoch = p / nseq;
        if (epoch != cached_epoch) order = epoch_order(nseq, rc.train.seed, epoch), cached_epoch = epoch;
        which.push_back(order[p % nseq]);
      }
      bufs.push_back(make_batch(seqs, which));
    }
    state.data_position += rc.train.grad_accum * dp_size * B;
    for (auto& b : bufs) micro.push_back(b.batch(B, rc.data.seq_len));
    while (hang_step > 0 && step + 1 == hang_step) std::this_thread::sleep_for(std::chrono::seconds(1));
    const double lr = rc.optim.schedule.at(step);
    const bool inject = inject_nan_step > 0 && step + 1 == inject_nan_step;
    const bool tracing = !rc.log.trace.empty() && step - first_step < rc.log.trace_steps;
    if (tracing && !m.prof) {  // log.trace: profiler regions and collectives on a timeline
      prof.trace = &tlog;
      m.prof = &prof;
      if (dp) dp->set_trace(&tlog);
    } else if (!tracing && m.prof == &prof) {
      m.prof = nullptr;
      if (dp) dp->set_trace(nullptr);
    }
    const double t_step = now_ms();
    StepStats s = dp ? trainer_step(*dp, micro, (float)lr, rc.train.bias_update_gamma, m.prof, inject)
                     : trainer_step(m, *opt1, micro, (float)lr, rc.train.bias_update_gamma, m.prof, inject);
    if (tracing) tlog.add("step " + std::to_string(step + 1), TraceTrack::Compute, t_step, now_ms());
    res.step_ms += s.ms;
    res.comm_ms += s.comm_ms;
    if (s.skipped) {
      ++res.skipped_steps;
      ++bad_in_a_row;
      if (root)
        TREX_LOG_WARN("step ", step + 1, ": loss ", s.loss, ", gradient norm ", s.grad_norm,
                      " is not finite; step skipped (weights unchanged), ", bad_in_a_row, " in a row");
      TREX_USER_CHECK(bad_in_a_row < rc.train.max_skipped_steps, nan_hint(run_dir, resume_dir),
                      "stopping: ", bad_in_a_row, " steps in a row had a NaN / Inf loss or gradient (train.max_skipped_steps = ",
                      rc.train.max_skipped_steps, ")");
    } else {
      bad_in_a_row = 0;
    }
    state.step = step + 1;
    StepMetrics mt;
    mt.step = state.step;
    mt.total_steps = rc.train.steps;
    mt.loss = s.loss, mt.ce = s.ce, mt.aux = s.aux, mt.lr = lr, mt.grad_norm = s.grad_norm, mt.ms = s.ms;
    mt.tokens = s.tokens;
    mt.tokens_per_s = s.tokens / (s.ms / 1000.0);
    mt.mfu = fpt * mt.tokens_per_s / (peak * 1e9);
    mt.load_max_over_mean = s.load_max_over_mean;
    if (rc.log.expert_loads) mt.expert_loads = s.expert_loads;
    if (m.opt.indexer_metrics()) mt.indexer_loss = s.indexer, mt.indexer_recall = s.indexer_recall;
    mt.skipped = s.skipped;
    if (dp) mt.comm_ms = s.comm_ms;
    if (!s.skipped) {
      const SpikeVerdict sv = spikes.observe(s.loss);
      mt.spike = sv.spike, mt.loss_z = sv.z;
      if (sv.spike) {
        ++res.loss_spikes;
        if (root)
          TREX_LOG_WARN("step ", state.step, ": loss spike: ", s.loss, " against a mean of ", sv.mean, " over the last ",
                        spikes.size() - 1, " steps (", sv.z, " standard deviations)");
      }
    }
    if (rc.train.eval_every > 0 && !eval_seqs.empty() &&
        (state.step % rc.train.eval_every == 0 || state.step == rc.train.steps)) {
      mt.eval_loss = eval_loss(m, eval_seqs, B, rc.train.eval_batches, dp.get());
      res.last_eval_loss = mt.eval_loss;
    }
    if (log_owner) log_owner->step(mt);
    guard.done(state.step);
    if (res.steps == 0) res.first_loss = s.loss;
    res.last_loss = s.loss;
    ++res.steps;
    // A stop signal on any rank stops every rank after this step (one-int max all-reduce).
    int stop_sig = stop ? stop->signal() : 0;
    if (stop && world && world->size() > 1) stop_sig = world->all_reduce_value(stop_sig, parallel::ReduceOp::Max);
    const bool stopping = stop_sig != 0 && state.step < rc.train.steps;
    if ((rc.checkpoint.every > 0 && state.step % rc.checkpoint.every == 0) || state.step == rc.train.steps || stopping) {
      if (!state.extra.is_object()) state.extra = nlohmann::json::object();
      state.extra["loss_window"] = spikes.state();
      if (!dp) m.params_to_host(), opt1->state_to_host();  // a device backend's copies (no-ops on the CPU)
      res.last_checkpoint = dp ? save_checkpoint(run_dir, *dp, state, (int)rc.checkpoint.keep)
                               : save_checkpoint(run_dir, m, *opt1, state, (int)rc.checkpoint.keep);
      if (log_owner) log_owner->sync();
      guard.beat();
    }
    if (stopping) {
      res.stop_signal = stop_sig;
      message(detail::cat("stopped by ", stop_sig == SIGINT ? "SIGINT" : stop_sig == SIGTERM ? "SIGTERM" : "a signal",
                          " after step ", state.step, " of ", rc.train.steps, "; checkpoint ", res.last_checkpoint,
                          " written. Continue with --resume auto (exit code ", kExitStopped, ")"));
      break;
    }
  }
  guard.finish();  // the loop is over: what follows is bounded (trace parts, messages)
  if (dp) dp->wait_params();
  res.peak_rss = peak_rss_bytes();
  message(detail::cat("memory: estimated ", res.memory_estimate / (1 << 20), " MiB per rank, peak resident ",
                      res.peak_rss / (1 << 20), " MiB", res.loss_spikes ? detail::cat("; ", res.loss_spikes, " loss spike(s)") : "",
                      res.skipped_steps ? detail::cat("; ", res.skipped_steps, " skipped step(s)") : ""));
  m.prof = nullptr;
  if (dp) dp->set_trace(nullptr);
  if (!rc.log.trace.empty()) {  // every rank writes its part, rank 0 joins them
    const std::string part = rc.log.trace + ".rank" + std::to_string(rank) + ".part";
    write_trace_part(tlog, rank, part);
    if (world) world->barrier();
    if (root) {
      std::vector<std::string> parts;
      for (int r = 0; r < dims.world(); ++r) parts.push_back(rc.log.trace + ".rank" + std::to_string(r) + ".part");
      const size_t n = merge_trace_parts(parts, rc.log.trace);
      for (const std::string& p : parts) std::remove(p.c_str());
      message(detail::cat("trace: ", rc.log.trace, " (", n, " events, ", dims.world(), " rank(s))"));
    }
  }
  if (dp && res.steps > 0)
    message(detail::cat("data parallel: ", res.steps, " steps, mean step ", res.step_ms / res.steps,
                        " ms, exposed communication ", res.comm_ms / res.steps, " ms per step (rank 0, ",
                        res.step_ms > 0 ? 100 * res.comm_ms / res.step_ms : 0.0, "%)"));
  return res;
}

}  // namespace trex::train
