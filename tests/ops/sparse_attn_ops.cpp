// Op cases for sparse shared-KV sink attention (kernels/sparse_attn.h):
//   test: dispatched fwd (o, lse) and bwd (dq, dkv +=, dsink +=), and the AVX2 kernel called
//         directly ("sattn[avx2]", kernels/cpu/sparse_attn_avx2.h; skipped on a CPU without
//         AVX2 + FMA, so it also runs on AVX-512 machines), against the reference in double,
//         over odd and round H (1..64, padded head lanes) and D (16..512), lists of a sliding
//         window plus random earlier / compressed rows in random order (lengths 0..~300, several
//         key blocks), queries without keys, with and without a sink, one and many backward
//         chunks; plus bitwise equality of all outputs between 1 thread and all threads. bf16:
//         the dispatched kernel with SparseAttnShape::prec = BF16 ("sattn_bf16") and the
//         AVX512_BF16 kernel called directly ("sattn[avx512bf16]",
//         kernels/cpu/sparse_attn_avx512bf16.h; skipped without AVX512_BF16) on the same cases,
//         with bounds for operands rounded to bf16 (see run_test). "sattn[hd]": the host model
//         of the CUDA kernels (tests/ops/sparse_attn_hd_model.h) on the same cases and bounds;
//   grad: reference backward in double against finite differences of the reference forward
//         (dq, dkv, dsink of sum(o * R));
//   perf: GFLOP/s of fwd (4 N H D n_avg) and bwd (8 N H D n_avg), also with very sharp scores,
//         dispatched, AVX2 and bf16, at the bench-v4 shape (N = 2048, H = 16, D = 128, window 128 +
//         128 compressed rows per query) among others.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/cpu.h"
#include "core/parallel.h"
#include "kernels/cpu/sparse_attn_avx2.h"
#include "kernels/cpu/sparse_attn_avx512.h"
#include "kernels/cpu/sparse_attn_avx512bf16.h"
#include "kernels/ref/sparse_attn.h"
#include "kernels/sparse_attn.h"
#include "tests/ops/harness.h"
#include "tests/ops/sparse_attn_cases.h"
#include "tests/ops/sparse_attn_hd_model.h"

namespace {

using trex::Rng;
using trex::kern::SparseAttnShape;
using namespace trex::ops;

// The implementation under test: the dispatched one, or the AVX2 kernel called directly (on any
// CPU with AVX2 + FMA; its workspace size is its own, checked with guard values).
struct Impl {
  const char* tag;
  void (*fwd)(const SparseAttnShape&, const float*, const float*, int64_t, const int64_t*,
              const int32_t*, const float*, float*, float*);
  void (*bwd)(const SparseAttnShape&, const float*, const float*, int64_t, const int64_t*,
              const int32_t*, const float*, const float*, const float*, const float*, float*,
              float*, float*, float*);
  size_t (*ws)(const SparseAttnShape&, int64_t);
  bool (*usable)();
  bool bf16 = false;  // run with SparseAttnShape::prec = BF16
};
bool always() { return true; }
bool has_avx2_fma() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
bool has_bf16_dot() { return trex::cpu_isa() >= trex::Isa::Avx512Bf16; }
const Impl kImpls[] = {
    {"sattn", trex::kern::sparse_attn_fwd, trex::kern::sparse_attn_bwd,
     trex::kern::sparse_attn_bwd_workspace_floats, always},
    {"sattn[avx2]", trex::kern::cpu::sparse_attn_fwd_avx2, trex::kern::cpu::sparse_attn_bwd_avx2,
     trex::kern::cpu::sparse_attn_bwd_workspace_floats_avx2, has_avx2_fma},
    {"sattn_bf16", trex::kern::sparse_attn_fwd, trex::kern::sparse_attn_bwd,
     trex::kern::sparse_attn_bwd_workspace_floats, always, true},
    {"sattn[avx512bf16]", trex::kern::cpu::sparse_attn_fwd_avx512bf16,
     trex::kern::cpu::sparse_attn_bwd_avx512bf16,
     trex::kern::cpu::sparse_attn_bwd_workspace_floats_avx512, has_bf16_dot, true},
    // The host model of the CUDA kernels (f32; their BF16 shapes run the same code).
    {"sattn[hd]", trex::ops::hd_model::sparse_attn_fwd, trex::ops::hd_model::sparse_attn_bwd,
     trex::ops::hd_model::sparse_attn_ws, always},
};
// A case of an implementation the CPU cannot run passes with a note.
bool skipped(const Impl& im, const std::string& name) {
  if (im.usable()) return false;
  std::printf("skip %-48s (CPU lacks %s)\n", name.c_str(), im.bf16 ? "AVX512_BF16" : "AVX2 + FMA");
  return true;
}

using Cfg = SattnCfg;
std::string cfg_name(const char* op, const Cfg& c) { return sattn_cfg_name(op, c); }

SparseAttnShape shape_of(const Cfg& c, const Impl& im) {
  return sattn_shape_of(c, im.bf16);
}
int64_t rows_of(const Cfg& c) { return sattn_rows_of(c); }
using Lists = SattnLists;
Lists make_lists(const Cfg& c, Rng& r) { return sattn_make_lists(c, r); }

std::vector<double> to_double(const float* p, size_t n) { return std::vector<double>(p, p + n); }

bool check(const std::string& name, const char* what, const float* got,
           const std::vector<double>& want, bool guard_ok, double tol) {
  bool nan_mis = false;
  double e = nmse(got, want.data(), want.size(), &nan_mis);
  return report(name, what, e, tol, guard_ok && !nan_mis,
                guard_ok ? "NaN/Inf mismatch" : "guard overwritten");
}

using Inputs = SattnInputs;
Inputs make_inputs(const Cfg& c, Rng& r) { return sattn_make_inputs(c, r); }

bool run_test(const Impl& im, const Cfg& c) {
  const std::string nf = cfg_name((im.tag + std::string("_fwd")).c_str(), c),
                    nb = cfg_name((im.tag + std::string("_bwd")).c_str(), c);
  if (skipped(im, nf)) return true;
  const SparseAttnShape sh = shape_of(c, im);
  const int64_t M = rows_of(c);
  const size_t nq = size_t(c.N) * c.H * c.D, nkv = size_t(M) * c.D, nl = size_t(c.N) * c.H;
  Rng r(1234 + c.N * 7 + c.D + c.H);
  const Lists L = make_lists(c, r);
  Inputs in = make_inputs(c, r);
  sattn_put_nans(c, in);
  const float* sk = c.sink ? in.sink.data() : nullptr;

  Guarded<float> o(nq), lse(nl), dq(nq, 7.0f), dkv(nkv), dsink(c.H);
  std::copy(in.dkv0.begin(), in.dkv0.end(), dkv.data());
  std::copy(in.dsink0.begin(), in.dsink0.end(), dsink.data());
  Guarded<float> ws(im.ws(sh, M), 3.0f);
  im.fwd(sh, in.q.data(), in.kv.data(), M, L.off.data(), L.idx.data(), sk, o.data(), lse.data());
  im.bwd(sh, in.q.data(), in.kv.data(), M, L.off.data(), L.idx.data(), sk, o.data(), lse.data(),
         in.dO.data(), dq.data(), dkv.data(), c.sink ? dsink.data() : nullptr, ws.data());

  auto qd = to_double(in.q.data(), nq), kvd = to_double(in.kv.data(), nkv),
       sd = to_double(in.sink.data(), c.H), dOd = to_double(in.dO.data(), nq);
  std::vector<double> od(nq), lsed(nl), dqd(nq), dkvd = to_double(in.dkv0.data(), nkv),
                                                 dsd = to_double(in.dsink0.data(), c.H);
  const double* skd = c.sink ? sd.data() : nullptr;
  trex::kern::ref::sparse_attn_fwd<double>(sh, qd.data(), kvd.data(), M, L.off.data(), L.idx.data(),
                                           skd, od.data(), lsed.data());
  trex::kern::ref::sparse_attn_bwd<double>(sh, qd.data(), kvd.data(), M, L.off.data(), L.idx.data(),
                                           skd, od.data(), lsed.data(), dOd.data(), dqd.data(),
                                           dkvd.data(), c.sink ? dsd.data() : nullptr);
  const SattnBounds bd = sattn_bounds(c, im.bf16);
  bool ok = true;
  ok &= check(nf, "o", o.data(), od, o.guard_ok(), bd.o);
  ok &= check(nf, "lse", lse.data(), lsed, lse.guard_ok(), bd.lse);
  ok &= check(nb, "dq", dq.data(), dqd, dq.guard_ok(), bd.grad);
  ok &= check(nb, "dkv", dkv.data(), dkvd, dkv.guard_ok(), bd.grad);
  ok &= check(nb, "dsink", dsink.data(), dsd, dsink.guard_ok() && ws.guard_ok(), bd.grad);
  return ok;
}

// All outputs with 1 thread and with all threads must agree bit for bit.
bool run_determinism(const Impl& im, const Cfg& c) {
  const std::string name = cfg_name((im.tag + std::string("_determinism")).c_str(), c);
  if (skipped(im, name)) return true;
  const SparseAttnShape sh = shape_of(c, im);
  const int64_t M = rows_of(c);
  const size_t nq = size_t(c.N) * c.H * c.D, nl = size_t(c.N) * c.H;
  Rng r(77);
  const Lists L = make_lists(c, r);
  const Inputs in = make_inputs(c, r);
  std::vector<float> ws(im.ws(sh, M));
  auto run = [&](std::vector<float>& out) {
    std::vector<float> o(nq), lse(nl), dq(nq), dkv = in.dkv0, dsink = in.dsink0;
    im.fwd(sh, in.q.data(), in.kv.data(), M, L.off.data(), L.idx.data(), in.sink.data(), o.data(),
           lse.data());
    im.bwd(sh, in.q.data(), in.kv.data(), M, L.off.data(), L.idx.data(), in.sink.data(), o.data(),
           lse.data(), in.dO.data(), dq.data(), dkv.data(), dsink.data(), ws.data());
    out.clear();
    for (auto* v : {&o, &lse, &dq, &dkv, &dsink}) out.insert(out.end(), v->begin(), v->end());
  };
  const int nt = trex::num_threads();
  std::vector<float> a, b;
  omp_set_num_threads(1);
  run(a);
  omp_set_num_threads(nt);
  run(b);
  size_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  char what[64];
  std::snprintf(what, sizeof what, "1 vs %d threads: %zu differing floats", nt, diff);
  return report(name, "bits", static_cast<double>(diff), 0.0, true, what);
}

// f(q, kv, sink) = sum(o * R) in double; its gradient is the reference backward with dO = R.
bool run_grad(const Cfg& c) {
  const SparseAttnShape sh = shape_of(c, kImpls[0]);
  const int64_t M = rows_of(c);
  const size_t nq = size_t(c.N) * c.H * c.D, nkv = size_t(M) * c.D, nl = size_t(c.N) * c.H;
  Rng r(99 + c.N);
  const Lists L = make_lists(c, r);
  std::vector<double> q(nq), kv(nkv), sink(c.H), R(nq), o(nq), lse(nl), dq(nq), dkv(nkv, 0.0),
      dsink(c.H, 0.0);
  fill_normal(q.data(), nq, r), fill_normal(kv.data(), nkv, r), fill_normal(R.data(), nq, r);
  fill_normal(sink.data(), c.H, r);
  const double* sk = c.sink ? sink.data() : nullptr;
  auto f = [&] {
    trex::kern::ref::sparse_attn_fwd<double>(sh, q.data(), kv.data(), M, L.off.data(), L.idx.data(),
                                             sk, o.data(), lse.data());
    double s = 0;
    for (size_t i = 0; i < nq; ++i) s += o[i] * R[i];
    return s;
  };
  f();
  trex::kern::ref::sparse_attn_bwd<double>(sh, q.data(), kv.data(), M, L.off.data(), L.idx.data(),
                                           sk, o.data(), lse.data(), R.data(), dq.data(),
                                           dkv.data(), c.sink ? dsink.data() : nullptr);
  const std::string n = cfg_name("sattn_grad", c);
  bool ok = true;
  ok &= report(n, "dq", fd_check(q, f, dq), 1e-6);
  ok &= report(n, "dkv", fd_check(kv, f, dkv), 1e-6);
  if (c.sink) ok &= report(n, "dsink", fd_check(sink, f, dsink), 1e-6);
  return ok;
}

void run_perf(const Impl& im, const Cfg& c) {
  if (skipped(im, cfg_name(im.tag, c))) return;
  const SparseAttnShape sh = shape_of(c, im);
  const int64_t M = rows_of(c);
  Rng r(5);
  const Lists L = make_lists(c, r);
  const Inputs in = make_inputs(c, r);
  const size_t nq = size_t(c.N) * c.H * c.D, nl = size_t(c.N) * c.H;
  std::vector<float> o(nq), lse(nl), dq(nq), dkv = in.dkv0, dsink = in.dsink0;
  std::vector<float> ws(im.ws(sh, M));
  const float* sk = c.sink ? in.sink.data() : nullptr;
  const double pairs = static_cast<double>(L.off.back());
  const double ffwd = 4.0 * pairs * c.H * c.D, fbwd = 2.0 * ffwd;
  double tf = time_ms(
      [&] {
        im.fwd(sh, in.q.data(), in.kv.data(), M, L.off.data(), L.idx.data(), sk, o.data(),
               lse.data());
      },
      3);
  double tb = time_ms(
      [&] {
        im.bwd(sh, in.q.data(), in.kv.data(), M, L.off.data(), L.idx.data(), sk, o.data(),
               lse.data(), in.dO.data(), dq.data(), dkv.data(), c.sink ? dsink.data() : nullptr,
               ws.data());
      },
      3);
  std::printf("perf %-56s n_avg=%.1f fwd %8.2f ms %7.1f GFLOP/s   bwd %8.2f ms %7.1f GFLOP/s\n",
              cfg_name(im.tag, c).c_str(), pairs / c.N, tf, ffwd / tf * 1e-6, tb,
              fbwd / tb * 1e-6);
}

}  // namespace

TREX_OP_CASES(sparse_attn_cases) {
  const Cfg det = {700, 16, 64, 100, 50, 9, true, 1.f};
  for (const Impl& im : kImpls) {
    for (const Cfg& c : kSattnTests)
      cases.push_back(
          {cfg_name(im.tag, c), [&im, c] { return run_test(im, c); }, nullptr, nullptr});
    if (std::string(im.tag) == "sattn[hd]")
      cases.push_back({cfg_name(im.tag, kSattnNanNoSink), [&im] { return run_test(im, kSattnNanNoSink); },
                       nullptr, nullptr});
    cases.push_back({cfg_name((im.tag + std::string("_det")).c_str(), det),
                     [&im, det] { return run_determinism(im, det); }, nullptr, nullptr});
  }
  const Cfg grads[] = {
      {5, 2, 3, 2, 1, 0, true, 1.f},
      {6, 3, 4, 3, 2, 4, false, 1.f},
      {4, 1, 5, 4, 0, 3, true, 2.f},
  };
  for (const Cfg& c : grads)
    cases.push_back({cfg_name("sattn", c), nullptr, [c] { return run_grad(c); }, nullptr});
  const Cfg perfs[] = {
      {2048, 16, 128, 128, 128, 0, true, 1.f},  // bench-v4 CSA layer: window 128 + 128 compressed
      {2048, 16, 128, 128, 64, 0, true, 1.f},
      {1024, 64, 512, 128, 128, 0, true, 1.f},
      {2048, 16, 128, 128, 64, 0, true, 40.f},  // score spread ~1000: tiny (denormal) probabilities
  };
  for (const Impl& im : kImpls)
    for (const Cfg& c : perfs)
      if (std::string(im.tag) != "sattn[hd]")  // the host model is not a kernel to time
        cases.push_back({cfg_name(im.tag, c), nullptr, nullptr, [&im, c] { run_perf(im, c); }});
}
