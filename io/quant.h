// Dequantization (and the matching quantizers) for the block-quantized checkpoint formats
// DeepSeek releases. Formats, names and sources: docs/QUANT.md.
//
//   V3/R1 FP8   weight F8_E4M3 [.., R, C] + "<weight>_scale_inv" F32 [.., ceil(R/128), ceil(C/128)]
//               w = e4m3 * scale_inv per 128x128 block (edge blocks partial).
//   V4 FP8      weight F8_E4M3 [.., R, C] + "<prefix>.scale" ue8m0 [.., ceil(R/128), ceil(C/128)]
//               w = e4m3 * 2^(e-127).
//   V4 FP4      weight I8 [.., R, C/2] (two e2m1 per byte, element 2k in the LOW nibble, 2k+1 in
//               the high nibble) + "<prefix>.scale" ue8m0 [.., R, ceil(C/32)]
//               w = e2m1 * 2^(e-127), one scale per 32 consecutive elements along C.
//
// ue8m0 scale tensors are read from the dtype F8_E8M0 (what the V4 release uses) or U8 (the raw
// exponent byte, as transformers' finegrained-FP8 loader also accepts). Packed FP4 weights are
// read from I8 (the V4 release), U8, or a dtype named "F4" whose shape counts logical elements.
// Leading dims ("..") are batch dims (merged experts): blocks never straddle them.
//
// Every decode is exact; a dequantized value is the single f32 product e4m3/e2m1 * scale, which is
// what torch computes (`w.float() * s.float()`), so results are bit-identical to the references
// as long as the FPU is in its default mode (no flush-to-zero / denormals-are-zero).
#pragma once
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "io/safetensors.h"

namespace trex::io {

// ---------------------------------------------------------------------------------------------
// Scalar codecs (exact tables; see docs/QUANT.md)

// e4m3fn: bias 7, no infinities, 0x7f/0xff NaN (bits 0x7ff00000 | sign, as torch), max 448,
// subnormals m * 2^-9.
float e4m3_to_f32(uint8_t b);
// e2m1 nibble (low 4 bits used): +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}; code 8 is -0.0.
float e2m1_to_f32(uint8_t nibble);
// ue8m0: 2^(e-127); e = 0 is 2^-127 (an f32 subnormal), e = 255 is NaN (bits 0x7f800001, as torch).
float ue8m0_to_f32(uint8_t e);
// Round to nearest even; |x| above the largest finite value saturates to +-448 (torch 2.15 and
// Triton's satfinite cast do the same); NaN -> 0x7f with x's sign.
uint8_t f32_to_e4m3(float x);
// Round to nearest, ties to the even code; saturates to +-6; the sign bit of x is kept (-0.1 ->
// code 8). NaN is not representable: callers reject it.
uint8_t f32_to_e2m1(float x);

// ---------------------------------------------------------------------------------------------
// Raw-buffer dequantization. Shapes are checked (TREX_CHECK) against each other, so a scale
// buffer that is too small for the weight is an error, never an out-of-bounds read.

struct Fp8Block {
  int64_t rows = 128, cols = 128;
};
constexpr int64_t kFp4Block = 32;

// Scale grid of a block-quantized weight: [.., ceil(R/rows), ceil(C/cols)].
Shape fp8_scale_shape(const Shape& w, Fp8Block b = {});
// Scale grid of an FP4 weight of logical shape [.., R, C]: [.., R, ceil(C/block)].
Shape fp4_scale_shape(const Shape& logical, int64_t block = kFp4Block);
// Packed byte shape of an FP4 weight of logical shape [.., R, C] (C even): [.., R, C/2].
Shape fp4_packed_shape(const Shape& logical);

// w: [.., R, C] e4m3 bytes  scale_inv: sshape = fp8_scale_shape(wshape, block), f32
// -> out: [.., R, C] f32 (threaded)
void dequant_fp8_block(const uint8_t* w, const Shape& wshape, const float* scale_inv,
                       const Shape& sshape, Fp8Block block, float* out);
// Same with ue8m0 scale bytes.
void dequant_fp8_block(const uint8_t* w, const Shape& wshape, const uint8_t* ue8m0,
                       const Shape& sshape, Fp8Block block, float* out);
std::vector<float> dequant_fp8_block(const uint8_t* w, const Shape& wshape, const float* scale_inv,
                                     const Shape& sshape, Fp8Block block = {});
std::vector<float> dequant_fp8_block(const uint8_t* w, const Shape& wshape, const uint8_t* ue8m0,
                                     const Shape& sshape, Fp8Block block = {});

// w: fp4_packed_shape(logical) bytes  ue8m0: fp4_scale_shape(logical, block)
// -> out: logical [.., R, C] f32 (threaded)
void dequant_fp4_e2m1(const uint8_t* w, const Shape& logical, const uint8_t* ue8m0,
                      const Shape& sshape, int64_t block, float* out);
std::vector<float> dequant_fp4_e2m1(const uint8_t* w, const Shape& logical, const uint8_t* ue8m0,
                                    const Shape& sshape, int64_t block = kFp4Block);

// Scalar reference versions of the two kernels above (same contract, single-threaded, no SIMD):
// the canonical definition the fast path is tested against bit for bit.
namespace ref {
void dequant_fp8_block(const uint8_t* w, const Shape& wshape, const float* scale_inv,
                       const Shape& sshape, Fp8Block block, float* out);
void dequant_fp8_block(const uint8_t* w, const Shape& wshape, const uint8_t* ue8m0,
                       const Shape& sshape, Fp8Block block, float* out);
void dequant_fp4_e2m1(const uint8_t* w, const Shape& logical, const uint8_t* ue8m0,
                      const Shape& sshape, int64_t block, float* out);
}  // namespace ref

// ---------------------------------------------------------------------------------------------
// Quantizers, as the references quantize (for making test checkpoints; docs/QUANT.md). Input must
// be finite (UserError otherwise). Blocks at the edges are partial; their amax covers only the
// elements that exist.

// DeepSeek-V3 inference/kernel.py weight_quant: s = amax / 448, q = e4m3(x / s), scale_inv = s.
// An all-zero block gets s = 1 (as transformers' Fp8Quantize; the reference would divide 0/0).
// x: [.., R, C] -> w: [.., R, C] bytes, scale_inv: fp8_scale_shape(shape, block) f32
void quantize_fp8_block(const float* x, const Shape& shape, Fp8Block block, uint8_t* w,
                        float* scale_inv);
// DeepSeek-V4 inference/kernel.py act_quant with scale_fmt (round_scale) applied per block:
// amax = max(amax, 1e-4); s = 2^ceil(log2(amax * f32(1/448))) by the reference's bit trick;
// q = e4m3(clamp(x / s, -448, 448)); scale byte = log2(s) + 127.
// x: [.., R, C] -> w: [.., R, C] bytes, ue8m0: fp8_scale_shape(shape, block) bytes
void quantize_fp8_block_ue8m0(const float* x, const Shape& shape, Fp8Block block, uint8_t* w,
                              uint8_t* ue8m0);
// DeepSeek-V4 inference/kernel.py fp4_quant: per 32 consecutive elements of a row,
// amax = max(amax, 6 * 2^-126); s = 2^ceil(log2(amax * f32(1/6))); q = e2m1(clamp(x / s, -6, 6));
// packed low nibble first. x: logical [.., R, C] (C even) -> w: fp4_packed_shape bytes,
// ue8m0: fp4_scale_shape(shape, block) bytes
void quantize_fp4_e2m1(const float* x, const Shape& shape, int64_t block, uint8_t* w,
                       uint8_t* ue8m0);

// ---------------------------------------------------------------------------------------------
// Checkpoint side

enum class QuantFormat : uint8_t {
  None,         // plain float tensor (F32/BF16/F16/F64)
  Fp8F32Scale,  // F8_E4M3 + F32 block scale_inv (V3 release "_scale_inv", V3 inference ".scale")
  Fp8Ue8m0,     // F8_E4M3 + ue8m0 block scale (V4 release)
  Fp4Ue8m0,     // packed e2m1 + ue8m0 scale per 32 (V4 release experts)
};
const char* quant_format_name(QuantFormat f);

// Block sizes and expectations, usually from the HF config.json (from_hf_config).
struct QuantConfig {
  Fp8Block fp8_block{};
  int64_t fp4_block = kFp4Block;
  // Parses config["quantization_config"] ({"quant_method": "fp8", "fmt": "e4m3",
  // "weight_block_size": [r, c], "scale_fmt": "ue8m0"}); an absent or null section gives the
  // defaults. An unsupported method / fmt / scale_fmt or a malformed field is a UserError naming
  // `where`. The scale storage (F32 or ue8m0 byte) is decided per tensor by the scale's dtype:
  // V3.1 declares scale_fmt "ue8m0" yet stores power-of-two scales as F32.
  static QuantConfig from_hf_config(const nlohmann::json& config, const std::string& where);
};

// What the reader found for one weight.
struct QuantInfo {
  QuantFormat format = QuantFormat::None;
  std::string weight;  // tensor name
  std::string scale;   // scale tensor name ("" for None)
  Shape shape;         // logical shape of the dequantized weight
  const TensorInfo* weight_info = nullptr;
  const TensorInfo* scale_info = nullptr;
  const SafetensorsFile* weight_file = nullptr;
  const SafetensorsFile* scale_file = nullptr;
};

// Reads weights from a checkpoint directory as f32, dequantizing when a weight is quantized.
// Detection: the scale of weight W is "W_scale_inv" (V3 / HF) or, when W ends in ".weight",
// "<prefix>.scale" (DeepSeek original layout); the weight's dtype and the scale's dtype pick the
// format. Every mismatch is a UserError naming the file, the tensor and the expected and actual
// shapes or dtypes: an FP8 weight without a scale, a scale beside a float weight, both scale
// names present, a scale whose shape does not match the weight's block grid (including a
// truncated one), or an unsupported dtype pairing. `dir` must outlive the reader.
class QuantizedTensorReader {
 public:
  explicit QuantizedTensorReader(const SafetensorsDir& dir, QuantConfig cfg = {});

  QuantInfo inspect(const std::string& name) const;  // detect + validate (cheap, no decoding)
  Shape shape(const std::string& name) const { return inspect(name).shape; }
  // out: [numel of the logical shape]; n must equal it.
  void read_f32(const std::string& name, float* out, int64_t n) const;
  std::vector<float> read_f32(const std::string& name) const;
  // True if `name` is the scale tensor of a quantized weight in this checkpoint (loaders skip it).
  bool is_scale(const std::string& name) const;
  // All tensor names except scale tensors, sorted.
  std::vector<std::string> weight_names() const;
  const QuantConfig& config() const { return cfg_; }

 private:
  const SafetensorsDir& dir_;
  QuantConfig cfg_;
};

// A quantized weight (and its scale) ready to be written with write_safetensors: bytes own the
// data, names follow the reference layouts (see QuantScheme).
struct QuantizedTensor {
  std::string name;
  DType dtype = DType::U8;
  Shape shape;
  std::vector<uint8_t> bytes;
  TensorToWrite to_write() const { return {name, dtype, shape, bytes.data()}; }
};

enum class QuantScheme : uint8_t {
  Fp8V3,  // "<name>" F8_E4M3 + "<name>_scale_inv" F32 (V3/R1 HF release)
  Fp8V4,  // "<prefix>.weight" F8_E4M3 + "<prefix>.scale" ue8m0 (stored as U8, see docs)
  Fp4V4,  // "<prefix>.weight" I8 [R, C/2] + "<prefix>.scale" ue8m0 (stored as U8)
};
// x: [.., R, C] f32 -> {weight, scale}. name must end in ".weight" for the V4 schemes.
std::vector<QuantizedTensor> quantize_weight(const std::string& name, const float* x,
                                             const Shape& shape, QuantScheme scheme,
                                             const QuantConfig& cfg = {});

}  // namespace trex::io
