// Packing: several documents in one row, with positions restarting per document and attention
// confined to each document (segment ids), give the same summed loss and the same gradients
// as running each document alone.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include "core/parallel.h"
#include "core/rng.h"
#include "model/model.h"

using namespace trex;

namespace {

model::ModelConfig config() {
  nlohmann::json j = {{"vocab_size", 61}, {"hidden_size", 36}, {"num_hidden_layers", 3}, {"num_attention_heads", 3},
                      {"q_lora_rank", 20}, {"kv_lora_rank", 14}, {"qk_nope_head_dim", 8}, {"qk_rope_head_dim", 6},
                      {"v_head_dim", 7}, {"intermediate_size", 40}, {"moe_intermediate_size", 12},
                      {"n_routed_experts", 6}, {"n_shared_experts", 1}, {"num_experts_per_tok", 2},
                      {"first_k_dense_replace", 1}, {"n_group", 2}, {"topk_group", 1}, {"initializer_range", 0.2},
                      {"rope_scaling", {{"type", "yarn"}, {"factor", 2.0}, {"original_max_position_embeddings", 8},
                                        {"mscale_all_dim", 1.0}}}};
  return model::parse_config(j, "packing test config");
}

struct Doc {
  std::vector<int32_t> ids, targets;
};

TEST(Packing, PackedEqualsSeparate) {
  init_threads();
  model::ModelConfig cfg = config();
  Rng r(3);
  std::vector<Doc> docs(3);
  const int lens[3] = {5, 9, 4};
  for (int i = 0; i < 3; ++i) {
    for (int t = 0; t < lens[i]; ++t) docs[i].ids.push_back(r.next_u64() % cfg.vocab_size);
    for (int t = 0; t < lens[i]; ++t) docs[i].targets.push_back(t + 1 < lens[i] ? docs[i].ids[t + 1] : -100);
    docs[i].targets[1] = -100;  // a masked prompt token
  }
  const int64_t n = model::build_layout(cfg).total;

  // Each document alone: gradient of its summed loss.
  std::vector<double> sum_grad(n, 0.0);
  double sum_loss = 0;
  for (const Doc& d : docs) {
    model::Model m(cfg, kern::Prec::F32);
    m.init_random(17);
    const int64_t T = d.ids.size();
    model::Batch b{1, T, d.ids.data(), d.targets.data(), nullptr, nullptr};
    int64_t nv = 0;
    for (int32_t t : d.targets) nv += t != -100;
    model::LossParts lp = m.forward_backward(b, (float)nv);
    sum_loss += lp.ce * nv;
    for (int64_t i = 0; i < n; ++i) sum_grad[i] += m.G()[i];
  }

  // All three packed into one row of 18 tokens.
  std::vector<int32_t> ids, targets, pos, seg;
  for (int i = 0; i < 3; ++i)
    for (int t = 0; t < lens[i]; ++t) {
      ids.push_back(docs[i].ids[t]);
      targets.push_back(docs[i].targets[t]);
      pos.push_back(t);
      seg.push_back(i);
    }
  model::Model m(cfg, kern::Prec::F32);
  m.init_random(17);
  int64_t nv = 0;
  for (int32_t t : targets) nv += t != -100;
  model::Batch b{1, (int64_t)ids.size(), ids.data(), targets.data(), pos.data(), seg.data()};
  model::LossParts lp = m.forward_backward(b, (float)nv);
  EXPECT_NEAR(lp.ce * nv, sum_loss, 1e-5 * std::abs(sum_loss));
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num += (m.G()[i] - sum_grad[i]) * (m.G()[i] - sum_grad[i]);
    den += sum_grad[i] * sum_grad[i];
  }
  EXPECT_LT(std::sqrt(num / den), 1e-5);

  // Without segment ids the documents see each other: the loss must differ (the test can fail).
  model::Model m2(cfg, kern::Prec::F32);
  m2.init_random(17);
  model::Batch leak{1, (int64_t)ids.size(), ids.data(), targets.data(), pos.data(), nullptr};
  EXPECT_GT(std::abs(m2.forward(leak).ce * nv - sum_loss), 1e-4);
}

}  // namespace
