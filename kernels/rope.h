// Rotary position embedding (RoPE): frequency tables as Hugging Face transformers computes them
// for DeepSeek-V3 (default and YaRN), and the in-place rotation, forward or inverse.
// Gradients: RoPE has no parameters. Its backward is the inverse rotation (rotate by -angle with
// the same tables), applied in place to the output gradient, which it therefore OVERWRITES.
// Note: with an attention factor a != 1 baked into the tables, cos^2 + sin^2 = a^2, so the
// "inverse" is exactly the transpose (adjoint, what backward needs) and undoes the forward only
// up to a factor a^2.
#pragma once
#include <cstdint>

namespace trex::kern {

// Mirrors transformers' rope_parameters (modeling_rope_utils.py, _compute_default_rope_parameters
// and _compute_yarn_parameters). dim = rotated head dimension (qk_rope_head_dim), theta =
// rope_theta. yarn=false is rope_type "default" (the other fields are then unused).
struct RopeParams {
  int dim;
  double theta;
  bool yarn = false;
  double factor = 1, beta_fast = 32, beta_slow = 1, mscale = 1, mscale_all_dim = 0;
  int64_t original_max_pos = 4096;
  bool truncate = true;
  double attention_factor = -1;  // YaRN: > 0 overrides the factor derived from mscale (HF "attention_factor")
};

// -> inv_freq: [dim/2] (double; HF keeps it as an f32 buffer)
void rope_inv_freq(const RopeParams& p, double* inv_freq);

// The factor HF multiplies cos and sin with (YaRN "attention_factor"; 1 for default RoPE).
double rope_attention_factor(const RopeParams& p);

// -> cos, sin: [max_pos, dim/2] f32: cos(pos * inv_freq[i]) * attention_factor (same for sin),
// computed in double and rounded once.
void rope_tables(const RopeParams& p, int64_t max_pos, float* cos, float* sin);

// The extra factor DeepseekV3Attention multiplies its softmax scale with (yarn_apply_mscale):
// m * m with m = 0.1 * mscale_all_dim * ln(factor) + 1 when YaRN, mscale_all_dim != 0 and
// factor > 1; else 1.
double yarn_softmax_mscale(const RopeParams& p);

// Interleaved: pairs (2i, 2i+1) rotate by angle pos * inv_freq[i] (DeepSeek's native layout,
// config rope_interleave = true). HalfSplit: pairs (i, i + D/2) (HF rotate_half layout).
// HF's apply_rotary_pos_emb_interleave rotates the interleaved pairs and writes the result
// de-interleaved (evens' results, then odds' results: half-split order). q and k get the same
// permutation, so every q.k dot product equals the one of the plain Interleaved rotation done
// here, which keeps the pairs in place.
enum class RopeLayout { Interleaved, HalfSplit };

// x: rows of N tokens x H heads; the rotated slice of head h of token n starts at
// x + n*stride_tok + h*stride_head and is D wide (D even). pos: [N] positions (row index into
// the tables, 0 <= pos). cos, sin: [max_pos, D/2] from rope_tables.
// Forward: (a, b) -> (a*c - b*s, b*c + a*s); inverse: (a, b) -> (a*c + b*s, b*c - a*s).
// In place; other elements of x are not touched.
void rope_apply(float* x, int64_t N, int H, int64_t stride_tok, int64_t stride_head, int D, const int32_t* pos,
                const float* cos, const float* sin, RopeLayout layout, bool inverse);

}  // namespace trex::kern
