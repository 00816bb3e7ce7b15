// trex bench decode --model DIR --context C --new N [--batch B] [--recompute]: greedy decoding
// speed of a checkpoint. B prompts of C random token ids (fixed seed) are fed at once (the
// prefill), then N tokens are generated for each, the argmax fed back one at a time; prints one
// JSON line with the prefill and decode seconds and the decode tokens/s (B N / decode seconds).
// --recompute (DeepSeek-V4 only, B = 1): every step runs the whole row again
// (Model::v4_last_logits), the path generation took before V4 had a KV cache.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include "cli/commands.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "model/checkpoint.h"
#include "model/generate.h"
#include "train/run_config.h"

namespace trex::cli {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int32_t argmax(const float* lg, int64_t V) { return (int32_t)(std::max_element(lg, lg + V) - lg); }

}  // namespace

void add_bench_decode(CLI::App& bench) {
  auto* dec = bench.add_subcommand("decode", "greedy decoding speed of a checkpoint: prefill, then tokens/s");
  struct Opts {
    std::string model, precision = "fp32";
    int64_t context = 512, n_new = 32, batch = 1;
    uint64_t seed = 1;
    bool recompute = false;
    int threads = 0;
  };
  auto o = std::make_shared<Opts>();
  dec->add_option("--model", o->model, "checkpoint directory (config.json + safetensors)")->required();
  dec->add_option("--context", o->context, "prompt tokens per sequence (default 512)");
  dec->add_option("--new", o->n_new, "tokens generated per sequence (default 32)");
  dec->add_option("--batch", o->batch, "prompts decoded together (default 1)");
  dec->add_option("--seed", o->seed, "seed of the random prompt ids (default 1)");
  dec->add_option("--precision", o->precision, "fp32 | bf16 (default fp32)");
  dec->add_flag("--recompute", o->recompute, "DeepSeek-V4: recompute the whole row every step (no KV cache)");
  dec->add_option("-t,--threads", o->threads, "threads (default TREX_THREADS or all cores)");
  dec->callback([o] {
    TREX_USER_CHECK(o->context >= 1 && o->n_new >= 1 && o->batch >= 1, "use --context, --new, --batch >= 1",
                    "bench decode: --context ", o->context, ", --new ", o->n_new, ", --batch ", o->batch);
    init_threads(o->threads);
    model::ModelConfig cfg = model::load_config_json(o->model + "/config.json");
    TREX_USER_CHECK(!o->recompute || (cfg.is_v4() && o->batch == 1), "drop --recompute, or use --batch 1",
                    "bench decode --recompute: only for DeepSeek-V4 and one sequence (", o->model, " is ",
                    cfg.model_type, ")");
    model::Model m(cfg, train::parse_precision(o->precision, "--precision"));
    model::load_hf_weights(m, o->model);
    const int64_t V = cfg.vocab_size, B = o->batch, C = o->context, N = o->n_new;
    Rng r(o->seed);
    std::vector<std::vector<int32_t>> ids(B, std::vector<int32_t>(C));
    for (auto& row : ids)
      for (auto& v : row) v = (int32_t)(r.next_u64() % V);
    double t0 = now_s(), t1 = 0;
    if (o->recompute) {
      std::vector<float> lg(V);
      std::vector<int32_t>& row = ids[0];
      m.v4_last_logits(row.data(), C, lg.data());
      t1 = now_s();
      for (int64_t s = 0; s < N; ++s) {
        row.push_back(argmax(lg.data(), V));
        m.v4_last_logits(row.data(), (int64_t)row.size(), lg.data());
      }
    } else {
      model::Decoder d(m, C + N, B);
      std::vector<model::DecoderPart> parts;
      for (int64_t b = 0; b < B; ++b) parts.push_back({b, ids[b].data(), C});
      const std::vector<float>* lg = &d.feed_batch(parts);
      t1 = now_s();
      std::vector<int32_t> next(B);
      for (int64_t s = 0; s < N; ++s) {
        for (int64_t b = 0; b < B; ++b) parts[b] = {b, &(next[b] = argmax(lg->data() + b * V, V)), 1};
        lg = &d.feed_batch(parts);
      }
    }
    const double t2 = now_s();
    std::printf("{\"model_type\": \"%s\", \"mode\": \"%s\", \"context\": %lld, \"new\": %lld, \"batch\": %lld, "
                "\"threads\": %d, \"precision\": \"%s\", \"prefill_s\": %.4f, \"decode_s\": %.4f, "
                "\"decode_tokens_per_s\": %.3f}\n",
                cfg.model_type.c_str(), o->recompute ? "recompute" : "cache", (long long)C, (long long)N, (long long)B,
                num_threads(), o->precision.c_str(), t1 - t0, t2 - t1, (double)(B * N) / (t2 - t1));
  });
}

}  // namespace trex::cli
