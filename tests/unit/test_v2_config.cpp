// DeepSeek-V2 / V2-Lite / V2.5 configs (model_type deepseek_v2, model/config_v2.cpp): what
// transformers' save_pretrained and DeepSeek's releases write reads into the V3 fields with V2's
// router (softmax, greedy / group_limited_greedy, scaled and never normalized weights); keys left
// out take DeepseekV2Config's defaults; what trex cannot compute as transformers does is refused
// naming the field; the layout has no router bias; config.json round-trips (save_pretrained's empty
// shared-expert tensors too); the KV-cache decoder scores as the training forward; and the
// model's gradient agrees with finite differences on configs the PyTorch dumps do not cover.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include "core/error.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "io/safetensors.h"
#include "model/checkpoint.h"
#include "model/generate.h"
#include "model/model.h"
#include "tests/tiny_configs.h"
#include "tests/unit/test_util.h"

using namespace trex;
using nlohmann::json;

namespace {

// What DeepSeek-V2-Lite's config.json holds (sizes shrunk, odd).
json lite_release() {
  return {{"architectures", {"DeepseekV2ForCausalLM"}}, {"model_type", "deepseek_v2"}, {"vocab_size", 91},
          {"hidden_size", 35}, {"intermediate_size", 41}, {"moe_intermediate_size", 9}, {"num_hidden_layers", 3},
          {"num_attention_heads", 5}, {"num_key_value_heads", 5}, {"n_shared_experts", 2}, {"n_routed_experts", 7},
          {"routed_scaling_factor", 1.0}, {"kv_lora_rank", 13}, {"q_lora_rank", nullptr}, {"qk_rope_head_dim", 4},
          {"v_head_dim", 7}, {"qk_nope_head_dim", 5}, {"topk_method", "greedy"}, {"n_group", 1}, {"topk_group", 1},
          {"num_experts_per_tok", 3}, {"moe_layer_freq", 1}, {"first_k_dense_replace", 1}, {"norm_topk_prob", false},
          {"scoring_func", "softmax"}, {"aux_loss_alpha", 0.001}, {"seq_aux", true}, {"hidden_act", "silu"},
          {"max_position_embeddings", 163840}, {"rms_norm_eps", 1e-6}, {"rope_theta", 10000},
          {"rope_scaling",
           {{"type", "yarn"}, {"factor", 40}, {"original_max_position_embeddings", 4096}, {"beta_fast", 32},
            {"beta_slow", 1}, {"mscale", 0.707}, {"mscale_all_dim", 0.707}}},
          {"attention_bias", false}, {"attention_dropout", 0.0}, {"tie_word_embeddings", false}};
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

TEST(V2Config, ReleaseConfigReadsIntoV2Routing) {
  const model::ModelConfig c = model::parse_config(lite_release(), "config.json");
  EXPECT_TRUE(c.is_v2());
  EXPECT_FALSE(c.is_v4());
  EXPECT_EQ(c.q_lora_rank, 0);  // null: plain q_proj
  EXPECT_EQ(c.scoring_func, model::ScoringFunc::Softmax);
  EXPECT_EQ(c.topk_method, model::TopkMethod::Greedy);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_TRUE(c.rope_interleave);
  EXPECT_TRUE(c.rope_scaling.yarn);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 40.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 4096);
  EXPECT_EQ(c.n_shared_experts, 2);
  EXPECT_EQ(c.first_k_dense_replace, 1);
  // aux_loss_alpha / seq_aux are release keys trex does not read (the aux loss is a run setting).
  const std::vector<std::string> unused = model::unused_config_keys(lite_release(), "config.json");
  EXPECT_EQ(unused, (std::vector<std::string>{"aux_loss_alpha", "seq_aux"}));
}

TEST(V2Config, MissingKeysTakeTransformersDefaults) {
  json j = {{"model_type", "deepseek_v2"}, {"num_experts_per_tok", 6}};
  const model::ModelConfig c = model::parse_config(j, "config.json");
  EXPECT_EQ(c.vocab_size, 102400);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.num_hidden_layers, 32);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.qk_nope_head_dim, 128);
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(c.v_head_dim, 128);
  EXPECT_EQ(c.n_routed_experts, 64);
  EXPECT_EQ(c.n_shared_experts, 2);
  EXPECT_EQ(c.moe_intermediate_size, 1407);
  EXPECT_EQ(c.first_k_dense_replace, 0);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_EQ(c.topk_method, model::TopkMethod::Greedy);
  EXPECT_FALSE(c.rope_scaling.yarn);
  // num_experts_per_tok has no default (None in transformers).
  EXPECT_TRUE(has(parse_error({{"model_type", "deepseek_v2"}}), "num_experts_per_tok"));
  // q_lora_rank = 0 is null (a TOML [model] table has no null).
  json z = lite_release();
  z["q_lora_rank"] = 0;
  EXPECT_EQ(model::parse_config(z, "run.toml").q_lora_rank, 0);
}

TEST(V2Config, GroupLimitedGreedyAndSavePretrainedForm) {
  json j = trex::testing::tiny_v2();
  // save_pretrained also writes these; transformers derives head_dim / qk_head_dim.
  j["head_dim"] = 4;
  j["qk_head_dim"] = 10;
  j["mlp_bias"] = false;
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5000.0}};
  const model::ModelConfig c = model::parse_config(j, "config.json");
  EXPECT_EQ(c.topk_method, model::TopkMethod::GroupLimitedGreedy);
  EXPECT_EQ(c.n_group, 3);
  EXPECT_EQ(c.topk_group, 2);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 1.5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 5000.0);
  EXPECT_TRUE(model::unused_config_keys(j, "config.json").empty());
  // Greedy never reads the groups (transformers ignores them): 7 experts in "3 groups" is fine.
  json g = lite_release();
  g["n_group"] = 3;
  g["topk_group"] = 2;
  EXPECT_EQ(parse_error(g), "");
  // group_limited_greedy without groups is an error naming them.
  json ng = trex::testing::tiny_v2();
  ng.erase("n_group");
  EXPECT_TRUE(has(parse_error(ng), "n_group")) << parse_error(ng);
}

TEST(V2Config, WhatTrexCannotComputeIdenticallyIsRefused) {
  struct Bad {
    const char* key;
    json value;
    const char* says;
  };
  for (const Bad& b : std::vector<Bad>{{"norm_topk_prob", true, "norm_topk_prob = true"},
                                       {"scoring_func", "sigmoid", "scoring_func 'sigmoid'"},
                                       {"topk_method", "noaux_tc", "topk_method 'noaux_tc'"},
                                       {"mlp_bias", true, "mlp_bias = true"},
                                       {"attention_bias", true, "attention_bias = true"},
                                       {"moe_layer_freq", 2, "moe_layer_freq 2"},
                                       {"rope_interleave", false, "rope_interleave = false"},
                                       {"num_key_value_heads", 1, "num_key_value_heads"},
                                       {"n_routed_experts", 0, "n_routed_experts"}}) {
    json j = lite_release();
    j[b.key] = b.value;
    const std::string e = parse_error(j);
    EXPECT_TRUE(has(e, b.says)) << b.key << ": " << e;
    EXPECT_TRUE(has(e, "config.json")) << e;
  }
  // With one expert per token transformers and the release code both scale: accepted.
  json one = lite_release();
  one["norm_topk_prob"] = true;
  one["num_experts_per_tok"] = 1;
  EXPECT_EQ(parse_error(one), "");
  EXPECT_FALSE(model::parse_config(one, "config.json").norm_topk_prob);
}

TEST(V2Config, LayoutHasNoRouterBiasAndConfigRoundTrips) {
  const model::ModelConfig c = model::parse_config(trex::testing::tiny_v2(), "tiny");
  model::Model m(c, kern::Prec::F32, {});
  m.init_random(3);
  EXPECT_TRUE(m.layout.buffers.empty());
  EXPECT_TRUE(m.layout.find("model.layers.1.self_attn.q_proj.weight"));
  EXPECT_FALSE(m.layout.find("model.layers.1.self_attn.q_a_proj.weight"));
  EXPECT_TRUE(m.layout.find("model.layers.2.mlp.experts.5.down_proj.weight"));
  test::TmpDir d("trex_v2_rt");
  model::save_hf_checkpoint(m, d.str(), DType::F32);
  const json saved = json::parse(std::ifstream(d.file("config.json")));
  EXPECT_EQ(saved["model_type"], "deepseek_v2");
  EXPECT_EQ(saved["architectures"][0], "DeepseekV2ForCausalLM");
  EXPECT_TRUE(saved["q_lora_rank"].is_null());
  EXPECT_EQ(saved["n_group"], 3);
  const model::ModelConfig c2 = model::load_config_json(d.file("config.json"));
  EXPECT_TRUE(c2.is_v2());
  EXPECT_EQ(model::config_to_json(c2), model::config_to_json(c));
  model::Model m2(c2, kern::Prec::F32, {});
  model::load_hf_weights(m2, d.str());
  EXPECT_EQ(0, std::memcmp(m.P(), m2.P(), sizeof(float) * (size_t)m.layout.total));
  // A greedy config writes null groups (as save_pretrained does) and reads back greedy.
  const model::ModelConfig lite = model::parse_config(lite_release(), "config.json");
  const json lj = json::parse(model::config_to_json(lite));
  EXPECT_TRUE(lj["n_group"].is_null());
  EXPECT_EQ(model::config_to_json(model::parse_config(lj, "saved")), model::config_to_json(lite));
}

// n_shared_experts = 0: transformers still builds the shared-expert MLP (width 0) and
// save_pretrained writes its empty tensors; they load as nothing. Other unknown tensors still fail.
TEST(V2Config, EmptySharedExpertTensorsOfSavePretrainedLoad) {
  json j = trex::testing::tiny_v2();
  j["n_shared_experts"] = 0;
  const model::ModelConfig c = model::parse_config(j, "tiny");
  model::Model m(c, kern::Prec::F32, {});
  m.init_random(4);
  test::TmpDir d("trex_v2_noshared");
  model::save_hf_checkpoint(m, d.str(), DType::F32);  // config.json
  const std::vector<float> zeros(40, 0.f);
  auto write = [&](const std::string& extra, const Shape& s) {
    std::vector<io::TensorToWrite> ts;
    for (const model::ParamEntry& e : m.layout.entries) ts.push_back({e.name, DType::F32, e.shape, m.P() + e.offset});
    ts.push_back({extra, DType::F32, s, zeros.data()});
    io::write_safetensors(d.file("model.safetensors"), ts);
  };
  const std::string sh = "model.layers.1.mlp.shared_experts.";
  write(sh + "down_proj.weight", Shape{40, 0});
  model::Model m2(c, kern::Prec::F32, {});
  model::load_hf_weights(m2, d.str());
  EXPECT_EQ(0, std::memcmp(m.P(), m2.P(), sizeof(float) * (size_t)m.layout.total));
  write(sh + "up_proj.weight", Shape{1, 40});  // not empty: not this model's
  EXPECT_THROW(model::load_hf_weights(m2, d.str()), UserError);
}

// Generation's KV-cache decoder (no router bias to read) scores a sequence as the training forward
// does, with YaRN.
TEST(V2Config, CachedDecodingMatchesTheTrainingForward) {
  init_threads();
  json j = trex::testing::tiny_v2();
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 2.0},
                          {"original_max_position_embeddings", 8}, {"mscale", 0.707}, {"mscale_all_dim", 0.707}};
  model::Model m(model::parse_config(j, "tiny"), kern::Prec::F32);
  m.init_random(21);
  Rng r(4);
  const int64_t T = 13, V = m.cfg.vocab_size;
  std::vector<int32_t> ids(T), tg(T, -100);
  for (auto& v : ids) v = (int32_t)(r.next_u64() % V);
  for (int64_t i = 0; i + 1 < T; ++i) tg[i] = ids[i + 1];
  const double ref = m.forward({1, T, ids.data(), tg.data(), nullptr, nullptr}).ce * (T - 1);
  auto log_softmax_at = [](const std::vector<float>& lg, int32_t t) {
    double mx = *std::max_element(lg.begin(), lg.end()), s = 0;
    for (float v : lg) s += std::exp(v - mx);
    return lg[t] - mx - std::log(s);
  };
  model::Decoder dec(m, T);
  double nll = 0;
  for (int64_t i = 0; i + 1 < T; ++i) nll -= log_softmax_at(dec.feed(&ids[i], 1), ids[i + 1]);
  EXPECT_NEAR(nll, ref, 1e-4 * ref);
}

// The gradient along a random direction of each tensor against a central finite difference.
void fd_check(json j, int64_t B, int64_t T, double aux) {
  init_threads();
  const model::ModelConfig cfg = model::parse_config(j, "test config");
  model::Model m(cfg, kern::Prec::F32, {aux});
  m.init_random(17);
  Rng r(5);
  std::vector<int32_t> ids(B * T), tg(B * T);
  for (auto& x : ids) x = (int32_t)(r.next_u64() % cfg.vocab_size);
  for (auto& x : tg) x = (int32_t)(r.next_u64() % cfg.vocab_size);
  tg[1] = -100;
  model::Batch b{B, T, ids.data(), tg.data(), nullptr, nullptr};
  m.zero_grads();
  ASSERT_TRUE(std::isfinite(m.forward_backward(b, 1.f).loss));
  const int64_t n = m.layout.total;
  std::vector<float> p0(m.P(), m.P() + n), g(m.G(), m.G() + n);
  auto loss_at = [&](const std::vector<float>& v, double t) {
    for (int64_t i = 0; i < n; ++i) m.P()[i] = p0[i] + (float)(t * v[i]);
    return m.forward(b).loss;
  };
  // A step of 1e-2 along a unit direction flips a near-tied expert selection of these softmax
  // routers (the loss jumps; every tensor's difference quotient is then off by the same jump).
  const double t = 1e-3;
  for (const model::ParamEntry& e : m.layout.entries) {
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

// Odd kv_lora_rank / qk_nope_head_dim (transformers' fp32 V2 cannot run them; trex can), top-1,
// one shared expert, every layer MoE, an aux loss.
TEST(V2Config, FiniteDifferenceOddLatentTop1) {
  json j = trex::testing::tiny_v2();
  j["kv_lora_rank"] = 9;
  j["qk_nope_head_dim"] = 5;
  j["num_experts_per_tok"] = 1;
  j["n_shared_experts"] = 1;
  j["first_k_dense_replace"] = 0;
  j["initializer_range"] = 0.3;
  fd_check(j, 2, 9, 0.01);
}

TEST(V2Config, FiniteDifferenceGreedyQLoraTied) {
  json j = trex::testing::tiny_v2();
  j["topk_method"] = "greedy";
  j["q_lora_rank"] = 11;
  j["tie_word_embeddings"] = true;
  j["routed_scaling_factor"] = 16.0;
  j["initializer_range"] = 0.3;
  fd_check(j, 1, 13, 0.0);
}

}  // namespace
