// parallel/heartbeat.h across real ranks: the peers hear each other over UDP, a rank that is
// slow (busy for several timeouts while the others wait in a barrier) is not reported lost, and a
// rank that says goodbye early is no longer watched. A peer that goes silent is reported: the
// fault tests stop one (tests/faults/rank_hang.sh, tests/hosts/).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "parallel/heartbeat.h"

namespace trex::parallel {
Communicator& test_world();
}  // namespace trex::parallel

using namespace trex;
using namespace trex::parallel;

namespace {

TEST(Heartbeat, SlowPeerIsNotLostAndGoodbyeStopsTheWatch) {
  Communicator& w = test_world();
  std::atomic<int> lost{0};
  auto on_lost = [&](const PeerLost& p) {
    ADD_FAILURE() << "rank " << w.rank() << ": peer " << p.rank << " reported lost after " << p.silent_s << " s";
    lost.fetch_add(1);
  };
  {
    Heartbeat hb(w, 0.6, on_lost);
    EXPECT_NEAR(hb.interval_s(), 0.1, 1e-9);
    EXPECT_FALSE(hb.host_of(0).empty());
    // The last rank is busy for 3 timeouts (no MPI call); the others wait for it in a barrier.
    if (w.rank() == w.size() - 1) std::this_thread::sleep_for(std::chrono::milliseconds(1800));
    w.barrier();
    EXPECT_GE(hb.received(), 5 * (w.size() - 1)) << "rank " << w.rank();
    // Rank 0 leaves first (goodbye); the others keep theirs for 3 more timeouts.
    if (w.rank() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(1800));
  }
  w.barrier();
  EXPECT_EQ(lost.load(), 0);
}

}  // namespace
