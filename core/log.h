// Logging to stderr with a level taken from TREX_LOG (error|warn|info|debug; default info).
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include "core/error.h"

namespace trex {

enum class LogLevel { Error = 0, Warn = 1, Info = 2, Debug = 3 };

inline LogLevel log_level() {
  static const LogLevel lvl = [] {
    const char* e = std::getenv("TREX_LOG");
    if (!e) return LogLevel::Info;
    if (!std::strcmp(e, "error")) return LogLevel::Error;
    if (!std::strcmp(e, "warn")) return LogLevel::Warn;
    if (!std::strcmp(e, "debug")) return LogLevel::Debug;
    return LogLevel::Info;
  }();
  return lvl;
}

template <class... A>
void log_at(LogLevel l, const char* tag, const A&... a) {
  if (static_cast<int>(l) > static_cast<int>(log_level())) return;
  std::string s = detail::cat(a...);
  std::fprintf(stderr, "[trex %s] %s\n", tag, s.c_str());
}

}  // namespace trex

#define TREX_LOG_INFO(...) ::trex::log_at(::trex::LogLevel::Info, "info", __VA_ARGS__)
#define TREX_LOG_WARN(...) ::trex::log_at(::trex::LogLevel::Warn, "warn", __VA_ARGS__)
#define TREX_LOG_DEBUG(...) ::trex::log_at(::trex::LogLevel::Debug, "debug", __VA_ARGS__)
