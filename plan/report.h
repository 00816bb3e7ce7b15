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

}  // namespace trex::plan
