// Machine peak: fp32 FMA and bf16 dot-product (vdpbf16ps) throughput on all worker threads,
// measured with register-only loops (16 independent accumulators per thread, enough to hide
// the FMA latency on two ports). FLOPs count 2 per multiply-add: an fp32 zmm FMA is 32 FLOPs,
// a vdpbf16ps zmm is 64 FLOPs (32 bf16 products summed pairwise into 16 f32 lanes).
// Without AVX512-BF16 bf16_gflops = fp32_gflops and bf16_native = false. Without AVX-512 the
// fp32 figure comes from an AVX2 FMA loop (the units oneDNN's sgemm uses there), or from a
// baseline SSE mul+add loop on CPUs without AVX2 / FMA or under TREX_ISA=ref.
// Where the CPU has AMX-BF16 and Linux grants its tiles, oneDNN runs the bf16 GEMMs on them
// (brgemm avx512_core_amx_bf16), so amx_bf16_gflops (a tdpbf16ps loop on four accumulator tiles)
// joins the peak; 0 where there are no usable tiles.
// MFU note: on CPUs where vdpbf16ps runs at half the fp32 FMA rate (e.g. the Emerald Rapids
// VMs this was written on: ~86 vs ~176 GFLOP/s per core) bf16 GEMMs run on the fp32 units
// (kernels/gemm.h widens bf16), so the honest denominator is best_gflops(): the fastest unit a
// GEMM of the step can use.
#pragma once

namespace trex::kern {

struct Peak {
  double fp32_gflops = 0, bf16_gflops = 0, amx_bf16_gflops = 0;
  int threads = 0;
  bool bf16_native = false;
  // The fastest arithmetic the machine offers for a GEMM of either precision.
  double best_gflops() const {
    const double v = fp32_gflops > bf16_gflops ? fp32_gflops : bf16_gflops;
    return v > amx_bf16_gflops ? v : amx_bf16_gflops;
  }
};

// Runs each throughput loop on num_threads() threads for about seconds_per_test seconds
// (best of 3 timed rounds after a calibration round).
Peak measure_peak(double seconds_per_test = 0.3);
// True where measure_peak measures AMX bf16 tiles: the CPU reports AMX-TILE and AMX-BF16, Linux
// grants this process the tile state, TREX_ISA names no level below amx, and oneDNN runs its
// kernels there (ONEDNN_MAX_CPU_ISA does not cap it below AMX).
bool amx_bf16_usable();
// True where the CPU has AVX512_BF16 (reported or probed, core/cpu.h) and its vdpbf16ps runs
// clearly faster than its fp32 FMAs, in FLOPs (over 1.3x): AMD Zen 4 (2x); not the Intel Xeons with AVX512_BF16
// (Cooper Lake to Emerald Rapids: about half the FMA rate), where the f32 kernels are faster. The
// bf16 attention kernels and, where no AMX tiles are usable, oneDNN's bf16 matmul run only where
// it holds. Measured once per process on one thread (both loops interleaved, best of 5, about
// 2 ms); TREX_BF16_DOT=fast|slow sets it instead (runs that must take the same kernels everywhere).
bool bf16_dot_fast();

}  // namespace trex::kern
