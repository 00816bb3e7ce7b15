// trex demo: trains a small DeepSeek-V3-shaped MoE (MLA, 1 dense + 2 MoE layers, 9 routed
// experts, group-limited top-2 routing, YaRN) on a built-in byte-level corpus and prints the
// loss falling. The post-training issues replace this with the CPT/SFT pipeline.
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include "cli/commands.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "train/trainer.h"

namespace trex::cli {

namespace {

const char* kCorpus =
    "A linear program chooses nonnegative quantities to maximize profit subject to limited resources. "
    "Each product uses machine hours and labor; the plant has 240 machine hours and 180 labor hours. "
    "Product A earns 30 per unit and uses 2 machine hours and 1 labor hour. Product B earns 40 per unit "
    "and uses 1 machine hour and 2 labor hours. The optimal plan makes 100 units of A and 40 units of B. "
    "In a transportation problem, supplies at warehouses meet demands at stores at least cost. "
    "The decision variable x_ij is the amount shipped from warehouse i to store j. Every store's demand "
    "must be met and no warehouse may ship more than it holds. A knapsack problem picks items of given "
    "weight and value to fill a bag of fixed capacity with the largest total value; each item is taken "
    "or left, so the variables are binary. A set cover selects the fewest sets whose union covers every "
    "element. Shift scheduling assigns workers to overlapping shifts so that every hour is staffed at "
    "minimum wage cost. The dual price of a constraint tells how much the objective improves when its "
    "right-hand side grows by one unit. A mixed-integer program is solved by branch and bound, which "
    "explores a tree of linear relaxations and prunes branches whose bound cannot beat the incumbent. ";

nlohmann::json demo_config() {
  return {{"model_type", "deepseek_v3"}, {"vocab_size", 256}, {"hidden_size", 96},
          {"num_hidden_layers", 3}, {"first_k_dense_replace", 1}, {"intermediate_size", 192},
          {"moe_intermediate_size", 48}, {"n_routed_experts", 9}, {"n_shared_experts", 1},
          {"num_experts_per_tok", 2}, {"n_group", 3}, {"topk_group", 2}, {"topk_method", "noaux_tc"},
          {"scoring_func", "sigmoid"}, {"norm_topk_prob", true}, {"routed_scaling_factor", 2.0},
          {"num_attention_heads", 3}, {"q_lora_rank", 48}, {"kv_lora_rank", 32}, {"qk_nope_head_dim", 16},
          {"qk_rope_head_dim", 8}, {"v_head_dim", 16}, {"max_position_embeddings", 256}, {"rope_theta", 10000.0},
          {"rope_scaling", {{"type", "yarn"}, {"factor", 2.0}, {"original_max_position_embeddings", 64},
                            {"beta_fast", 32}, {"beta_slow", 1}, {"mscale", 1.0}, {"mscale_all_dim", 1.0}}},
          {"initializer_range", 0.05}};
}

}  // namespace

void add_demo(CLI::App& app) {
  auto* cmd = app.add_subcommand("demo", "train a small MoE on a built-in corpus and show the loss falling");
  struct Opts {
    int steps = 300, threads = 0;
    std::string precision = "bf16";
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--steps", o->steps, "optimizer steps");
  cmd->add_option("--threads", o->threads, "threads");
  cmd->add_option("--precision", o->precision, "fp32 or bf16");
  cmd->callback([o] {
    int threads = init_threads(o->threads);
    model::ModelConfig cfg = model::parse_config(demo_config(), "built-in demo config");
    kern::Prec prec = o->precision == "fp32" ? kern::Prec::F32 : kern::Prec::BF16;
    model::Model m(cfg, prec, {0.0});
    m.init_random(7);
    train::AdamW opt(m, {3e-3f, 0.9f, 0.95f, 1e-8f, 0.01f, 1.0f});
    const std::string text(kCorpus);
    const int64_t B = 8, T = 96, N = B * T;
    std::printf("trex demo: %lld params (%lld active), %lld layers, %lld experts top-%lld, %s, %d threads\n",
                (long long)cfg.num_params(), (long long)cfg.num_active_params(), (long long)cfg.num_hidden_layers,
                (long long)cfg.n_routed_experts, (long long)cfg.num_experts_per_tok, o->precision.c_str(), threads);
    Rng rng(11);
    std::vector<int32_t> ids(N), targets(N);
    double first = 0, last = 0, ms = 0;
    for (int s = 0; s < o->steps; ++s) {
      for (int64_t b = 0; b < B; ++b) {
        size_t start = rng.next_u64() % (text.size() - T - 1);
        for (int64_t t = 0; t < T; ++t) {
          ids[b * T + t] = (unsigned char)text[start + t];
          targets[b * T + t] = (unsigned char)text[start + t + 1];
        }
      }
      // Warm-up then cosine decay.
      float lr = 3e-3f * std::min(1.f, (s + 1) / 20.f) * (0.55f + 0.45f * std::cos(3.14159265f * s / o->steps));
      model::Batch bt{B, T, ids.data(), targets.data(), nullptr, nullptr};
      train::StepStats st = train::trainer_step(m, opt, {bt}, lr, 1e-3f);
      if (s == 0) first = st.loss;
      last = st.loss;
      ms += st.ms;
      if (s % 25 == 0 || s == o->steps - 1)
        std::printf("step %4d  loss %.4f  grad_norm %.3f  lr %.2e  %.1f ms/step\n", s, st.loss, st.grad_norm, lr, st.ms);
    }
    std::printf("loss %.4f -> %.4f over %d steps (uniform over 256 bytes would be %.4f); %.1f s total\n", first, last,
                o->steps, std::log(256.0), ms / 1000);
  });
}

}  // namespace trex::cli
