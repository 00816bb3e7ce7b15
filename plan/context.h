// The longest context a model trains at on N devices of a spec (`trex plan --longest-context`).
// For every context-parallel size cp that the devices allow next to the layout's tp and pp (ep,
// recompute, precision and the rest as the layout gives them; dp = devices / (tp pp cp)), the
// largest seq that fits every device's memory (plan/memory.h), found by doubling then bisection on
// multiples of lcm(step, 2 cp) (memory grows with seq), with the step time, tokens/s and MFU
// there. A cp whose layout is invalid for the model (ep not dividing dp x cp x tp, say) is left
// out; one where even the smallest seq does not fit is listed with seq 0.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>
#include "plan/planner.h"

namespace trex::plan {

struct ContextRow {
  int64_t cp = 1;
  int64_t seq = 0;  // the longest that fits (0: none)
  Plan plan;        // at that seq (when seq > 0)
};
struct ContextResult {
  std::string model, cluster;
  int64_t devices = 0, step = 0, max_seq = 0;
  std::vector<ContextRow> rows;  // by cp, ascending
  int best = -1;                 // the row with the longest seq (the smallest cp among equals); -1: none fits
};

ContextResult longest_context(const ArchModel& a, const ClusterSpec& s, int64_t devices, const Layout& base,
                              int64_t step = 1024, int64_t max_seq = int64_t{1} << 24);
std::string format_context(const ContextResult& r);
nlohmann::json context_to_json(const ContextResult& r);

}  // namespace trex::plan
