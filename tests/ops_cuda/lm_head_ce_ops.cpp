// CUDA cases for the fused LM head + cross-entropy (kernels/lm_head_ce.h) with trex_ops's shapes:
// f32 and bf16, with and without gradients, ignored rows, odd V and chunk sizes (one chunk, many,
// a chunk of 1), N = 0, a NaN row, labels outside [0, V) refused; against the full-logits reference
// in double. bf16: the CUDA kernel rounds p to bf16 for the two gradient GEMMs (the reference does
// the same with round_p); p itself is formed in f32 there and in double here, so a p that lies near
// a bf16 rounding boundary can round the other way: the gradient bound is 1e-7 instead of 1e-9.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>
#include "core/dtype.h"
#include "kernels/ref/lm_head_ce.h"
#include "tests/ops/lm_head_ce_cases.h"
#include "tests/ops_cuda/device.h"

namespace {
using namespace trex;
using namespace trex::ops;
using kern::Prec;

bool ce_case(Prec prec, int64_t N, int64_t d, int64_t V, int64_t chunk, bool grads, int nan_row = -1) {
  const bool bf = prec == Prec::BF16;
  const std::string name = std::string("cuda lm_head_ce ") + (bf ? "bf16" : "f32") + " N=" + std::to_string(N) +
                           " d=" + std::to_string(d) + " V=" + std::to_string(V) + " chunk=" + std::to_string(chunk) +
                           (grads ? " grad" : " fwd") + (nan_row >= 0 ? " nan" : "");
  const CeInputs in = ce_inputs(prec, N, d, V, nan_row);
  const std::vector<float>&h = in.h, &W = in.W, &dW0 = in.dW0;
  const std::vector<bf16>&hb = in.hb, &Wb = in.Wb;
  const std::vector<int32_t>& y = in.y;
  const float gs = 1.f / static_cast<float>(std::max<int64_t>(N, 1));
  Guarded<float> dh(N * d, std::numeric_limits<float>::quiet_NaN()), dW(V * d);
  for (size_t i = 0; i < dW0.size(); ++i) dW[i] = dW0[i];
  auto Hf = upload(h), Wf = upload(W);
  auto Y = upload(y);
  auto Hb = upload(hb), Wbd = upload(Wb);
  DevCopy<float> DH(dh), DW(dW);
  kern::CeArgs a;
  a.prec = prec;
  a.N = N, a.d = d, a.V = V;
  if (bf) a.h_b = Hb.get(), a.W_b = Wbd.get();
  else a.h = Hf.get(), a.W = Wf.get();
  a.labels = Y.get() ? Y.get() : reinterpret_cast<int32_t*>(DH.get());  // N = 0: any device pointer
  a.grad_scale = gs;
  if (grads) a.dh = DH.get(), a.dW = DW.get();
  a.chunk = chunk;
  int64_t nv = -1;
  const double loss = dev().lm_head_ce(a, &nv);
  DH.fetch(), DW.fetch();
  std::vector<double> hd(h.begin(), h.end()), Wd(W.begin(), W.end()), dhr(N * d), dWr(dW0.begin(), dW0.end());
  int64_t nvr = -2;
  const double lref = kern::ref::lm_head_ce<double>(N, d, V, hd.data(), Wd.data(), y.data(), gs,
                                                    grads ? dhr.data() : nullptr, dWr.data(), &nvr, bf);
  bool ok = true;
  const bool both_nan = std::isnan(loss) && std::isnan(lref);
  const double lerr = both_nan ? 0.0 : std::fabs(loss - lref) / std::max(1.0, std::fabs(lref));
  ok &= report(name, "loss", lerr, 1e-6, nv == nvr && (nan_row < 0 || both_nan), "n_valid/nan");
  if (grads) {
    bool m1, m2;
    const double e1 = nmse(dh.data(), dhr.data(), dh.n, &m1), e2 = nmse(dW.data(), dWr.data(), dW.n, &m2);
    const double tol = bf ? 1e-7 : 1e-9;
    // dh sums V products a row: the bound grows with V past 4096, as in tests/ops/lm_head_ce_ops.cpp.
    ok &= report(name, "dh", e1, tol * std::max(1.0, static_cast<double>(V) / 4096), !m1 && dh.guard_ok(),
                 "nan/guard");
    ok &= report(name, "dW", e2, tol, !m2 && dW.guard_ok(), "nan/guard");
  }
  return ok;
}

bool ce_bad_label() {
  bool ok = true;
  for (int32_t bad : {10, -1, -101}) {
    std::vector<int32_t> y = {1, bad, -100};
    std::vector<float> h(3 * 4, 0.5f), W(10 * 4, 0.25f);
    auto Hd = upload(h), Wd = upload(W);
    auto Y = upload(y);
    kern::CeArgs a;
    a.N = 3, a.d = 4, a.V = 10, a.h = Hd.get(), a.W = Wd.get(), a.labels = Y.get();
    bool threw = false;
    try {
      dev().lm_head_ce(a, nullptr);
    } catch (const std::exception&) {
      threw = true;
    }
    ok &= threw;
  }
  return report("cuda lm_head_ce bad label throws", "check", ok ? 0.0 : 1.0, 0.0);
}

void ce_perf(Prec prec, int64_t N, int64_t d, int64_t V) {
  Rng r(4);
  std::vector<bf16> hb(N * d), Wb(V * d);
  for (auto& x : hb) x = f32_to_bf16(static_cast<float>(r.normal()));
  for (auto& x : Wb) x = f32_to_bf16(static_cast<float>(r.normal() * 0.05));
  std::vector<int32_t> y(N);
  for (auto& v : y) v = static_cast<int32_t>(r.next_u64() % V);
  auto H = upload(hb), W = upload(Wb);
  auto Y = upload(y);
  kern::DeviceBuffer<float> dh(dev(), N * d), dW(dev(), V * d);
  dev().zero(dW.get(), V * d * 4);
  kern::CeArgs a;
  a.prec = prec, a.N = N, a.d = d, a.V = V, a.h_b = H.get(), a.W_b = W.get(), a.labels = Y.get();
  a.grad_scale = 1.f / N, a.dh = dh.get(), a.dW = dW.get();
  const double ms = dev_time_ms([&] { dev().lm_head_ce(a, nullptr); }, 5);
  std::printf("perf cuda lm_head_ce bf16 fwd+bwd N=%lld d=%lld V=%lld  %.3f ms  %.1f TFLOP/s (6NVd)\n", (long long)N,
              (long long)d, (long long)V, ms, 6.0 * N * V * d / ms / 1e9);
}

}  // namespace

TREX_OP_CASES(cuda_lm_head_ce_cases) {
  for (Prec p : {Prec::F32, Prec::BF16})
    for (const CeShape& s : kCeShapes)
      for (bool g : {false, true})
        cases.push_back({"cuda lm_head_ce", [=] { return ce_case(p, s.N, s.d, s.V, s.chunk, g); }, nullptr, nullptr});
  cases.push_back({"cuda lm_head_ce nan", [] { return ce_case(Prec::F32, 9, 16, 50, 16, true, 4); }, nullptr, nullptr});
  cases.push_back({"cuda lm_head_ce n=0", [] { return ce_case(Prec::F32, 0, 16, 50, 0, true); }, nullptr, nullptr});
  cases.push_back({"cuda lm_head_ce bad label", [] { return ce_bad_label(); }, nullptr, nullptr});
  cases.push_back({"cuda lm_head_ce perf", nullptr, nullptr, [] { ce_perf(Prec::BF16, 4096, 2048, 32768); }});
}
