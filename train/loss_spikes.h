// Loss-spike detection against a running window of recent losses (issue 9). A step's loss is a
// spike when, with at least min_count losses in the window,
//   loss > mean + z * std   and   loss > mean * (1 + rel_floor)
// (the relative floor keeps a nearly constant loss, whose std is ~0, from flagging noise). Every
// finite loss then enters the window, spikes included, so a lasting shift stops being flagged
// once the window has absorbed it. Non-finite losses (skipped steps) are not observed.
// The window is saved in checkpoints (state / restore) so a resumed run flags the same steps.
#pragma once
#include <cstdint>
#include <deque>
#include <nlohmann/json.hpp>

namespace trex::train {

struct SpikeVerdict {
  bool spike = false;
  double z = 0;     // (loss - mean) / std of the window before this loss; 0 until min_count
  double mean = 0;  // window mean before this loss
};

class SpikeDetector {
 public:
  // window: losses kept (>= 2); z <= 0 turns detection off (observe still fills the window).
  SpikeDetector(int64_t window, double z, int64_t min_count = 20, double rel_floor = 0.01);
  SpikeVerdict observe(double loss);
  nlohmann::json state() const;            // the window, oldest first
  void restore(const nlohmann::json& s);   // from state(); ignores a missing / malformed value
  int64_t size() const { return (int64_t)w_.size(); }

 private:
  std::deque<double> w_;
  int64_t window_, min_count_;
  double z_, rel_floor_;
};

}  // namespace trex::train
