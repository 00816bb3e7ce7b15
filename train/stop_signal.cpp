// SIGTERM / SIGINT: finish the step, save, exit. See train/stop_signal.h.
#include "train/stop_signal.h"

#include <unistd.h>

#include <csignal>
#include <cstring>

#include "core/error.h"

namespace trex::train {

namespace {

// The one flag (see the header for why it is global): the first signal's number, 0 = none.
volatile std::sig_atomic_t g_stop_signal = 0;

void on_stop_signal(int sig) {
  if (g_stop_signal != 0) _exit(128 + sig);  // a second signal: at once (async-signal-safe)
  g_stop_signal = sig;
  static const char msg[] =
      "[trex] stop requested: finishing the current step, then writing a checkpoint (signal again to exit at "
      "once)\n";
  ssize_t w = ::write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)w;
}

}  // namespace

StopSignals::StopSignals() {
  struct sigaction cur;
  TREX_CHECK(::sigaction(SIGTERM, nullptr, &cur) == 0 && cur.sa_handler != on_stop_signal,
             "StopSignals: only one may exist at a time");
  g_stop_signal = 0;
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // system calls interrupted by the first signal resume
  TREX_CHECK(::sigaction(SIGTERM, &sa, &old_term_) == 0 && ::sigaction(SIGINT, &sa, &old_int_) == 0,
             "sigaction failed");
}

StopSignals::~StopSignals() {
  ::sigaction(SIGTERM, &old_term_, nullptr);
  ::sigaction(SIGINT, &old_int_, nullptr);
  g_stop_signal = 0;
}

int StopSignals::signal() const { return g_stop_signal; }

}  // namespace trex::train
