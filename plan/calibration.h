// Calibration of the planner to the machine at hand: a JSON file that `trex bench` writes with
// this machine's measured peaks, memory bandwidth, per-op efficiencies and MPI link figures, from
// which the "cpu-this" cluster spec is built. Until a file exists, a default with a clear note
// stands in (the planner then says its CPU figures are not measured).
//
// File format (version 1; every figure optional except peak.bf16_gflops):
// {
//   "version": 1, "written_by": "trex bench ...", "machine": "...", "isa": "avx512",
//   "threads": 2, "ranks_per_node": 1,
//   "peak": {"bf16_gflops": 180.0, "fp32_gflops": 190.0},
//   "memory": {"gb": 23.0, "bandwidth_gbs": 15.0},
//   "efficiency": {"gemm": 0.87, "grouped_gemm": 0.6, "attention": 0.4, "memory": 0.7, ...},
//   "network": {"intra_node_gbs": 5.0, "intra_node_latency_us": 2.0,
//               "inter_node_gbs": 1.25, "inter_node_latency_us": 50.0},
//   "cost": {"price_per_device_hour": 0.1, "power_w": 150}
// }
// Efficiency keys are those of plan::Efficiency. Peaks and memory are for the whole machine;
// with ranks_per_node = r each planner device is one rank: 1/r of them.
#pragma once
#include <map>
#include <string>
#include <nlohmann/json_fwd.hpp>
#include "plan/spec.h"

namespace trex::plan {

struct Calibration {
  std::string path;       // file it was read from; "" for the built-in default
  bool measured = false;  // false: the built-in default, not a measurement of this machine
  std::string note, machine, isa, written_by;
  int threads = 0, ranks_per_node = 1;
  double bf16_gflops = 0, fp32_gflops = 0;
  double mem_gb = 0, mem_bw_gbs = 0;
  // Memory a process could take when calibrated (MemAvailable, at most mem_gb: what trex train's
  // start-up check compares with); 0: not measured, mem_gb stands. The cpu-this device's memory.
  double mem_available_gb = 0;
  std::map<std::string, double> efficiency;  // plan::Efficiency field name -> fraction
  double intra_node_gbs = 0, intra_node_latency_us = 0, inter_node_gbs = 0, inter_node_latency_us = 0;
  double price_per_device_hour = 0, power_w = 0;
};

// $TREX_CALIBRATION if set, else $HOME/.cache/trex/calibration.json.
std::string default_calibration_path();
Calibration default_calibration();
Calibration parse_calibration(const nlohmann::json& j, const std::string& where);
Calibration load_calibration(const std::string& path);
// `path` if given (must exist), else the default path if that file exists, else the default.
Calibration find_calibration(const std::string& path);
nlohmann::json calibration_to_json(const Calibration& c);
void save_calibration(const Calibration& c, const std::string& path);  // creates parent folders
ClusterSpec cpu_spec_from_calibration(const Calibration& c);

}  // namespace trex::plan
