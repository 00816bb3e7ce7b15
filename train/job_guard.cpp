// The watchdog and the heartbeat of a multi-rank job. See job_guard.h.
#include "train/job_guard.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace trex::train {

JobGuard::JobGuard(parallel::Communicator* world, const ParallelConfig& pc, std::string what, std::string on_loss,
                   int64_t first_step)
    : what_(std::move(what)), on_loss_(std::move(on_loss)), done_(first_step) {
  const bool many = world && world->size() > 1;
  const int rank = world ? world->rank() : 0;
  const double watchdog_s = pc.watchdog_s, peer_timeout_s = pc.peer_timeout_s;
  dog_ = std::make_unique<Watchdog>(many ? watchdog_s : 0, [this, world, rank, watchdog_s](double idle) {
    std::fprintf(stderr,
                 "[trex] error: rank %d: no %s finished in %.0f s (parallel.watchdog_s = %g; last finished: step "
                 "%lld). This rank or another one is stuck: a stopped or hung process, a lost node, a deadlock. "
                 "Ending the job instead of waiting forever; if steps really take this long, raise "
                 "parallel.watchdog_s (0 = off).\n",
                 rank, what_.c_str(), idle, watchdog_s, (long long)done_.load());
    std::fflush(stderr);
    world->abort_job(3);
  });
  if (!many) return;
  heart_ = std::make_unique<parallel::Heartbeat>(*world, peer_timeout_s, [this, world, rank, peer_timeout_s](
                                                                              const parallel::PeerLost& p) {
    std::fprintf(stderr,
                 "[trex] error: rank %d: peer rank %d (host %s, %s) %s for %.0f s (parallel.peer_timeout_s = %g; "
                 "last finished: step %lld): the process died or is stopped, its host is down, or the network to it "
                 "is cut. Ending the job%s %s\n",
                 rank, p.rank, p.host.c_str(), p.addresses.c_str(),
                 p.never_heard ? "has not sent one heartbeat since the start" : "has not answered", p.silent_s,
                 peer_timeout_s, (long long)done_.load(), on_loss_.c_str(),
                 p.never_heard ? "The heartbeat is UDP on an ephemeral port between every two ranks: check that a "
                                 "firewall lets it through (docs/PARALLEL.md)."
                               : "If the network is only congested for longer, raise parallel.peer_timeout_s.");
    std::fflush(stderr);
    // MPI_Abort may wait on a launcher that cannot reach the peer's host: exit regardless.
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::seconds(5));
      std::_Exit(3);
    }).detach();
    world->abort_job(3);
  });
}

JobGuard::~JobGuard() { finish(); }

void JobGuard::done(int64_t step) {
  done_.store(step);
  if (dog_) dog_->beat();
}

void JobGuard::beat() {
  if (dog_) dog_->beat();
}

void JobGuard::finish() {
  dog_.reset();
  heart_.reset();
}

}  // namespace trex::train
