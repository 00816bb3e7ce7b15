#include "train/run_config.h"

#include <set>
#include "core/error.h"
#include "io/toml_json.h"

namespace trex::train {

kern::Prec parse_precision(const std::string& s, const std::string& where) {
  if (s == "fp32" || s == "f32") return kern::Prec::F32;
  if (s == "bf16") return kern::Prec::BF16;
  TREX_USER_FAIL("allowed: fp32, bf16", where, ": precision '", s, "' is not supported");
}

RunConfig load_run_config(const std::string& path) {
  nlohmann::json j = io::load_toml_as_json(path);
  RunConfig r;
  for (auto& [k, v] : j.items())
    TREX_USER_CHECK(k == "model" || k == "train", "allowed sections: [model], [train]", path, ": unknown section [",
                    k, "]");
  TREX_USER_CHECK(j.contains("model") && j["model"].is_object(), "add a [model] section", path,
                  ": missing [model]");
  nlohmann::json mj = j["model"];
  if (mj.contains("path")) {
    TREX_USER_CHECK(mj["path"].is_string(), "model.path must be a string", path, ": bad model.path");
    r.model_path = mj["path"].get<std::string>();
    std::string cfg = r.model_path;
    if (cfg.size() < 5 || cfg.compare(cfg.size() - 5, 5, ".json") != 0) cfg += "/config.json";
    r.model = model::load_config_json(cfg);
  } else {
    r.model = model::parse_config(mj, path + " [model]");
  }
  if (!j.contains("train")) return r;
  const nlohmann::json& t = j["train"];
  static const std::set<std::string> keys = {"batch_size", "seq_len", "threads", "steps", "seed", "precision",
                                             "lr", "weight_decay", "clip_grad_norm", "beta1", "beta2", "eps",
                                             "bias_update_gamma", "aux_loss_alpha"};
  for (auto& [k, v] : t.items()) {
    if (keys.count(k)) continue;
    std::string allowed;
    for (auto& a : keys) allowed += (allowed.empty() ? "" : ", ") + a;
    TREX_USER_FAIL("allowed keys: " + allowed, path, ": unknown key train.", k);
  }
  auto num = [&](const char* k, auto& dst, double lo) {
    if (!t.contains(k)) return;
    TREX_USER_CHECK(t[k].is_number(), "use a number", path, ": train.", k, " must be a number");
    double v = t[k].get<double>();
    TREX_USER_CHECK(v >= lo, "use a value >= " + std::to_string(lo), path, ": train.", k, " = ", v, " is out of range");
    dst = static_cast<std::remove_reference_t<decltype(dst)>>(v);
  };
  num("batch_size", r.batch_size, 1);
  num("seq_len", r.seq_len, 1);
  num("threads", r.threads, 0);
  num("steps", r.steps, 1);
  num("seed", r.seed, 0);
  num("lr", r.lr, 0);
  num("weight_decay", r.weight_decay, 0);
  num("clip_grad_norm", r.clip_grad_norm, 0);
  num("beta1", r.beta1, 0);
  num("beta2", r.beta2, 0);
  num("eps", r.eps, 0);
  num("bias_update_gamma", r.bias_update_gamma, 0);
  num("aux_loss_alpha", r.aux_loss_alpha, 0);
  if (t.contains("precision")) {
    TREX_USER_CHECK(t["precision"].is_string(), "allowed: fp32, bf16", path, ": train.precision must be a string");
    r.precision = parse_precision(t["precision"].get<std::string>(), path + ": train.precision");
  }
  return r;
}

}  // namespace trex::train
