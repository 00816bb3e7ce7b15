// GEMM precision recipes as they behave on a device: which peak the GEMMs run at, what the
// quantize / transpose / cast kernels around each GEMM cost in memory traffic, how a cached GEMM
// input is stored, and what the expert dispatch sends. What stays bf16 under every recipe: the
// attention core (QK^T, PV), the router, norms, RoPE, SwiGLU's elementwise work, the LM head and
// the optimizer (DeepSeek-V3 sec. 3.3.1; Transformer Engine's recipes keep the same set), so that
// memory-bound work does not speed up.
//
// Quantize traffic is per quantized operand element (plan/arch.h, LayerCost::q_in / q_grad): each
// linear layer's input X in the forward (its forward GEMM and, kept from the forward or
// re-quantized in the backward, the weight gradient's transposed operand) and its output gradient
// dY in the backward (the data gradient needs dY row-wise, the weight gradient column-wise: with
// 1-D block scales the two are quantized separately, as Transformer Engine does).
//
//   recipe      GEMMs at     scales                              B per element of X (fwd; bwd) and dY
//   bf16        peak_bf16    -                                   0; 0 | 0
//   fp8         peak_fp8     1x128 activations, 128x128 weights  X 3.03 (read bf16, write fp8 +
//   (= fp8-block)            (DeepSeek-V3)                       scale); bwd 2.03 (transposed re-
//                                                                quantization of the cached input)
//                                                                | dY 4.06 (row- and column-wise)
//   fp8-tensor  peak_fp8     one scale per tensor, current       X 6 (amax pass 2, then read 2,
//                            scaling (Transformer Engine)        write row- and column-wise 1 + 1);
//                                                                0 | dY 6 (the same)
//   mxfp8       peak_fp8     1x32 blocks, e8m0 scales; needs     X 4.06 (read 2, write row- and
//                            hardware block-scaled MMA           column-wise 1 + 1 + scales); 0 |
//                            (Blackwell, CDNA 4)                 dY 4.06 (the same)
//   mxfp4       peak_fp4     1x16/1x32 blocks (NVFP4 / MXFP4);   X 3.13; 0 | dY 3.13 (read 2, write
//                            needs hardware fp4 MMA              two 0.5 B copies + scales)
//
// MX formats also rearrange ("swizzle") the block scales into the tensor core's layout before every
// GEMM, both operands, as Transformer Engine does (transformer_engine/pytorch/csrc/extensions/
// gemm.cpp: swizzle_scaling_factors on A and B before each GEMM, multi_tensor_swizzle_scaling_factors
// before each grouped GEMM; no swizzle was fused into the quantize kernels as of December 2025):
// the scales read and written once per operand use. Activations: the forward's row-wise copy
// (forward GEMM), the column-wise copy (weight gradient), the output gradient's two copies (data and
// weight gradients); weights: the row-wise scales (forward) and column-wise ones (data gradient) of
// every local weight, each micro-batch (swizzle_fwd, swizzle_bwd, swizzle_grad, weight_swizzle below).
//
// The routed experts' grouped GEMMs need each expert's rows padded to a multiple of align_rows
// (Transformer Engine's get_align_size_for_quantization: 32 for MXFP8 / NVFP4, 16 for the other FP8
// recipes). Megatron-Core pads in the dispatch when the flex dispatcher (DeepEP / HybridEP,
// Layout::ep_dedup) is used (its pad_multiple); with the all-to-all dispatcher TEGroupedMLP copies
// the input into a padded buffer and the output back (Fp8Padding / Fp8Unpadding, Transformer
// Engine's fused_multi_row_padding), unless every expert's count happens to be aligned.
#pragma once
#include "plan/layout.h"
#include "plan/spec.h"

namespace trex::plan {

struct PrecisionModel {
  bool low = false;            // GEMMs run below bf16
  double gemm_peak = 0;        // FLOP/s peak the linear layers' GEMMs run at
  double gemm_eff = 0, grouped_eff = 0;  // fractions of gemm_peak (dense, routed experts)
  double quant_fwd = 0;        // bytes of quantize traffic per quantized input element (q_in), forward
  double quant_bwd = 0;        // same, backward (a transposed re-quantization of the cached input)
  double quant_grad = 0;       // bytes per output-gradient element (q_grad), backward
  double cached_bytes = 0;     // bytes a cached GEMM input takes (0 = its bf16 size)
  double dispatch_bytes = 2;   // bytes per hidden element the expert dispatch sends
  double align_rows = 0;       // each routed expert's rows padded to a multiple of this (0: none)
  // Scale swizzle (MX formats), bytes per input element forward and backward, per output-gradient
  // element, and per local weight per micro-batch; at the spec's `swizzle` efficiency (plan/spec.h).
  double swizzle_fwd = 0, swizzle_bwd = 0, swizzle_grad = 0, weight_swizzle = 0;
};

// Rows a routed expert computes beyond the `rows` it receives, on average, when the recipe pads
// each expert to a multiple of align_rows: with a routed count's remainder spread evenly over the
// multiple (routing is not aligned by construction, even when forced to balance on average),
// (align_rows - 1) / 2.
double expert_pad_rows(const PrecisionModel& p);

// The recipe on this device; refuses (naming the spec key) a recipe the device cannot run.
PrecisionModel precision_model(const ClusterSpec& s, Precision p);

}  // namespace trex::plan
