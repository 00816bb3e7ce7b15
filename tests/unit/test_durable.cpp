// Durable writes and checkpoint integrity (issues 26 and 27): the atomic writer and its failure
// messages, CRC-32 manifests that name a damaged file, --resume auto skipping a damaged
// checkpoint, the tokenizer travelling with checkpoints, convert refusing to write into its
// input, the checkpoint.dir alias, the step-path function and the stop-signal flag.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/parallel.h"
#include "io/atomic_file.h"
#include "io/checksum.h"
#include "model/checkpoint.h"
#include "tests/run_config_error.h"
#include "tests/unit/test_util.h"
#include "tests/unit/tiny_trainee.h"
#include "train/checkpoint.h"
#include "train/loop.h"
#include "train/run_config.h"
#include "train/stop_signal.h"
#include "train/trainer.h"

using namespace trex;
namespace fs = std::filesystem;

namespace {

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void flip_byte(const std::string& p, uint64_t at) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg((std::streamoff)at);
  char c = 0;
  f.read(&c, 1);
  c ^= 0x10;
  f.seekp((std::streamoff)at);
  f.write(&c, 1);
}

// ---- atomic writer -------------------------------------------------------------------------

TEST(AtomicFile, WritesReplacesAndLeavesNoTemporary) {
  test::TmpDir d("trex_atomic");
  const std::string p = d.file("a.json");
  io::write_file_atomic(p, std::string("first\n"));
  EXPECT_EQ(slurp(p), "first\n");
  io::write_file_atomic(p, [](io::AtomicWriter& w) {
    w.write("sec", 3);
    w.write(std::string_view("ond\n"));
    EXPECT_EQ(w.bytes(), 7u);
  });
  EXPECT_EQ(slurp(p), "second\n");
  EXPECT_FALSE(fs::exists(p + ".tmp"));
}

TEST(AtomicFile, UnwritableDirectoryNamesPathAndOperation) {
  test::TmpDir d("trex_atomic");
  std::ofstream(d.file("plain")) << "x";  // a file where a directory is expected (fails as root too)
  const std::string p = d.file("plain") + "/out.json";
  const std::string m = test::user_error([&] { io::write_file_atomic(p, std::string("x")); }, true);
  EXPECT_NE(m.find("cannot create '" + p + ".tmp'"), std::string::npos) << m;
  EXPECT_NE(m.find("writing '" + p + "'"), std::string::npos) << m;
  EXPECT_NE(m.find("hint:"), std::string::npos) << m;
  const std::string m2 = test::user_error([&] { io::write_file_atomic(d.file("missing/x.json"), std::string("x")); });
  EXPECT_NE(m2.find("cannot create '" + d.file("missing/x.json") + ".tmp'"), std::string::npos) << m2;
}

TEST(AtomicFile, RenameFailureNamesBothPathsAndKeepsNoTemporary) {
  test::TmpDir d("trex_atomic");
  fs::create_directories(d.path / "taken" / "child");  // a non-empty directory cannot be replaced by a file
  const std::string p = d.file("taken");
  const std::string m = test::user_error([&] { io::write_file_atomic(p, std::string("x")); });
  EXPECT_NE(m.find("cannot rename '" + p + ".tmp' to '" + p + "'"), std::string::npos) << m;
  EXPECT_FALSE(fs::exists(p + ".tmp"));
}

TEST(AtomicFile, WriteFailureKeepsTheOldFile) {
  test::TmpDir d("trex_atomic");
  const std::string p = d.file("big.bin");
  io::write_file_atomic(p, std::string("old"));
  // A write past RLIMIT_FSIZE fails with EFBIG (in a child: the limit is per process).
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit rl{4096, 4096};
    ::setrlimit(RLIMIT_FSIZE, &rl);
    std::string big(1 << 20, 'y');
    try {
      io::write_file_atomic(p, big);
    } catch (const UserError& e) {
      const std::string m = e.what();
      _exit(m.find("cannot write '" + p + ".tmp'") != std::string::npos ? 0 : 2);
    }
    _exit(1);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: no error thrown, 2: the message does not name the temporary file";
  EXPECT_EQ(slurp(p), "old");
  EXPECT_FALSE(fs::exists(p + ".tmp"));
}

TEST(AtomicFile, ReplaceDirKeepsOneCompleteDirectory) {
  test::TmpDir d("trex_atomic");
  fs::create_directories(d.path / "t1");
  std::ofstream(d.file("t1/f")) << "one";
  io::fsync_tree(d.file("t1"));
  io::replace_dir_atomic(d.file("t1"), d.file("final"));
  EXPECT_EQ(slurp(d.file("final/f")), "one");
  fs::create_directories(d.path / "t2");
  std::ofstream(d.file("t2/f")) << "two";
  io::replace_dir_atomic(d.file("t2"), d.file("final"));
  EXPECT_EQ(slurp(d.file("final/f")), "two");
  int entries = 0;
  for (const auto& e : fs::directory_iterator(d.path)) entries += e.path().filename() != "t1";
  EXPECT_EQ(entries, 1);  // final only: no .old- left
}

// ---- convert: output must not be the input or inside it -------------------------------------

TEST(AtomicFile, OutputInsideInputRefused) {
  test::TmpDir d("trex_convert");
  fs::create_directories(d.path / "ckpt" / "sub");
  fs::create_symlink(d.path / "ckpt", d.path / "link");
  const std::string in = d.file("ckpt");
  // The old check (out != model as strings) let every one of these through.
  for (const std::string& out : {in, in + "/", in + "/.", d.file("sub/../ckpt"), d.file("link"), d.file("link/")}) {
    const std::string m = test::user_error([&] { io::check_output_outside_input(in, out, "--model", "--out"); });
    EXPECT_NE(m.find("is the same directory as --model"), std::string::npos) << out << ": " << m;
  }
  for (const std::string& out : {in + "/sub", in + "/new/deeper", d.file("link/new")}) {
    const std::string m = test::user_error([&] { io::check_output_outside_input(in, out, "--model", "--out"); });
    EXPECT_NE(m.find("lies inside --model"), std::string::npos) << out << ": " << m;
  }
  EXPECT_NO_THROW(io::check_output_outside_input(in, d.file("ckpt-bf16"), "--model", "--out"));
  EXPECT_NO_THROW(io::check_output_outside_input(in, d.file("other/ckpt"), "--model", "--out"));
}

// ---- checksums and manifests ----------------------------------------------------------------

TEST(Checksum, MatchesZlibAcrossChunkBoundaries) {
  init_threads();
  std::vector<uint8_t> b((40u << 20) + 12345);
  for (size_t i = 0; i < b.size(); ++i) b[i] = (uint8_t)(i * 2654435761u >> 13);
  const uint32_t want = (uint32_t)::crc32(0, b.data(), (uInt)b.size());
  EXPECT_EQ(io::crc32(b.data(), b.size()), want);  // threaded, joined with crc32_combine
  EXPECT_EQ(io::crc32(b.data() + 100, 1000), (uint32_t)::crc32(0, b.data() + 100, 1000));
  EXPECT_EQ(io::crc32("123456789", 9), 0xcbf43926u);  // the CRC-32 check value
}

TEST(Checksum, ManifestNamesTheDamagedFile) {
  test::TmpDir d("trex_manifest");
  io::write_file_atomic(d.file("a.bin"), std::string(5000, 'a'));
  io::write_file_atomic(d.file("b.bin"), std::string(300, 'b'));
  io::write_manifest(d.str(), {"a.bin", "b.bin"});
  EXPECT_FALSE(io::check_manifest(d.str()));
  flip_byte(d.file("b.bin"), 17);
  auto p = io::check_manifest(d.str());
  ASSERT_TRUE(p);
  EXPECT_NE(p->find(d.file("b.bin") + ": checksum crc32"), std::string::npos) << *p;
  EXPECT_NE(p->find("damaged"), std::string::npos) << *p;
  EXPECT_FALSE(io::check_manifest(d.str(), [](const std::string& n) { return n != "b.bin"; }));
  std::ofstream(d.file("a.bin"), std::ios::app) << "x";
  p = io::check_manifest(d.str());
  ASSERT_TRUE(p);
  EXPECT_NE(p->find(d.file("a.bin") + ": 5001 bytes, the manifest says 5000"), std::string::npos) << *p;
  fs::remove(d.file("a.bin"));
  p = io::check_manifest(d.str());
  ASSERT_TRUE(p);
  EXPECT_NE(p->find(d.file("a.bin") + ": missing"), std::string::npos) << *p;
}

// ---- training checkpoints -------------------------------------------------------------------

using test::Trainee;

TEST(CheckpointIntegrity, StepPath) {
  EXPECT_EQ(train::checkpoint_name(42), "step-00000042");
  EXPECT_EQ(train::checkpoint_path("runs/a", 7), "runs/a/checkpoints/step-00000007");
}

TEST(CheckpointIntegrity, FlippedByteNamedAndResumeAutoFallsBack) {
  init_threads(1);
  test::TmpDir d("trex_integrity");
  std::ofstream(d.file("tok.json")) << "{\"model\": {}}";
  std::ofstream(d.file("tokenizer_config.json")) << "{}";
  Trainee t(3);
  train::TrainState st;
  st.carry = {{d.file("tok.json"), "tokenizer.json"}, {d.file("tokenizer_config.json"), "tokenizer_config.json"}};
  t.step();
  st.step = 1;
  const std::string one = train::save_checkpoint(d.str(), t.m, t.opt, st, 3);
  std::vector<float> w1(t.m.P(), t.m.P() + t.m.layout.total);
  t.step();
  st.step = 2;
  const std::string two = train::save_checkpoint(d.str(), t.m, t.opt, st, 3);
  EXPECT_EQ(two, train::checkpoint_path(d.str(), 2));

  // Every file is in the manifest, the tokenizer included.
  const nlohmann::json man = nlohmann::json::parse(std::ifstream(two + "/manifest.json"));
  for (const char* f : {"config.json", "model.safetensors", "optimizer.safetensors", "trainer_state.json",
                        "tokenizer.json", "tokenizer_config.json"})
    EXPECT_TRUE(man["files"].contains(f)) << f;
  EXPECT_EQ(slurp(two + "/tokenizer.json"), "{\"model\": {}}");

  // Without checksums the flipped byte loaded silently; now the load names the file.
  const std::string weights = two + "/model.safetensors";
  flip_byte(weights, fs::file_size(weights) - 9);
  Trainee fresh(9);
  const std::string m = test::user_error([&] { train::load_checkpoint(two, fresh.m, fresh.opt); }, true);
  EXPECT_NE(m.find(weights + ": checksum crc32"), std::string::npos) << m;
  EXPECT_NE(m.find("--resume auto"), std::string::npos) << m;

  // --resume auto: the newest checkpoint that verifies, saying which it skipped and why.
  const train::ResumePick pick = train::newest_verified_checkpoint(d.str());
  ASSERT_TRUE(pick.dir);
  EXPECT_EQ(*pick.dir, one);
  ASSERT_EQ(pick.skipped.size(), 1u);
  EXPECT_NE(pick.skipped[0].find(weights), std::string::npos) << pick.skipped[0];
  const train::TrainState got = train::load_checkpoint(*pick.dir, fresh.m, fresh.opt);
  EXPECT_EQ(got.step, 1);
  for (int64_t i = 0; i < fresh.m.layout.total; ++i) ASSERT_EQ(fresh.m.P()[i], w1[i]) << i;

  // A damaged optimizer state is named the same way.
  flip_byte(one + "/optimizer.safetensors", 200);
  const std::string m2 = test::user_error([&] { train::load_checkpoint(one, fresh.m, fresh.opt); });
  EXPECT_NE(m2.find(one + "/optimizer.safetensors: checksum"), std::string::npos) << m2;
  EXPECT_FALSE(train::newest_verified_checkpoint(d.str()).dir);

  // Reading the weights only (model.path, convert): the optimizer state is not checked.
  EXPECT_NO_THROW(model::verify_weights(one));
  const std::string m3 = test::user_error([&] { model::verify_weights(two); });
  EXPECT_NE(m3.find(weights + ": checksum"), std::string::npos) << m3;
}

// ---- config: checkpoint.run_dir and its old name ---------------------------------------------

nlohmann::json base_config() {
  return {{"model", {{"vocab_size", 97}, {"hidden_size", 40}, {"num_hidden_layers", 2}, {"num_attention_heads", 2},
                     {"q_lora_rank", 14}, {"kv_lora_rank", 10}, {"qk_nope_head_dim", 6}, {"qk_rope_head_dim", 4},
                     {"v_head_dim", 6}, {"intermediate_size", 36}, {"moe_intermediate_size", 12},
                     {"n_routed_experts", 3}, {"n_shared_experts", 1}, {"num_experts_per_tok", 2},
                     {"first_k_dense_replace", 1}}}};
}

TEST(RunDirConfig, RunDirAndDeprecatedAlias) {
  nlohmann::json j = base_config();
  j["checkpoint"] = {{"run_dir", "runs/new"}};
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(train::parse_run_config(j, "run.toml").checkpoint.run_dir, "runs/new");
  EXPECT_EQ(::testing::internal::GetCapturedStderr().find("deprecated"), std::string::npos);

  j["checkpoint"] = {{"dir", "runs/old"}};
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(train::parse_run_config(j, "run.toml").checkpoint.run_dir, "runs/old");
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("checkpoint.dir is deprecated; name it checkpoint.run_dir"), std::string::npos) << err;
  EXPECT_EQ(err.find("deprecated", err.find("deprecated") + 1), std::string::npos) << "warned more than once: " << err;

  j = base_config();  // --set with the old name works too
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(train::parse_run_config(j, "run.toml", {"checkpoint.dir=x"}).checkpoint.run_dir, "x");
  ::testing::internal::GetCapturedStderr();

  j["checkpoint"] = {{"dir", "a"}, {"run_dir", "b"}};
  const std::string m = trex::testing::run_config_error(j, {});
  EXPECT_NE(m.find("both checkpoint.dir and checkpoint.run_dir"), std::string::npos) << m;

  EXPECT_TRUE(train::parse_run_config(base_config(), "run.toml").train.exit_signal_save);
  EXPECT_FALSE(train::parse_run_config(base_config(), "run.toml", {"train.exit_signal_save=false"})
                   .train.exit_signal_save);
  EXPECT_NE(trex::testing::run_config_error(base_config(), {"train.exit_signal_save=3"}).find("true or false"),
            std::string::npos);
}

// ---- the hint after NaN steps in a resumed run ----------------------------------------------

TEST(CheckpointIntegrity, NanStopAfterResumeNamesTheCheckpointBeforeNotResumeAuto) {
  init_threads(1);
  test::TmpDir d("trex_nan_hint");
  const std::string data = d.file("corpus.jsonl");
  {
    std::ofstream f(data);
    for (int i = 0; i < 40; ++i) f << nlohmann::json{{"text", "item " + std::to_string(i) + " costs " + std::to_string(3 * i)}}.dump() << "\n";
  }
  train::TokenizerFns bytes;
  bytes.encode = [](std::string_view s) {
    std::vector<int32_t> v;
    for (unsigned char ch : s) v.push_back(ch % 97);
    return v;
  };
  bytes.eos_id = 95;
  bytes.pad_id = 96;
  nlohmann::json j = base_config();
  j["data"] = {{"mode", "cpt"}, {"train", {data}}, {"seq_len", 16}, {"cache_dir", "none"}};
  j["train"] = {{"steps", 4}, {"batch_size", 2}, {"precision", "fp32"}, {"max_skipped_steps", 1}};
  j["checkpoint"] = {{"run_dir", d.file("run")}, {"every", 2}, {"keep", 3}};
  j["log"] = {{"progress", "lines"}};
  train::run_training(train::parse_run_config(j, "run.toml"), bytes);
  // Resumed from step 4, the state it loaded turns out bad (a NaN at step 5): --resume auto would
  // load step 4 again, so the hint names step 2.
  setenv("TREX_INJECT_NAN_STEP", "5", 1);
  const std::string m = test::user_error(
      [&] { train::run_training(train::parse_run_config(j, "run.toml", {"train.steps=8", "checkpoint.resume=auto"}), bytes); },
      true);
  unsetenv("TREX_INJECT_NAN_STEP");
  EXPECT_NE(m.find("--resume " + train::checkpoint_path(d.file("run"), 2) + ")"), std::string::npos) << m;
  EXPECT_EQ(m.find("(--resume auto)"), std::string::npos) << m;
}

// ---- stop signals ---------------------------------------------------------------------------

TEST(StopSignal, FirstSignalSetsTheFlagSecondExitsAtOnce) {
  {
    train::StopSignals s;
    EXPECT_FALSE(s.requested());
    ::raise(SIGTERM);  // without the handler this would end the test binary
    EXPECT_EQ(s.signal(), SIGTERM);
  }
  {
    train::StopSignals s;  // a fresh flag; the previous handlers were restored in between
    EXPECT_FALSE(s.requested());
    ::raise(SIGINT);
    EXPECT_EQ(s.signal(), SIGINT);
  }
  struct sigaction cur;
  ::sigaction(SIGTERM, nullptr, &cur);
  EXPECT_EQ(cur.sa_handler, SIG_DFL);
  const pid_t pid = ::fork();
  if (pid == 0) {
    train::StopSignals s;
    ::raise(SIGTERM);
    ::raise(SIGTERM);  // the second one: _exit(128 + SIGTERM)
    _exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM);
}

}  // namespace
