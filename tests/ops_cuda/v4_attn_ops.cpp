// CUDA cases for DeepSeek-V4's attention core (kernels/cuda/ops_v4attn.h), called directly with a
// local kern::cuda::Ctx on the backend's stream:
//   sparse attention: trex_ops's cases and bounds (tests/ops/sparse_attn_cases.h: odd N, H, D,
//     empty lists, M no round number, shuffled duplicate-free lists, sinks and none, sharp scores,
//     NaN inputs) in f32 and with prec = BF16, plus the kernels' own edges (heads not a multiple of
//     the 8 per block, more than 64 heads in the dkv passes, one and many dkv chunks, D = 512),
//     fwd (o, lse) and bwd (dq overwritten, dkv and dsink accumulated onto random values) against
//     the reference in double; a second run must give the same bits; D > 512 is refused by name;
//   indexer: trex_ops's cases (tests/ops/indexer_cases.h: topk > nw, topk 0, m = 1, packed and
//     shifted positions, ties, NaN keys and queries) with their checks against the reference, and
//     a second run bitwise equal;
//   perf: ms and TFLOP/s at DeepSeek-V4's shape (seq 4096, 64 heads, D 512, window 128 + up to 512
//     compressed rows per query; indexer 64 heads x 128, topk 512) and at bench-v4's.
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include "kernels/cuda/ops_v4attn.h"
#include "kernels/ref/sparse_attn.h"
#include "tests/ops/indexer_cases.h"
#include "tests/ops/sparse_attn_cases.h"
#include "tests/ops_cuda/device.h"

namespace {
using namespace trex;
using namespace trex::ops;

// The kernels run on the backend's stream, so that its copies and synchronizations order them.
kern::cuda::Ctx ctx() {
  kern::cuda::Ctx c;
  c.stream = reinterpret_cast<cudaStream_t>(dev().stream());
  return c;
}

std::vector<double> to_double(const float* p, size_t n) { return std::vector<double>(p, p + n); }

bool check(const std::string& name, const char* what, const Guarded<float>& got, const std::vector<double>& want,
           double tol) {
  bool nan_mis = false;
  const double e = nmse(got.data(), want.data(), want.size(), &nan_mis);
  return report(name, what, e, tol, got.guard_ok() && !nan_mis, "NaN/Inf mismatch or guard overwritten");
}

size_t bits_differ(const float* a, const float* b, size_t n) {
  size_t d = 0;
  for (size_t i = 0; i < n; ++i) d += std::memcmp(a + i, b + i, sizeof(float)) != 0;
  return d;
}

// ---------------------------------------------------------------- sparse attention

struct SattnRun {
  Guarded<float> o, lse, dq, dkv, dsink;
};

// fwd + bwd on the device; dkv and dsink start from the inputs' random values.
SattnRun sattn_device(const kern::SparseAttnShape& sh, const SattnCfg& c, const SattnLists& L, const SattnInputs& in) {
  const int64_t M = sattn_rows_of(c);
  const size_t nq = size_t(c.N) * c.H * c.D, nkv = size_t(M) * c.D, nl = size_t(c.N) * c.H;
  SattnRun r{Guarded<float>(nq), Guarded<float>(nl), Guarded<float>(nq, 7.0f), Guarded<float>(nkv),
             Guarded<float>(c.H)};
  std::copy(in.dkv0.begin(), in.dkv0.end(), r.dkv.data());
  std::copy(in.dsink0.begin(), in.dsink0.end(), r.dsink.data());
  auto Q = upload(in.q), KV = upload(in.kv), S = upload(in.sink), DO = upload(in.dO);
  auto OFF = upload(L.off);
  auto IDX = upload(L.idx.empty() ? std::vector<int32_t>(1, 0) : L.idx);
  DevCopy<float> O(r.o), LS(r.lse), DQ(r.dq), DKV(r.dkv), DS(r.dsink);
  const float* sk = c.sink ? S.get() : nullptr;
  kern::cuda::sparse_attn_fwd(ctx(), sh, Q.get(), KV.get(), M, OFF.get(), IDX.get(), sk, O.get(), LS.get());
  kern::cuda::sparse_attn_bwd(ctx(), sh, Q.get(), KV.get(), M, OFF.get(), IDX.get(), sk, O.get(), LS.get(), DO.get(),
                              DQ.get(), DKV.get(), c.sink ? DS.get() : nullptr, nullptr);
  O.fetch(), LS.fetch(), DQ.fetch(), DKV.fetch(), DS.fetch();
  return r;
}

bool sattn_test(const SattnCfg& c, bool bf16) {
  const char* tag = bf16 ? "cuda sattn_bf16" : "cuda sattn";
  const std::string nf = sattn_cfg_name((tag + std::string("_fwd")).c_str(), c),
                    nb = sattn_cfg_name((tag + std::string("_bwd")).c_str(), c);
  const kern::SparseAttnShape sh = sattn_shape_of(c, bf16);
  const int64_t M = sattn_rows_of(c);
  const size_t nq = size_t(c.N) * c.H * c.D, nkv = size_t(M) * c.D, nl = size_t(c.N) * c.H;
  Rng rng(1234 + c.N * 7 + c.D + c.H);
  const SattnLists L = sattn_make_lists(c, rng);
  SattnInputs in = sattn_make_inputs(c, rng);
  sattn_put_nans(c, in);
  SattnRun r = sattn_device(sh, c, L, in);

  auto qd = to_double(in.q.data(), nq), kvd = to_double(in.kv.data(), nkv), sd = to_double(in.sink.data(), c.H),
       dOd = to_double(in.dO.data(), nq);
  std::vector<double> od(nq), lsed(nl), dqd(nq), dkvd = to_double(in.dkv0.data(), nkv),
                                                 dsd = to_double(in.dsink0.data(), c.H);
  const double* skd = c.sink ? sd.data() : nullptr;
  kern::ref::sparse_attn_fwd<double>(sh, qd.data(), kvd.data(), M, L.off.data(), L.idx.data(), skd, od.data(),
                                     lsed.data());
  kern::ref::sparse_attn_bwd<double>(sh, qd.data(), kvd.data(), M, L.off.data(), L.idx.data(), skd, od.data(),
                                     lsed.data(), dOd.data(), dqd.data(), dkvd.data(), c.sink ? dsd.data() : nullptr);
  const SattnBounds bd = sattn_bounds(c, bf16);
  bool ok = true;
  ok &= check(nf, "o", r.o, od, bd.o);
  ok &= check(nf, "lse", r.lse, lsed, bd.lse);
  ok &= check(nb, "dq", r.dq, dqd, bd.grad);
  ok &= check(nb, "dkv", r.dkv, dkvd, bd.grad);
  ok &= check(nb, "dsink", r.dsink, dsd, bd.grad);
  // Fixed-order reductions: a second run gives the same bits.
  SattnRun r2 = sattn_device(sh, c, L, in);
  size_t diff = bits_differ(r.o.data(), r2.o.data(), nq) + bits_differ(r.lse.data(), r2.lse.data(), nl) +
                bits_differ(r.dq.data(), r2.dq.data(), nq) + bits_differ(r.dkv.data(), r2.dkv.data(), nkv) +
                bits_differ(r.dsink.data(), r2.dsink.data(), c.H);
  ok &= report(nb, "rerun", static_cast<double>(diff), 0, true, "");
  return ok;
}

// A head dim above the kernels' 512 is refused with its value, not computed wrongly.
bool sattn_refuses_big_d() {
  const kern::SparseAttnShape sh{2, 1, 513, 1.f};
  std::string msg;
  try {
    kern::cuda::sparse_attn_fwd(ctx(), sh, nullptr, nullptr, 1, nullptr, nullptr, nullptr, nullptr, nullptr);
  } catch (const std::exception& e) {
    msg = e.what();
  }
  const bool ok = msg.find("D=513") != std::string::npos;
  return report("cuda sattn D=513 refused", "error", ok ? 0 : 1, 0, true, "");
}

void sattn_perf(const SattnCfg& c) {
  const kern::SparseAttnShape sh = sattn_shape_of(c, false);
  const int64_t M = sattn_rows_of(c);
  const size_t nq = size_t(c.N) * c.H * c.D, nkv = size_t(M) * c.D, nl = size_t(c.N) * c.H;
  Rng rng(5);
  const SattnLists L = sattn_make_lists(c, rng);
  std::vector<float> q(nq), kv(nkv), sink(c.H);
  fill_normal(q.data(), nq, rng), fill_normal(kv.data(), nkv, rng), fill_normal(sink.data(), c.H, rng);
  auto Q = upload(q), KV = upload(kv), S = upload(sink), DO = upload(q);
  auto OFF = upload(L.off);
  auto IDX = upload(L.idx);
  kern::DeviceBuffer<float> O(dev(), nq), LS(dev(), nl), DQ(dev(), nq), DKV(dev(), nkv), DS(dev(), c.H);
  dev().zero(DKV.get(), nkv * sizeof(float)), dev().zero(DS.get(), c.H * sizeof(float));
  const double tf = dev_time_ms([&] {
    kern::cuda::sparse_attn_fwd(ctx(), sh, Q.get(), KV.get(), M, OFF.get(), IDX.get(), S.get(), O.get(), LS.get());
  }, 3);
  const double tb = dev_time_ms([&] {
    kern::cuda::sparse_attn_bwd(ctx(), sh, Q.get(), KV.get(), M, OFF.get(), IDX.get(), S.get(), O.get(), LS.get(),
                                DO.get(), DQ.get(), DKV.get(), DS.get(), nullptr);
  }, 3);
  const double pairs = static_cast<double>(L.off.back());
  const double ffwd = 4.0 * pairs * c.H * c.D, fbwd = 2.0 * ffwd;
  std::printf("perf %-60s n_avg=%.1f fwd %8.2f ms %6.2f TFLOP/s   bwd %8.2f ms %6.2f TFLOP/s\n",
              sattn_cfg_name("cuda sattn", c).c_str(), pairs / c.N, tf, ffwd / tf * 1e-9, tb, fbwd / tb * 1e-9);
}

// ---------------------------------------------------------------- indexer

struct IdxRun {
  Guarded<float> sc;
  Guarded<int32_t> cnt, sel, cnt2, sel2;
};

IdxRun idx_device(const IdxCfg& c, const IdxData& d) {
  const auto& sh = d.sh;
  const size_t nq = c.B * c.T, ns = nq * sh.nw;
  IdxRun r{Guarded<float>(ns), Guarded<int32_t>(nq), Guarded<int32_t>(nq * c.topk), Guarded<int32_t>(nq),
           Guarded<int32_t>(nq * c.topk)};
  auto Q = upload(d.q), K = upload(d.k), W = upload(d.w);
  auto P = upload(d.pos);
  DevCopy<float> SC(r.sc);
  DevCopy<int32_t> CNT(r.cnt), SEL(r.sel), CNT2(r.cnt2), SEL2(r.sel2);
  kern::cuda::indexer_topk(ctx(), sh, Q.get(), K.get(), W.get(), P.get(), CNT.get(), SEL.get(), SC.get(), nullptr);
  kern::cuda::indexer_topk(ctx(), sh, Q.get(), K.get(), W.get(), P.get(), CNT2.get(), SEL2.get(), nullptr, nullptr);
  SC.fetch(), CNT.fetch(), SEL.fetch(), CNT2.fetch(), SEL2.fetch();
  return r;
}

bool idx_test(const IdxCfg& c, bool ties) {
  const std::string name = indexer_cfg_name("cuda indexer", c, ties ? " ties/nan" : "");
  const IdxData d(c, 500 + c.T + c.nh * 7 + c.dI, ties);
  IdxRun r = idx_device(c, d);
  bool ok = indexer_check(name, c, d, ties, r.sc, r.cnt, r.sel, r.cnt2, r.sel2, true);
  IdxRun r2 = idx_device(c, d);
  const size_t nq = c.B * c.T;
  size_t diff = bits_differ(r.sc.data(), r2.sc.data(), nq * d.sh.nw);
  diff += std::memcmp(r.cnt.data(), r2.cnt.data(), nq * sizeof(int32_t)) != 0;
  diff += std::memcmp(r.sel.data(), r2.sel.data(), nq * c.topk * sizeof(int32_t)) != 0;
  ok &= report(name, "rerun", static_cast<double>(diff), 0, true, "");
  return ok;
}

void idx_perf(const IdxCfg& c) {
  const IdxData d(c, 7);
  const auto& sh = d.sh;
  const size_t nq = c.B * c.T;
  auto Q = upload(d.q), K = upload(d.k), W = upload(d.w);
  auto P = upload(d.pos);
  kern::DeviceBuffer<int32_t> CNT(dev(), nq), SEL(dev(), nq * c.topk);
  double flops = 0;  // the scoring needed: valid entries of queries with more than topk of them
  for (size_t i = 0; i < nq; ++i) {
    const int64_t nv = kern::indexer_valid_count(d.pos[i], c.m, sh.nw);
    if (nv > std::min<int64_t>(c.topk, sh.nw)) flops += 2.0 * nv * c.nh * c.dI;
  }
  const double t = dev_time_ms([&] {
    kern::cuda::indexer_topk(ctx(), sh, Q.get(), K.get(), W.get(), P.get(), CNT.get(), SEL.get(), nullptr, nullptr);
  }, 3);
  std::printf("perf %-60s %8.3f ms %6.2f TFLOP/s (%.2f GFLOP needed)\n",
              indexer_cfg_name("cuda indexer", c).c_str(), t, flops / t * 1e-9, flops * 1e-9);
}

}  // namespace

TREX_OP_CASES(cuda_v4_attn_cases) {
  // The kernels' own edges: 9 heads (a block of 8 and one of 1), 72 heads (two dkv passes), 1000
  // queries (63 dkv chunks), D = 512 with lists over several 32-row tiles, D = 1.
  const SattnCfg extra[] = {{50, 9, 31, 40, 30, 6, true, 1.f},  {40, 72, 20, 70, 10, 0, false, 1.f},
                            {1000, 3, 17, 33, 20, 9, true, 2.f}, {70, 8, 512, 64, 80, 0, true, 1.f},
                            {33, 2, 1, 5, 3, 0, true, 1.f}};
  for (bool bf : {false, true}) {
    const char* tag = bf ? "cuda sattn_bf16" : "cuda sattn";
    for (const SattnCfg& c : kSattnTests)
      cases.push_back({sattn_cfg_name(tag, c), [c, bf] { return sattn_test(c, bf); }, nullptr, nullptr});
    for (const SattnCfg& c : extra)
      cases.push_back({sattn_cfg_name(tag, c), [c, bf] { return sattn_test(c, bf); }, nullptr, nullptr});
  }
  cases.push_back({sattn_cfg_name("cuda sattn", kSattnNanNoSink), [] { return sattn_test(kSattnNanNoSink, false); },
                   nullptr, nullptr});
  cases.push_back({"cuda sattn D=513 refused", sattn_refuses_big_d, nullptr, nullptr});
  for (const IdxCfg& c : kIdxTests)
    cases.push_back({indexer_cfg_name("cuda indexer", c), [c] { return idx_test(c, false); }, nullptr, nullptr});
  for (const IdxCfg& c : kIdxTiesTests)
    cases.push_back({indexer_cfg_name("cuda indexer", c, " ties/nan"), [c] { return idx_test(c, true); }, nullptr,
                     nullptr});

  const SattnCfg sperfs[] = {
      {4096, 64, 512, 128, 512, 0, true, 1.f},  // DeepSeek-V4: window 128 + up to 512 compressed rows
      {2048, 16, 128, 128, 128, 0, true, 1.f},  // bench-v4 CSA layer
  };
  for (const SattnCfg& c : sperfs)
    cases.push_back({sattn_cfg_name("cuda sattn", c), nullptr, nullptr, [c] { sattn_perf(c); }});
  const IdxCfg iperfs[] = {{1, 4096, 64, 128, 4, 512, PosKind::Causal},   // DeepSeek-V4 indexer
                           {1, 2048, 16, 64, 4, 128, PosKind::Causal}};  // bench-v4
  for (const IdxCfg& c : iperfs)
    cases.push_back({indexer_cfg_name("cuda indexer", c), nullptr, nullptr, [c] { idx_perf(c); }});
}
