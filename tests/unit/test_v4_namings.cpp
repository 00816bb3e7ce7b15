// DeepSeek-V4 checkpoints under the naming transformers' save_pretrained writes (the in-memory
// names with the conversion mapping's rules reversed, behind the model. prefix) load into the
// same weights as the original release naming trex writes; a tensor that two namings put in one
// place is refused with both names.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>
#include "core/error.h"
#include "io/safetensors.h"
#include "model/checkpoint.h"
#include "tests/tiny_configs.h"

namespace {
using namespace trex;
namespace fs = std::filesystem;

// The save_pretrained name of an original-release name, written out independently of the loader's
// rules: model. + the original name, except the tensors whose rules are anchored at the start of
// the name (embed, head, hc_head_*), and the attention's kv_norm, which the reversed rule
// .norm. -> .kv_norm. turns into attn.norm (`kv_style`: keep kv_norm, as a writer might).
std::string saved_name(const std::string& n, bool kv_style) {
  if (n == "head.weight") return n;
  if (n == "embed.weight") return "model.embed_tokens.weight";
  if (n.rfind("hc_head_", 0) == 0) return "model.hc_head.hc_" + n.substr(8);
  std::string s = "model." + n;
  if (!kv_style)
    if (size_t p = s.find(".attn.kv_norm."); p != std::string::npos) s.replace(p, 14, ".attn.norm.");
  return s;
}

// dir_in's tensors copied to dir_out under rename(name).
void copy_renamed(const std::string& in, const std::string& out, const std::function<std::string(const std::string&)>& f,
                  const std::string& extra_dup = "") {
  io::SafetensorsDir ck = io::SafetensorsDir::open(in);
  std::vector<io::TensorToWrite> ts;
  for (const std::string& n : ck.names()) {
    const io::SafetensorsFile* file = nullptr;
    const io::TensorInfo* t = ck.find(n, &file);
    ts.push_back({f(n), t->dtype, t->shape, file->data(*t)});
    if (n == extra_dup) ts.push_back({"model." + n, t->dtype, t->shape, file->data(*t)});
  }
  fs::create_directories(out);
  io::write_safetensors_dir(out, ts);
  fs::copy_file(in + "/config.json", out + "/config.json", fs::copy_options::overwrite_existing);
}

TEST(V4Namings, SavePretrainedNamingLoadsTheSameWeights) {
  nlohmann::json j = trex::testing::tiny_v4();
  j["num_nextn_predict_layers"] = 0;  // transformers has no MTP block
  const model::ModelConfig cfg = model::parse_config(j, "tiny_v4");
  model::Model a(cfg, kern::Prec::F32);
  a.init_random(3);
  trex::testing::perturb_vectors(a, 4);
  const std::string root = ::testing::TempDir() + "v4_namings";
  fs::remove_all(root);
  model::save_v4_original(a, root + "/original", DType::F32, false);
  for (bool kv_style : {false, true}) {
    const std::string dir = root + (kv_style ? "/saved_kv" : "/saved");
    copy_renamed(root + "/original", dir, [&](const std::string& n) { return saved_name(n, kv_style); });
    {
      io::SafetensorsDir ck = io::SafetensorsDir::open(dir);
      ASSERT_TRUE(ck.find("model.layers.0.attn.wq_a.weight"));
      ASSERT_TRUE(ck.find("model.embed_tokens.weight"));
      ASSERT_TRUE(ck.find("head.weight"));
      ASSERT_FALSE(ck.find("embed.weight"));
    }
    model::Model b(cfg, kern::Prec::F32);
    model::load_hf_weights(b, dir, /*verify=*/false);
    EXPECT_EQ(0, std::memcmp(a.P(), b.P(), a.layout.total * sizeof(float))) << dir;
    EXPECT_EQ(a.buffers, b.buffers) << dir;
  }
  // trex convert --layout transformers: exactly the names above, and the same weights back.
  {
    const std::string dir = root + "/written";
    model::save_v4_original(a, dir, DType::F32, false, 5ull << 30, /*saved_names=*/true);
    std::vector<std::string> want;
    for (const std::string& n : io::SafetensorsDir::open(root + "/original").names()) want.push_back(saved_name(n, false));
    std::sort(want.begin(), want.end());
    EXPECT_EQ(io::SafetensorsDir::open(dir).names(), want);
    model::Model b(cfg, kern::Prec::F32);
    model::load_hf_weights(b, dir, false);
    EXPECT_EQ(0, std::memcmp(a.P(), b.P(), a.layout.total * sizeof(float)));
  }
  // Both spellings of one tensor in one checkpoint: refused, naming both.
  const std::string dup = root + "/dup";
  copy_renamed(root + "/original", dup, [](const std::string& n) { return saved_name(n, false); },
               "layers.0.attn.kv_norm.weight");
  model::Model c(cfg, kern::Prec::F32);
  try {
    model::load_hf_weights(c, dup, false);
    ADD_FAILURE() << "a checkpoint with two names for one tensor loaded";
  } catch (const UserError& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("model.layers.0.attn.norm.weight"), std::string::npos) << w;
    EXPECT_NE(w.find("model.layers.0.attn.kv_norm.weight"), std::string::npos) << w;
  }
  fs::remove_all(root);
}

TEST(V4Namings, SavedNamesMapToOriginalNames) {
  EXPECT_EQ(model::v4_original_of_saved("model.layers.3.attn.wq_a.weight"), "layers.3.attn.wq_a.weight");
  EXPECT_EQ(model::v4_original_of_saved("model.layers.3.attn.norm.weight"), "layers.3.attn.kv_norm.weight");
  EXPECT_EQ(model::v4_original_of_saved("model.layers.3.ffn.experts.7.w1.weight"), "layers.3.ffn.experts.7.w1.weight");
  EXPECT_EQ(model::v4_original_of_saved("model.embed_tokens.weight"), "embed.weight");
  EXPECT_EQ(model::v4_original_of_saved("head.weight"), "head.weight");
  EXPECT_EQ(model::v4_original_of_saved("model.hc_head.hc_fn"), "hc_head_fn");
  EXPECT_EQ(model::v4_original_of_saved("model.norm.weight"), "norm.weight");
  EXPECT_TRUE(model::v4_saved_naming({"head.weight", "model.layers.0.attn.wq_a.weight"}));
  EXPECT_FALSE(model::v4_saved_naming({"lm_head.weight", "model.layers.0.self_attn.q_a_proj.weight"}));
  EXPECT_FALSE(model::v4_saved_naming({"embed.weight", "layers.0.attn.wq_a.weight"}));
}

}  // namespace
