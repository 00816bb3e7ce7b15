// trex plan: memory, step time, MFU and cost of a training run at cluster scale, before it is
// launched (plan/). One layout with --layout, or every valid layout ranked with --search.
//   trex plan --model deepseek-v3 --cluster h800 --devices 2048 --layout pp=16,ep=64 --tokens 10e9
//   trex plan --model CONFIG.json --cluster my_cluster.toml --devices 256 --search [--json]
//   trex plan --model deepseek-v3 --cluster h800 --devices 2048 --layout pp=16,ep=64 --routing RUN/metrics.jsonl
//   trex plan --model deepseek-v3 --cluster h800 --devices 256 --layout pp=8,ep=32,recompute=full --longest-context
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include "cli/commands.h"
#include "core/error.h"
#include "io/toml_json.h"
#include "plan/calibration.h"
#include "plan/context.h"
#include "plan/planner.h"
#include "plan/report.h"
#include "train/preflight.h"

namespace trex::cli {

namespace {

struct PlanOpts {
  std::string model, cluster, layout, calibration, routing;
  int64_t devices = 0;
  bool search = false, json = false, list = false, vary_devices = false, longest = false;
  int64_t context_step = 1024, context_max = int64_t{1} << 24;
  int top = 10;
  int64_t min_devices = 1;
  double tokens = 0;
};

void list_builtins() {
  std::printf("models:   ");
  for (auto& m : plan::builtin_model_names()) std::printf(" %s", m.c_str());
  std::printf("   (or a config.json, a model directory, a trex TOML run config)\nclusters:  cpu-this");
  for (auto& c : plan::builtin_spec_names()) std::printf(" %s", c.c_str());
  std::printf("   (or a TOML spec file; see plan/specs/h800.toml)\ncalibration for cpu-this: %s\n",
              plan::default_calibration_path().c_str());
}

// A trex TOML run config's [data] seq_len (where run configs keep it; [train] seq_len also read)
// and [train] batch_size become the default seq and mbs.
plan::Layout base_layout(const std::string& model) {
  plan::Layout l;
  namespace fs = std::filesystem;
  if (fs::path(model).extension() == ".toml" && fs::is_regular_file(model)) {
    nlohmann::json t = io::load_toml_as_json(model);
    if (t.contains("data") && t["data"].is_object() && t["data"].contains("seq_len") &&
        t["data"]["seq_len"].is_number_integer())
      l.seq = t["data"]["seq_len"].get<int64_t>();
    if (t.contains("train") && t["train"].is_object()) {
      const nlohmann::json& tr = t["train"];
      if (tr.contains("seq_len") && tr["seq_len"].is_number_integer()) l.seq = tr["seq_len"].get<int64_t>();
      if (tr.contains("batch_size") && tr["batch_size"].is_number_integer()) l.mbs = tr["batch_size"].get<int64_t>();
    }
  }
  return l;
}

void run_plan(const PlanOpts& o) {
  if (o.list) {
    list_builtins();
    return;
  }
  TREX_USER_CHECK(!o.model.empty() && !o.cluster.empty() && o.devices > 0,
                  "e.g. trex plan --model deepseek-v3 --cluster h800 --devices 2048 --layout pp=16,ep=64 "
                  "(trex plan --list shows the built-ins)",
                  "trex plan needs --model, --cluster and --devices");
  plan::ArchModel a = plan::resolve_model(o.model);
  plan::ClusterSpec s = plan::load_spec(o.cluster, o.calibration);
  if (s.runs_trex) s.engine_memory = train::layout_memory;  // memory as trex train's start-up check counts it
  plan::Layout base = plan::parse_layout(o.layout, base_layout(o.model));
  std::unique_ptr<plan::Routing> routing;
  if (!o.routing.empty()) {
    const std::vector<std::string> keys = plan::layout_keys(o.layout);
    TREX_USER_CHECK(std::find(keys.begin(), keys.end(), "expert_load") == keys.end(),
                    "give the expert imbalance once: either --routing FILE or expert_load= in --layout",
                    "trex plan: --routing ", o.routing, " and --layout expert_load=... both set the expert load");
    routing = std::make_unique<plan::Routing>(plan::read_routing(o.routing));
  }
  if (o.longest) {
    TREX_USER_CHECK(!o.search && o.routing.empty(), "run --longest-context alone (with --layout for tp, pp, ep, ...)",
                    "trex plan: --longest-context does not combine with --search or --routing");
    const plan::ContextResult r = plan::longest_context(a, s, o.devices, base, o.context_step, o.context_max);
    if (o.json) std::printf("%s\n", plan::context_to_json(r).dump(2).c_str());
    else std::fputs(plan::format_context(r).c_str(), stdout);
    return;
  }
  if (o.search) {
    plan::SearchOptions so;
    so.top = o.top;
    so.vary_devices = o.vary_devices;
    so.min_devices = o.min_devices;
    so.fixed = plan::layout_keys(o.layout);
    so.routing = routing.get();
    plan::SearchResult r = plan::search(a, s, o.devices, base, o.tokens, so);
    if (o.json) {
      std::printf("%s\n", plan::search_to_json(r).dump(2).c_str());
      return;
    }
    std::fputs(plan::format_search(r, s).c_str(), stdout);
    if (r.by_speed.empty()) return;
    const plan::Plan& top = r.by_speed.front();
    std::fputs(("\n" + plan::format_plan(top)).c_str(), stdout);
    if (routing && a.n_experts > 0) {  // the fastest layout under forced balance beside it
      plan::Layout forced = top.layout;
      forced.expert_load = 1.0;
      const plan::Plan b = plan::evaluate(a, s, top.devices, forced, o.tokens);
      std::fputs(("\n" + plan::format_routing_compare(b, top)).c_str(), stdout);
    }
    return;
  }
  plan::Plan p = plan::evaluate(a, s, o.devices, base, o.tokens, routing.get());
  if (routing && a.n_experts > 0) {  // forced balance beside the measured routing
    plan::Layout forced = base;
    forced.expert_load = 1.0;
    const plan::Plan b = plan::evaluate(a, s, o.devices, forced, o.tokens);
    if (o.json) std::printf("%s\n", plan::routing_compare_json(b, p).dump(2).c_str());
    else std::fputs((plan::format_plan(p) + "\n" + plan::format_routing_compare(b, p)).c_str(), stdout);
    return;
  }
  if (o.json) std::printf("%s\n", plan::plan_to_json(p).dump(2).c_str());
  else std::fputs(plan::format_plan(p).c_str(), stdout);
}

}  // namespace

void add_plan(CLI::App& app) {
  auto o = std::make_shared<PlanOpts>();
  auto* c = app.add_subcommand("plan", "memory, step time, MFU and cost of a run on a cluster, before launching it");
  c->add_option("--model", o->model,
                "built-in name (deepseek-v2, deepseek-v2-lite, deepseek-v3, deepseek-v3.2, deepseek-v4-flash, "
                "deepseek-v4-pro), config.json, model directory or trex TOML run config");
  c->add_option("--cluster", o->cluster, "built-in spec (trex plan --list shows them; cpu-this) or TOML file");
  c->add_option("--devices", o->devices, "number of devices (GPUs, NPU dies, or ranks for cpu-this)");
  c->add_option("--layout", o->layout,
                "dp=..,tp=..,pp=..,cp=..,ep=..,etp=..,mbs=..,gbs=..,seq=..,recompute=none|selective|full,zero=0-3,"
                "schedule=1f1b|dualpipe,vp=..,precision=bf16|fp8|fp8-tensor|mxfp8|mxfp4,overlap=ep+tp+dp+pp+cp|all|none,mtp=0|1,moments=f32|bf16,"
                "grads=f32|bf16,dedup=0|1,graphs=off|partial|full,param_gather=overlap|exposed,expert_load=X,indexer_loss=0|1 "
                "(with --search: the keys given are held fixed)");
  c->add_option("--routing", o->routing,
                "measured routing: a trex metrics.jsonl (train with [log] expert_loads = true) or a JSON "
                "{\"expert_loads\": [[tokens per expert of a layer], ...]}; sets each layout's expert_load to its "
                "busiest ep rank's share and shows forced balance beside it");
  c->add_flag("--search", o->search, "enumerate valid layouts that fit and rank them by tokens/s and by cost");
  c->add_option("--top", o->top, "layouts shown by --search (default 10)");
  c->add_flag("--vary-devices", o->vary_devices, "with --search: also try devices/2, devices/4, ... (cost ranking)");
  c->add_option("--min-devices", o->min_devices, "with --vary-devices: the fewest devices tried (default 1)");
  c->add_option("--tokens", o->tokens, "tokens of the whole run (e.g. 10e9): wall time, dollars and energy");
  c->add_option("--calibration", o->calibration, "calibration JSON for cpu-this (default: $TREX_CALIBRATION or "
                                                 "~/.cache/trex/calibration.json)");
  c->add_flag("--longest-context", o->longest,
              "the longest seq that fits memory, for every context-parallel size cp the devices allow next to "
              "the layout's tp and pp (its other keys as given), with step time, tokens/s and MFU there");
  c->add_option("--context-step", o->context_step, "with --longest-context: seq granularity (default 1024)");
  c->add_option("--context-max", o->context_max, "with --longest-context: the longest seq tried (default 16777216)");
  c->add_flag("--json", o->json, "print one JSON object");
  c->add_flag("--list", o->list, "list the built-in models and clusters");
  c->callback([o] { run_plan(*o); });
}

}  // namespace trex::cli
