#include "train/loop.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include "core/log.h"
#include "core/parallel.h"
#include "kernels/peak.h"
#include "model/checkpoint.h"
#include "train/checkpoint.h"
#include "train/metrics.h"
#include "train/trainer.h"

namespace trex::train {

namespace fs = std::filesystem;

namespace {

std::vector<Sample> read_all(const RunConfig& rc, const std::vector<std::string>& files, const TokenizerFns& tok,
                             DataStats& st) {
  std::vector<Sample> docs;
  const ChatTemplate tmpl = ChatTemplate::by_name(rc.data.chat_template);
  for (const std::string& f : files) {
    std::vector<Sample> d = rc.data.mode == "sft"
                                ? read_sft_file(f, tmpl, tok.encode, rc.data.train_on_prompt, st)
                                : read_cpt_file(f, tok.encode, tok.eos_id, st);
    for (auto& s : d) docs.push_back(std::move(s));
  }
  return docs;
}

// Mean loss over up to n batches of the eval split (no gradients).
double eval_loss(model::Model& m, const std::vector<PackedSeq>& seqs, int64_t batch, int64_t n) {
  double sum = 0;
  int64_t valid = 0;
  for (int64_t b = 0; b < n && b * batch < (int64_t)seqs.size(); ++b) {
    std::vector<int64_t> which;
    for (int64_t i = b * batch; i < std::min<int64_t>((b + 1) * batch, seqs.size()); ++i) which.push_back(i);
    BatchBuffer bb = make_batch(seqs, which);
    model::LossParts lp = m.forward(bb.batch(which.size(), seqs[0].ids.size()));
    sum += lp.ce * lp.n_valid;
    valid += lp.n_valid;
  }
  return valid ? sum / valid : 0.0;
}

}  // namespace

TrainResult run_training(const RunConfig& rc, const TokenizerFns& tok) {
  TrainResult res;
  const int threads = init_threads((int)rc.train.threads);
  const std::string run_dir = rc.checkpoint.dir;
  fs::create_directories(run_dir);  // refuse an unwritable run directory before any work
  {
    std::ofstream probe(run_dir + "/.write_test");
    TREX_USER_CHECK(probe.good(), "set checkpoint.dir to a writable directory", run_dir, ": not writable");
  }
  fs::remove(run_dir + "/.write_test");

  // Data.
  TREX_USER_CHECK(!rc.data.train.empty(), "set data.train to one or more files", "[data] train is empty");
  DataStats& st = res.data;
  std::vector<Sample> train_docs = read_all(rc, rc.data.train, tok, st), eval_docs;
  if (!rc.data.eval.empty()) {
    DataStats est;
    eval_docs = read_all(rc, rc.data.eval, tok, est);
  } else if (rc.data.eval_fraction > 0 && train_docs.size() > 1) {
    std::vector<int64_t> order = epoch_order(train_docs.size(), rc.train.seed, -1);
    int64_t n_eval = std::max<int64_t>(1, (int64_t)(rc.data.eval_fraction * train_docs.size()));
    std::vector<char> is_eval(train_docs.size(), 0);
    for (int64_t i = 0; i < n_eval; ++i) is_eval[order[i]] = 1;
    std::vector<Sample> keep;
    for (size_t i = 0; i < train_docs.size(); ++i)
      (is_eval[i] ? eval_docs : keep).push_back(std::move(train_docs[i]));
    train_docs.swap(keep);
  }
  const bool cpt = rc.data.mode == "cpt";
  std::vector<PackedSeq> seqs = pack(train_docs, rc.data.seq_len, rc.data.overflow, cpt, tok.pad_id, st);
  DataStats est;
  std::vector<PackedSeq> eval_seqs = pack(eval_docs, rc.data.seq_len, rc.data.overflow, cpt, tok.pad_id, est);
  TREX_USER_CHECK(!seqs.empty(), "give more data or a shorter seq_len", "no training sequences after packing");

  // Model, optimizer, resume.
  model::Model m(rc.model, rc.train.precision, {rc.train.aux_loss_alpha, rc.train.mtp_loss_weight});
  if (!rc.model_path.empty()) model::load_hf_weights(m, rc.model_path);
  else m.init_random(rc.train.seed);
  AdamW opt(m, {(float)rc.optim.schedule.lr, rc.optim.beta1, rc.optim.beta2, rc.optim.eps, rc.optim.weight_decay,
                rc.optim.clip_grad_norm});
  TrainState state;
  std::string resume_dir;
  if (rc.checkpoint.resume == "auto") {
    if (auto l = latest_checkpoint(run_dir)) resume_dir = *l;
  } else if (rc.checkpoint.resume != "none") {
    resume_dir = rc.checkpoint.resume;
  }
  if (!resume_dir.empty()) state = load_checkpoint(resume_dir, m, opt);

  MetricsLog log(run_dir, rc.log.progress, rc.log.every, !resume_dir.empty());
  {
    std::ofstream(run_dir + "/config.resolved.json") << rc.raw.dump(2) << "\n";
  }
  log.message(detail::cat("trex train: ", rc.data.mode, ", ", train_docs.size(), " documents -> ", seqs.size(),
                          " sequences of ", rc.data.seq_len, " (", st.skipped_malformed, " malformed, ",
                          st.skipped_no_target, " without targets, ", st.truncated, " truncated, ", st.dropped_too_long,
                          " dropped), eval ", eval_seqs.size(), " sequences; ", m.cfg.num_params(), " params, ",
                          threads, " threads", resume_dir.empty() ? "" : ", resumed from " + resume_dir));
  for (const std::string& e : st.first_errors) log.message("  skipped: " + e);

  const double peak = kern::measure_peak(0.1).best_gflops();
  const double fpt = m.cfg.train_flops_per_token(rc.data.seq_len);  // with the MTP blocks it trains
  const int64_t nseq = seqs.size(), B = rc.train.batch_size;
  int64_t cached_epoch = -1;
  std::vector<int64_t> order;
  // Debug hook (tests of the NaN guard): TREX_INJECT_NAN_STEP=k puts a NaN into step k's gradients.
  const char* inj = std::getenv("TREX_INJECT_NAN_STEP");
  const int64_t inject_nan_step = inj ? std::atoll(inj) : 0;
  int64_t bad_in_a_row = 0;
  for (int64_t step = state.step; step < rc.train.steps; ++step) {
    std::vector<BatchBuffer> bufs;
    std::vector<model::Batch> micro;
    for (int64_t a = 0; a < rc.train.grad_accum; ++a) {
      std::vector<int64_t> which;
      for (int64_t i = 0; i < B; ++i, ++state.data_position) {
        const int64_t epoch = state.data_position / nseq;
        if (epoch != cached_epoch) order = epoch_order(nseq, rc.train.seed, epoch), cached_epoch = epoch;
        which.push_back(order[state.data_position % nseq]);
      }
      bufs.push_back(make_batch(seqs, which));
    }
    for (auto& b : bufs) micro.push_back(b.batch(B, rc.data.seq_len));
    const double lr = rc.optim.schedule.at(step);
    const bool inject = inject_nan_step > 0 && step + 1 == inject_nan_step;
    StepStats s = trainer_step(m, opt, micro, (float)lr, rc.train.bias_update_gamma, nullptr, inject);
    if (s.skipped) {
      ++res.skipped_steps;
      ++bad_in_a_row;
      TREX_LOG_WARN("step ", step + 1, ": loss ", s.loss, ", gradient norm ", s.grad_norm,
                    " is not finite; step skipped (weights unchanged), ", bad_in_a_row, " in a row");
      TREX_USER_CHECK(bad_in_a_row < rc.train.max_skipped_steps,
                      "lower the learning rate or check the data; the last checkpoint in the run directory holds the "
                      "last good weights (--resume auto)",
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
    if (rc.train.eval_every > 0 && !eval_seqs.empty() &&
        (state.step % rc.train.eval_every == 0 || state.step == rc.train.steps)) {
      mt.eval_loss = eval_loss(m, eval_seqs, B, rc.train.eval_batches);
      res.last_eval_loss = mt.eval_loss;
    }
    log.step(mt);
    if (res.steps == 0) res.first_loss = s.loss;
    res.last_loss = s.loss;
    ++res.steps;
    if ((rc.checkpoint.every > 0 && state.step % rc.checkpoint.every == 0) || state.step == rc.train.steps)
      res.last_checkpoint = save_checkpoint(run_dir, m, opt, state, (int)rc.checkpoint.keep);
  }
  return res;
}

}  // namespace trex::train
