// Graceful stop of a training run (train.exit_signal_save, on by default): SIGTERM (what Slurm and
// Kubernetes send before a kill) or SIGINT (Ctrl-C) lets the current step finish; the loop then
// writes a checkpoint (atomically, as every checkpoint) and `trex train` exits with kExitStopped.
// A second signal ends the process at once (exit code 128 + the signal number, as a shell
// reports a death by that signal). Under mpirun the ranks agree after every step (a one-int max
// all-reduce of the flag over the world communicator, train/loop.cpp), so a signal delivered to
// any rank stops every rank at the same step.
//
// The handler only stores the signal number into one process-wide `volatile sig_atomic_t`. That
// one flag must be global: a POSIX signal handler receives no pointer to any object, and the only
// state it may touch safely is an object of static storage duration of type volatile
// sig_atomic_t (or a lock-free atomic). StopSignals owns it: at most one exists at a time (checked
// against the installed handler, not by a second global).
#pragma once
#include <signal.h>

namespace trex::train {

// The exit code of a run stopped by SIGTERM / SIGINT after writing its checkpoint: EX_TEMPFAIL
// of sysexits.h ("try again later"): rerun the same command with --resume auto.
constexpr int kExitStopped = 75;

// Installs the SIGTERM and SIGINT handlers for its lifetime (the previous ones are restored by the
// destructor) and clears the flag.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  // The first signal received since construction (SIGTERM or SIGINT), or 0.
  int signal() const;
  bool requested() const { return signal() != 0; }

 private:
  struct sigaction old_term_ {}, old_int_ {};  // restored by the destructor
};

}  // namespace trex::train
