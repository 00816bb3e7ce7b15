#include "train/checkpoint.h"

#include <unistd.h>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include "core/log.h"
#include "io/atomic_file.h"
#include "io/checksum.h"
#include "io/safetensors.h"
#include "model/checkpoint.h"
#include "model/mtp_v3.h"

namespace trex::train {

namespace fs = std::filesystem;

namespace {

const std::regex kName("step-([0-9]{8})");
constexpr const char* kDamagedHint =
    "--resume auto takes the newest checkpoint that verifies; or pass an older one with --resume DIR";

// The files of one checkpoint into `tmp` (created here), each fsynced, the manifest last, and
// tmp itself.
void write_checkpoint_files(const fs::path& tmp, const model::WeightsView& m, const float* M1, const float* M2,
                            int64_t optimizer_step, const TrainState& st) {
  fs::create_directories(tmp);
  model::save_hf_checkpoint(m, tmp.string(), DType::F32);
  std::vector<io::TensorToWrite> ts;
  for (const model::ParamEntry& e : m.layout.entries) {
    ts.push_back({"exp_avg." + e.name, DType::F32, e.shape, M1 + e.offset});
    ts.push_back({"exp_avg_sq." + e.name, DType::F32, e.shape, M2 + e.offset});
  }
  io::write_safetensors((tmp / "optimizer.safetensors").string(), ts);
  nlohmann::json js = {{"step", st.step},
                       {"optimizer_step", optimizer_step},
                       {"data_position", st.data_position},
                       {"rng_state", std::to_string(st.rng_state)},
                       {"extra", st.extra}};
  io::write_file_atomic((tmp / "trainer_state.json").string(), js.dump(2) + "\n");
  for (const CarriedFile& c : st.carry) {
    std::error_code ec;
    fs::copy_file(c.src, tmp / c.name, fs::copy_options::overwrite_existing, ec);
    TREX_USER_CHECK(!ec, "check that the file is readable", "cannot copy '", c.src, "' into the checkpoint as '",
                    c.name, "': ", ec.message());
  }
  std::vector<std::string> files;
  for (const auto& f : fs::directory_iterator(tmp))
    if (f.is_regular_file()) files.push_back(f.path().filename().string());
  std::sort(files.begin(), files.end());
  io::fsync_tree(tmp.string());
  io::write_manifest(tmp.string(), files);  // fsyncs itself and tmp
}

// Checkpoint directories under run_dir/checkpoints with a trainer_state.json, newest first.
std::vector<std::pair<int64_t, fs::path>> complete_checkpoints(const std::string& run_dir) {
  std::vector<std::pair<int64_t, fs::path>> all;
  const fs::path root = fs::path(run_dir) / "checkpoints";
  std::error_code ec;
  if (!fs::exists(root, ec)) return all;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string n = e.path().filename().string();
    std::smatch mt;
    if (!std::regex_match(n, mt, kName) || !fs::exists(e.path() / "trainer_state.json")) continue;
    all.push_back({std::stoll(mt[1]), e.path()});
  }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return all;
}

}  // namespace

std::string checkpoint_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", (long long)step);
  return buf;
}

std::string checkpoint_path(const std::string& run_dir, int64_t step) {
  return (fs::path(run_dir) / "checkpoints" / checkpoint_name(step)).string();
}

std::string save_checkpoint(const std::string& run_dir, const model::Model& m, const AdamW& opt,
                            const TrainState& st, int keep) {
  TREX_CHECK(opt.owns_all(), "save_checkpoint: the optimizer holds a shard; gather the moments first (train/dist.h)");
  return save_checkpoint(run_dir, m, opt.M1(), opt.M2(), opt.steps(), st, keep);
}

std::string save_checkpoint(const std::string& run_dir, const model::Model& m, const float* M1, const float* M2,
                            int64_t optimizer_step, const TrainState& st, int keep) {
  TREX_CHECK(!m.layout.sharded(), "save_checkpoint: the model holds an expert shard or a pipeline stage only ",
             "(train/dist.h save_checkpoint gathers the shards)");
  return save_checkpoint(run_dir, model::WeightsView{m.cfg, m.layout, m.P(), m.buffers.data(), &m.kept}, M1, M2,
                         optimizer_step, st, keep);
}

std::string save_checkpoint(const std::string& run_dir, const model::WeightsView& m, const float* M1,
                            const float* M2, int64_t optimizer_step, const TrainState& st, int keep) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  std::error_code ec;
  fs::create_directories(root, ec);
  TREX_USER_CHECK(!ec, "check permissions of checkpoint.run_dir", root.string(), ": cannot create: ", ec.message());
  const fs::path final_dir = root / checkpoint_name(st.step);
  const fs::path tmp = root / (".tmp-" + checkpoint_name(st.step) + "-" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  const std::optional<std::string> previous = latest_checkpoint(run_dir);
  const std::string kept = previous ? "; the previous checkpoint " + *previous + " is intact (--resume auto loads it)"
                                    : "; no earlier checkpoint exists";
  // Free space first: the files are about 12 bytes per parameter (f32 weights and two moments).
  const double need = 12.0 * (double)m.layout.total + (64 << 10);
  const fs::space_info sp = fs::space(root, ec);
  TREX_USER_CHECK(ec || (double)sp.available >= need,
                  "free space on that disk, lower checkpoint.keep, or set checkpoint.run_dir to a larger disk",
                  "checkpoint of step ", st.step, " needs about ", need / (1 << 20), " MiB but ", root.string(), " has ",
                  (double)sp.available / (1 << 20), " MiB free", kept);
  try {
    write_checkpoint_files(tmp, m, M1, M2, optimizer_step, st);
  } catch (const UserError& e) {
    fs::remove_all(tmp, ec);  // no half-written checkpoint left to fill the disk
    TREX_USER_FAIL("free space on that disk or fix its permissions, then rerun with --resume auto",
                   "checkpoint of step ", st.step, " was not written: ", e.what(), kept);
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(tmp, ec);
    TREX_USER_FAIL("free space on that disk or fix its permissions, then rerun with --resume auto",
                   "checkpoint of step ", st.step, " was not written: ", e.what(), kept);
  }

  // Re-saving the same step: the old directory is moved aside before the new one takes its name
  // and removed after, so a crash in between leaves one of them in place.
  io::replace_dir_atomic(tmp.string(), final_dir.string());

  // Retention: keep the newest `keep` complete checkpoints; clear stale temporaries.
  std::vector<std::pair<int64_t, fs::path>> all;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string n = e.path().filename().string();
    std::smatch mt;
    if (std::regex_match(n, mt, kName)) all.push_back({std::stoll(mt[1]), e.path()});
    else if ((n.rfind(".tmp-", 0) == 0 || n.find(".old-") != std::string::npos) && e.path() != tmp) fs::remove_all(e.path());
  }
  std::sort(all.begin(), all.end());
  for (size_t i = 0; keep > 0 && i + keep < all.size(); ++i) fs::remove_all(all[i].second);
  return final_dir.string();
}

std::optional<std::string> latest_checkpoint(const std::string& run_dir) {
  const auto all = complete_checkpoints(run_dir);
  if (all.empty()) return std::nullopt;
  return all.front().second.string();
}

ResumePick newest_verified_checkpoint(const std::string& run_dir) {
  ResumePick r;
  for (const auto& [step, dir] : complete_checkpoints(run_dir)) {
    std::optional<std::string> problem;
    try {
      problem = io::check_manifest(dir.string());
    } catch (const UserError& e) {  // a file that cannot be opened or mapped
      problem = e.what();
    }
    if (!problem) {
      r.dir = dir.string();
      return r;
    }
    r.skipped.push_back(dir.string() + ": " + *problem);
  }
  return r;
}

void verify_checkpoint(const std::string& dir) { io::verify_manifest(dir, kDamagedHint); }

TrainState load_checkpoint(const std::string& dir, model::Model& m, AdamW& opt, bool verify) {
  if (verify) verify_checkpoint(dir);
  // With the MTP blocks the run trains (config.json lists them in num_nextn_predict_layers).
  const model::ModelConfig c =
      model::with_mtp(model::load_config_json(dir + "/config.json"), m.cfg.is_v4() ? m.cfg.v4.mtp_layers : m.cfg.v3_mtp_layers);
  TREX_USER_CHECK(c.num_params() == m.cfg.num_params() && c.num_hidden_layers == m.cfg.num_hidden_layers,
                  "resume with the model config the run was started with", dir,
                  ": checkpoint model does not match the configured model");
  model::load_hf_weights(m, dir, false);  // verify_checkpoint covered every file when asked
  io::SafetensorsFile f = io::SafetensorsFile::open(dir + "/optimizer.safetensors");
  // The optimizer's pieces of each parameter (all of it on one rank; a ZeRO-1 shard's parts).
  std::vector<std::vector<const AdamWPiece*>> of_entry(m.layout.entries.size());
  for (const AdamWPiece& p : opt.pieces()) of_entry[p.entry].push_back(&p);
  std::vector<float> tmp, local;
  int64_t fresh_moments = 0;
  for (size_t i = 0; i < m.layout.entries.size(); ++i) {
    const model::ParamEntry& e = m.layout.entries[i];
    const int64_t n = e.shape.numel();
    // MTP tensors a run starts training on resume (the checkpoint's run kept them, mtp_loss_weight
    // = 0): no moments in the file; theirs start at 0.
    if (!f.find("exp_avg." + e.name) && model::v3_layer_of(e.name) >= m.cfg.num_hidden_layers) {
      ++fresh_moments;
      continue;
    }
    // An expert-parallel shard's rows of a merged [E, ...] expert tensor, a tensor-parallel slice:
    // read whole, keep this entry's part.
    const int64_t n_file = e.whole_numel();
    for (int k = 0; k < 2; ++k) {
      const std::string name = (k ? "exp_avg_sq." : "exp_avg.") + e.name;
      float* M = k ? opt.M2() : opt.M1();
      const auto& ps = of_entry[i];
      if (ps.empty()) continue;
      if (!e.sliced() && ps.size() == 1 && ps[0]->off == e.offset && ps[0]->n == n) {
        f.read_f32(name, M + ps[0]->state, n);
        continue;
      }
      tmp.resize(n_file);
      f.read_f32(name, tmp.data(), n_file);
      if (e.sliced()) {
        local.resize(n);
        e.take_from_whole(tmp.data(), local.data());
      }
      const float* src = e.sliced() ? local.data() : tmp.data();
      for (const AdamWPiece* p : ps)
        std::copy(src + (p->off - e.offset), src + (p->off - e.offset + p->n), M + p->state);
    }
  }
  if (fresh_moments)
    TREX_LOG_INFO(dir, ": ", fresh_moments, " tensors of the MTP layers have no optimizer moments (the run that wrote "
                  "the checkpoint did not train them); their moments start at 0");
  nlohmann::json js;
  try {
    js = nlohmann::json::parse(std::ifstream(dir + "/trainer_state.json"));
  } catch (const nlohmann::json::exception& e) {
    TREX_USER_FAIL("the checkpoint is damaged; resume from an older one", dir, "/trainer_state.json: ", e.what());
  }
  TrainState st;
  try {
    st.step = js.at("step").get<int64_t>();
    st.data_position = js.at("data_position").get<int64_t>();
    st.rng_state = std::stoull(js.at("rng_state").get<std::string>());
    st.extra = js.value("extra", nlohmann::json::object());
    opt.set_steps(js.at("optimizer_step").get<int64_t>());
  } catch (const std::exception& e) {
    TREX_USER_FAIL("the checkpoint is damaged; resume from an older one", dir, "/trainer_state.json: ", e.what());
  }
  opt.host_state_changed();  // (the parameters went to the device with load_hf_weights)
  return st;
}

}  // namespace trex::train
