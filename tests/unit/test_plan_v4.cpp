// The planner's DeepSeek-V4 architecture agrees with model/'s config parser and counts: for
// bench-v4 (configs/bench-v4.toml), the V4-Flash and V4-Pro built-ins and a config with odd sizes
// (odd compress rates, window, dims, tied embeddings, 2 MTP modules), the planner's total and
// active parameters and model FLOPs per token equal ModelConfig::num_params / num_active_params /
// train_flops_per_token (model/config_v4.cpp: 6 x active + 12 H hd per attended key + 2 nI dI per
// scored CSA entry), its MTP modules equal what model::with_mtp adds, and the layer kinds, hash
// layers and shapes follow the parsed config.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include "core/error.h"
#include "io/toml_json.h"
#include "plan/arch.h"
#include "test_util.h"

using namespace trex;
using namespace trex::plan;
using nlohmann::json;

namespace {

std::string bench_v4_path() {
  namespace fs = std::filesystem;
  const fs::path p = fs::path(__FILE__).parent_path().parent_path().parent_path() / "configs" / "bench-v4.toml";
  return fs::exists(p) ? p.string() : "configs/bench-v4.toml";
}

// Odd sizes everywhere: CSA rate 3, HCA rate 29, window 37, 7 layers of mixed kinds, hash layers
// not at the front, 2 shared experts, tied embeddings, 3 streams, 2 MTP modules.
json odd_json() {
  return {{"model_type", "deepseek_v4"}, {"vocab_size", 1000}, {"hidden_size", 200}, {"num_hidden_layers", 7},
          {"num_attention_heads", 6}, {"head_dim", 40}, {"qk_rope_head_dim", 8}, {"q_lora_rank", 72},
          {"o_groups", 3}, {"o_lora_rank", 52}, {"n_routed_experts", 13}, {"n_shared_experts", 2},
          {"num_experts_per_tok", 3}, {"moe_intermediate_size", 56}, {"sliding_window", 37},
          {"compress_rates", {{"compressed_sparse_attention", 3}, {"heavily_compressed_attention", 29}}},
          {"layer_types", {"heavily_compressed_attention", "sliding_attention", "compressed_sparse_attention",
                           "compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention",
                           "compressed_sparse_attention"}},
          {"mlp_layer_types", {"hash_moe", "moe", "hash_moe", "moe", "moe", "moe", "moe"}},
          {"index_n_heads", 5}, {"index_head_dim", 24}, {"index_topk", 11}, {"hc_mult", 3}, {"hc_sinkhorn_iters", 7},
          {"num_nextn_predict_layers", 2}, {"tie_word_embeddings", true}};
}

struct Case {
  std::string name;
  model::ModelConfig config;
  ArchModel arch;
};

std::vector<Case> cases() {
  std::vector<Case> v;
  const std::string bench = bench_v4_path();
  v.push_back({"bench-v4", model::parse_config(io::load_toml_as_json(bench)["model"], bench), resolve_model(bench)});
  v.push_back({"deepseek-v4-flash", deepseek_v4_flash_config(), resolve_model("deepseek-v4-flash")});
  v.push_back({"deepseek-v4-pro", deepseek_v4_pro_config(), resolve_model("deepseek-v4-pro")});
  model::ModelConfig odd = model::parse_config(odd_json(), "odd");
  v.push_back({"odd", odd, arch_from_config(odd, "odd")});
  return v;
}

}  // namespace

TEST(PlanV4, CountsEqualModelConfig) {
  for (const Case& k : cases()) {
    const model::ModelConfig& c = k.config;
    const ArchModel& a = k.arch;
    ASSERT_TRUE(c.is_v4()) << k.name;
    EXPECT_EQ(a.family, "deepseek_v4") << k.name;
    EXPECT_EQ(c.v4.mtp_layers, 0) << k.name;  // the published counts exclude MTP; so does the planner
    EXPECT_EQ(std::llround(a.total_params()), c.num_params()) << k.name;
    EXPECT_EQ(std::llround(a.active_params()), c.num_active_params()) << k.name;
    for (int64_t T : {1, 2, 36, 37, 38, 128, 129, 2048, 4096, 5001, 65536}) {
      const double ref = c.train_flops_per_token(T);
      EXPECT_NEAR(a.model_flops_per_token(T), ref, 1e-12 * ref) << k.name << " T " << T;
    }
  }
}

TEST(PlanV4, MtpModulesEqualWithMtp) {
  // What model::with_mtp adds (parameters, active parameters, FLOPs) is the planner's MTP module:
  // its block, the extra projections / norms / hc_head, and the shared LM head once more.
  for (const Case& k : cases()) {
    const model::ModelConfig& c = k.config;
    const ArchModel& a = k.arch;
    ASSERT_GT(c.num_nextn_predict_layers, 0) << k.name;
    EXPECT_EQ(a.mtp_modules, c.num_nextn_predict_layers) << k.name;
    const model::ModelConfig m = model::with_mtp(c, c.num_nextn_predict_layers);
    const double n = (double)a.mtp_modules;
    const LayerCost& b = a.mtp_block;
    EXPECT_EQ(b.attn.kind, AttnKind::SlidingWindow) << k.name;
    EXPECT_FALSE(b.hash_routed) << k.name;
    const double block_active = b.active_matmul_params + a.mtp_extra_matmul_params + a.head_params;
    const double block_total = b.dense_params + b.expert_params + a.mtp_extra_params;
    EXPECT_EQ(std::llround(n * block_total), m.num_params() - c.num_params()) << k.name;
    EXPECT_EQ(std::llround(n * block_active), m.num_active_params() - c.num_active_params()) << k.name;
    for (int64_t T : {1, 37, 4096}) {
      const double planner =
          a.model_flops_per_token(T) + n * (6.0 * block_active + 3.0 * attn_core_fwd_flops(b.attn, T));
      EXPECT_NEAR(planner, m.train_flops_per_token(T), 1e-12 * planner) << k.name << " T " << T;
    }
  }
}

TEST(PlanV4, LayersFollowTheParsedConfig) {
  for (const Case& k : cases()) {
    const model::ModelConfig& c = k.config;
    const ArchModel& a = k.arch;
    ASSERT_EQ(a.n_layers(), c.num_hidden_layers) << k.name;
    EXPECT_EQ(a.hidden, c.hidden_size);
    EXPECT_EQ(a.vocab, c.vocab_size);
    EXPECT_EQ(a.heads, c.num_attention_heads);
    EXPECT_EQ(a.hc_mult, c.v4.hc_mult);
    EXPECT_EQ(a.residual_width(), c.v4.hc_mult * c.hidden_size);
    EXPECT_EQ(a.n_experts, c.n_routed_experts);
    EXPECT_EQ(a.topk, c.num_experts_per_tok);
    EXPECT_EQ(a.tied_embeddings, c.tie_word_embeddings);
    for (int64_t l = 0; l < a.n_layers(); ++l) {
      const LayerCost& L = a.layers[l];
      const AttnKind want = c.v4.attn[l] == model::AttnKind::CSA   ? AttnKind::CSA
                            : c.v4.attn[l] == model::AttnKind::HCA ? AttnKind::HCA
                                                                   : AttnKind::SlidingWindow;
      EXPECT_EQ(L.attn.kind, want) << k.name << " layer " << l;
      EXPECT_EQ(L.attn.compress_ratio, c.v4.rate(l)) << k.name << " layer " << l;
      EXPECT_EQ(L.attn.window, c.v4.sliding_window);
      EXPECT_EQ(L.attn.heads, c.num_attention_heads);
      EXPECT_EQ(L.attn.qk_dim, c.v4.head_dim);
      EXPECT_EQ(L.attn.v_dim, c.v4.head_dim);
      EXPECT_EQ(L.attn.index_topk, want == AttnKind::CSA ? c.v4.index_topk : 0);
      EXPECT_EQ(L.attn.index_heads, want == AttnKind::CSA ? c.v4.index_n_heads : 0);
      EXPECT_EQ(L.attn.index_dim, want == AttnKind::CSA ? c.v4.index_head_dim : 0);
      EXPECT_EQ(L.hash_routed, c.v4.hash[l] != 0) << k.name << " layer " << l;
      EXPECT_TRUE(L.moe);
      EXPECT_EQ(L.input_elems, (double)(c.v4.hc_mult * c.hidden_size));
      EXPECT_DOUBLE_EQ(L.expert_params, (double)c.n_routed_experts * 3 * c.hidden_size * c.moe_intermediate_size);
    }
  }
  // The figures themselves, for the configs whose layouts are known by heart.
  const std::vector<Case> all = cases();
  const ArchModel& bench = all[0].arch;
  std::string kinds;
  for (const LayerCost& L : bench.layers) kinds += L.kind + " ";
  EXPECT_EQ(kinds, "swa+moe(hash) csa+moe hca+moe csa+moe ");
  EXPECT_EQ(bench.layers[1].attn.compress_ratio, 4);
  EXPECT_EQ(bench.layers[2].attn.compress_ratio, 128);
  EXPECT_EQ(bench.layers[1].attn.index_topk, 128);
  const ArchModel& flash = all[1].arch;
  EXPECT_EQ(flash.layers[0].kind, "swa+moe(hash)");
  EXPECT_EQ(flash.layers[2].kind, "csa+moe(hash)");
  EXPECT_EQ(flash.layers[3].kind, "hca+moe");
  EXPECT_EQ(flash.layers[42].kind, "csa+moe");
  EXPECT_EQ(all[2].arch.layers[0].kind, "hca+moe(hash)");
  EXPECT_EQ(all[2].arch.layers[60].attn.index_topk, 1024);
  const ArchModel& odd = all[3].arch;
  EXPECT_EQ(odd.layers[2].kind, "csa+moe(hash)");
  EXPECT_EQ(odd.layers[2].attn.compress_ratio, 3);
  EXPECT_EQ(odd.layers[4].attn.compress_ratio, 29);
  EXPECT_EQ(odd.layers[5].attn.window, 37);
}

TEST(PlanV4, ConfigFilesResolveLikeTheBuiltins) {
  // A deepseek_v4 config.json (file and model directory) goes through model::parse_config and
  // gives the built-in's architecture.
  test::TmpDir dir("trex_plan_v4");
  json j = odd_json();
  {
    std::ofstream f(dir.path / "config.json");
    f << j.dump();
  }
  const model::ModelConfig c = model::parse_config(j, "odd");
  for (const std::string& p : {(dir.path / "config.json").string(), dir.path.string()}) {
    ArchModel a = resolve_model(p);
    EXPECT_EQ(std::llround(a.total_params()), c.num_params()) << p;
    EXPECT_EQ(std::llround(a.active_params()), c.num_active_params()) << p;
    EXPECT_EQ(a.mtp_modules, 2) << p;
  }
  // A TOML run config whose [model] table is the same object.
  {
    std::ofstream f(dir.path / "run.toml");
    f << "[model]\nmodel_type = \"deepseek_v4\"\nvocab_size = 1000\nhidden_size = 200\nnum_hidden_layers = 7\n"
         "num_attention_heads = 6\nhead_dim = 40\nqk_rope_head_dim = 8\nq_lora_rank = 72\no_groups = 3\n"
         "o_lora_rank = 52\nn_routed_experts = 13\nn_shared_experts = 2\nnum_experts_per_tok = 3\n"
         "moe_intermediate_size = 56\nsliding_window = 37\n"
         "compress_rates = { compressed_sparse_attention = 3, heavily_compressed_attention = 29 }\n"
         "layer_types = [\"heavily_compressed_attention\", \"sliding_attention\", \"compressed_sparse_attention\", "
         "\"compressed_sparse_attention\", \"heavily_compressed_attention\", \"sliding_attention\", "
         "\"compressed_sparse_attention\"]\n"
         "mlp_layer_types = [\"hash_moe\", \"moe\", \"hash_moe\", \"moe\", \"moe\", \"moe\", \"moe\"]\n"
         "index_n_heads = 5\nindex_head_dim = 24\nindex_topk = 11\nhc_mult = 3\nhc_sinkhorn_iters = 7\n"
         "num_nextn_predict_layers = 2\ntie_word_embeddings = true\n";
  }
  ArchModel t = resolve_model((dir.path / "run.toml").string());
  EXPECT_EQ(std::llround(t.total_params()), c.num_params());
  EXPECT_DOUBLE_EQ(t.model_flops_per_token(4096), c.train_flops_per_token(4096));
  // The parser's checks apply: one shared KV head only.
  j["num_key_value_heads"] = 2;
  {
    std::ofstream f(dir.path / "config.json");
    f << j.dump();
  }
  try {
    resolve_model((dir.path / "config.json").string());
    ADD_FAILURE() << "num_key_value_heads = 2 accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("num_key_value_heads"), std::string::npos) << e.what();
  }
}
