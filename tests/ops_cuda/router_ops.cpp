// CUDA cases for the MoE router (kernels/router.h): scores, the choice of experts (every method,
// groups, bias, hash routing, NaN logits), the two backward steps, the sequence-wise balance loss
// and the sort of the (token, slot) pairs by expert. The reference is the shared row math
// (kernels/hd/router.h) and plain loops here. The scores may differ from the host's in the last
// bit (the device's exp); so the choice is checked on the device's own scores, where it is a
// matter of comparisons and must agree exactly, as must the sort.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include "kernels/hd/router.h"
#include "tests/ops_cuda/device.h"

namespace {
using namespace trex;
using namespace trex::ops;
using kern::RouterScore;
using kern::RouterShape;
using kern::RouterTopk;

std::vector<float> randv(size_t n, uint64_t seed, double scale = 1.0) {
  Rng r(seed);
  std::vector<float> v(n);
  fill_normal(v.data(), n, r, scale);
  return v;
}

const char* score_name(RouterScore s) {
  return s == RouterScore::Sigmoid ? "sigmoid" : s == RouterScore::Softmax ? "softmax" : "sqrtsoftplus";
}
const char* topk_name(RouterTopk t) {
  return t == RouterTopk::NoauxTc ? "noaux_tc" : t == RouterTopk::Greedy ? "greedy" : "group_greedy";
}

std::string shape_name(const char* what, const RouterShape& s, bool hash) {
  char b[200];
  std::snprintf(b, sizeof b, "cuda %s N=%lld E=%lld K=%lld G=%lld/%lld %s %s%s%s", what, (long long)s.N, (long long)s.E,
                (long long)s.K, (long long)s.groups, (long long)s.topk_group, score_name(s.score), topk_name(s.topk),
                s.norm_topk_prob ? " norm" : "", hash ? " hash" : "");
  return b;
}

// The host's selection of every row from the given scores.
void host_select(const RouterShape& s, const std::vector<float>& sc, const float* bias, const int32_t* fixed,
                 std::vector<int32_t>& idx, std::vector<float>& pr) {
  idx.assign(s.N * s.K, -1), pr.assign(s.N * s.K, 0.f);
  std::vector<float> gs(s.groups);
  std::vector<unsigned char> gk(s.groups);
  for (int64_t n = 0; n < s.N; ++n)
    kern::hd::router_select_row(s, &sc[n * s.E], bias, fixed ? fixed + n * s.K : nullptr, gs.data(), gk.data(),
                                &idx[n * s.K], &pr[n * s.K]);
}

bool select_case(RouterShape s, bool bias_on, bool hash, int nan_rows) {
  const std::string name = shape_name("router_select", s, hash);
  std::vector<float> logits = randv(s.N * s.E, 11 + s.N + s.E, 2.0);
  for (int r = 0; r < nan_rows && r < s.N; ++r) logits[(r * 7 % s.N) * s.E + (r * 5) % s.E] = NAN;
  const std::vector<float> bias = randv(s.E, 12, 0.1);
  std::vector<int32_t> fixed;
  if (hash) {
    fixed.resize(s.N * s.K);
    for (int64_t n = 0; n < s.N; ++n)
      for (int64_t k = 0; k < s.K; ++k) fixed[n * s.K + k] = (int32_t)((n * 3 + k * 5) % s.E);
  }
  std::vector<float> sc_ref(s.N * s.E);
  for (int64_t n = 0; n < s.N; ++n) kern::hd::router_scores_row(s, &logits[n * s.E], &sc_ref[n * s.E]);

  Guarded<float> sc(s.N * s.E), pr(s.N * s.K);
  Guarded<int32_t> id(s.N * s.K);
  auto L = upload(logits), Bd = upload(bias);
  kern::DeviceBuffer<int32_t> F;
  if (hash) F = upload(fixed);
  DevCopy<float> Sd(sc), Pd(pr);
  DevCopy<int32_t> Id(id);
  dev().router_select(s, L.get(), bias_on ? Bd.get() : nullptr, hash ? F.get() : nullptr, Sd.get(), Id.get(), Pd.get());
  Sd.fetch(), Pd.fetch(), Id.fetch();

  bool m1 = false, m2 = false;
  const double e1 = nmse(sc.data(), sc_ref.data(), sc_ref.size(), &m1);
  std::vector<float> sc_dev(sc.data(), sc.data() + s.N * s.E);
  std::vector<int32_t> idx_ref;
  std::vector<float> pr_ref;
  host_select(s, sc_dev, bias_on ? bias.data() : nullptr, hash ? fixed.data() : nullptr, idx_ref, pr_ref);
  const bool same_idx = std::memcmp(id.data(), idx_ref.data(), idx_ref.size() * 4) == 0;
  const double e2 = nmse(pr.data(), pr_ref.data(), pr_ref.size(), &m2);
  bool ok = report(name, "scores", e1, 1e-12, !m1 && sc.guard_ok(), "nan/guard");
  ok &= report(name, "idx", same_idx ? 0 : 1, 0, id.guard_ok(), "guard (on the device's scores)");
  ok &= report(name, "probs", e2, 1e-12, !m2 && pr.guard_ok(), "nan/guard");
  return ok;
}

bool backward_case(RouterShape s) {
  const std::string name = shape_name("router bwd", s, false);
  const std::vector<float> logits = randv(s.N * s.E, 21 + s.N, 1.5), dp = randv(s.N * s.K, 22), ds0 = randv(s.N * s.E, 23);
  std::vector<float> sc(s.N * s.E);
  for (int64_t n = 0; n < s.N; ++n) kern::hd::router_scores_row(s, &logits[n * s.E], &sc[n * s.E]);
  std::vector<int32_t> idx;
  std::vector<float> pr;
  host_select(s, sc, nullptr, nullptr, idx, pr);
  std::vector<float> ds_ref = ds0, dl_ref(s.N * s.E);
  for (int64_t n = 0; n < s.N; ++n) {
    kern::hd::router_probs_bwd_row(s, &sc[n * s.E], &idx[n * s.K], &dp[n * s.K], &ds_ref[n * s.E]);
    kern::hd::router_scores_bwd_row(s, &sc[n * s.E], &ds_ref[n * s.E], &dl_ref[n * s.E]);
  }
  Guarded<float> ds(s.N * s.E), dl(s.N * s.E);
  for (size_t i = 0; i < ds0.size(); ++i) ds[i] = ds0[i];
  auto S = upload(sc), P = upload(dp);
  auto I = upload(idx);
  DevCopy<float> Dd(ds), Ld(dl);
  dev().router_probs_bwd(s, S.get(), I.get(), P.get(), Dd.get());
  dev().router_scores_bwd(s, S.get(), Dd.get(), Ld.get());
  Dd.fetch(), Ld.fetch();
  bool m1 = false, m2 = false;
  const double e1 = nmse(ds.data(), ds_ref.data(), ds_ref.size(), &m1);
  const double e2 = nmse(dl.data(), dl_ref.data(), dl_ref.size(), &m2);
  bool ok = report(name, "dscores", e1, 1e-12, !m1 && ds.guard_ok(), "nan/guard");
  ok &= report(name, "dlogits", e2, 1e-12, !m2 && dl.guard_ok(), "nan/guard");
  return ok;
}

// The balance loss written the plain way: per sequence b, f_e = E / (K T) x its selections of e,
// P_e = mean over its T tokens of s_e / sum s (only these rows' tokens add to P).
double aux_ref(const RouterShape& s, const std::vector<float>& sc, const std::vector<int32_t>& idx, int64_t B,
               int64_t T, int64_t n0, double alpha, float gs, std::vector<float>* ds) {
  const int64_t E = s.E, K = s.K;
  std::vector<double> f(B * E, 0.0), P(B * E, 0.0);
  for (int64_t i = 0; i < s.N; ++i)
    for (int64_t k = 0; k < K; ++k) f[((n0 + i) / T) * E + idx[i * K + k]] += (double)E / (K * T);
  for (int64_t i = 0; i < s.N; ++i) {
    double Z = 0;
    for (int64_t e = 0; e < E; ++e) Z += sc[i * E + e];
    for (int64_t e = 0; e < E; ++e) P[((n0 + i) / T) * E + e] += sc[i * E + e] / Z / T;
  }
  double L = 0;
  for (int64_t j = 0; j < B * E; ++j) L += alpha * f[j] * P[j] / B;
  if (ds)
    for (int64_t i = 0; i < s.N; ++i) {
      const int64_t b = (n0 + i) / T;
      double Z = 0, dot = 0;
      for (int64_t e = 0; e < E; ++e) Z += sc[i * E + e];
      for (int64_t e = 0; e < E; ++e) dot += alpha * f[b * E + e] / (T * B) * sc[i * E + e] / Z;
      for (int64_t e = 0; e < E; ++e) (*ds)[i * E + e] += gs * (float)((alpha * f[b * E + e] / (T * B) - dot) / Z);
    }
  return L;
}

bool aux_case(RouterShape s, int64_t B, int64_t T, int64_t n0) {
  const std::string name = shape_name("router_aux", s, false) + " B=" + std::to_string(B) + " T=" +
                           std::to_string(T) + " n0=" + std::to_string(n0);
  const std::vector<float> logits = randv(s.N * s.E, 31 + s.N, 1.0), ds0 = randv(s.N * s.E, 32);
  std::vector<float> sc(s.N * s.E);
  for (int64_t n = 0; n < s.N; ++n) kern::hd::router_scores_row(s, &logits[n * s.E], &sc[n * s.E]);
  std::vector<int32_t> idx;
  std::vector<float> pr;
  host_select(s, sc, nullptr, nullptr, idx, pr);
  const double alpha = 0.013;
  const float gs = 0.7f;
  std::vector<float> ds_ref = ds0;
  const double L_ref = aux_ref(s, sc, idx, B, T, n0, alpha, gs, &ds_ref);
  Guarded<float> ds(s.N * s.E);
  for (size_t i = 0; i < ds0.size(); ++i) ds[i] = ds0[i];
  auto S = upload(sc);
  auto I = upload(idx);
  DevCopy<float> Dd(ds);
  const double L = dev().router_aux(s, S.get(), I.get(), B, T, n0, alpha, gs, nullptr);
  dev().router_aux(s, S.get(), I.get(), B, T, n0, alpha, gs, Dd.get());
  Dd.fetch();
  bool m = false;
  const double e = nmse(ds.data(), ds_ref.data(), ds_ref.size(), &m);
  bool ok = report(name, "loss", std::fabs(L - L_ref) / std::max(std::fabs(L_ref), 1e-30), 1e-12);
  ok &= report(name, "dscores", e, 1e-12, !m && ds.guard_ok(), "nan/guard");
  return ok;
}

bool sort_case(int64_t N, int64_t K, int64_t E, int skew) {
  const std::string name = "cuda moe_sort N=" + std::to_string(N) + " K=" + std::to_string(K) + " E=" +
                           std::to_string(E) + (skew ? " skewed" : "");
  const int64_t R = N * K;
  std::vector<int32_t> idx(R);
  Rng r(41 + N);
  for (int64_t i = 0; i < R; ++i) {
    const double u = r.uniform();
    idx[i] = (int32_t)std::min<int64_t>(E - 1, (int64_t)(skew ? u * u * u * E : u * E));  // skewed: experts left empty
  }
  std::vector<int64_t> off_ref(E + 1, 0);
  std::vector<int32_t> rt_ref(R), sr_ref(R);
  for (int64_t i = 0; i < R; ++i) off_ref[idx[i] + 1]++;
  for (int64_t e = 0; e < E; ++e) off_ref[e + 1] += off_ref[e];
  std::vector<int64_t> fill(off_ref.begin(), off_ref.end() - 1);
  for (int64_t i = 0; i < R; ++i) {
    const int64_t row = fill[idx[i]]++;
    rt_ref[row] = (int32_t)(i / K), sr_ref[i] = (int32_t)row;
  }
  Guarded<int64_t> off(E + 1);
  Guarded<int32_t> rt(R), sr(R);
  auto I = upload(idx);
  DevCopy<int64_t> O(off);
  DevCopy<int32_t> RT(rt), SR(sr);
  dev().moe_sort(I.get(), N, K, E, O.get(), RT.get(), SR.get());
  O.fetch(), RT.fetch(), SR.fetch();
  bool ok = report(name, "offsets", std::memcmp(off.data(), off_ref.data(), (E + 1) * 8) ? 1 : 0, 0, off.guard_ok(), "guard");
  ok &= report(name, "row_token", R && std::memcmp(rt.data(), rt_ref.data(), R * 4) ? 1 : 0, 0, rt.guard_ok(), "guard");
  ok &= report(name, "slot_row", R && std::memcmp(sr.data(), sr_ref.data(), R * 4) ? 1 : 0, 0, sr.guard_ok(), "guard");
  return ok;
}

RouterShape shape(int64_t N, int64_t E, int64_t K, int64_t G, int64_t tg, RouterScore sc, RouterTopk tk, bool norm,
                  float scale) {
  RouterShape s;
  s.N = N, s.E = E, s.K = K, s.groups = G, s.topk_group = tg, s.score = sc, s.topk = tk, s.norm_topk_prob = norm;
  s.scale = scale;
  return s;
}

// DeepSeek-V3's router on a 4096-token micro-batch: select, sort and the backward.
void router_perf() {
  const RouterShape s = shape(4096, 256, 8, 8, 4, RouterScore::Sigmoid, RouterTopk::NoauxTc, true, 2.5f);
  const std::vector<float> logits = randv(s.N * s.E, 51), bias = randv(s.E, 52, 0.1), dp = randv(s.N * s.K, 53);
  auto L = upload(logits), Bd = upload(bias), P = upload(dp);
  kern::DeviceBuffer<float> sc(dev(), s.N * s.E), pr(dev(), s.N * s.K), ds(dev(), s.N * s.E);
  kern::DeviceBuffer<int32_t> id(dev(), s.N * s.K), rt(dev(), s.N * s.K), sr(dev(), s.N * s.K);
  kern::DeviceBuffer<int64_t> off(dev(), s.E + 1);
  const double t_sel = dev_time_ms([&] { dev().router_select(s, L.get(), Bd.get(), nullptr, sc.get(), id.get(), pr.get()); });
  const double t_sort = dev_time_ms([&] { dev().moe_sort(id.get(), s.N, s.K, s.E, off.get(), rt.get(), sr.get()); });
  const double t_bwd = dev_time_ms([&] {
    dev().router_probs_bwd(s, sc.get(), id.get(), P.get(), ds.get());
    dev().router_scores_bwd(s, sc.get(), ds.get(), ds.get());
  });
  std::printf("perf %-48s select %.3f ms  sort %.3f ms  bwd %.3f ms\n", "cuda router N=4096 E=256 K=8", t_sel, t_sort,
              t_bwd);
}

}  // namespace

TREX_OP_CASES(cuda_router_cases) {
  using S = RouterScore;
  using T = RouterTopk;
  struct Sel {
    RouterShape s;
    bool bias, hash;
    int nans;
  };
  for (const Sel& c : {Sel{shape(1, 1, 1, 1, 1, S::Softmax, T::Greedy, false, 1.f), false, false, 0},
                       Sel{shape(37, 10, 3, 1, 1, S::Softmax, T::Greedy, false, 1.f), false, false, 0},
                       Sel{shape(300, 45, 7, 5, 2, S::Sigmoid, T::NoauxTc, true, 2.5f), true, false, 0},
                       Sel{shape(129, 24, 5, 3, 1, S::Softmax, T::GroupLimitedGreedy, false, 16.f), false, false, 0},
                       Sel{shape(77, 13, 4, 1, 1, S::SqrtSoftplus, T::NoauxTc, true, 1.5f), true, true, 0},
                       Sel{shape(61, 21, 6, 3, 2, S::Sigmoid, T::NoauxTc, true, 1.f), true, false, 5},
                       Sel{shape(4097, 256, 8, 8, 4, S::Sigmoid, T::NoauxTc, true, 2.5f), true, false, 0}})
    cases.push_back({"cuda router_select", [=] { return select_case(c.s, c.bias, c.hash, c.nans); }, nullptr, nullptr});
  for (const RouterShape& s : {shape(1, 3, 2, 1, 1, S::Softmax, T::Greedy, true, 1.f),
                               shape(53, 45, 7, 5, 2, S::Sigmoid, T::NoauxTc, true, 2.5f),
                               shape(40, 13, 4, 1, 1, S::SqrtSoftplus, T::Greedy, false, 1.5f),
                               shape(33, 10, 3, 1, 1, S::Softmax, T::Greedy, false, 1.f)})
    cases.push_back({"cuda router bwd", [=] { return backward_case(s); }, nullptr, nullptr});
  for (auto [N, T_, n0] : {std::array<int64_t, 3>{7, 7, 0}, {45, 9, 4}, {100, 37, 11}})
    cases.push_back({"cuda router_aux", [=] {
                       const int64_t B = (n0 + N + T_ - 1) / T_ + 1;  // one sequence past the rows
                       return aux_case(shape(N, 11, 3, 1, 1, S::Sigmoid, T::NoauxTc, true, 1.f), B, T_, n0);
                     },
                     nullptr, nullptr});
  for (auto [N, K, E, skew] : {std::array<int64_t, 4>{1, 1, 1, 0}, {0, 3, 5, 0}, {37, 3, 7, 1}, {300, 6, 45, 0},
                               {4097, 8, 256, 1}})
    cases.push_back({"cuda moe_sort", [=] { return sort_case(N, K, E, (int)skew); }, nullptr, nullptr});
  cases.push_back({"cuda router perf", nullptr, nullptr, router_perf});
}
