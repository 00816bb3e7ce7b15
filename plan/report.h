// Text and JSON renderings of plans and searches (what `trex plan` prints).
#pragma once
#include <string>
#include <nlohmann/json.hpp>
#include "plan/planner.h"

namespace trex::plan {

std::string format_plan(const Plan& p);
nlohmann::json plan_to_json(const Plan& p);
std::string format_search(const SearchResult& r, const ClusterSpec& s);
nlohmann::json search_to_json(const SearchResult& r);

// trex plan --routing: the same layout under forced-balance routing (expert_load = 1) and under
// the measured routing, side by side (step time, expert GEMM phase, EP all-to-all, throughput).
std::string format_routing_compare(const Plan& balanced, const Plan& measured);
nlohmann::json routing_compare_json(const Plan& balanced, const Plan& measured);

}  // namespace trex::plan
