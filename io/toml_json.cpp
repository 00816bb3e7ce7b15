#include "io/toml_json.h"

#include <toml++/toml.h>
#include "core/error.h"

namespace trex::io {

namespace {

nlohmann::json to_json(const toml::node& n) {
  if (auto t = n.as_table()) {
    nlohmann::json j = nlohmann::json::object();
    for (auto&& [k, v] : *t) j[std::string(k.str())] = to_json(v);
    return j;
  }
  if (auto a = n.as_array()) {
    nlohmann::json j = nlohmann::json::array();
    for (auto&& v : *a) j.push_back(to_json(v));
    return j;
  }
  if (auto v = n.as_string()) return v->get();
  if (auto v = n.as_integer()) return v->get();
  if (auto v = n.as_floating_point()) return v->get();
  if (auto v = n.as_boolean()) return v->get();
  return nullptr;  // dates and times are not used by trex configs
}

}  // namespace

nlohmann::json load_toml_as_json(const std::string& path) {
  try {
    toml::table t = toml::parse_file(path);
    return to_json(t);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    TREX_USER_FAIL("fix the TOML syntax", path, ":", b.line, ":", b.column, ": ", e.description());
  }
}

std::optional<nlohmann::json> parse_toml_value(const std::string& text) {
  try {
    toml::table t = toml::parse("v = " + text);
    if (const toml::node* n = t.get("v"); n && t.size() == 1) return to_json(*n);  // not "1\nw = 2"
  } catch (const toml::parse_error&) {
  }
  return std::nullopt;
}

}  // namespace trex::io
