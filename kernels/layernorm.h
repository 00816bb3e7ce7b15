// LayerNorm forward (torch.nn.LayerNorm with weight and bias), for the DeepSeek-V3.2 indexer's
// key norm. Forward only: the indexer's selection carries no gradient, so nothing differentiates
// through it.
//   y[n, :] = (x[n, :] - mean) / sqrt(var + eps) * w + b,  var = the biased variance of the row
// Mean and variance are accumulated in double, y rounded once to f32. Threaded over rows.
#pragma once
#include <cstdint>

namespace trex::kern {

// x: [N, d]  w, b: [d] -> y: [N, d] (may alias x)
void layernorm_fwd(const float* x, int64_t N, int64_t d, const float* w, const float* b, float eps, float* y);

}  // namespace trex::kern
