// Op cases for SwiGLU (with and without the clamp): fast vs reference incl. odd widths, clamped
// values, NaN/Inf inputs and values at the ends of exp's range; the dispatched kernel and the
// AVX2 kernel called directly ("swiglu[avx2]", kernels/cpu/swiglu_avx2.h; skipped on a CPU
// without AVX2 + FMA, so it also runs on AVX-512 machines); outputs bitwise the same for 1 and 2
// threads; gradients in double against finite differences; bandwidth (dispatched and AVX2, at
// the bench-v3 shapes among others); the backward rounded to bf16 ("swiglu_bf16", kern::
// swiglu_bwd_bf16) bit for bit against kern::to_bf16 of the f32 backward, NaN/Inf included.
#include <omp.h>
#include <cstring>
#include <limits>
#include <string>
#include <vector>
#include "core/parallel.h"
#include "kernels/cpu/swiglu_avx2.h"
#include "kernels/ref/swiglu.h"
#include "kernels/rows.h"
#include "kernels/swiglu.h"
#include "tests/ops/harness.h"

namespace {
using namespace trex;
using namespace trex::ops;

// The implementation under test: the dispatched one, or the AVX2 kernel called directly.
struct SwiImpl {
  const char* tag;
  void (*fwd)(const float*, int64_t, int64_t, float, float*);
  void (*bwd)(const float*, const float*, int64_t, int64_t, float, float*);
  bool (*usable)();
};
bool swi_always() { return true; }
bool swi_has_avx2_fma() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
const SwiImpl kSwiImpls[] = {{"swiglu", kern::swiglu_fwd, kern::swiglu_bwd, swi_always},
                             {"swiglu[avx2]", kern::cpu::swiglu_fwd_avx2, kern::cpu::swiglu_bwd_avx2,
                              swi_has_avx2_fma}};
// A case of an implementation the CPU cannot run passes with a note.
bool swi_skipped(const SwiImpl& im, const std::string& name) {
  if (im.usable()) return false;
  std::printf("skip %-48s (CPU lacks AVX2 + FMA)\n", name.c_str());
  return true;
}

bool swiglu_test(const SwiImpl& im, int64_t N, int64_t F, float limit, bool specials) {
  std::string name = std::string(im.tag) + " N=" + std::to_string(N) + " F=" + std::to_string(F) +
                     " limit=" + std::to_string(limit).substr(0, 4) + (specials ? " nan/inf" : "");
  if (swi_skipped(im, name)) return true;
  Rng r(31 + N * 5 + F);
  const size_t n2 = static_cast<size_t>(N * 2 * F), n1 = static_cast<size_t>(N * F);
  // Scale so that about a third of the values fall outside [-limit, limit] when clamping.
  std::vector<float> gu(n2), dh(n1);
  fill_normal(gu.data(), n2, r, limit > 0 ? limit : 4.0);
  fill_normal(dh.data(), n1, r);
  if (limit > 0 && F > 2) {  // exact boundary values: gradient must pass (inclusive bounds)
    gu[0] = limit;
    gu[F] = limit;
    gu[F + 1] = -limit;
  }
  if (specials) {
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    // +-88.5, -88.9: exp(-g) near the top of the float range (finite: sigmoid is denormal, not 0).
    const float sv[] = {nan, inf, -inf, 200.0f, -200.0f, 89.0f, -89.0f, 0.0f, -88.5f, 88.5f, -88.9f, -103.0f};
    for (size_t i = 0; i < n2; i += 7) gu[i] = sv[(i / 7) % 12];
  }
  Guarded<float> h(n1), dgu(n2);
  std::vector<float> h_ref(n1), dgu_ref(n2);
  im.fwd(gu.data(), N, F, limit, h.data());
  im.bwd(dh.data(), gu.data(), N, F, limit, dgu.data());
  kern::ref::swiglu_fwd<float>(gu.data(), N, F, limit, h_ref.data());
  kern::ref::swiglu_bwd<float>(dh.data(), gu.data(), N, F, limit, dgu_ref.data());
  bool m1, m2;  // (nmse is evaluated first: argument order is unspecified)
  const double e1 = nmse(h.data(), h_ref.data(), n1, &m1), e2 = nmse(dgu.data(), dgu_ref.data(), n2, &m2);
  bool ok = report(name, "h", e1, 1e-12, !m1 && h.guard_ok(), "nan/guard");
  ok &= report(name, "dgu", e2, 1e-12, !m2 && dgu.guard_ok(), "nan/guard");
  // Clamped gradients must be exactly zero where the reference says so.
  size_t zero_mism = 0;
  for (size_t i = 0; i < n2; ++i) zero_mism += (dgu_ref[i] == 0.0f) != (dgu[i] == 0.0f);
  ok &= report(name, "dgu==0", static_cast<double>(zero_mism), 0);
  return ok;
}

// kern::swiglu_bwd_bf16 against kern::to_bf16 of kern::swiglu_bwd: the same bits.
bool swiglu_bf16_test(int64_t N, int64_t F, float limit, bool specials) {
  const std::string name = "swiglu_bf16 N=" + std::to_string(N) + " F=" + std::to_string(F) +
                           " limit=" + std::to_string(limit).substr(0, 4) + (specials ? " nan/inf" : "");
  Rng r(41 + N * 3 + F);
  const size_t n2 = static_cast<size_t>(N * 2 * F), n1 = static_cast<size_t>(N * F);
  std::vector<float> gu(n2), dh(n1), dgu(n2);
  fill_normal(gu.data(), n2, r, limit > 0 ? limit : 4.0);
  fill_normal(dh.data(), n1, r);
  if (specials) {
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    const float sv[] = {nan, inf, -inf, 200.0f, -200.0f, 0.0f, -88.5f, 88.5f, 1e-40f, -1e-40f};
    for (size_t i = 0; i < n2; i += 5) gu[i] = sv[(i / 5) % 10];
    for (size_t i = 3; i < n1; i += 11) dh[i] = sv[(i / 11) % 10];
  }
  kern::swiglu_bwd(dh.data(), gu.data(), N, F, limit, dgu.data());
  std::vector<bf16> want(n2);
  kern::to_bf16(dgu.data(), static_cast<int64_t>(n2), want.data());
  Guarded<bf16> got(n2);
  kern::swiglu_bwd_bf16(dh.data(), gu.data(), N, F, limit, got.data());
  size_t diff = 0;
  for (size_t i = 0; i < n2; ++i) diff += std::memcmp(&got[i], &want[i], sizeof(bf16)) != 0;
  return report(name, "bits", static_cast<double>(diff), 0, got.guard_ok(), "guard");
}

bool swiglu_grad(int64_t N, int64_t F, double limit) {
  std::string name = "swiglu N=" + std::to_string(N) + " F=" + std::to_string(F) +
                     " limit=" + std::to_string(limit).substr(0, 4);
  Rng r(7 + F);
  const size_t n2 = static_cast<size_t>(N * 2 * F), n1 = static_cast<size_t>(N * F);
  std::vector<double> gu(n2), p(n1), h(n1), dgu(n2);
  fill_normal(gu.data(), n2, r, 2.0);
  fill_normal(p.data(), n1, r);
  auto loss = [&]() {
    kern::ref::swiglu_fwd<double>(gu.data(), N, F, limit, h.data());
    double s = 0;
    for (size_t i = 0; i < n1; ++i) s += p[i] * h[i];
    return s;
  };
  kern::ref::swiglu_bwd<double>(p.data(), gu.data(), N, F, limit, dgu.data());
  size_t zeros = 0;
  for (double v : dgu) zeros += v == 0.0;
  bool ok = report(name, "dgu", fd_check(gu, loss, dgu), 1e-7);
  if (limit > 0) ok &= report(name, "clamped", zeros > 0 ? 0.0 : 1.0, 0, true);  // the clamp was exercised
  return ok;
}

// h and dgu must be bitwise the same for 1 and 2 threads (rows split differently).
bool swiglu_threads(const SwiImpl& im, int64_t N, int64_t F, float limit) {
  std::string name = std::string(im.tag) + " threads 1/2 N=" + std::to_string(N) + " F=" + std::to_string(F);
  if (swi_skipped(im, name)) return true;
  Rng r(55 + F);
  const size_t n2 = static_cast<size_t>(N * 2 * F), n1 = static_cast<size_t>(N * F);
  std::vector<float> gu(n2), dh(n1), h1(n1), h2(n1), dgu1(n2), dgu2(n2);
  fill_normal(gu.data(), n2, r, 4.0);
  fill_normal(dh.data(), n1, r);
  const int nt = num_threads();
  omp_set_num_threads(1);
  im.fwd(gu.data(), N, F, limit, h1.data());
  im.bwd(dh.data(), gu.data(), N, F, limit, dgu1.data());
  omp_set_num_threads(2);
  im.fwd(gu.data(), N, F, limit, h2.data());
  im.bwd(dh.data(), gu.data(), N, F, limit, dgu2.data());
  omp_set_num_threads(nt);
  size_t bad = 0;
  for (size_t i = 0; i < n1; ++i) bad += std::memcmp(&h1[i], &h2[i], 4) != 0;
  for (size_t i = 0; i < n2; ++i) bad += std::memcmp(&dgu1[i], &dgu2[i], 4) != 0;
  return report(name, "bitwise", static_cast<double>(bad), 0);
}

void swiglu_perf(const SwiImpl& im, int64_t N, int64_t F, float limit) {
  if (swi_skipped(im, std::string(im.tag) + " perf")) return;
  const size_t n2 = static_cast<size_t>(N * 2 * F), n1 = static_cast<size_t>(N * F);
  Rng r(1);
  std::vector<float> gu(n2), dh(n1), h(n1), dgu(n2);
  fill_normal(gu.data(), n2, r, 3.0);
  fill_normal(dh.data(), n1, r);
  double tf = time_ms([&] { im.fwd(gu.data(), N, F, limit, h.data()); });
  double tb = time_ms([&] { im.bwd(dh.data(), gu.data(), N, F, limit, dgu.data()); });
  std::printf("perf %s N=%ld F=%ld limit=%g  fwd %.3f ms %.1f GB/s   bwd %.3f ms %.1f GB/s\n", im.tag, (long)N, (long)F,
              limit, tf, 12.0 * n1 / tf * 1e-6, tb, 20.0 * n1 / tb * 1e-6);
}

}  // namespace

TREX_OP_CASES(swiglu_cases) {
  const int64_t shapes[][2] = {{1, 37}, {3, 16}, {7, 1000}, {64, 2048}, {5, 1}, {33, 129}, {37, 7}};
  for (const SwiImpl& im : kSwiImpls) {
    for (auto& s : shapes)
      for (float limit : {0.0f, 7.0f}) {
        int64_t N = s[0], F = s[1];
        cases.push_back({im.tag, [=, &im] { return swiglu_test(im, N, F, limit, false); }, nullptr, nullptr});
      }
    for (float limit : {0.0f, 10.0f}) {
      cases.push_back({im.tag, [=, &im] { return swiglu_test(im, 9, 100, limit, true); }, nullptr, nullptr});
      cases.push_back({im.tag, [=, &im] { return swiglu_test(im, 37, 129, limit, true); }, nullptr, nullptr});
      cases.push_back({im.tag, [=, &im] { return swiglu_threads(im, 301, 129, limit); }, nullptr, nullptr});
    }
  }
  for (auto& s : shapes)
    for (float limit : {0.0f, 7.0f})
      for (bool sp : {false, true}) {
        const int64_t N = s[0], F = s[1];
        cases.push_back({"swiglu_bf16", [=] { return swiglu_bf16_test(N, F, limit, sp); }, nullptr, nullptr});
      }
  for (double limit : {0.0, 1.5}) {
    cases.push_back({"swiglu", nullptr, [=] { return swiglu_grad(3, 17, limit); }, nullptr});
    cases.push_back({"swiglu", nullptr, [=] { return swiglu_grad(1, 40, limit); }, nullptr});
  }
  for (const SwiImpl& im : kSwiImpls) {
    cases.push_back({im.tag, nullptr, nullptr, [&im] { swiglu_perf(im, 2048, 2048, 0.0f); }});
    cases.push_back({im.tag, nullptr, nullptr, [&im] { swiglu_perf(im, 2048, 2048, 10.0f); }});
    // bench-v3: routed experts (8192 rows x moe_intermediate 512) and the dense MLP (2048 x 2816).
    cases.push_back({im.tag, nullptr, nullptr, [&im] { swiglu_perf(im, 8192, 512, 0.0f); }});
    cases.push_back({im.tag, nullptr, nullptr, [&im] { swiglu_perf(im, 2048, 2816, 0.0f); }});
  }
}
