// Deterministic random numbers (SplitMix64 + Box-Muller) for initialization and tests.
#pragma once
#include <cmath>
#include <cstdint>

namespace trex {

class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed ? seed : 0x9E3779B97F4A7C15ull) {}
  // The whole generator state (for checkpoints): Rng::from_state(r.state()) continues r exactly.
  uint64_t state() const { return s_; }
  static Rng from_state(uint64_t s) {
    Rng r(1);
    r.s_ = s;
    return r;
  }
  uint64_t next_u64() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1).
  double uniform() { return (next_u64() >> 11) * (1.0 / 9007199254740992.0); }
  float uniform(float lo, float hi) { return lo + (hi - lo) * static_cast<float>(uniform()); }
  double normal() {
    double u1 = uniform(), u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t s_;
};

}  // namespace trex
