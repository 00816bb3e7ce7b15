// LayerNorm (torch.nn.LayerNorm with weight and bias), forward and backward, for the DeepSeek-V3.2
// indexer's key norm (the backward serves the indexer loss, model/v32_indexer.h).
//   y[n, :] = (x[n, :] - mean) / sqrt(var + eps) * w + b,  var = the biased variance of the row
//   backward, xh = (x - mean) * rstd, g = dy * w: dx = rstd * (g - mean(g) - xh * mean(g * xh)),
//   dw += sum_n dy * xh, db += sum_n dy
// Mean, variance and the backward's sums are accumulated in double, results rounded once to f32.
// Threaded over rows (dw / db: over columns, rows summed in order; deterministic). Scalar
// reference: kernels/ref/layernorm.h.
#pragma once
#include <cstdint>

namespace trex::kern {

// x: [N, d]  w, b: [d] -> y: [N, d] (may alias x)
void layernorm_fwd(const float* x, int64_t N, int64_t d, const float* w, const float* b, float eps, float* y);
// dy, x: [N, d] (x: the forward's input)  w: [d] -> dx: [N, d] (overwritten; may not alias),
// dw, db: [d] (+=)
void layernorm_bwd(const float* dy, const float* x, int64_t N, int64_t d, const float* w, float eps, float* dx,
                   float* dw, float* db);

}  // namespace trex::kern
