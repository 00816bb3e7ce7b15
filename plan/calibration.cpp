#include "plan/calibration.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include "core/error.h"
#include "core/host_memory.h"

namespace trex::plan {

using nlohmann::json;

namespace {

const char* kEffKeys[] = {"gemm",      "gemm_fp8",  "grouped_gemm", "grouped_gemm_fp8",   "attention",
                          "sparse_attention", "indexer", "head", "optimizer", "memory", "net_intra", "net_inter",
                          "overlap",   "comm_compute_share", "goodput"};

double* eff_field(Efficiency& e, const std::string& k) {
  if (k == "gemm") return &e.gemm;
  if (k == "gemm_fp8") return &e.gemm_fp8;
  if (k == "grouped_gemm") return &e.grouped_gemm;
  if (k == "grouped_gemm_fp8") return &e.grouped_gemm_fp8;
  if (k == "attention") return &e.attention;
  if (k == "sparse_attention") return &e.sparse_attention;
  if (k == "indexer") return &e.indexer;
  if (k == "optimizer") return &e.optimizer;
  if (k == "head") return &e.head;
  if (k == "memory") return &e.memory;
  if (k == "net_intra") return &e.net_intra;
  if (k == "net_inter") return &e.net_inter;
  if (k == "overlap") return &e.overlap;
  if (k == "comm_compute_share") return &e.comm_compute_share;
  if (k == "goodput") return &e.goodput;
  return nullptr;
}

}  // namespace

std::string default_calibration_path() {
  if (const char* p = std::getenv("TREX_CALIBRATION"); p && *p) return p;
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.cache/trex/calibration.json";
}

Calibration default_calibration() {
  Calibration c;
  c.measured = false;
  c.note =
      "NOT MEASURED: built-in placeholder for a 2-core AVX-512 machine; run `trex bench` to write a calibration "
      "file (plan/calibration.h) before trusting cpu-this figures";
  c.machine = "unknown (default)";
  c.isa = "avx512";
  c.threads = 2;
  c.bf16_gflops = 150;
  c.fp32_gflops = 150;
  c.mem_gb = 16;
  c.mem_bw_gbs = 15;
  c.efficiency = {{"gemm", 0.80}, {"grouped_gemm", 0.60}, {"attention", 0.40}, {"memory", 0.60},
                  {"net_intra", 0.50}, {"net_inter", 0.50}, {"overlap", 0.80}, {"comm_compute_share", 0.0}};
  c.intra_node_gbs = 5;
  c.intra_node_latency_us = 2;
  c.inter_node_gbs = 1.25;  // 10 GbE
  c.inter_node_latency_us = 50;
  c.price_per_device_hour = 0.10;
  c.power_w = 150;
  return c;
}

Calibration parse_calibration(const json& j, const std::string& where) {
  const char* hint = "rewrite the calibration with `trex bench`, or fix the JSON (format in plan/calibration.h)";
  TREX_USER_CHECK(j.is_object(), hint, where, ": calibration must be a JSON object");
  TREX_USER_CHECK(j.value("version", 1) == 1, hint, where, ": calibration version ", j.value("version", 0),
                  " is not supported (expected 1)");
  Calibration c = default_calibration();
  c.path = where;
  c.measured = true;
  c.note = "measured: " + where;
  auto num = [&](const json& o, const char* k, double def, const std::string& sect) {
    if (!o.contains(k) || o[k].is_null()) return def;
    TREX_USER_CHECK(o[k].is_number() && o[k].get<double>() >= 0, hint, where, ": ", sect, k,
                    " must be a non-negative number, got ", o[k].dump());
    return o[k].get<double>();
  };
  c.written_by = j.value("written_by", std::string());
  c.machine = j.value("machine", std::string());
  c.isa = j.value("isa", std::string());
  c.threads = (int)num(j, "threads", 0, "");
  c.ranks_per_node = std::max(1, (int)num(j, "ranks_per_node", 1, ""));
  TREX_USER_CHECK(j.contains("peak") && j["peak"].is_object(), hint, where, ": 'peak' object is required");
  c.bf16_gflops = num(j["peak"], "bf16_gflops", 0, "peak.");
  TREX_USER_CHECK(c.bf16_gflops > 0, hint, where, ": peak.bf16_gflops is required and must be > 0");
  c.fp32_gflops = num(j["peak"], "fp32_gflops", c.bf16_gflops, "peak.");
  if (j.contains("memory")) {
    c.mem_gb = num(j["memory"], "gb", c.mem_gb, "memory.");
    c.mem_bw_gbs = num(j["memory"], "bandwidth_gbs", c.mem_bw_gbs, "memory.");
    c.mem_available_gb = num(j["memory"], "available_gb", 0, "memory.");
  }
  if (j.contains("efficiency")) {
    TREX_USER_CHECK(j["efficiency"].is_object(), hint, where, ": 'efficiency' must be an object");
    for (auto& [k, v] : j["efficiency"].items()) {
      Efficiency probe;
      TREX_USER_CHECK(eff_field(probe, k), "efficiency keys: gemm, gemm_fp8, grouped_gemm, grouped_gemm_fp8, "
                      "attention, sparse_attention, indexer, head, optimizer, memory, net_intra, net_inter, overlap, comm_compute_share, goodput",
                      where, ": unknown efficiency key '", k, "'");
      double x = num(j["efficiency"], k.c_str(), 0, "efficiency.");
      TREX_USER_CHECK(x <= 1.0, hint, where, ": efficiency.", k, " is a fraction (<= 1), got ", x);
      TREX_USER_CHECK(x > 0 || k == "overlap" || k == "comm_compute_share", hint, where, ": efficiency.", k,
                      " must be > 0 (the time model divides by it)");
      c.efficiency[k] = x;
    }
  }
  if (j.contains("network")) {
    const json& n = j["network"];
    c.intra_node_gbs = num(n, "intra_node_gbs", c.intra_node_gbs, "network.");
    c.intra_node_latency_us = num(n, "intra_node_latency_us", c.intra_node_latency_us, "network.");
    c.inter_node_gbs = num(n, "inter_node_gbs", c.inter_node_gbs, "network.");
    c.inter_node_latency_us = num(n, "inter_node_latency_us", c.inter_node_latency_us, "network.");
  }
  if (j.contains("cost")) {
    c.price_per_device_hour = num(j["cost"], "price_per_device_hour", c.price_per_device_hour, "cost.");
    c.power_w = num(j["cost"], "power_w", c.power_w, "cost.");
  }
  return c;
}

Calibration load_calibration(const std::string& path) {
  std::ifstream f(path);
  TREX_USER_CHECK(f.good(), "run `trex bench` to write one, or give an existing --calibration file", path,
                  ": cannot open calibration file");
  json j;
  try {
    j = json::parse(f);
  } catch (const json::exception& e) {
    TREX_USER_FAIL("rewrite the calibration with `trex bench`", path, ": not valid JSON: ", e.what());
  }
  return parse_calibration(j, path);
}

Calibration find_calibration(const std::string& path) {
  if (!path.empty()) return load_calibration(path);
  const std::string def = default_calibration_path();
  if (std::filesystem::is_regular_file(def)) return load_calibration(def);
  return default_calibration();
}

json calibration_to_json(const Calibration& c) {
  json j = {{"version", 1},
            {"written_by", c.written_by},
            {"machine", c.machine},
            {"isa", c.isa},
            {"threads", c.threads},
            {"ranks_per_node", c.ranks_per_node},
            {"peak", {{"bf16_gflops", c.bf16_gflops}, {"fp32_gflops", c.fp32_gflops}}},
            {"memory", {{"gb", c.mem_gb}, {"available_gb", c.mem_available_gb}, {"bandwidth_gbs", c.mem_bw_gbs}}},
            {"efficiency", json::object()},
            {"network",
             {{"intra_node_gbs", c.intra_node_gbs},
              {"intra_node_latency_us", c.intra_node_latency_us},
              {"inter_node_gbs", c.inter_node_gbs},
              {"inter_node_latency_us", c.inter_node_latency_us}}},
            {"cost", {{"price_per_device_hour", c.price_per_device_hour}, {"power_w", c.power_w}}}};
  for (auto& [k, v] : c.efficiency) j["efficiency"][k] = v;
  return j;
}

void save_calibration(const Calibration& c, const std::string& path) {
  std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  std::ofstream f(path);
  TREX_USER_CHECK(f.good(), "choose a writable path", path, ": cannot write calibration file");
  f << calibration_to_json(c).dump(2) << "\n";
}

ClusterSpec cpu_spec_from_calibration(const Calibration& c) {
  ClusterSpec s;
  const double r = (double)std::max(1, c.ranks_per_node);
  s.name = "cpu-this";
  s.description = "this machine as calibrated (" + (c.machine.empty() ? std::string("unknown CPU") : c.machine) +
                  ", " + std::to_string(c.threads) + " threads, " + std::to_string(c.ranks_per_node) +
                  " rank(s) per node; one device = one rank)";
  s.source = c.measured ? c.path : "built-in default calibration";
  s.note = c.note;
  s.peak_bf16 = c.bf16_gflops * 1e9 / r;
  s.peak_fp8 = 0;
  // What a training process can take (MemAvailable when calibrated), as trex train's start-up check counts.
  s.mem_bytes = (c.mem_available_gb > 0 ? std::min(c.mem_available_gb, c.mem_gb) : c.mem_gb) * 1e9 / r;
  s.mem_bw = c.mem_bw_gbs * 1e9 / r;
  s.reserved_bytes = kRuntimeBytes;  // the rest of a training process, as the start-up check counts it
  s.activation_bytes = 4;  // trex's CPU engine saves its activations in f32
  s.runs_trex = true;  // its memory: ClusterSpec::engine_memory where the CLI installs it
  s.replicated_f32_master = true;  // and keeps the f32 master on every data-parallel rank
  s.dp_reduce_temp = 1;            // OpenMPI's in-flight non-blocking reduce-scatter temporaries
  s.devices_per_node = c.ranks_per_node;
  s.intra_bw = c.intra_node_gbs * 1e9;
  s.intra_lat = c.intra_node_latency_us * 1e-6;
  s.inter_bw = c.inter_node_gbs * 1e9;
  s.inter_lat = c.inter_node_latency_us * 1e-6;
  s.price_per_device_hour = c.price_per_device_hour / r;
  s.power_w = c.power_w / r;
  for (const char* k : kEffKeys) {
    auto it = c.efficiency.find(k);
    if (it != c.efficiency.end()) *eff_field(s.eff, k) = it->second;
  }
  return s;
}

}  // namespace trex::plan
