// The planner: one layout evaluated (memory, step time, MFU, cost), or every valid layout of a
// cluster enumerated and ranked by tokens/s and by tokens per dollar.
#pragma once
#include <string>
#include <vector>
#include "plan/arch.h"
#include "plan/cost.h"
#include "plan/layout.h"
#include "plan/limits.h"
#include "plan/memory.h"
#include "plan/routing.h"
#include "plan/spec.h"
#include "plan/timing.h"

namespace trex::plan {

struct Plan {
  std::string model, cluster;
  int64_t devices = 0;
  double total_params = 0, active_params = 0;
  Layout layout;
  MemoryReport memory;
  double activations_by_recompute[3] = {0, 0, 0};  // largest rank's activation bytes: none, selective, full
  StepTime time;
  std::vector<Limit> limits;  // what bounds each phase of the step, largest exposed first
  Cost cost;
  std::vector<std::string> notes;  // caveats: uncalibrated CPU figures, groups across nodes, no fit
};

// Validates the layout (UserError naming what fails) and evaluates it. routing (optional, a
// measured expert-load distribution, plan/routing.h) replaces the layout's expert_load with the
// busiest ep rank's share under that routing.
Plan evaluate(const ArchModel& a, const ClusterSpec& s, int64_t devices, Layout layout, double run_tokens = 0,
              const Routing* routing = nullptr);

struct SearchOptions {
  int top = 10;
  bool vary_devices = false;  // also try devices/2, devices/4, ... down to min_devices
  int64_t min_devices = 1;
  std::vector<int64_t> mbs = {1, 2, 4};
  int64_t max_pp = 64;
  // Layout keys held at the base layout's value instead of searched: any of dp, tp, pp, ep,
  // recompute, zero, mbs (e.g. the keys the user gave in --layout).
  std::vector<std::string> fixed;
  // Measured routing (plan/routing.h): each layout's expert_load is the busiest of its ep ranks'
  // share under it (nullptr: the base layout's expert_load for every ep).
  const Routing* routing = nullptr;
};

struct SearchResult {
  std::vector<Plan> by_speed;  // fitting layouts, highest tokens/s first
  std::vector<Plan> by_cost;   // fitting layouts, most tokens per dollar (or per kWh) first
  int64_t tried = 0, valid = 0, fit = 0;
};

// Enumerates tp (powers of two within a node, dividing the heads), pp (<= layers), ep (dividing
// the experts and dp*tp), recompute, ZeRO 1-3 and micro-batch size, except the `fixed` keys;
// everything else (global batch, sequence, schedule, precision, overlap, etp) comes from `base`.
SearchResult search(const ArchModel& a, const ClusterSpec& s, int64_t devices, const Layout& base, double run_tokens,
                    const SearchOptions& o);

}  // namespace trex::plan
