// trex train --config FILE [--set section.key=value ...] [--resume auto|none|DIR]
// CPT or SFT by data.mode; see train/loop.h. The step is train/trainer.cpp: trainer_step().
#include <cstdio>
#include "cli/commands.h"
#include "cli/tokenizer_fns.h"
#include "train/loop.h"

namespace trex::cli {

void add_train(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "continued pretraining or SFT from a TOML run config");
  struct Opts {
    std::string config, resume;
    std::vector<std::string> sets;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--config", o->config, "TOML run config ([model] [data] [train] [optim] [checkpoint] [log])")
      ->required();
  cmd->add_option("--set", o->sets, "override: section.key=value (repeatable)");
  cmd->add_option("--resume", o->resume, "auto | none | checkpoint directory (overrides checkpoint.resume)");
  cmd->callback([o] {
    std::vector<std::string> sets = o->sets;
    if (!o->resume.empty()) sets.push_back("checkpoint.resume=" + o->resume);
    train::RunConfig rc = train::load_run_config(o->config, sets);
    TREX_USER_CHECK(!rc.data.tokenizer.empty(), "set data.tokenizer (or model.path with a tokenizer.json)",
                    o->config, ": no tokenizer given");
    io::Tokenizer tok = io::Tokenizer::load(rc.data.tokenizer);
    TREX_USER_CHECK(tok.vocab_size() <= rc.model.vocab_size, "use the model's own tokenizer", rc.data.tokenizer,
                    ": tokenizer has ", tok.vocab_size(), " ids but the model's vocab_size is ", rc.model.vocab_size);
    train::TrainResult r = train::run_training(rc, tokenizer_fns(tok, rc.data.eos_token, rc.data.tokenizer));
    std::printf("{\"steps\": %lld, \"first_loss\": %.6f, \"last_loss\": %.6f, \"last_eval_loss\": %.6f, "
                "\"checkpoint\": \"%s\"}\n",
                (long long)r.steps, r.first_loss, r.last_loss, r.last_eval_loss, r.last_checkpoint.c_str());
  });
}

}  // namespace trex::cli
