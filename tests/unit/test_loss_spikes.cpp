// Loss-spike detection (train/loss_spikes.h): a jump far above the running window is flagged at
// that step only; a smooth or flat loss is not; the window survives state / restore.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>
#include "core/rng.h"
#include "train/loss_spikes.h"

using namespace trex;
using train::SpikeDetector;

namespace {

// A falling loss with noise: 6 - step / 100 + N(0, 0.02)-ish.
std::vector<double> smooth(int n, uint64_t seed) {
  Rng r(seed);
  std::vector<double> v;
  for (int i = 0; i < n; ++i) v.push_back(6.0 - i / 100.0 + 0.04 * ((r.next_u64() % 1000) / 1000.0 - 0.5));
  return v;
}

}  // namespace

TEST(LossSpikes, SmoothLossHasNone) {
  SpikeDetector d(50, 4.0);
  for (double x : smooth(400, 3)) EXPECT_FALSE(d.observe(x).spike) << x;
}

TEST(LossSpikes, JumpIsFlaggedAtItsStepOnly) {
  std::vector<double> v = smooth(120, 4);
  v[70] += 1.5;  // a spike
  SpikeDetector d(50, 4.0);
  std::vector<int> flagged;
  for (int i = 0; i < (int)v.size(); ++i) {
    const train::SpikeVerdict s = d.observe(v[i]);
    if (s.spike) {
      flagged.push_back(i);
      EXPECT_GT(s.z, 4.0);
      EXPECT_NEAR(s.mean, v[69], 0.3);
    }
  }
  EXPECT_EQ(flagged, std::vector<int>{70});
}

TEST(LossSpikes, NothingBeforeMinCountOrWhenOff) {
  SpikeDetector early(50, 4.0, 20);
  for (int i = 0; i < 19; ++i) early.observe(2.0 + 0.001 * (i % 3));
  EXPECT_FALSE(early.observe(100.0).spike);  // 19 losses in the window: too few to judge
  SpikeDetector off(50, 0.0);
  for (int i = 0; i < 40; ++i) off.observe(2.0 + 0.001 * (i % 3));
  EXPECT_FALSE(off.observe(100.0).spike);
}

TEST(LossSpikes, FlatLossNeedsTheRelativeFloor) {
  SpikeDetector d(30, 4.0, 20, 0.01);
  for (int i = 0; i < 30; ++i) d.observe(3.0);
  EXPECT_FALSE(d.observe(3.0 * 1.005).spike);  // infinitely many std above, but within 1%
  EXPECT_TRUE(d.observe(3.5).spike);
}

TEST(LossSpikes, NonFiniteLossesAreNotObserved) {
  SpikeDetector d(30, 4.0);
  for (int i = 0; i < 25; ++i) d.observe(3.0 + 0.01 * (i % 2));
  EXPECT_FALSE(d.observe(NAN).spike);
  EXPECT_FALSE(d.observe(INFINITY).spike);
  EXPECT_EQ(d.size(), 25);
}

TEST(LossSpikes, StateRestoreGivesTheSameVerdicts) {
  std::vector<double> v = smooth(200, 5);
  v[150] += 2.0;
  SpikeDetector a(40, 4.0);
  for (int i = 0; i < 100; ++i) a.observe(v[i]);
  SpikeDetector b(40, 4.0);
  b.restore(nlohmann::json::parse(a.state().dump()));  // through text, as a checkpoint stores it
  EXPECT_EQ(b.size(), 40);
  for (int i = 100; i < 200; ++i) {
    const train::SpikeVerdict x = a.observe(v[i]), y = b.observe(v[i]);
    EXPECT_EQ(x.spike, y.spike) << i;
    EXPECT_EQ(x.z, y.z) << i;
  }
  SpikeDetector c(40, 4.0);
  c.restore(nlohmann::json("not an array"));  // a malformed value: an empty window
  EXPECT_EQ(c.size(), 0);
}
