// Gated window pooling dispatch: AVX-512 kernel when the CPU has it, else the scalar reference.
#include "kernels/compress_pool.h"
#include <cstring>
#include "core/cpu.h"
#include "core/error.h"
#include "kernels/cpu/compress_pool_avx512.h"
#include "kernels/ref/compress_pool.h"

namespace trex::kern {
namespace {

void check_shape(const char* fn, int64_t B, int64_t T, int64_t m, int64_t hd, int c) {
  TREX_CHECK(B >= 0 && T >= 0 && hd > 0, fn, ": B=", B, " T=", T, " hd=", hd);
  TREX_CHECK(m >= 1, fn, ": compress rate m=", m);
  TREX_CHECK(c == 1 || c == 2, fn, ": c=", c, " (1 = HCA, 2 = CSA / indexer)");
}

}  // namespace

size_t compress_pool_bwd_workspace_floats(int64_t B, int64_t T, int64_t m, int64_t hd, int c) {
  check_shape("compress_pool_bwd_workspace_floats", B, T, m, hd, c);
  return static_cast<size_t>(compress_pool_chunks(B * (T / m)) * m * c * hd);
}

void compress_pool_fwd(int64_t B, int64_t T, int64_t m, int64_t hd, int c, const float* kv, const float* gate,
                       const float* pb, float* out) {
  check_shape("compress_pool_fwd", B, T, m, hd, c);
  if (B * (T / m) == 0) return;
  TREX_CHECK(kv && gate && pb && out, "compress_pool_fwd: null pointer");
  if (cpu_isa() >= Isa::Avx512) return cpu::compress_pool_fwd_avx512(B, T, m, hd, c, kv, gate, pb, out);
  ref::compress_pool_fwd<float>(B, T, m, hd, c, kv, gate, pb, out);
}

void compress_pool_bwd(int64_t B, int64_t T, int64_t m, int64_t hd, int c, const float* kv, const float* gate,
                       const float* pb, const float* dout, float* dkv, float* dgate, float* dpb, float* workspace) {
  check_shape("compress_pool_bwd", B, T, m, hd, c);
  if (B * T == 0) return;
  TREX_CHECK(dkv && dgate, "compress_pool_bwd: null pointer");
  if (B * (T / m) == 0) {  // no window: every gradient element is 0, dpb unchanged
    std::memset(dkv, 0, sizeof(float) * B * T * c * hd);
    std::memset(dgate, 0, sizeof(float) * B * T * c * hd);
    return;
  }
  TREX_CHECK(kv && gate && pb && dout && dpb && workspace, "compress_pool_bwd: null pointer");
  if (cpu_isa() >= Isa::Avx512)
    return cpu::compress_pool_bwd_avx512(B, T, m, hd, c, kv, gate, pb, dout, dkv, dgate, dpb, workspace);
  ref::compress_pool_bwd<float>(B, T, m, hd, c, kv, gate, pb, dout, dkv, dgate, dpb);
}

}  // namespace trex::kern
