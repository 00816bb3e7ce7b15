#include "plan/spec.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <toml++/toml.h>
#include "core/error.h"
#include "plan/calibration.h"

namespace trex::plan {

namespace {

const char* kHint = "fix the cluster spec (see plan/specs/h800.toml for every key)";

struct Section {
  const toml::table* t;
  std::string where, name;

  double num(const char* key, double def, bool required = false, double min = 0) const {
    const toml::node* n = t ? t->get(key) : nullptr;
    if (!n) {
      TREX_USER_CHECK(!required, kHint, where, ": [", name, "] ", key, " is required");
      return def;
    }
    double v;
    if (auto i = n->as_integer()) v = (double)i->get();
    else if (auto f = n->as_floating_point()) v = f->get();
    else TREX_USER_FAIL(kHint, where, ": [", name, "] ", key, " must be a number");
    TREX_USER_CHECK(v >= min, kHint, where, ": [", name, "] ", key, " must be >= ", min, ", got ", v);
    return v;
  }
  void only(std::initializer_list<const char*> keys) const {
    if (!t) return;
    for (auto&& [k, v] : *t) {
      bool ok = false;
      std::string allowed;
      for (const char* a : keys) {
        ok = ok || k.str() == a;
        allowed += std::string(allowed.empty() ? "" : ", ") + a;
      }
      TREX_USER_CHECK(ok, "allowed keys in [" + name + "]: " + allowed, where, ": unknown key '", k.str(),
                      "' in [", name, "]");
    }
  }
};

std::string str_of(const toml::table& t, const char* key, const std::string& where) {
  const toml::node* n = t.get(key);
  if (!n) return "";
  auto s = n->as_string();
  TREX_USER_CHECK(s, kHint, where, ": ", key, " must be a string");
  return s->get();
}

}  // namespace

ClusterSpec parse_spec_toml(const std::string& text, const std::string& where) {
  toml::table root;
  try {
    root = toml::parse(text, where);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    TREX_USER_FAIL("fix the TOML syntax", where, ":", b.line, ":", b.column, ": ", e.description());
  }
  for (auto&& [k, v] : root) {
    static const char* top[] = {"name", "description", "source", "note", "device", "network", "cost", "efficiency", "host"};
    bool ok = false;
    for (const char* a : top) ok = ok || k.str() == a;
    TREX_USER_CHECK(ok, "top-level keys: name, description, source, note, [device], [network], [cost], [efficiency], [host]",
                    where, ": unknown top-level key '", k.str(), "'");
  }
  ClusterSpec s;
  s.name = str_of(root, "name", where);
  s.description = str_of(root, "description", where);
  s.source = str_of(root, "source", where);
  s.note = str_of(root, "note", where);
  if (s.name.empty()) s.name = where;

  Section dev{root["device"].as_table(), where, "device"};
  dev.only({"peak_bf16_tflops", "peak_fp8_tflops", "peak_fp4_tflops", "mx_formats", "memory_gb",
            "memory_bandwidth_gbs", "reserved_gb", "sustained_clock", "sm_count", "tile_m", "tile_n", "tile_sms",
            "sparse_attention_slot_pad"});
  s.peak_bf16 = dev.num("peak_bf16_tflops", 0, true, 1e-6) * 1e12;
  s.peak_fp8 = dev.num("peak_fp8_tflops", 0) * 1e12;
  s.peak_fp4 = dev.num("peak_fp4_tflops", 0) * 1e12;
  if (const toml::node* n = dev.t ? dev.t->get("mx_formats") : nullptr) {
    auto b = n->as_boolean();
    TREX_USER_CHECK(b, kHint, where, ": [device] mx_formats must be true or false");
    s.mx_formats = b->get();
  }
  s.mem_bytes = dev.num("memory_gb", 0, true, 1e-6) * 1e9;
  s.mem_bw = dev.num("memory_bandwidth_gbs", 0, true, 1e-6) * 1e9;
  s.reserved_bytes = dev.num("reserved_gb", 0) * 1e9;
  TREX_USER_CHECK(s.reserved_bytes < s.mem_bytes, kHint, where, ": [device] reserved_gb must be below memory_gb");
  s.sustained_clock = dev.num("sustained_clock", 1.0, false, 0.05);
  TREX_USER_CHECK(s.sustained_clock <= 1, kHint, where, ": [device] sustained_clock is a share of the spec's rates, <= 1; got ",
                  s.sustained_clock);
  s.sm_count = (int64_t)dev.num("sm_count", 0);
  s.tile_m = (int64_t)dev.num("tile_m", (double)s.tile_m, false, 1);
  s.tile_n = (int64_t)dev.num("tile_n", (double)s.tile_n, false, 1);
  s.tile_sms = (int64_t)dev.num("tile_sms", (double)s.tile_sms, false, 1);
  s.sparse_slot_pad = (int64_t)dev.num("sparse_attention_slot_pad", 0, false, 0);
  TREX_USER_CHECK(s.sm_count == 0 || s.sm_count >= s.tile_sms, kHint, where,
                  ": [device] sm_count (", s.sm_count, ") must be at least tile_sms (", s.tile_sms, ")");

  Section net{root["network"].as_table(), where, "network"};
  net.only({"devices_per_node", "intra_node_gbs", "intra_node_latency_us", "inter_node_gbs", "inter_node_latency_us"});
  s.devices_per_node = (int64_t)net.num("devices_per_node", 1, true, 1);
  s.intra_bw = net.num("intra_node_gbs", 0, s.devices_per_node > 1, 1e-6) * 1e9;
  s.intra_lat = net.num("intra_node_latency_us", 0) * 1e-6;
  s.inter_bw = net.num("inter_node_gbs", 0, true, 1e-6) * 1e9;
  s.inter_lat = net.num("inter_node_latency_us", 0) * 1e-6;
  if (s.intra_bw <= 0) s.intra_bw = s.inter_bw;

  Section cost{root["cost"].as_table(), where, "cost"};
  cost.only({"price_per_device_hour", "power_w", "pue"});
  s.price_per_device_hour = cost.num("price_per_device_hour", 0);
  s.power_w = cost.num("power_w", 0);
  s.pue = cost.num("pue", 1.0, false, 1.0);

  Section e{root["efficiency"].as_table(), where, "efficiency"};
  e.only({"gemm", "gemm_fp8", "grouped_gemm", "grouped_gemm_fp8", "attention", "sparse_attention", "indexer",
          "head", "optimizer", "gemm_fp4", "grouped_gemm_fp4", "memory", "quantize", "swizzle", "net_intra", "net_inter",
          "overlap", "comm_compute_share", "goodput"});
  Efficiency& f = s.eff;
  auto frac = [&](const char* k, double def, double min = 1e-3) {
    double v = e.num(k, def, false, min);
    TREX_USER_CHECK(v <= 1.0, kHint, where, ": [efficiency] ", k, " is a fraction of a peak, <= 1; got ", v);
    return v;
  };
  f.gemm = frac("gemm", f.gemm);
  f.gemm_fp8 = frac("gemm_fp8", f.gemm_fp8);
  f.grouped_gemm = frac("grouped_gemm", f.grouped_gemm);
  f.grouped_gemm_fp8 = frac("grouped_gemm_fp8", f.grouped_gemm_fp8);
  f.attention = frac("attention", f.attention);
  f.sparse_attention = frac("sparse_attention", f.sparse_attention, 0);
  f.indexer = frac("indexer", f.indexer, 0);
  f.optimizer = frac("optimizer", f.optimizer, 0);
  f.head = frac("head", f.head, 0);
  f.gemm_fp4 = frac("gemm_fp4", f.gemm_fp4, 0);
  f.grouped_gemm_fp4 = frac("grouped_gemm_fp4", f.grouped_gemm_fp4, 0);
  f.memory = frac("memory", f.memory);
  f.quantize = frac("quantize", f.quantize, 0);
  f.swizzle = frac("swizzle", f.swizzle, 0);
  f.net_intra = frac("net_intra", f.net_intra);
  f.net_inter = frac("net_inter", f.net_inter);
  f.overlap = frac("overlap", f.overlap, 0);
  f.comm_compute_share = frac("comm_compute_share", f.comm_compute_share, 0);
  TREX_USER_CHECK(f.comm_compute_share < 1, kHint, where, ": [efficiency] comm_compute_share must be < 1");
  f.goodput = frac("goodput", f.goodput);

  // [host]: the CPU that launches the kernels (plan/host.h); absent = not modelled.
  Section h{root["host"].as_table(), where, "host"};
  h.only({"cpu", "op_us", "launch_us"});
  if (h.t) {
    s.host.cpu = str_of(*h.t, "cpu", where);
    TREX_USER_CHECK(s.host.cpu == "x86" || s.host.cpu == "grace" || s.host.cpu == "arm",
                    "set [host] cpu to x86, grace or arm (the CPU kind that launches the kernels)", where,
                    ": [host] cpu = '", s.host.cpu, "' is not one of x86, grace, arm");
    s.host.op_s = h.num("op_us", 0, true, 0) * 1e-6;
    s.host.launch_s = h.num("launch_us", 0, true, 0) * 1e-6;
    TREX_USER_CHECK(s.host.op_s <= 1e-3 && s.host.launch_s <= 1e-3, kHint, where,
                    ": [host] op_us and launch_us are microseconds per launch, at most 1000; got ", s.host.op_s * 1e6,
                    " and ", s.host.launch_s * 1e6);
  }
  return s;
}

ClusterSpec load_spec(const std::string& name, const std::string& calibration) {
  if (name == "cpu-this") return cpu_spec_from_calibration(find_calibration(calibration));
  if (const char* text = builtin_spec_text(name)) return parse_spec_toml(text, name + " (built-in)");
  std::string names = "cpu-this";
  for (auto& n : builtin_spec_names()) names += ", " + n;
  TREX_USER_CHECK(std::filesystem::is_regular_file(name), "built-in clusters: " + names + "; or a TOML spec file",
                  "cluster '", name, "' is neither a built-in name nor a file");
  std::ifstream f(name);
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_spec_toml(ss.str(), name);
}

}  // namespace trex::plan
