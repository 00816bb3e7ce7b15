// RoPE tables (transformers' _compute_default_rope_parameters / _compute_yarn_parameters and
// DeepseekV3RotaryEmbedding, in double) and the rotation dispatch (AVX-512, AVX2 or reference).
#include "kernels/rope.h"
#include <algorithm>
#include <cmath>
#include <vector>
#include "core/cpu.h"
#include "core/error.h"
#include "core/parallel.h"
#include "kernels/cpu/rope_avx2.h"
#include "kernels/cpu/rope_avx512.h"
#include "kernels/ref/rope.h"

namespace trex::kern {
namespace {

constexpr double kPi = 3.14159265358979323846;

void check_params(const RopeParams& p) {
  TREX_CHECK(p.dim > 0 && p.dim % 2 == 0, "rope: dim must be even and positive, got ", p.dim);
  TREX_CHECK(p.theta > 1, "rope: theta must be > 1, got ", p.theta);
  if (p.yarn) {
    TREX_CHECK(p.factor > 0, "rope: yarn factor must be positive, got ", p.factor);
    TREX_CHECK(p.original_max_pos > 0, "rope: yarn original_max_pos must be positive");
  }
}

// yarn_get_mscale / get_mscale in transformers.
double get_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

// Inverse dimension formula: the dimension index at which a frequency makes num_rotations turns
// over max_pos positions.
double find_correction_dim(double num_rotations, int dim, double base, double max_pos) {
  return (dim * std::log(max_pos / (num_rotations * 2 * kPi))) / (2 * std::log(base));
}

}  // namespace

void rope_inv_freq(const RopeParams& p, double* inv_freq) {
  check_params(p);
  const int dim = p.dim, half = dim / 2;
  // pos_freqs = base ** (arange(0, dim, 2) / dim)
  for (int i = 0; i < half; ++i) inv_freq[i] = 1.0 / std::pow(p.theta, static_cast<double>(2 * i) / dim);
  if (!p.yarn) return;
  // Python `x or default` for beta_fast / beta_slow.
  const double beta_fast = p.beta_fast != 0 ? p.beta_fast : 32.0;
  const double beta_slow = p.beta_slow != 0 ? p.beta_slow : 1.0;
  const double orig = static_cast<double>(p.original_max_pos);
  double low = find_correction_dim(beta_fast, dim, p.theta, orig);
  double high = find_correction_dim(beta_slow, dim, p.theta, orig);
  if (p.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // prevent singularity
  for (int i = 0; i < half; ++i) {
    const double extrap = inv_freq[i];               // 1 / pos_freq
    const double interp = extrap / p.factor;         // 1 / (factor * pos_freq)
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double extrap_factor = 1.0 - ramp;
    inv_freq[i] = interp * (1 - extrap_factor) + extrap * extrap_factor;
  }
}

double rope_attention_factor(const RopeParams& p) {
  check_params(p);
  if (!p.yarn) return 1.0;
  if (p.attention_factor > 0) return p.attention_factor;
  // `if mscale and mscale_all_dim` in transformers: both must be non-zero.
  if (p.mscale != 0 && p.mscale_all_dim != 0)
    return get_mscale(p.factor, p.mscale) / get_mscale(p.factor, p.mscale_all_dim);
  return get_mscale(p.factor, 1.0);
}

void rope_tables(const RopeParams& p, int64_t max_pos, float* cos, float* sin) {
  TREX_CHECK(max_pos >= 0, "rope_tables: max_pos=", max_pos);
  const int half = p.dim / 2;
  std::vector<double> inv(half);
  rope_inv_freq(p, inv.data());
  const double a = rope_attention_factor(p);
  parallel_for(max_pos, 256, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t)
      for (int i = 0; i < half; ++i) {
        const double ang = static_cast<double>(t) * inv[i];
        cos[t * half + i] = static_cast<float>(std::cos(ang) * a);
        sin[t * half + i] = static_cast<float>(std::sin(ang) * a);
      }
  });
}

double yarn_softmax_mscale(const RopeParams& p) {
  check_params(p);
  if (!p.yarn || p.mscale_all_dim == 0) return 1.0;
  const double m = get_mscale(p.factor, p.mscale_all_dim);
  return m * m;
}

void rope_apply(float* x, int64_t N, int H, int64_t stride_tok, int64_t stride_head, int D, const int32_t* pos,
                const float* cos, const float* sin, RopeLayout layout, bool inverse) {
  TREX_CHECK(N >= 0 && H >= 0, "rope_apply: N=", N, " H=", H);
  TREX_CHECK(D > 0 && D % 2 == 0, "rope_apply: D must be even and positive, got ", D);
  if (N == 0 || H == 0) return;
  TREX_CHECK(x && pos && cos && sin, "rope_apply: null pointer");
  for (int64_t n = 0; n < N; ++n) TREX_CHECK(pos[n] >= 0, "rope_apply: negative position ", pos[n], " at ", n);
  if (cpu_isa() >= Isa::Avx512)
    return cpu::rope_apply_avx512(x, N, H, stride_tok, stride_head, D, pos, cos, sin, layout, inverse);
  if (cpu_isa() == Isa::Avx2)
    return cpu::rope_apply_avx2(x, N, H, stride_tok, stride_head, D, pos, cos, sin, layout, inverse);
  ref::rope_apply<float>(x, N, H, stride_tok, stride_head, D, pos, cos, sin, layout, inverse);
}

}  // namespace trex::kern
