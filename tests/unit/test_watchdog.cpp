// core/watchdog.h: fires once after timeout_s without a beat, never while beats keep coming, and
// not at all when off.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "core/watchdog.h"

using namespace trex;
using namespace std::chrono_literals;

TEST(Watchdog, FiresOnceWithoutBeats) {
  std::atomic<int> fired{0};
  std::atomic<double> idle{0};
  {
    Watchdog w(0.2, [&](double s) {
      idle = s;
      ++fired;
    });
    std::this_thread::sleep_for(700ms);
    EXPECT_TRUE(w.fired());
  }
  EXPECT_EQ(fired.load(), 1);
  EXPECT_GE(idle.load(), 0.2);
}

TEST(Watchdog, BeatsKeepItQuiet) {
  std::atomic<int> fired{0};
  {
    Watchdog w(0.3, [&](double) { ++fired; });
    for (int i = 0; i < 12; ++i) {
      std::this_thread::sleep_for(50ms);
      w.beat();
    }
    EXPECT_FALSE(w.fired());
  }
  EXPECT_EQ(fired.load(), 0);
}

TEST(Watchdog, OffWhenTimeoutIsZero) {
  std::atomic<int> fired{0};
  Watchdog w(0, [&](double) { ++fired; });
  std::this_thread::sleep_for(100ms);
  w.beat();
  EXPECT_FALSE(w.fired());
  EXPECT_EQ(fired.load(), 0);
}
