// Error handling: one macro family that carries file:line, and a typed exception for
// user-facing errors that carries a hint of what to do.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace trex {

// Internal invariant or programming error (file:line in the message).
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Bad input from the user (config, data, checkpoint, layout). `hint` says what to do.
struct UserError : std::runtime_error {
  std::string hint;
  UserError(const std::string& what, std::string h) : std::runtime_error(what), hint(std::move(h)) {}
};

namespace detail {
template <class... A>
std::string cat(const A&... a) {
  std::ostringstream os;
  (os << ... << a);
  return os.str();
}
[[noreturn]] inline void fail(const char* file, int line, const std::string& msg) {
  throw Error(cat(file, ":", line, ": ", msg));
}
}  // namespace detail

}  // namespace trex

#define TREX_FAIL(...) ::trex::detail::fail(__FILE__, __LINE__, ::trex::detail::cat(__VA_ARGS__))
#define TREX_CHECK(cond, ...)                                                        \
  do {                                                                               \
    if (!(cond)) [[unlikely]]                                                        \
      ::trex::detail::fail(__FILE__, __LINE__,                                       \
                           ::trex::detail::cat("check failed: " #cond " ", ##__VA_ARGS__)); \
  } while (0)
// User-facing error: message names the file / field; hint says what to do.
#define TREX_USER_CHECK(cond, hint, ...)                                             \
  do {                                                                               \
    if (!(cond)) [[unlikely]]                                                        \
      throw ::trex::UserError(::trex::detail::cat(__VA_ARGS__), hint);               \
  } while (0)
#define TREX_USER_FAIL(hint, ...) throw ::trex::UserError(::trex::detail::cat(__VA_ARGS__), hint)
