// What a run costs, which MFU alone never tells: tokens per dollar and per kWh at the planned
// throughput, and the wall time, dollars and energy of a run of a given number of tokens.
//   dollars/hour = devices x price_per_device_hour
//   kW           = devices x power_w x pue / 1000
//   tokens/$     = tokens/s x 3600 / dollars/hour;  tokens/kWh = tokens/s x 3600 / kW
//   run: hours = tokens / tokens/s / 3600; dollars = hours x dollars/hour; kWh = hours x kW
#pragma once
#include <cstdint>
#include "plan/spec.h"

namespace trex::plan {

struct Cost {
  bool priced = false, powered = false;  // the spec carries a price / a power figure
  double dollars_per_hour = 0, kw = 0;
  double tokens_per_dollar = 0, tokens_per_kwh = 0;
  double run_tokens = 0, run_hours = 0, run_dollars = 0, run_kwh = 0;  // run_tokens = 0: no run given
};

Cost plan_cost(const ClusterSpec& s, int64_t devices, double tokens_per_s, double run_tokens);

}  // namespace trex::plan
