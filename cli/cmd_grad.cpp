// trex grad --model DIR --batch FILE.json [--precision fp32|bf16] --out GRADS.safetensors
// One forward + backward of a Hugging Face checkpoint on a batch {"input_ids": [[...]],
// "labels": [[...]]} (labels aligned with input_ids as in transformers; -100 = ignored; absent =
// input_ids). Prints {"loss": ...} (with --indexer-loss-weight: the DeepSeek-V3.2 indexer's KL
// loss in the sum and as "indexer") and writes every parameter gradient under its HF name. A loss
// that is NaN or Inf is an error (exit 2) and writes nothing.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include "cli/commands.h"
#include "core/parallel.h"
#include "model/checkpoint.h"
#include "train/device.h"
#include "train/run_config.h"

namespace trex::cli {

namespace {

std::vector<int32_t> read_rows(const nlohmann::json& j, const char* key, const std::string& path, int64_t& B,
                               int64_t& T) {
  TREX_USER_CHECK(j.contains(key) && j[key].is_array() && !j[key].empty(), "give a non-empty list of rows", path,
                  ": '", key, "' must be a non-empty list of lists of integers");
  const auto& rows = j[key];
  B = rows.size();
  T = -1;
  std::vector<int32_t> out;
  for (size_t b = 0; b < rows.size(); ++b) {
    TREX_USER_CHECK(rows[b].is_array() && !rows[b].empty(), "each row must be a non-empty list", path, ": ", key,
                    "[", b, "] is not a non-empty list");
    if (T < 0) T = rows[b].size();
    TREX_USER_CHECK((int64_t)rows[b].size() == T, "pad all rows to one length", path, ": ", key, "[", b,
                    "] has length ", rows[b].size(), ", row 0 has ", T);
    for (const auto& v : rows[b]) {
      TREX_USER_CHECK(v.is_number_integer(), "ids must be integers", path, ": ", key, "[", b, "] holds ", v.dump());
      out.push_back(v.get<int32_t>());
    }
  }
  return out;
}

}  // namespace

void add_grad(CLI::App& app) {
  auto* cmd = app.add_subcommand("grad", "one forward+backward of a checkpoint on a batch; writes all gradients");
  struct Opts {
    std::string model, batch, out, precision = "fp32", device = "cpu";
    int threads = 0;
    double aux_alpha = 0, mtp_weight = 0, indexer_weight = 0;
    std::string indexer_stage = "sparse";
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--model", o->model, "Hugging Face checkpoint directory (config.json + safetensors)")->required();
  cmd->add_option("--batch", o->batch, "JSON file {\"input_ids\": [[...]], \"labels\": [[...]]}")->required();
  cmd->add_option("--out", o->out, "output gradients (.safetensors)")->required();
  cmd->add_option("--precision", o->precision, "fp32 or bf16");
  cmd->add_option("--device", o->device, "cpu | cuda | cuda:N");
  cmd->add_option("--threads", o->threads, "threads (default TREX_THREADS or all cores)");
  cmd->add_option("--aux-loss-alpha", o->aux_alpha, "sequence-wise aux loss coefficient (default 0 = off)");
  cmd->add_option("--mtp-loss-weight", o->mtp_weight, "DeepSeek-V3 / V4: train the MTP layers / blocks with this loss weight (default 0 = off)");
  cmd->add_option("--indexer-loss-weight", o->indexer_weight,
                  "DeepSeek-V3.2 / V4 (CSA): train the lightning indexer with its KL loss at this weight (default 0 = frozen)");
  cmd->add_option("--indexer-stage", o->indexer_stage, "with --indexer-loss-weight > 0: sparse or dense_warmup")
      ->check(CLI::IsMember({"sparse", "dense_warmup"}));
  cmd->callback([o] {
    init_threads(o->threads);
    kern::Prec prec = train::parse_precision(o->precision, "--precision");
    const std::unique_ptr<kern::Backend> device = train::open_device(o->device, "--device");
    model::ModelConfig cfg = model::load_config_json(o->model + "/config.json");
    std::ifstream f(o->batch);
    TREX_USER_CHECK(f.good(), "check the --batch path", o->batch, ": cannot open");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(f);
    } catch (const nlohmann::json::exception& e) {
      TREX_USER_FAIL("the batch file must be JSON", o->batch, ": ", e.what());
    }
    int64_t B, T, B2, T2;
    std::vector<int32_t> ids = read_rows(j, "input_ids", o->batch, B, T);
    std::vector<int32_t> labels = j.contains("labels") ? read_rows(j, "labels", o->batch, B2, T2) : ids;
    if (j.contains("labels"))
      TREX_USER_CHECK(B2 == B && T2 == T, "labels must have the shape of input_ids", o->batch, ": labels are [", B2,
                      ", ", T2, "], input_ids [", B, ", ", T, "]");
    std::vector<int32_t> targets = model::shift_labels(labels, B, T);
    TREX_USER_CHECK(o->indexer_weight >= 0, "use --indexer-loss-weight >= 0", "--indexer-loss-weight ",
                    o->indexer_weight, " is negative");
    TREX_USER_CHECK(o->indexer_stage == "sparse" || o->indexer_weight > 0, "set --indexer-loss-weight > 0",
                    "--indexer-stage dense_warmup trains only the indexer, whose loss weight is 0");
    const model::IndexerStage ixs =
        o->indexer_stage == "dense_warmup" ? model::IndexerStage::DenseWarmup : model::IndexerStage::Sparse;
    model::Model m(cfg, prec, {o->aux_alpha, o->mtp_weight, model::Recompute::None, o->indexer_weight, ixs});
    if (device) m.use_backend(*device);
    model::load_hf_weights(m, o->model);
    model::Batch b{B, T, ids.data(), targets.data(), nullptr, nullptr};
    model::LossParts lp = m.forward_backward(b, 1.f);
    TREX_USER_CHECK(std::isfinite(lp.loss), "check the checkpoint's weights (values too large overflow) and the "
                    "batch; try --precision fp32",
                    o->model, ": the loss on ", o->batch, " is ", lp.loss, " (cross-entropy ", lp.ce,
                    "): not a number, so no gradients were written to ", o->out);
    m.grads_to_host();
    model::save_gradients(m, o->out);
    std::printf("{\"loss\": %.9g, \"ce\": %.9g, \"mtp\": %.9g, \"indexer\": %.9g, \"n_valid\": %lld, \"tokens\": %lld}\n",
                lp.loss, lp.ce, lp.mtp, lp.indexer, (long long)lp.n_valid, (long long)(B * T));
  });
}

}  // namespace trex::cli
