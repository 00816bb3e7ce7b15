// Subcommands of the `trex` binary; each file registers one group on the CLI11 app.
#pragma once
#include <CLI/CLI.hpp>

namespace trex::cli {
void add_grad(CLI::App& app);
void add_bench(CLI::App& app);
void add_demo(CLI::App& app);
}  // namespace trex::cli
