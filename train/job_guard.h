// The guards of a job on more than one rank against a rank that stops answering (train/loop.cpp's
// training loop, `trex bench step` under mpirun): a watchdog that ends the job, every rank, when no
// step has finished for parallel.watchdog_s seconds (a stuck, stopped or deadlocked rank), and the
// heartbeat (parallel/heartbeat.h) that ends it after parallel.peer_timeout_s of silence from a
// peer (a dead process, a lost host, a cut network) while a step that is only slow waits for the
// watchdog. Each prints why on stderr, naming the rank, the setting and the last finished step,
// and ends the job with exit code 3. On one rank (world null or of size 1) nothing is started.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include "core/watchdog.h"
#include "parallel/comm.h"
#include "parallel/heartbeat.h"
#include "train/run_config.h"

namespace trex::train {

class JobGuard {
 public:
  // Collective over world (the heartbeat). what: the unit of progress in the messages ("training
  // step", "benchmark step"); on_loss: what follows "Ending the job" in the peer-lost message,
  // its end of sentence included ("." or "; the newest checkpoint in ... is complete ...").
  // first_step: the step the job starts from.
  JobGuard(parallel::Communicator* world, const ParallelConfig& pc, std::string what, std::string on_loss,
           int64_t first_step);
  ~JobGuard();
  JobGuard(const JobGuard&) = delete;
  JobGuard& operator=(const JobGuard&) = delete;

  void done(int64_t step);  // step finished: the watchdog's beat, and the step the messages name
  void beat();              // progress inside a step's tail (an eval, a checkpoint)
  // The loop is over: no watchdog for what follows (bounded work), and the heartbeat says goodbye
  // (the peers stop watching this rank).
  void finish();

 private:
  std::string what_, on_loss_;
  std::atomic<int64_t> done_;
  std::unique_ptr<Watchdog> dog_;
  std::unique_ptr<parallel::Heartbeat> heart_;
};

}  // namespace trex::train
