// TOML -> JSON conversion (toml++), so that a [model] table in a trex run config is read by the
// same code as a Hugging Face config.json.
#pragma once
#include <string>
#include <nlohmann/json.hpp>

namespace trex::io {

// Parses a TOML file into a JSON object; throws UserError naming the file and line on a syntax error.
nlohmann::json load_toml_as_json(const std::string& path);

}  // namespace trex::io
