// CUDA cases for the GEMMs (cuBLASLt): f32, bf16 and mixed operands, every transpose, odd sizes,
// leading dimensions past the width, beta 0 over NaN (overwrite), beta 1 (accumulate), K = 0;
// the grouped GEMM with empty and uneven groups. Against kernels/ref/gemm.h in double.
// perf: the bf16 rate at 8192^3 and 4096^3 (the peak trex's MFU is measured against), and the
// expert grouped GEMM (one cuBLASLt call per expert) against one dense GEMM of the same FLOPs.
#include <cmath>
#include <limits>
#include <string>
#include <vector>
#include "core/dtype.h"
#include "kernels/ref/gemm.h"
#include "tests/ops_cuda/device.h"

namespace {
using namespace trex;
using namespace trex::ops;
using kern::Prec;

const char* pname(Prec p) { return p == Prec::BF16 ? "bf16" : "f32"; }

// A host operand of `rows x cols` at leading dimension ld, in f32 and (rounded) bf16.
struct Operand {
  std::vector<float> f;
  std::vector<bf16> b;
  Operand(int64_t rows, int64_t ld, Rng& r, bool round) : f(rows * ld), b(rows * ld) {
    fill_normal(f.data(), f.size(), r);
    for (size_t i = 0; i < f.size(); ++i) {
      b[i] = f32_to_bf16(f[i]);
      if (round) f[i] = bf16_to_f32(b[i]);
    }
  }
};

bool gemm_case(Prec pa, Prec pb, bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t pad, float beta) {
  const std::string name = std::string("cuda gemm ") + pname(pa) + "x" + pname(pb) + (ta ? " At" : " A") +
                           (tb ? "Bt" : "B") + " M=" + std::to_string(M) + " N=" + std::to_string(N) +
                           " K=" + std::to_string(K) + " beta=" + std::to_string(int(beta));
  Rng r(11 + M * 3 + N * 5 + K * 7 + ta + 2 * tb);
  const int64_t lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
  Operand A(ta ? K : M, lda, r, pa == Prec::BF16), B(tb ? N : K, ldb, r, pb == Prec::BF16);
  Guarded<float> C(M * ldc);
  std::vector<double> Cr(M * ldc);
  for (int64_t i = 0; i < M * ldc; ++i) {
    C[i] = beta == 0.f ? std::numeric_limits<float>::quiet_NaN() : static_cast<float>(r.normal());
    Cr[i] = beta == 0.f ? 0.0 : C[i];
  }
  for (int64_t i = 0; i < M; ++i)  // the padding columns must stay as they are
    for (int64_t j = N; j < ldc; ++j) C[i * ldc + j] = Cr[i * ldc + j] = 5.f;
  auto Af = upload(A.f), Bf = upload(B.f);
  auto Ab = upload(A.b), Bb = upload(B.b);
  DevCopy<float> Cd(C);
  const void* a = pa == Prec::BF16 ? static_cast<const void*>(Ab.get()) : Af.get();
  const void* b = pb == Prec::BF16 ? static_cast<const void*>(Bb.get()) : Bf.get();
  dev().gemm(pa, pb, ta, tb, M, N, K, 1.25f, a, lda, b, ldb, beta, Cd.get(), ldc);
  Cd.fetch();
  std::vector<double> Ad(A.f.begin(), A.f.end()), Bd(B.f.begin(), B.f.end());
  kern::ref::gemm<double>(ta, tb, M, N, K, 1.25, Ad.data(), lda, Bd.data(), ldb, beta, Cr.data(), ldc);
  bool m;
  const double e = nmse(C.data(), Cr.data(), M * ldc, &m);
  return report(name, "C", e, 1e-10, !m && C.guard_ok(), "nan/guard");
}

bool grouped_case(Prec prec) {
  const std::string name = std::string("cuda grouped_gemm ") + pname(prec);
  Rng r(99);
  const int64_t N = 96, K = 72;
  const int64_t Ms[] = {5, 0, 17, 1, 64, 0, 33};
  const int G = 7;
  bool ok = true;
  std::vector<Operand> As, Bs;
  std::vector<Guarded<float>> Cs;
  std::vector<kern::DeviceBuffer<float>> Afs, Bfs, Cds;
  std::vector<kern::DeviceBuffer<bf16>> Abs, Bbs;
  std::vector<kern::GemmGroup> groups;
  Cs.reserve(G);
  for (int g = 0; g < G; ++g) {
    As.emplace_back(Ms[g], K, r, prec == Prec::BF16);
    Bs.emplace_back(N, K, r, prec == Prec::BF16);  // tb: B stored [N, K] (an expert's weight)
    Cs.emplace_back(Ms[g] * N);
    for (int64_t i = 0; i < Ms[g] * N; ++i) Cs.back()[i] = static_cast<float>(r.normal());
  }
  for (int g = 0; g < G; ++g) {
    Afs.push_back(upload(As[g].f)), Bfs.push_back(upload(Bs[g].f));
    Abs.push_back(upload(As[g].b)), Bbs.push_back(upload(Bs[g].b));
    Cds.emplace_back(dev(), Cs[g].buf.size());
    Cds.back().upload(Cs[g].buf.data());
    const void* a = prec == Prec::BF16 ? static_cast<const void*>(Abs[g].get()) : Afs[g].get();
    const void* b = prec == Prec::BF16 ? static_cast<const void*>(Bbs[g].get()) : Bfs[g].get();
    groups.push_back({a, b, Cds[g].get(), Ms[g], N, K, K, K, N});
  }
  std::vector<std::vector<double>> ref(G);
  for (int g = 0; g < G; ++g) ref[g].assign(Cs[g].data(), Cs[g].data() + Cs[g].n);
  dev().grouped_gemm(prec, false, true, 1.f, 1.f, groups.data(), G);
  for (int g = 0; g < G; ++g) {
    Cds[g].download(Cs[g].buf.data());
    std::vector<double> Ad(As[g].f.begin(), As[g].f.end()), Bd(Bs[g].f.begin(), Bs[g].f.end());
    kern::ref::gemm<double>(false, true, Ms[g], N, K, 1.0, Ad.data(), K, Bd.data(), K, 1.0, ref[g].data(), N);
    bool m;
    const double e = nmse(Cs[g].data(), ref[g].data(), Cs[g].n, &m);
    ok &= report(name + " group " + std::to_string(g) + " M=" + std::to_string(Ms[g]), "C", e, 1e-10,
                 !m && Cs[g].guard_ok(), "nan/guard");
  }
  return ok;
}

void perf_gemm(int64_t M, int64_t N, int64_t K) {
  Rng r(1);
  std::vector<bf16> a(M * K), b(N * K);
  for (auto& x : a) x = f32_to_bf16(static_cast<float>(r.normal()));  // random data, never zeros
  for (auto& x : b) x = f32_to_bf16(static_cast<float>(r.normal()));
  auto A = upload(a), B = upload(b);
  kern::DeviceBuffer<float> C(dev(), M * N);
  const double ms = dev_time_ms([&] {
    dev().gemm(Prec::BF16, Prec::BF16, false, true, M, N, K, 1.f, A.get(), K, B.get(), K, 0.f, C.get(), N);
  }, 20);
  std::printf("perf cuda gemm bf16->f32 M=%lld N=%lld K=%lld  %.3f ms  %.1f TFLOP/s\n", (long long)M, (long long)N,
              (long long)K, ms, 2.0 * M * N * K / ms / 1e9);
}

// An MoE layer's expert GEMM: E experts, `rows` routed rows in all, uneven per expert.
void perf_grouped(int E, int64_t rows, int64_t N, int64_t K) {
  Rng r(2);
  std::vector<int64_t> Ms(E);
  int64_t tot = 0;
  for (int e = 0; e < E; ++e) tot += Ms[e] = static_cast<int64_t>(rows / E * (0.5 + r.uniform()));
  std::vector<bf16> a(tot * K), w(int64_t(E) * N * K);
  for (auto& x : a) x = f32_to_bf16(static_cast<float>(r.normal()));
  for (auto& x : w) x = f32_to_bf16(static_cast<float>(r.normal()));
  auto A = upload(a), W = upload(w);
  kern::DeviceBuffer<float> C(dev(), tot * N);
  std::vector<kern::GemmGroup> g;
  int64_t off = 0;
  for (int e = 0; e < E; ++e) {
    g.push_back({A.get() + off * K, W.get() + int64_t(e) * N * K, C.get() + off * N, Ms[e], N, K, K, K, N});
    off += Ms[e];
  }
  const double gm = dev_time_ms([&] { dev().grouped_gemm(Prec::BF16, false, true, 1.f, 0.f, g.data(), E); }, 20);
  const double dm = dev_time_ms([&] {
    dev().gemm(Prec::BF16, Prec::BF16, false, true, tot, N, K, 1.f, A.get(), K, W.get(), K, 0.f, C.get(), N);
  }, 20);
  const double fl = 2.0 * tot * N * K;
  std::printf("perf cuda grouped_gemm E=%d rows=%lld N=%lld K=%lld  per-expert calls %.3f ms %.1f TFLOP/s | one dense "
              "GEMM, same FLOPs %.3f ms %.1f TFLOP/s\n",
              E, (long long)tot, (long long)N, (long long)K, gm, fl / gm / 1e9, dm, fl / dm / 1e9);
}

}  // namespace

TREX_OP_CASES(cuda_gemm_cases) {
  const Prec P[] = {Prec::F32, Prec::BF16};
  for (Prec pa : P)
    for (Prec pb : P)
      for (int t = 0; t < 4; ++t) {
        const bool ta = t & 1, tb = t & 2;
        cases.push_back({"cuda gemm", [=] {
                           return gemm_case(pa, pb, ta, tb, 37, 29, 53, 3, 0.f) &&
                                  gemm_case(pa, pb, ta, tb, 64, 128, 96, 0, 1.f) &&
                                  gemm_case(pa, pb, ta, tb, 1, 300, 7, 1, 1.f);
                         },
                         nullptr, nullptr});
      }
  cases.push_back({"cuda gemm K=0", [] { return gemm_case(Prec::F32, Prec::F32, false, false, 5, 6, 0, 2, 1.f) &&
                                                gemm_case(Prec::BF16, Prec::BF16, false, true, 5, 6, 0, 0, 0.f); },
                   nullptr, nullptr});
  cases.push_back({"cuda grouped_gemm", [] { return grouped_case(Prec::F32) && grouped_case(Prec::BF16); }, nullptr,
                   nullptr});
  cases.push_back({"cuda gemm perf", nullptr, nullptr, [] {
                     perf_gemm(8192, 8192, 8192);
                     perf_gemm(4096, 4096, 4096);
                     perf_gemm(4096, 7168, 2048);
                   }});
  cases.push_back({"cuda grouped_gemm perf", nullptr, nullptr, [] {
                     perf_grouped(64, 4096 * 6, 2 * 1408, 2048);
                     perf_grouped(64, 4096 * 6, 2048, 1408);
                   }});
}
