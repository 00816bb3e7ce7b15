// AVX-512 loops of the mHC kernels (kernels/hyper_conn.h): the per-token passes over the n
// streams (dots, the collapse, the post mixing and its backward, the pre step's dx update) and
// the pre step's forward projection. kernels/hyper_conn.cpp calls them on CPUs with AVX-512 and
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

// out[j] = a . x[j d .. (j + 1) d) for j < n: one pass over a and the n streams x [n, d]
void hc_dots_avx512(int n, int64_t d, const float* a, const float* x, float* out);

// y [d] = sum_j w[j] * x[j d + i] (x [n, d]; stream order)
void hc_collapse_avx512(int n, int64_t d, const float* w, const float* x, float* y);

// One token of the pre step's backward: dx_j += p[j] * dy - c * x_j for j < n (dy null: -c x_j
// only). x, dx: [n, d], dy: [d].
void hc_dx_update_avx512(int n, int64_t d, const float* p, float c, const float* dy, const float* x, float* dx);

// The pre step's projection for tc tokens (the one loop here with fused multiply-adds, as the
// sgemm it replaces; the baseline keeps the sgemm): mix [tc, R] = x [tc, K] @ fn^T, fn [R, K],
// rows of stride K. Each output sums 16 lanes (lane l: the elements i = l mod 16) in K order and
// adds the lanes in hsum's fixed order: bits that depend on the token's data only.
void hc_project_avx512(int R, int64_t K, int64_t tc, const float* x, const float* fn, float* mix);

// Tokens [t0, t1) of hc_post_fwd: out_k = post[k] f + sum_j comb[j][k] x_j.
void hc_post_fwd_avx512(int n, int64_t d, int64_t t0, int64_t t1, const float* x, const float* f, const float* post,
                        const float* comb, float* out);

// Tokens [t0, t1) of hc_post_bwd: df = sum_k post[k] g_k; dx_j = sum_k comb[j][k] g_k;
// dpost[k] = g_k . f; dcomb[j][k] = g_k . x_j (g = dout).
void hc_post_bwd_avx512(int n, int64_t d, int64_t t0, int64_t t1, const float* x, const float* f, const float* post,
                        const float* comb, const float* dout, float* dx, float* df, float* dpost, float* dcomb);

}  // namespace trex::kern::cpu
