// Op cases for the fused LM head + cross-entropy: chunked kernel (f32 and bf16) against the
// full-logits reference in double (loss, n_valid, dh overwrite, dW accumulate, workspace
// bounds), ignored rows, odd V and chunk sizes, bad labels, NaN; reference gradients against
// finite differences; GFLOP/s.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/gemm_bf16_dnnl.h"
#include "kernels/lm_head_ce.h"
#include "kernels/ref/lm_head_ce.h"
#include "tests/ops/harness.h"
#include "tests/ops/lm_head_ce_cases.h"

namespace {
using namespace trex;
using namespace trex::ops;
using kern::Prec;

bool ce_case(Prec prec, int64_t N, int64_t d, int64_t V, int64_t chunk, bool grads, int nan_row = -1) {
  std::string name = std::string("lm_head_ce ") + (prec == Prec::BF16 ? "bf16" : "f32") + " N=" + std::to_string(N) +
                     " d=" + std::to_string(d) + " V=" + std::to_string(V) + " chunk=" + std::to_string(chunk) +
                     (grads ? " grad" : " fwd") + (nan_row >= 0 ? " nan" : "");
  const CeInputs in = ce_inputs(prec, N, d, V, nan_row);
  const std::vector<float>&h = in.h, &W = in.W, &dW0 = in.dW0;
  const std::vector<bf16>&hb = in.hb, &Wb = in.Wb;
  const std::vector<int32_t>& y = in.y;
  const float gs = 1.f / static_cast<float>(std::max<int64_t>(N, 1));
  Guarded<float> dh(N * d, std::numeric_limits<float>::quiet_NaN()), dW(V * d);  // dh overwritten
  for (size_t i = 0; i < dW0.size(); ++i) dW[i] = dW0[i];
  kern::CeArgs a;
  a.prec = prec;
  a.N = N, a.d = d, a.V = V;
  if (prec == Prec::BF16) a.h_b = hb.data(), a.W_b = Wb.data();
  else a.h = h.data(), a.W = W.data();
  a.labels = y.data();
  a.grad_scale = gs;
  if (grads) a.dh = dh.data(), a.dW = dW.data();
  a.chunk = chunk;
  Guarded<float> ws(kern::lm_head_ce_workspace_floats(a));
  a.workspace = ws.data();
  int64_t nv = -1;
  double loss = kern::lm_head_ce(a, &nv);

  std::vector<double> hd(h.begin(), h.end()), Wd(W.begin(), W.end()), dhr(N * d), dWr(dW0.begin(), dW0.end());
  int64_t nvr = -2;
  // bf16 on the dot-product GEMMs: the kernel rounds p to bf16 for the gradient GEMMs.
  const bool round_p = prec == Prec::BF16 && kern::bf16_dot_gemm();
  double lref = kern::ref::lm_head_ce<double>(N, d, V, hd.data(), Wd.data(), y.data(), gs, grads ? dhr.data() : nullptr,
                                              dWr.data(), &nvr, round_p);
  bool ok = true;
  const bool both_nan = std::isnan(loss) && std::isnan(lref);
  const double lerr = both_nan ? 0.0 : std::fabs(loss - lref) / std::max(1.0, std::fabs(lref));
  ok &= report(name, "loss", lerr, 1e-6, nv == nvr && ws.guard_ok() && (nan_row < 0 || both_nan), "n_valid/ws/nan");
  if (grads) {
    bool m1, m2;  // set by nmse before use (argument evaluation order is unspecified)
    const double e1 = nmse(dh.data(), dhr.data(), dh.n, &m1), e2 = nmse(dW.data(), dWr.data(), dW.n, &m2);
    // dh sums V products a row: a plain f32 sum of them (the scalar reference GEMM) has an error
    // variance growing with V, so its bound grows with V past the 4096 the small cases have.
    const double tol_dh = 1e-9 * std::max(1.0, static_cast<double>(V) / 4096);
    ok &= report(name, "dh", e1, tol_dh, !m1 && dh.guard_ok(), "nan/guard");
    ok &= report(name, "dW", e2, 1e-9, !m2 && dW.guard_ok(), "nan/guard");
  } else {
    bool untouched = true;
    for (size_t i = 0; i < dW0.size(); ++i) untouched &= std::memcmp(&dW[i], &dW0[i], 4) == 0;
    ok &= report(name, "dW untouched", untouched ? 0.0 : 1.0, 0.0);
  }
  return ok;
}

// A label outside [0, V) other than -100 must throw.
bool ce_bad_label() {
  const int64_t N = 3, d = 4, V = 10;
  std::vector<float> h(N * d, 0.1f), W(V * d, 0.2f);
  bool ok = true;
  for (int32_t bad : {10, -1, -101}) {
    std::vector<int32_t> y = {1, bad, -100};
    kern::CeArgs a;
    a.N = N, a.d = d, a.V = V, a.h = h.data(), a.W = W.data(), a.labels = y.data();
    bool threw = false;
    try {
      kern::lm_head_ce(a, nullptr);
    } catch (const trex::Error&) {
      threw = true;
    }
    ok &= threw;
  }
  return report("lm_head_ce bad label throws", "check", ok ? 0.0 : 1.0, 0.0);
}

// Reference gradients (double) against finite differences of grad_scale * loss.
bool ce_grad(int64_t N, int64_t d, int64_t V) {
  std::string name = "lm_head_ce N=" + std::to_string(N) + " d=" + std::to_string(d) + " V=" + std::to_string(V);
  Rng r(41 + N + d + V);
  std::vector<double> h(N * d), W(V * d), dh(N * d), dW(V * d, 0.0);
  fill_normal(h.data(), h.size(), r);
  fill_normal(W.data(), W.size(), r);
  std::vector<int32_t> y = ce_labels(N, V, r, 0.0);
  y[N / 2] = -100;
  const double gs = 0.37;
  auto f = [&]() { return gs * kern::ref::lm_head_ce<double>(N, d, V, h.data(), W.data(), y.data(), gs, nullptr, nullptr, nullptr); };
  kern::ref::lm_head_ce<double>(N, d, V, h.data(), W.data(), y.data(), gs, dh.data(), dW.data(), nullptr);
  bool ok = report(name, "dh", fd_check(h, f, dh), 1e-6);
  ok &= report(name, "dW", fd_check(W, f, dW), 1e-6);
  return ok;
}

void ce_perf(Prec prec, int64_t N, int64_t d, int64_t V, bool grads) {
  Rng r(8);
  std::vector<float> h(N * d), W(V * d), dh, dW;
  fill_normal(h.data(), h.size(), r);
  fill_normal(W.data(), W.size(), r, 0.03);
  std::vector<bf16> hb, Wb;
  std::vector<int32_t> y = ce_labels(N, V, r, 0.1);
  kern::CeArgs a;
  a.prec = prec;
  a.N = N, a.d = d, a.V = V, a.labels = y.data(), a.grad_scale = 1.f / N;
  if (prec == Prec::BF16) {
    hb.resize(h.size());
    Wb.resize(W.size());
    for (size_t i = 0; i < h.size(); ++i) hb[i] = f32_to_bf16(h[i]);
    for (size_t i = 0; i < W.size(); ++i) Wb[i] = f32_to_bf16(W[i]);
    a.h_b = hb.data(), a.W_b = Wb.data();
  } else {
    a.h = h.data(), a.W = W.data();
  }
  if (grads) {
    dh.resize(N * d);
    dW.assign(V * d, 0.f);
    a.dh = dh.data(), a.dW = dW.data();
  }
  std::vector<float> ws(kern::lm_head_ce_workspace_floats(a));
  a.workspace = ws.data();
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    double t0 = now_ms();
    kern::lm_head_ce(a, nullptr);
    best = std::min(best, now_ms() - t0);
  }
  const double flops = kern::lm_head_ce_flops(a, grads);  // executed (6 or 8 N V d with grads)
  std::printf("perf lm_head_ce %-4s %s N=%ld d=%ld V=%ld chunk=%ld  %8.1f ms  %6.1f GFLOP/s executed"
              "  (%.1f useful: %s)\n",
              prec == Prec::BF16 ? "bf16" : "f32", grads ? "fwd+bwd" : "fwd    ", (long)N, (long)d, (long)V,
              (long)(a.chunk ? a.chunk : 0), best,
              flops / best * 1e-6, (grads ? 6.0 : 2.0) * N * V * d / best * 1e-6, grads ? "6NVd" : "2NVd");
}

}  // namespace

TREX_OP_CASES(lm_head_ce_cases) {
  for (Prec p : {Prec::F32, Prec::BF16})
    for (const CeShape& s : kCeShapes)
      for (bool g : {false, true})
        cases.push_back({"lm_head_ce", [=] { return ce_case(p, s.N, s.d, s.V, s.chunk, g); }, nullptr, nullptr});
  cases.push_back({"lm_head_ce nan", [] { return ce_case(Prec::F32, 9, 16, 50, 16, true, 4); }, nullptr, nullptr});
  cases.push_back({"lm_head_ce n=0", [] { return ce_case(Prec::F32, 0, 16, 50, 0, true); }, nullptr, nullptr});
  cases.push_back({"lm_head_ce bad label", [] { return ce_bad_label(); }, nullptr, nullptr});
  const int64_t gshapes[][3] = {{3, 5, 7}, {4, 6, 11}, {2, 3, 1}};
  for (auto& g : gshapes) {
    int64_t N = g[0], d = g[1], V = g[2];
    cases.push_back({"lm_head_ce", nullptr, [=] { return ce_grad(N, d, V); }, nullptr});
  }
  for (Prec p : {Prec::F32, Prec::BF16})
    for (bool g : {false, true})
      cases.push_back({"lm_head_ce perf", nullptr, nullptr, [=] { ce_perf(p, 1024, 1024, 32768, g); }});
}
