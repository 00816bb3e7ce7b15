// Field readers for model config JSON (shared by the V3 and V4 parsers): typed access with
// defaults, required fields and range checks; every failure names the file and the field.
#pragma once
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <nlohmann/json.hpp>
#include "core/error.h"

namespace trex::model::cfgread {

using nlohmann::json;

inline const char* kFixHint = "fix the value in the model config (Hugging Face config.json keys)";

// A value for a message: scalars as JSON, arrays and objects by kind only (dumping a value
// nested thousands deep would recurse that deep; fuzz/regressions/config_deep_nesting.json).
inline std::string shown(const json& v) {
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return v.dump();
}

// An integral double within int64 range (a cast of anything else is undefined behaviour).
inline bool is_int64_value(double d) { return std::fabs(d) < 9.2e18 && d == std::trunc(d); }

struct Reader {
  const json& j;
  const std::string& where;
  // Not null: every key the parser looks at (present or not) is added, so that the keys of a
  // config it never looks at can be listed (model::unused_config_keys).
  std::set<std::string>* used = nullptr;

  bool has(const char* k) const {
    if (used) used->insert(k);
    return j.contains(k) && !j[k].is_null();
  }

  int64_t i64(const char* k, int64_t def, bool required = false, int64_t min = 0) const {
    if (!has(k)) {
      TREX_USER_CHECK(!required, kFixHint, where, ": required field '", k, "' is missing");
      return def;
    }
    const json& v = j[k];
    TREX_USER_CHECK(v.is_number_integer() || (v.is_number_float() && is_int64_value(v.get<double>())),
                    kFixHint, where, ": field '", k, "' must be an integer, got ", shown(v));
    int64_t x = v.is_number_integer() ? v.get<int64_t>() : (int64_t)v.get<double>();
    TREX_USER_CHECK(x >= min, kFixHint, where, ": field '", k, "' must be >= ", min, ", got ", x);
    return x;
  }
  double f64(const char* k, double def, bool required = false) const {
    if (!has(k)) {
      TREX_USER_CHECK(!required, kFixHint, where, ": required field '", k, "' is missing");
      return def;
    }
    TREX_USER_CHECK(j[k].is_number(), kFixHint, where, ": field '", k, "' must be a number, got ", shown(j[k]));
    return j[k].get<double>();
  }
  bool boolean(const char* k, bool def) const {
    if (!has(k)) return def;
    TREX_USER_CHECK(j[k].is_boolean(), kFixHint, where, ": field '", k, "' must be true or false, got ", shown(j[k]));
    return j[k].get<bool>();
  }
  std::string str(const char* k, const std::string& def) const {
    if (!has(k)) return def;
    TREX_USER_CHECK(j[k].is_string(), kFixHint, where, ": field '", k, "' must be a string, got ", shown(j[k]));
    return j[k].get<std::string>();
  }
};

}  // namespace trex::model::cfgread
