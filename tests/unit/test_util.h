// Shared helpers for the unit tests: locating committed fixtures under tests/data/ (from the
// repository root or the build tree), and a temporary directory removed at scope exit.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>

#include "core/error.h"

namespace trex::test {

// tests/data/<sub>, found next to this header or under the working directory; `probe` is a file
// that must exist there.
inline std::filesystem::path data_dir(const std::string& sub, const std::string& probe) {
  namespace fs = std::filesystem;
  const fs::path candidates[] = {fs::path(__FILE__).parent_path().parent_path() / "data" / sub,
                                 fs::path("tests/data") / sub};
  for (const auto& p : candidates)
    if (fs::exists(p / probe)) return p;
  ADD_FAILURE() << "fixtures tests/data/" << sub << " not found (run from the repository root)";
  return candidates[1];
}

// A fresh directory under the system temp dir, unique per process and instance.
struct TmpDir {
  std::filesystem::path path;
  explicit TmpDir(const std::string& prefix = "trex") {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           (prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TmpDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TmpDir(const TmpDir&) = delete;
  TmpDir& operator=(const TmpDir&) = delete;
  std::string file(const std::string& name) const { return (path / name).string(); }
  std::string str() const { return path.string(); }
};

// Runs f, which must throw trex::UserError, and returns its message (with_hint: then " | hint: "
// and its hint). Another exception, or none, is a test failure and returns "".
template <class F>
std::string user_error(F&& f, bool with_hint = false) {
  try {
    f();
  } catch (const UserError& e) {
    return with_hint ? std::string(e.what()) + " | hint: " + e.hint : std::string(e.what());
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected trex::UserError, got: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected trex::UserError, nothing thrown";
  return "";
}

}  // namespace trex::test
