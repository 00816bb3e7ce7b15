// Data parallelism on a device (train/dist.h DpOptions::device_comm, parallel/comm_device.h):
// the StagedComm's collectives on memory the host cannot address equal the host communicator's
// byte for byte, and a data-parallel run whose model computes on the fenced backend
// (tests/unit/fenced_backend.h: any host access to device memory faults) equals the same run in
// host memory bit for bit (DeepSeek-V3 and V4): losses, norms, parameters, moments, the
// checkpoint's gather, the NaN guard; layouts the device path does not run are refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "parallel/comm.h"
#include "parallel/comm_device.h"
#include "parallel/comm_staged.h"
#include "parallel/dims.h"
#include "tests/mpi/train_parity.h"
#include "tests/unit/fenced_backend.h"
#include "train/layout.h"
#include "train/trainer.h"

using namespace trex;
using namespace trex::train;
using namespace trex::testing;

namespace {

// n values of T in fenced memory, copied from host values.
template <class T>
kern::DeviceBuffer<T> on_device(Fenced& be, const std::vector<T>& h) {
  kern::DeviceBuffer<T> d(be, h.size());
  d.upload(h.data());
  return d;
}
template <class T>
std::vector<T> to_host(const kern::DeviceBuffer<T>& d) {
  std::vector<T> h(d.size());
  d.download(h.data());
  return h;
}
std::vector<float> ramp(size_t n, int rank, uint64_t seed) {
  Rng r(seed + 31 * (uint64_t)rank);
  std::vector<float> v(n);
  for (float& x : v) x = (float)r.uniform(-2.f, 2.f);
  return v;
}

}  // namespace

TEST(DpDevice, StagedCollectivesEqualTheHostCommunicator) {
  parallel::Communicator& w = parallel::test_world();
  Fenced be;
  std::unique_ptr<parallel::Communicator> dc = parallel::make_device_comm(w, be);
  ASSERT_TRUE(dc);
  EXPECT_EQ(dc->backend(), "staged(" + w.backend() + ")");
  const int n = w.size(), me = w.rank();
  const size_t c = 37;
  // all-reduce (f32, out of place), in place (i64), bf16 (rounded once, as the host's)
  {
    const std::vector<float> x = ramp(c, me, 1);
    std::vector<float> want(c);
    w.all_reduce(x.data(), want.data(), c, DType::F32, parallel::ReduceOp::Sum);
    auto dx = on_device(be, x);
    kern::DeviceBuffer<float> dy(be, c);
    dc->all_reduce(dx.get(), dy.get(), c, DType::F32, parallel::ReduceOp::Sum);
    EXPECT_EQ(0, std::memcmp(to_host(dy).data(), want.data(), c * 4));
    std::vector<int64_t> iv(c);
    for (size_t i = 0; i < c; ++i) iv[i] = (int64_t)(i * 7 + me);
    std::vector<int64_t> iw = iv;
    w.all_reduce(iw.data(), c, parallel::ReduceOp::Max);
    auto di = on_device(be, iv);
    dc->all_reduce(di.get(), c, parallel::ReduceOp::Max);
    EXPECT_EQ(to_host(di), iw);
    std::vector<bf16> bv(c);
    for (size_t i = 0; i < c; ++i) bv[i] = f32_to_bf16(x[i]);
    std::vector<bf16> bw = bv;
    w.all_reduce(bw.data(), c);
    auto db = on_device(be, bv);
    dc->all_reduce(db.get(), c);
    EXPECT_EQ(0, std::memcmp(to_host(db).data(), bw.data(), c * 2));
  }
  // reduce-scatter, in place (as GradSync runs it) and out of place
  {
    const std::vector<float> x = ramp(c * n, me, 2);
    std::vector<float> want(c);
    w.reduce_scatter(x.data(), want.data(), c, DType::F32, parallel::ReduceOp::Sum);
    auto dx = on_device(be, x);
    kern::DeviceBuffer<float> dy(be, c);
    dc->reduce_scatter(dx.get(), dy.get(), c, DType::F32, parallel::ReduceOp::Sum);
    EXPECT_EQ(0, std::memcmp(to_host(dy).data(), want.data(), c * 4));
    dc->reduce_scatter(dx.get(), dx.get() + me * c, c, DType::F32, parallel::ReduceOp::Sum);
    EXPECT_EQ(0, std::memcmp(to_host(dx).data() + me * c, want.data(), c * 4));
  }
  // all-gather, in place and out of place
  {
    const std::vector<float> x = ramp(c, me, 3);
    std::vector<float> want(c * n);
    w.all_gather(x.data(), want.data(), c, DType::F32);
    auto dx = on_device(be, x);
    kern::DeviceBuffer<float> dy(be, c * n);
    dc->all_gather(dx.get(), dy.get(), c, DType::F32);
    EXPECT_EQ(to_host(dy), want);
    std::vector<float> big(c * n, -1.f);
    std::copy(x.begin(), x.end(), big.begin() + me * c);
    auto dbig = on_device(be, big);
    dc->all_gather(dbig.get() + me * c, dbig.get(), c, DType::F32);
    EXPECT_EQ(to_host(dbig), want);
  }
  // all-to-all-v with uneven counts (rank r sends r + p + 1 elements to p, some zero), the
  // receive buffer's gaps untouched
  {
    std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
    size_t so = 0, ro = 3;
    for (int p = 0; p < n; ++p) {
      sc[p] = (me + p) % 3 == 0 ? 0 : (size_t)(me + p + 1), sd[p] = so, so += sc[p] + 1;
      rc[p] = (p + me) % 3 == 0 ? 0 : (size_t)(p + me + 1), rd[p] = ro, ro += rc[p] + 2;
    }
    const std::vector<float> x = ramp(so, me, 4);
    std::vector<float> want(ro, 9.f);
    w.all_to_all_v(x.data(), sc, sd, want.data(), rc, rd, DType::F32);
    auto dx = on_device(be, x);
    auto dy = on_device(be, std::vector<float>(ro, 9.f));
    dc->all_to_all_v(dx.get(), sc, sd, dy.get(), rc, rd, DType::F32);
    EXPECT_EQ(to_host(dy), want);
  }
  // broadcast from the last rank; a ring of sends and receives posted before either waits
  {
    std::vector<float> x = ramp(c, me, 5), want = x;
    w.broadcast(want.data(), c, n - 1);
    auto dx = on_device(be, x);
    dc->broadcast(dx.get(), c, n - 1);
    EXPECT_EQ(to_host(dx), want);
    const std::vector<float> s = ramp(c, me, 6), from = ramp(c, (me + n - 1) % n, 6);
    auto ds = on_device(be, s);
    kern::DeviceBuffer<float> dr(be, c);
    parallel::Handle hr = dc->irecv(dr.get(), c, DType::F32, (me + n - 1) % n, 5);
    parallel::Handle hs = dc->isend(ds.get(), c, DType::F32, (me + 1) % n, 5);
    hs.wait();
    hr.wait();
    EXPECT_EQ(to_host(dr), from);
  }
  // a sub-communicator stages too
  {
    std::unique_ptr<parallel::Communicator> half = dc->split(me % 2, me);
    ASSERT_TRUE(half);
    EXPECT_EQ(half->backend(), dc->backend());
    std::vector<int32_t> v{me};
    auto dv = on_device(be, v);
    half->all_reduce(dv.get(), 1);
    int32_t want = 0;
    for (int r = me % 2; r < n; r += 2) want += r;
    EXPECT_EQ(to_host(dv)[0], want);
  }
}

namespace {

struct Run {
  Trace trace;
  std::vector<float> params, m1, m2, whole, bias;
};

// K steps of a data-parallel run (ga micro-batches per step, NaN injected at nan_step) on the host
// backend, or on the fenced one with the staged communicator; everything compared afterwards
// brought back to the host.
Run dp_run(const Case& su, kern::Prec prec, bool fenced, DpOptions o, const Global& g, int64_t K, int64_t nan_step) {
  parallel::Communicator& w = parallel::test_world();
  Fenced be;
  auto mp = std::make_unique<model::Model>(su.cfg(), prec, model::TrainOptions{su.aux, su.mtp});
  mp->init_random(5);
  perturb_vectors(*mp, 1005);
  if (prec == kern::Prec::BF16) mp->refresh_bf16();
  std::unique_ptr<parallel::Communicator> dc;
  if (fenced) {
    mp->use_backend(be);
    dc = parallel::make_device_comm(w, be);
    o.device_comm = dc.get();
  }
  Run r;
  {
    DataParallel dp(w, *mp, su.ocfg, o);
    r.trace = run_dp(dp, su, g, 0, K, nan_step);
    DataParallel::Gathered gw = dp.gather_whole();
    if (w.rank() == 0) r.whole.assign(gw.params, gw.params + gw.layout.total), r.m1 = gw.m1, r.m2 = gw.m2;
    r.params.assign(mp->P(), mp->P() + mp->layout.total);
    r.bias = mp->buffers;
  }
  return r;
}

void expect_same(const Run& a, const Run& b, const char* what) {
  ASSERT_EQ(a.trace.loss.size(), b.trace.loss.size());
  for (size_t s = 0; s < a.trace.loss.size(); ++s) {
    EXPECT_EQ(a.trace.loss[s], b.trace.loss[s]) << what << " step " << s;
    EXPECT_EQ(a.trace.aux[s], b.trace.aux[s]) << what << " step " << s;
    EXPECT_EQ(a.trace.skipped[s], b.trace.skipped[s]) << what << " step " << s;
    if (std::isfinite(b.trace.norm[s])) EXPECT_EQ(a.trace.norm[s], b.trace.norm[s]) << what << " step " << s;
    else EXPECT_FALSE(std::isfinite(a.trace.norm[s])) << what << " step " << s;
  }
  ASSERT_EQ(a.params.size(), b.params.size());
  EXPECT_EQ(0, std::memcmp(a.params.data(), b.params.data(), a.params.size() * 4)) << what << ": parameters";
  EXPECT_EQ(a.bias, b.bias) << what << ": router biases";
  EXPECT_EQ(a.whole, b.whole) << what << ": gathered weights";
  EXPECT_EQ(a.m1, b.m1) << what << ": first moments";
  EXPECT_EQ(a.m2, b.m2) << what << ": second moments";
}

}  // namespace

// fp32, several buckets started from the backward, two micro-batches per step, the aux loss and
// the bias update; a NaN step skipped on every rank.
TEST(DpDevice, V3StepsEqualTheHostRunBitForBit) {
  init_threads(1);
  parallel::Communicator& w = parallel::test_world();
  Case su{tiny_v3(), 0.01, 0};
  const Global g = make_global(4, 2, w.size(), 2, 9, 67, 11);
  for (bool overlap : {true, false}) {
    const DpOptions o{overlap ? 997 : 0, overlap};
    expect_same(dp_run(su, kern::Prec::F32, true, o, g, 4, 2), dp_run(su, kern::Prec::F32, false, o, g, 4, 2),
                overlap ? "overlap" : "one bucket");
  }
}

// bf16 GEMMs (the shadow refreshed on the device after the all-gather, also when the all-gather
// runs on into the next forward), MTP layers.
TEST(DpDevice, V3MtpBf16StepsEqualTheHostRunBitForBit) {
  init_threads(1);
  parallel::Communicator& w = parallel::test_world();
  Case su{tiny_v3_mtp(1), 0.01, 0.3};
  const Global g = make_global(3, 1, w.size(), 2, 9, 67, 12);
  for (bool overlap_params : {false, true}) {
    DpOptions o{700, true};
    o.overlap_params = overlap_params;
    expect_same(dp_run(su, kern::Prec::BF16, true, o, g, 3, -1), dp_run(su, kern::Prec::BF16, false, o, g, 3, -1),
                overlap_params ? "bf16 + mtp, all-gather into the next forward" : "bf16 + mtp");
  }
}

// DeepSeek-V4 (hyper-connections, CSA / HCA, hash routing, its MTP block) on the device path.
TEST(DpDevice, V4StepsEqualTheHostRunBitForBit) {
  init_threads(1);
  parallel::Communicator& w = parallel::test_world();
  Case su{tiny_v4(), 0.0, 0.3};
  const Global g = make_global(3, 1, w.size(), 1, 13, su.cfg().vocab_size, 13);
  const DpOptions o{1500, true};
  expect_same(dp_run(su, kern::Prec::F32, true, o, g, 3, -1), dp_run(su, kern::Prec::F32, false, o, g, 3, -1), "v4");
}

// Expert, tensor, pipeline and context parallelism and ZeRO-2 are refused on a device, naming the setting.
TEST(DpDevice, LayoutsTheDeviceDoesNotRunAreRefused) {
  init_threads(1);
  parallel::Communicator& w = parallel::test_world();
  if (w.size() != 2) GTEST_SKIP() << "needs 2 ranks";
  Case su{tiny_v3(), 0.01, 0};
  Fenced be;
  auto m = su.make(5);
  m->use_backend(be);
  parallel::ParallelDims ep;
  ep.dp = 2, ep.ep = 2;
  try {
    make_parallel_run(w, ep, *m, su.ocfg);
    ADD_FAILURE() << "ep = 2 on a device was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.ep"), std::string::npos) << e.what();
  }
  parallel::ParallelDims cp;
  cp.cp = 2;
  try {
    make_parallel_run(w, cp, *m, su.ocfg);
    ADD_FAILURE() << "cp = 2 on a device was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.cp = 2"), std::string::npos) << e.what();
  }
  parallel::ParallelDims dp;
  dp.dp = 2;
  DpOptions z2;
  z2.zero_stage = 2;
  try {
    make_parallel_run(w, dp, *m, su.ocfg, z2);
    ADD_FAILURE() << "zero_stage = 2 on a device was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("zero_stage"), std::string::npos) << e.what();
  }
  ParallelRun r = make_parallel_run(w, dp, *m, su.ocfg);  // plain dp runs
  ASSERT_TRUE(r.dp && r.device);
  EXPECT_EQ(r.device->backend(), "staged(" + w.backend() + ")");
}
