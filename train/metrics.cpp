#include "train/metrics.h"

#include <unistd.h>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include "core/error.h"
#include "core/timer.h"
#include "io/atomic_file.h"

namespace trex::train {

int64_t truncate_metrics(const std::string& path, int64_t step) {
  std::ifstream in(path, std::ios::binary);
  if (!in.good()) return 0;
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  std::string keep;
  int64_t dropped = 0;
  for (size_t pos = 0; pos < all.size();) {
    size_t end = all.find('\n', pos);
    if (end == std::string::npos) end = all.size();
    const std::string line = all.substr(pos, end - pos);
    pos = end + 1;
    if (line.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer() && j["step"].get<int64_t>() <= step)
      keep += line + "\n";
    else
      ++dropped;
  }
  if (keep != all) io::write_file_atomic(path, keep);
  return dropped;
}

std::vector<nlohmann::json> read_metrics(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TREX_USER_CHECK(in.good(), "give the checkpoint.run_dir of a trex train run", path, ": cannot open");
  std::map<int64_t, nlohmann::json> by_step;
  std::string line;
  int64_t ln = 0;
  while (std::getline(in, line)) {
    ++ln;
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    const bool ok = j.is_object() && j.contains("step") && j["step"].is_number_integer() && j.contains("loss") &&
                    j["loss"].is_number();
    if (!ok && in.eof()) break;  // a last line cut by a kill
    TREX_USER_CHECK(ok, "the file must come from trex train", path, ":", ln, ": not a metrics record");
    const int64_t step = j["step"].get<int64_t>();
    by_step[step] = std::move(j);
  }
  std::vector<nlohmann::json> out;
  out.reserve(by_step.size());
  for (auto& [s, j] : by_step) out.push_back(std::move(j));
  return out;
}

MetricsLog::MetricsLog(const std::string& run_dir, const std::string& progress, int64_t every, int64_t resumed_step)
    : every_(every), t0_ms_(now_ms()) {
  std::filesystem::create_directories(run_dir);
  path_ = run_dir + "/metrics.jsonl";
  if (resumed_step >= 0) dropped_ = truncate_metrics(path_, resumed_step);
  f_ = std::fopen(path_.c_str(), resumed_step >= 0 ? "a" : "w");
  TREX_USER_CHECK(f_, "check that checkpoint.run_dir is writable", path_, ": cannot open for writing");
  bar_ = progress == "bar" || (progress == "auto" && ::isatty(STDERR_FILENO));
}

MetricsLog::~MetricsLog() {
  if (bar_) std::fputc('\n', stderr);
  if (f_) std::fclose(f_);
}

void MetricsLog::sync() {
  std::fflush(f_);
  io::fsync_file(path_);
}

void MetricsLog::message(const std::string& s) {
  if (bar_) std::fputc('\n', stderr);
  std::fprintf(stderr, "%s\n", s.c_str());
}

void MetricsLog::step(const StepMetrics& m) {
  nlohmann::json j = {{"step", m.step},       {"loss", m.loss},       {"ce", m.ce},
                      {"aux", m.aux},         {"lr", m.lr},           {"grad_norm", m.grad_norm},
                      {"step_ms", m.ms},      {"tokens", m.tokens},   {"tokens_per_s", m.tokens_per_s},
                      {"mfu", m.mfu},         {"expert_load_max_over_mean", m.load_max_over_mean}};
  if (!m.expert_loads.empty()) j["expert_loads"] = m.expert_loads;
  if (m.eval_loss >= 0) j["eval_loss"] = m.eval_loss;
  if (m.indexer_loss >= 0) j["indexer_loss"] = m.indexer_loss, j["indexer_recall"] = m.indexer_recall;
  if (m.skipped) j["skipped"] = true;
  if (m.comm_ms >= 0) j["comm_ms"] = m.comm_ms;
  if (m.spike) {
    j["spike"] = true;
    j["loss_z"] = std::min(m.loss_z, 1e9);  // a window of equal losses gives z = inf
  }
  std::fprintf(f_, "%s\n", j.dump().c_str());
  std::fflush(f_);
  if (first_step_ < 0) first_step_ = m.step - 1, t0_ms_ = now_ms() - m.ms;
  const double elapsed = (now_ms() - t0_ms_) / 1000.0;
  const int64_t done = m.step - first_step_, left = m.total_steps - m.step;
  const double eta = done > 0 ? elapsed / done * left : 0;
  double lb = 0;
  for (double v : m.load_max_over_mean) lb = std::max(lb, v);
  char tail[256];
  std::snprintf(tail, sizeof tail, "loss %.4f%s lr %.2e gnorm %.3f %.0f tok/s mfu %.1f%% load %.2f eta %.0fs",
                m.loss, m.eval_loss >= 0 ? (" eval " + std::to_string(m.eval_loss).substr(0, 6)).c_str() : "", m.lr,
                m.grad_norm, m.tokens_per_s, 100 * m.mfu, lb, eta);
  if (bar_) {
    const int width = 30;
    int fill = m.total_steps ? (int)(width * m.step / m.total_steps) : width;
    std::string bar(fill, '#');
    bar.resize(width, '.');
    std::fprintf(stderr, "\r[%s] %lld/%lld %s   ", bar.c_str(), (long long)m.step, (long long)m.total_steps, tail);
    std::fflush(stderr);
  } else if (m.step % every_ == 0 || m.step == m.total_steps || m.eval_loss >= 0) {
    std::fprintf(stderr, "step %lld/%lld %s\n", (long long)m.step, (long long)m.total_steps, tail);
  }
}

}  // namespace trex::train
