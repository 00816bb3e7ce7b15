// A DeepSeek-V3-family model on a backend the host cannot address (model/model.h, backend()):
// "Fenced" is the CPU backend with every allocation in its own mapping that is readable and
// writable only while a backend call runs (PROT_NONE between calls). A training step on it must
// give the plain CPU model's losses, gradients, parameters and optimizer moments bit for bit (V3
// MTP layers and DeepSeek-V2 included); a
// host read or write of parameters, gradients or activations outside the backend faults, and the
// test crashes. This is the device path of the CUDA backend with the CPU's kernels.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <vector>
#include "core/error.h"
#include "kernels/backend.h"
#include "model/model.h"
#include "tests/tiny_configs.h"
#include "train/checkpoint.h"
#include "train/optimizer.h"

namespace {
using namespace trex;

class Fenced final : public kern::Backend {
 public:
  int calls = 0;
  const char* name() const override { return "fenced"; }
  std::string describe() const override { return "cpu kernels, memory fenced between calls"; }
  bool host_addressable() const override { return false; }
  ~Fenced() override {
    for (auto& [p, n] : live_) munmap(p, n);
  }

  void* alloc(size_t bytes) override {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), n = std::max<size_t>((bytes + page - 1) / page * page, page);
    void* p = mmap(nullptr, n, open_ ? PROT_READ | PROT_WRITE : PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw Error("fenced backend: mmap of " + std::to_string(n) + " bytes failed");
    live_[p] = n;
    return p;
  }
  void release(void* p) override {
    auto it = live_.find(p);
    ASSERT_NE(it, live_.end()) << "release of memory the backend did not allocate";
    munmap(p, it->second);
    live_.erase(it);
  }
  void to_device(void* d, const void* s, size_t n) override { Open o(*this); std::memcpy(d, s, n); }
  void to_host(void* d, const void* s, size_t n) override { Open o(*this); std::memcpy(d, s, n); }
  void copy(void* d, const void* s, size_t n) override { Open o(*this); std::memmove(d, s, n); }
  void zero(void* p, size_t n) override { Open o(*this); std::memset(p, 0, n); }
  kern::Stream new_stream() override { return in_->new_stream(); }
  void delete_stream(kern::Stream s) override { in_->delete_stream(s); }
  void set_stream(kern::Stream s) override { in_->set_stream(s); }
  kern::Stream stream() const override { return in_->stream(); }
  kern::Event record() override { return in_->record(); }
  void wait(kern::Event e) override { in_->wait(e); }
  void sync(kern::Event e) override { in_->sync(e); }
  void delete_event(kern::Event e) override { in_->delete_event(e); }
  void synchronize() override {}

#define TREX_FENCED(call) \
  Open open_call(*this);  \
  ++calls;                \
  return in_->call
  void gemm(kern::Prec pa, kern::Prec pb, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float al, const void* A,
            int64_t lda, const void* B, int64_t ldb, float be, float* C, int64_t ldc) override {
    TREX_FENCED(gemm(pa, pb, ta, tb, M, N, K, al, A, lda, B, ldb, be, C, ldc));
  }
  void grouped_gemm(kern::Prec p, bool ta, bool tb, float al, float be, const kern::GemmGroup* g, int n) override {
    TREX_FENCED(grouped_gemm(p, ta, tb, al, be, g, n));
  }
  void rmsnorm_fwd(const float* x, int64_t N, int64_t d, const float* w, float eps, float* y, float* r) override {
    TREX_FENCED(rmsnorm_fwd(x, N, d, w, eps, y, r));
  }
  void rmsnorm_bwd(const float* dy, const float* x, int64_t N, int64_t d, const float* w, const float* r, float* dx,
                   float* dw) override {
    TREX_FENCED(rmsnorm_bwd(dy, x, N, d, w, r, dx, dw));
  }
  void swiglu_fwd(const float* gu, int64_t N, int64_t F, float l, float* h) override {
    TREX_FENCED(swiglu_fwd(gu, N, F, l, h));
  }
  void swiglu_bwd(const float* dh, const float* gu, int64_t N, int64_t F, float l, float* dgu) override {
    TREX_FENCED(swiglu_bwd(dh, gu, N, F, l, dgu));
  }
  void rope_apply(float* x, int64_t N, int H, int64_t st, int64_t sh, int D, const int32_t* pos, const float* c,
                  const float* s, kern::RopeLayout lay, bool inv) override {
    TREX_FENCED(rope_apply(x, N, H, st, sh, D, pos, c, s, lay, inv));
  }
  void adamw_step(const kern::AdamWParams& hp, float* p, const float* g, float* m, float* v, int64_t n,
                  bf16* pb) override {
    TREX_FENCED(adamw_step(hp, p, g, m, v, n, pb));
  }
  double sum_squares(const float* x, int64_t n) override { TREX_FENCED(sum_squares(x, n)); }
  void attention_fwd(const kern::AttnShape& sh, const float* q, const float* k, const float* v, float* o, float* l,
                     const int32_t* seg) override {
    TREX_FENCED(attention_fwd(sh, q, k, v, o, l, seg));
  }
  void attention_bwd(const kern::AttnShape& sh, const float* q, const float* k, const float* v, const float* o,
                     const float* l, const float* dO, float* dq, float* dk, float* dv, const int32_t* seg) override {
    TREX_FENCED(attention_bwd(sh, q, k, v, o, l, dO, dq, dk, dv, seg));
  }
  double lm_head_ce(const kern::CeArgs& a, int64_t* nv) override { TREX_FENCED(lm_head_ce(a, nv)); }
  void copy_rows(void* d, int64_t ldd, const void* s, int64_t lds, int64_t rb, int64_t rows) override {
    TREX_FENCED(copy_rows(d, ldd, s, lds, rb, rows));
  }
  void add(float* y, const float* x, int64_t n) override { TREX_FENCED(add(y, x, n)); }
  void to_bf16(const float* x, int64_t ldx, int64_t r, int64_t c, bf16* y) override {
    TREX_FENCED(to_bf16(x, ldx, r, c, y));
  }
  void gather_rows(const float* s, const int32_t* i, int64_t R, int64_t d, float* o) override {
    TREX_FENCED(gather_rows(s, i, R, d, o));
  }
  void scatter_add_rows(const float* s, const int32_t* i, int64_t R, int64_t d, float* o) override {
    TREX_FENCED(scatter_add_rows(s, i, R, d, o));
  }
  void sum_heads(const float* x, int64_t N, int64_t H, int64_t ldn, int64_t ldh, int64_t w, float* y,
                 int64_t ldy) override {
    TREX_FENCED(sum_heads(x, N, H, ldn, ldh, w, y, ldy));
  }
  void moe_combine(const float* y, const float* p, const int32_t* sr, int64_t N, int64_t K, int64_t d,
                   float* o) override {
    TREX_FENCED(moe_combine(y, p, sr, N, K, d, o));
  }
  void moe_combine_bwd(const float* g, const float* y, const float* p, const int32_t* sr, int64_t N, int64_t K,
                       int64_t d, float* dy, float* dp) override {
    TREX_FENCED(moe_combine_bwd(g, y, p, sr, N, K, d, dy, dp));
  }
  void moe_dispatch_bwd(const float* g, const int32_t* sr, int64_t N, int64_t K, int64_t d, float* dx) override {
    TREX_FENCED(moe_dispatch_bwd(g, sr, N, K, d, dx));
  }
#undef TREX_FENCED

 private:
  // Every allocation readable and writable for the lifetime of one backend call.
  struct Open {
    Fenced& f;
    explicit Open(Fenced& fb) : f(fb) { f.protect(PROT_READ | PROT_WRITE), f.open_ = true; }
    ~Open() { f.protect(PROT_NONE), f.open_ = false; }
  };
  void protect(int prot) {
    for (auto& [p, n] : live_) ASSERT_EQ(0, mprotect(p, n, prot));
  }
  std::map<void*, size_t> live_;
  bool open_ = false;
  std::unique_ptr<kern::Backend> in_ = kern::make_cpu_backend();
};

struct Case {
  kern::Prec prec;
  model::Recompute recompute;
  double aux;
  bool packed;  // positions and documents of packed rows
  int mtp = 0;  // DeepSeek-V3 MTP layers trained (model/mtp_v3.h)
  bool v2 = false;  // DeepSeek-V2 (softmax router without a bias, no q LoRA)
};

class DeviceModel : public ::testing::TestWithParam<Case> {};

// Three AdamW steps of the same batches on the CPU backend and on the fenced one.
TEST_P(DeviceModel, StepsEqualTheCpuBitForBit) {
  const Case k = GetParam();
  nlohmann::json j = k.v2 ? trex::testing::tiny_v2() : k.mtp ? trex::testing::tiny_v3_mtp(k.mtp) : trex::testing::tiny_v3();
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
                                           Case{kern::Prec::F32, model::Recompute::None, 0.01, true, 0, true}));

// A checkpoint written from the device (its copies brought back first, as the trainer does) and
// resumed onto the device continues exactly as the CPU run that never stopped.
TEST(DeviceModelResume, CheckpointAndResumeContinueTheCpuRun) {
  Fenced dev;
  const model::ModelConfig cfg = model::parse_config(trex::testing::tiny_v3(), "tiny_v3");
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
  const std::string run_dir = ::testing::TempDir() + "trex_device_resume";
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
  const model::ModelConfig c4 = model::parse_config(trex::testing::tiny_v4(), "tiny_v4");
  model::Model m4(c4, kern::Prec::F32);
  EXPECT_THROW(m4.use_backend(dev), UserError);
  const model::ModelConfig c3 = model::parse_config(trex::testing::tiny_v3(), "tiny_v3");
  model::Model sharded(c3, kern::Prec::F32, {}, model::ExpertShard{1, 1});
  EXPECT_THROW(sharded.use_backend(dev), UserError);
  model::Model whole(c3, kern::Prec::F32);
  whole.use_backend(dev);
  EXPECT_THROW(whole.set_pipeline_stage({0, 1, true, false}), UserError);
}

}  // namespace
