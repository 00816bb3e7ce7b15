// trex train --config FILE [--set section.key=value ...] [--resume auto|none|DIR]
// CPT or SFT by data.mode; see train/loop.h. The step is train/trainer.cpp: trainer_step().
// Data parallel: mpirun -np N trex train --config FILE [--set parallel.dp=N] (every rank runs this
// command; MPI is initialized when a launcher started the process; docs/PARALLEL.md).
// Exit codes: 0 done, 2 user error (bad config or data: the message says what to fix), 3 internal
// error, 75 stopped by SIGTERM / SIGINT after writing a checkpoint (rerun with --resume auto;
// train.exit_signal_save, train/stop_signal.h), 128 + N killed by a second signal N.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include "cli/commands.h"
#include "cli/tokenizer_fns.h"
#include "core/log.h"
#include "parallel/comm_mpi.h"
#include "train/device.h"
#include "train/loop.h"
#include "train/stop_signal.h"

namespace trex::cli {

void add_train(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "continued pretraining or SFT from a TOML run config");
  struct Opts {
    std::string config, resume, trace, device;
    std::vector<std::string> sets;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--config", o->config,
                  "TOML run config ([model] [data] [train] [optim] [parallel] [checkpoint] [log])")
      ->required();
  cmd->add_option("--set", o->sets, "override: section.key=value (repeatable)");
  cmd->add_option("--device", o->device, "cpu | cuda | cuda:N (overrides train.device)");
  cmd->add_option("--resume", o->resume, "auto | none | checkpoint directory (overrides checkpoint.resume)");
  cmd->add_option("--trace", o->trace, "Chrome trace (Perfetto) of the first log.trace_steps steps: compute and "
                                      "communication tracks per rank (overrides log.trace)");
  cmd->callback([o] {
    std::vector<std::string> sets = o->sets;
    if (!o->resume.empty()) sets.push_back("checkpoint.resume=" + o->resume);
    if (!o->trace.empty()) sets.push_back("log.trace=" + o->trace);
    if (!o->device.empty()) sets.push_back("train.device=" + o->device);
    train::RunConfig rc = train::load_run_config(o->config, sets);
    TREX_USER_CHECK(!rc.data.tokenizer.empty(), "set data.tokenizer (or model.path with a tokenizer.json)",
                    o->config, ": no tokenizer given");
    io::Tokenizer tok = io::Tokenizer::load(rc.data.tokenizer);
    TREX_USER_CHECK(tok.vocab_size() <= rc.model.vocab_size, "use the model's own tokenizer", rc.data.tokenizer,
                    ": tokenizer has ", tok.vocab_size(), " ids but the model's vocab_size is ", rc.model.vocab_size);
    if (rc.data.mode == "sft")
      for (const std::string& t : missing_template_tokens(tok, train::ChatTemplate::by_name(rc.data.chat_template)))
        TREX_LOG_WARN(rc.data.tokenizer, ": chat template '", rc.data.chat_template, "' marker ", t,
                      " is not a token of this tokenizer; it is encoded as plain text (docs/DATA.md)");
    // MPI when a launcher started us (declared before the communicator: destroyed after it).
    std::unique_ptr<parallel::MpiContext> mpi;
    std::unique_ptr<parallel::Communicator> world;
    if (parallel::MpiContext::launched()) {
      mpi = std::make_unique<parallel::MpiContext>(nullptr, nullptr, parallel::ThreadLevel::Serialized);
      world = mpi->world();
    }
    const int rank = world ? world->rank() : 0;
    // Layout errors: raised by every rank alike, before any collective (a normal exit).
    train::resolve_parallel(rc, world ? world->size() : 1);
    train::TrainResult r;
    try {
      r = train::run_training(rc, tokenizer_fns(tok, rc.data.eos_token, rc.data.tokenizer), world.get(),
                              world ? parallel::MpiContext::local_size(1) : 1);
    } catch (const std::exception& e) {
      // Under MPI a rank that fails alone would leave the others waiting in a collective: report
      // and end the whole job.
      if (world && world->size() > 1) {
        const auto* ue = dynamic_cast<const UserError*>(&e);
        std::fprintf(stderr, "error on rank %d of %d: %s%s%s\n", rank, world->size(), e.what(),
                     ue ? "\nhint: " : "", ue ? ue->hint.c_str() : "");
        std::fflush(stderr);
        parallel::MpiContext::abort(ue ? 2 : 3);
      }
      throw;
    }
    if (rank == 0)
      std::printf("{\"steps\": %lld, \"first_loss\": %.6f, \"last_loss\": %.6f, \"last_eval_loss\": %.6f, "
                  "\"checkpoint\": \"%s\", \"dp\": %d, \"step_ms\": %.3f, \"comm_ms\": %.3f}\n",
                  (long long)r.steps, r.first_loss, r.last_loss, r.last_eval_loss, r.last_checkpoint.c_str(), r.dp,
                  r.steps ? r.step_ms / r.steps : 0.0, r.steps ? r.comm_ms / r.steps : 0.0);
    if (r.stop_signal) {  // stopped by SIGTERM / SIGINT after writing a checkpoint: a distinct exit code
      std::fflush(stdout);
      world.reset();
      mpi.reset();  // MPI_Finalize on every rank before the exit
      std::exit(train::kExitStopped);
    }
  });
}

}  // namespace trex::cli
