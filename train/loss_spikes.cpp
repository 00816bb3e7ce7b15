#include "train/loss_spikes.h"

#include <algorithm>
#include <cmath>
#include "core/error.h"

namespace trex::train {

SpikeDetector::SpikeDetector(int64_t window, double z, int64_t min_count, double rel_floor)
    : window_(window), min_count_(std::min(min_count, window)), z_(z), rel_floor_(rel_floor) {
  TREX_CHECK(window >= 2, "SpikeDetector: window ", window, " < 2");
}

SpikeVerdict SpikeDetector::observe(double loss) {
  SpikeVerdict v;
  if (!std::isfinite(loss)) return v;
  if ((int64_t)w_.size() >= std::max<int64_t>(min_count_, 2)) {
    double mean = 0, var = 0;
    for (double x : w_) mean += x;
    mean /= (double)w_.size();
    for (double x : w_) var += (x - mean) * (x - mean);
    const double sd = std::sqrt(var / (double)w_.size());
    v.mean = mean;
    v.z = sd > 0 ? (loss - mean) / sd : (loss > mean ? INFINITY : 0.0);
    v.spike = z_ > 0 && v.z > z_ && loss > mean * (1 + rel_floor_);
  }
  w_.push_back(loss);
  if ((int64_t)w_.size() > window_) w_.pop_front();
  return v;
}

nlohmann::json SpikeDetector::state() const { return nlohmann::json(std::vector<double>(w_.begin(), w_.end())); }

void SpikeDetector::restore(const nlohmann::json& s) {
  w_.clear();
  if (!s.is_array()) return;
  for (const auto& x : s)
    if (x.is_number()) w_.push_back(x.get<double>());
  while ((int64_t)w_.size() > window_) w_.pop_front();
}

}  // namespace trex::train
