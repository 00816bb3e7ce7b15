// Gated window pooling of DeepSeek-V4's KV compressors (HF DeepseekV4HCACompressor, c = 1;
// DeepseekV4CSACompressor and DeepseekV4Indexer's compressor, c = 2; no cache: training), forward
// and backward, in fp32. The caller computes kv = h @ Wkv^T and gate = h @ Wg^T and applies the
// kv_norm RMSNorm and RoPE to `out` itself. Exact definition (slots, -inf fill of window 0,
// dropped trailing tokens, NaN behaviour): kernels/ref/compress_pool.h.
//   out[b, w, d] = sum_slots softmax_slots(gate + pb) * kv   over the m (c = 1) or 2m (c = 2,
//   overlapping: the "Ca" half of window w-1 and the "Cb" half of window w) slots of window w.
// Gradients: the parameter gradient dpb ACCUMULATES (+=); the activation gradients dkv and dgate
// OVERWRITE (elements that feed no window get 0). dpb is deterministic: windows are cut into
// chunks that depend only on B * (T / m) (never on the thread count), each chunk's partial sum is
// kept apart in the workspace and the partials are added in chunk order.
// Dispatches to the AVX-512 kernel (kernels/cpu/compress_pool_avx512.cpp) or the reference.
#pragma once
#include <cstddef>
#include <cstdint>

namespace trex::kern {

// kv, gate: [B, T, c*hd]  pb: [m, c*hd] -> out: [B, T/m, hd]   (m >= 1, c = 1 or 2)
void compress_pool_fwd(int64_t B, int64_t T, int64_t m, int64_t hd, int c, const float* kv, const float* gate,
                       const float* pb, float* out);

// kv, gate: [B, T, c*hd]  pb: [m, c*hd]  dout: [B, T/m, hd]
//   -> dkv, dgate: [B, T, c*hd] (overwritten)  dpb: [m, c*hd] (+=)
// workspace: [compress_pool_bwd_workspace_floats(...)] floats (contents on entry ignored).
void compress_pool_bwd(int64_t B, int64_t T, int64_t m, int64_t hd, int c, const float* kv, const float* gate,
                       const float* pb, const float* dout, float* dkv, float* dgate, float* dpb, float* workspace);

// Floats of workspace compress_pool_bwd needs: (number of window chunks) * m * c * hd, with at
// most 16 chunks; 0 when T < m.
size_t compress_pool_bwd_workspace_floats(int64_t B, int64_t T, int64_t m, int64_t hd, int c);

// Number of window chunks of the deterministic dpb reduction for B * nw windows (<= 16).
inline int64_t compress_pool_chunks(int64_t BW) { return BW < 16 ? BW : 16; }

}  // namespace trex::kern
