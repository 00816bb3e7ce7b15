// `trex plan --cluster cpu-this` counts memory as trex's own engine does (plan/memory.h,
// ClusterSpec::engine_memory = train::layout_memory, as the CLI installs it): a layout's memory per
// device is what the start-up memory check of `trex train` computes for the same run written as a
// run config (train/preflight.h), so a plan that fits is a run the check lets start, and
// `--longest-context` answers with a seq that trains here.
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include "core/error.h"
#include "plan/calibration.h"
#include "plan/context.h"
#include "plan/memory.h"
#include "tests/tiny_configs.h"
#include "train/preflight.h"
#include "train/run_config.h"

using namespace trex;
using json = nlohmann::json;

namespace {

// A run of `model` as trex train reads it: bf16, B rows of T tokens, MTP trained where the model
// has MTP blocks, the layout's recompute and parallel sizes.
train::RunConfig run_of(const json& model, int64_t B, int64_t T, const std::string& recompute, int64_t cp = 1,
                        int64_t tp = 1, int64_t ep = 1, int64_t pp = 1) {
  json j = {{"model", model},
            {"data", {{"seq_len", T}}},
            {"train",
             {{"batch_size", B},
              {"precision", "bf16"},
              {"recompute", recompute == "mlp" || recompute == "selective+mlp" ? "selective" : recompute},
              {"mtp_loss_weight", model.value("num_nextn_predict_layers", 0) > 0 ? 0.3 : 0.0}}},
            {"parallel", {{"cp", cp}, {"tp", tp}, {"ep", ep}, {"pp", pp}, {"sequence_parallel", tp > 1}}}};
  if (recompute == "mlp") j["train"]["recompute_modules"] = {"moe_act", "shared_experts"};
  if (recompute == "selective+mlp") j["train"]["recompute_modules"] = {"moe", "moe_act", "shared_experts"};
  return train::parse_run_config(j, "run.toml");
}

plan::Layout layout_of(const train::RunConfig& rc, const std::string& recompute, int64_t dp) {
  const auto& p = rc.parallel;
  const std::string s = "dp=" + std::to_string(dp) + ",cp=" + std::to_string(p.cp) + ",tp=" + std::to_string(p.tp) +
                        ",pp=" + std::to_string(p.pp) +
                        ",ep=" + std::to_string(p.ep) + ",mbs=" + std::to_string(rc.train.batch_size) +
                        ",gbs=" + std::to_string(rc.train.batch_size * dp) + ",seq=" + std::to_string(rc.data.seq_len) +
                        ",recompute=" + recompute + ",mtp=" + (rc.train.mtp_loss_weight > 0 ? "1" : "0");
  return plan::parse_layout(s, plan::Layout{});
}

plan::ClusterSpec cpu_this() {
  plan::ClusterSpec s = plan::cpu_spec_from_calibration(plan::default_calibration());
  s.engine_memory = train::layout_memory;
  return s;
}

struct Model {
  const char* name;
  json cfg;
};

std::vector<Model> models() {
  json v4 = trex::testing::tiny_v4();
  v4["sliding_window"] = 7;
  v4["compress_rates"] = {{"compressed_sparse_attention", 3}, {"heavily_compressed_attention", 5}};
  return {{"tiny_v3 + MTP", trex::testing::tiny_v3_mtp(1)}, {"tiny_v32", trex::testing::tiny_v32()}, {"tiny_v4", v4}};
}

}  // namespace

// The planner's layout against the run config a user writes for it: recompute none / selective /
// full / mlp / selective+mlp, context parallel 2 and 3 (rows of 132 tokens: chunks of 33 and 22),
// tensor parallel 3 (sequence parallel), expert parallel 5 over dp 5, pipeline parallel 2 (stages
// of 2 and 1 layers), where the model allows them; every part of every pipeline rank equal to the
// check's estimate (the largest stage's).
TEST(PlanEngineMemory, CpuThisIsTheStartupCheck) {
  const plan::ClusterSpec s = cpu_this();
  ASSERT_TRUE(s.runs_trex);
  EXPECT_DOUBLE_EQ(s.reserved_bytes, kRuntimeBytes);  // the check's allowance for the rest of the process
  struct Par {
    int64_t cp, tp, ep, dp, pp;
  };
  int checked = 0;
  for (const Model& m : models())
    for (const char* rec : {"none", "selective", "full", "mlp", "selective+mlp"})
      for (const Par& p : {Par{1, 1, 1, 1, 1}, Par{2, 1, 1, 1, 1}, Par{3, 1, 1, 1, 1}, Par{1, 3, 1, 1, 1},
                           Par{1, 1, 5, 5, 1}, Par{1, 1, 1, 1, 2}}) {
        const std::string what = std::string(m.name) + " recompute " + rec + " cp " + std::to_string(p.cp) + " tp " +
                                 std::to_string(p.tp) + " ep " + std::to_string(p.ep) + " pp " + std::to_string(p.pp);
        const int64_t ranks = p.dp * p.cp * p.tp * p.pp;
        train::RunConfig rc;
        try {
          rc = run_of(m.cfg, 2, 132, rec, p.cp, p.tp, p.ep, p.pp);
          (void)train::resolve_parallel(rc, (int)ranks);
        } catch (const UserError&) {
          continue;  // a layout the engine refuses for this model (heads, experts, dense columns)
        }
        const plan::ArchModel a = plan::arch_from_config(rc.model, m.name);
        plan::Layout l = layout_of(rc, rec, p.dp);
        try {
          plan::validate_layout(l, a, ranks);
        } catch (const UserError& e) {
          ADD_FAILURE() << what << ": the engine runs it, the planner refuses: " << e.what();
          continue;
        }
        const plan::MemoryReport r = plan::plan_memory(a, s, l);
        const train::MemoryEstimate e = train::estimate_train_memory(rc, (int)ranks);
        EXPECT_TRUE(r.engine) << what;
        for (const plan::RankMemory& rm : r.ranks) {
          EXPECT_DOUBLE_EQ(rm.params, e.weights) << what;
          EXPECT_DOUBLE_EQ(rm.grads, e.grads) << what;
          EXPECT_DOUBLE_EQ(rm.optimizer, e.optimizer) << what;
          EXPECT_DOUBLE_EQ(rm.activations, e.activations) << what;
          EXPECT_DOUBLE_EQ(rm.buffers, e.buffers) << what;
        }
        EXPECT_DOUBLE_EQ(r.peak().total() + s.reserved_bytes, e.total()) << what;
        ++checked;
      }
  EXPECT_EQ(checked, 75);  // 90 less tp 3 on V3 / V3.2 (50 dense columns) and ep 5 on V3.2 (6 experts)
}

// Layouts trex's engine does not run keep the planner's formulas: DualPipe, expert tensor
// parallel, ZeRO 0 and 3.
TEST(PlanEngineMemory, OtherLayoutsKeepTheFormulas) {
  const plan::ClusterSpec s = cpu_this();
  const train::RunConfig rc = run_of(models()[2].cfg, 1, 90, "none");
  const plan::ArchModel a = plan::arch_from_config(rc.model, "tiny_v4");
  const plan::Layout base = layout_of(rc, "none", 1);
  EXPECT_TRUE(plan::plan_memory(a, s, base).engine);
  for (const char* extra : {"pp=3,schedule=dualpipe", "dp=5,ep=5,etp=3,tp=3", "zero=0", "zero=3"}) {
    plan::Layout l = plan::parse_layout(extra, base);
    EXPECT_FALSE(plan::plan_memory(a, s, l).engine) << extra;
  }
  plan::ClusterSpec no_hook = s;
  no_hook.engine_memory = nullptr;
  EXPECT_FALSE(plan::plan_memory(a, no_hook, base).engine);
}

// --longest-context on cpu-this: at each cp size's answer the start-up check's estimate fits the
// device, and at the next multiple it does not.
TEST(PlanEngineMemory, LongestContextIsWhatTheCheckAdmits) {
  plan::ClusterSpec s = cpu_this();
  s.mem_bytes = s.reserved_bytes + 96.0 * 1024 * 1024;  // a small device: answers of a few thousand tokens
  for (const Model& m : models()) {
    const train::RunConfig base = run_of(m.cfg, 1, 90, "full");
    const plan::ArchModel a = plan::arch_from_config(base.model, m.name);
    plan::Layout lay = layout_of(base, "full", 1);
    lay.dp = 0, lay.gbs = 0;
    const plan::ContextResult res = plan::longest_context(a, s, 3, lay, 30, 1 << 20);
    ASSERT_EQ(res.rows.size(), 2u) << m.name;  // cp 1 (dp 3) and cp 3
    for (const plan::ContextRow& row : res.rows) {
      ASSERT_GT(row.seq, 0) << m.name << " cp " << row.cp;
      const int64_t q = std::lcm<int64_t>(30, 2 * row.cp), ranks = 3;
      for (int64_t seq : {row.seq, row.seq + q}) {
        const train::RunConfig rc = run_of(m.cfg, 1, seq, "full", row.cp);
        const double total = train::estimate_train_memory(rc, (int)ranks).total();
        if (seq == row.seq) EXPECT_LE(total, s.mem_bytes) << m.name << " cp " << row.cp << " seq " << seq;
        else EXPECT_GT(total, s.mem_bytes) << m.name << " cp " << row.cp << " seq " << seq;
      }
    }
  }
}

// The cpu-this device's memory is what a process could take when the machine was calibrated
// (memory.available_gb: MemAvailable, what the check compares with), not the physical total; a
// calibration without it keeps memory.gb. `trex bench calibrate` writes both, and they round-trip.
TEST(PlanEngineMemory, DeviceMemoryIsTheAvailable) {
  json j = {{"version", 1}, {"peak", {{"bf16_gflops", 150.0}}}, {"memory", {{"gb", 64.0}, {"bandwidth_gbs", 20.0}}}};
  EXPECT_DOUBLE_EQ(plan::cpu_spec_from_calibration(plan::parse_calibration(j, "cal.json")).mem_bytes, 64e9);
  j["memory"]["available_gb"] = 61.5;
  const plan::Calibration c = plan::parse_calibration(j, "cal.json");
  EXPECT_DOUBLE_EQ(plan::cpu_spec_from_calibration(c).mem_bytes, 61.5e9);
  const plan::Calibration back = plan::parse_calibration(plan::calibration_to_json(c), "back.json");
  EXPECT_DOUBLE_EQ(back.mem_available_gb, 61.5);
  j["memory"]["available_gb"] = 70.0;  // never above the machine's memory
  EXPECT_DOUBLE_EQ(plan::cpu_spec_from_calibration(plan::parse_calibration(j, "cal.json")).mem_bytes, 64e9);
}
