// Element types: f32, bf16 (round-to-nearest-even), and the integer/float tags that
// safetensors files can carry.
#pragma once
#include <cstdint>
#include <cstring>
#include <string_view>

namespace trex {

struct bf16 {
  uint16_t bits = 0;
};

inline float bf16_to_f32(bf16 h) {
  uint32_t u = static_cast<uint32_t>(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline bf16 f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x40)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>(u >> 16)};
}

// Rounds f32 through bf16 and back (what a bf16 GEMM input sees).
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// F8_E8M0: a power-of-two scale byte (DeepSeek-V4 block scales); F4: e2m1 packed two per byte
// (dtype_size 1 per byte; an F4 tensor of n elements takes n / 2 bytes).
enum class DType : uint8_t { F32, BF16, F16, F64, I64, I32, I16, I8, U8, BOOL, F8_E4M3, F8_E5M2, F8_E8M0, F4 };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::F64: case DType::I64: return 8;
    case DType::F32: case DType::I32: return 4;
    case DType::BF16: case DType::F16: case DType::I16: return 2;
    default: return 1;
  }
}

// Bits per element (4 for packed F4).
inline size_t dtype_bits(DType t) { return t == DType::F4 ? 4 : 8 * dtype_size(t); }

inline std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::F64: return "F64";
    case DType::I64: return "I64";
    case DType::I32: return "I32";
    case DType::I16: return "I16";
    case DType::I8: return "I8";
    case DType::U8: return "U8";
    case DType::BOOL: return "BOOL";
    case DType::F8_E4M3: return "F8_E4M3";
    case DType::F8_E5M2: return "F8_E5M2";
    case DType::F8_E8M0: return "F8_E8M0";
    case DType::F4: return "F4";
  }
  return "?";
}

}  // namespace trex
