// trex generate --model DIR [--tokenizer PATH] (--prompt TEXT | --input FILE.jsonl [--output FILE])
//   [--max-tokens N] [--temperature T] [--top-p P] [--seed S] [--stop STR ...] [--chat]
// Greedy by default. --input reads {"prompt": ...} per line (or "question") and writes
// {"prompt", "output", "finish", "n_tokens"} per line to --output (default stdout), --batch B of
// them generated together (model::generate_batch: the same lines as one at a time); --prompt prints
// the text, or with --output writes that JSON line. Prompt + generation are capped at the model's
// max_position_embeddings (a warning names --max-tokens and the limit); a tokenizer with more ids
// than the model's vocab_size and non-finite logits are errors.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include "cli/commands.h"
#include "cli/tokenizer_fns.h"
#include "core/log.h"
#include "core/parallel.h"
#include "model/checkpoint.h"
#include "model/generate.h"
#include "train/device.h"
#include "train/data.h"

namespace trex::cli {

void add_generate(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "generate text from a checkpoint (KV cache; greedy or sampling)");
  struct Opts {
    std::string model, tokenizer, prompt, input, output, tmpl = "deepseek", precision = "fp32", device = "cpu";
    int64_t max_tokens = 128, batch = 1;
    float temperature = 0.f, top_p = 1.f;
    uint64_t seed = 0;
    std::vector<std::string> stop;
    bool chat = false;
    int threads = 0;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--model", o->model, "checkpoint directory (config.json + safetensors)")->required();
  cmd->add_option("--tokenizer", o->tokenizer, "tokenizer.json (default: MODEL/tokenizer.json)");
  cmd->add_option("--prompt", o->prompt, "prompt text");
  cmd->add_option("--input", o->input, "JSONL with a \"prompt\" (or \"question\") per line");
  cmd->add_option("--output", o->output, "JSONL results (default stdout; with --prompt the JSON line replaces the printed text)");
  cmd->add_option("--max-tokens", o->max_tokens, "tokens to generate at most");
  cmd->add_option("--batch", o->batch, "--input: prompts generated together (default 1; the same results)");
  cmd->add_option("--temperature", o->temperature, "0 = greedy");
  cmd->add_option("--top-p", o->top_p, "nucleus sampling mass");
  cmd->add_option("--seed", o->seed, "sampling seed");
  cmd->add_option("--stop", o->stop, "stop string (repeatable)");
  cmd->add_flag("--chat", o->chat, "wrap the prompt as a user turn of the chat template");
  cmd->add_option("--template", o->tmpl, "chat template: deepseek | deepseek-v2 | chatml");
  cmd->add_option("--precision", o->precision, "fp32 or bf16");
  cmd->add_option("--device", o->device, "cpu | cuda | cuda:N");
  cmd->add_option("--threads", o->threads, "threads");
  cmd->callback([o] {
    init_threads(o->threads);
    const std::unique_ptr<kern::Backend> device = train::open_device(o->device, "--device");
    TREX_USER_CHECK(!device || device->host_addressable(), "generate with --device cpu",
                    "--device ", o->device, ": generation (its KV cache and sampling) runs on the CPU only for now; "
                    "the training step runs on ", device ? device->name() : "", " (trex train, grad, bench step)");
    TREX_USER_CHECK(o->batch >= 1, "use --batch >= 1", "trex generate: --batch ", o->batch, " must be >= 1");
    TREX_USER_CHECK(o->prompt.empty() != o->input.empty(), "give exactly one of --prompt and --input",
                    "trex generate: need --prompt TEXT or --input FILE.jsonl");
    // The output file first: a bad --output fails before the model is loaded.
    FILE* out = o->output.empty() ? stdout : std::fopen(o->output.c_str(), "w");
    TREX_USER_CHECK(out, "check the --output path (its directory must exist and be writable)", o->output,
                    ": cannot open for writing: ", std::strerror(errno));
    std::unique_ptr<FILE, int (*)(FILE*)> out_guard(out == stdout ? nullptr : out, &std::fclose);
    model::ModelConfig cfg = model::load_config_json(o->model + "/config.json");
    model::Model m(cfg, train::parse_precision(o->precision, "--precision"));
    if (device) m.use_backend(*device);
    model::load_hf_weights(m, o->model);
    const std::string tok_path = o->tokenizer.empty() ? o->model : o->tokenizer;
    io::Tokenizer tok = io::Tokenizer::load(tok_path);
    TREX_USER_CHECK(tok.vocab_size() <= cfg.vocab_size, "use the model's own tokenizer (--tokenizer)", tok_path,
                    ": the tokenizer has ", tok.vocab_size(), " ids but the model's vocab_size is ", cfg.vocab_size,
                    " (", o->model, "/config.json): ids past it have no embedding");
    train::ChatTemplate tmpl = train::ChatTemplate::by_name(o->tmpl);
    auto encode_prompt = [&](const std::string& p) {
      return o->chat ? chat_prompt_ids(tok, tmpl, p) : tok.encode(p, true);
    };
    auto decode = [&](const std::vector<int32_t>& t) { return tok.decode(t, true); };
    const std::vector<int32_t> eos_ids = stop_ids(tok, tmpl);
    bool warned = false;
    // The prompts ps generated together -> one result each.
    auto run_batch = [&](const std::vector<std::string>& ps) {
      std::vector<std::vector<int32_t>> ids;
      std::vector<int64_t> budgets;
      int64_t longest = 0;
      for (const std::string& p : ps) {
        ids.push_back(encode_prompt(p));
        bool capped = false;
        const int64_t n = model::generation_budget(cfg, (int64_t)ids.back().size(), o->max_tokens, &capped);
        if (capped && !warned) {
          TREX_LOG_WARN("--max-tokens ", o->max_tokens, ": a prompt of ", ids.back().size(), " tokens plus ",
                        o->max_tokens, " exceeds the model's max_position_embeddings (", cfg.max_position_embeddings,
                        "); generating at most ", n, " tokens");
          warned = true;
        }
        budgets.push_back(n);
        longest = std::max(longest, (int64_t)ids.back().size() + n);
      }
      model::SampleParams sp{o->temperature, o->top_p, o->max_tokens, o->seed, o->stop};
      model::Decoder dec(m, longest, (int64_t)ps.size());
      return model::generate_batch(dec, ids, sp, budgets, decode, eos_ids);
    };
    auto run = [&](const std::string& p) { return run_batch({p})[0]; };
    auto write = [&](const std::string& p, const model::GenerateResult& r) {
      nlohmann::json res = {{"prompt", p}, {"output", r.text}, {"finish", r.finish}, {"n_tokens", r.tokens.size()}};
      std::fprintf(out, "%s\n", res.dump().c_str());
      TREX_USER_CHECK(std::fflush(out) == 0 && !std::ferror(out), "check free space on the --output file system",
                      o->output.empty() ? "stdout" : o->output, ": write failed: ", std::strerror(errno));
    };
    if (!o->prompt.empty()) {
      model::GenerateResult r = run(o->prompt);
      if (o->output.empty()) std::printf("%s\n", r.text.c_str());
      else write(o->prompt, r);
      std::fprintf(stderr, "[generate] %zu tokens, finish: %s\n", r.tokens.size(), r.finish.c_str());
    } else {
      std::ifstream in(o->input);
      TREX_USER_CHECK(in.good(), "check the --input path", o->input, ": cannot open");
      std::vector<std::string> pending;  // read, not yet generated (up to --batch)
      auto flush = [&] {
        if (pending.empty()) return;
        const std::vector<model::GenerateResult> r = run_batch(pending);
        for (size_t k = 0; k < pending.size(); ++k) write(pending[k], r[k]);
        pending.clear();
      };
      std::string line;
      int64_t ln = 0;
      while (std::getline(in, line)) {
        ++ln;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        nlohmann::json j;
        try {
          j = nlohmann::json::parse(line);
        } catch (const nlohmann::json::exception&) {
          TREX_USER_FAIL("each line must be a JSON object", o->input, ":", ln, ": not valid JSON");
        }
        std::string p = j.contains("prompt") && j["prompt"].is_string()       ? j["prompt"].get<std::string>()
                        : j.contains("question") && j["question"].is_string() ? j["question"].get<std::string>()
                                                                               : "";
        TREX_USER_CHECK(!p.empty(), "give a \"prompt\" or \"question\" string", o->input, ":", ln, ": no prompt");
        pending.push_back(p);
        if ((int64_t)pending.size() == o->batch) flush();
      }
      flush();
    }
    if (out != stdout) {
      out_guard.release();
      TREX_USER_CHECK(std::fclose(out) == 0, "check free space on the --output file system", o->output,
                      ": write failed: ", std::strerror(errno));
    }
  });
}

}  // namespace trex::cli
