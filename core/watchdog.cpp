#include "core/watchdog.h"

#include <algorithm>
#include <chrono>

namespace trex {

namespace {
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace

Watchdog::Watchdog(double timeout_s, std::function<void(double)> fire)
    : timeout_s_(timeout_s), fire_(std::move(fire)), last_(now_s()) {
  if (timeout_s_ > 0) th_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (th_.joinable()) th_.join();
}

void Watchdog::beat() { last_.store(now_s()); }

void Watchdog::run() {
  const auto tick = std::chrono::duration<double>(std::clamp(timeout_s_ / 10, 0.05, 1.0));
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    cv_.wait_for(l, tick, [this] { return stop_; });
    if (stop_) break;
    const double idle = now_s() - last_.load();
    if (idle >= timeout_s_) {
      fired_.store(true);
      l.unlock();
      fire_(idle);
      return;
    }
  }
}

}  // namespace trex
