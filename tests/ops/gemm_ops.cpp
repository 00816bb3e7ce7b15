// Op cases for GEMM: f32 / bf16 / mixed against the reference (in double, on the bf16 values)
// in all four transposition modes, odd sizes including M, N, K = 0 and 1, padded leading
// dimensions, beta = 0 over a NaN-filled C, K blocks of the widened-panel path; grouped GEMM
// with empty groups; perf (GFLOP/s) for the model's shapes and the grouped-schedule choice.
#include <omp.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>
#include "core/dtype.h"
#include "core/parallel.h"
#include "kernels/gemm.h"
#include "kernels/ref/gemm.h"
#include "tests/ops/harness.h"

namespace {
using namespace trex;
using namespace trex::ops;
using kern::Prec;

// A stored operand: f32 values (already bf16-rounded when prec is BF16) and the bf16 copy.
struct Mat {
  std::vector<float> f;
  std::vector<bf16> b;
  const void* ptr(Prec p) const { return p == Prec::BF16 ? static_cast<const void*>(b.data()) : f.data(); }
};

Mat make_mat(int64_t rows, int64_t ld, Rng& r, Prec p) {
  Mat m;
  const size_t n = static_cast<size_t>(std::max<int64_t>(rows * ld, 1));
  m.f.resize(n);
  m.b.resize(n);
  fill_normal(m.f.data(), n, r);
  for (size_t i = 0; i < n; ++i) {
    if (p == Prec::BF16) m.f[i] = round_bf16(m.f[i]);
    m.b[i] = f32_to_bf16(m.f[i]);
  }
  return m;
}

// Best of `reps` timed runs after one warm-up (ms): on a shared machine the minimum is the
// figure least disturbed by other processes.
double best_ms(const std::function<void()>& fn, int reps = 5) {
  fn();
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    double t0 = now_ms();
    fn();
    best = std::min(best, now_ms() - t0);
  }
  return best;
}

const char* pname(Prec p) { return p == Prec::BF16 ? "bf16" : "f32"; }

// One GEMM of the dispatched kernel vs ref::gemm<double> on the same (rounded) values.
bool gemm_case(Prec pa, Prec pb, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, float beta,
               int64_t pad) {
  std::string name = std::string("gemm ") + pname(pa) + "x" + pname(pb) + " " + (ta ? "T" : "N") + (tb ? "T" : "N") +
                     " M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                     " a=" + std::to_string(alpha).substr(0, 4) + " b=" + std::to_string(beta).substr(0, 3);
  Rng r(17 + M * 131 + N * 7 + K);
  const int64_t lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
  Mat A = make_mat(ta ? K : M, lda, r, pa), B = make_mat(tb ? N : K, ldb, r, pb);
  const size_t nc = static_cast<size_t>(M * ldc);
  std::vector<float> c0(nc);
  fill_normal(c0.data(), nc, r);
  // beta == 0 must not read C: fill it with NaN.
  if (beta == 0.f)
    for (auto& v : c0) v = std::numeric_limits<float>::quiet_NaN();
  Guarded<float> C(nc);
  for (size_t i = 0; i < nc; ++i) C[i] = c0[i];
  std::vector<double> cref(c0.begin(), c0.end());
  if (pa == Prec::F32 && pb == Prec::F32)
    kern::gemm_f32(ta, tb, M, N, K, alpha, A.f.data(), lda, B.f.data(), ldb, beta, C.data(), ldc);
  else if (pa == Prec::BF16 && pb == Prec::BF16)
    kern::gemm_bf16(ta, tb, M, N, K, alpha, A.b.data(), lda, B.b.data(), ldb, beta, C.data(), ldc);
  else
    kern::gemm_mixed(pa, pb, ta, tb, M, N, K, alpha, A.ptr(pa), lda, B.ptr(pb), ldb, beta, C.data(), ldc);
  kern::ref::gemm<double>(ta, tb, M, N, K, alpha, A.f.data(), lda, B.f.data(), ldb, beta, cref.data(), ldc);
  // Padding columns of C must be untouched.
  bool pad_ok = true;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = N; j < ldc; ++j)
      pad_ok &= std::memcmp(&C[i * ldc + j], &c0[i * ldc + j], 4) == 0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = N; j < ldc; ++j) cref[i * ldc + j] = C[i * ldc + j];  // NaN pads compare equal
  bool mism;
  double e = nmse(C.data(), cref.data(), nc, &mism);
  return report(name, "C", e, 1e-11, !mism && C.guard_ok() && pad_ok, "nan/guard/pad");
}

// Grouped GEMM against per-group references; groups with M = 0 are skipped and keep C.
bool grouped_case(Prec p, bool ta, bool tb, float beta, std::vector<int64_t> Ms, int64_t N, int64_t K) {
  std::string name = std::string("grouped_gemm ") + pname(p) + " " + (ta ? "T" : "N") + (tb ? "T" : "N") +
                     " G=" + std::to_string(Ms.size()) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                     " b=" + std::to_string(beta).substr(0, 3);
  Rng r(99 + N + K);
  const int G = static_cast<int>(Ms.size());
  std::vector<Mat> As, Bs;
  std::vector<Guarded<float>> Cs;
  std::vector<std::vector<double>> refs;
  std::vector<kern::GemmGroup> groups;
  for (int g = 0; g < G; ++g) {
    const int64_t M = Ms[g], lda = ta ? M + 1 : K, ldb = tb ? K : N + 3;
    As.push_back(make_mat(ta ? K : M, lda, r, p));
    Bs.push_back(make_mat(tb ? N : K, ldb, r, p));
    Cs.emplace_back(static_cast<size_t>(M * N));
    for (int64_t i = 0; i < M * N; ++i) Cs[g][i] = static_cast<float>(r.normal());
    refs.emplace_back(Cs[g].data(), Cs[g].data() + M * N);
  }
  for (int g = 0; g < G; ++g) {
    const int64_t M = Ms[g], lda = ta ? M + 1 : K, ldb = tb ? K : N + 3;
    groups.push_back({As[g].ptr(p), Bs[g].ptr(p), Cs[g].data(), M, N, K, lda, ldb, N});
    kern::ref::gemm<double>(ta, tb, M, N, K, 0.5, As[g].f.data(), lda, Bs[g].f.data(), ldb, beta, refs[g].data(), N);
  }
  kern::grouped_gemm(p, ta, tb, 0.5f, beta, groups.data(), G);
  double worst = 0;
  bool extra = true;
  for (int g = 0; g < G; ++g) {
    bool m;
    worst = std::max(worst, nmse(Cs[g].data(), refs[g].data(), Cs[g].n, &m));
    extra &= !m && Cs[g].guard_ok();
  }
  return report(name, "C", worst, 1e-11, extra, "nan/guard");
}

// Two runs with the same thread count give bitwise the same C.
bool determinism_case(Prec p, bool ta, bool tb, int64_t M, int64_t N, int64_t K) {
  std::string name = std::string("gemm determinism ") + pname(p) + " M=" + std::to_string(M) + " N=" +
                     std::to_string(N) + " K=" + std::to_string(K);
  Rng r(23);
  const int64_t lda = ta ? M : K, ldb = tb ? K : N;
  Mat A = make_mat(ta ? K : M, lda, r, p), B = make_mat(tb ? N : K, ldb, r, p);
  std::vector<float> C1(static_cast<size_t>(M * N), 1.f), C2(C1);
  kern::gemm_mixed(p, p, ta, tb, M, N, K, 1.f, A.ptr(p), lda, B.ptr(p), ldb, 0.5f, C1.data(), N);
  kern::gemm_mixed(p, p, ta, tb, M, N, K, 1.f, A.ptr(p), lda, B.ptr(p), ldb, 0.5f, C2.data(), N);
  const bool same = std::memcmp(C1.data(), C2.data(), C1.size() * sizeof(float)) == 0;
  return report(name, "bitwise", same ? 0.0 : 1.0, 0.0);
}

// GFLOP/s of one GEMM shape in f32 and bf16 (Prec p).
void gemm_perf(Prec p, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float beta, const char* what) {
  Rng r(5);
  const int64_t lda = ta ? M : K, ldb = tb ? K : N;
  Mat A = make_mat(ta ? K : M, lda, r, p), B = make_mat(tb ? N : K, ldb, r, p);
  std::vector<float> C(static_cast<size_t>(M * N), 0.f);
  double ms = best_ms([&] {
    kern::gemm_mixed(p, p, ta, tb, M, N, K, 1.f, A.ptr(p), lda, B.ptr(p), ldb, beta, C.data(), N);
  });
  std::printf("perf gemm %-4s %-7s %c%c M=%-5ld N=%-5ld K=%-5ld %8.2f ms %7.1f GFLOP/s\n", pname(p), what,
              ta ? 'T' : 'N', tb ? 'T' : 'N', (long)M, (long)N, (long)K, ms, 2.0 * M * N * K / ms * 1e-6);
}

// Model shapes: x: [M, K], W: [N, K]; forward y = x W^T, dx = dy W, dW += dy^T x.
void linear_perf(Prec p, int64_t M, int64_t N, int64_t K) {
  gemm_perf(p, false, true, M, N, K, 0.f, "fwd");
  gemm_perf(p, false, false, M, K, N, 0.f, "dx");
  gemm_perf(p, true, false, N, K, M, 1.f, "dW");
}

// Expert GEMMs (G groups of ~tok tokens, x: [tok, d], W: [F, d]) in the three modes: the
// library's schedule vs the two fixed strategies (all threads per group / one thread per group).
void grouped_perf(Prec p, int G, int64_t tok, int64_t d, int64_t F) {
  Rng r(11);
  std::vector<int64_t> Ms(G);
  int64_t tot = 0;
  for (int g = 0; g < G; ++g) tot += Ms[g] = std::max<int64_t>(0, tok + static_cast<int64_t>(r.normal() * tok / 3));
  const int64_t maxm = *std::max_element(Ms.begin(), Ms.end());
  Mat X = make_mat(G * maxm, d, r, p), W = make_mat(G * F, d, r, p), Y = make_mat(G * maxm, F, r, p);
  std::vector<float> out(static_cast<size_t>(G * std::max(maxm * std::max(d, F), F * d)));
  for (int mode = 0; mode < 3; ++mode) {
    std::vector<kern::GemmGroup> gs;
    bool ta = mode == 2, tb = mode == 0;
    float beta = mode == 2 ? 1.f : 0.f;
    const size_t es = p == Prec::BF16 ? 2 : 4;
    for (int g = 0; g < G; ++g) {
      auto at = [&](const Mat& m, int64_t off) {
        return static_cast<const void*>(static_cast<const char*>(m.ptr(p)) + off * es);
      };
      const int64_t M = Ms[g];
      if (mode == 0) gs.push_back({at(X, g * maxm * d), at(W, g * F * d), out.data() + g * maxm * F, M, F, d, d, d, F});
      if (mode == 1) gs.push_back({at(Y, g * maxm * F), at(W, g * F * d), out.data() + g * maxm * d, M, d, F, F, d, d});
      if (mode == 2) gs.push_back({at(Y, g * maxm * F), at(X, g * maxm * d), out.data() + g * F * d, F, d, M, F, d, d});
    }
    double flops = 0;
    for (auto& q : gs) flops += 2.0 * q.M * q.N * q.K;
    auto one = [&](const kern::GemmGroup& q) {
      kern::gemm_mixed(p, p, ta, tb, q.M, q.N, q.K, 1.f, q.A, q.lda, q.B, q.ldb, beta, q.C, q.ldc);
    };
    double t_lib = best_ms([&] { kern::grouped_gemm(p, ta, tb, 1.f, beta, gs.data(), G); });
    double t_all = best_ms([&] { for (auto& q : gs) one(q); });
    double t_par = best_ms([&] {
#pragma omp parallel for schedule(dynamic, 1)
      for (int g = 0; g < G; ++g) one(gs[g]);
    });
    const char* names[] = {"fwd", "dx", "dW"};
    std::printf("perf grouped %-4s %-3s G=%d tokens=%ld d=%ld F=%ld  lib %7.1f  all-threads %7.1f  "
                "thread-per-group %7.1f GFLOP/s\n",
                pname(p), names[mode], G, (long)tot, (long)d, (long)F, flops / t_lib * 1e-6, flops / t_all * 1e-6,
                flops / t_par * 1e-6);
  }
}

}  // namespace

TREX_OP_CASES(gemm_cases) {
  const int64_t shapes[][3] = {{0, 5, 7},   {4, 0, 3},     {5, 7, 0},    {1, 1, 1},     {1, 37, 129},
                               {37, 1, 64}, {2, 3, 1000}, {64, 64, 64}, {129, 300, 77}, {300, 129, 257}};
  const Prec precs[][2] = {{Prec::F32, Prec::F32}, {Prec::BF16, Prec::BF16}, {Prec::F32, Prec::BF16},
                           {Prec::BF16, Prec::F32}};
  for (auto& pp : precs)
    for (int t = 0; t < 4; ++t)
      for (auto& s : shapes) {
        const bool ta = t & 1, tb = t & 2;
        const int64_t M = s[0], N = s[1], K = s[2];
        const int64_t pad = (M + N + K) % 3;
        const float beta = (M + K) % 2 ? 0.f : ((t & 1) ? 1.f : 0.5f), alpha = (N % 2) ? 1.f : -0.75f;
        Prec pa = pp[0], pb = pp[1];
        cases.push_back({"gemm", [=] { return gemm_case(pa, pb, ta, tb, M, N, K, alpha, beta, pad); }, nullptr, nullptr});
      }
  // K > 1024: K blocks (with a tail) in the widened-panel path; several inner blocks on the
  // side that is not widened whole (A whole when M <= N, else B whole). On AMX (oneDNN's matmul)
  // a K off the 32-step block is zero-padded: 64 x 8200 x 1001 is beyond the padded copies' limit,
  // so its first 992 steps run in place and the last 9, padded, accumulate into C.
  const int64_t big[][3] = {{40, 1100, 1300}, {1100, 40, 1300}, {3, 4500, 200}, {64, 8200, 1001}};
  for (auto& s : big)
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      const int64_t M = s[0], N = s[1], K = s[2];
      cases.push_back({"gemm big", [=] { return gemm_case(Prec::BF16, Prec::BF16, ta, tb, M, N, K, ta ? 1.f : -0.5f, tb ? 1.f : 0.5f, 1); },
                       nullptr, nullptr});
    }
  cases.push_back({"gemm big", [] { return gemm_case(Prec::F32, Prec::BF16, false, true, 700, 900, 1500, 1.f, 0.f, 2); },
                   nullptr, nullptr});
  for (Prec p : {Prec::F32, Prec::BF16})
    cases.push_back({"gemm determinism", [=] { return determinism_case(p, true, false, 300, 257, 1100); }, nullptr,
                     nullptr});
  for (Prec p : {Prec::F32, Prec::BF16})
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      cases.push_back({"grouped_gemm",
                       [=] { return grouped_case(p, ta, tb, t == 1 ? 1.f : 0.f, {0, 1, 37, 170, 0, 300, 5}, 96, 130); },
                       nullptr, nullptr});
    }
  // One dominant group (runs alone on all threads) and small ones (one thread each).
  for (Prec p : {Prec::F32, Prec::BF16})
    cases.push_back({"grouped_gemm", [=] { return grouped_case(p, true, false, 1.f, {3, 2000, 0, 10}, 96, 130); },
                     nullptr, nullptr});
  cases.push_back({"grouped_gemm", [] { return grouped_case(Prec::F32, false, true, 0.f, {}, 8, 8); }, nullptr, nullptr});
  cases.push_back({"grouped_gemm", [] { return grouped_case(Prec::BF16, false, false, 0.f, {0, 0, 0}, 8, 8); }, nullptr,
                   nullptr});

  for (Prec p : {Prec::F32, Prec::BF16})
    for (int64_t N : {1024, 3072, 7168, 512})
      cases.push_back({"gemm perf", nullptr, nullptr, [=] { linear_perf(p, 2048, N, 1024); }});
  for (Prec p : {Prec::F32, Prec::BF16}) {
    cases.push_back({"gemm perf small-M", nullptr, nullptr, [=] {
                       for (int64_t M : {1, 17, 170}) gemm_perf(p, false, true, M, 1024, 1024, 0.f, "fwd");
                     }});
    cases.push_back({"grouped_gemm perf", nullptr, nullptr, [=] { grouped_perf(p, 48, 170, 1024, 512); }});
  }
}
