// CUDA cases for DeepSeek-V4's hyper-connections (kernels/hyper_conn.h, kernels/cuda/hyper_conn.cu),
// the compressors' pooling (kernels/compress_pool.h, kernels/cuda/compress_pool.cu) and the step's
// row operations (kernels/v4_rows.h, kernels/cuda/v4_rows.cu): each against the CPU reference
// (kernels/ref/, kernels/hd/) with trex_ops's cases and bounds (tests/ops/hyper_conn_ops.cpp,
// compress_pool_ops.cpp, v4_rows_ops.cpp): gradients accumulated into non-zero values, null
// upstream gradients, NaN tokens, guards past every output. Determinism: two runs of each
// backward give the same bits (parameter gradients are reduced in a fixed order).
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>
#include "kernels/hd/v4_rows.h"
#include "kernels/hyper_conn.h"
#include "kernels/ref/compress_pool.h"
#include "kernels/ref/hyper_conn.h"
#include "tests/ops/hyper_conn_cases.h"
#include "tests/ops_cuda/device.h"

namespace {
using namespace trex;
using namespace trex::ops;
using kern::HcShape;

std::string hc_name(const char* op, const HcShape& s, const std::string& extra = "") {
  char buf[160];
  std::snprintf(buf, sizeof buf, "cuda %s N=%ld n=%d d=%ld it=%d eps=%g/%g%s", op, (long)s.N, s.n, (long)s.d, s.iters,
                s.hc_eps, s.norm_eps, extra.c_str());
  return buf;
}

std::vector<float> randv(size_t n, Rng& r, double sc, double mean = 0.0) {
  std::vector<float> v(n);
  for (float& e : v) e = (float)(mean + sc * r.normal());
  return v;
}

// The workspace the CUDA backward kernels use: the first floats of the CPU's
// (hc_pre_bwd_workspace_floats / hc_head_bwd_workspace_floats, which this harness does not link):
// dz, dmix, pre [N, R], [N, R], [N, n] (head: R = n) and cx [N].
size_t hc_ws(const HcShape& s, bool head) {
  const size_t N = s.N, n = s.n, R = head ? n : (2 + n) * n;
  return 2 * N * R + N * n + N;
}


// The pre step, forward and backward (run twice: the second must repeat the first bit for bit).
bool pre_case(HcShape s, int nulls, int64_t nan_tok) {
  const std::string name = hc_name("hc_pre", s, (nulls ? " nulls=" + std::to_string(nulls) : std::string()) +
                                                    (nan_tok >= 0 ? " nan" : ""));
  HcData<float> D(s, 11 + s.N * 3 + s.d + s.n);
  if (nan_tok >= 0) D.x[nan_tok * D.K + D.K / 2] = std::numeric_limits<float>::quiet_NaN();
  const size_t N = s.N, n = s.n, R = D.R, K = D.K;
  Guarded<float> y(N * s.d), post(N * n), comb(N * n * n), mix(N * R), rstd(N);
  std::vector<float> y_r(N * s.d), post_r(N * n), comb_r(N * n * n), mix_r(N * R), rstd_r(N);
  auto X = upload(D.x), Fn = upload(D.fn), Bs = upload(D.base), Sc = upload(D.scale);
  DevCopy<float> Y(y), Po(post), Co(comb), Mi(mix), Rs(rstd);
  dev().hc_pre_fwd(s, X.get(), Fn.get(), Bs.get(), Sc.get(), Y.get(), Po.get(), Co.get(), Mi.get(), Rs.get());
  Y.fetch(), Po.fetch(), Co.fetch(), Mi.fetch(), Rs.fetch();
  kern::ref::hc_pre_fwd<float>(s, D.x.data(), D.fn.data(), D.base.data(), D.scale.data(), y_r.data(), post_r.data(),
                               comb_r.data(), mix_r.data(), rstd_r.data());
  bool ok = cmp(name, "y", y, y_r, 1e-10);
  ok &= cmp(name, "post", post, post_r, 1e-10);
  ok &= cmp(name, "comb", comb, comb_r, 1e-10);
  ok &= cmp(name, "mix", mix, mix_r, 1e-10);
  ok &= cmp(name, "rstd", rstd, rstd_r, 1e-10);

  Rng r(99);
  const std::vector<float> dx0 = randv(N * K, r, 1.0), dfn0 = randv(R * K, r, 1.0), db0 = randv(R, r, 1.0),
                           ds0 = randv(3, r, 1.0);
  std::vector<float> dx_r(dx0), dfn_r(dfn0), db_r(db0), ds_r(ds0);
  const float* dy_h = nulls & 1 ? nullptr : D.dy.data();
  const float* dpost_h = nulls & 2 ? nullptr : D.dpost.data();
  const float* dcomb_h = nulls & 4 ? nullptr : D.dcomb.data();
  kern::ref::hc_pre_bwd<float>(s, D.x.data(), D.fn.data(), D.base.data(), D.scale.data(), mix_r.data(), rstd_r.data(),
                               dy_h, dpost_h, dcomb_h, dx_r.data(), dfn_r.data(), db_r.data(), ds_r.data());
  auto Dy = upload(D.dy), Dp = upload(D.dpost), Dc = upload(D.dcomb);
  std::vector<float> first;
  for (int run = 0; run < 2; ++run) {
    auto dx = guarded(dx0), dfn = guarded(dfn0), db = guarded(db0), ds = guarded(ds0);
    Guarded<float> ws(hc_ws(s, false));
    DevCopy<float> DX(dx), DF(dfn), DB(db), DS(ds), WS(ws);
    dev().hc_pre_bwd(s, X.get(), Fn.get(), Bs.get(), Sc.get(), Mi.get(), Rs.get(), nulls & 1 ? nullptr : Dy.get(),
                     nulls & 2 ? nullptr : Dp.get(), nulls & 4 ? nullptr : Dc.get(), DX.get(), DF.get(), DB.get(),
                     DS.get(), WS.get());
    DX.fetch(), DF.fetch(), DB.fetch(), DS.fetch(), WS.fetch();
    std::vector<float> all(dx.data(), dx.data() + dx.n);
    all.insert(all.end(), dfn.data(), dfn.data() + dfn.n);
    all.insert(all.end(), db.data(), db.data() + db.n);
    all.insert(all.end(), ds.data(), ds.data() + ds.n);
    if (run == 1) {
      ok &= report(name, "repeat", std::memcmp(all.data(), first.data(), all.size() * 4) ? 1 : 0, 0);
      break;
    }
    first = all;
    ok &= cmp(name, "dx", dx, dx_r, 1e-9);
    ok &= cmp(name, "dfn", dfn, dfn_r, 1e-9);
    ok &= cmp(name, "dbase", db, db_r, 1e-9);
    ok &= cmp(name, "dscale", ds, ds_r, 1e-9);
    ok &= report(name, "ws guard", 0, 0, ws.guard_ok(), "guard");
  }
  return ok;
}

bool post_case(HcShape s) {
  const std::string name = hc_name("hc_post", s);
  HcData<float> D(s, 5 + s.N + s.d);
  const size_t N = s.N, n = s.n, K = D.K, d = s.d;
  std::vector<float> y(N * d), post(N * n), comb(N * n * n), mix(N * D.R), rstd(N);
  kern::ref::hc_pre_fwd<float>(s, D.x.data(), D.fn.data(), D.base.data(), D.scale.data(), y.data(), post.data(),
                               comb.data(), mix.data(), rstd.data());
  Guarded<float> out(N * K), dx(N * K, 7.f), df(N * d, 7.f), dpost(N * n, 7.f), dcomb(N * n * n, 7.f);
  std::vector<float> out_r(N * K), dx_r(N * K), df_r(N * d), dpost_r(N * n), dcomb_r(N * n * n);
  auto X = upload(D.x), F = upload(D.f), Po = upload(post), Co = upload(comb), Do = upload(D.dout);
  DevCopy<float> O(out), DX(dx), DF(df), DP(dpost), DC(dcomb);
  dev().hc_post_fwd(s, X.get(), F.get(), Po.get(), Co.get(), O.get());
  dev().hc_post_bwd(s, X.get(), F.get(), Po.get(), Co.get(), Do.get(), DX.get(), DF.get(), DP.get(), DC.get());
  O.fetch(), DX.fetch(), DF.fetch(), DP.fetch(), DC.fetch();
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

bool head_case(HcShape s) {
  const std::string name = hc_name("hc_head", s);
  HcData<float> D(s, 17 + s.N + s.d * 5);
  const size_t N = s.N, n = s.n, K = D.K, d = s.d;
  Guarded<float> y(N * d), mix(N * n), rstd(N), dx(N * K, 7.f), ws(hc_ws(s, true));
  std::vector<float> y_r(N * d), mix_r(N * n), rstd_r(N), dx_r(N * K);
  const std::vector<float> dfn0(n * K, 0.25f), db0(n, -0.5f), ds0(1, 0.75f);
  auto dfn = guarded(dfn0), db = guarded(db0), ds = guarded(ds0);
  std::vector<float> dfn_r(dfn0), db_r(db0), ds_r(ds0);
  auto X = upload(D.x), Fn = upload(D.hfn), Bs = upload(D.hbase), Sc = upload(D.hscale), Dy = upload(D.dy);
  DevCopy<float> Y(y), Mi(mix), Rs(rstd), DX(dx), WS(ws), DF(dfn), DB(db), DS(ds);
  dev().hc_head_fwd(s, X.get(), Fn.get(), Bs.get(), Sc.get(), Y.get(), Mi.get(), Rs.get());
  dev().hc_head_bwd(s, X.get(), Fn.get(), Bs.get(), Sc.get(), Mi.get(), Rs.get(), Dy.get(), DX.get(), DF.get(),
                    DB.get(), DS.get(), WS.get());
  Y.fetch(), Mi.fetch(), Rs.fetch(), DX.fetch(), WS.fetch(), DF.fetch(), DB.fetch(), DS.fetch();
  kern::ref::hc_head_fwd<float>(s, D.x.data(), D.hfn.data(), D.hbase.data(), D.hscale.data(), y_r.data(),
                                mix_r.data(), rstd_r.data());
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

struct PoolCfg {
  int64_t B, T, m, hd;
  int c;
};

std::string pool_name(const PoolCfg& p, const char* extra = "") {
  char buf[160];
  std::snprintf(buf, sizeof buf, "cuda compress_pool B=%ld T=%ld m=%ld hd=%ld c=%d%s", (long)p.B, (long)p.T, (long)p.m,
                (long)p.hd, p.c, extra);
  return buf;
}

// As tests/ops/compress_pool_ops.cpp's pool_test; the backward runs twice (same bits).
bool pool_case(const PoolCfg& p, bool special, double gscale = 2.0) {
  const std::string name = pool_name(p, special ? " nan/-inf" : "");
  Rng r(100 + p.T * 3 + p.m * 5 + p.hd + p.c);
  const size_t n = p.B * p.T * p.c * p.hd, nout = p.B * (p.T / p.m) * p.hd, npb = p.m * p.c * p.hd;
  std::vector<float> kv = randv(n, r, 1.0), gate = randv(n, r, gscale), pb = randv(npb, r, 0.5),
                     dout = randv(nout, r, 1.0), dpb0 = randv(npb, r, 1.0);
  const int64_t C = p.c * p.hd, nw = p.T / p.m;
  if (special && nw >= 2) {
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    gate[p.m * C + C - 1] = nan;
    kv[(p.m - 1) * C + C - 1] = nan;
    gate[0] = -inf;
    for (int64_t k = 0; k < p.m; ++k) {
      gate[(p.m + k) * C + (p.c == 2 ? p.hd + 1 : 1)] = -inf;
      if (p.c == 2) gate[k * C + 1] = -inf;
    }
  }
  std::vector<float> out_r(nout), dkv_r(n), dgate_r(n), dpb_r(dpb0);
  kern::ref::compress_pool_fwd<float>(p.B, p.T, p.m, p.hd, p.c, kv.data(), gate.data(), pb.data(), out_r.data());
  kern::ref::compress_pool_bwd<float>(p.B, p.T, p.m, p.hd, p.c, kv.data(), gate.data(), pb.data(), dout.data(),
                                      dkv_r.data(), dgate_r.data(), dpb_r.data());
  auto KV = upload(kv), G = upload(gate), PB = upload(pb), DO = upload(dout);
  bool ok = true;
  std::vector<float> first;
  for (int run = 0; run < 2; ++run) {
    Guarded<float> out(nout), dkv(n, 7.f), dgate(n, 7.f), dpb(npb);
    for (size_t i = 0; i < npb; ++i) dpb[i] = dpb0[i];
    Guarded<float> ws(1);  // the CUDA kernels use none
    DevCopy<float> O(out), DK(dkv), DG(dgate), DP(dpb), WS(ws);
    dev().compress_pool_fwd(p.B, p.T, p.m, p.hd, p.c, KV.get(), G.get(), PB.get(), O.get());
    dev().compress_pool_bwd(p.B, p.T, p.m, p.hd, p.c, KV.get(), G.get(), PB.get(), DO.get(), DK.get(), DG.get(),
                            DP.get(), WS.get());
    O.fetch(), DK.fetch(), DG.fetch(), DP.fetch();
    std::vector<float> all(dkv.data(), dkv.data() + n);
    all.insert(all.end(), dgate.data(), dgate.data() + n);
    all.insert(all.end(), dpb.data(), dpb.data() + npb);
    if (run == 1) {
      ok &= report(name, "repeat", std::memcmp(all.data(), first.data(), all.size() * 4) ? 1 : 0, 0);
      break;
    }
    first = all;
    bool zeros = true;  // elements feeding no window: exactly 0
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t t = 0; t < p.T; ++t)
        for (int64_t j = 0; j < C; ++j) {
          const bool unused = t >= nw * p.m || (p.c == 2 && t >= (nw - 1) * p.m && j < p.hd);
          const size_t i = (b * p.T + t) * C + j;
          if (unused && (dkv[i] != 0.f || dgate[i] != 0.f)) zeros = false;
        }
    bool m1, m2, m3, m4;
    const double e1 = nmse(out.data(), out_r.data(), nout, &m1), e2 = nmse(dkv.data(), dkv_r.data(), n, &m2);
    const double e3 = nmse(dgate.data(), dgate_r.data(), n, &m3), e4 = nmse(dpb.data(), dpb_r.data(), npb, &m4);
    ok &= report(name, "out", e1, 1e-11, !m1 && out.guard_ok(), "nan/guard");
    ok &= report(name, "dkv", e2, 1e-11, !m2 && zeros && dkv.guard_ok(), "nan/zeros/guard");
    ok &= report(name, "dgate", e3, 1e-11, !m3 && dgate.guard_ok(), "nan/guard");
    ok &= report(name, "dpb", e4, 1e-11, !m4 && dpb.guard_ok(), "nan/guard");
  }
  return ok;
}

// The key lists and the scale against kernels/hd/v4_rows.h on the host (bit for bit).
bool keys_case(int64_t B, int64_t T, int64_t W, int64_t m, kern::V4Keys kind, int topk, bool packed) {
  const std::string name = "cuda v4 keys B=" + std::to_string(B) + " T=" + std::to_string(T) + " W=" +
                           std::to_string(W) + " m=" + std::to_string(m) + " kind=" + std::to_string((int)kind) +
                           (packed ? " packed" : "");
  const int64_t N = B * T, nw = kind == kern::V4Keys::Sliding ? 0 : T / m;
  const kern::V4KeyShape s{B, T, W, m, nw, kind, topk};
  std::vector<int32_t> seg(N), cnt(N), sel(N * std::max(topk, 1), -1);
  for (int64_t i = 0; i < N; ++i) {
    const int64_t t = i % T;
    seg[i] = (int32_t)(t / 7 + (t % 11 == 3));  // documents, some of one token
    const int64_t valid = std::min<int64_t>((t + 1) / m, nw);
    cnt[i] = (int32_t)std::min<int64_t>(topk, valid);
    for (int k = 0; k < cnt[i]; ++k) sel[i * topk + k] = (int32_t)((valid - cnt[i]) * (i % 2) + k);
  }
  std::vector<int64_t> off_r(N + 1, 0);
  for (int64_t i = 0; i < N; ++i)
    off_r[i + 1] = off_r[i] + kern::hd::v4_query_keys(s, packed ? seg.data() : nullptr, cnt.data(), sel.data(), i,
                                                      nullptr);
  std::vector<int32_t> idx_r(std::max<int64_t>(off_r[N], 1));
  for (int64_t i = 0; i < N; ++i)
    kern::hd::v4_query_keys(s, packed ? seg.data() : nullptr, cnt.data(), sel.data(), i, idx_r.data() + off_r[i]);
  Guarded<int64_t> off(N + 1);
  Guarded<int32_t> idx(off_r[N]);
  auto S = upload(seg), C = upload(cnt), L = upload(sel);
  DevCopy<int64_t> O(off);
  DevCopy<int32_t> I(idx);
  dev().v4_key_offsets(s, packed ? S.get() : nullptr, C.get(), L.get(), O.get());
  dev().v4_key_fill(s, packed ? S.get() : nullptr, C.get(), L.get(), O.get(), I.get());
  O.fetch(), I.fetch();
  bool ok = report(name, "off", std::memcmp(off.data(), off_r.data(), (N + 1) * 8) ? 1 : 0, 0, off.guard_ok(), "guard");
  ok &= report(name, "idx", std::memcmp(idx.data(), idx_r.data(), off_r[N] * 4) ? 1 : 0, 0, idx.guard_ok(), "guard");
  Rng r(7 + N);
  const std::vector<float> x0 = randv(N * 3, r, 1.0);
  Guarded<float> x = guarded(x0);
  DevCopy<float> X(x);
  dev().scale(X.get(), N * 3, 0.37f);
  X.fetch();
  size_t bad = 0;
  for (int64_t i = 0; i < N * 3; ++i) bad += x[i] != x0[i] * 0.37f;
  ok &= report(name, "scale", (double)bad, 0, x.guard_ok(), "guard");
  return ok;
}

}  // namespace

TREX_OP_CASES(cuda_v4_hc_cases) {
  // tests/ops/hyper_conn_ops.cpp's shapes {N, n, d, iters, hc_eps, norm_eps}.
  const HcShape shapes[] = {{1, 1, 7, 1, 1e-6f, 1e-6f},       {2, 3, 5, 4, 1e-2f, 0.1f},
                            {3, 3, 37, 4, 1e-6f, 1e-6f},      {37, 4, 129, 20, 1e-6f, 1e-6f},
                            {5, 5, 37, 3, 0.05f, 0.3f},       {200, 4, 64, 20, 1e-6f, 1e-6f},
                            {129, 4, 1000, 20, 1e-6f, 1e-6f}, {1000, 2, 37, 7, 1e-3f, 1e-5f}};
  for (const auto& s : shapes) {
    cases.push_back({"cuda hc_pre", [=] { return pre_case(s, 0, -1); }, nullptr, nullptr});
    cases.push_back({"cuda hc_post", [=] { return post_case(s); }, nullptr, nullptr});
    cases.push_back({"cuda hc_head", [=] { return head_case(s); }, nullptr, nullptr});
  }
  for (int nulls : {1, 2, 4, 6, 7})
    cases.push_back({"cuda hc_pre nulls", [=] { return pre_case({9, 4, 33, 5, 1e-2f, 1e-6f}, nulls, -1); }, nullptr,
                     nullptr});
  cases.push_back({"cuda hc_pre nan", [] { return pre_case({11, 3, 40, 6, 1e-6f, 1e-6f}, 0, 4); }, nullptr, nullptr});

  // tests/ops/compress_pool_ops.cpp's shapes {B, T, m, hd, c}.
  const PoolCfg pools[] = {
      {1, 7, 3, 5, 1},       {2, 37, 4, 37, 2},    {3, 130, 5, 129, 2},  {1, 300, 23, 64, 1},
      {2, 260, 128, 100, 1}, {1, 259, 128, 16, 2}, {2, 9, 1, 20, 2},     {2, 9, 1, 33, 1},
      {2, 3, 4, 17, 2},      {1, 4, 4, 8, 2},      {1, 1000, 4, 128, 2}, {1, 512, 128, 512, 1},
      {1, 37, 4, 600, 2},    {2, 50, 7, 1030, 1},
  };
  for (const PoolCfg& p : pools) cases.push_back({pool_name(p), [p] { return pool_case(p, false); }, nullptr, nullptr});
  for (const PoolCfg& p : {PoolCfg{1, 20, 4, 19, 2}, PoolCfg{2, 15, 3, 33, 1}})
    cases.push_back({pool_name(p, " nan"), [p] { return pool_case(p, true); }, nullptr, nullptr});
  cases.push_back({"cuda compress_pool large logits", [] { return pool_case({2, 64, 8, 40, 2}, false, 60.0); },
                   nullptr, nullptr});

  using K = kern::V4Keys;
  for (bool packed : {false, true}) {
    cases.push_back({"cuda v4 keys", [=] { return keys_case(2, 37, 5, 1, K::Sliding, 0, packed); }, nullptr, nullptr});
    cases.push_back({"cuda v4 keys", [=] { return keys_case(3, 41, 7, 5, K::Hca, 0, packed); }, nullptr, nullptr});
    cases.push_back({"cuda v4 keys", [=] { return keys_case(2, 45, 4, 3, K::Csa, 4, packed); }, nullptr, nullptr});
    cases.push_back({"cuda v4 keys", [=] { return keys_case(1, 2049, 128, 4, K::Csa, 128, packed); }, nullptr,
                     nullptr});
    cases.push_back({"cuda v4 keys", [=] { return keys_case(2, 29, 6, 3, K::CsaDense, 2, packed); }, nullptr, nullptr});
  }
}
