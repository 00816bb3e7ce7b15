// Op cases for the mHC kernels (kernels/hyper_conn.h): fast vs the float reference for the pre
// step, the post step and the head (forward and backward, accumulation into non-zero gradients,
// null upstream gradients, NaN tokens, guard bytes), bitwise independence of the thread count,
// reference backward in double against finite differences (with large eps so every + eps in
// the Sinkhorn denominators matters), and timings.
#include <omp.h>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>
#include "core/parallel.h"
#include "kernels/hyper_conn.h"
#include "kernels/ref/hyper_conn.h"
#include "tests/ops/harness.h"
#include "tests/ops/hyper_conn_cases.h"

namespace {
using namespace trex;
using namespace trex::ops;
using kern::HcShape;

std::string shape_name(const char* op, const HcShape& s) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s N=%ld n=%d d=%ld it=%d eps=%g/%g", op, static_cast<long>(s.N), s.n,
                static_cast<long>(s.d), s.iters, s.hc_eps, s.norm_eps);
  return buf;
}

// Pre step forward + backward against the float reference. nulls: bit 0 dy, 1 dpost, 2 dcomb
// passed as null. nan_tok >= 0 puts a NaN into that token's x.
bool pre_test(HcShape s, int nulls, int64_t nan_tok) {
  std::string name = shape_name("hc_pre", s) + (nulls ? " nulls=" + std::to_string(nulls) : "") +
                     (nan_tok >= 0 ? " nan" : "");
  HcData<float> D(s, 11 + s.N * 3 + s.d + s.n);
  if (nan_tok >= 0) D.x[nan_tok * D.K + D.K / 2] = std::numeric_limits<float>::quiet_NaN();
  const size_t N = s.N, n = s.n, R = D.R, K = D.K;
  Guarded<float> y(N * s.d), post(N * n), comb(N * n * n), mix(N * R), rstd(N);
  std::vector<float> y_r(N * s.d), post_r(N * n), comb_r(N * n * n), mix_r(N * R), rstd_r(N);
  kern::hc_pre_fwd(s, D.x.data(), D.fn.data(), D.base.data(), D.scale.data(), y.data(), post.data(), comb.data(),
                   mix.data(), rstd.data());
  kern::ref::hc_pre_fwd<float>(s, D.x.data(), D.fn.data(), D.base.data(), D.scale.data(), y_r.data(),
                               post_r.data(), comb_r.data(), mix_r.data(), rstd_r.data());
  bool ok = cmp(name, "y", y, y_r, 1e-10);
  ok &= cmp(name, "post", post, post_r, 1e-10);
  ok &= cmp(name, "comb", comb, comb_r, 1e-10);
  ok &= cmp(name, "mix", mix, mix_r, 1e-10);
  ok &= cmp(name, "rstd", rstd, rstd_r, 1e-10);

  Rng r(99);
  std::vector<float> dx0(N * K), dfn0(R * K), db0(R), ds0(3);  // gradients accumulate into these
  fill_normal(dx0.data(), dx0.size(), r);
  fill_normal(dfn0.data(), dfn0.size(), r);
  fill_normal(db0.data(), R, r);
  fill_normal(ds0.data(), 3, r);
  auto dx = guarded(dx0), dfn = guarded(dfn0), db = guarded(db0), ds = guarded(ds0);
  std::vector<float> dx_r(dx0), dfn_r(dfn0), db_r(db0), ds_r(ds0);
  Guarded<float> ws(kern::hc_pre_bwd_workspace_floats(s));
  const float* dy = nulls & 1 ? nullptr : D.dy.data();
  const float* dpost = nulls & 2 ? nullptr : D.dpost.data();
  const float* dcomb = nulls & 4 ? nullptr : D.dcomb.data();
  kern::hc_pre_bwd(s, D.x.data(), D.fn.data(), D.base.data(), D.scale.data(), mix.data(), rstd.data(), dy, dpost,
                   dcomb, dx.data(), dfn.data(), db.data(), ds.data(), ws.data());
  kern::ref::hc_pre_bwd<float>(s, D.x.data(), D.fn.data(), D.base.data(), D.scale.data(), mix_r.data(),
                               rstd_r.data(), dy, dpost, dcomb, dx_r.data(), dfn_r.data(), db_r.data(), ds_r.data());
  ok &= cmp(name, "dx", dx, dx_r, 1e-9);
  ok &= cmp(name, "dfn", dfn, dfn_r, 1e-9);
  ok &= cmp(name, "dbase", db, db_r, 1e-9);
  ok &= cmp(name, "dscale", ds, ds_r, 1e-9);
  ok &= report(name, "ws guard", 0, 0, ws.guard_ok(), "guard");
  return ok;
}

bool post_test(HcShape s) {
  std::string name = shape_name("hc_post", s);
  HcData<float> D(s, 5 + s.N + s.d);
  const size_t N = s.N, n = s.n, K = D.K, d = s.d;
  // Doubly-stochastic-ish comb and post as the pre step makes them.
  std::vector<float> y(N * d), post(N * n), comb(N * n * n), mix(N * D.R), rstd(N);
  kern::ref::hc_pre_fwd<float>(s, D.x.data(), D.fn.data(), D.base.data(), D.scale.data(), y.data(), post.data(),
                               comb.data(), mix.data(), rstd.data());
  Guarded<float> out(N * K), dx(N * K, 7.f), df(N * d, 7.f), dpost(N * n, 7.f), dcomb(N * n * n, 7.f);
  std::vector<float> out_r(N * K), dx_r(N * K), df_r(N * d), dpost_r(N * n), dcomb_r(N * n * n);
  kern::hc_post_fwd(s, D.x.data(), D.f.data(), post.data(), comb.data(), out.data());
  kern::hc_post_bwd(s, D.x.data(), D.f.data(), post.data(), comb.data(), D.dout.data(), dx.data(), df.data(),
                    dpost.data(), dcomb.data());
  kern::ref::hc_post_fwd<float>(s, D.x.data(), D.f.data(), post.data(), comb.data(), out_r.data());
  kern::ref::hc_post_bwd<float>(s, D.x.data(), D.f.data(), post.data(), comb.data(), D.dout.data(), dx_r.data(),
                                df_r.data(), dpost_r.data(), dcomb_r.data());
  bool ok = cmp(name, "out", out, out_r, 1e-11);
  ok &= cmp(name, "dx", dx, dx_r, 1e-11);
  ok &= cmp(name, "df", df, df_r, 1e-11);
  ok &= cmp(name, "dpost", dpost, dpost_r, 1e-11);
  ok &= cmp(name, "dcomb", dcomb, dcomb_r, 1e-11);
  return ok;
}

bool head_test(HcShape s) {
  std::string name = shape_name("hc_head", s);
  HcData<float> D(s, 17 + s.N + s.d * 5);
  const size_t N = s.N, n = s.n, K = D.K, d = s.d;
  Guarded<float> y(N * d), mix(N * n), rstd(N), dx(N * K, 7.f), ws(kern::hc_head_bwd_workspace_floats(s));
  std::vector<float> y_r(N * d), mix_r(N * n), rstd_r(N), dx_r(N * K);
  std::vector<float> dfn0(n * K, 0.25f), db0(n, -0.5f), ds0(1, 0.75f);
  auto dfn = guarded(dfn0), db = guarded(db0), ds = guarded(ds0);
  std::vector<float> dfn_r(dfn0), db_r(db0), ds_r(ds0);
  kern::hc_head_fwd(s, D.x.data(), D.hfn.data(), D.hbase.data(), D.hscale.data(), y.data(), mix.data(), rstd.data());
  kern::ref::hc_head_fwd<float>(s, D.x.data(), D.hfn.data(), D.hbase.data(), D.hscale.data(), y_r.data(),
                                mix_r.data(), rstd_r.data());
  kern::hc_head_bwd(s, D.x.data(), D.hfn.data(), D.hbase.data(), D.hscale.data(), mix.data(), rstd.data(),
                    D.dy.data(), dx.data(), dfn.data(), db.data(), ds.data(), ws.data());
  kern::ref::hc_head_bwd<float>(s, D.x.data(), D.hfn.data(), D.hbase.data(), D.hscale.data(), mix_r.data(),
                                rstd_r.data(), D.dy.data(), dx_r.data(), dfn_r.data(), db_r.data(), ds_r.data());
  bool ok = cmp(name, "y", y, y_r, 1e-10);
  ok &= cmp(name, "mix", mix, mix_r, 1e-10);
  ok &= cmp(name, "rstd", rstd, rstd_r, 1e-10);
  ok &= cmp(name, "dx", dx, dx_r, 1e-9);
  ok &= cmp(name, "dfn", dfn, dfn_r, 1e-9);
  ok &= cmp(name, "dbase", db, db_r, 1e-9);
  ok &= cmp(name, "dscale", ds, ds_r, 1e-9);
  ok &= report(name, "ws guard", 0, 0, ws.guard_ok(), "guard");
  return ok;
}

// Every output of pre fwd/bwd and head fwd/bwd bitwise equal for 1 and 3 threads.
bool determinism(HcShape s) {
  std::string name = shape_name("hc determinism", s);
  HcData<float> D(s, 3);
  const size_t N = s.N, n = s.n, R = D.R, K = D.K, d = s.d;
  auto run = [&](int threads) {
    const int nt = num_threads();
    omp_set_num_threads(threads);
    std::vector<float> out(N * d + N * n + N * n * n + N * R + N + N * K + R * K + R + 3, 0.f);
    float* p = out.data();
    float *y = p, *post = y + N * d, *comb = post + N * n, *mix = comb + N * n * n, *rstd = mix + N * R;
    float *dx = rstd + N, *dfn = dx + N * K, *db = dfn + R * K, *ds = db + R;
    std::vector<float> ws(kern::hc_pre_bwd_workspace_floats(s));
    kern::hc_pre_fwd(s, D.x.data(), D.fn.data(), D.base.data(), D.scale.data(), y, post, comb, mix, rstd);
    kern::hc_pre_bwd(s, D.x.data(), D.fn.data(), D.base.data(), D.scale.data(), mix, rstd, D.dy.data(),
                     D.dpost.data(), D.dcomb.data(), dx, dfn, db, ds, ws.data());
    std::vector<float> h(N * d + N * n + N + N * K + n * K + n + 1, 0.f), hws(kern::hc_head_bwd_workspace_floats(s));
    float *hy = h.data(), *hmix = hy + N * d, *hr = hmix + N * n, *hdx = hr + N, *hdfn = hdx + N * K;
    float *hdb = hdfn + n * K, *hds = hdb + n;
    kern::hc_head_fwd(s, D.x.data(), D.hfn.data(), D.hbase.data(), D.hscale.data(), hy, hmix, hr);
    kern::hc_head_bwd(s, D.x.data(), D.hfn.data(), D.hbase.data(), D.hscale.data(), hmix, hr, D.dy.data(), hdx,
                      hdfn, hdb, hds, hws.data());
    out.insert(out.end(), h.begin(), h.end());
    omp_set_num_threads(nt);
    return out;
  };
  const auto a = run(1), b = run(3);
  size_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) bad += std::memcmp(&a[i], &b[i], 4) != 0;
  return report(name, "bitwise", static_cast<double>(bad), 0);
}

// Reference backward (double) against central differences of the reference forward (double).
bool pre_grad(HcShape s) {
  std::string name = shape_name("hc_pre", s);
  HcData<double> D(s, 21 + s.n + s.d);
  const size_t N = s.N, n = s.n, R = D.R, K = D.K, d = s.d;
  std::vector<double> y(N * d), post(N * n), comb(N * n * n), mix(N * R), rstd(N);
  auto fwd = [&] {
    kern::ref::hc_pre_fwd<double>(s, D.x.data(), D.fn.data(), D.base.data(), D.scale.data(), y.data(), post.data(),
                                  comb.data(), mix.data(), rstd.data());
  };
  auto loss = [&] {  // L = dy . y + dpost . post + dcomb . comb
    fwd();
    double l = 0;
    for (size_t i = 0; i < y.size(); ++i) l += D.dy[i] * y[i];
    for (size_t i = 0; i < post.size(); ++i) l += D.dpost[i] * post[i];
    for (size_t i = 0; i < comb.size(); ++i) l += D.dcomb[i] * comb[i];
    return l;
  };
  fwd();
  std::vector<double> dx(N * K, 0.0), dfn(R * K, 0.0), db(R, 0.0), ds(3, 0.0);
  kern::ref::hc_pre_bwd<double>(s, D.x.data(), D.fn.data(), D.base.data(), D.scale.data(), mix.data(), rstd.data(),
                                D.dy.data(), D.dpost.data(), D.dcomb.data(), dx.data(), dfn.data(), db.data(),
                                ds.data());
  bool ok = report(name, "dx", fd_check(D.x, loss, dx), 1e-6);
  ok &= report(name, "dfn", fd_check(D.fn, loss, dfn), 1e-6);
  ok &= report(name, "dbase", fd_check(D.base, loss, db), 1e-6);
  ok &= report(name, "dscale", fd_check(D.scale, loss, ds), 1e-6);
  return ok;
}

bool post_grad(HcShape s) {
  std::string name = shape_name("hc_post", s);
  HcData<double> D(s, 23 + s.n + s.d);
  const size_t N = s.N, n = s.n, K = D.K, d = s.d;
  std::vector<double> post(D.dpost), comb(D.dcomb), out(N * K);  // any values will do here
  auto loss = [&] {
    kern::ref::hc_post_fwd<double>(s, D.x.data(), D.f.data(), post.data(), comb.data(), out.data());
    double l = 0;
    for (size_t i = 0; i < out.size(); ++i) l += D.dout[i] * out[i];
    return l;
  };
  std::vector<double> dx(N * K), df(N * d), dpost(N * n), dcomb(N * n * n);
  kern::ref::hc_post_bwd<double>(s, D.x.data(), D.f.data(), post.data(), comb.data(), D.dout.data(), dx.data(),
                                 df.data(), dpost.data(), dcomb.data());
  bool ok = report(name, "dx", fd_check(D.x, loss, dx), 1e-6);
  ok &= report(name, "df", fd_check(D.f, loss, df), 1e-6);
  ok &= report(name, "dpost", fd_check(post, loss, dpost), 1e-6);
  ok &= report(name, "dcomb", fd_check(comb, loss, dcomb), 1e-6);
  return ok;
}

bool head_grad(HcShape s) {
  std::string name = shape_name("hc_head", s);
  HcData<double> D(s, 29 + s.n + s.d);
  const size_t N = s.N, n = s.n, K = D.K, d = s.d;
  std::vector<double> y(N * d), mix(N * n), rstd(N);
  auto fwd = [&] {
    kern::ref::hc_head_fwd<double>(s, D.x.data(), D.hfn.data(), D.hbase.data(), D.hscale.data(), y.data(),
                                   mix.data(), rstd.data());
  };
  auto loss = [&] {
    fwd();
    double l = 0;
    for (size_t i = 0; i < y.size(); ++i) l += D.dy[i] * y[i];
    return l;
  };
  fwd();
  std::vector<double> dx(N * K), dfn(n * K, 0.0), db(n, 0.0), ds(1, 0.0);
  kern::ref::hc_head_bwd<double>(s, D.x.data(), D.hfn.data(), D.hbase.data(), D.hscale.data(), mix.data(),
                                 rstd.data(), D.dy.data(), dx.data(), dfn.data(), db.data(), ds.data());
  bool ok = report(name, "dx", fd_check(D.x, loss, dx), 1e-6);
  ok &= report(name, "dfn", fd_check(D.hfn, loss, dfn), 1e-6);
  ok &= report(name, "dbase", fd_check(D.hbase, loss, db), 1e-6);
  ok &= report(name, "dscale", fd_check(D.hscale, loss, ds), 1e-6);
  return ok;
}

void hc_perf(HcShape s) {
  HcData<float> D(s, 1);
  const size_t N = s.N, n = s.n, R = D.R, K = D.K, d = s.d;
  std::vector<float> y(N * d), post(N * n), comb(N * n * n), mix(N * R), rstd(N), dx(N * K, 0.f), dfn(R * K, 0.f);
  std::vector<float> db(R, 0.f), ds(3, 0.f), ws(kern::hc_pre_bwd_workspace_floats(s)), out(N * K), df(N * d);
  std::vector<float> dpost(N * n), dcomb(N * n * n), hmix(N * n), hws(kern::hc_head_bwd_workspace_floats(s));
  const double tf = time_ms([&] {
    kern::hc_pre_fwd(s, D.x.data(), D.fn.data(), D.base.data(), D.scale.data(), y.data(), post.data(), comb.data(),
                     mix.data(), rstd.data());
  });
  const double tb = time_ms([&] {
    kern::hc_pre_bwd(s, D.x.data(), D.fn.data(), D.base.data(), D.scale.data(), mix.data(), rstd.data(),
                     D.dy.data(), D.dpost.data(), D.dcomb.data(), dx.data(), dfn.data(), db.data(), ds.data(),
                     ws.data());
  });
  const double tpf = time_ms([&] {
    kern::hc_post_fwd(s, D.x.data(), D.f.data(), post.data(), comb.data(), out.data());
  });
  const double tpb = time_ms([&] {
    kern::hc_post_bwd(s, D.x.data(), D.f.data(), post.data(), comb.data(), D.dout.data(), dx.data(), df.data(),
                      dpost.data(), dcomb.data());
  });
  const double thf = time_ms([&] {
    kern::hc_head_fwd(s, D.x.data(), D.hfn.data(), D.hbase.data(), D.hscale.data(), y.data(), hmix.data(),
                      rstd.data());
  });
  const double thb = time_ms([&] {
    kern::hc_head_bwd(s, D.x.data(), D.hfn.data(), D.hbase.data(), D.hscale.data(), hmix.data(), rstd.data(),
                      D.dy.data(), dx.data(), dfn.data(), db.data(), ds.data(), hws.data());
  });
  const double xb = 4.0 * N * K * 1e-6;  // MB of x; GB/s below counts one read of x per ms
  std::printf("perf %s  pre fwd %.2f ms (%.1f GB/s of x)  pre bwd %.2f ms  pre fwd+bwd %.2f ms\n",
              shape_name("hc", s).c_str(), tf, xb / tf, tb, tf + tb);
  std::printf("perf %s  post fwd %.2f ms  post bwd %.2f ms  head fwd %.2f ms  head bwd %.2f ms\n",
              shape_name("hc", s).c_str(), tpf, tpb, thf, thb);
}

}  // namespace

TREX_OP_CASES(hyper_conn_cases) {
  // {N, n, d, iters, hc_eps, norm_eps}; N = 200 and 1000 end in a partial chunk; n = 13 and the
  // largest n (kHcMaxStreams) with d off the 16-lane width.
  const HcShape shapes[] = {{1, 1, 7, 1, 1e-6f, 1e-6f},       {2, 3, 5, 4, 1e-2f, 0.1f},
                            {3, 3, 37, 4, 1e-6f, 1e-6f},      {37, 4, 129, 20, 1e-6f, 1e-6f},
                            {5, 5, 37, 3, 0.05f, 0.3f},       {200, 4, 64, 20, 1e-6f, 1e-6f},
                            {129, 4, 1000, 20, 1e-6f, 1e-6f}, {1000, 2, 37, 7, 1e-3f, 1e-5f},
                            {7, 13, 45, 5, 1e-6f, 1e-6f},     {3, 64, 17, 2, 1e-6f, 1e-6f}};
  for (const auto& s : shapes) {
    cases.push_back({"hc_pre", [=] { return pre_test(s, 0, -1); }, nullptr, nullptr});
    cases.push_back({"hc_post", [=] { return post_test(s); }, nullptr, nullptr});
    cases.push_back({"hc_head", [=] { return head_test(s); }, nullptr, nullptr});
  }
  for (int nulls : {1, 2, 4, 6, 7}) {
    auto t = [=] { return pre_test({9, 4, 33, 5, 1e-2f, 1e-6f}, nulls, -1); };
    cases.push_back({"hc_pre nulls", t, nullptr, nullptr});
  }
  cases.push_back({"hc_pre nan", [] { return pre_test({11, 3, 40, 6, 1e-6f, 1e-6f}, 0, 4); }, nullptr, nullptr});
  // One chunk and 3 dfn column blocks; one dfn column block and 4 chunks; many of both.
  const HcShape dshapes[] = {{3, 4, 300, 20, 1e-6f, 1e-6f}, {50, 4, 100, 20, 1e-6f, 1e-6f},
                             {301, 4, 257, 20, 1e-6f, 1e-6f}};
  for (const auto& s : dshapes) cases.push_back({"hc determinism", [=] { return determinism(s); }, nullptr, nullptr});

  const HcShape gshapes[] = {{2, 3, 5, 4, 0.05f, 0.3f}, {1, 1, 3, 2, 0.1f, 0.5f}, {2, 4, 6, 20, 0.02f, 0.2f},
                             {3, 2, 4, 1, 0.1f, 0.1f}, {2, 3, 4, 6, 1e-6f, 1e-6f}};
  for (const auto& s : gshapes) {
    cases.push_back({"hc_pre", nullptr, [=] { return pre_grad(s); }, nullptr});
    cases.push_back({"hc_post", nullptr, [=] { return post_grad(s); }, nullptr});
    cases.push_back({"hc_head", nullptr, [=] { return head_grad(s); }, nullptr});
  }
  cases.push_back({"hc", nullptr, nullptr, [] { hc_perf({2048, 4, 1024, 20, 1e-6f, 1e-6f}); }});
  cases.push_back({"hc", nullptr, nullptr, [] { hc_perf({512, 4, 7168, 20, 1e-6f, 1e-6f}); }});
}
