// Shared helpers of the libFuzzer targets in fuzz/ (built by fuzz/CMakeLists.txt, run by
// scripts/fuzz.sh). Each target feeds untrusted bytes to one trex parser: a trex::UserError is
// the expected rejection of bad input; anything else (another exception, a crash, a sanitizer
// report, a broken invariant checked with FUZZ_ASSERT) is a finding.
#pragma once
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/error.h"

#ifndef TREX_FUZZ_ROOT
#error "TREX_FUZZ_ROOT (the repository root) must be defined by fuzz/CMakeLists.txt"
#endif

namespace trex::fuzz {

// Aborts with a message when an invariant of a parser's output does not hold.
#define FUZZ_ASSERT(cond, ...)                                                          \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "FUZZ_ASSERT failed: %s at %s:%d: %s\n", #cond, __FILE__,    \
                   __LINE__, ::trex::detail::cat("" __VA_OPT__(, ) __VA_ARGS__).c_str()); \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)

// A file of the repository (fixtures under tests/data, ...).
inline std::string repo_file(const std::string& rel) { return std::string(TREX_FUZZ_ROOT) + "/" + rel; }

// A scratch directory private to this process (removed at exit), under $TMPDIR or /tmp.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    const char* t = std::getenv("TMPDIR");
    std::filesystem::path p = std::filesystem::path(t && *t ? t : "/tmp") /
                              ("trex_fuzz_" + std::to_string(::getpid()));
    std::filesystem::create_directories(p);
    static struct Cleanup {
      std::filesystem::path p;
      ~Cleanup() {
        std::error_code ec;
        std::filesystem::remove_all(p, ec);
      }
    } cleanup{p};
    return p;
  }();
  return dir;
}

// Writes `bytes` to scratch_dir()/name (replacing it) and returns the path.
inline std::string write_scratch(const std::string& name, std::string_view bytes) {
  const std::string p = (scratch_dir() / name).string();
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.close();
  if (!f) {
    std::fprintf(stderr, "fuzz harness: cannot write %s\n", p.c_str());
    std::abort();
  }
  return p;
}

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Runs fn; a trex::UserError (bad input, rejected with a message) is the expected outcome for
// most inputs. Checks that the message is not empty. Anything else propagates and crashes.
// With TREX_FUZZ_VERBOSE=1 in the environment, prints each rejection (to check a seed corpus).
template <class F>
bool accepts(F&& fn) {
  static const bool verbose = std::getenv("TREX_FUZZ_VERBOSE") != nullptr;
  try {
    fn();
    if (verbose) std::fprintf(stderr, "[fuzz] accepted\n");
    return true;
  } catch (const trex::UserError& e) {
    FUZZ_ASSERT(e.what()[0] != '\0', "UserError with an empty message");
    if (verbose) std::fprintf(stderr, "[fuzz] rejected: %s\n", e.what());
    return false;
  }
}

}  // namespace trex::fuzz
