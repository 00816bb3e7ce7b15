// GEMM precision recipes as they behave on a device: which peak the GEMMs run at, what the
// quantize / transpose / cast kernels around each GEMM cost in memory traffic (forward and
// backward, per GEMM-input element), how a cached GEMM input is stored, and what the expert
// dispatch sends. What stays bf16 under every recipe: the attention core (QK^T, PV), the router,
// norms, RoPE, SwiGLU's elementwise work, the LM head and the optimizer (DeepSeek-V3 sec. 3.3.1;
// Transformer Engine's recipes keep the same set), so that memory-bound work does not speed up.
//
//   recipe      GEMMs at     scales                              quantize traffic (B / element)
//   bf16        peak_bf16    -                                   0 / 0
//   fp8         peak_fp8     1x128 activations, 128x128 weights  fwd 3.03 (read bf16, write fp8 +
//   (= fp8-block)            (DeepSeek-V3)                       scale); bwd 2.03 (transposed
//                                                                re-quantization of the cached
//                                                                input) + 4.06 (output gradient,
//                                                                row- and column-wise)
//   fp8-tensor  peak_fp8     one scale per tensor, current       fwd 6 (amax pass 2, then read 2,
//                            scaling (Transformer Engine)        write row- and column-wise 1 + 1);
//                                                                bwd 6 (the same on the gradient)
//   mxfp8       peak_fp8     1x32 blocks, e8m0 scales; needs     fwd 4.06 (read 2, write row- and
//                            hardware block-scaled MMA           column-wise 1 + 1 + scales);
//                            (Blackwell, CDNA 4)                 bwd 4.06 (the gradient)
//   mxfp4       peak_fp4     1x16/1x32 blocks (NVFP4 / MXFP4);   fwd 3.13, bwd 3.13 (read 2, write
//                            needs hardware fp4 MMA              two 0.5 B copies + scales)
#pragma once
#include "plan/layout.h"
#include "plan/spec.h"

namespace trex::plan {

struct PrecisionModel {
  bool low = false;            // GEMMs run below bf16
  double gemm_peak = 0;        // FLOP/s peak the linear layers' GEMMs run at
  double gemm_eff = 0, grouped_eff = 0;  // fractions of gemm_peak (dense, routed experts)
  double quant_fwd = 0;        // bytes of quantize traffic per GEMM-input element, forward
  double quant_bwd = 0;        // same, backward (transposed copies, output gradients)
  double cached_bytes = 0;     // bytes a cached GEMM input takes (0 = its bf16 size)
  double dispatch_bytes = 2;   // bytes per hidden element the expert dispatch sends
};

// The recipe on this device; refuses (naming the spec key) a recipe the device cannot run.
PrecisionModel precision_model(const ClusterSpec& s, Precision p);

}  // namespace trex::plan
