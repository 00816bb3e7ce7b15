// trex bench kernels: every hot kernel of one training step of a config's model, timed alone at
// the shapes the step runs it, with its share of this machine's roofline (cli/cmd_bench_kernels.cpp).
#pragma once
#include <CLI/CLI.hpp>

namespace trex::cli {

// Registers `kernels` under the `bench` subcommand (cli/cmd_bench.cpp's add_bench).
void add_bench_kernels(CLI::App& bench);

}  // namespace trex::cli
