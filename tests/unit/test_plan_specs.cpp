// Planner cluster specs, calibration and cost: the compiled-in specs equal plan/specs/*.toml,
// malformed specs and calibrations are errors that name the key, cpu-this follows the
// calibration, and the cost arithmetic.
//
// To regenerate plan/builtin_specs.cpp after editing a spec file:
//   TREX_REGEN_SPECS=1 trex_tests --gtest_filter=PlanSpecs.BuiltinsEqualFiles   (from the repo root)
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>
#include "core/error.h"
#include "plan/calibration.h"
#include "plan/cost.h"
#include "plan/spec.h"

using namespace trex;
using namespace trex::plan;

namespace {

std::string read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void regenerate_builtin_specs() {
  std::ofstream o("plan/builtin_specs.cpp");
  o << "// The built-in cluster specs, compiled in: a copy of plan/specs/*.toml (test_plan_specs checks\n"
       "// that each string equals its file). After editing a spec file, regenerate this file with:\n"
       "//   TREX_REGEN_SPECS=1 trex_tests --gtest_filter=PlanSpecs.BuiltinsEqualFiles   (from the repo root)\n"
       "#include \"plan/spec.h\"\n\nnamespace trex::plan {\n\nnamespace {\nstruct Builtin {\n  const char* name;\n"
       "  const char* text;\n};\nconst Builtin kSpecs[] = {\n";
  for (const std::string& n : builtin_spec_names())
    o << "    {\"" << n << "\", R\"TOML(" << read("plan/specs/" + n + ".toml") << ")TOML\"},\n";
  o << "};\n}  // namespace\n\nstd::vector<std::string> builtin_spec_names() {\n  std::vector<std::string> n;\n"
       "  for (const Builtin& b : kSpecs) n.push_back(b.name);\n  return n;\n}\n\n"
       "const char* builtin_spec_text(const std::string& name) {\n  for (const Builtin& b : kSpecs)\n"
       "    if (name == b.name) return b.text;\n  return nullptr;\n}\n\n}  // namespace trex::plan\n";
}

std::string spec_error(const std::string& text) {
  try {
    parse_spec_toml(text, "x.toml");
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

const char* kMinimal = R"(
[device]
peak_bf16_tflops = 100
memory_gb = 10
memory_bandwidth_gbs = 1000
[network]
devices_per_node = 1
inter_node_gbs = 10
)";

}  // namespace

TEST(PlanSpecs, BuiltinsEqualFiles) {
  if (const char* e = std::getenv("TREX_REGEN_SPECS"); e && std::string(e) == "1") regenerate_builtin_specs();
  std::vector<std::string> names = builtin_spec_names();
  EXPECT_EQ(names, (std::vector<std::string>{"h800", "h100", "h200", "b200", "gb200-nvl72", "gb300-nvl72", "mi300x",
                                              "mi355x", "ascend-910c", "cloudmatrix384"}));
  for (const std::string& n : names) {
    const std::string path = "plan/specs/" + n + ".toml";
    ASSERT_TRUE(std::filesystem::exists(path)) << path << " (run from the repository root)";
    EXPECT_EQ(read(path), builtin_spec_text(n)) << n << ": regenerate plan/builtin_specs.cpp (see the top of this file)";
    ClusterSpec s = load_spec(n);
    EXPECT_EQ(s.name, n);
    EXPECT_GT(s.peak_bf16, 1e14);
    EXPECT_GT(s.mem_bytes, 1e10);
    EXPECT_GT(s.inter_bw, 0);
    EXPECT_GT(s.price_per_device_hour, 0);
    EXPECT_GT(s.power_w, 0);
  }
  ClusterSpec h = load_spec("h800");
  EXPECT_DOUBLE_EQ(h.peak_bf16, 989.4e12);
  EXPECT_DOUBLE_EQ(h.peak_fp8, 1978.9e12);
  EXPECT_EQ(h.devices_per_node, 8);
  EXPECT_DOUBLE_EQ(h.inter_bw, 50e9);
  EXPECT_DOUBLE_EQ(load_spec("ascend-910c").peak_fp8, 0);
  EXPECT_EQ(builtin_spec_text("nope"), nullptr);
}

TEST(PlanSpecs, ParseErrorsNameTheKey) {
  ClusterSpec s = parse_spec_toml(kMinimal, "x.toml");
  EXPECT_DOUBLE_EQ(s.intra_bw, s.inter_bw);  // one device per node: no intra-node tier
  EXPECT_DOUBLE_EQ(s.eff.goodput, 1.0);
  EXPECT_NE(spec_error(std::string(kMinimal) + "bogus = 1\n").find("unknown key 'bogus' in [network]"),
            std::string::npos);
  EXPECT_NE(spec_error(std::string(kMinimal) + "[efficiency]\ngemm = 1.5\n").find("gemm"), std::string::npos);
  EXPECT_NE(spec_error(std::string(kMinimal) + "[efficiency]\nspeed = 1\n").find("'speed'"), std::string::npos);
  EXPECT_NE(spec_error("[device]\nmemory_gb = 1\n").find("peak_bf16_tflops is required"), std::string::npos);
  EXPECT_NE(spec_error("[device\n").find("x.toml:"), std::string::npos);
  EXPECT_NE(spec_error(std::string(kMinimal) + "[cost]\npue = 0.5\n").find("pue"), std::string::npos);
  try {
    load_spec("no-such-cluster");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-cluster"), std::string::npos);
    EXPECT_NE(e.hint.find("h800"), std::string::npos);
  }
}

TEST(PlanSpecs, CalibrationDrivesCpuThis) {
  Calibration d = default_calibration();
  EXPECT_FALSE(d.measured);
  EXPECT_NE(d.note.find("NOT MEASURED"), std::string::npos);
  nlohmann::json j = {{"version", 1},
                      {"machine", "test box"},
                      {"threads", 4},
                      {"ranks_per_node", 2},
                      {"peak", {{"bf16_gflops", 400.0}, {"fp32_gflops", 300.0}}},
                      {"memory", {{"gb", 32.0}, {"bandwidth_gbs", 20.0}}},
                      {"efficiency", {{"gemm", 0.85}, {"attention", 0.3}}},
                      {"network", {{"intra_node_gbs", 8.0}}},
                      {"cost", {{"price_per_device_hour", 0.2}, {"power_w", 200.0}}}};
  Calibration c = parse_calibration(j, "cal.json");
  EXPECT_TRUE(c.measured);
  ClusterSpec s = cpu_spec_from_calibration(c);
  EXPECT_EQ(s.name, "cpu-this");
  EXPECT_DOUBLE_EQ(s.peak_bf16, 200e9);  // per rank: 2 ranks share the machine
  EXPECT_DOUBLE_EQ(s.mem_bytes, 16e9);
  EXPECT_DOUBLE_EQ(s.mem_bw, 10e9);
  EXPECT_EQ(s.devices_per_node, 2);
  EXPECT_DOUBLE_EQ(s.intra_bw, 8e9);
  EXPECT_DOUBLE_EQ(s.eff.gemm, 0.85);
  EXPECT_DOUBLE_EQ(s.eff.attention, 0.3);
  EXPECT_DOUBLE_EQ(s.price_per_device_hour, 0.1);
  // JSON round trip through a file and the default-path lookup.
  const std::string path = (std::filesystem::temp_directory_path() / "trex_test_cal" / "cal.json").string();
  save_calibration(c, path);
  Calibration back = load_calibration(path);
  EXPECT_DOUBLE_EQ(back.bf16_gflops, 400);
  EXPECT_EQ(back.ranks_per_node, 2);
  EXPECT_DOUBLE_EQ(back.efficiency.at("gemm"), 0.85);
  setenv("TREX_CALIBRATION", path.c_str(), 1);
  EXPECT_EQ(default_calibration_path(), path);
  EXPECT_TRUE(find_calibration("").measured);
  EXPECT_DOUBLE_EQ(load_spec("cpu-this").peak_bf16, 200e9);
  unsetenv("TREX_CALIBRATION");
  std::filesystem::remove_all(std::filesystem::path(path).parent_path());
  // Malformed calibrations name the problem.
  auto err = [](nlohmann::json x) {
    try {
      parse_calibration(x, "cal.json");
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(err({{"version", 1}}).find("'peak'"), std::string::npos);
  EXPECT_NE(err({{"peak", {{"bf16_gflops", 1.0}}}, {"efficiency", {{"gemm", 2.0}}}}).find("efficiency.gemm"),
            std::string::npos);
  EXPECT_NE(err({{"peak", {{"bf16_gflops", 1.0}}}, {"efficiency", {{"speed", 0.5}}}}).find("'speed'"),
            std::string::npos);
  EXPECT_NE(err({{"version", 2}, {"peak", {{"bf16_gflops", 1.0}}}}).find("version 2"), std::string::npos);
}

TEST(PlanSpecs, CostArithmetic) {
  ClusterSpec s = parse_spec_toml(std::string(kMinimal) + "[cost]\nprice_per_device_hour = 2\npower_w = 1000\npue = 1.2\n",
                                  "x.toml");
  Cost c = plan_cost(s, 8, 1000.0, 7.2e6);
  EXPECT_DOUBLE_EQ(c.dollars_per_hour, 16);
  EXPECT_DOUBLE_EQ(c.kw, 9.6);
  EXPECT_DOUBLE_EQ(c.tokens_per_dollar, 3.6e6 / 16);
  EXPECT_DOUBLE_EQ(c.tokens_per_kwh, 3.6e6 / 9.6);
  EXPECT_DOUBLE_EQ(c.run_hours, 2);
  EXPECT_DOUBLE_EQ(c.run_dollars, 32);
  EXPECT_DOUBLE_EQ(c.run_kwh, 19.2);
  Cost none = plan_cost(parse_spec_toml(kMinimal, "x.toml"), 8, 1000.0, 0);
  EXPECT_FALSE(none.priced);
  EXPECT_EQ(none.tokens_per_dollar, 0);
  EXPECT_EQ(none.run_hours, 0);
}
