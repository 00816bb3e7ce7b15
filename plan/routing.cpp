#include "plan/routing.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include "core/error.h"

namespace trex::plan {

namespace {

using nlohmann::json;

constexpr const char* kHint =
    "give a trex metrics.jsonl written with [log] expert_loads = true, or a JSON file "
    "{\"expert_loads\": [[tokens of each expert in a layer], ...]}";

// One layer's per-expert loads: a list of non-negative numbers, all layers the same length.
void add_layer(Routing& r, const json& row, const std::string& where) {
  TREX_USER_CHECK(row.is_array() && !row.empty(), kHint, r.source, where, ": expert_loads must hold lists of numbers");
  std::vector<double> v;
  for (const json& x : row) {
    TREX_USER_CHECK(x.is_number() && x.get<double>() >= 0, kHint, r.source, where,
                    ": an expert load is not a number >= 0: ", x.dump());
    v.push_back(x.get<double>());
  }
  if (r.experts == 0) r.experts = (int64_t)v.size();
  TREX_USER_CHECK((int64_t)v.size() == r.experts, kHint, r.source, where, ": a layer lists ", v.size(),
                  " experts, an earlier one ", r.experts);
  double total = 0;
  for (double x : v) total += x;
  if (total > 0) r.loads.push_back(std::move(v));  // all zero: a layer of another pipeline stage
}

void add_layers(Routing& r, const json& layers, const std::string& where) {
  TREX_USER_CHECK(layers.is_array(), kHint, r.source, where, ": expert_loads must be a list of per-layer lists");
  for (const json& row : layers) add_layer(r, row, where);
}

// A record of metrics.jsonl or an element of a JSON list.
void add_record(Routing& r, const json& j, const std::string& where, double& scalar_sum, int64_t& scalar_n) {
  if (!j.is_object()) return;
  if (j.contains("skipped") && j["skipped"].is_boolean() && j["skipped"].get<bool>()) return;
  ++r.steps;
  if (j.contains("expert_loads")) add_layers(r, j["expert_loads"], where);
  if (j.contains("expert_load_max_over_mean") && j["expert_load_max_over_mean"].is_array())
    for (const json& x : j["expert_load_max_over_mean"])
      if (x.is_number() && x.get<double>() > 0) scalar_sum += x.get<double>(), ++scalar_n;
}

}  // namespace

Routing read_routing(const std::string& path) {
  Routing r;
  r.source = path;
  std::ifstream in(path, std::ios::binary);
  TREX_USER_CHECK(in.good(), kHint, path, ": cannot open");
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  double scalar_sum = 0;
  int64_t scalar_n = 0;
  const json whole = json::parse(all, nullptr, false);
  if (!whole.is_discarded()) {  // one JSON document
    if (whole.is_array() && !whole.empty() && whole[0].is_array()) add_layers(r, whole, "");
    else if (whole.is_array())
      for (size_t i = 0; i < whole.size(); ++i) add_record(r, whole[i], detail::cat("[", i, "]"), scalar_sum, scalar_n);
    else add_record(r, whole, "", scalar_sum, scalar_n);
  } else {  // JSON lines (metrics.jsonl)
    int64_t ln = 0;
    for (size_t pos = 0; pos < all.size();) {
      size_t end = all.find('\n', pos);
      const bool last = end == std::string::npos;
      if (last) end = all.size();
      const std::string line = all.substr(pos, end - pos);
      pos = end + 1;
      ++ln;
      if (line.empty()) continue;
      const json j = json::parse(line, nullptr, false);
      if (j.is_discarded() && last) break;  // a last line cut by a kill
      TREX_USER_CHECK(j.is_object(), kHint, path, ":", ln, ": not a JSON object");
      add_record(r, j, detail::cat(":", ln), scalar_sum, scalar_n);
    }
  }
  if (scalar_n > 0) r.scalar = std::max(1.0, scalar_sum / (double)scalar_n);
  TREX_USER_CHECK(!r.loads.empty() || r.scalar > 0, kHint, path,
                  ": no expert_loads and no expert_load_max_over_mean found");
  return r;
}

double busiest_rank_share(const std::vector<double>& load, int64_t ep) {
  const int64_t E = (int64_t)load.size();
  double total = 0;
  for (double x : load) total += x;
  if (ep <= 1 || E == 0 || total <= 0) return 1.0;
  // Rank r holds the expert-index interval [r E / ep, (r+1) E / ep), in units of one expert.
  double mx = 0;
  for (int64_t r = 0; r < ep; ++r) {
    const double lo = (double)r * E / ep, hi = (double)(r + 1) * E / ep;
    double rows = 0;
    for (int64_t e = (int64_t)std::floor(lo); e < E && (double)e < hi; ++e) {
      const double part = std::min(hi, (double)e + 1) - std::max(lo, (double)e);
      if (part > 0) rows += part * load[e];
    }
    mx = std::max(mx, rows);
  }
  return std::max(1.0, mx / (total / (double)ep));
}

double routing_expert_load(const Routing& r, int64_t ep) {
  if (r.loads.empty()) return std::max(1.0, r.scalar);
  if (ep <= 1) return 1.0;
  double s = 0;
  for (const auto& row : r.loads) s += busiest_rank_share(row, ep);
  return std::max(1.0, s / (double)r.loads.size());
}

std::string routing_summary(const Routing& r, int64_t ep, int64_t model_experts) {
  using detail::cat;
  char f[32];
  std::snprintf(f, sizeof f, "%.3f", routing_expert_load(r, ep));
  if (r.loads.empty())
    return cat("routing from ", r.source, ": ", r.steps, " steps without per-expert loads; the busiest expert's load "
               "over the mean (", f, ") stands in for the busiest rank's (an upper bound; write [log] expert_loads = "
               "true for the per-rank share)");
  std::string s = cat("routing from ", r.source, ": ", r.loads.size(), " layer-steps of ", r.experts,
                      " experts; busiest of ep=", ep, " ranks carries ", f, " x the mean rank's expert rows and a2a bytes");
  if (model_experts > 0 && model_experts != r.experts)
    s += cat(" (measured with ", r.experts, " experts, spread over the model's ", model_experts, " by expert index)");
  return s;
}

}  // namespace trex::plan
