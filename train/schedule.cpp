#include "train/schedule.h"

#include <algorithm>
#include <cmath>
#include "core/error.h"

namespace trex::train {

Schedule parse_schedule(const std::string& s, const std::string& where) {
  if (s == "constant") return Schedule::Constant;
  if (s == "linear") return Schedule::Linear;
  if (s == "cosine") return Schedule::Cosine;
  if (s == "wsd") return Schedule::Wsd;
  TREX_USER_FAIL("allowed: constant, linear, cosine, wsd", where, ": schedule '", s, "' is not known");
}

double LrSchedule::at(int64_t step) const {
  if (warmup_steps > 0 && step < warmup_steps) return lr * (double)(step + 1) / (double)warmup_steps;
  const int64_t span = std::max<int64_t>(1, total_steps - warmup_steps);
  const double t = std::clamp((double)(step - warmup_steps) / (double)span, 0.0, 1.0);
  switch (kind) {
    case Schedule::Constant: return lr;
    case Schedule::Linear: return min_lr + (lr - min_lr) * (1.0 - t);
    case Schedule::Cosine: return min_lr + (lr - min_lr) * 0.5 * (1.0 + std::cos(M_PI * t));
    case Schedule::Wsd: {
      const double d = std::clamp(decay_fraction, 0.0, 1.0);
      if (t <= 1.0 - d || d == 0.0) return lr;
      return min_lr + (lr - min_lr) * (1.0 - (t - (1.0 - d)) / d);
    }
  }
  return lr;
}

}  // namespace trex::train
