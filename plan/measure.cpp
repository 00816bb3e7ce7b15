#include "plan/measure.h"

#include <unistd.h>
#include <algorithm>
#include <cstring>
#include <vector>
#include "core/cpu.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "core/timer.h"
#include "kernels/attention.h"
#include "kernels/gemm.h"
#include "kernels/peak.h"
#include "kernels/rmsnorm.h"

namespace trex::plan {

namespace {

// Best time (ms) of fn over repeats filling about `seconds`.
template <class F>
double best_ms(F&& fn, double seconds) {
  fn();  // warm-up (JIT, first touch)
  double best = 1e30, spent = 0;
  int runs = 0;
  while (runs < 3 || (spent < seconds * 1000 && runs < 50)) {
    double t0 = now_ms();
    fn();
    double dt = now_ms() - t0;
    best = std::min(best, dt);
    spent += dt;
    ++runs;
  }
  return best;
}

std::vector<bf16> random_bf16(size_t n, uint64_t seed) {
  Rng r(seed);
  std::vector<bf16> v(n);
  for (auto& x : v) x = f32_to_bf16((float)r.normal());
  return v;
}

}  // namespace

Calibration measure_calibration(double seconds) {
  Calibration c = default_calibration();
  c.measured = true;
  c.note = "measured by trex bench calibrate";
  c.written_by = "trex bench calibrate";
  c.isa = isa_name(cpu_isa());
  c.threads = num_threads();
  c.ranks_per_node = 1;
  kern::Peak pk = kern::measure_peak(0.3);
  // The planner's matmul peak is the rate trex's bf16 GEMMs run at: the best of the FMA and
  // bf16-dot peaks (bf16 operands are widened to f32 where the FMA units are faster).
  c.bf16_gflops = pk.best_gflops();
  c.fp32_gflops = pk.fp32_gflops;
  const double peak = pk.best_gflops() * 1e9;
  c.mem_gb = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGE_SIZE) / 1e9;
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  c.machine = std::string(host) + " (" + std::to_string(c.threads) + " threads)";

  // Memory bandwidth: a threaded triad over arrays far larger than the caches.
  {
    const int64_t n = int64_t{32} << 20;  // 3 x 128 MB
    std::vector<float> a(n, 1.f), b(n, 2.f), d(n, 0.f);
    double ms = best_ms([&] {
      parallel_for(n, 1 << 16, [&](int64_t s, int64_t e) {
        for (int64_t i = s; i < e; ++i) d[i] = a[i] + 0.5f * b[i];
      });
    }, seconds);
    c.mem_bw_gbs = 3.0 * n * 4 / (ms / 1000) / 1e9;
    // A memory-bound model op (RMSNorm forward: read x, write y) against that bandwidth.
    const int64_t N = 16384, dd = 1024;
    std::vector<float> w(dd, 1.f), rs(N);
    double ms2 = best_ms([&] { kern::rmsnorm_fwd(a.data(), N, dd, w.data(), 1e-6f, d.data(), rs.data()); }, seconds);
    c.efficiency["memory"] = std::min(1.0, 2.0 * N * dd * 4 / (ms2 / 1000) / 1e9 / c.mem_bw_gbs);
  }
  // Dense GEMM: the three shapes of a linear layer (fwd, dx, dW) in bf16.
  {
    const int64_t M = 2048, N = 1024, K = 1024;
    auto A = random_bf16(M * K, 1), B = random_bf16(N * K, 2), G = random_bf16(M * N, 3);
    std::vector<float> C(std::max(M * N, N * K));
    double ms = best_ms([&] {
      kern::gemm_bf16(false, true, M, N, K, 1.f, A.data(), K, B.data(), K, 0.f, C.data(), N);
      kern::gemm_bf16(false, false, M, K, N, 1.f, G.data(), N, B.data(), K, 0.f, C.data(), K);
      kern::gemm_bf16(true, false, N, K, M, 1.f, G.data(), N, A.data(), K, 1.f, C.data(), K);
    }, seconds);
    c.efficiency["gemm"] = 3 * 2.0 * M * N * K / (ms / 1000) / peak;
  }
  // Grouped expert GEMM: 32 experts x ~192 tokens, d 1024 -> 2 x 512 (gate|up), bf16.
  {
    const int E = 32;
    const int64_t rows = 192, d = 1024, F2 = 1024;
    auto X = random_bf16(E * rows * d, 4), W = random_bf16(E * F2 * d, 5);
    std::vector<float> Y(E * rows * F2);
    std::vector<kern::GemmGroup> g;
    for (int e = 0; e < E; ++e)
      g.push_back({X.data() + e * rows * d, W.data() + e * F2 * d, Y.data() + e * rows * F2, rows, F2, d, d, d, F2});
    double ms = best_ms([&] { kern::grouped_gemm(kern::Prec::BF16, false, true, 1.f, 0.f, g.data(), E); }, seconds);
    c.efficiency["grouped_gemm"] = 2.0 * E * rows * F2 * d / (ms / 1000) / peak;
  }
  // Attention forward + backward (causal, MLA-like head dims).
  {
    const int B = 1, T = 2048, H = 8, Dqk = 96, Dv = 64;
    Rng r(6);
    std::vector<float> q((size_t)B * T * H * Dqk), k(q.size()), v((size_t)B * T * H * Dv), o(v.size()),
        lse((size_t)B * H * T), dO(v.size()), dq(q.size()), dk(q.size()), dv(v.size());
    for (auto* vec : {&q, &k, &v, &dO})
      for (auto& x : *vec) x = (float)r.normal();
    kern::AttnShape sh{B, T, H, Dqk, Dv, 0.1f, 0};
    double ms = best_ms([&] {
      kern::attention_fwd(sh, q.data(), k.data(), v.data(), o.data(), lse.data());
      kern::attention_bwd(sh, q.data(), k.data(), v.data(), o.data(), lse.data(), dO.data(), dq.data(), dk.data(),
                          dv.data());
    }, seconds);
    const double fwd = 2.0 * (Dqk + Dv) * ((double)T * (T + 1) / 2) * H * B;
    c.efficiency["attention"] = 3.0 * fwd / (ms / 1000) / peak;  // bwd = 2 x fwd matmul FLOPs
  }
  return c;
}

}  // namespace trex::plan
