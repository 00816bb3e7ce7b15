// The AVX-512 f32 -> bf16 conversion (kernels/cpu/rows_avx512.h) and kernels/rows.h's to_bf16
// (which runs it on AVX-512 CPUs) against core/dtype.h's f32_to_bf16, bit for bit: ties to even in
// both directions, subnormals, infinities, NaNs with payloads, the largest finite values (which
// round to infinity), at lengths on and off the 16- and 32-lane steps and at a row stride.
// The direct kernel call is skipped on CPUs without AVX-512; the dispatch is tested everywhere.
// And the zero fill (streaming stores on AVX-512): every byte of the range zeroed, none beside it,
// at unaligned starts and ends, below and above the size where it streams and threads.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/cpu.h"
#include "kernels/cpu/rows_avx512.h"
#include "kernels/rows.h"

namespace {

using trex::bf16;

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Values where a conversion can go wrong, then random bit patterns (every class of float).
std::vector<float> hard_values(size_t n) {
  std::vector<float> v = {0.f, -0.f, 1.f, -1.f, std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::max(),
                          -std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(),
                          std::numeric_limits<float>::min(), from_bits(0x7fc00000u), from_bits(0xff800001u),
                          from_bits(0x7f800001u), from_bits(0x3f808000u), from_bits(0x3f818000u),
                          from_bits(0x3f808001u), from_bits(0x3f817fffu), from_bits(0x00008000u),
                          from_bits(0x00018000u), from_bits(0x7f7f8000u), from_bits(0x807fffffu)};
  std::mt19937 rng(7);
  while (v.size() < n) v.push_back(from_bits(static_cast<uint32_t>(rng())));
  v.resize(n);
  return v;
}

bool equal_to_scalar(const float* x, const bf16* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (y[i].bits != trex::f32_to_bf16(x[i]).bits) return false;
  return true;
}

TEST(RowsAvx512, ToBf16EqualsTheScalarConversionBitForBit) {
  if (trex::cpu_isa() < trex::Isa::Avx512) GTEST_SKIP() << "the CPU has no AVX-512 (or TREX_ISA caps it)";
  for (int64_t n : {0, 1, 15, 16, 17, 31, 32, 33, 47, 1000, 4099}) {
    const std::vector<float> x = hard_values(static_cast<size_t>(n) + 1);
    std::vector<bf16> y(static_cast<size_t>(n) + 1, bf16{0xABCD});
    trex::kern::cpu::to_bf16_avx512(x.data() + 1, n, y.data());  // an unaligned source
    EXPECT_TRUE(equal_to_scalar(x.data() + 1, y.data(), n)) << "n=" << n;
    EXPECT_EQ(y[n].bits, 0xABCD) << "wrote past the end at n=" << n;
  }
}

TEST(RowsAvx512, ToBf16RowsAtAStrideEqualTheScalarConversion) {
  // Through kernels/rows.h: packed (one range per thread block) and strided (row by row).
  const int64_t rows = 37, cols = 41, ldx = 53;
  const std::vector<float> x = hard_values(static_cast<size_t>(rows * ldx));
  std::vector<bf16> y(static_cast<size_t>(rows * cols));
  trex::kern::to_bf16(x.data(), ldx, rows, cols, y.data());
  for (int64_t r = 0; r < rows; ++r) EXPECT_TRUE(equal_to_scalar(x.data() + r * ldx, y.data() + r * cols, cols)) << r;
  const int64_t n = (int64_t{1} << 17) + 5;  // more than one thread block
  const std::vector<float> big = hard_values(static_cast<size_t>(n));
  std::vector<bf16> yb(static_cast<size_t>(n));
  trex::kern::to_bf16(big.data(), n, 1, n, yb.data());
  EXPECT_TRUE(equal_to_scalar(big.data(), yb.data(), n));
}

// Fills [off, off + n) of a buffer of 0xA5 bytes with kern::zero_bytes (or the AVX-512 kernel) and
// checks the range and the guard bytes on both sides.
void check_zero(size_t off, size_t n, bool direct) {
  const size_t guard = 256;
  std::vector<unsigned char> b(off + n + guard, 0xA5);
  if (direct) trex::kern::cpu::zero_stream_avx512(b.data() + off, n);
  else trex::kern::zero_bytes(b.data() + off, n);
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    const unsigned char want = i >= off && i < off + n ? 0 : 0xA5;
    if (b[i] != want && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << "off " << off << " n " << n << " direct " << direct << ": first wrong byte at " << first;
}

TEST(RowsAvx512, ZeroBytesClearsExactlyTheRange) {
  const size_t big = trex::kern::kZeroStreamBytes;
  for (size_t off : {0, 1, 63, 64, 100})
    for (size_t n : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{1000}, big - 7, big + 4099,
                     3 * big + 123})
      check_zero(off, n, false);
  if (trex::cpu_isa() < trex::Isa::Avx512) GTEST_SKIP() << "the CPU has no AVX-512 (or TREX_ISA caps it)";
  for (size_t off : {0, 1, 63, 64, 100})
    for (size_t n : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{127}, size_t{128}, size_t{4097}})
      check_zero(off, n, true);
}

}  // namespace

