// Peak throughput measurement (see peak.h): calibrate the iteration count on one thread, then
// run the loop on all threads inside one OpenMP region and keep the best of three rounds.
#include "kernels/peak.h"
#include <immintrin.h>
#include <omp.h>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <vector>
#include "core/cpu.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/timer.h"
#include "kernels/gemm_bf16_dnnl.h"

namespace trex::kern {
namespace cpu {
float peak_fma_f32_avx512(int64_t iters);      // kernels/cpu/peak_avx512.cpp: 512 FLOPs / iter
float peak_dpbf16_avx512bf16(int64_t iters);   // kernels/cpu/peak_avx512bf16.cpp: 1024 FLOPs / iter
bool amx_bf16_usable();                        // kernels/cpu/peak_amx.cpp
float peak_amx_bf16(int64_t iters);            // kernels/cpu/peak_amx.cpp: 65536 FLOPs / iter
}  // namespace cpu

namespace {

// Without AVX-512 there are 16 vector registers: 12 accumulators + the 2 constants stay in
// registers (16 accumulators spilled to the stack and measured 55 instead of 95 GFLOP/s per Zen 3
// core); 12 independent chains still cover 2 pipes x 4-5 cycles of latency.
constexpr int kAcc = 12;

// Baseline x86-64 (SSE2) mul + add loop: 12 accumulators x 4 lanes x 2 FLOPs = 96 FLOPs / iter.
__attribute__((noinline)) float peak_muladd_sse(int64_t iters) {
  typedef float v4 __attribute__((vector_size(16)));
  v4 a[kAcc];
  for (int i = 0; i < kAcc; ++i) a[i] = v4{} + 0.001f * (i + 1);
  const v4 x = v4{} + 0.999f, y = v4{} + 1e-4f;
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < kAcc; ++i) a[i] = a[i] * x + y;
  }
  v4 s{};
  for (int i = 0; i < kAcc; ++i) s += a[i];
  return s[0] + s[1] + s[2] + s[3];
}

// AVX2 + FMA loop (CPUs without AVX-512, where oneDNN's sgemm runs on these units): 12 ymm
// accumulators x 8 lanes x 2 FLOPs = 192 FLOPs / iter. Compiled for that target only here and
// called only when the CPU reports both features.
__attribute__((noinline, target("avx2,fma"))) float peak_fma_avx2(int64_t iters) {
  __m256 a[kAcc];
  for (int i = 0; i < kAcc; ++i) a[i] = _mm256_set1_ps(0.001f * (i + 1));
  const __m256 x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(1e-4f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < kAcc; ++i) a[i] = _mm256_fmadd_ps(a[i], x, y);
  }
  __m256 s = _mm256_setzero_ps();
  for (int i = 0; i < kAcc; ++i) s = _mm256_add_ps(s, a[i]);
  float o[8];
  _mm256_storeu_ps(o, s);
  return o[0] + o[1] + o[2] + o[3] + o[4] + o[5] + o[6] + o[7];
}

bool cpu_has_avx2_fma() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

// GFLOP/s of fn(iters) running concurrently on `threads` threads for about `seconds`.
double throughput(float (*fn)(int64_t), double flops_per_iter, int threads, double seconds) {
  volatile float sink = 0;
  int64_t iters = 1 << 12;
  for (;;) {  // calibrate: one thread, until a run takes >= 10 ms
    double t0 = now_ms();
    sink = sink + fn(iters);
    double ms = now_ms() - t0;
    if (ms >= 10.0 || iters > (int64_t{1} << 40)) {
      iters = std::max<int64_t>(1, static_cast<int64_t>(iters * (seconds * 1000.0 / 3.0) / std::max(ms, 1e-3)));
      break;
    }
    iters *= 4;
  }
  double best = 0;
  std::vector<float> out(threads);
  for (int round = 0; round < 3; ++round) {
    double t0 = now_ms();
#pragma omp parallel num_threads(threads)
    out[omp_get_thread_num()] = fn(iters);
    double ms = now_ms() - t0;
    for (float v : out) sink = sink + v;
    best = std::max(best, flops_per_iter * static_cast<double>(iters) * threads / (ms * 1e6));
  }
  return best;
}

}  // namespace

Peak measure_peak(double seconds_per_test) {
  Peak p;
  p.threads = num_threads();
  const Isa isa = cpu_isa();
  if (isa >= Isa::Avx512) p.fp32_gflops = throughput(cpu::peak_fma_f32_avx512, 512.0, p.threads, seconds_per_test);
  else if (!isa_ref_forced() && cpu_has_avx2_fma())
    p.fp32_gflops = throughput(peak_fma_avx2, 16.0 * kAcc, p.threads, seconds_per_test);
  else p.fp32_gflops = throughput(peak_muladd_sse, 8.0 * kAcc, p.threads, seconds_per_test);
  p.bf16_native = isa >= Isa::Avx512Bf16;
  p.bf16_gflops = p.bf16_native ? throughput(cpu::peak_dpbf16_avx512bf16, 1024.0, p.threads, seconds_per_test)
                                : p.fp32_gflops;
  if (amx_bf16_usable()) p.amx_bf16_gflops = throughput(cpu::peak_amx_bf16, 65536.0, p.threads, seconds_per_test);
  return p;
}

bool amx_bf16_usable() {
  return !isa_ref_forced() && !amx_capped() && cpu::amx_bf16_usable() && dnnl_uses_amx();
}

bool bf16_dot_fast() {
  static const bool fast = [] {
    if (cpu_isa() < Isa::Avx512Bf16) return false;
    if (const char* e = std::getenv("TREX_BF16_DOT")) {
      TREX_USER_CHECK(!std::strcmp(e, "fast") || !std::strcmp(e, "slow"),
                      "set TREX_BF16_DOT to fast (the bf16 dot-product kernels) or slow (the f32 ones), or unset it "
                      "(measured once at start)",
                      "environment variable TREX_BF16_DOT=", e, " names no choice");
      return !std::strcmp(e, "fast");
    }
    // One thread, the two register-only loops interleaved, the best of 5 runs of each (about
    // 0.2 ms a run): a run slowed by another process does not decide. Fast only with a margin (the
    // CPUs measured sit at 2x and 0.5x), so that every rank of a run on such CPUs decides alike.
    volatile float sink = 0;
    constexpr int64_t kIters = 1 << 16;
    double fma = 0, dot = 0;
    for (int r = 0; r < 5; ++r) {
      double t0 = now_ms();
      sink = sink + cpu::peak_fma_f32_avx512(kIters);
      fma = std::max(fma, 512.0 * kIters / std::max(now_ms() - t0, 1e-6));
      t0 = now_ms();
      sink = sink + cpu::peak_dpbf16_avx512bf16(kIters);
      dot = std::max(dot, 1024.0 * kIters / std::max(now_ms() - t0, 1e-6));
    }
    return dot > 1.3 * fma;
  }();
  return fast;
}

}  // namespace trex::kern
