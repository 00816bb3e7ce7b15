// Watchdog: a thread that fires once when the owner stops making progress. The owner calls beat()
// at every unit of progress (a training step); when no beat has come for timeout_s seconds,
// fire(idle_s) runs on the watchdog thread (typically: log and abort the whole parallel job, so a
// stuck or stopped rank does not leave the others waiting in a collective forever). The thread
// checks a few times a second and stops with the object.
#pragma once
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace trex {

class Watchdog {
 public:
  // timeout_s <= 0: no thread, beat() does nothing.
  Watchdog(double timeout_s, std::function<void(double idle_s)> fire);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void beat();
  bool fired() const { return fired_.load(); }

 private:
  void run();
  double timeout_s_;
  std::function<void(double)> fire_;
  std::atomic<double> last_;  // steady-clock seconds of the last beat
  std::atomic<bool> fired_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread th_;
};

}  // namespace trex
