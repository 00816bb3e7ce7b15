// A checkpoint write that runs out of space (issue 9) fails with a clear error naming the step,
// the file and the intact previous checkpoint; it leaves no partial directory; the previous
// checkpoint loads. Two ways to run out:
//   - RLIMIT_FSIZE: a write past the limit fails with EFBIG in the middle of a file (any user);
//   - a tmpfs too small for a second checkpoint (needs mount permission; skipped without it):
//     refused by the free-space check before anything is written.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <filesystem>
#include <nlohmann/json.hpp>
#include "core/error.h"
#include "core/parallel.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "tests/unit/test_util.h"
#include "tests/unit/tiny_trainee.h"

using namespace trex;
namespace fs = std::filesystem;

namespace {

using test::Trainee;


uint64_t dir_bytes(const fs::path& p) {
  uint64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(p))
    if (e.is_regular_file()) n += e.file_size();
  return n;
}

bool has_temporaries(const fs::path& run) {
  for (const auto& e : fs::directory_iterator(run / "checkpoints"))
    if (e.path().filename().string()[0] == '.') return true;
  return false;
}

// The newest checkpoint is step 1 and loads into a fresh model with the saved weights.
void expect_step1_loads(const std::string& run_dir, const Trainee& saved) {
  auto latest = train::latest_checkpoint(run_dir);
  ASSERT_TRUE(latest);
  EXPECT_EQ(fs::path(*latest).filename().string(), "step-00000001");
  Trainee fresh(999);
  const train::TrainState st = train::load_checkpoint(*latest, fresh.m, fresh.opt);
  EXPECT_EQ(st.step, 1);
  for (int64_t i = 0; i < fresh.m.layout.total; ++i) ASSERT_EQ(fresh.m.P()[i], saved.m.P()[i]) << i;
}

}  // namespace

TEST(CheckpointDiskFull, WriteFailureMidFileKeepsThePreviousCheckpoint) {
  init_threads();
  test::TmpDir dir("trex_diskfull");
  const std::string run = dir.str();
  Trainee r(7);
  r.step();
  train::save_checkpoint(run, r.m, r.opt, {1, 1, 0, {}}, 3);
  std::vector<float> w1(r.m.P(), r.m.P() + r.m.layout.total);
  r.step();

  // Files may grow to 4 KB: config.json fits, model.safetensors stops part way.
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  struct rlimit lim = old;
  lim.rlim_cur = 4096;
  auto prev = ::signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of the signal
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
  const std::string m =
      test::user_error([&] { train::save_checkpoint(run, r.m, r.opt, {2, 2, 0, {}}, 3); }, /*with_hint=*/true);
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, prev);

  EXPECT_NE(m.find("checkpoint of step 2 was not written"), std::string::npos) << m;
  EXPECT_NE(m.find("cannot write"), std::string::npos) << m;
  EXPECT_NE(m.find("File too large"), std::string::npos) << m;
  EXPECT_NE(m.find("the previous checkpoint"), std::string::npos) << m;
  EXPECT_NE(m.find("step-00000001 is intact"), std::string::npos) << m;
  EXPECT_FALSE(has_temporaries(run)) << "a partial checkpoint was left behind";
  Trainee check(7);
  std::copy(w1.begin(), w1.end(), check.m.P());
  expect_step1_loads(run, check);
  // With the limit gone, the same save succeeds.
  EXPECT_NO_THROW(train::save_checkpoint(run, r.m, r.opt, {2, 2, 0, {}}, 3));
}

TEST(CheckpointDiskFull, TooLittleSpaceIsRefusedBeforeWriting) {
  init_threads();
  test::TmpDir probe("trex_diskfull_probe");
  Trainee r(8);
  r.step();
  train::save_checkpoint(probe.str(), r.m, r.opt, {1, 1, 0, {}}, 3);
  const uint64_t one = dir_bytes(probe.path / "checkpoints");

  test::TmpDir dir("trex_diskfull_tmpfs");
  // Room for one checkpoint and a third.
  const std::string opts = "size=" + std::to_string((one * 13 / 10 + 65536 + 4095) / 4096 * 4096);
  if (::mount("tmpfs", dir.str().c_str(), "tmpfs", 0, opts.c_str()) != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (needs CAP_SYS_ADMIN); the RLIMIT_FSIZE test covers write failures";
  struct Unmount {
    std::string p;
    ~Unmount() { ::umount2(p.c_str(), MNT_DETACH); }
  } unmount{dir.str()};
  const std::string run = dir.str() + "/run";
  train::save_checkpoint(run, r.m, r.opt, {1, 1, 0, {}}, 3);
  std::vector<float> w1(r.m.P(), r.m.P() + r.m.layout.total);
  r.step();
  const std::string m =
      test::user_error([&] { train::save_checkpoint(run, r.m, r.opt, {2, 2, 0, {}}, 3); }, /*with_hint=*/true);
  EXPECT_NE(m.find("checkpoint of step 2 needs about"), std::string::npos) << m;
  EXPECT_NE(m.find("MiB free"), std::string::npos) << m;
  EXPECT_NE(m.find("step-00000001 is intact"), std::string::npos) << m;
  EXPECT_NE(m.find("checkpoint.keep"), std::string::npos) << m;
  EXPECT_FALSE(has_temporaries(run));
  Trainee check(8);
  std::copy(w1.begin(), w1.end(), check.m.P());
  expect_step1_loads(run, check);
}
