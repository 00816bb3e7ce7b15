// Model parity against PyTorch + transformers. tests/reference/make_dumps.py builds tiny
// DeepseekV3ForCausalLM models (random init, fixed seed), and dumps a batch, the loss, every
// parameter gradient and the losses of 10 AdamW steps. Here the C++ engine must match:
// fp32 loss to 1e-5 relative, each gradient tensor to 1e-4 (||d - r|| / ||r||), the 10 losses
// to 1e-4, and in bf16 the 10 losses stay within 4e-2 of the fp32 ones (or of PyTorch's own
// bf16 drift where a routing flip moves both; see the bf16 check below).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include "core/cpu.h"
#include "core/parallel.h"
#include "io/safetensors.h"
#include "model/checkpoint.h"
#include "train/trainer.h"
#include "tests/unit/test_util.h"

namespace fs = std::filesystem;
using namespace trex;

namespace {

const char* kDataDir = "tests/reference/data";

std::vector<std::string> cases() {
  std::vector<std::string> out;
  if (!fs::exists(kDataDir)) return out;
  for (auto& e : fs::directory_iterator(kDataDir))
    if (fs::exists(e.path() / "expected.json")) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

struct Case {
  std::string dir;
  model::ModelConfig cfg;
  nlohmann::json expected;
  int64_t B = 0, T = 0;
  std::vector<int32_t> ids, targets;

  explicit Case(const std::string& name) : dir(std::string(kDataDir) + "/" + name) {
    cfg = model::load_config_json(dir + "/model/config.json");
    expected = nlohmann::json::parse(std::ifstream(dir + "/expected.json"));
    auto batch = nlohmann::json::parse(std::ifstream(dir + "/batch.json"));
    B = batch["input_ids"].size();
    T = batch["input_ids"][0].size();
    std::vector<int32_t> labels;
    for (auto& r : batch["input_ids"])
      for (auto& v : r) ids.push_back(v.get<int32_t>());
    for (auto& r : batch["labels"])
      for (auto& v : r) labels.push_back(v.get<int32_t>());
    targets = model::shift_labels(labels, B, T);
  }
  model::Batch batch() const { return {B, T, ids.data(), targets.data(), nullptr, nullptr}; }
  double aux_alpha() const { return expected["train"].value("aux_loss_alpha", 0.0); }
  double mtp_weight() const { return expected["train"].value("mtp_loss_weight", 0.0); }
  // DeepSeek-V3.2 indexer-loss cases (make_dumps_idxloss.py): the weight and the stage.
  model::TrainOptions opts() const {
    const auto& t = expected["train"];
    const bool dense = t.value("indexer_stage", std::string("sparse")) == "dense_warmup";
    return {aux_alpha(), mtp_weight(), model::Recompute::None, t.value("indexer_loss_weight", 0.0),
            dense ? model::IndexerStage::DenseWarmup : model::IndexerStage::Sparse};
  }

  // Losses of the 10 training steps of the reference recipe.
  std::vector<double> train(kern::Prec prec, std::vector<float>* final_bias) const {
    model::Model m(cfg, prec, opts());
    model::load_hf_weights(m, dir + "/model");
    const auto& t = expected["train"];
    train::AdamW opt(m, {t["lr"].get<float>(), t["beta1"].get<float>(), t["beta2"].get<float>(),
                         t["eps"].get<float>(), t["weight_decay"].get<float>(), t["clip_grad_norm"].get<float>()});
    std::vector<double> losses;
    for (int s = 0; s < t["steps"].get<int>(); ++s)
      losses.push_back(train::trainer_step(m, opt, {batch()}, t["lr"].get<float>(),
                                           t["bias_update_gamma"].get<float>()).loss);
    if (final_bias) *final_bias = m.buffers;
    return losses;
  }
};

double rel_err(const float* a, const float* r, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num += ((double)a[i] - r[i]) * ((double)a[i] - r[i]);
    den += (double)r[i] * r[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

class Parity : public ::testing::TestWithParam<std::string> {};

TEST_P(Parity, LossAndEveryGradientFp32) {
  init_threads();
  Case c(GetParam());
  model::Model m(c.cfg, kern::Prec::F32, c.opts());
  model::load_hf_weights(m, c.dir + "/model");
  model::LossParts lp = m.forward_backward(c.batch(), 1.f);
  const double ref = c.expected["loss"].get<double>();
  EXPECT_LE(std::abs(lp.loss - ref) / std::abs(ref), 1e-5) << "loss " << lp.loss << " vs " << ref;
  io::SafetensorsFile g = io::SafetensorsFile::open(c.dir + "/expected.safetensors");
  int checked = 0;
  double worst = 0;
  std::string worst_name;
  for (const model::ParamEntry& e : m.layout.entries) {
    const std::string key = "grad." + e.name;
    ASSERT_TRUE(g.find(key)) << "reference lacks " << key;
    std::vector<float> r(e.shape.numel());
    g.read_f32(key, r.data(), r.size());
    double err = rel_err(m.G() + e.offset, r.data(), r.size());
    EXPECT_LE(err, 1e-4) << e.name;
    if (err > worst) worst = err, worst_name = e.name;
    ++checked;
  }
  EXPECT_EQ(checked, (int)m.layout.entries.size());
  std::printf("[parity %s] loss %.8f ref %.8f; %d gradients, worst %.2e (%s)\n", GetParam().c_str(), lp.loss, ref,
              checked, worst, worst_name.c_str());
}

TEST_P(Parity, TenAdamWStepsFp32AndBf16) {
  init_threads();
  Case c(GetParam());
  std::vector<float> bias;
  std::vector<double> l32 = c.train(kern::Prec::F32, &bias);
  const auto& ref = c.expected["losses"];
  ASSERT_EQ(l32.size(), ref.size());
  // Steps whose expert / indexer selections have margins the reference could certify (a V4 case
  // with 600 tokens redraws ~1.5 near-ties per step; tests/reference/README.md): compared
  // strictly; later steps only by the bf16-drift bound below. The final biases need all steps.
  // The margins were certified against the AVX-512 kernels' rounding. On a CPU without AVX-512 the
  // scalar reference kernels run, whose fp32 summation order differs more, and a near-tie can
  // flip after the first update (seen on v4_rates_odd): there, step 0 (loss and, in
  // Parity.Gradients, every gradient) stays strict and later steps keep only the drift bound.
  const bool certified_isa = cpu_isa() >= Isa::Avx512;
  const size_t strict = certified_isa ? (size_t)c.expected.value("parity_steps", (int)l32.size()) : 1;
  for (size_t i = 0; i < std::min(strict, l32.size()); ++i) {
    double r = ref[i].get<double>();
    EXPECT_LE(std::abs(l32[i] - r) / std::abs(r), 1e-4) << "step " << i << ": " << l32[i] << " vs " << r;
  }
  // Router biases after the aux-loss-free updates.
  model::Model m(c.cfg, kern::Prec::F32, c.opts());
  for (const model::BufferEntry& b : m.layout.buffers) {
    if (strict < l32.size()) break;
    if (!c.expected.contains("final_bias") || !c.expected["final_bias"].contains(b.name)) continue;
    const auto& rb = c.expected["final_bias"][b.name];
    for (int64_t i = 0; i < b.size; ++i)
      EXPECT_NEAR(bias[b.offset + i], rb[i].get<double>(), 1e-6) << b.name << "[" << i << "]";
  }
  // bf16: (a) against the reference run with trex's bf16 semantics (bf16-rounded GEMM inputs and
  // weights, f32 accumulation, f32 router) at 1e-2 absolute; (b) the drift from fp32 stays within
  // 4e-2, or within PyTorch's own bf16 drift (autocast, or the bf16-weights run) + 4e-2 where a
  // routing flip in these tiny random MoEs moves both engines (tests/reference/README.md, "bf16
  // yardsticks").
  // (a) runs with the f32 attention core (and f32 indexer scores), the reference's semantics: on an
  // AVX512_BF16 CPU a bf16 run also rounds the indexer's q and k and the attention's q, k, v, P, dO
  // and dS to bf16 (kernels/cpu/attention_
  // avx512bf16.h; V4's and V3.2's sparse core: sparse_attn_avx512bf16.h), which the reference does
  // not, and in these tiny MoEs that alone flips expert
  // selections from step 0 (measured, Zen 4: v3_tied_greedy step 0 5.4024 against the reference's
  // bf16 5.3821 and fp32 5.4020; v3_qlora_sigmoid step 1 3.1186 against 3.0889). (b) runs as a
  // bf16 run does (PyTorch's autocast yardstick has bf16 attention products too). The bf16 sparse
  // core moved (b)'s V4 / V3.2 losses against the f32 core by up to 3.2e-2 at step 0
  // (v32idx_sparse_yarn 5.3916 -> 5.3597, fp32 5.3644) and 3.4e-2 at step 9 (v4idx_sparse_odd
  // 0.6983 -> 0.6642, fp32 0.6904), inside the same bounds.
  // Likewise its GEMMs take the widened path (f32 sums on the FMA units, TREX_GEMM_BF16=widen): on
  // a CPU with AMX tiles oneDNN's bf16 matmul runs there, in another order of the f32 additions,
  // and that alone moved v2_5_group_yarn's step 2 to 2.887 against the reference's bf16 2.967
  // (measured, Sapphire Rapids class, 2026-12-05; the widened path and the AVX512_BF16 dot path
  // both stay within 1e-2). (b) runs the default path.
  auto set_env = [](const char* name, const char* value) {
    const char* was = std::getenv(name);
    std::pair<bool, std::string> old{was != nullptr, was ? was : ""};
    setenv(name, value, 1);
    return old;
  };
  auto restore_env = [](const char* name, const std::pair<bool, std::string>& old) {
    if (old.first)
      setenv(name, old.second.c_str(), 1);
    else
      unsetenv(name);
  };
  const auto attn_was = set_env("TREX_ATTN", "f32"), gemm_was = set_env("TREX_GEMM_BF16", "widen");
  std::vector<double> l16a = c.train(kern::Prec::BF16, nullptr);
  restore_env("TREX_ATTN", attn_was);
  restore_env("TREX_GEMM_BF16", gemm_was);
  std::vector<double> l16 = c.train(kern::Prec::BF16, nullptr);
  ASSERT_TRUE(c.expected.contains("losses_bf16_weights"));
  const auto& rb = c.expected["losses_bf16_weights"];
  const auto& ra = c.expected["losses_bf16_autocast"];
  // (a) covers the first three steps (V4: the first; every V4 step has router / indexer gaps of
  // ~1e-4, below what bf16 rounding moves: README, "DeepSeek-V4 cases"). These runs fall from loss
  // ~5 to ~0.1 in 10 steps, and from the fourth step on they amplify any change in the order of
  // the f32 additions of a GEMM past 1e-2: measured on v3_tied_greedy, splitting the widened
  // path's K into blocks of 16, or the bf16 dot-product path (kernels/gemm_bf16_dnnl.h), moves
  // step 4 by 0.07-0.08 against the reference while steps 0-2 stay within 5e-3. For the same
  // reason (b) has room over PyTorch's drift: the K-blocking change alone moved v4_rates_odd
  // 2.5e-2 past it, the dot path v4_mtp 2.0e-2, and the bf16 attention core (AVX512_BF16)
  // v2_5_group_yarn 3.4e-2 at step 8 (0.1238 against fp32 0.2171, PyTorch's drift 0.0595), so
  // 4e-2.
  // DeepSeek-V3.2: as V4 for (a), the indexer's top-k gaps (~3e-4) are below what bf16 moves, and
  // PyTorch's own bf16 runs leave its fp32 losses by 0.05-0.14 at steps 1-2. A selection that flips
  // moves every later step, while PyTorch's drift can shrink back by chance, so (b) takes the
  // largest PyTorch drift of the steps so far, for every case: v2_5_group_yarn's PyTorch drift is
  // 0.061 at step 1, 0.015 at step 2 and 0.18-0.48 at steps 3-5, and on a Sapphire Rapids class
  // CPU (AMX GEMMs, the f32 attention core that trex takes there) trex's step 2 is 2.887 against
  // fp32 2.968 (measured 2026-12-05), inside the step-1 drift + 4e-2 and not inside step 2's.
  const size_t bf16_strict = c.cfg.is_v4() || c.cfg.is_v32() ? 1 : std::min<size_t>(strict, 3);
  const double drift_room = 4e-2;
  double torch_drift_max = 0;
  for (size_t i = 0; i < l16.size(); ++i) {
    if (i < bf16_strict) {
      EXPECT_LE(std::abs(l16a[i] - rb[i].get<double>()), 1e-2)
          << "bf16 step " << i << ": " << l16a[i] << " vs reference bf16 " << rb[i].get<double>();
    }
    const double drift_i = std::max(std::abs(ra[i].get<double>() - ref[i].get<double>()),
                                    std::abs(rb[i].get<double>() - ref[i].get<double>()));
    torch_drift_max = std::max(torch_drift_max, drift_i);
    const double torch_drift = torch_drift_max;
    EXPECT_LE(std::abs(l16[i] - l32[i]), torch_drift + drift_room)
        << "bf16 step " << i << ": " << l16[i] << " vs fp32 " << l32[i] << " (PyTorch bf16 drift " << torch_drift
        << ")";
  }
  std::printf("[parity %s] fp32 loss %.5f -> %.5f (ref %.5f -> %.5f); bf16 %.5f -> %.5f\n", GetParam().c_str(),
              l32.front(), l32.back(), ref.front().get<double>(), ref.back().get<double>(), l16.front(), l16.back());
}

TEST_P(Parity, LoadThenSaveGivesIdenticalTensors) {
  Case c(GetParam());
  model::Model m(c.cfg, kern::Prec::F32, c.opts());
  model::load_hf_weights(m, c.dir + "/model");
  test::TmpDir tmp("trex_rt"), bf("trex_rt_bf16"), bf2("trex_rt_bf16b");
  model::save_hf_checkpoint(m, tmp.str(), DType::F32);
  io::SafetensorsDir a = io::SafetensorsDir::open(c.dir + "/model");
  io::SafetensorsDir b = io::SafetensorsDir::open(tmp.str());
  for (const std::string& n : a.names()) {
    const io::SafetensorsFile *fa, *fb;
    const io::TensorInfo* ta = a.find(n, &fa);
    const io::TensorInfo* tb = b.find(n, &fb);
    ASSERT_TRUE(tb) << n << " missing after save";
    ASSERT_EQ(ta->dtype, tb->dtype) << n;
    ASSERT_TRUE(ta->shape == tb->shape) << n;
    ASSERT_EQ(ta->nbytes, tb->nbytes);
    EXPECT_EQ(0, std::memcmp(fa->data(*ta), fb->data(*tb), ta->nbytes)) << n;
  }
  EXPECT_EQ(a.names().size(), b.names().size());
  // And the saved config reads back to the same model.
  model::ModelConfig c2 = model::load_config_json(tmp.file("config.json"));
  EXPECT_EQ(c2.num_params(), c.cfg.num_params());
  // A bf16 checkpoint (as DeepSeek releases them) survives load -> save bit for bit, sharded too.
  model::save_hf_checkpoint(m, bf.str(), DType::BF16, 20000);
  model::Model m2(c2, kern::Prec::F32, c.opts());
  model::load_hf_weights(m2, bf.str());
  model::save_hf_checkpoint(m2, bf2.str(), DType::BF16, 20000);
  io::SafetensorsDir x = io::SafetensorsDir::open(bf.str()), y = io::SafetensorsDir::open(bf2.str());
  EXPECT_TRUE(x.sharded());
  for (const std::string& n : x.names()) {
    const io::SafetensorsFile *fx, *fy;
    const io::TensorInfo* tx = x.find(n, &fx);
    const io::TensorInfo* ty = y.find(n, &fy);
    ASSERT_TRUE(ty) << n;
    ASSERT_EQ(tx->nbytes, ty->nbytes) << n;
    EXPECT_EQ(0, std::memcmp(fx->data(*tx), fy->data(*ty), tx->nbytes)) << n;
  }
}

INSTANTIATE_TEST_SUITE_P(Reference, Parity, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param; });

TEST(ParityData, DumpsArePresent) { EXPECT_GE(cases().size(), 2u) << "run tests/reference/make_dumps.py"; }

}  // namespace
