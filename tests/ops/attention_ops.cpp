// Op cases for causal flash attention (kernels/attention.h):
//   test: dispatched fwd (o, lse) and bwd (dq, dk, dv), the GEMM-based kernel called directly
//         ("attn[blas]", kernels/cpu/attention_blas.h) and the AVX2 kernel called directly
//         ("attn[avx2]", kernels/cpu/attention_avx2.h; skipped on a CPU without AVX2 + FMA),
//         against the reference in double, over odd and round shapes, Dqk != Dv, document ids
//         (2-3 documents per row) and sliding windows; the AVX2 kernel also over tile-edge T,
//         windows on and off the 64-key tile edges, and 1, 2, 3 threads (which change how the
//         work splits: query-block chunks forward, key-block sets backward). bf16: the
//         dispatched kernel with AttnShape::prec = BF16 ("attn_bf16") and the AVX512_BF16 kernel
//         called directly ("attn[avx512bf16]", kernels/cpu/attention_avx512bf16.h; skipped
//         without AVX512_BF16) on the same shapes and on the AVX2 list's kind, with bounds for
//         operands rounded to bf16 (see run_test); query rows Tq < T (the last Tq positions:
//         a context-parallel chunk against the keys before it) and dk, dv accumulation for the
//         flash kernels (dispatched f32, AVX2, bf16): Tq and T - Tq on and off the tile edges,
//         documents, 1-3 threads, against the reference's rows on the whole sequence with the
//         output gradient of the other rows 0;
//   grad: reference backward in double against finite differences of the reference forward;
//   perf: GFLOP/s of fwd and bwd at B=1, T=2048, H=16, Dqk=192, Dv=128 and at bench-v3's heads
//         (H=8, Dqk=96, Dv=64) at T=2048 and 8192 (causal flop count).
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "core/cpu.h"
#include "kernels/cpu/attention_avx2.h"
#include "kernels/cpu/attention_avx512bf16.h"
#include "kernels/cpu/attention_blas.h"
#include "kernels/ref/attention.h"
#include "tests/ops/attention_cases.h"
#include "tests/ops/harness.h"

namespace {

using trex::Rng;
using trex::kern::AttnShape;
using namespace trex::ops;

// The implementation under test: the dispatched one (AVX-512, AVX2, or GEMM-based), or the
// GEMM-based / AVX2 one called directly (so each is tested on every machine that can run it).
struct Impl {
  const char* tag;
  void (*fwd)(const AttnShape&, const float*, const float*, const float*, float*, float*, const int32_t*);
  void (*bwd)(const AttnShape&, const float*, const float*, const float*, const float*, const float*,
              const float*, float*, float*, float*, const int32_t*);
  bool (*usable)();
  bool bf16 = false;  // run with AttnShape::prec = BF16
};
bool always() { return true; }
bool has_bf16_dot() { return trex::cpu_isa() >= trex::Isa::Avx512Bf16; }
bool has_avx2_fma() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
void dispatched_fwd(const AttnShape& sh, const float* q, const float* k, const float* v, float* o, float* lse,
                    const int32_t* seg) {
  trex::kern::attention_fwd(sh, q, k, v, o, lse, seg);
}
void dispatched_bwd(const AttnShape& sh, const float* q, const float* k, const float* v, const float* o,
                    const float* lse, const float* dO, float* dq, float* dk, float* dv, const int32_t* seg) {
  trex::kern::attention_bwd(sh, q, k, v, o, lse, dO, dq, dk, dv, seg);
}
const Impl kImpls[] = {
    {"attn", dispatched_fwd, dispatched_bwd, always},
    {"attn[blas]", trex::kern::cpu::attention_fwd_blas, trex::kern::cpu::attention_bwd_blas, always},
    {"attn[avx2]", trex::kern::cpu::attention_fwd_avx2, trex::kern::cpu::attention_bwd_avx2,
     has_avx2_fma},
    {"attn_bf16", dispatched_fwd, dispatched_bwd, always, true},
    {"attn[avx512bf16]", trex::kern::cpu::attention_fwd_avx512bf16,
     trex::kern::cpu::attention_bwd_avx512bf16, has_bf16_dot, true}};
const Impl& kAvx2 = kImpls[2];
const Impl& kBf16 = kImpls[4];

template <class T>
std::vector<double> to_double(const T* p, size_t n) {
  return std::vector<double>(p, p + n);
}

bool check(const std::string& name, const char* what, const float* got,
           const std::vector<double>& want, bool guard_ok, double tol) {
  bool nan_mis = false;
  double e = nmse(got, want.data(), want.size(), &nan_mis);
  return report(name, what, e, tol, guard_ok && !nan_mis,
                guard_ok ? "NaN/Inf mismatch" : "guard overwritten");
}

bool run_test(const Impl& im, const AttnCfg& c) {
  if (!im.usable()) {
    std::printf("skip %-48s (CPU lacks %s)\n", attn_cfg_name(im.tag, c).c_str(),
                im.bf16 ? "AVX512_BF16" : "AVX2 + FMA");
    return true;
  }
  AttnShape sh = attn_shape_of(c);
  if (im.bf16) sh.prec = trex::kern::Prec::BF16;
  if ((c.Tq > 0 || c.acc) && im.fwd == dispatched_fwd && !trex::kern::attention_supports_rows(sh)) {
    std::printf("skip %-48s (no flash kernel here)\n", attn_cfg_name(im.tag, c).c_str());
    return true;
  }
  // Query rows: the last Tq of the T positions (all T when c.Tq is 0).
  const int Tq = sh.rows(), off = c.T - Tq;
  const size_t rq = size_t(c.H) * c.Dqk, rv = size_t(c.H) * c.Dv;  // floats a position
  const size_t nq = size_t(c.B) * c.T * rq, nv = size_t(c.B) * c.T * rv, nl = size_t(c.B) * c.H * c.T;
  const size_t lq = size_t(c.B) * Tq * rq, lv = size_t(c.B) * Tq * rv, ll = size_t(c.B) * c.H * Tq;
  Rng r(1234 + c.T * 7 + c.Dqk);
  std::vector<float> q(nq), k(nq), v(nv), dO(nv, 0.0f);
  fill_normal(q.data(), nq, r), fill_normal(k.data(), nq, r), fill_normal(v.data(), nv, r);
  // The output gradient of the query rows; the positions before them get 0.
  for (int b = 0; b < c.B; ++b) fill_normal(dO.data() + (size_t(b) * c.T + off) * rv, Tq * rv, r);
  std::vector<int32_t> seg = c.seg ? attn_make_seg(c, r) : std::vector<int32_t>();
  const int32_t* sp = c.seg ? seg.data() : nullptr;
  // The kernel's operands: rows [off, T) of every batch row of q and dO.
  auto rows_of = [&](const std::vector<float>& x, size_t w) {
    std::vector<float> y;
    for (int b = 0; b < c.B; ++b)
      y.insert(y.end(), x.begin() + (size_t(b) * c.T + off) * w, x.begin() + (size_t(b) * c.T + c.T) * w);
    return y;
  };
  const std::vector<float> ql = rows_of(q, rq), dOl = rows_of(dO, rv);
  // acc: dk, dv start from values the backward must add to.
  std::vector<float> dk0(nq, 7.0f), dv0(nv, 7.0f);
  if (c.acc) fill_normal(dk0.data(), nq, r), fill_normal(dv0.data(), nv, r);

  Guarded<float> o(lv), lse(ll), dq(lq, 7.0f), dk(nq), dv(nv);
  std::copy(dk0.begin(), dk0.end(), dk.data()), std::copy(dv0.begin(), dv0.end(), dv.data());
  const int nt = omp_get_max_threads();
  if (c.threads > 0) omp_set_num_threads(c.threads);
  im.fwd(sh, ql.data(), k.data(), v.data(), o.data(), lse.data(), sp);
  im.bwd(sh, ql.data(), k.data(), v.data(), o.data(), lse.data(), dOl.data(), dq.data(), dk.data(), dv.data(), sp);
  omp_set_num_threads(nt);

  // The reference on the whole sequence (square), then its query rows.
  AttnShape shr = sh;
  shr.Tq = 0, shr.acc_dkv = false;
  auto qd = to_double(q.data(), nq), kd = to_double(k.data(), nq), vd = to_double(v.data(), nv),
       dOd = to_double(dO.data(), nv);
  std::vector<double> of(nv), lsef(nl), dqf(nq), dkd(nq), dvd(nv);
  trex::kern::ref::attention_fwd<double>(shr, qd.data(), kd.data(), vd.data(), of.data(),
                                         lsef.data(), sp);
  trex::kern::ref::attention_bwd<double>(shr, qd.data(), kd.data(), vd.data(), of.data(),
                                         lsef.data(), dOd.data(), dqf.data(), dkd.data(),
                                         dvd.data(), sp);
  std::vector<double> od, dqd, lsed;
  for (int b = 0; b < c.B; ++b) {
    od.insert(od.end(), of.begin() + (size_t(b) * c.T + off) * rv, of.begin() + (size_t(b) * c.T + c.T) * rv);
    dqd.insert(dqd.end(), dqf.begin() + (size_t(b) * c.T + off) * rq, dqf.begin() + (size_t(b) * c.T + c.T) * rq);
    for (int h = 0; h < c.H; ++h)
      lsed.insert(lsed.end(), lsef.begin() + (size_t(b) * c.H + h) * c.T + off,
                  lsef.begin() + (size_t(b) * c.H + h) * c.T + c.T);
  }
  if (c.acc)  // compare what the call added (the sum's error is the addend's)
    for (size_t i = 0; i < nq; ++i) dk[i] -= dk0[i];
  if (c.acc)
    for (size_t i = 0; i < nv; ++i) dv[i] -= dv0[i];
  const std::string nf = attn_cfg_name((std::string(im.tag) + "_fwd").c_str(), c),
                    nb = attn_cfg_name((std::string(im.tag) + "_bwd").c_str(), c);
  // bf16 (q, k, v, dO, P and dS rounded to nearest even bf16, relative error <= 2^-9 each, f32
  // accumulation): the bounds of the CUDA bf16 kernel (tests/ops_cuda/attention_ops.cpp). The
  // AVX512_BF16 kernel's worst over these cases (Zen 4): o 9.9e-6, lse 2.0e-6 (T > 1), 1.3e-3
  // (T = 1), gradients 7.0e-5, so the bounds hold 4-10x of room. At T = 1 the lse is the one
  // scaled score q.k itself, whose relative error after rounding q and k grows as
  // |q||k| / |q.k|; for T > 1 the log of the sum keeps it small.
  const bool bf = im.bf16;
  const double to = bf ? 1e-4 : 1e-10, tl = bf ? (c.T == 1 ? 1e-2 : 1e-5) : 1e-12,
               tg = bf ? 3e-4 : 1e-10;
  bool ok = true;
  ok &= check(nf, "o", o.data(), od, o.guard_ok(), to);
  ok &= check(nf, "lse", lse.data(), lsed, lse.guard_ok(), tl);
  ok &= check(nb, "dq", dq.data(), dqd, dq.guard_ok(), tg);
  ok &= check(nb, "dk", dk.data(), dkd, dk.guard_ok(), tg);
  ok &= check(nb, "dv", dv.data(), dvd, dv.guard_ok(), tg);
  return ok;
}

// f(q, k, v) = sum(o * R) in double; its gradient is the reference backward with dO = R.
bool run_grad(const AttnCfg& c) {
  const AttnShape sh = attn_shape_of(c);
  const size_t nq = size_t(c.B) * c.T * c.H * c.Dqk, nv = size_t(c.B) * c.T * c.H * c.Dv,
               nl = size_t(c.B) * c.H * c.T;
  Rng r(99 + c.T);
  std::vector<double> q(nq), k(nq), v(nv), R(nv), o(nv), lse(nl), dq(nq), dk(nq), dv(nv);
  fill_normal(q.data(), nq, r), fill_normal(k.data(), nq, r), fill_normal(v.data(), nv, r);
  fill_normal(R.data(), nv, r);
  std::vector<int32_t> seg = c.seg ? attn_make_seg(c, r) : std::vector<int32_t>();
  const int32_t* sp = c.seg ? seg.data() : nullptr;
  auto f = [&] {
    trex::kern::ref::attention_fwd<double>(sh, q.data(), k.data(), v.data(), o.data(), lse.data(),
                                           sp);
    double s = 0;
    for (size_t i = 0; i < nv; ++i) s += o[i] * R[i];
    return s;
  };
  f();
  trex::kern::ref::attention_bwd<double>(sh, q.data(), k.data(), v.data(), o.data(), lse.data(),
                                         R.data(), dq.data(), dk.data(), dv.data(), sp);
  const std::string n = attn_cfg_name("attn_grad", c);
  bool ok = true;
  ok &= report(n, "dq", fd_check(q, f, dq), 1e-6);
  ok &= report(n, "dk", fd_check(k, f, dk), 1e-6);
  ok &= report(n, "dv", fd_check(v, f, dv), 1e-6);
  return ok;
}

void run_perf(const Impl& im, const AttnCfg& c) {
  if (!im.usable()) return;
  AttnShape sh = attn_shape_of(c);
  if (im.bf16) sh.prec = trex::kern::Prec::BF16;
  const size_t nq = size_t(c.B) * c.T * c.H * c.Dqk, nv = size_t(c.B) * c.T * c.H * c.Dv,
               nl = size_t(c.B) * c.H * c.T;
  Rng r(5);
  std::vector<float> q(nq), k(nq), v(nv), dO(nv), o(nv), lse(nl), dq(nq), dk(nq), dv(nv);
  fill_normal(q.data(), nq, r), fill_normal(k.data(), nq, r), fill_normal(v.data(), nv, r);
  fill_normal(dO.data(), nv, r);
  std::vector<int32_t> seg = c.seg ? attn_make_seg(c, r) : std::vector<int32_t>();
  const int32_t* sp = c.seg ? seg.data() : nullptr;
  // Causal flops (the attended half of T x T, or T x window): fwd 2 (Dqk + Dv) per score, bwd 2.5x.
  double pairs = 0;
  for (int t = 0; t < c.T; ++t) pairs += c.window > 0 ? std::min(t + 1, c.window) : t + 1;
  const double ffwd = 2.0 * (c.Dqk + c.Dv) * pairs * c.H * c.B, fbwd = 2.5 * ffwd;
  double tf = time_ms(
      [&] { im.fwd(sh, q.data(), k.data(), v.data(), o.data(), lse.data(), sp); }, 3);
  double tb = time_ms(
      [&] {
        im.bwd(sh, q.data(), k.data(), v.data(), o.data(), lse.data(), dO.data(), dq.data(), dk.data(), dv.data(), sp);
      },
      3);
  std::printf("perf %-48s fwd %8.2f ms %7.1f GFLOP/s   bwd %8.2f ms %7.1f GFLOP/s\n",
              attn_cfg_name(im.tag, c).c_str(), tf, ffwd / tf * 1e-6, tb, fbwd / tb * 1e-6);
}

}  // namespace

TREX_OP_CASES(attention_cases) {
  for (const Impl& im : kImpls)
    for (const AttnCfg& c : kAttnTests)
      cases.push_back({attn_cfg_name(im.tag, c), [&im, c] { return run_test(im, c); }, nullptr, nullptr});
  // AVX2 kernel: T on and around the 64-row tile edges, odd H, Dqk != Dv, windows smaller than,
  // equal to and larger than a tile and not multiples of 8, documents, each at 1, 2, 3 threads.
  const AttnCfg avx2[] = {
      {1, 1, 3, 96, 64, 0, false},    {3, 7, 1, 96, 64, 0, true},     {1, 63, 3, 24, 40, 0, false},
      {2, 65, 3, 96, 64, 0, true},    {1, 128, 1, 96, 64, 64, false}, {1, 130, 5, 33, 17, 65, true},
      {1, 257, 3, 96, 64, 0, false},  {1, 257, 1, 96, 64, 9, true},   {2, 200, 1, 8, 8, 1, false},
      {1, 320, 2, 40, 72, 130, false}, {2, 70, 2, 5, 3, 0, true},
  };
  for (const AttnCfg& c0 : avx2)
    for (int th = 1; th <= 3; ++th) {
      AttnCfg c = c0;
      c.threads = th;
      cases.push_back({attn_cfg_name(kAvx2.tag, c), [c] { return run_test(kAvx2, c); }, nullptr, nullptr});
    }
  // AVX512_BF16 kernel: T 1, 7, 45, 200 and on and around the tile edges (64 and 128 for the
  // AVX2 / f32 tiles; 192 and 384 for this kernel's; odd T: the last pair of a reduction over keys
  // or queries is half zero), odd H, odd Dqk / Dv (odd pairs), Dqk 40 / Dv 24 (MLA-like, not
  // multiples of 16), documents, windows narrower and wider than a tile, 1, 2, 3 threads.
  const AttnCfg bf16[] = {
      {1, 1, 3, 40, 24, 0, false},    {3, 7, 1, 96, 64, 0, true},    {1, 45, 5, 40, 24, 0, true},
      {2, 200, 3, 40, 24, 0, true},   {1, 200, 5, 192, 128, 0, false}, {1, 63, 3, 24, 40, 0, false},
      {2, 65, 3, 96, 64, 0, true},    {1, 130, 5, 33, 17, 65, true}, {1, 257, 1, 96, 64, 9, true},
      {1, 320, 2, 40, 72, 130, false}, {2, 70, 2, 5, 3, 0, true},   {1, 191, 3, 40, 24, 0, false},
      {2, 193, 2, 96, 64, 0, true},   {1, 385, 3, 33, 17, 0, false}, {1, 577, 2, 40, 24, 250, true},
      {1, 384, 1, 96, 64, 191, false},
  };
  for (const AttnCfg& c0 : bf16)
    for (int th = 1; th <= 3; ++th) {
      AttnCfg c = c0;
      c.threads = th;
      cases.push_back({attn_cfg_name(kBf16.tag, c), [c] { return run_test(kBf16, c); }, nullptr, nullptr});
    }
  // Query rows Tq < T and dk, dv accumulation (context parallelism's chunks): the flash kernels
  // (dispatched f32, AVX2, bf16 dispatched and direct) with the first query on a tile edge
  // (T - Tq = 64; 192 for the bf16 kernel) and off it, one query row, Tq = T, documents, a
  // window, 1, 2, 3 threads.
  const AttnCfg rows[] = {
      {1, 203, 3, 40, 24, 0, false, 0, 139, false}, {1, 203, 3, 40, 24, 0, true, 0, 100, false},
      {2, 150, 5, 33, 17, 0, true, 0, 37, true},     {1, 130, 2, 96, 64, 0, false, 0, 1, false},
      {1, 257, 1, 192, 128, 0, true, 0, 130, true},  {2, 64, 2, 16, 16, 0, false, 0, 64, true},
      {1, 7, 3, 5, 3, 0, true, 0, 3, false},         {1, 321, 2, 24, 40, 0, false, 0, 200, true},
      {1, 260, 2, 40, 24, 70, true, 0, 150, true},  {1, 450, 2, 40, 24, 0, true, 0, 258, true},
      {1, 401, 3, 33, 17, 0, false, 0, 208, false}, {1, 600, 2, 40, 24, 200, true, 0, 216, true},
  };
  for (const Impl* im : {&kImpls[0], &kImpls[2], &kImpls[3], &kImpls[4]})
    for (const AttnCfg& c0 : rows)
      for (int th = 1; th <= 3; ++th) {
        AttnCfg c = c0;
        c.threads = th;
        cases.push_back({attn_cfg_name(im->tag, c), [im, c] { return run_test(*im, c); }, nullptr, nullptr});
      }
  const AttnCfg grads[] = {
      {2, 7, 2, 5, 3, 0, false},
      {2, 9, 1, 4, 6, 0, true},
      {1, 9, 3, 3, 3, 3, false},
      {2, 8, 1, 5, 4, 4, true},
  };
  for (const AttnCfg& c : grads)
    cases.push_back({attn_cfg_name("attn", c), nullptr, [c] { return run_grad(c); }, nullptr});
  const AttnCfg perfs[] = {{1, 2048, 16, 192, 128, 0, false}, {1, 2048, 8, 96, 64, 0, false},
                           {1, 8192, 8, 96, 64, 0, false}};
  for (const Impl& im : kImpls)
    for (const AttnCfg& c : perfs)
      cases.push_back({attn_cfg_name(im.tag, c), nullptr, nullptr, [&im, c] { run_perf(im, c); }});
}
