// AMX bf16 tile throughput loop for kernels/peak.cpp: four independent 16 x 16 f32 accumulator
// tiles, each `tdpbf16ps` a 16 x 16 x 32 bf16 product (16384 FLOPs), 4 x 16384 = 65536 FLOPs per
// iteration, no memory traffic inside the loop. oneDNN runs trex's bf16 GEMMs on these units where
// the CPU has them (its brgemm "avx512_core_amx_bf16" kernels), so the machine's peak must count
// them. Compiled with -mamx-tile -mamx-bf16 and called only after amx_bf16_usable().
#include <immintrin.h>
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cstdint>
#include <cstring>

namespace trex::kern::cpu {

namespace {

// The 64-byte tile configuration (palette 1): tiles 0-7, each 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

}  // namespace

// CPUID leaf 7 reports AMX-TILE and AMX-BF16, and Linux grants this process the tile data state
// (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA; a kernel or hypervisor without it refuses).
bool amx_bf16_usable() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool tile = d & (1u << 24), bf16 = d & (1u << 22);
  if (!tile || !bf16) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

__attribute__((noinline)) float peak_amx_bf16(int64_t iters) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  alignas(64) uint16_t ab[16 * 32];
  for (int i = 0; i < 16 * 32; ++i) ab[i] = 0x3c00;  // 2^-7 in bf16: sums stay finite
  alignas(64) float out[16 * 16];
  // The thread's tile configuration is restored at the end, not released: oneDNN's brgemm keeps
  // the palette it loaded on each thread and does not load it again, so a release here made its
  // next AMX GEMM on this thread fault (SIGILL).
  alignas(64) uint8_t saved[64];
  _tile_storeconfig(saved);
  _tile_loadconfig(&cfg);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, ab, 64);
  _tile_loadd(5, ab, 64);
  _tile_loadd(6, ab, 64);
  _tile_loadd(7, ab, 64);
  for (int64_t it = 0; it < iters; ++it) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  float s = 0;
  _tile_stored(0, out, 64);
  s += out[0];
  _tile_stored(3, out, 64);
  s += out[255];
  _tile_loadconfig(saved);  // all zeros (palette 0) when the thread had none: the init state
  return s;
}

}  // namespace trex::kern::cpu
