// AVX-512 gated window pooling (forward and backward); semantics and shapes as in
// kernels/compress_pool.h. Call through kernels/compress_pool.h, which checks the arguments.
#pragma once
#include <cstdint>

namespace trex::kern::cpu {

// kv, gate: [B, T, c*hd]  pb: [m, c*hd] -> out: [B, T/m, hd]
void compress_pool_fwd_avx512(int64_t B, int64_t T, int64_t m, int64_t hd, int c, const float* kv,
                              const float* gate, const float* pb, float* out);

// kv, gate: [B, T, c*hd]  pb: [m, c*hd]  dout: [B, T/m, hd]
//   -> dkv, dgate: [B, T, c*hd] (overwritten)  dpb: [m, c*hd] (+=, deterministic)
// workspace: compress_pool_chunks(B * (T/m)) * m * c * hd floats.
void compress_pool_bwd_avx512(int64_t B, int64_t T, int64_t m, int64_t hd, int c, const float* kv,
                              const float* gate, const float* pb, const float* dout, float* dkv, float* dgate,
                              float* dpb, float* workspace);

}  // namespace trex::kern::cpu
