// Run metrics: one JSON object per step in RUN_DIR/metrics.jsonl (loss, lr, grad norm,
// tokens/s, MFU, expert load balance per MoE layer ([log] expert_loads: also the tokens each
// expert received), eval loss when measured, the DeepSeek-V3.2
// indexer loss and top-k recall when it trains, "skipped" and
// "spike" flags when set), and a live view on
// stderr: a progress bar with ETA on a terminal, plain lines otherwise. A resumed run first cuts
// the file back to the step it resumed from, so every step has one line.
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
  // [log] expert_loads = true: per MoE layer [E], tokens routed to each expert over the global
  // batch, written as "expert_loads" (empty: not written).
  std::vector<std::vector<int64_t>> expert_loads;
  double eval_loss = -1;                   // < 0: not measured this step
  // DeepSeek-V3.2 with train.indexer_loss_weight > 0 (else < 0: not reported): the indexer's KL loss
  // (summed over layers) and the main attention's mass inside the indexer's top-k (mean).
  double indexer_loss = -1, indexer_recall = -1;
  bool skipped = false;                    // NaN / Inf loss or gradient: no update made
  bool spike = false;                      // loss spike against the running window (train/loss_spikes.h)
  double loss_z = 0;                       // with spike: (loss - window mean) / window std
  double comm_ms = -1;                     // data parallel: exposed communication of rank 0 (< 0: one rank)
};

// Cuts metrics.jsonl back to the records of steps <= `step` (a run resuming from that step's
// checkpoint): the records of later steps, which the resumed run writes again, and lines that are
// not a JSON record (the last line of a run killed while writing it) are dropped. Rewritten
// atomically (io/atomic_file.h) and only when something is dropped; a missing file is left
// missing. Returns the number of lines dropped.
int64_t truncate_metrics(const std::string& path, int64_t step);

// The records of a metrics.jsonl, one per step in step order: where a step appears more than once
// (files written before resumes cut the file back), the last line wins. A line that is not a JSON
// object with "step" and "loss" is a UserError naming the file and line, except a last line
// without its newline (a run killed while writing it), which is skipped.
std::vector<nlohmann::json> read_metrics(const std::string& path);

class MetricsLog {
 public:
  // progress: "auto" (bar when stderr is a terminal), "bar", "lines". resumed_step >= 0: the run
  // resumed from that step; the file is cut back to it (truncate_metrics) and appended to.
  // < 0: a fresh run, the file starts empty.
  MetricsLog(const std::string& run_dir, const std::string& progress, int64_t every, int64_t resumed_step);
  // Lines the resume cut from the file (0 on a fresh run).
  int64_t dropped() const { return dropped_; }
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
  int64_t dropped_ = 0;
};

}  // namespace trex::train
