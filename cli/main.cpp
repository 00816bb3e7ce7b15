// trex: post-training engine for DeepSeek-family MoE models.
// The training step is at train/trainer.cpp: trainer_step().
// Exit codes (docs/CLI.md): 0 success; 2 a user error (bad input, config, path: "error: ..." and
// "hint: ..." on stderr); 3 an internal error (a bug); CLI11's codes (100 and above) for a bad
// command line.
#include <cstdio>
#include <filesystem>
#include <string>
#include <CLI/CLI.hpp>
#include "cli/commands.h"
#include "core/error.h"

namespace {

// A filesystem error as a user error: "PATH [and PATH2]: OPERATION: REASON". libstdc++ words
// what() as "filesystem error: OPERATION: REASON [PATH] [PATH2]".
std::string describe(const std::filesystem::filesystem_error& e) {
  std::string op = e.what();
  const std::string prefix = "filesystem error: ";
  if (op.rfind(prefix, 0) == 0) op = op.substr(prefix.size());
  const size_t colon = op.find(": ");
  if (colon != std::string::npos) op = op.substr(0, colon);
  std::string paths;
  for (const auto* p : {&e.path1(), &e.path2()})
    if (!p->empty()) paths += (paths.empty() ? "'" : " and '") + p->string() + "'";
  if (paths.empty()) paths = "a path";
  return paths + ": " + op + ": " + e.code().message();
}

}  // namespace

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
  trex::cli::add_config(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const trex::UserError& e) {
    std::fprintf(stderr, "error: %s\nhint: %s\n", e.what(), e.hint.c_str());
    return 2;
  } catch (const std::filesystem::filesystem_error& e) {
    std::fprintf(stderr, "error: %s\nhint: check that the path exists, that its directory is one you may write to "
                 "on a regular file system (not /proc or /sys), and that there is free space\n",
                 describe(e).c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "internal error: %s\n", e.what());
    return 3;
  }
  return 0;
}
