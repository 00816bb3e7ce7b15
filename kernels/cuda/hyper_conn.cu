// DeepSeek-V4 hyper-connections on the GPU (kernels/hyper_conn.h): the projections x @ fn^T and
// their two backward products are f32 cuBLASLt GEMMs (kernels/cuda/gemm.cu); one block per token
// computes the token's RMS, its sigmoid / Sinkhorn coefficients (kernels/hd/hyper_conn.h, the
// functions the CPU runs) and the collapse; elementwise kernels do the post step. Parameter
// gradients are reduced in a fixed order: dfn by a GEMM over all tokens, dbase and dscale by one
// block per projection summing the tokens in a fixed partition (in double), then the groups in
// projection order, so results do not depend on anything but the shape.
#include <algorithm>
#include "kernels/cuda/check.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/hd/hyper_conn.h"

namespace trex::kern::cuda {

namespace {

constexpr int kThreads = 256;

// One block per token: rstd = 1/sqrt(mean(x^2) + eps), mix *= rstd, the coefficients (pre step:
// Sinkhorn, post and comb written; head: the sigmoids only), then y = sum_j pre[j] x[j].
__global__ void hc_token_fwd_k(HcShape s, bool head, const float* __restrict__ x, const float* __restrict__ base,
                               const float* __restrict__ scale, float* __restrict__ y, float* __restrict__ post,
                               float* __restrict__ comb, float* __restrict__ mix, float* __restrict__ rstd) {
  __shared__ float pre[kHcMaxStreams];
  const int n = s.n, R = head ? n : (2 + n) * n;
  const int64_t t = blockIdx.x, d = s.d, K = n * d;
  const float* xt = x + t * K;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < K; i += blockDim.x) ss += xt[i] * xt[i];
  ss = block_sum(ss);
  const float r = 1.f / sqrtf(ss / static_cast<float>(K) + s.norm_eps);
  float* m = mix + t * R;
  __syncthreads();
  if (threadIdx.x == 0) {
    rstd[t] = r;
    for (int q = 0; q < R; ++q) m[q] *= r;
    if (head) {
      for (int j = 0; j < n; ++j) pre[j] = hd::hc_sigmoid(m[j] * scale[0] + base[j]) + s.hc_eps;
    } else {
      hd::hc_coeffs_fwd<float>(n, s.iters, s.hc_eps, m, base, scale, pre, post + t * n, comb + t * n * n, nullptr);
    }
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    float a = pre[0] * xt[i];
    for (int j = 1; j < n; ++j) a += pre[j] * xt[j * d + i];
    y[t * d + i] = a;
  }
}

// One block per token of the pre step's backward: dpre[j] = dy . x_j, the coefficients' backward
// (hd::hc_coeffs_bwd) -> dz [R], pre [n]; dmixs = dz * scale * rstd and the RMSNorm's x coefficient cx.
__global__ void hc_pre_token_bwd_k(HcShape s, const float* __restrict__ x, const float* __restrict__ base,
                                   const float* __restrict__ scale, const float* __restrict__ mix,
                                   const float* __restrict__ rstd, const float* __restrict__ dy,
                                   const float* __restrict__ dpost, const float* __restrict__ dcomb,
                                   float* __restrict__ dz, float* __restrict__ dmixs, float* __restrict__ pre,
                                   float* __restrict__ cx, float* __restrict__ scratch, size_t cs) {
  __shared__ float dpre[kHcMaxStreams];
  const int n = s.n, R = (2 + n) * n;
  const int64_t t = blockIdx.x, d = s.d, K = n * d;
  const float* xt = x + t * K;
  for (int j = 0; j < n; ++j) {
    float a = 0.f;
    if (dy)
      for (int64_t i = threadIdx.x; i < d; i += blockDim.x) a += dy[t * d + i] * xt[j * d + i];
    a = block_sum(a);
    if (threadIdx.x == 0) dpre[j] = a;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  const float* m = mix + t * R;
  float* z = dz + t * R;
  hd::hc_coeffs_bwd<float>(n, s.iters, s.hc_eps, m, base, scale, dpre, dpost ? dpost + t * n : nullptr,
                           dcomb ? dcomb + t * n * n : nullptr, z, pre + t * n, scratch + t * cs);
  const float r = rstd[t];
  float dm = 0.f;
  for (int q = 0; q < R; ++q) {
    const float dmq = z[q] * scale[min(q / n, 2)];
    dmixs[t * R + q] = dmq * r;
    dm += dmq * m[q];
  }
  cx[t] = r * r * dm / static_cast<float>(K);
}

// The head's per-token backward: dz[j] = (dy . x_j) sg (1 - sg), pre, dmixs, cx.
__global__ void hc_head_token_bwd_k(HcShape s, const float* __restrict__ x, const float* __restrict__ base,
                                    const float* __restrict__ scale, const float* __restrict__ mix,
                                    const float* __restrict__ rstd, const float* __restrict__ dy,
                                    float* __restrict__ dz, float* __restrict__ dmixs, float* __restrict__ pre,
                                    float* __restrict__ cx) {
  __shared__ float dots[kHcMaxStreams];
  const int n = s.n;
  const int64_t t = blockIdx.x, d = s.d, K = n * d;
  const float* xt = x + t * K;
  for (int j = 0; j < n; ++j) {
    float a = 0.f;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) a += dy[t * d + i] * xt[j * d + i];
    a = block_sum(a);
    if (threadIdx.x == 0) dots[j] = a;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  const float r = rstd[t];
  float dm = 0.f;
  for (int j = 0; j < n; ++j) {
    const float mj = mix[t * n + j];
    const float sg = hd::hc_sigmoid(mj * scale[0] + base[j]);
    pre[t * n + j] = sg + s.hc_eps;
    const float z = dots[j] * sg * (1.f - sg);
    dz[t * n + j] = z;
    dmixs[t * n + j] = z * scale[0] * r;
    dm += z * scale[0] * mj;
  }
  cx[t] = r * r * dm / static_cast<float>(K);
}

// dx[t, j, i] += pre[t, j] dy[t, i] - cx[t] x[t, j, i]   (dy null: only the second term)
__global__ void hc_dx_k(HcShape s, const float* __restrict__ x, const float* __restrict__ dy,
                        const float* __restrict__ pre, const float* __restrict__ cx, float* __restrict__ dx) {
  const int64_t n = s.n, d = s.d, total = s.N * n * d;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t t = e / (n * d), j = (e / d) % n, i = e % d;
    if (dy)
      dx[e] += pre[t * n + j] * dy[t * d + i] - cx[t] * x[e];
    else
      dx[e] -= cx[t] * x[e];
  }
}

// One block per projection q: dbase[q] += sum_t dz[t, q]; part[q] = sum_t dz[t, q] mix[t, q].
__global__ void hc_base_k(int64_t N, int R, const float* __restrict__ dz, const float* __restrict__ mix,
                          float* __restrict__ dbase, double* __restrict__ part) {
  const int q = blockIdx.x;
  double b = 0, sc = 0;
  for (int64_t t = threadIdx.x; t < N; t += blockDim.x) {
    b += dz[t * R + q];
    sc += static_cast<double>(dz[t * R + q]) * mix[t * R + q];
  }
  b = block_sum(b);
  sc = block_sum(sc);
  if (threadIdx.x == 0) {
    dbase[q] += static_cast<float>(b);
    part[q] = sc;
  }
}

// dscale[g] += sum of part over group g's projections, in projection order.
__global__ void hc_scale_k(int n, int R, int ngroups, const double* __restrict__ part, float* __restrict__ dscale) {
  double ds[3] = {0, 0, 0};
  for (int q = 0; q < R; ++q) ds[min(q / n, ngroups - 1)] += part[q];
  for (int g = 0; g < ngroups; ++g) dscale[g] += static_cast<float>(ds[g]);
}

__global__ void hc_post_fwd_k(HcShape s, const float* __restrict__ x, const float* __restrict__ f,
                              const float* __restrict__ post, const float* __restrict__ comb, float* __restrict__ out) {
  const int64_t n = s.n, d = s.d, total = s.N * n * d;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t t = e / (n * d), k = (e / d) % n, i = e % d;
    const float* xt = x + t * n * d;
    const float* cm = comb + t * n * n;
    float o = post[t * n + k] * f[t * d + i];
    for (int64_t j = 0; j < n; ++j) o += cm[j * n + k] * xt[j * d + i];
    out[e] = o;
  }
}

// Per (t, i): df[t, i] = sum_k post[t, k] dout[t, k, i]; dx[t, j, i] = sum_k comb[t, j, k] dout[t, k, i].
__global__ void hc_post_bwd_rows_k(HcShape s, const float* __restrict__ post, const float* __restrict__ comb,
                                   const float* __restrict__ dout, float* __restrict__ dx, float* __restrict__ df) {
  const int64_t n = s.n, d = s.d, total = s.N * d;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t t = e / d, i = e % d;
    const float* go = dout + t * n * d;
    const float* cm = comb + t * n * n;
    float a = post[t * n] * go[i];
    for (int64_t k = 1; k < n; ++k) a += post[t * n + k] * go[k * d + i];
    df[e] = a;
    for (int64_t j = 0; j < n; ++j) {
      float b = cm[j * n] * go[i];
      for (int64_t k = 1; k < n; ++k) b += cm[j * n + k] * go[k * d + i];
      dx[(t * n + j) * d + i] = b;
    }
  }
}

// One block per token: dpost[t, k] = dout_k . f; dcomb[t, j, k] = dout_k . x_j.
__global__ void hc_post_bwd_dots_k(HcShape s, const float* __restrict__ x, const float* __restrict__ f,
                                   const float* __restrict__ dout, float* __restrict__ dpost,
                                   float* __restrict__ dcomb) {
  const int n = s.n;
  const int64_t t = blockIdx.x, d = s.d;
  const float* go = dout + t * n * d;
  const float* xt = x + t * n * d;
  for (int k = 0; k < n; ++k) {
    float a = 0.f;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) a += go[k * d + i] * f[t * d + i];
    a = block_sum(a);
    if (threadIdx.x == 0) dpost[t * n + k] = a;
    for (int j = 0; j < n; ++j) {
      float b = 0.f;
      for (int64_t i = threadIdx.x; i < d; i += blockDim.x) b += go[k * d + i] * xt[j * d + i];
      b = block_sum(b);
      if (threadIdx.x == 0) dcomb[(t * n + j) * n + k] = b;
    }
  }
}

void check(const HcShape& s, const char* fn) {
  TREX_CHECK(s.N >= 0 && s.n >= 1 && s.n <= kHcMaxStreams && s.d >= 1, fn, ": N=", s.N, " n=", s.n, " d=", s.d);
}

// dfn += dmixs^T x (one GEMM over all tokens), dbase / dscale from dz.
void param_grads(const Ctx& c, const HcShape& s, int R, int ngroups, const float* dz, const float* dmixs,
                 const float* mix, const float* x, float* dfn, float* dbase, float* dscale) {
  const int64_t K = s.n * s.d;
  gemm(c, Prec::F32, Prec::F32, true, false, R, K, s.N, 1.f, dmixs, R, x, K, 1.f, dfn, K);
  Scratch part(c, R * sizeof(double));
  hc_base_k<<<R, kThreads, 0, c.stream>>>(s.N, R, dz, mix, dbase, part.as<double>());
  TREX_CUDA_LAUNCHED("hc_base_k");
  hc_scale_k<<<1, 1, 0, c.stream>>>(s.n, R, ngroups, part.as<double>(), dscale);
  TREX_CUDA_LAUNCHED("hc_scale_k");
}

}  // namespace

void hc_pre_fwd(const Ctx& c, const HcShape& s, const float* x, const float* fn, const float* base, const float* scale,
                float* y, float* post, float* comb, float* mix, float* rstd) {
  check(s, "hc_pre_fwd");
  TREX_CHECK(s.iters >= 1, "hc_pre_fwd: iters=", s.iters);
  if (s.N == 0) return;
  const int n = s.n, R = (2 + n) * n;
  const int64_t K = n * s.d;
  gemm(c, Prec::F32, Prec::F32, false, true, s.N, R, K, 1.f, x, K, fn, K, 0.f, mix, R);
  hc_token_fwd_k<<<(unsigned)s.N, kThreads, 0, c.stream>>>(s, false, x, base, scale, y, post, comb, mix, rstd);
  TREX_CUDA_LAUNCHED("hc_token_fwd_k");
}

void hc_pre_bwd(const Ctx& c, const HcShape& s, const float* x, const float* fn, const float* base, const float* scale,
                const float* mix, const float* rstd, const float* dy, const float* dpost, const float* dcomb, float* dx,
                float* dfn, float* dbase, float* dscale, float* workspace) {
  check(s, "hc_pre_bwd");
  TREX_CHECK(s.iters >= 1, "hc_pre_bwd: iters=", s.iters);
  if (s.N == 0) return;
  const int n = s.n, R = (2 + n) * n;
  const int64_t N = s.N, K = n * s.d;
  // The workspace's layout as the CPU's (kernels/hyper_conn.cpp); the Sinkhorn history of every
  // token in scratch of its own.
  float* dz = workspace;
  float* dmixs = dz + N * R;
  float* pre = dmixs + N * R;
  float* cx = pre + N * n;
  const size_t cs = hd::hc_coeffs_scratch(n, s.iters);
  Scratch hist(c, N * cs * sizeof(float));
  hc_pre_token_bwd_k<<<(unsigned)N, kThreads, 0, c.stream>>>(s, x, base, scale, mix, rstd, dy, dpost, dcomb, dz,
                                                              dmixs, pre, cx, hist.as<float>(), cs);
  TREX_CUDA_LAUNCHED("hc_pre_token_bwd_k");
  gemm(c, Prec::F32, Prec::F32, false, false, N, K, R, 1.f, dmixs, R, fn, K, 1.f, dx, K);
  hc_dx_k<<<grid_for(N * K), kThreads, 0, c.stream>>>(s, x, dy, pre, cx, dx);
  TREX_CUDA_LAUNCHED("hc_dx_k");
  param_grads(c, s, R, 3, dz, dmixs, mix, x, dfn, dbase, dscale);
}

void hc_post_fwd(const Ctx& c, const HcShape& s, const float* x, const float* f, const float* post, const float* comb,
                 float* out) {
  check(s, "hc_post_fwd");
  TREX_CHECK(out != x, "hc_post_fwd: out must not alias x");
  if (s.N == 0) return;
  hc_post_fwd_k<<<grid_for(s.N * s.n * s.d), kThreads, 0, c.stream>>>(s, x, f, post, comb, out);
  TREX_CUDA_LAUNCHED("hc_post_fwd_k");
}

void hc_post_bwd(const Ctx& c, const HcShape& s, const float* x, const float* f, const float* post, const float* comb,
                 const float* dout, float* dx, float* df, float* dpost, float* dcomb) {
  check(s, "hc_post_bwd");
  if (s.N == 0) return;
  hc_post_bwd_rows_k<<<grid_for(s.N * s.d), kThreads, 0, c.stream>>>(s, post, comb, dout, dx, df);
  TREX_CUDA_LAUNCHED("hc_post_bwd_rows_k");
  hc_post_bwd_dots_k<<<(unsigned)s.N, kThreads, 0, c.stream>>>(s, x, f, dout, dpost, dcomb);
  TREX_CUDA_LAUNCHED("hc_post_bwd_dots_k");
}

void hc_head_fwd(const Ctx& c, const HcShape& s, const float* x, const float* hc_fn, const float* hc_base,
                 const float* hc_scale, float* y, float* mix, float* rstd) {
  check(s, "hc_head_fwd");
  if (s.N == 0) return;
  const int64_t K = s.n * s.d;
  gemm(c, Prec::F32, Prec::F32, false, true, s.N, s.n, K, 1.f, x, K, hc_fn, K, 0.f, mix, s.n);
  hc_token_fwd_k<<<(unsigned)s.N, kThreads, 0, c.stream>>>(s, true, x, hc_base, hc_scale, y, nullptr, nullptr, mix,
                                                            rstd);
  TREX_CUDA_LAUNCHED("hc_token_fwd_k");
}

void hc_head_bwd(const Ctx& c, const HcShape& s, const float* x, const float* hc_fn, const float* hc_base,
                 const float* hc_scale, const float* mix, const float* rstd, const float* dy, float* dx, float* dfn,
                 float* dbase, float* dscale, float* workspace) {
  check(s, "hc_head_bwd");
  if (s.N == 0) return;
  const int n = s.n;
  const int64_t N = s.N, K = n * s.d;
  float* dz = workspace;
  float* dmixs = dz + N * n;
  float* pre = dmixs + N * n;
  float* cx = pre + N * n;
  hc_head_token_bwd_k<<<(unsigned)N, kThreads, 0, c.stream>>>(s, x, hc_base, hc_scale, mix, rstd, dy, dz, dmixs, pre,
                                                               cx);
  TREX_CUDA_LAUNCHED("hc_head_token_bwd_k");
  gemm(c, Prec::F32, Prec::F32, false, false, N, K, n, 1.f, dmixs, n, hc_fn, K, 0.f, dx, K);
  hc_dx_k<<<grid_for(N * K), kThreads, 0, c.stream>>>(s, x, dy, pre, cx, dx);
  TREX_CUDA_LAUNCHED("hc_dx_k");
  param_grads(c, s, n, 1, dz, dmixs, mix, x, dfn, dbase, dscale);
}

}  // namespace trex::kern::cuda
