// Measured routing as a planner input: the tokens each routed expert received, per MoE layer and
// step (trex train with [log] expert_loads = true writes them to metrics.jsonl), turned into the
// busiest expert-parallel rank's share of the expert GEMM rows and of the all-to-all bytes.
//
// With ep ranks holding contiguous expert ranges (rank r: experts [r E/ep, (r+1) E/ep)), the rows
// rank r computes in a layer are the sum of its experts' loads, and the dispatch / combine bytes
// it receives and sends are proportional to the same rows (tokens start evenly over the ranks). The
// slowest rank sets the layer's pace, so the planner's expert_load for a given ep is
//   mean over (step, layer) of  max_r rows_r / mean_r rows_r.
// A measurement with a different expert count than the planned model (a small trex run planned
// at DeepSeek-V3 size) is read as a density over the expert index: rank r holds the fraction
// [r/ep, (r+1)/ep) of it, experts split where a boundary falls inside one.
// A metrics.jsonl without per-expert loads falls back to its scalar expert_load_max_over_mean
// (mean over steps and layers): the busiest single expert, an upper bound on the busiest rank.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace trex::plan {

struct Routing {
  std::string source;                          // the file read
  int64_t experts = 0;                         // routed experts per layer in the measurement (0: scalar only)
  std::vector<std::vector<double>> loads;      // one row per (step, MoE layer): tokens per expert [experts]
  double scalar = 0;                           // fallback: mean busiest-expert load / mean load (>= 1)
  int64_t steps = 0;                           // records read
};

// Reads a trex metrics.jsonl (records with "expert_loads", else "expert_load_max_over_mean") or a
// JSON file {"expert_loads": [[per-expert tokens of a layer], ...]} (also a list of such objects or
// a bare list of lists). UserError naming the file and what is missing.
Routing read_routing(const std::string& path);

// The busiest rank's rows over the mean rank's, for one layer's per-expert loads split over ep
// ranks (1 for ep = 1 or no tokens).
double busiest_rank_share(const std::vector<double>& load, int64_t ep);

// The planner's expert_load for ep ranks: mean of busiest_rank_share over the measured (step,
// layer) rows; the scalar fallback when there are no per-expert loads; at least 1.
double routing_expert_load(const Routing& r, int64_t ep);

// One line for the report: what was read and how it is used.
std::string routing_summary(const Routing& r, int64_t ep, int64_t model_experts);

}  // namespace trex::plan
