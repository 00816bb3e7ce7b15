// What loading a run config says about it, for tests of the config's error messages (shared by
// the unit and the MPI test binaries).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "train/run_config.h"

namespace trex::testing {

// The UserError ("text | hint") that parsing run config j with `overrides` gives, or "" when it
// parses; world > 0: also resolving its parallel layout for that many ranks.
inline std::string run_config_error(const nlohmann::json& j, const std::vector<std::string>& overrides, int world = 0) {
  try {
    const train::RunConfig rc = train::parse_run_config(j, "run.toml", overrides);
    if (world > 0) train::resolve_parallel(rc, world);
  } catch (const UserError& e) {
    return std::string(e.what()) + " | " + e.hint;
  }
  return std::string();
}

}  // namespace trex::testing
