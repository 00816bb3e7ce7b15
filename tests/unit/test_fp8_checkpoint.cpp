// A DeepSeek-V3-style FP8 checkpoint (e4m3 weights + F32 128x128 scale_inv blocks, declared in
// config.json's quantization_config) loads with every quantized weight dequantized, equal bit for
// bit to its dequantized twin, and gives that twin's loss; its loss stays close to the f32 model.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include "core/parallel.h"
#include "io/quant.h"
#include "io/safetensors.h"
#include "model/checkpoint.h"
#include "tests/unit/test_util.h"

using namespace trex;
namespace fs = std::filesystem;

namespace {

// Writes the parity case src's model as an FP8 checkpoint (blocks `block`), loads it, and checks it
// against its dequantized twin. Returns the number of weights quantized.
int check_fp8_twin(const std::string& src, std::array<int64_t, 2> block, std::vector<std::string>* quantized_names) {
  init_threads();
  model::ModelConfig cfg = model::load_config_json(src + "/model/config.json");
  model::Model f32(cfg, kern::Prec::F32);
  model::load_hf_weights(f32, src + "/model");
  model::Model twin(cfg, kern::Prec::F32);
  model::load_hf_weights(twin, src + "/model");

  // Quantize the linear weights as DeepSeek's release does (not embeddings, head, norms, router).
  io::QuantConfig qc;
  qc.fp8_block = {block[0], block[1]};
  std::vector<io::QuantizedTensor> qts;
  std::vector<io::TensorToWrite> ts;
  int quantized = 0;
  for (const model::ParamEntry& e : f32.layout.entries) {
    const bool linear = e.shape.ndim == 2 && e.name.find("embed_tokens") == std::string::npos &&
                        e.name != "lm_head.weight" && e.name.find("mlp.gate.weight") == std::string::npos;
    if (!linear) {
      ts.push_back({e.name, DType::F32, e.shape, f32.P() + e.offset});
      continue;
    }
    auto q = io::quantize_weight(e.name, f32.P() + e.offset, e.shape, io::QuantScheme::Fp8V3, qc);
    EXPECT_EQ(q.size(), 2u);
    EXPECT_EQ(q[1].name, e.name.substr(0, e.name.size() - 6) + "weight_scale_inv");
    quantized_names->push_back(e.name);
    std::vector<float> deq =
        io::dequant_fp8_block(q[0].bytes.data(), q[0].shape, reinterpret_cast<const float*>(q[1].bytes.data()),
                              q[1].shape, qc.fp8_block);
    std::memcpy(twin.P() + e.offset, deq.data(), deq.size() * sizeof(float));
    for (auto& t : q) qts.push_back(std::move(t));
    ++quantized;
  }
  for (const auto& q : qts) ts.push_back(q.to_write());
  for (const model::BufferEntry& b : f32.layout.buffers)
    ts.push_back({b.name, DType::F32, Shape{b.size}, f32.buffers.data() + b.offset});
  test::TmpDir dir("trex_fp8_ckpt");
  io::write_safetensors_dir(dir.str(), ts, 64 << 10);
  nlohmann::json cj = nlohmann::json::parse(std::ifstream(src + "/model/config.json"));
  cj["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
                               {"weight_block_size", {block[0], block[1]}}};
  std::ofstream(dir.file("config.json")) << cj.dump(2);

  model::Model fp8(cfg, kern::Prec::F32);
  model::load_hf_weights(fp8, dir.str());
  EXPECT_EQ(0, std::memcmp(fp8.P(), twin.P(), cfg.num_params() > 0 ? fp8.layout.total * sizeof(float) : 0));

  auto batch = nlohmann::json::parse(std::ifstream(src + "/batch.json"));
  std::vector<int32_t> ids, labels;
  for (auto& r : batch["input_ids"]) for (auto& v : r) ids.push_back(v);
  for (auto& r : batch["labels"]) for (auto& v : r) labels.push_back(v);
  const int64_t B = batch["input_ids"].size(), T = batch["input_ids"][0].size();
  auto tg = model::shift_labels(labels, B, T);
  model::Batch b{B, T, ids.data(), tg.data(), nullptr, nullptr};
  const double l8 = fp8.forward(b).loss, lt = twin.forward(b).loss, l32 = f32.forward(b).loss;
  EXPECT_EQ(l8, lt);
  EXPECT_NEAR(l8, l32, 0.05 * l32);  // e4m3 keeps ~3 significant bits per weight
  EXPECT_NE(l8, l32);
  return quantized;
}

}  // namespace

TEST(Fp8Checkpoint, LoadsAsItsDequantizedTwin) {
  std::vector<std::string> names;
  // Small blocks so the tiny model has several per matrix, with partial edges.
  EXPECT_GT(check_fp8_twin("tests/reference/data/v3_qlora_sigmoid", {16, 16}, &names), 20);
}

// DeepSeek-V3.2's FP8 release layout: e4m3 weights with F32 128 x 128 weight_scale_inv blocks for
// every linear weight, the lightning indexer's (wq_b, wk, weights_proj) included; also with small
// blocks (several per matrix). The indexer reads the dequantized weights like the rest.
TEST(Fp8Checkpoint, V32ReleaseLayoutWithTheIndexer) {
  for (std::array<int64_t, 2> block : {std::array<int64_t, 2>{128, 128}, std::array<int64_t, 2>{16, 16}}) {
    std::vector<std::string> names;
    EXPECT_GT(check_fp8_twin("tests/reference/data/v32_topk_yarn", block, &names), 20);
    int indexer = 0;
    for (const std::string& n : names) indexer += n.find(".self_attn.indexer.") != std::string::npos;
    EXPECT_EQ(indexer, 3 * 3) << "wq_b, wk, weights_proj of 3 layers";
  }
}
