// trex convert --model DIR --out DIR [--layout hf|original|transformers] [--dtype f32|bf16] [--quantize]
// Rewrites a checkpoint (Hugging Face layout, or for DeepSeek-V4 also the original release
// layout and the names transformers' save_pretrained writes; FP8 / FP4 dequantized on load) in
// the chosen layout and dtype. --quantize (V4 original
// layout only) writes FP8 e4m3 + ue8m0 128x128 attention / shared-expert matrices and FP4 e2m1
// routed experts, as the release ships them. Prints {"tensors": ..., "params": ...}.
#include <cstdio>
#include "cli/commands.h"
#include "core/parallel.h"
#include "io/atomic_file.h"
#include "model/checkpoint.h"

namespace trex::cli {

void add_convert(CLI::App& app) {
  auto* cmd = app.add_subcommand("convert", "rewrite a checkpoint in another layout (hf | original) or dtype");
  struct Opts {
    std::string model, out, layout = "hf", dtype = "bf16";
    bool quantize = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--model", o->model, "checkpoint directory (config.json + safetensors)")->required();
  cmd->add_option("--out", o->out, "output directory")->required();
  cmd->add_option("--layout", o->layout, "hf (transformers names), original (DeepSeek-V4 release names) or "
                                         "transformers (DeepSeek-V4 as transformers' save_pretrained writes it)");
  cmd->add_option("--dtype", o->dtype, "f32 or bf16 (weights that are not quantized)");
  cmd->add_flag("--quantize", o->quantize, "original layout: FP8 attention / shared experts, FP4 routed experts");
  cmd->callback([o] {
    init_threads(0);
    TREX_USER_CHECK(o->layout == "hf" || o->layout == "original" || o->layout == "transformers",
                    "use --layout hf, original or transformers", "--layout ", o->layout, " is not a checkpoint layout");
    TREX_USER_CHECK(o->dtype == "f32" || o->dtype == "bf16", "use --dtype f32 or --dtype bf16", "--dtype ", o->dtype,
                    " is not supported");
    // Not the input, not inside it (realpath: symlinks, "..", trailing slashes resolved).
    io::check_output_outside_input(o->model, o->out, "--model", "--out");
    const DType dt = o->dtype == "f32" ? DType::F32 : DType::BF16;
    model::ModelConfig cfg = model::load_config_json(o->model + "/config.json");
    TREX_USER_CHECK(o->layout == "hf" || cfg.is_v4(), "use --layout hf", o->model,
                    ": the ", o->layout, " layout exists for DeepSeek-V4 checkpoints only");
    TREX_USER_CHECK(!o->quantize || o->layout == "original", "add --layout original", "--quantize writes the "
                    "DeepSeek-V4 original layout");
    model::Model m(cfg, kern::Prec::F32);
    model::load_hf_weights(m, o->model);  // a damaged trex checkpoint is named, not converted
    if (o->layout == "hf") model::save_hf_checkpoint(m, o->out, dt);
    else model::save_v4_original(m, o->out, dt, o->quantize, 5ull << 30, o->layout == "transformers");
    std::printf("{\"layout\": \"%s\", \"dtype\": \"%s\", \"quantized\": %s, \"params\": %lld}\n", o->layout.c_str(),
                o->dtype.c_str(), o->quantize ? "true" : "false", (long long)cfg.num_params());
  });
}

}  // namespace trex::cli
