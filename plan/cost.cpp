#include "plan/cost.h"

#include "core/error.h"

namespace trex::plan {

Cost plan_cost(const ClusterSpec& s, int64_t devices, double tokens_per_s, double run_tokens) {
  TREX_USER_CHECK(run_tokens >= 0, "give --tokens >= 0", "run tokens must be >= 0, got ", run_tokens);
  Cost c;
  c.priced = s.price_per_device_hour > 0;
  c.powered = s.power_w > 0;
  c.dollars_per_hour = (double)devices * s.price_per_device_hour;
  c.kw = (double)devices * s.power_w * s.pue / 1000.0;
  if (c.priced && tokens_per_s > 0) c.tokens_per_dollar = tokens_per_s * 3600.0 / c.dollars_per_hour;
  if (c.powered && tokens_per_s > 0) c.tokens_per_kwh = tokens_per_s * 3600.0 / c.kw;
  c.run_tokens = run_tokens;
  if (run_tokens > 0 && tokens_per_s > 0) {
    c.run_hours = run_tokens / tokens_per_s / 3600.0;
    c.run_dollars = c.run_hours * c.dollars_per_hour;
    c.run_kwh = c.run_hours * c.kw;
  }
  return c;
}

}  // namespace trex::plan
