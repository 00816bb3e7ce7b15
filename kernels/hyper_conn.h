// DeepSeek-V4 manifold-constrained hyper-connections (mHC) in fp32, forward and exact backward,
// matching Hugging Face transformers' DeepseekV4HyperConnection (pre step: RMSNorm of the
// flattened streams, projection, sigmoid / Sinkhorn coefficients, collapse), the post mixing of
// DeepseekV4DecoderLayer.forward, and DeepseekV4HyperHead. The formulas are spelled out in
// kernels/ref/hyper_conn.h (the canonical scalar reference).
// n = hc_mult streams, d = hidden, K = n*d, R = (2+n)*n; comb[j][k] is the Sinkhorn output and
// the post step uses it transposed: out[k] = post[k] * f + sum_j comb[j][k] * x[j].
// Gradients: parameter gradients (dfn, dbase, dscale) ACCUMULATE (+=). Activation gradients
// OVERWRITE, except hc_pre_bwd's dx, which ACCUMULATES (so the pre branch and the post step of
// one layer can add into the same residual-stream gradient).
// Determinism: every output is bitwise independent of the thread count (token chunks depend
// only on the shape; parameter gradients are reduced in a fixed order).
#pragma once
#include <cstddef>
#include <cstdint>

namespace trex::kern {

constexpr int kHcMaxStreams = 64;  // largest hc_mult the kernels accept

struct HcShape {
  int64_t N;       // tokens
  int n;           // hc_mult (1 <= n <= kHcMaxStreams)
  int64_t d;       // hidden size
  int iters;       // hc_sinkhorn_iters (>= 1)
  float hc_eps;    // hc_eps
  float norm_eps;  // rms_norm_eps of the unweighted RMSNorm
  // Generation: each token's projection independent of the other tokens (the baseline's sgemm
  // takes kern::gemm_rows_invariant; the AVX-512 loop is per token already).
  bool rows_invariant = false;
};

// x: [N, n, d]  fn: [R, K]  base: [R]  scale: [3]
// -> y: [N, d] (block input)  post: [N, n]  comb: [N, n, n] (comb[j][k])
//    mix: [N, R] normalized projections (saved for backward)  rstd: [N] (saved)
void hc_pre_fwd(const HcShape& s, const float* x, const float* fn, const float* base, const float* scale, float* y,
                float* post, float* comb, float* mix, float* rstd);

// dy: [N, d]  dpost: [N, n]  dcomb: [N, n, n] (each may be null = zero); x, fn, base, scale,
// mix, rstd as in hc_pre_fwd; workspace: [hc_pre_bwd_workspace_floats(s)]
// -> dx: [N, n, d] (+=)  dfn: [R, K] (+=)  dbase: [R] (+=)  dscale: [3] (+=)
void hc_pre_bwd(const HcShape& s, const float* x, const float* fn, const float* base, const float* scale,
                const float* mix, const float* rstd, const float* dy, const float* dpost, const float* dcomb,
                float* dx, float* dfn, float* dbase, float* dscale, float* workspace);
size_t hc_pre_bwd_workspace_floats(const HcShape& s);

// The post step that feeds a pre step (a decoder layer's attention post step feeds its MoE pre
// step): hc_post_bwd's arguments, its dout left out.
struct HcPostBwd {
  const float *x, *f, *post, *comb;
  float *dx, *df, *dpost, *dcomb;
};
// hc_pre_bwd, then hc_post_bwd(next) with dout = the dx hc_pre_bwd leaves (dx's old value plus
// the pre step's gradient): the same bits as the two calls. dx is read and left as it was: each
// chunk of tokens sums into a scratch of its own thread, still in cache when the post step reads
// it, which saves writing dx and reading it back (2 N n d floats of memory traffic). next.dpost /
// next.dcomb may be dpost / dcomb themselves (each chunk reads its tokens' before writing them).
void hc_pre_bwd_then_post(const HcShape& s, const float* x, const float* fn, const float* base, const float* scale,
                          const float* mix, const float* rstd, const float* dy, const float* dpost, const float* dcomb,
                          const float* dx, float* dfn, float* dbase, float* dscale, float* workspace,
                          const HcPostBwd& next);

// x: [N, n, d]  f: [N, d]  post: [N, n]  comb: [N, n, n] -> out: [N, n, d] (must not alias x)
void hc_post_fwd(const HcShape& s, const float* x, const float* f, const float* post, const float* comb,
                 float* out);

// dout: [N, n, d] -> dx: [N, n, d]  df: [N, d]  dpost: [N, n]  dcomb: [N, n, n] (all OVERWRITE)
void hc_post_bwd(const HcShape& s, const float* x, const float* f, const float* post, const float* comb,
                 const float* dout, float* dx, float* df, float* dpost, float* dcomb);

// x: [N, n, d]  hc_fn: [n, K]  hc_base: [n]  hc_scale: [1] -> y: [N, d]; mix: [N, n], rstd: [N] saved.
// (s.iters is not used.)
void hc_head_fwd(const HcShape& s, const float* x, const float* hc_fn, const float* hc_base, const float* hc_scale,
                 float* y, float* mix, float* rstd);

// dy: [N, d]; workspace: [hc_head_bwd_workspace_floats(s)]
// -> dx: [N, n, d] (OVERWRITE)  dfn: [n, K] (+=)  dbase: [n] (+=)  dscale: [1] (+=)
void hc_head_bwd(const HcShape& s, const float* x, const float* hc_fn, const float* hc_base, const float* hc_scale,
                 const float* mix, const float* rstd, const float* dy, float* dx, float* dfn, float* dbase,
                 float* dscale, float* workspace);
size_t hc_head_bwd_workspace_floats(const HcShape& s);

}  // namespace trex::kern
