// trex tokenizer train --files F... --vocab-size N --out DIR [--special-tokens T...] [--min-frequency K] [--bos T]
//   trains a byte-level BPE with the DeepSeek-V3 pre-tokenizer and writes DIR/tokenizer.json.
// trex tokenizer encode --tokenizer PATH (--text T | --file F) [--no-special] [--bench]
//   prints the ids (one line per input line), or with --bench one JSON line with MB/s.
// trex tokenizer decode --tokenizer PATH [--skip-special] ID...
//   prints the text of the ids.
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/timer.h"
#include "io/bpe_train.h"
#include "io/tokenizer.h"

namespace trex::cli {

namespace {

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  TREX_USER_CHECK(f.good(), "check --file", "cannot open ", path);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(f, line)) lines.push_back(line);
  return lines;
}

}  // namespace

void add_tokenizer(CLI::App& app) {
  auto* tk = app.add_subcommand("tokenizer", "train, run and inspect byte-level BPE tokenizers (tokenizer.json)");
  tk->require_subcommand(1);

  auto* train = tk->add_subcommand("train", "train a byte-level BPE (DeepSeek-V3 pre-tokenizer), write DIR/tokenizer.json");
  struct TrainOpts {
    std::vector<std::string> files;
    std::string out;
    io::BpeTrainOptions o;
    int threads = 0;
  };
  auto t = std::make_shared<TrainOpts>();
  train->add_option("--files", t->files, "training text files (each line, with its newline, is one sequence)")
      ->required()
      ->check(CLI::ExistingFile);
  train->add_option("--vocab-size", t->o.vocab_size, "total ids: special tokens + 256 bytes + merges")->required();
  train->add_option("--out", t->out, "output directory (tokenizer.json is written there)")->required();
  train->add_option("--special-tokens", t->o.special_tokens, "special tokens, given ids 0.. in this order");
  train->add_option("--min-frequency", t->o.min_frequency, "minimum pair count to merge (default 2)");
  train->add_option("--bos", t->o.bos_token, "a special token the post_processor puts first (DeepSeek style)");
  train->add_option("--threads", t->threads, "threads for counting (default TREX_THREADS or all cores)");
  train->callback([t] {
    init_threads(t->threads);
    io::BpeTrainStats s = io::train_bpe_files(t->files, t->o, t->out);
    std::printf("{\"out\": \"%s/tokenizer.json\", \"vocab\": %lld, \"merges\": %lld, \"sequences\": %lld, "
                "\"words\": %lld, \"unique_words\": %lld, \"count_ms\": %.1f, \"merge_ms\": %.1f}\n",
                t->out.c_str(), (long long)s.vocab, (long long)s.merges, (long long)s.sequences, (long long)s.words,
                (long long)s.unique_words, s.count_ms, s.merge_ms);
  });

  auto* enc = tk->add_subcommand("encode", "print the ids of a text, or of each line of a file");
  struct EncOpts {
    std::string tokenizer, text, file;
    bool no_special = false, bench = false;
    int threads = 1;
  };
  auto e = std::make_shared<EncOpts>();
  enc->add_option("--tokenizer", e->tokenizer, "tokenizer.json or a directory holding it")->required();
  auto* o_text = enc->add_option("--text", e->text, "text to encode");
  auto* o_file = enc->add_option("--file", e->file, "encode each line of this file (without its newline)");
  o_text->excludes(o_file);
  enc->add_flag("--no-special", e->no_special, "do not add the post_processor's special tokens (BOS)");
  enc->add_flag("--bench", e->bench, "print only one JSON line: bytes, tokens, seconds, MB/s");
  enc->add_option("--threads", e->threads, "threads for --file (default 1)");
  enc->callback([e] {
    TREX_USER_CHECK(!e->text.empty() || !e->file.empty(), "pass --text or --file", "nothing to encode");
    double t_load = now_ms();
    io::Tokenizer tok = io::Tokenizer::load(e->tokenizer);
    t_load = now_ms() - t_load;
    std::vector<std::string> lines = e->file.empty() ? std::vector<std::string>{e->text} : read_lines(e->file);
    std::vector<std::vector<int32_t>> ids(lines.size());
    init_threads(e->threads);
    const int T = std::max(1, e->threads);
    double t0 = now_ms();
    parallel_dynamic(T, [&](int64_t w) {
      io::EncodeScratchPtr s = tok.make_scratch();
      for (size_t i = (size_t)w; i < lines.size(); i += (size_t)T) tok.encode(lines[i], ids[i], !e->no_special, s.get());
    });
    double sec = (now_ms() - t0) / 1000.0;
    if (e->bench) {
      size_t bytes = 0, toks = 0;
      for (size_t i = 0; i < lines.size(); ++i) bytes += lines[i].size(), toks += ids[i].size();
      std::printf("{\"lines\": %zu, \"bytes\": %zu, \"tokens\": %zu, \"seconds\": %.4f, \"mb_per_s\": %.2f, "
                  "\"threads\": %d, \"load_ms\": %.1f}\n",
                  lines.size(), bytes, toks, sec, bytes / 1e6 / sec, T, t_load);
      return;
    }
    for (const auto& v : ids) {
      for (size_t k = 0; k < v.size(); ++k) std::printf(k ? " %d" : "%d", v[k]);
      std::printf("\n");
    }
  });

  auto* dec = tk->add_subcommand("decode", "print the text of token ids");
  struct DecOpts {
    std::string tokenizer;
    std::vector<int32_t> ids;
    bool skip_special = false;
  };
  auto d = std::make_shared<DecOpts>();
  dec->add_option("--tokenizer", d->tokenizer, "tokenizer.json or a directory holding it")->required();
  dec->add_option("ids", d->ids, "token ids")->required();
  dec->add_flag("--skip-special", d->skip_special, "leave out special tokens");
  dec->callback([d] {
    io::Tokenizer tok = io::Tokenizer::load(d->tokenizer);
    std::string s = tok.decode(d->ids, d->skip_special);
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::printf("\n");
  });
}

}  // namespace trex::cli
