// TOML -> JSON conversion (toml++), so that a [model] table in a trex run config is read by the
// same code as a Hugging Face config.json.
#pragma once
#include <optional>
#include <string>
#include <nlohmann/json.hpp>

namespace trex::io {

// Parses a TOML file into a JSON object; throws UserError naming the file and line on a syntax error.
nlohmann::json load_toml_as_json(const std::string& path);

// One TOML value written as it would follow "key = " ({a = 1}, [1, 2], 'text', 3.5, true) as
// JSON; nullopt when it is not one (a bare word).
std::optional<nlohmann::json> parse_toml_value(const std::string& text);

}  // namespace trex::io
