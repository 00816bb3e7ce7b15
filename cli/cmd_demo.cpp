// trex demo: the post-training workflow end to end on a built-in default, in a few minutes on a
// laptop-class CPU. Each stage is the user-facing command, run in this process and printed as
// the command line a user would type, with the run configs written next to the results:
//   1. trex or gen          solver-verified OR data (CPT documents, SFT chats, test questions)
//   2. trex tokenizer train a byte-level BPE on that text, with DeepSeek's chat tokens
//   3. trex train (CPT)     a small DeepSeek-V3-shaped MoE (MLA, 1 dense + 2 MoE layers, 8 experts
//                           top-2, sigmoid routing with noaux_tc bias) from random weights
//   4. trex train (SFT)     from the CPT checkpoint, loss on assistant tokens only, packed
//   5. trex generate        greedy answers to held-out test questions from the SFT model
//   6. trex plot            loss / MFU / expert-load PNGs of both runs (gnuplot)
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>
#include "cli/commands.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "io/tokenizer.h"
#include "train/checkpoint.h"

namespace trex::cli {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Runs one trex command line in this process, printed first as a user would type it.
void run_cmd(std::vector<std::string> args) {
  std::string shown = "$ trex";
  for (const std::string& a : args)
    shown += a.find_first_of(" <|") == std::string::npos ? " " + a : " '" + a + "'";
  std::printf("\n%s\n", shown.c_str());
  std::fflush(stdout);
  CLI::App app{"trex"};
  app.require_subcommand(1);
  add_or(app);
  add_tokenizer(app);
  add_train(app);
  add_generate(app);
  add_plot(app);
  std::reverse(args.begin(), args.end());  // CLI11 parses a reversed vector
  app.parse(args);
  std::fflush(stdout);
}

// Plain text for the tokenizer trainer (one line per sequence): CPT texts and SFT turns.
void write_tokenizer_corpus(const std::string& data, const std::string& out) {
  std::ofstream o(out);
  std::string line;
  auto text_lines = [&](const std::string& s) {
    size_t b = 0;
    while (b <= s.size()) {
      size_t e = s.find('\n', b);
      if (e == std::string::npos) e = s.size();
      if (e > b) o << s.substr(b, e - b) << "\n";
      b = e + 1;
    }
  };
  std::ifstream cpt(data + "/cpt.jsonl"), sft(data + "/sft.jsonl");
  while (std::getline(cpt, line)) text_lines(json::parse(line).at("text").get<std::string>());
  while (std::getline(sft, line))
    for (const json& m : json::parse(line).at("messages")) text_lines(m.at("content").get<std::string>());
}

std::string model_toml(int64_t vocab) {
  return "[model]\nmodel_type = \"deepseek_v3\"\nvocab_size = " + std::to_string(vocab) +
         "\nhidden_size = 128\nnum_hidden_layers = 3\nfirst_k_dense_replace = 1\nintermediate_size = 320\n"
         "moe_intermediate_size = 64\nn_routed_experts = 8\nn_shared_experts = 1\nnum_experts_per_tok = 2\n"
         "n_group = 2\ntopk_group = 1\ntopk_method = \"noaux_tc\"\nscoring_func = \"sigmoid\"\n"
         "norm_topk_prob = true\nrouted_scaling_factor = 2.0\nnum_attention_heads = 4\nq_lora_rank = 64\n"
         "kv_lora_rank = 48\nqk_nope_head_dim = 24\nqk_rope_head_dim = 8\nv_head_dim = 24\n"
         "max_position_embeddings = 4096\nrope_theta = 10000.0\ninitializer_range = 0.04\n";
}

std::string run_toml(const std::string& mode, const std::string& model_section, const std::string& train_file,
                     const std::string& tokenizer, const std::string& dir, int64_t steps, double lr, int threads,
                     const std::string& cache, int64_t seq_len, int64_t batch) {
  const int64_t every = std::max<int64_t>(1, steps / 3);
  return model_section + "\n[data]\nmode = \"" + mode + "\"\ntrain = [\"" + train_file + "\"]\neval_fraction = 0.05\n" +
         "seq_len = " + std::to_string(seq_len) + "\noverflow = \"drop\"\ntokenizer = \"" + tokenizer + "\"\ncache_dir = \"" + cache + "\"\n\n[train]\nbatch_size = " + std::to_string(batch) + "\nsteps = " + std::to_string(steps) +
         "\nprecision = \"bf16\"\neval_every = " + std::to_string(every) + "\neval_batches = 2\nthreads = " +
         std::to_string(threads) + "\n\n[optim]\nlr = " + std::to_string(lr) +
         "\nmin_lr = " + std::to_string(lr / 10) + "\nwarmup_steps = " + std::to_string(std::max<int64_t>(1, steps / 10)) +
         "\nschedule = \"cosine\"\nweight_decay = 0.05\n\n[checkpoint]\nrun_dir = \"" + dir + "\"\nevery = " +
         std::to_string(every) + "\nkeep = 2\n\n[log]\nevery = " + std::to_string(std::max<int64_t>(1, steps / 10)) + "\n";
}

void write_file(const std::string& path, const std::string& text) { io::write_file_atomic(path, text); }

}  // namespace

void add_demo(CLI::App& app) {
  auto* cmd = app.add_subcommand("demo", "post-training end to end on a built-in default: OR data, tokenizer, CPT, "
                                         "SFT, generation, plots");
  struct Opts {
    std::string out = "runs/demo";
    int64_t n = 600, vocab = 1536, cpt_steps = 80, sft_steps = 80, questions = 2;
    int threads = 0;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--out", o->out, "output directory (default runs/demo)");
  cmd->add_option("--n", o->n, "OR instances to generate (default 600)");
  cmd->add_option("--vocab", o->vocab, "tokenizer vocabulary size (default 1536)");
  cmd->add_option("--cpt-steps", o->cpt_steps, "CPT optimizer steps (default 80)");
  cmd->add_option("--sft-steps", o->sft_steps, "SFT optimizer steps (default 80)");
  cmd->add_option("--questions", o->questions, "held-out questions to answer at the end (default 2)");
  cmd->add_option("--threads", o->threads, "threads (default TREX_THREADS or all cores)");
  cmd->callback([o] {
    TREX_USER_CHECK(o->n >= 20 && o->vocab >= 300 && o->cpt_steps >= 1 && o->sft_steps >= 1, "use the defaults",
                    "trex demo: need --n >= 20, --vocab >= 300 and at least one step per stage");
    const std::string out = fs::absolute(o->out).lexically_normal().string();
    const std::string data = out + "/data", tokdir = out + "/tokenizer", cpt = out + "/cpt", sft = out + "/sft";
    // The demo always starts from scratch, but removes only a folder it made itself (its marker
    // file inside) or an empty one: `--out .` or `--out ~` must never delete a user's files.
    const fs::path marker = fs::path(out) / ".trex-demo";
    if (fs::exists(out)) {
      TREX_USER_CHECK(fs::is_directory(out) && (fs::is_empty(out) || fs::exists(marker)),
                      "give --out a new or empty folder (or one an earlier trex demo wrote)", "trex demo: ", out,
                      " exists and was not written by trex demo; it is left as it is");
      fs::remove_all(out);
    }
    fs::create_directories(out);
    std::FILE* mf = std::fopen(marker.c_str(), "w");
    TREX_USER_CHECK(mf, "give --out a folder you may write to", "trex demo: cannot write ", marker.string());
    std::fclose(mf);
    std::printf("trex demo: OR data -> tokenizer -> CPT -> SFT -> generate -> plots, everything under %s\n",
                out.c_str());

    run_cmd({"or", "gen", "--n", std::to_string(o->n), "--out", data, "--seed", "7"});

    write_tokenizer_corpus(data, out + "/tokenizer_corpus.txt");
    run_cmd({"tokenizer", "train", "--files", out + "/tokenizer_corpus.txt", "--vocab-size", std::to_string(o->vocab),
             "--out", tokdir, "--special-tokens", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>",
             "<｜Assistant｜>", "--bos", "<｜begin▁of▁sentence｜>"});
    const std::string tok_file = tokdir + "/tokenizer.json";
    const int64_t vocab = io::Tokenizer::load(tok_file).vocab_size();

    write_file(out + "/cpt.toml",
               run_toml("cpt", model_toml(vocab), data + "/cpt.jsonl", tok_file, cpt, o->cpt_steps, 3e-3, o->threads,
                        out + "/token_cache", 512, 4));
    run_cmd({"train", "--config", out + "/cpt.toml"});
    const auto cpt_ckpt = train::latest_checkpoint(cpt);
    TREX_CHECK(cpt_ckpt.has_value(), "the CPT run wrote no checkpoint");

    write_file(out + "/sft.toml", run_toml("sft", "[model]\npath = \"" + *cpt_ckpt + "\"\n", data + "/sft.jsonl",
                                           tok_file, sft, o->sft_steps, 2e-3, o->threads, out + "/token_cache", 1024, 2));
    run_cmd({"train", "--config", out + "/sft.toml"});
    const auto sft_ckpt = train::latest_checkpoint(sft);
    TREX_CHECK(sft_ckpt.has_value(), "the SFT run wrote no checkpoint");

    std::ifstream test(data + "/test.jsonl");
    std::string line;
    for (int64_t q = 0; q < o->questions && std::getline(test, line); ++q) {
      json t = json::parse(line);
      const std::string question = t.at("question").get<std::string>();
      std::printf("\n--- held-out question %lld (reference answer: %s) ---\n%s\n", (long long)q + 1,
                  t.at("answer").dump().c_str(), question.c_str());
      run_cmd({"generate", "--model", *sft_ckpt, "--tokenizer", tok_file, "--chat", "--max-tokens", "200", "--prompt",
               question});
    }

    run_cmd({"plot", cpt, "--out", out + "/cpt.png"});
    run_cmd({"plot", sft, "--out", out + "/sft.png"});
    std::printf("\ntrex demo: done. Plots: %s/cpt.png and %s/sft.png; run configs: %s/cpt.toml and %s/sft.toml; "
                "metrics: %s/metrics.jsonl and %s/metrics.jsonl.\n",
                out.c_str(), out.c_str(), out.c_str(), out.c_str(), cpt.c_str(), sft.c_str());
  });
}

}  // namespace trex::cli
