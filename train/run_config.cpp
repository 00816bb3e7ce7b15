#include "train/run_config.h"

#include <algorithm>
#include <functional>
#include <map>
#include <tuple>
#include "core/error.h"
#include "core/log.h"
#include "io/toml_json.h"
#include "train/layout.h"

namespace trex::train {

using nlohmann::json;

kern::Prec parse_precision(const std::string& s, const std::string& where) {
  if (s == "fp32" || s == "f32") return kern::Prec::F32;
  if (s == "bf16") return kern::Prec::BF16;
  TREX_USER_FAIL("allowed: fp32, bf16", where, ": precision '", s, "' is not supported");
}

namespace {

using Setter = std::function<void(const json&, const std::string& key)>;

struct Section {
  std::map<std::string, Setter> keys;
};

std::string allowed_keys(const Section& s) {
  std::string a;
  for (auto& [k, v] : s.keys) a += (a.empty() ? "" : ", ") + k;
  return a;
}

struct Ctx {
  std::string where;
  int64_t i64(const json& v, const std::string& key, int64_t lo) const {
    TREX_USER_CHECK(v.is_number_integer(), "use an integer", where, ": ", key, " must be an integer, got ", v.dump());
    int64_t x = v.get<int64_t>();
    TREX_USER_CHECK(x >= lo, "use a value >= " + std::to_string(lo), where, ": ", key, " = ", x, " is out of range");
    return x;
  }
  double f64(const json& v, const std::string& key, double lo, double hi = 1e300) const {
    TREX_USER_CHECK(v.is_number(), "use a number", where, ": ", key, " must be a number, got ", v.dump());
    double x = v.get<double>();
    TREX_USER_CHECK(x >= lo && x <= hi, "use a value in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]",
                    where, ": ", key, " = ", x, " is out of range");
    return x;
  }
  bool boolean(const json& v, const std::string& key) const {
    TREX_USER_CHECK(v.is_boolean(), "use true or false", where, ": ", key, " must be true or false");
    return v.get<bool>();
  }
  std::string str(const json& v, const std::string& key, std::initializer_list<const char*> allowed = {}) const {
    TREX_USER_CHECK(v.is_string(), "use a string", where, ": ", key, " must be a string, got ", v.dump());
    std::string s = v.get<std::string>();
    if (allowed.size() == 0) return s;
    std::string list;
    for (const char* a : allowed) {
      if (s == a) return s;
      list += (list.empty() ? "" : ", ") + std::string(a);
    }
    TREX_USER_FAIL("allowed: " + list, where, ": ", key, " = '", s, "' is not allowed");
  }
  std::vector<std::string> files(const json& v, const std::string& key) const {
    if (v.is_string()) return {v.get<std::string>()};
    TREX_USER_CHECK(v.is_array(), "use a path or a list of paths", where, ": ", key, " must be a list of paths");
    std::vector<std::string> out;
    for (const json& e : v) out.push_back(str(e, key));
    return out;
  }
};

void apply_override(json& j, const std::string& ov) {
  size_t eq = ov.find('='), dot = ov.find('.');
  TREX_USER_CHECK(eq != std::string::npos && dot != std::string::npos && dot < eq,
                  "write --set section.key=value", "--set '", ov, "' is not section.key=value");
  std::string sec = ov.substr(0, dot), key = ov.substr(dot + 1, eq - dot - 1), val = ov.substr(eq + 1);
  json v;
  try {
    v = json::parse(val);
  } catch (const json::exception&) {
    v = val;  // bare words are strings
  }
  j[sec][key] = v;
}

}  // namespace

RunConfig parse_run_config(json j, const std::string& where, const std::vector<std::string>& overrides) {
  for (const std::string& ov : overrides) apply_override(j, ov);
  RunConfig r;
  r.raw = j;
  Ctx c{where};
  TREX_USER_CHECK(j.is_object(), "a run config is a TOML table", where, ": not a table");
  TREX_USER_CHECK(j.contains("model") && j["model"].is_object(), "add a [model] section (path = checkpoint dir, or "
                  "Hugging Face config.json keys)", where, ": missing [model]");

  std::map<std::string, Section> S;
  S["data"].keys = {
      {"mode", [&](const json& v, const std::string& k) { r.data.mode = c.str(v, k, {"cpt", "sft"}); }},
      {"train", [&](const json& v, const std::string& k) { r.data.train = c.files(v, k); }},
      {"eval", [&](const json& v, const std::string& k) { r.data.eval = c.files(v, k); }},
      {"eval_fraction", [&](const json& v, const std::string& k) { r.data.eval_fraction = c.f64(v, k, 0, 0.9); }},
      {"seq_len", [&](const json& v, const std::string& k) { r.data.seq_len = c.i64(v, k, 2); }},
      {"chat_template", [&](const json& v, const std::string& k) {
         r.data.chat_template = c.str(v, k, {"deepseek", "chatml"});
       }},
      {"train_on_prompt", [&](const json& v, const std::string& k) { r.data.train_on_prompt = c.boolean(v, k); }},
      {"overflow", [&](const json& v, const std::string& k) {
         r.data.overflow = c.str(v, k, {"truncate", "drop"}) == "drop" ? OverflowPolicy::Drop : OverflowPolicy::Truncate;
       }},
      {"tokenizer", [&](const json& v, const std::string& k) { r.data.tokenizer = c.str(v, k); }},
      {"eos_token", [&](const json& v, const std::string& k) { r.data.eos_token = c.str(v, k); }},
      {"cache_dir", [&](const json& v, const std::string& k) { r.data.cache_dir = c.str(v, k); }},
  };
  S["train"].keys = {
      {"batch_size", [&](const json& v, const std::string& k) { r.train.batch_size = c.i64(v, k, 1); }},
      {"grad_accum", [&](const json& v, const std::string& k) { r.train.grad_accum = c.i64(v, k, 1); }},
      {"steps", [&](const json& v, const std::string& k) { r.train.steps = c.i64(v, k, 1); }},
      {"threads", [&](const json& v, const std::string& k) { r.train.threads = c.i64(v, k, 0); }},
      {"seed", [&](const json& v, const std::string& k) { r.train.seed = (uint64_t)c.i64(v, k, 0); }},
      {"eval_every", [&](const json& v, const std::string& k) { r.train.eval_every = c.i64(v, k, 0); }},
      {"eval_batches", [&](const json& v, const std::string& k) { r.train.eval_batches = c.i64(v, k, 1); }},
      {"precision", [&](const json& v, const std::string& k) {
         r.train.precision = parse_precision(c.str(v, k, {"fp32", "bf16"}), where);
       }},
      {"bias_update_gamma", [&](const json& v, const std::string& k) {
         r.train.bias_update_gamma = (float)c.f64(v, k, 0, 1);
       }},
      {"aux_loss_alpha", [&](const json& v, const std::string& k) { r.train.aux_loss_alpha = c.f64(v, k, 0, 10); }},
      {"recompute", [&](const json& v, const std::string& k) {
         r.train.recompute = c.str(v, k, {"none", "full"}) == "full" ? model::Recompute::Full : model::Recompute::None;
       }},
      {"mtp_loss_weight", [&](const json& v, const std::string& k) { r.train.mtp_loss_weight = c.f64(v, k, 0, 10); }},
      {"max_skipped_steps", [&](const json& v, const std::string& k) { r.train.max_skipped_steps = c.i64(v, k, 1); }},
      {"memory_check", [&](const json& v, const std::string& k) { r.train.memory_check = c.boolean(v, k); }},
      // SIGTERM / SIGINT finish the current step, write a checkpoint and exit with code 75 (a second
      // signal exits at once); false: the signals end the process as usual.
      {"exit_signal_save", [&](const json& v, const std::string& k) { r.train.exit_signal_save = c.boolean(v, k); }},
  };
  S["optim"].keys = {
      {"lr", [&](const json& v, const std::string& k) { r.optim.schedule.lr = c.f64(v, k, 0, 10); }},
      {"min_lr", [&](const json& v, const std::string& k) { r.optim.schedule.min_lr = c.f64(v, k, 0, 10); }},
      {"schedule", [&](const json& v, const std::string& k) {
         r.optim.schedule.kind = parse_schedule(c.str(v, k, {"constant", "linear", "cosine", "wsd"}), where);
       }},
      {"warmup_steps", [&](const json& v, const std::string& k) { r.optim.schedule.warmup_steps = c.i64(v, k, 0); }},
      {"decay_fraction", [&](const json& v, const std::string& k) {
         r.optim.schedule.decay_fraction = c.f64(v, k, 0, 1);
       }},
      {"weight_decay", [&](const json& v, const std::string& k) { r.optim.weight_decay = (float)c.f64(v, k, 0, 10); }},
      {"beta1", [&](const json& v, const std::string& k) { r.optim.beta1 = (float)c.f64(v, k, 0, 0.999999); }},
      {"beta2", [&](const json& v, const std::string& k) { r.optim.beta2 = (float)c.f64(v, k, 0, 0.999999); }},
      {"eps", [&](const json& v, const std::string& k) { r.optim.eps = (float)c.f64(v, k, 0, 1); }},
      {"clip_grad_norm", [&](const json& v, const std::string& k) { r.optim.clip_grad_norm = (float)c.f64(v, k, 0); }},
  };
  S["parallel"].keys = {
      {"dp", [&](const json& v, const std::string& k) { r.parallel.dp = c.i64(v, k, 0); }},
      {"tp", [&](const json& v, const std::string& k) { r.parallel.tp = c.i64(v, k, 1); }},
      {"pp", [&](const json& v, const std::string& k) { r.parallel.pp = c.i64(v, k, 1); }},
      {"ep", [&](const json& v, const std::string& k) { r.parallel.ep = c.i64(v, k, 1); }},
      {"pp_layers",
       [&](const json& v, const std::string& k) {
         TREX_USER_CHECK(v.is_array(), "use a list of layer counts, one per pipeline stage, e.g. [3, 4, 3]", c.where,
                         ": ", k, " must be a list of integers");
         r.parallel.pp_layers.clear();
         for (const json& e : v) r.parallel.pp_layers.push_back(c.i64(e, k, 0));
       }},
      {"bucket_size", [&](const json& v, const std::string& k) { r.parallel.bucket_size = c.i64(v, k, 0); }},
      {"overlap", [&](const json& v, const std::string& k) { r.parallel.overlap = c.boolean(v, k); }},
      {"overlap_params", [&](const json& v, const std::string& k) { r.parallel.overlap_params = c.boolean(v, k); }},
      {"sequence_parallel",
       [&](const json& v, const std::string& k) { r.parallel.sequence_parallel = c.boolean(v, k); }},
      {"watchdog_s", [&](const json& v, const std::string& k) { r.parallel.watchdog_s = c.f64(v, k, 0); }},
      {"zero_stage",
       [&](const json& v, const std::string& k) {
         TREX_USER_CHECK(v.is_number_integer() && (v.get<int64_t>() == 1 || v.get<int64_t>() == 2),
                         "allowed values: 1 (sharded optimizer state), 2 (gradients sharded too)", c.where, ": ", k,
                         " must be 1 or 2, got ", v.dump());
         r.parallel.zero_stage = v.get<int64_t>();
       }},
  };
  S["checkpoint"].keys = {
      // The run directory: checkpoints/step-NNNNNNNN/, metrics.jsonl, config.resolved.json (torchtitan's
      // job.dump_folder, Hugging Face's output_dir).
      {"run_dir", [&](const json& v, const std::string& k) { r.checkpoint.run_dir = c.str(v, k); }},
      // Deprecated alias of run_dir (a warning names the new key).
      {"dir", [&](const json& v, const std::string& k) {
         TREX_USER_CHECK(!j["checkpoint"].contains("run_dir"), "keep checkpoint.run_dir only (dir is its old name)",
                         where, ": both checkpoint.dir and checkpoint.run_dir are set");
         r.checkpoint.run_dir = c.str(v, k);
         TREX_LOG_WARN(where, ": checkpoint.dir is deprecated; name it checkpoint.run_dir (same meaning: the run "
                       "directory, holding checkpoints/, metrics.jsonl and config.resolved.json)");
       }},
      {"every", [&](const json& v, const std::string& k) { r.checkpoint.every = c.i64(v, k, 0); }},
      {"keep", [&](const json& v, const std::string& k) { r.checkpoint.keep = c.i64(v, k, 1); }},
      {"resume", [&](const json& v, const std::string& k) { r.checkpoint.resume = c.str(v, k); }},
  };
  S["log"].keys = {
      {"every", [&](const json& v, const std::string& k) { r.log.every = c.i64(v, k, 1); }},
      {"progress", [&](const json& v, const std::string& k) { r.log.progress = c.str(v, k, {"auto", "bar", "lines"}); }},
      {"spike_window", [&](const json& v, const std::string& k) { r.log.spike_window = c.i64(v, k, 2); }},
      {"spike_z", [&](const json& v, const std::string& k) { r.log.spike_z = c.f64(v, k, 0, 1000); }},
      {"trace", [&](const json& v, const std::string& k) { r.log.trace = c.str(v, k); }},
      {"trace_steps", [&](const json& v, const std::string& k) { r.log.trace_steps = c.i64(v, k, 1); }},
  };

  for (auto& [sec, body] : j.items()) {
    if (sec == "model") continue;
    auto it = S.find(sec);
    if (it == S.end()) {
      std::string all = "model";
      for (auto& [n, s] : S) all += ", " + n;
      TREX_USER_FAIL("allowed sections: " + all, where, ": unknown section [", sec, "]");
    }
    TREX_USER_CHECK(body.is_object(), "a section is a table", where, ": [", sec, "] is not a table");
    for (auto& [k, v] : body.items()) {
      auto kt = it->second.keys.find(k);
      TREX_USER_CHECK(kt != it->second.keys.end(), "allowed keys in [" + sec + "]: " + allowed_keys(it->second), where,
                      ": unknown key ", sec, ".", k);
      kt->second(v, sec + "." + k);
    }
  }

  json mj = j["model"];
  if (mj.contains("path")) {
    TREX_USER_CHECK(mj["path"].is_string(), "model.path must be a string", where, ": bad model.path");
    r.model_path = mj["path"].get<std::string>();
    std::string cfg = r.model_path;
    if (cfg.size() < 5 || cfg.compare(cfg.size() - 5, 5, ".json") != 0) cfg += "/config.json";
    r.model = model::load_config_json(cfg);
    if (r.data.tokenizer.empty()) r.data.tokenizer = r.model_path + "/tokenizer.json";
  } else {
    r.model = model::parse_config(mj, where + " [model]");
  }
  r.optim.schedule.total_steps = r.train.steps;
  return r;
}

parallel::ParallelDims resolve_parallel(const RunConfig& rc, int world_size) {
  parallel::ParallelDims d;
  d.tp = (int)rc.parallel.tp, d.pp = (int)rc.parallel.pp, d.ep = (int)rc.parallel.ep;
  for (int64_t n : rc.parallel.pp_layers) d.pp_layers.push_back((int)n);
  d.dp = rc.parallel.dp > 0 ? (int)rc.parallel.dp : std::max(1, world_size / std::max(1, d.tp * d.pp));
  TREX_USER_CHECK(world_size > 1 || d.world() == 1,
                  "launch with mpirun -np " + std::to_string(d.world()) + " trex train ...", "parallel.dp x tp x pp = ",
                  d.world(), " needs ", d.world(), " MPI ranks but trex train runs as one process");
  validate_layout(d, world_size, rc.model);
  TREX_USER_CHECK(!rc.parallel.sequence_parallel || d.tp == 1 || rc.data.seq_len >= d.tp,
                  "set data.seq_len >= parallel.tp, or parallel.sequence_parallel = false",
                  "parallel.sequence_parallel splits every sequence's tokens over the tp = ", d.tp,
                  " ranks, but data.seq_len = ", rc.data.seq_len);
  return d;
}

RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides) {
  return parse_run_config(io::load_toml_as_json(path), path, overrides);
}

}  // namespace trex::train
