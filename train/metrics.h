// Run metrics: one JSON object per step in RUN_DIR/metrics.jsonl (loss, lr, grad norm,
// tokens/s, MFU, expert load balance per MoE layer, eval loss when measured, the DeepSeek-V3.2
// indexer loss and top-k recall when it trains, "skipped" and
// "spike" flags when set), and a live view on
// stderr: a progress bar with ETA on a terminal, plain lines otherwise.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

namespace trex::train {

struct StepMetrics {
  int64_t step = 0, total_steps = 0, tokens = 0;
  double loss = 0, ce = 0, aux = 0, lr = 0, grad_norm = 0, ms = 0, tokens_per_s = 0, mfu = 0;
  std::vector<double> load_max_over_mean;  // per MoE layer
  double eval_loss = -1;                   // < 0: not measured this step
  // DeepSeek-V3.2 with train.indexer_loss_weight > 0 (else < 0: not reported): the indexer's KL loss
  // (summed over layers) and the main attention's mass inside the indexer's top-k (mean).
  double indexer_loss = -1, indexer_recall = -1;
  bool skipped = false;                    // NaN / Inf loss or gradient: no update made
  bool spike = false;                      // loss spike against the running window (train/loss_spikes.h)
  double loss_z = 0;                       // with spike: (loss - window mean) / window std
  double comm_ms = -1;                     // data parallel: exposed communication of rank 0 (< 0: one rank)
};

class MetricsLog {
 public:
  // progress: "auto" (bar when stderr is a terminal), "bar", "lines".
  MetricsLog(const std::string& run_dir, const std::string& progress, int64_t every, bool append);
  ~MetricsLog();
  void step(const StepMetrics& m);
  void message(const std::string& s);
  // fsyncs metrics.jsonl (io/atomic_file.h), so the lines of the steps a checkpoint holds survive
  // a power loss with it. The file is appended one line per step, not rewritten atomically.
  void sync();

 private:
  std::string path_;
  FILE* f_ = nullptr;
  bool bar_ = false;
  int64_t every_ = 1;
  double t0_ms_ = 0;
  int64_t first_step_ = -1;
};

}  // namespace trex::train
