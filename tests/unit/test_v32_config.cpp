// DeepSeek-V3.2 configs (model_type deepseek_v32, model/config_v32.cpp) and its indexer
// (model/v32_indexer.cpp): what DeepSeek's V3.2-Exp release and transformers' save_pretrained
// write reads into the V3 fields plus the indexer's; keys left out take DeepseekV32Config's
// defaults; what trex cannot compute as transformers does is refused naming the field; the layout
// holds the indexer's tensors under transformers' names, frozen (no gradient); config.json
// round-trips; packed documents select only inside themselves (a packed row scores as its
// documents alone); and the model's gradient agrees with finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include "core/error.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "model/checkpoint.h"
#include "model/model.h"
#include "tests/tiny_configs.h"
#include "tests/unit/test_util.h"

using namespace trex;
using nlohmann::json;

namespace {

// What DeepSeek-V3.2-Exp's config.json holds (sizes shrunk, odd).
json release() {
  return {{"architectures", {"DeepseekV32ForCausalLM"}}, {"model_type", "deepseek_v32"}, {"vocab_size", 91},
          {"hidden_size", 35}, {"intermediate_size", 41}, {"moe_intermediate_size", 9}, {"num_hidden_layers", 3},
          {"num_attention_heads", 5}, {"num_key_value_heads", 5}, {"n_shared_experts", 1}, {"n_routed_experts", 8},
          {"routed_scaling_factor", 2.5}, {"kv_lora_rank", 13}, {"q_lora_rank", 15}, {"qk_rope_head_dim", 4},
          {"v_head_dim", 7}, {"qk_nope_head_dim", 5}, {"topk_method", "noaux_tc"}, {"n_group", 4},
          {"topk_group", 2}, {"num_experts_per_tok", 3}, {"moe_layer_freq", 1}, {"first_k_dense_replace", 1},
          {"norm_topk_prob", true}, {"scoring_func", "sigmoid"}, {"hidden_act", "silu"},
          {"max_position_embeddings", 163840}, {"rms_norm_eps", 1e-6}, {"rope_theta", 10000},
          {"rope_scaling",
           {{"type", "yarn"}, {"factor", 40}, {"original_max_position_embeddings", 4096}, {"beta_fast", 32},
            {"beta_slow", 1}, {"mscale", 1.0}, {"mscale_all_dim", 1.0}}},
          {"index_topk", 7}, {"index_head_dim", 9}, {"index_n_heads", 3}, {"num_nextn_predict_layers", 0},
          {"ep_size", 1}, {"attention_bias", false}, {"attention_dropout", 0.0}, {"tie_word_embeddings", false}};
}

std::string parse_error(const json& j) {
  try {
    model::parse_config(j, "config.json");
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(V32Config, ReleaseConfigReadsIntoV3FieldsAndTheIndexer) {
  const model::ModelConfig c = model::parse_config(release(), "config.json");
  EXPECT_TRUE(c.is_v32());
  EXPECT_FALSE(c.is_v2() || c.is_v4());
  EXPECT_EQ(c.q_lora_rank, 15);
  EXPECT_EQ(c.scoring_func, model::ScoringFunc::Sigmoid);
  EXPECT_EQ(c.topk_method, model::TopkMethod::NoauxTc);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_TRUE(c.rope_scaling.yarn);
  EXPECT_EQ(c.v32.index_topk, 7);
  EXPECT_EQ(c.v32.index_head_dim, 9);
  EXPECT_EQ(c.v32.index_n_heads, 3);
  EXPECT_EQ(c.first_k_dense_replace, 1);
  const std::vector<std::string> unused = model::unused_config_keys(release(), "config.json");
  EXPECT_TRUE(unused.empty() || unused == std::vector<std::string>{"ep_size"});
}

TEST(V32Config, MissingKeysTakeTransformersDefaults) {
  const model::ModelConfig c = model::parse_config({{"model_type", "deepseek_v32"}}, "config.json");
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.num_hidden_layers, 61);
  EXPECT_EQ(c.num_attention_heads, 128);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.n_routed_experts, 256);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.n_group, 8);
  EXPECT_EQ(c.topk_group, 4);
  EXPECT_EQ(c.first_k_dense_replace, 3);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_EQ(c.max_position_embeddings, 163840);
  EXPECT_EQ(c.v32.index_topk, 2048);
  EXPECT_EQ(c.v32.index_head_dim, 128);
  EXPECT_EQ(c.v32.index_n_heads, 64);
  // num_key_value_heads defaults to 128: equal to num_attention_heads or refused, as transformers
  // cannot run the model otherwise.
  json j = trex::testing::tiny_v32();
  j.erase("num_key_value_heads");
  EXPECT_TRUE(has(parse_error(j), "num_key_value_heads")) << parse_error(j);
}

TEST(V32Config, SavePretrainedFormWithLayerTypes) {
  json j = trex::testing::tiny_v32();
  j.erase("first_k_dense_replace");  // mlp_layer_types decides, as in transformers
  j["mlp_layer_types"] = {"dense", "dense", "sparse"};
  j["layer_types"] = {"indexed_attention", "indexed_attention", "indexed_attention"};
  j["head_dim"] = 4;
  j["qk_head_dim"] = 10;
  j["output_router_logits"] = false;
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5000.0}};
  const model::ModelConfig c = model::parse_config(j, "config.json");
  EXPECT_EQ(c.first_k_dense_replace, 2);
  EXPECT_DOUBLE_EQ(c.rope_theta, 5000.0);
  EXPECT_TRUE(model::unused_config_keys(j, "config.json").empty()) << model::unused_config_keys(j, "c")[0];
}

TEST(V32Config, WhatTrexCannotComputeIdenticallyIsRefused) {
  struct Bad {
    const char* key;
    json value;
    const char* says;
  };
  for (const Bad& b : std::vector<Bad>{{"q_lora_rank", nullptr, "q_lora_rank null"},
                                       {"q_lora_rank", 0, "q_lora_rank null"},
                                       {"scoring_func", "softmax", "scoring_func 'softmax'"},
                                       {"topk_method", "greedy", "topk_method 'greedy'"},
                                       {"mlp_bias", true, "mlp_bias = true"},
                                       {"attention_bias", true, "attention_bias = true"},
                                       {"rope_interleave", false, "rope_interleave = false"},
                                       {"index_head_dim", 3, "index_head_dim (3)"},
                                       {"index_topk", 0, "index_topk"},
                                       {"layer_types", {"indexed_attention", "full_attention", "indexed_attention"},
                                        "layer_types entry \"full_attention\""},
                                       {"mlp_layer_types", {"dense", "sparse", "dense"}, "mlp_layer_types[2]"},
                                       {"n_routed_experts", 0, "n_routed_experts"}}) {
    json j = release();
    j[b.key] = b.value;
    const std::string e = parse_error(j);
    EXPECT_TRUE(has(e, b.says)) << b.key << ": " << e;
    EXPECT_TRUE(has(e, "config.json")) << e;
  }
}

TEST(V32Config, LayoutHoldsTheFrozenIndexerAndConfigRoundTrips) {
  const model::ModelConfig c = model::parse_config(trex::testing::tiny_v32(), "tiny");
  model::Model m(c, kern::Prec::F32, {});
  m.init_random(3);
  for (const char* t : {"wq_b.weight", "wk.weight", "k_norm.weight", "k_norm.bias", "weights_proj.weight"}) {
    const model::ParamEntry* e = m.layout.find(std::string("model.layers.2.self_attn.indexer.") + t);
    ASSERT_TRUE(e) << t;
    EXPECT_TRUE(e->frozen) << t;
  }
  EXPECT_EQ(m.P()[m.layout.find("model.layers.0.self_attn.indexer.k_norm.bias")->offset], 0.f);  // nn.LayerNorm
  EXPECT_EQ(m.P()[m.layout.find("model.layers.0.self_attn.indexer.k_norm.weight")->offset], 1.f);
  int64_t n = 0;
  for (const model::ParamEntry& e : m.layout.entries) n += e.shape.numel();
  EXPECT_EQ(n, c.num_params());
  test::TmpDir d("trex_v32_rt");
  model::save_hf_checkpoint(m, d.str(), DType::F32);
  const json saved = json::parse(std::ifstream(d.file("config.json")));
  EXPECT_EQ(saved["model_type"], "deepseek_v32");
  EXPECT_EQ(saved["architectures"][0], "DeepseekV32ForCausalLM");
  EXPECT_EQ(saved["index_topk"], 5);
  EXPECT_EQ(saved["mlp_layer_types"], json({"dense", "sparse", "sparse"}));
  const model::ModelConfig c2 = model::load_config_json(d.file("config.json"));
  EXPECT_TRUE(c2.is_v32());
  EXPECT_EQ(model::config_to_json(c2), model::config_to_json(c));
  model::Model m2(c2, kern::Prec::F32, {});
  model::load_hf_weights(m2, d.str());
  EXPECT_EQ(0, std::memcmp(m.P(), m2.P(), sizeof(float) * (size_t)m.layout.total));
}

// The indexer's tensors get no gradient (transformers runs the indexer under no_grad); the
// attention's do.
TEST(V32Config, IndexerGetsNoGradient) {
  init_threads();
  const model::ModelConfig c = model::parse_config(trex::testing::tiny_v32(), "tiny");
  model::Model m(c, kern::Prec::F32, {});
  m.init_random(5);
  Rng r(2);
  const int64_t T = 17;
  std::vector<int32_t> ids(T), tg(T);
  for (auto& x : ids) x = (int32_t)(r.next_u64() % c.vocab_size);
  for (auto& x : tg) x = (int32_t)(r.next_u64() % c.vocab_size);
  m.zero_grads();
  m.forward_backward({1, T, ids.data(), tg.data(), nullptr, nullptr}, 1.f);
  for (const model::ParamEntry& e : m.layout.entries) {
    double s = 0;
    for (int64_t i = 0; i < e.shape.numel(); ++i) s += std::abs(m.G()[e.offset + i]);
    if (e.frozen) {
      EXPECT_EQ(s, 0.0) << e.name;
    } else if (e.name.find("q_b_proj") != std::string::npos) {
      EXPECT_GT(s, 0.0) << e.name;
    }
  }
}

// Two documents packed in one row (seg ids, positions restarting) score as each alone: the
// indexer ranks only the tokens of the query's own document.
TEST(V32Config, PackedDocumentsSelectInsideThemselves) {
  init_threads();
  const model::ModelConfig c = model::parse_config(trex::testing::tiny_v32(), "tiny");
  model::Model m(c, kern::Prec::F32, {});
  m.init_random(7);
  Rng r(9);
  const int64_t La = 9, Lb = 12, T = La + Lb;
  std::vector<int32_t> ids(T), tg(T, -100), pos(T), seg(T);
  for (auto& x : ids) x = (int32_t)(r.next_u64() % c.vocab_size);
  for (int64_t t = 0; t < T; ++t) {
    const bool a = t < La;
    pos[t] = (int32_t)(a ? t : t - La);
    seg[t] = a ? 0 : 1;
    if (t + 1 < T && (t + 1 < La) == a) tg[t] = ids[t + 1];
  }
  auto nll = [&](const model::Batch& b) {
    int64_t nv = 0;
    for (int64_t i = 0; i < b.B * b.T; ++i) nv += b.targets[i] != -100;
    return m.forward(b).ce * (double)nv;
  };
  const double packed = nll({1, T, ids.data(), tg.data(), pos.data(), seg.data()});
  const double alone = nll({1, La, ids.data(), tg.data(), nullptr, nullptr}) +
                       nll({1, Lb, ids.data() + La, tg.data() + La, nullptr, nullptr});
  EXPECT_NEAR(packed, alone, 1e-5 * alone);
}

// The gradient along a random direction of each tensor against a central finite difference
// (the selections stay put for a step of 1e-3 on this seed).
TEST(V32Config, FiniteDifference) {
  init_threads();
  json j = trex::testing::tiny_v32();
  j["initializer_range"] = 0.3;
  const model::ModelConfig cfg = model::parse_config(j, "test config");
  model::Model m(cfg, kern::Prec::F32, {0.01});
  m.init_random(17);
  Rng r(5);
  const int64_t B = 2, T = 11;
  std::vector<int32_t> ids(B * T), tg(B * T);
  for (auto& x : ids) x = (int32_t)(r.next_u64() % cfg.vocab_size);
  for (auto& x : tg) x = (int32_t)(r.next_u64() % cfg.vocab_size);
  model::Batch b{B, T, ids.data(), tg.data(), nullptr, nullptr};
  m.zero_grads();
  ASSERT_TRUE(std::isfinite(m.forward_backward(b, 1.f).loss));
  const int64_t n = m.layout.total;
  std::vector<float> p0(m.P(), m.P() + n), g(m.G(), m.G() + n);
  auto loss_at = [&](const std::vector<float>& v, double t) {
    for (int64_t i = 0; i < n; ++i) m.P()[i] = p0[i] + (float)(t * v[i]);
    return m.forward(b).loss;
  };
  const double t = 1e-3;
  for (const model::ParamEntry& e : m.layout.entries) {
    if (e.frozen) continue;  // a step moves the selection, not a gradient
    std::vector<float> v(n, 0.f);
    double gv = 0, vv = 0;
    for (int64_t i = e.offset; i < e.offset + e.shape.numel(); ++i) vv += (v[i] = (float)r.normal()) * v[i];
    for (int64_t i = e.offset; i < e.offset + e.shape.numel(); ++i) {
      v[i] = (float)(v[i] / std::sqrt(vv));
      gv += (double)g[i] * v[i];
    }
    const double fd = (loss_at(v, t) - loss_at(v, -t)) / (2 * t);
    EXPECT_NEAR(fd, gv, 3e-2 * std::abs(gv) + 1e-3) << e.name;
  }
}

}  // namespace
