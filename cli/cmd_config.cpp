// trex config reference
//   prints the run config reference (docs/CONFIG.md): every section and key of a `trex train`
//   config with its type, default and meaning, from the table the parser reads.
#include <cstdio>
#include "cli/commands.h"
#include "train/run_config.h"

namespace trex::cli {

void add_config(CLI::App& app) {
  auto* cfg = app.add_subcommand("config", "run config (TOML) reference");
  cfg->require_subcommand(1);
  auto* ref = cfg->add_subcommand("reference", "print docs/CONFIG.md: every key of every section (type, default, "
                                               "meaning)");
  ref->callback([] {
    const std::string md = train::run_config_reference();
    std::fwrite(md.data(), 1, md.size(), stdout);
  });
}

}  // namespace trex::cli
