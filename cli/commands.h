// Subcommands of the `trex` binary; each file registers one group on the CLI11 app.
#pragma once
#include <CLI/CLI.hpp>

namespace trex::cli {
void add_grad(CLI::App& app);
void add_bench(CLI::App& app);
void add_bench_decode(CLI::App& bench);  // cli/cmd_bench_decode.cpp: trex bench decode
void add_demo(CLI::App& app);
void add_or(CLI::App& app);    // cli/cmd_or.cpp: trex or gen | solve | eval
void add_plan(CLI::App& app);  // cli/cmd_plan.cpp: trex plan
void add_train(CLI::App& app);
void add_generate(CLI::App& app);
void add_plot(CLI::App& app);
void add_convert(CLI::App& app);
void add_tokenizer(CLI::App& app);  // cli/cmd_tokenizer.cpp: trex tokenizer train
void add_config(CLI::App& app);     // cli/cmd_config.cpp: trex config reference
}  // namespace trex::cli
