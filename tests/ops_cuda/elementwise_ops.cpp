// CUDA cases for RMSNorm, SwiGLU, RoPE, AdamW and the sum of squares: the CUDA kernel on device
// copies against the reference of kernels/ref in double, with trex_ops's bounds (NaN positions
// must agree, guards past every output intact), and SwiGLU's bf16 backward bit for bit against
// the device's to_bf16 of its f32 one; GB/s in perf mode.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>
#include "core/dtype.h"
#include "kernels/ref/adamw.h"
#include "kernels/ref/rmsnorm.h"
#include "kernels/ref/rope.h"
#include "kernels/ref/swiglu.h"
#include "tests/ops/rmsnorm_cases.h"
#include "tests/ops_cuda/device.h"

namespace {
using namespace trex;
using namespace trex::ops;

std::vector<double> dbl(const std::vector<float>& x) { return {x.begin(), x.end()}; }

bool rms_case(int64_t N, int64_t d, int64_t nan_row, double scale) {
  const std::string name = rms_case_name("cuda rmsnorm", N, d, nan_row, scale);
  const RmsInputs in = rms_inputs(N, d, nan_row, scale);
  const std::vector<float>&x = in.x, &w = in.w, &dy = in.dy, &dw0 = in.dw0;
  const size_t nd = N * d;
  const float eps = 1e-6f;
  Guarded<float> y(nd), rs(N), dx(nd), dw(d);
  for (int64_t j = 0; j < d; ++j) dw[j] = dw0[j];
  auto X = upload(x), Wt = upload(w), DY = upload(dy);
  DevCopy<float> Y(y), RS(rs), DX(dx), DW(dw);
  dev().rmsnorm_fwd(X.get(), N, d, Wt.get(), eps, Y.get(), RS.get());
  dev().rmsnorm_bwd(DY.get(), X.get(), N, d, Wt.get(), RS.get(), DX.get(), DW.get());
  Y.fetch(), RS.fetch(), DX.fetch(), DW.fetch();
  std::vector<double> xd = dbl(x), wd = dbl(w), dyd = dbl(dy), yr(nd), rsr(N), dxr(nd), dwr = dbl(dw0);
  kern::ref::rmsnorm_fwd<double>(xd.data(), N, d, wd.data(), eps, yr.data(), rsr.data());
  kern::ref::rmsnorm_bwd<double>(dyd.data(), xd.data(), N, d, wd.data(), rsr.data(), dxr.data(), dwr.data());
  bool ok = true, m1, m2, m3, m4;
  const double e1 = nmse(y.data(), yr.data(), nd, &m1), e2 = nmse(rs.data(), rsr.data(), N, &m2);
  // dx = rstd (dy w - xhat m) cancels where xhat^2 is near 1 (d = 1: to ~1e-7 of its terms), so its
  // error is measured against the size of its terms, sum (rstd dy w)^2, not against dx itself.
  double e3 = nmse(dx.data(), dxr.data(), nd, &m3);
  {
    double num = 0, den = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < d; ++j) {
        const double diff = dx[n * d + j] - dxr[n * d + j], term = rsr[n] * dyd[n * d + j] * wd[j];
        if (std::isfinite(diff)) num += diff * diff, den += term * term;
      }
    e3 = den > 0 ? num / den : num;
  }
  const double e4 = nmse(dw.data(), dwr.data(), d, &m4);
  ok &= report(name, "y", e1, 1e-10, !m1 && y.guard_ok(), "nan/guard");
  ok &= report(name, "rstd", e2, 1e-10, !m2 && rs.guard_ok(), "nan/guard");
  ok &= report(name, "dx", e3, 1e-10, !m3 && dx.guard_ok(), "nan/guard");
  ok &= report(name, "dw", e4, 1e-10, !m4 && dw.guard_ok(), "nan/guard");
  return ok;
}

bool swiglu_case(int64_t N, int64_t F, float limit) {
  const std::string name = "cuda swiglu N=" + std::to_string(N) + " F=" + std::to_string(F) +
                           " limit=" + std::to_string(limit).substr(0, 4);
  Rng r(77 + N * 3 + F);
  std::vector<float> gu(N * 2 * F), dh(N * F);
  fill_normal(gu.data(), gu.size(), r, limit > 0 ? 2.0 * limit : 3.0);  // many values past the clamp
  fill_normal(dh.data(), dh.size(), r);
  if (N * F > 3) gu[1] = std::numeric_limits<float>::quiet_NaN();
  Guarded<float> h(N * F), dgu(N * 2 * F, std::numeric_limits<float>::quiet_NaN());
  auto GU = upload(gu), DH = upload(dh);
  DevCopy<float> Hd(h), DG(dgu);
  dev().swiglu_fwd(GU.get(), N, F, limit, Hd.get());
  dev().swiglu_bwd(DH.get(), GU.get(), N, F, limit, DG.get());
  Hd.fetch(), DG.fetch();
  std::vector<double> gud = dbl(gu), dhd = dbl(dh), hr(N * F), dgr(N * 2 * F);
  kern::ref::swiglu_fwd<double>(gud.data(), N, F, limit, hr.data());
  kern::ref::swiglu_bwd<double>(dhd.data(), gud.data(), N, F, limit, dgr.data());
  bool ok = true, m1, m2;
  const double e1 = nmse(h.data(), hr.data(), h.n, &m1), e2 = nmse(dgu.data(), dgr.data(), dgu.n, &m2);
  ok &= report(name, "h", e1, 1e-10, !m1 && h.guard_ok(), "nan/guard");
  ok &= report(name, "dgu", e2, 1e-10, !m2 && dgu.guard_ok(), "nan/guard");
  // The bf16 backward: the device's own rounding of its f32 backward, bit for bit.
  Guarded<bf16> dgb(N * 2 * F);
  DevCopy<bf16> DGB(dgb);
  dev().swiglu_bwd_bf16(DH.get(), GU.get(), N, F, limit, DGB.get());
  DGB.fetch();
  Guarded<bf16> dgc(N * 2 * F);
  DevCopy<bf16> DGC(dgc);
  auto DGF = upload(std::vector<float>(dgu.data(), dgu.data() + dgu.n));
  dev().to_bf16(DGF.get(), N * 2 * F, 1, N * 2 * F, DGC.get());
  DGC.fetch();
  ok &= report(name, "dgu bf16", std::memcmp(dgb.data(), dgc.data(), dgb.n * sizeof(bf16)) == 0 ? 0 : 1, 0,
               dgb.guard_ok(), "guard");
  return ok;
}

bool rope_case(int64_t N, int H, int D, int extra, bool interleaved, bool inverse) {
  const std::string name = "cuda rope N=" + std::to_string(N) + " H=" + std::to_string(H) + " D=" + std::to_string(D) +
                           (interleaved ? " interleaved" : " half-split") + (inverse ? " inverse" : "");
  Rng r(5 + N + H * 11 + D);
  const int64_t sh = D + extra, st = H * sh, max_pos = N + 7;
  std::vector<float> x(N * st), cs(max_pos * D / 2), sn(max_pos * D / 2);
  std::vector<int32_t> pos(N);
  fill_normal(x.data(), x.size(), r);
  for (size_t i = 0; i < cs.size(); ++i) {
    const double a = r.uniform() * 6.28;
    cs[i] = static_cast<float>(1.1 * std::cos(a)), sn[i] = static_cast<float>(1.1 * std::sin(a));
  }
  for (int64_t n = 0; n < N; ++n) pos[n] = static_cast<int32_t>((n * 5 + 3) % max_pos);
  Guarded<float> xo(x.size());
  for (size_t i = 0; i < x.size(); ++i) xo[i] = x[i];
  auto P = upload(pos);
  auto C = upload(cs), S = upload(sn);
  DevCopy<float> X(xo);
  const auto lay = interleaved ? kern::RopeLayout::Interleaved : kern::RopeLayout::HalfSplit;
  dev().rope_apply(X.get(), N, H, st, sh, D, P.get(), C.get(), S.get(), lay, inverse);
  X.fetch();
  std::vector<double> xr = dbl(x), cd = dbl(cs), sd = dbl(sn);
  kern::ref::rope_apply<double>(xr.data(), N, H, st, sh, D, pos.data(), cd.data(), sd.data(), lay, inverse);
  bool m;
  const double e = nmse(xo.data(), xr.data(), x.size(), &m);
  return report(name, "x", e, 1e-12, !m && xo.guard_ok(), "nan/guard");
}

bool adamw_case(int64_t n, int64_t step, double wd) {
  const std::string name = "cuda adamw n=" + std::to_string(n) + " step=" + std::to_string(step);
  Rng r(9 + n + step);
  std::vector<float> p(n), g(n), m(n), v(n);
  fill_normal(p.data(), n, r);
  fill_normal(g.data(), n, r, 0.1);
  fill_normal(m.data(), n, r, 0.01);
  for (auto& x : v) x = static_cast<float>(std::fabs(r.normal()) * 1e-4);
  kern::AdamWParams hp{1e-3, 0.9, 0.95, 1e-8, wd, step, 0.7f};
  Guarded<float> pg(n), mg(n), vg(n);
  Guarded<bf16> pb(n);
  for (int64_t i = 0; i < n; ++i) pg[i] = p[i], mg[i] = m[i], vg[i] = v[i];
  auto G = upload(g);
  DevCopy<float> Pd(pg), Md(mg), Vd(vg);
  DevCopy<bf16> PB(pb);
  dev().adamw_step(hp, Pd.get(), G.get(), Md.get(), Vd.get(), n, PB.get());
  Pd.fetch(), Md.fetch(), Vd.fetch(), PB.fetch();
  std::vector<float> pr = p, mr = m, vr = v;
  kern::ref::adamw_step<float>(hp, pr.data(), g.data(), mr.data(), vr.data(), n);
  bool round_ok = true;
  for (int64_t i = 0; i < n; ++i) round_ok &= f32_to_bf16(pg[i]).bits == pb[i].bits;
  bool ok = true, m1, m2, m3;
  const double e1 = nmse(pg.data(), pr.data(), n, &m1), e2 = nmse(mg.data(), mr.data(), n, &m2),
               e3 = nmse(vg.data(), vr.data(), n, &m3);
  ok &= report(name, "p", e1, 1e-12, !m1 && pg.guard_ok() && round_ok && pb.guard_ok(), "nan/guard/bf16 copy");
  ok &= report(name, "m", e2, 1e-12, !m2 && mg.guard_ok(), "nan/guard");
  ok &= report(name, "v", e3, 1e-12, !m3 && vg.guard_ok(), "nan/guard");
  // Sum of squares of the gradient, in double, against the sequential reference.
  const double ss = dev().sum_squares(G.get(), n), ssr = kern::ref::sum_squares(g.data(), n);
  ok &= report(name, "sumsq", std::fabs(ss - ssr) / std::max(ssr, 1e-300), 1e-12);
  // The same over segments (uneven, one empty, one past a 4096-element chunk edge).
  std::vector<int64_t> off, sz;
  for (int64_t o = 0, k = 1; o < n; k = (k * 1103515245 + 12345) % 2147483648) {
    const int64_t len = std::min(n - o, 1 + k % 5003);
    off.push_back(o), sz.push_back(len);
    o += len + (k >> 7) % 2;  // a gap now and then
  }
  off.push_back(0), sz.push_back(0);
  double segr = 0;
  for (size_t i = 0; i < off.size(); ++i) segr += kern::ref::sum_squares(g.data() + off[i], sz[i]);
  const double seg = dev().sum_squares_segments(G.get(), off.data(), sz.data(), (int)off.size());
  ok &= report(name, "sumsq segments", std::fabs(seg - segr) / std::max(segr, 1e-300), 1e-12);
  return ok;
}

void perf_rms(int64_t N, int64_t d) {
  kern::DeviceBuffer<float> x(dev(), N * d), y(dev(), N * d), w(dev(), d), rs(dev(), N), dx(dev(), N * d), dw(dev(), d);
  std::vector<float> h(N * d, 1.f);
  x.upload(h.data());
  std::vector<float> wh(d, 1.f);
  w.upload(wh.data());
  const double f = dev_time_ms([&] { dev().rmsnorm_fwd(x.get(), N, d, w.get(), 1e-6f, y.get(), rs.get()); });
  const double b = dev_time_ms([&] { dev().rmsnorm_bwd(y.get(), x.get(), N, d, w.get(), rs.get(), dx.get(), dw.get()); });
  std::printf("perf cuda rmsnorm N=%lld d=%lld  fwd %.3f ms %.0f GB/s  bwd %.3f ms %.0f GB/s\n", (long long)N,
              (long long)d, f, 8.0 * N * d / f / 1e6, b, 12.0 * N * d / b / 1e6);
}

void perf_swiglu(int64_t N, int64_t F) {
  kern::DeviceBuffer<float> gu(dev(), N * 2 * F), h(dev(), N * F), dgu(dev(), N * 2 * F);
  dev().zero(gu.get(), N * 2 * F * 4);
  const double f = dev_time_ms([&] { dev().swiglu_fwd(gu.get(), N, F, 0.f, h.get()); });
  const double b = dev_time_ms([&] { dev().swiglu_bwd(h.get(), gu.get(), N, F, 0.f, dgu.get()); });
  std::printf("perf cuda swiglu N=%lld F=%lld  fwd %.3f ms %.0f GB/s  bwd %.3f ms %.0f GB/s\n", (long long)N,
              (long long)F, f, 12.0 * N * F / f / 1e6, b, 20.0 * N * F / b / 1e6);
}

}  // namespace

TREX_OP_CASES(cuda_elementwise_cases) {
  // trex_ops's shapes and its NaN / small-x cases, then shapes of the CUDA kernel's own edges
  // (d = 1, a row shorter and longer than its 256 threads, DeepSeek-V3's hidden size).
  for (auto& s : kRmsShapes) {
    const int64_t N = s[0], d = s[1];
    cases.push_back({"cuda rmsnorm", [N, d] { return rms_case(N, d, -1, 2.0); }, nullptr, nullptr});
  }
  cases.push_back({"cuda rmsnorm nan", [] { return rms_case(9, 100, 4, 2.0); }, nullptr, nullptr});
  cases.push_back({"cuda rmsnorm small x", [] { return rms_case(17, 300, -1, 1e-3); }, nullptr, nullptr});
  for (auto [N, d] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {17, 1000}, {129, 4096}, {5, 7168}, {300, 333}}) {
    cases.push_back({"cuda rmsnorm N=" + std::to_string(N) + " d=" + std::to_string(d),
                     [N, d] { return rms_case(N, d, -1, 2.0) && rms_case(N, d, -1, 1e-3); }, nullptr, nullptr});
  }
  cases.push_back({"cuda rmsnorm nan", [] { return rms_case(9, 130, 4, 2.0); }, nullptr, nullptr});
  cases.push_back({"cuda rmsnorm perf", nullptr, nullptr, [] { perf_rms(8192, 7168); }});
  for (float lim : {0.f, 7.f, 1.5f})
    for (auto [N, F] : {std::pair<int64_t, int64_t>{1, 1}, {7, 13}, {33, 1408}, {2, 2048}})
      cases.push_back({"cuda swiglu", [N, F, lim] { return swiglu_case(N, F, lim); }, nullptr, nullptr});
  cases.push_back({"cuda swiglu perf", nullptr, nullptr, [] { perf_swiglu(8192, 2048); }});
  for (bool il : {false, true})
    for (bool inv : {false, true}) {
      cases.push_back({"cuda rope", [il, inv] { return rope_case(37, 3, 64, 128, il, inv); }, nullptr, nullptr});
      cases.push_back({"cuda rope", [il, inv] { return rope_case(5, 1, 2, 0, il, inv); }, nullptr, nullptr});
      cases.push_back({"cuda rope", [il, inv] { return rope_case(300, 16, 32, 160, il, inv); }, nullptr, nullptr});
    }
  for (auto [n, s] : {std::pair<int64_t, int64_t>{1, 1}, {1000, 3}, {1 << 20, 100}, {12345, 7}})
    cases.push_back({"cuda adamw", [n, s] { return adamw_case(n, s, 0.1); }, nullptr, nullptr});
}
