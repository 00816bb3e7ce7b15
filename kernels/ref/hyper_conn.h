// Scalar reference for DeepSeek-V4 manifold-constrained hyper-connections (mHC), the canonical
// definition (Hugging Face DeepseekV4HyperConnection / DeepseekV4HyperHead / the post mixing in
// DeepseekV4DecoderLayer.forward, all in fp32 there). n = hc_mult streams (<= kHcMaxStreams),
// d = hidden, K = n*d, R = (2+n)*n. Per token t with streams x_t: [n, d], flat = x_t as [K]:
//   rstd     = 1 / sqrt(mean(flat^2) + norm_eps)                   (unweighted RMSNorm)
//   mix[q]   = sum_i (flat[i] * rstd) * fn[q, i]                   q < R (head: q < n)
//   pre[j]   = sigmoid(mix[j] * scale[0] + base[j]) + hc_eps
//   post[j]  = 2 * sigmoid(mix[n+j] * scale[1] + base[n+j])
//   comb     = softmax_k(mix[2n + j*n + k] * scale[2] + base[2n + j*n + k]) + hc_eps
//   comb     = colnorm(comb); then (iters-1) x { comb = rownorm(comb); comb = colnorm(comb) }
//              rownorm: c[j][k] /= (sum_k c[j][k] + hc_eps); colnorm: c[j][k] /= (sum_j c[j][k] + hc_eps)
//   y[i]     = sum_j pre[j] * x_t[j, i]                              (block input)
//   post step: out[k, i] = post[k] * f[i] + sum_j comb[j][k] * x_t[j, i]
//   head:    pre[j] = sigmoid(mix[j] * hc_scale[0] + hc_base[j]) + hc_eps; y = sum_j pre[j] x_t[j]
// Backward is exactly what autograd computes through these formulas (Sinkhorn through every
// iteration, the +hc_eps in every denominator included).
// Gradients: parameter gradients (dfn, dbase, dscale) ACCUMULATE (+=); activation gradients
// OVERWRITE, except hc_pre_bwd's dx, which ACCUMULATES (the residual stream's gradient is
// summed from the pre branch and the post step of the same layer).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#include "kernels/hd/hyper_conn.h"
#include "kernels/hyper_conn.h"

namespace trex::kern::ref {

// The per-token coefficient math (hc_sigmoid, hc_coeffs_scratch, hc_coeffs_fwd, hc_coeffs_bwd) is
// kernels/hd/hyper_conn.h, which the CUDA kernels run too.
using hd::hc_coeffs_bwd;
using hd::hc_coeffs_fwd;
using hd::hc_coeffs_scratch;
using hd::hc_sigmoid;

// Adds one token's parameter gradients from dz: dmix[q] = dz[q] * scale[g(q)] (written),
// dbase[q] += dz[q], dscale[g] += sum_{q in g} dz[q] * mix[q]. R = (2+n)n (ngroups = 3) or
// n (head, ngroups = 1).
template <class T>
void hc_dz_to_dmix(int n, int ngroups, const T* dz, const T* mix, const T* scale, T* dmix, T* dbase, T* dscale) {
  for (int g = 0; g < ngroups; ++g) {
    const int q0 = g * n, q1 = g < 2 ? (g + 1) * n : (2 + n) * n;
    T ds = 0;
    for (int q = q0; q < q1; ++q) {
      dmix[q] = dz[q] * scale[g];
      if (dbase) dbase[q] += dz[q];
      ds += dz[q] * mix[q];
    }
    if (dscale) dscale[g] += ds;
  }
}

// Shared forward projection: x_t: [K] -> rstd (returned), mix: [R] = (x_t * rstd) @ fn^T.
template <class T>
T hc_project(int64_t K, int R, T norm_eps, const T* xt, const T* fn, T* mix) {
  T ss = 0;
  for (int64_t i = 0; i < K; ++i) ss += xt[i] * xt[i];
  const T r = T(1) / std::sqrt(ss / static_cast<T>(K) + norm_eps);
  for (int q = 0; q < R; ++q) {
    T s = 0;
    for (int64_t i = 0; i < K; ++i) s += (xt[i] * r) * fn[q * K + i];
    mix[q] = s;
  }
  return r;
}

// Shared backward of the projection and RMSNorm for one token:
// dmix: [R] -> dx_t: [K] (+=), dfn: [R, K] (+=). xhat = x*rstd, g = dmix @ fn,
// dx += rstd * (g - xhat * sum(g*xhat) / K).
template <class T>
void hc_project_bwd(int64_t K, int R, const T* xt, const T* fn, T r, const T* dmix, T* dxt, T* dfn) {
  std::vector<T> g(K, T(0));
  for (int q = 0; q < R; ++q)
    for (int64_t i = 0; i < K; ++i) g[i] += dmix[q] * fn[q * K + i];
  T gx = 0;
  for (int64_t i = 0; i < K; ++i) gx += g[i] * (xt[i] * r);
  const T m = gx / static_cast<T>(K);
  for (int64_t i = 0; i < K; ++i) dxt[i] += r * (g[i] - (xt[i] * r) * m);
  for (int q = 0; q < R; ++q)
    for (int64_t i = 0; i < K; ++i) dfn[q * K + i] += dmix[q] * (xt[i] * r);
}

// x: [N, n, d]  fn: [R, K]  base: [R]  scale: [3] -> y: [N, d]  post: [N, n]  comb: [N, n, n]
// mix: [N, R]  rstd: [N]
template <class T>
void hc_pre_fwd(const HcShape& s, const T* x, const T* fn, const T* base, const T* scale, T* y, T* post, T* comb,
                T* mix, T* rstd) {
  const int n = s.n;
  const int64_t d = s.d, K = n * d;
  const int R = (2 + n) * n;
  std::vector<T> pre(n);
  for (int64_t t = 0; t < s.N; ++t) {
    const T* xt = x + t * K;
    rstd[t] = hc_project<T>(K, R, static_cast<T>(s.norm_eps), xt, fn, mix + t * R);
    hc_coeffs_fwd<T>(n, s.iters, static_cast<T>(s.hc_eps), mix + t * R, base, scale, pre.data(), post + t * n,
                     comb + t * n * n, nullptr);
    for (int64_t i = 0; i < d; ++i) {
      T a = 0;
      for (int j = 0; j < n; ++j) a += pre[j] * xt[j * d + i];
      y[t * d + i] = a;
    }
  }
}

// dy: [N, d]  dpost: [N, n]  dcomb: [N, n, n] (each may be null = zero) -> dx: [N, n, d] (+=)
// dfn: [R, K] (+=)  dbase: [R] (+=)  dscale: [3] (+=)
template <class T>
void hc_pre_bwd(const HcShape& s, const T* x, const T* fn, const T* base, const T* scale, const T* mix,
                const T* rstd, const T* dy, const T* dpost, const T* dcomb, T* dx, T* dfn, T* dbase, T* dscale) {
  const int n = s.n;
  const int64_t d = s.d, K = n * d;
  const int R = (2 + n) * n;
  std::vector<T> pre(n), dpre(n), dz(R), dmix(R), scratch(hc_coeffs_scratch(n, s.iters));
  for (int64_t t = 0; t < s.N; ++t) {
    const T* xt = x + t * K;
    T* dxt = dx + t * K;
    for (int j = 0; j < n; ++j) {
      T a = 0;
      if (dy)
        for (int64_t i = 0; i < d; ++i) a += dy[t * d + i] * xt[j * d + i];
      dpre[j] = a;
    }
    hc_coeffs_bwd<T>(n, s.iters, static_cast<T>(s.hc_eps), mix + t * R, base, scale, dpre.data(),
                     dpost ? dpost + t * n : nullptr, dcomb ? dcomb + t * n * n : nullptr, dz.data(), pre.data(),
                     scratch.data());
    if (dy)
      for (int j = 0; j < n; ++j)
        for (int64_t i = 0; i < d; ++i) dxt[j * d + i] += pre[j] * dy[t * d + i];
    hc_dz_to_dmix<T>(n, 3, dz.data(), mix + t * R, scale, dmix.data(), dbase, dscale);
    hc_project_bwd<T>(K, R, xt, fn, rstd[t], dmix.data(), dxt, dfn);
  }
}

// x: [N, n, d]  f: [N, d]  post: [N, n]  comb: [N, n, n] -> out: [N, n, d]
template <class T>
void hc_post_fwd(const HcShape& s, const T* x, const T* f, const T* post, const T* comb, T* out) {
  const int n = s.n;
  const int64_t d = s.d;
  for (int64_t t = 0; t < s.N; ++t)
    for (int k = 0; k < n; ++k)
      for (int64_t i = 0; i < d; ++i) {
        T a = post[t * n + k] * f[t * d + i];
        for (int j = 0; j < n; ++j) a += comb[(t * n + j) * n + k] * x[(t * n + j) * d + i];
        out[(t * n + k) * d + i] = a;
      }
}

// dout: [N, n, d] -> dx: [N, n, d]  df: [N, d]  dpost: [N, n]  dcomb: [N, n, n] (all OVERWRITE)
template <class T>
void hc_post_bwd(const HcShape& s, const T* x, const T* f, const T* post, const T* comb, const T* dout, T* dx,
                 T* df, T* dpost, T* dcomb) {
  const int n = s.n;
  const int64_t d = s.d;
  for (int64_t t = 0; t < s.N; ++t) {
    const T* go = dout + t * n * d;
    for (int64_t i = 0; i < d; ++i) {
      T a = 0;
      for (int k = 0; k < n; ++k) a += post[t * n + k] * go[k * d + i];
      df[t * d + i] = a;
    }
    for (int j = 0; j < n; ++j)
      for (int64_t i = 0; i < d; ++i) {
        T a = 0;
        for (int k = 0; k < n; ++k) a += comb[(t * n + j) * n + k] * go[k * d + i];
        dx[(t * n + j) * d + i] = a;
      }
    for (int k = 0; k < n; ++k) {
      T a = 0;
      for (int64_t i = 0; i < d; ++i) a += go[k * d + i] * f[t * d + i];
      dpost[t * n + k] = a;
    }
    for (int j = 0; j < n; ++j)
      for (int k = 0; k < n; ++k) {
        T a = 0;
        for (int64_t i = 0; i < d; ++i) a += go[k * d + i] * x[(t * n + j) * d + i];
        dcomb[(t * n + j) * n + k] = a;
      }
  }
}

// x: [N, n, d]  hc_fn: [n, K]  hc_base: [n]  hc_scale: [1] -> y: [N, d]  mix: [N, n]  rstd: [N]
template <class T>
void hc_head_fwd(const HcShape& s, const T* x, const T* hc_fn, const T* hc_base, const T* hc_scale, T* y, T* mix,
                 T* rstd) {
  const int n = s.n;
  const int64_t d = s.d, K = n * d;
  const T eps = static_cast<T>(s.hc_eps);
  std::vector<T> pre(n);
  for (int64_t t = 0; t < s.N; ++t) {
    const T* xt = x + t * K;
    rstd[t] = hc_project<T>(K, n, static_cast<T>(s.norm_eps), xt, hc_fn, mix + t * n);
    for (int j = 0; j < n; ++j) pre[j] = hc_sigmoid(mix[t * n + j] * hc_scale[0] + hc_base[j]) + eps;
    for (int64_t i = 0; i < d; ++i) {
      T a = 0;
      for (int j = 0; j < n; ++j) a += pre[j] * xt[j * d + i];
      y[t * d + i] = a;
    }
  }
}

// dy: [N, d] -> dx: [N, n, d] (OVERWRITE)  dfn: [n, K] (+=)  dbase: [n] (+=)  dscale: [1] (+=)
template <class T>
void hc_head_bwd(const HcShape& s, const T* x, const T* hc_fn, const T* hc_base, const T* hc_scale, const T* mix,
                 const T* rstd, const T* dy, T* dx, T* dfn, T* dbase, T* dscale) {
  const int n = s.n;
  const int64_t d = s.d, K = n * d;
  const T eps = static_cast<T>(s.hc_eps);
  std::vector<T> dz(n), dmix(n);
  for (int64_t t = 0; t < s.N; ++t) {
    const T* xt = x + t * K;
    T* dxt = dx + t * K;
    for (int j = 0; j < n; ++j) {
      const T sg = hc_sigmoid(mix[t * n + j] * hc_scale[0] + hc_base[j]);
      T a = 0;
      for (int64_t i = 0; i < d; ++i) a += dy[t * d + i] * xt[j * d + i];
      dz[j] = a * sg * (T(1) - sg);
      for (int64_t i = 0; i < d; ++i) dxt[j * d + i] = (sg + eps) * dy[t * d + i];
    }
    hc_dz_to_dmix<T>(n, 1, dz.data(), mix + t * n, hc_scale, dmix.data(), dbase, dscale);
    hc_project_bwd<T>(K, n, xt, hc_fn, rstd[t], dmix.data(), dxt, dfn);
  }
}

}  // namespace trex::kern::ref
