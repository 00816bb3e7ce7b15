// Fuzz target: a trex run config (TOML), read as `trex train --config` does: TOML -> JSON
// (io/toml_json.cpp, toml++) -> trex::train::parse_run_config (train/run_config.cpp, and the
// [model] table through model::parse_config). Comment lines of the form `#set section.key=value`
// in the input are also passed as --set overrides, so the override parser is fuzzed too.
// A [model].path is redirected to a committed checkpoint directory (the fuzzer must not make the
// harness open arbitrary files such as /dev/stdin); the branch that reads it still runs.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "io/toml_json.h"
#include "train/run_config.h"

using namespace trex;
using namespace trex::train;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = fuzz::as_text(data, size);
  std::vector<std::string> overrides;
  for (size_t b = 0; b < text.size();) {
    size_t e = text.find('\n', b);
    if (e == std::string_view::npos) e = text.size();
    std::string_view line = text.substr(b, e - b);
    if (line.substr(0, 5) == "#set ") {
      std::string ov(line.substr(5));
      // An override of model.path would escape the redirection below: skip it.
      size_t dot = ov.find('.'), eq = ov.find('=');
      const bool model_path = dot != std::string::npos && eq != std::string::npos && dot < eq &&
                              ov.substr(0, dot) == "model" && ov.substr(dot + 1, eq - dot - 1) == "path";
      if (!model_path) overrides.push_back(std::move(ov));
    }
    b = e + 1;
  }
  const std::string path = fuzz::write_scratch("run.toml", text);
  fuzz::accepts([&] {
    nlohmann::json j = io::load_toml_as_json(path);
    FUZZ_ASSERT(j.is_object(), "a TOML document is a table");
    if (j.contains("model") && j["model"].is_object() && j["model"].contains("path") &&
        j["model"]["path"].is_string())
      j["model"]["path"] = fuzz::repo_file("tests/reference/data/v3_tied_greedy/model");
    RunConfig r = parse_run_config(j, path, overrides);
    FUZZ_ASSERT(r.data.seq_len >= 2 && r.train.batch_size >= 1 && r.train.steps >= 1);
    FUZZ_ASSERT(r.optim.schedule.total_steps == r.train.steps);
    FUZZ_ASSERT(r.model.vocab_size > 0);
  });
  return 0;
}
