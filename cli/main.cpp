// trex: post-training engine for DeepSeek-family MoE models.
// The training step is at train/trainer.cpp: trainer_step().
#include <cstdio>
#include <CLI/CLI.hpp>
#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"trex: full-parameter post-training of DeepSeek-family MoE models"};
  app.require_subcommand(1);
  trex::cli::add_grad(app);
  trex::cli::add_bench(app);
  trex::cli::add_demo(app);
  trex::cli::add_plan(app);
  trex::cli::add_or(app);
  trex::cli::add_tokenizer(app);
  trex::cli::add_train(app);
  trex::cli::add_generate(app);
  trex::cli::add_plot(app);
  trex::cli::add_convert(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const trex::UserError& e) {
    std::fprintf(stderr, "error: %s\nhint: %s\n", e.what(), e.hint.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "internal error: %s\n", e.what());
    return 3;
  }
  return 0;
}
