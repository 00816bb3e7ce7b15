// A DeepSeek-V3-family or DeepSeek-V4 model on a backend the host cannot address (model/model.h,
// backend()):
// "Fenced" (tests/unit/fenced_backend.h) is the CPU backend with every allocation in its own
// mapping that is readable and writable only while a backend call runs (PROT_NONE between
// calls). A training step on it must
// give the plain CPU model's losses, gradients, parameters and optimizer moments bit for bit (V3
// MTP layers, DeepSeek-V2 and DeepSeek-V4 with its hyper-connections, compressors, indexer, sparse
// attention and MTP block included); a
// host read or write of parameters, gradients or activations outside the backend faults, and the
// test crashes. This is the device path of the CUDA backend with the CPU's kernels.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <vector>
#include "core/error.h"
#include "kernels/backend.h"
#include "model/model.h"
#include "tests/tiny_configs.h"
#include "tests/unit/fenced_backend.h"
#include "train/checkpoint.h"
#include "train/optimizer.h"

namespace {
using namespace trex;

using trex::testing::Fenced;  // tests/unit/fenced_backend.h

struct Case {
  kern::Prec prec;
  model::Recompute recompute;
  double aux;
  bool packed;  // positions and documents of packed rows
  int mtp = 0;  // DeepSeek-V3 MTP layers trained (model/mtp_v3.h)
  bool v2 = false;  // DeepSeek-V2 (softmax router without a bias, no q LoRA)
  bool v4 = false;  // DeepSeek-V4 (odd_v4(); mtp: its MTP block trained)
};

// DeepSeek-V4 at odd sizes: 3 hyper-connection streams, compress rates 3 (CSA, index_topk 2 of up
// to 3 entries a row) and 5 (HCA), every attention kind, a hash-routed layer, sinks, an MTP block.
nlohmann::json odd_v4() {
  nlohmann::json m = trex::testing::tiny_v4();
  m["num_hidden_layers"] = 4;
  m["layer_types"] = {"compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention",
                      "compressed_sparse_attention"};
  m["mlp_layer_types"] = {"hash_moe", "moe", "moe", "moe"};
  m["compress_rates"] = {{"compressed_sparse_attention", 3}, {"heavily_compressed_attention", 5}};
  return m;
}

class DeviceModel : public ::testing::TestWithParam<Case> {};

// Three AdamW steps of the same batches on the CPU backend and on the fenced one.
TEST_P(DeviceModel, StepsEqualTheCpuBitForBit) {
  const Case k = GetParam();
  nlohmann::json j = k.v4   ? odd_v4()
                     : k.v2 ? trex::testing::tiny_v2()
                     : k.mtp ? trex::testing::tiny_v3_mtp(k.mtp)
                             : trex::testing::tiny_v3();
  const model::ModelConfig cfg = model::parse_config(j, "tiny_v3");
  const model::TrainOptions opt{k.aux, k.mtp ? 0.3 : 0.0, k.recompute};
  Fenced dev;  // outlives the model and the optimizer that hold its memory
  model::Model a(cfg, k.prec, opt), m(cfg, k.prec, opt);
  m.use_backend(dev);  // before the weights, as the commands do: refresh_bf16 sends them
  for (model::Model* x : {&a, &m}) {
    x->init_random(11);
    trex::testing::perturb_vectors(*x, 12);
  }
  const train::AdamWConfig oc{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
  train::AdamW oa(a, oc), om(m, oc);
  const int64_t B = 2, T = 11, N = B * T;
  std::vector<int32_t> ids(N), tg(N), pos(N), seg(N);
  for (int step = 0; step < 3; ++step) {
    for (int64_t i = 0; i < N; ++i) {
      ids[i] = (int32_t)((i * 7 + 3 + step * 13) % cfg.vocab_size);
      tg[i] = i % 5 == 4 ? -100 : (int32_t)((i * 5 + 1 + step) % cfg.vocab_size);
      seg[i] = (int32_t)((i % T) / 4);  // three documents per row
      pos[i] = (int32_t)((i % T) % 4);
    }
    const model::Batch b{B, T, ids.data(), tg.data(), k.packed ? pos.data() : nullptr, k.packed ? seg.data() : nullptr};
    a.zero_grads(), m.zero_grads();
    const model::LossParts la = a.forward_backward(b), lm = m.forward_backward(b);
    ASSERT_EQ(la.loss, lm.loss) << "step " << step;
    ASSERT_EQ(la.aux, lm.aux) << "step " << step;
    m.grads_to_host();
    ASSERT_EQ(0, std::memcmp(a.G(), m.G(), a.layout.total * sizeof(float))) << "gradients, step " << step;
    EXPECT_EQ(a.expert_load(), m.expert_load());
    ASSERT_EQ(oa.step(a, 1e-2f), om.step(m, 1e-2f)) << "gradient norm, step " << step;
  }
  m.params_to_host();
  EXPECT_EQ(0, std::memcmp(a.P(), m.P(), a.layout.total * sizeof(float)));
  if (k.prec == kern::Prec::BF16) {
    EXPECT_EQ(0, std::memcmp(a.params_bf16.data(), m.params_bf16.data(), a.params_bf16.size() * sizeof(bf16)));
  }
  om.state_to_host();
  EXPECT_EQ(0, std::memcmp(oa.M1(), om.M1(), oa.state_elems() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(oa.M2(), om.M2(), oa.state_elems() * sizeof(float)));
  EXPECT_GT(dev.calls, 100);
  // A forward alone (eval) as well.
  const model::Batch b{B, T, ids.data(), tg.data(), nullptr, nullptr};
  EXPECT_EQ(a.forward(b).loss, m.forward(b).loss);
}

INSTANTIATE_TEST_SUITE_P(Cases, DeviceModel,
                         ::testing::Values(Case{kern::Prec::F32, model::Recompute::None, 0.0, false},
                                           Case{kern::Prec::BF16, model::Recompute::None, 0.01, true},
                                           Case{kern::Prec::F32, model::Recompute::Full, 0.01, true},
                                           Case{kern::Prec::BF16, model::Recompute::None, 0.01, true, 2},
                                           Case{kern::Prec::F32, model::Recompute::None, 0.01, true, 0, true},
                                           Case{kern::Prec::F32, model::Recompute::None, 0.0, false, 1, false, true},
                                           Case{kern::Prec::BF16, model::Recompute::None, 0.01, true, 1, false, true},
                                           Case{kern::Prec::F32, model::Recompute::Full, 0.01, true, 1, false, true},
                                           Case{kern::Prec::BF16, model::Recompute::Full, 0.01, true, 0, false, true},
                                           Case{kern::Prec::BF16, model::Recompute::Selective, 0.01, true, 2},
                                           Case{kern::Prec::F32, model::Recompute::Selective, 0.01, true, 1, false, true}));

// A checkpoint written from the device (its copies brought back first, as the trainer does) and
// resumed onto the device continues exactly as the CPU run that never stopped.
void expect_resume_continues(const nlohmann::json& j) {
  Fenced dev;
  const model::ModelConfig cfg = model::parse_config(j, "tiny");
  model::Model a(cfg, kern::Prec::BF16), m(cfg, kern::Prec::BF16), r(cfg, kern::Prec::BF16);
  m.use_backend(dev);
  r.use_backend(dev);
  for (model::Model* x : {&a, &m}) x->init_random(21);
  const train::AdamWConfig oc{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
  train::AdamW oa(a, oc), om(m, oc), orr(r, oc);
  const int64_t B = 2, T = 9, N = B * T;
  std::vector<int32_t> ids(N), tg(N);
  auto step = [&](model::Model& x, train::AdamW& o, int s) {
    for (int64_t i = 0; i < N; ++i)
      ids[i] = (int32_t)((i * 3 + s * 7) % cfg.vocab_size), tg[i] = (int32_t)((i * 11 + s) % cfg.vocab_size);
    x.zero_grads();
    const double loss = x.forward_backward({B, T, ids.data(), tg.data(), nullptr, nullptr}).loss;
    o.step(x, 1e-2f);
    return loss;
  };
  for (int s = 0; s < 2; ++s) ASSERT_EQ(step(a, oa, s), step(m, om, s));
  m.params_to_host(), om.state_to_host();
  // One directory per test: the V3 and V4 cases run at the same time under ctest -j.
  const std::string run_dir =
      ::testing::TempDir() + "trex_device_resume_" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::filesystem::remove_all(run_dir);
  train::TrainState st;
  st.step = 2;
  const std::string ck = train::save_checkpoint(run_dir, m, om, st, 2);
  train::load_checkpoint(ck, r, orr);
  for (int s = 2; s < 4; ++s) ASSERT_EQ(step(a, oa, s), step(r, orr, s)) << "step " << s;
  r.params_to_host();
  EXPECT_EQ(0, std::memcmp(a.P(), r.P(), a.layout.total * sizeof(float)));
  std::filesystem::remove_all(run_dir);
}

TEST(DeviceModelResume, CheckpointAndResumeContinueTheCpuRun) { expect_resume_continues(trex::testing::tiny_v3()); }
TEST(DeviceModelResume, CheckpointAndResumeContinueTheCpuRunV4) { expect_resume_continues(odd_v4()); }

// The fence is real: a host read of the backend's memory between calls faults.
TEST(DeviceModelLimits, HostReadOfFencedMemoryFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Fenced dev;
  auto* p = static_cast<volatile float*>(dev.alloc(64));
  dev.zero(const_cast<float*>(p), 64);  // inside a call: fine
  EXPECT_DEATH({ [[maybe_unused]] float v = p[3]; }, "");
}

// What does not run on such a backend yet is refused by name, before anything is computed.
TEST(DeviceModelLimits, RefusesWhatItCannotRun) {
  Fenced dev;
  const model::ModelConfig c32 = model::parse_config(trex::testing::tiny_v32(), "tiny_v32");
  model::Model m32(c32, kern::Prec::F32);
  EXPECT_THROW(m32.use_backend(dev), UserError);
  // DeepSeek-V4 runs there, but not its indexer loss (nor its recall) or the uncached reference
  // forward of generation.
  const model::ModelConfig c4 = model::parse_config(trex::testing::tiny_v4(), "tiny_v4");
  for (const model::TrainOptions& o : {model::TrainOptions{0, 0, model::Recompute::None, 0.5},
                                       model::TrainOptions{0, 0, model::Recompute::None, 0, {}, true}}) {
    model::Model ix(c4, kern::Prec::F32, o);
    EXPECT_THROW(ix.use_backend(dev), UserError);
  }
  model::Model m4(c4, kern::Prec::F32);
  m4.use_backend(dev);
  std::vector<float> logits(c4.vocab_size);
  const int32_t ids[3] = {1, 2, 3};
  EXPECT_THROW(m4.v4_last_logits(ids, 3, logits.data()), UserError);
  const model::ModelConfig c3 = model::parse_config(trex::testing::tiny_v3(), "tiny_v3");
  model::Model sharded(c3, kern::Prec::F32, {}, model::ExpertShard{1, 1});
  EXPECT_THROW(sharded.use_backend(dev), UserError);
  model::Model whole(c3, kern::Prec::F32);
  whole.use_backend(dev);
  EXPECT_THROW(whole.set_pipeline_stage({0, 1, true, false}), UserError);
}

}  // namespace
