#include "plan/precision.h"

#include "core/error.h"

namespace trex::plan {

PrecisionModel precision_model(const ClusterSpec& s, Precision p) {
  PrecisionModel m;
  const Efficiency& e = s.eff;
  if (p == Precision::BF16) {
    m.gemm_peak = s.peak_bf16;
    m.gemm_eff = e.gemm;
    m.grouped_eff = e.grouped_gemm;
    return m;
  }
  const char* name = precision_name(p);
  m.low = true;
  if (p == Precision::MXFP4) {
    TREX_USER_CHECK(s.peak_fp4 > 0, "use precision=mxfp8, fp8 or bf16 on this device, or set [device] peak_fp4_tflops",
                    "cluster ", s.name, " has no fp4 matmul (peak_fp4 = 0); precision=mxfp4 cannot run there");
    m.gemm_peak = s.peak_fp4;
    m.gemm_eff = e.gemm_fp4_or_fp8();
    m.grouped_eff = e.grouped_gemm_fp4_or_fp8();
    m.quant_fwd = m.quant_grad = 2.0 + 0.5 + 0.5 + 2.0 / 16;
    m.cached_bytes = 0.5 + 1.0 / 16;
    // 1x16 scales, 1/16 B an element: swizzled before each GEMM (read + write): the input's row-wise
    // copy (forward), its column-wise copy (weight gradient), the output gradient's two; weights two.
    m.swizzle_fwd = m.swizzle_bwd = 2.0 / 16, m.swizzle_grad = 2 * 2.0 / 16, m.weight_swizzle = 2 * 2.0 / 16;
    m.align_rows = 32;
    return m;
  }
  TREX_USER_CHECK(s.peak_fp8 > 0, "use precision=bf16 on this device", "cluster ", s.name,
                  " has no fp8 matmul (peak_fp8 = 0); precision=", name, " cannot run there");
  m.gemm_peak = s.peak_fp8;
  m.gemm_eff = e.gemm_fp8;
  m.grouped_eff = e.grouped_gemm_fp8;
  m.align_rows = 16;  // Transformer Engine's alignment for the non-MX FP8 recipes
  switch (p) {
    case Precision::FP8:  // DeepSeek-V3: 1x128 activation tiles, 128x128 weight blocks, fp8 dispatch
      m.quant_fwd = 3.0 + 4.0 / 128;
      m.quant_bwd = 2.0 + 4.0 / 128;    // the cached input re-quantized transposed (weight gradient)
      m.quant_grad = 4.0 + 8.0 / 128;   // the output gradient row- and column-wise
      m.cached_bytes = 1.0 + 4.0 / 128;
      m.dispatch_bytes = 1.0 + 4.0 / 128;
      break;
    case Precision::FP8Tensor:  // Transformer Engine current scaling: amax pass, then quantize
      m.quant_fwd = 6.0;
      m.quant_grad = 6.0;
      m.cached_bytes = 1.0;
      break;
    case Precision::MXFP8:
      TREX_USER_CHECK(s.mx_formats, "use precision=fp8 (1x128 block scaling in software) or fp8-tensor, or set "
                      "[device] mx_formats = true for a device with block-scaled MMA", "cluster ", s.name,
                      " has no hardware block-scaled (MX) matmul; precision=mxfp8 cannot run there");
      m.quant_fwd = m.quant_grad = 2.0 + 1.0 + 1.0 + 2.0 / 32;
      m.cached_bytes = 1.0 + 1.0 / 32;
      // 1x32 e8m0 scales, 1/32 B an element, swizzled before each GEMM (read + write): the input's
      // row-wise copy (forward), its column-wise copy (weight gradient), the output gradient's two
      // copies; each local weight's row- and column-wise scales every micro-batch.
      m.swizzle_fwd = m.swizzle_bwd = 2.0 / 32, m.swizzle_grad = 2 * 2.0 / 32, m.weight_swizzle = 2 * 2.0 / 32;
      m.align_rows = 32;
      break;
    default: break;
  }
  return m;
}

double expert_pad_rows(const PrecisionModel& p) { return p.align_rows > 1 ? (p.align_rows - 1) / 2 : 0; }

}  // namespace trex::plan
