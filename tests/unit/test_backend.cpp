// The backend seam (kernels/backend.h): the CPU backend's memory and kernel table equal the kern::
// functions bit for bit; device names are checked; a model on a wrapped CPU backend computes the
// same loss and gradients as on its own, and a model refuses a backend whose memory the host
// cannot address; the CUDA backend is either usable here or says why not.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>
#include "core/error.h"
#include "core/rng.h"
#include "kernels/backend.h"
#include "kernels/rmsnorm.h"
#include "model/model.h"
#include "tests/tiny_configs.h"
#include "tests/unit/forwarding_backend.h"
#include "train/device.h"

namespace {
using namespace trex;

std::vector<float> randn(size_t n, uint64_t seed) {
  Rng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(r.normal());
  return v;
}

TEST(Backend, CpuMemoryAndCopies) {
  auto be = kern::make_backend("cpu");
  EXPECT_STREQ(be->name(), "cpu");
  EXPECT_TRUE(be->host_addressable());
  const std::vector<float> x = randn(1000, 1);
  kern::DeviceBuffer<float> a(*be, x.size()), b(*be, x.size());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.get()) % 256, 0u);
  a.upload(x.data());
  be->copy(b.get(), a.get(), x.size() * sizeof(float));
  std::vector<float> y(x.size());
  b.download(y.data());
  EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * sizeof(float)));
  be->zero(b.get(), 10 * sizeof(float));
  b.download(y.data());
  EXPECT_EQ(y[9], 0.f);
  EXPECT_EQ(y[10], x[10]);
  kern::DeviceBuffer<float> c = std::move(b);
  EXPECT_EQ(b.get(), nullptr);
  EXPECT_EQ(c.size(), x.size());
  const kern::Event e = be->record();
  be->wait(e);
  be->sync(e);
  be->delete_event(e);
  be->synchronize();
}

TEST(Backend, CpuKernelTableIsTheKernFunctions) {
  auto be = kern::make_cpu_backend();
  const int64_t N = 7, d = 33;
  const std::vector<float> x = randn(N * d, 2), w = randn(d, 3);
  std::vector<float> y1(N * d), y2(N * d), r1(N), r2(N);
  kern::rmsnorm_fwd(x.data(), N, d, w.data(), 1e-6f, y1.data(), r1.data());
  be->rmsnorm_fwd(x.data(), N, d, w.data(), 1e-6f, y2.data(), r2.data());
  EXPECT_EQ(0, std::memcmp(y1.data(), y2.data(), y1.size() * 4));
  std::vector<float> c1(N * N), c2(N * N);
  kern::gemm_f32(false, true, N, N, d, 1.f, x.data(), d, x.data(), d, 0.f, c1.data(), N);
  be->gemm(kern::Prec::F32, kern::Prec::F32, false, true, N, N, d, 1.f, x.data(), d, x.data(), d, 0.f, c2.data(), N);
  EXPECT_EQ(0, std::memcmp(c1.data(), c2.data(), c1.size() * 4));
  EXPECT_EQ(be->sum_squares(x.data(), N * d), kern::sum_squares(x.data(), N * d));
}

TEST(Backend, DeviceNames) {
  EXPECT_EQ(train::parse_device("cpu", "w"), "cpu");
  EXPECT_EQ(train::parse_device("cuda:12", "w"), "cuda:12");
  for (const char* bad : {"", "gpu", "cuda:", "cuda:-1", "cuda:1x", "CPU", "cuda:12345"})
    EXPECT_THROW(train::parse_device(bad, "train.device"), UserError) << bad;
  EXPECT_THROW(kern::make_backend("tpu"), Error);
  EXPECT_EQ(train::open_device("cpu", "w"), nullptr);
}

// Either a CUDA device is here and the backend opens, or make_backend says why it cannot (and
// open_device refuses it, naming train.device).
// Under mpirun / srun, "cuda" is the device of the rank's local rank on its host; a named device
// stays as it is for every rank.
TEST(Backend, RankDeviceFollowsTheLocalRank) {
  EXPECT_EQ(train::rank_device("cuda", "3"), "cuda:3");
  EXPECT_EQ(train::rank_device("cuda", "0"), "cuda:0");
  EXPECT_EQ(train::rank_device("cuda", nullptr), "cuda");
  EXPECT_EQ(train::rank_device("cuda", ""), "cuda");
  EXPECT_EQ(train::rank_device("cuda", "x1"), "cuda");
  EXPECT_EQ(train::rank_device("cuda:1", "3"), "cuda:1");
  EXPECT_EQ(train::rank_device("cpu", "3"), "cpu");
}

TEST(Backend, CudaUsableOrSaysWhy) {
  std::string why;
  if (kern::cuda_available(&why)) {
    auto be = kern::make_backend("cuda");
    EXPECT_STREQ(be->name(), "cuda");
    EXPECT_FALSE(be->host_addressable());
    EXPECT_NE(train::open_device("cuda", "train.device"), nullptr);
    return;
  }
  EXPECT_FALSE(why.empty());
  try {
    kern::make_backend("cuda");
    ADD_FAILURE() << "make_backend(cuda) succeeded without a device";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
  try {
    train::open_device("cuda", "train.device");
    ADD_FAILURE() << "open_device(cuda) succeeded";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("train.device = \"cuda\""), std::string::npos) << e.what();
  }
}

// A CPU backend behind the interface, optionally claiming device memory the host cannot address.
class Wrapped final : public trex::testing::ForwardingBackend {
 public:
  explicit Wrapped(bool host) : host_(host) {}
  const char* name() const override { return "wrapped"; }
  std::string describe() const override { return "wrapped cpu"; }
  bool host_addressable() const override { return host_; }

 private:
  bool host_;
};

// The model's modules compute through the backend it is given: the same loss and gradients,
// bit for bit, and every GEMM, norm, attention and head call went through it.
TEST(Backend, ModelComputesThroughItsBackend) {
  const model::ModelConfig cfg = model::parse_config(trex::testing::tiny_v3(), "tiny_v3");
  const int64_t B = 2, T = 9;
  std::vector<int32_t> ids(B * T), tg(B * T);
  for (int64_t i = 0; i < B * T; ++i) ids[i] = (int32_t)((i * 7 + 3) % cfg.vocab_size), tg[i] = (int32_t)((i * 5 + 1) % cfg.vocab_size);
  const model::Batch b{B, T, ids.data(), tg.data(), nullptr, nullptr};
  model::Model a(cfg, kern::Prec::F32), m(cfg, kern::Prec::F32);
  a.init_random(5);
  m.init_random(5);
  Wrapped w(true);
  m.use_backend(w);
  const double la = a.forward_backward(b).loss, lm = m.forward_backward(b).loss;
  EXPECT_EQ(la, lm);
  EXPECT_EQ(0, std::memcmp(a.G(), m.G(), a.layout.total * sizeof(float)));
  EXPECT_GT(w.calls, 10);
  // DeepSeek-V3.2 does not run on a backend the host cannot address yet: refused, naming the model
  // type (DeepSeek-V4 does: tests/unit/test_device_model.cpp).
  const model::ModelConfig c32 = model::parse_config(trex::testing::tiny_v32(), "tiny_v32");
  Wrapped dev(false);
  model::Model m32(c32, kern::Prec::F32);
  try {
    m32.use_backend(dev);
    ADD_FAILURE() << "a V3.2 model accepted a device backend";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("deepseek_v32"), std::string::npos) << e.what();
  }
}

TEST(Backend, CtxWithoutBackendIsAnError) {
  model::Ctx c;
  EXPECT_THROW(c.k(), Error);
}

}  // namespace
