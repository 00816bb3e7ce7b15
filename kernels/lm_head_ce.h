// LM head fused with cross-entropy: loss = sum over valid rows n of
//   lse_n - logit[n, labels[n]],   logit = h @ W^T,   lse_n = log sum_v exp(logit[n, v])
// without ever forming the [N, V] logits: the vocabulary is processed in chunks with an online
// log-sum-exp (pass 1); with gradients, pass 2 forms p = grad_scale * (softmax - onehot) chunk by
// chunk, then dh += p @ W_c and dW_c += p^T @ h (GEMMs). Rows are processed in blocks so the
// workspace is [row_block, chunk + 16] floats (rows a cache line longer than the chunk; at most
// 64 MiB a chunk; 128 MiB when one chunk is the vocabulary: at V = 16384, blocks of 1024 rows
// take 0.88x the time of 512 on the fp32 units and 0.80x on AMX, and 2048 rows 0.97x the time of
// 1024 on Zen 5's bf16 dot product, as every block streams all of W). By default one chunk covers
// the whole vocabulary when a block of 256 rows fits in 64 MiB (V <= 65536): pass 2 then reuses
// pass 1's logits.
// With more than one chunk pass 2 recomputes each chunk's logits.
// FLOPs: 2*N*V*d for the loss alone; with gradients 6*N*V*d (one chunk) or 8*N*V*d (logits
// formed twice): lm_head_ce_flops.
// Rows with label -100 are ignored (no loss, zero gradient); any other label outside [0, V) is
// an error. NaN/Inf in a valid row's logits make the loss NaN.
// Gradients: dh (activation) is OVERWRITTEN; dW (parameter) ACCUMULATES (+=).
// Precision BF16: the logits use the bf16 copies h_b and W_b (f32 accumulation); the gradients
// are those of that loss w.r.t. the rounded values (dh = p @ W_b, dW += p^T @ h_b, p in f32).
// Where bf16 GEMMs run on the dot-product units (kernels/gemm_bf16_dnnl.h: bf16_dot_gemm()), p is
// rounded to bf16 for those two GEMMs, as PyTorch's autocast rounds the logits' gradient: they
// are 2/3 of the head's FLOPs and would otherwise run at the f32 FMA rate, half the dot rate.
// Elsewhere (bf16 GEMMs widened to f32, kernels/gemm.h), where V * d <= 2^26, the workspace also
// holds W_b widened once a call ([V, d] floats) and one row block of h_b widened, and the GEMMs
// read those: the same values, without widening W again for every row block's two GEMMs (3% faster
// on 2 Sapphire Rapids class cores at N = 2048, d = 1024, V = 16384).
#pragma once
#include <cstddef>
#include <cstdint>
#include "core/dtype.h"
#include "kernels/gemm.h"

namespace trex::kern {

struct CeArgs {
  Prec prec = Prec::F32;
  int64_t N = 0, d = 0, V = 0;
  const float* h = nullptr;       // [N, d]  final hidden states (prec F32)
  const bf16* h_b = nullptr;      // [N, d]  bf16 copy (prec BF16)
  const float* W = nullptr;       // [V, d]  head weight (prec F32)
  const bf16* W_b = nullptr;      // [V, d]  bf16 copy (prec BF16)
  const int32_t* labels = nullptr;  // [N]   target of each row (already shifted); -100 = ignored
  float grad_scale = 1.f;         // gradients are of grad_scale * (sum of losses)
  float* dh = nullptr;            // [N, d]  overwritten; null: no gradients (then dW unused)
  float* dW = nullptr;            // [V, d]  accumulated (+=); required when dh is set
  int64_t chunk = 0;              // vocabulary columns per chunk; 0: default (V if V <= 65536, else 4096)
  float* workspace = nullptr;     // lm_head_ce_workspace_floats(args) floats; null: allocated inside
};

// Returns the SUM of per-row losses over valid rows (in double); *n_valid (if not null) gets
// the number of valid rows. With args.dh set, also computes the gradients described above.
double lm_head_ce(const CeArgs& args, int64_t* n_valid);

// Floats the caller must provide in args.workspace (depends on N, V and chunk only).
size_t lm_head_ce_workspace_floats(const CeArgs& args);

// FLOPs one call with these N, d, V, chunk executes without / with gradients (2, 6 or 8 x N V d).
double lm_head_ce_flops(const CeArgs& args, bool grads);

}  // namespace trex::kern
