// AVX-512 loops of the mHC kernels (kernels/hyper_conn.h): the per-token passes over the n
// streams (dots, the collapse, the post mixing and its backward), the pre step's forward
// projection and input gradient, and the coefficients of 4 streams 16 tokens at a time. kernels/hyper_conn.cpp calls them on CPUs with AVX-512 and
// keeps its baseline loops elsewhere; the other projections stay on kern::gemm_f32.
// Dots sum 16 lanes (lane l holds the elements i = l mod 16) and add the lanes in a fixed order,
// as the baseline loops do; sums over the streams run in stream order; every product and sum is
// rounded on its own (no fused multiply-add), as in the baseline build. So the outputs are the
// baseline loops' bits, and depend only on the token's data (not on the thread count).
#pragma once
#include <cstdint>

namespace trex::kern::cpu {

// sum_i a[i] * b[i], i < len
float hc_dot_avx512(const float* a, const float* b, int64_t len);

// out[j] = a . x[j d .. (j + 1) d) for j < n: one pass over a and the n streams x [n, d]. x_next
// (may be null) [n, d] and a_next [d]: the next token's, fetched into L2 on the way.
void hc_dots_avx512(int n, int64_t d, const float* a, const float* x, float* out, const float* a_next = nullptr,
                    const float* x_next = nullptr);

// y [d] = sum_j w[j] * x[j d + i] (x [n, d]; stream order)
void hc_collapse_avx512(int n, int64_t d, const float* w, const float* x, float* y);

// The pre step's projection for tc tokens (the one loop here with fused multiply-adds, as the
// sgemm it replaces; the baseline keeps the sgemm): mix [tc, R] = x [tc, K] @ fn^T, fn [R, K],
// rows of stride K. Each output sums 16 lanes (lane l: the elements i = l mod 16) in K order and
// adds the lanes in hsum's fixed order: bits that depend on the token's data only, the same with
// fn packed or not. Tiles of 4 tokens and kHcProjTile outputs run over all of K; the 4 tokens'
// rows are read once from memory and then from L2. packed: fn as hc_pack_proj_avx512 lays it out
// (each tile's rows then come in one stream; fn's own rows, 16 KiB apart at K = 4096, share L1
// sets); worth it from a few dozen tokens on.
constexpr int kHcProjTile = 6;
void hc_project_avx512(int R, int64_t K, int64_t tc, const float* x, const float* fn, float* mix, bool packed = false);
// fn [R, K] -> packed [hc_pack_proj_floats(R, K)] (best 64-byte aligned): for each tile of
// kHcProjTile rows (the last may be shorter), the rows' 16-column groups side by side (zeros past K).
int64_t hc_pack_proj_floats(int R, int64_t K);
void hc_pack_proj_avx512(int R, int64_t K, const float* fn, float* packed);

// The pre step's (and the head's) input gradient for tc tokens, one pass over each token's rows:
//   dx_t (+)= dmixs_t @ fn + pre_t (x) dy_t - cx_t * x_t
// dmixs: [tc, R]  fn_packed: fn [R, K] as hc_pack_fn_avx512 lays it out  pre: [tc, n]  cx: [tc]
// dy: [tc, d] (null: no pre term)  x, dx: [tc, K] (K = n d). accumulate: dx's old value is added
// first (else overwritten). The projection term sums its R products in q order with fused
// multiply-adds, then dx + (p dy - c x) (no dy: dx - c x) is formed as the baseline's dx update
// does: each token's bits depend on its own data only.
// dfn_part (may be null): the projection's weight gradient laid out as fn_packed, += dmixs^T x
// over these tokens while their rows are in L1, each element summed over the tokens in order with
// fused multiply-adds. Column blocks run outer, 8-token tiles inner, so a block's partial stays in
// L1 across the tiles (a separate pass over [R, K] partials read x again, its rows 16 KiB apart
// sharing L1 sets: 8192 tokens, n = 4, d = 1024, 2 Zen 5 threads: hc_pre_bwd 20.2 -> 18.7 ms).
void hc_pre_dx_avx512(int n, int R, int64_t d, int64_t tc, const float* dmixs, const float* fn_packed,
                      const float* pre, const float* cx, const float* dy, const float* x, float* dx, bool accumulate,
                      float* dfn_part = nullptr);
// fn [R, K] -> packed [hc_pack_fn_floats(n, R, d)] (best 64-byte aligned): for each stream j and block
// of 32 columns of it, the block's R rows of 32 floats side by side (zeros past d), so a tile reads
// 3 KiB in a row (fn's rows, 16 KiB apart at d = 1024, share L1 sets).
int64_t hc_pack_fn_floats(int n, int R, int64_t d);
void hc_pack_fn_avx512(int n, int R, int64_t d, const float* fn, float* packed);

// The per-token coefficient math of kernels/hd/hyper_conn.h for n = 4 streams, 16 tokens at a
// time (one token per lane): the operations of hd::hc_coeffs_fwd_n<float, 4> /
// hc_coeffs_bwd_n<float, 4> in their order, each exp by std::exp on its lane, no fused
// multiply-add, so the outputs are theirs bit for bit. Arrays are token-major as there (token t
// at mix + t R, post + t 4, comb / dcomb + t 16, dz + t R, R = 24); tc <= 16 tokens.
constexpr int kHcLanes = 16;
// -> pre, post: [tc, 4]  comb: [tc, 16]
void hc_coeffs4_fwd_avx512(int iters, float eps, int64_t tc, const float* mix, const float* base, const float* scale,
                           float* pre, float* post, float* comb);
// dpre: [tc, 4] (null: zero)  dpost: [tc, 4] (null)  dcomb: [tc, 16] (null) -> dz: [tc, R]; pre:
// [tc, 4] (may be null) gets the forward pre. scratch: [hc_coeffs4_scratch_floats(iters)], 64-byte aligned.
void hc_coeffs4_bwd_avx512(int iters, float eps, int64_t tc, const float* mix, const float* base, const float* scale,
                           const float* dpre, const float* dpost, const float* dcomb, float* dz, float* pre,
                           float* scratch);
int64_t hc_coeffs4_scratch_floats(int iters);

// Tokens [t0, t1) of hc_post_fwd: out_k = post[k] f + sum_j comb[j][k] x_j.
void hc_post_fwd_avx512(int n, int64_t d, int64_t t0, int64_t t1, const float* x, const float* f, const float* post,
                        const float* comb, float* out);

// Tokens [t0, t1) of hc_post_bwd: df = sum_k post[k] g_k; dx_j = sum_k comb[j][k] g_k;
// dpost[k] = g_k . f; dcomb[j][k] = g_k . x_j (g = dout).
void hc_post_bwd_avx512(int n, int64_t d, int64_t t0, int64_t t1, const float* x, const float* f, const float* post,
                        const float* comb, const float* dout, float* dx, float* df, float* dpost, float* dcomb);

}  // namespace trex::kern::cpu
