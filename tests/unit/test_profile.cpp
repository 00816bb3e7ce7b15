// `trex bench step --profile`'s breakdown (core/profile.h Profiler::print_breakdown): on real
// training steps of tiny V3 and V4 models (with and without full recompute), the model's
// top-level regions plus the time between them make step.forward_backward, the trainer's regions
// plus the rest make the step, every decoder layer appears once forward and once backward, and a
// recompute's replayed layer is not timed twice.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/profile.h"
#include "core/rng.h"
#include "model/model.h"
#include "tests/tiny_configs.h"
#include "train/optimizer.h"
#include "train/trainer.h"

using namespace trex;
using nlohmann::json;
using trex::testing::tiny_v3;
using trex::testing::tiny_v4;

namespace {

// Rows "name  ms  share%" of the breakdown, by name (indented rows keep their indent).
std::map<std::string, double> breakdown(const Profiler& p, int steps, double step_ms, std::string* text) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  p.print_breakdown(f, steps, step_ms);
  std::fclose(f);
  *text = std::string(buf, len);
  std::free(buf);
  std::map<std::string, double> rows;
  std::istringstream in(*text);
  std::string line;
  while (std::getline(in, line)) {
    const size_t pct = line.rfind('%');
    if (pct == std::string::npos) continue;
    // ... name (may hold spaces) | ms | share%
    const size_t s2 = line.find_last_of(' ', pct);
    const size_t e1 = line.find_last_not_of(' ', s2);
    const size_t s1 = line.find_last_of(' ', e1);
    const std::string name = line.substr(0, line.find_last_not_of(' ', s1) + 1);
    rows[name] = std::stod(line.substr(s1 + 1, e1 - s1));
  }
  return rows;
}

void check(const json& mj, model::Recompute rc) {
  const model::ModelConfig cfg = model::parse_config(mj, "tiny");
  model::Model m(cfg, kern::Prec::F32, {0.01, cfg.is_v4() ? 0.3 : 0.0, rc});
  m.init_random(5);
  train::AdamW opt(m, train::AdamWConfig{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f});
  const int64_t B = 2, T = 19;
  std::vector<int32_t> ids(B * T), tg(B * T);
  Rng r(1);
  for (auto& v : ids) v = (int32_t)(r.next_u64() % cfg.vocab_size);
  for (auto& v : tg) v = (int32_t)(r.next_u64() % cfg.vocab_size);
  Profiler prof;
  m.prof = &prof;
  const int steps = 2;
  double total = 0;
  for (int s = 0; s < steps; ++s) {
    std::vector<model::Batch> micro{{B, T, ids.data(), tg.data(), nullptr, nullptr}};
    total += train::trainer_step(m, opt, micro, 1e-3f, 0.01f, &prof).ms;
  }
  std::string text;
  const auto rows = breakdown(prof, steps, total / steps, &text);
  SCOPED_TRACE(text);
  const double fb = rows.at("step.forward_backward");
  double inner = 0, trainer = 0;
  int layers_fwd = 0, layers_bwd = 0;
  for (const auto& [name, v] : rows) {
    EXPECT_GE(v, -0.05) << name;  // parts never exceed their parent (0.05 ms: print rounding)
    if (name.rfind("  layer.", 0) == 0) {
      layers_fwd += name.find(".fwd") != std::string::npos;
      layers_bwd += name.find(".bwd") != std::string::npos;
    } else if (name.rfind("  ", 0) == 0) {
      inner += v;
    } else if (name.rfind("step.", 0) == 0) {
      trainer += v;
    }
  }
  EXPECT_NEAR(inner, fb, 0.05 * 8);  // each printed row rounds to 0.1 ms
  EXPECT_NEAR(trainer + rows.at("outside the trainer's regions"), rows.at("total"), 0.05 * 5);
  EXPECT_NEAR(rows.at("total"), total / steps, 0.05);
  const int64_t L = m.cfg.num_hidden_layers + (m.cfg.is_v4() ? m.cfg.v4.mtp_layers : 0);
  EXPECT_EQ(layers_fwd, L);
  EXPECT_EQ(layers_bwd, L);
  // The model's top-level regions are found, and a replayed layer's forward is not in them twice:
  // the forward regions stay below the forward's per-layer total.
  EXPECT_TRUE(rows.count(cfg.is_v4() ? "  fwd.attn" : "  fwd.mla"));
  EXPECT_TRUE(rows.count("  bwd.moe"));
  EXPECT_EQ(rows.count("  bwd.recompute"), rc == model::Recompute::Full ? 1u : 0u);
  double fwd_regions = 0, fwd_layers = 0;
  for (const auto& [name, v] : rows) {
    if (name.rfind("  fwd.", 0) == 0) fwd_regions += v;
    if (name.rfind("  layer.", 0) == 0 && name.find(".fwd") != std::string::npos) fwd_layers += v;
  }
  EXPECT_LE(fwd_regions, fwd_layers + 0.05 * 16);
}

}  // namespace

TEST(Profile, BreakdownAddsUpV3) {
  check(tiny_v3(), model::Recompute::None);
  check(tiny_v3(), model::Recompute::Full);
}

TEST(Profile, BreakdownAddsUpV4WithMtp) {
  check(tiny_v4(), model::Recompute::None);
  check(tiny_v4(), model::Recompute::Full);
}
