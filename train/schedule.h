// Learning-rate schedules: constant, linear decay, cosine, and WSD (warmup-stable-decay), each
// after a linear warmup from 0. step is 0-based (the step about to be taken).
#pragma once
#include <cstdint>
#include <string>

namespace trex::train {

enum class Schedule { Constant, Linear, Cosine, Wsd };

struct LrSchedule {
  Schedule kind = Schedule::Cosine;
  double lr = 1e-4, min_lr = 0;
  int64_t warmup_steps = 0, total_steps = 1;
  double decay_fraction = 0.1;  // WSD: share of total steps spent decaying at the end

  double at(int64_t step) const;
};

Schedule parse_schedule(const std::string& s, const std::string& where);

}  // namespace trex::train
