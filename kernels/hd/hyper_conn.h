// DeepSeek-V4 hyper-connections' per-token coefficient math (kernels/hyper_conn.h, the formulas
// in kernels/ref/hyper_conn.h): the sigmoid / Sinkhorn coefficients of one token from its
// projections, and their exact backward. Shared by the CPU reference and kernels
// (kernels/ref/hyper_conn.h, kernels/hyper_conn.cpp) and the CUDA kernels
// (kernels/cuda/hyper_conn.cu). T = float in the kernels, double in the gradient checks.
#pragma once
#include <cmath>
#include <cstddef>
#include "kernels/hd/hd.h"
#include "kernels/hyper_conn.h"

namespace trex::kern::hd {

template <class T>
TREX_HD T hc_sigmoid(T a) {
  return T(1) / (T(1) + std::exp(-a));
}

// Scratch (in T) needed by hc_coeffs_bwd for n streams and `iters` Sinkhorn iterations.
TREX_HD size_t hc_coeffs_scratch(int n, int iters) {
  return static_cast<size_t>(2 * iters + 1) * n * n + 2 * static_cast<size_t>(n);
}

// One token's coefficients from its projections.
// mix: [R]  base: [R]  scale: [3] -> pre: [n], post: [n], comb: [n*n] (comb[j*n+k]).
// hist (may be null): [2*iters, n*n]: slot 0 = the softmax, slot 1+s = the input of
// normalization step s (s = 0..2*iters-2; even s normalize columns, odd s rows).
// hc_coeffs_fwd_n: NC > 0 takes n as the constant NC (the caller checks n == NC), so the loops
// over streams unroll and the column steps' divisions run as vectors; NC = 0 the count at run
// time. The same operations in the same order: the same bits. hc_coeffs_fwd (below) picks one.
template <class T, int NC>
TREX_HD void hc_coeffs_fwd_n(int n_, int iters, T eps, const T* mix, const T* base, const T* scale, T* pre, T* post,
                           T* comb, T* hist) {
  const int n = NC > 0 ? NC : n_;
  for (int j = 0; j < n; ++j) pre[j] = hc_sigmoid(mix[j] * scale[0] + base[j]) + eps;
  for (int j = 0; j < n; ++j) post[j] = T(2) * hc_sigmoid(mix[n + j] * scale[1] + base[n + j]);
  const T* cw = mix + 2 * n;
  const T* cb = base + 2 * n;
  const int nn = n * n;
  for (int j = 0; j < n; ++j) {
    T* c = comb + j * n;
    T m = -INFINITY;
    for (int k = 0; k < n; ++k) {
      c[k] = cw[j * n + k] * scale[2] + cb[j * n + k];
      m = c[k] > m ? c[k] : m;
    }
    T s = 0;
    for (int k = 0; k < n; ++k) {
      c[k] = std::exp(c[k] - m);
      s += c[k];
    }
    for (int k = 0; k < n; ++k) c[k] /= s;
  }
  if (hist)
    for (int q = 0; q < nn; ++q) hist[q] = comb[q];
  for (int q = 0; q < nn; ++q) comb[q] += eps;
  // Column sums are accumulated row by row into den[k] (the same order, j = 0..n-1, per
  // column) so that the divisions vectorize across k.
  T den[kHcMaxStreams];
  const int steps = 2 * iters - 1;
  for (int st = 0; st < steps; ++st) {
    if (hist)
      for (int q = 0; q < nn; ++q) hist[(1 + st) * nn + q] = comb[q];
    if (st % 2 == 0) {  // columns: den[k] = sum_j comb[j][k] + eps
      for (int k = 0; k < n; ++k) den[k] = 0;
      for (int j = 0; j < n; ++j)
        for (int k = 0; k < n; ++k) den[k] += comb[j * n + k];
      for (int k = 0; k < n; ++k) den[k] += eps;
      for (int j = 0; j < n; ++j)
        for (int k = 0; k < n; ++k) comb[j * n + k] /= den[k];
    } else {  // rows: sum over k
      for (int j = 0; j < n; ++j) {
        T s = 0;
        for (int k = 0; k < n; ++k) s += comb[j * n + k];
        const T dj = s + eps;
        for (int k = 0; k < n; ++k) comb[j * n + k] /= dj;
      }
    }
  }
}

// Backward of hc_coeffs_fwd for one token, to the pre-activations a[q] = mix[q]*scale[g] + base[q].
// dpre: [n] (may be null: zero)  dpost: [n] (may be null)  dcomb: [n*n] (may be null)
// -> dz: [R] (OVERWRITES); pre: [n] (may be null) gets the forward pre. scratch: hc_coeffs_scratch.
// NC: as in hc_coeffs_fwd_n; hc_coeffs_bwd (below) picks one.
template <class T, int NC>
TREX_HD void hc_coeffs_bwd_n(int n_, int iters, T eps, const T* mix, const T* base, const T* scale, const T* dpre,
                           const T* dpost, const T* dcomb, T* dz, T* pre, T* scratch) {
  const int n = NC > 0 ? NC : n_;
  const int nn = n * n;
  T* hist = scratch;                   // [2*iters, n*n]
  T* G = scratch + 2 * iters * nn;     // [n*n]: gradient flowing back through Sinkhorn
  T* pr = G + nn;                      // [n]
  T* po = pr + n;                      // [n]
  T* cm = dz + 2 * n;                  // the comb output lands in dz's slot, overwritten below
  hc_coeffs_fwd_n<T, NC>(n, iters, eps, mix, base, scale, pr, po, cm, hist);
  if (pre)
    for (int j = 0; j < n; ++j) pre[j] = pr[j];
  for (int q = 0; q < nn; ++q) G[q] = dcomb ? dcomb[q] : T(0);
  // Step out = A / den (den = sums of A + eps along the step's axis):
  //   dA = dout / den - sum_axis(dout * A) / den^2
  T den[kHcMaxStreams], gs[kHcMaxStreams];
  for (int st = 2 * iters - 2; st >= 0; --st) {
    const T* A = hist + (1 + st) * nn;  // input of step st
    if (st % 2 == 0) {                  // column step: sums over j, per column k
      for (int k = 0; k < n; ++k) den[k] = gs[k] = 0;
      for (int j = 0; j < n; ++j)
        for (int k = 0; k < n; ++k) {
          den[k] += A[j * n + k];
          gs[k] += G[j * n + k] * A[j * n + k];
        }
      for (int k = 0; k < n; ++k) {
        den[k] += eps;
        gs[k] = gs[k] / (den[k] * den[k]);
      }
      for (int j = 0; j < n; ++j)
        for (int k = 0; k < n; ++k) G[j * n + k] = G[j * n + k] / den[k] - gs[k];
    } else {  // row step: sums over k, per row j
      for (int j = 0; j < n; ++j) {
        T s = 0, g = 0;
        for (int k = 0; k < n; ++k) {
          s += A[j * n + k];
          g += G[j * n + k] * A[j * n + k];
        }
        const T dj = s + eps, corr = g / (dj * dj);
        for (int k = 0; k < n; ++k) G[j * n + k] = G[j * n + k] / dj - corr;
      }
    }
  }
  // G is now the gradient of the softmax output (the + hc_eps passes it through).
  const T* S = hist;
  for (int j = 0; j < n; ++j) {
    T s = 0;
    for (int k = 0; k < n; ++k) s += G[j * n + k] * S[j * n + k];
    for (int k = 0; k < n; ++k) cm[j * n + k] = S[j * n + k] * (G[j * n + k] - s);
  }
  for (int j = 0; j < n; ++j) {
    const T sp = hc_sigmoid(mix[j] * scale[0] + base[j]);
    dz[j] = dpre ? dpre[j] * sp * (T(1) - sp) : T(0);
    const T sq = hc_sigmoid(mix[n + j] * scale[1] + base[n + j]);
    dz[n + j] = dpost ? dpost[j] * T(2) * sq * (T(1) - sq) : T(0);
  }
}

// The coefficients for any stream count: DeepSeek-V4's 4 streams as the compile-time count, others
// at run time (the same bits either way).
template <class T>
TREX_HD void hc_coeffs_fwd(int n, int iters, T eps, const T* mix, const T* base, const T* scale, T* pre, T* post,
                           T* comb, T* hist) {
  if (n == 4) hc_coeffs_fwd_n<T, 4>(n, iters, eps, mix, base, scale, pre, post, comb, hist);
  else hc_coeffs_fwd_n<T, 0>(n, iters, eps, mix, base, scale, pre, post, comb, hist);
}

template <class T>
TREX_HD void hc_coeffs_bwd(int n, int iters, T eps, const T* mix, const T* base, const T* scale, const T* dpre,
                           const T* dpost, const T* dcomb, T* dz, T* pre, T* scratch) {
  if (n == 4) hc_coeffs_bwd_n<T, 4>(n, iters, eps, mix, base, scale, dpre, dpost, dcomb, dz, pre, scratch);
  else hc_coeffs_bwd_n<T, 0>(n, iters, eps, mix, base, scale, dpre, dpost, dcomb, dz, pre, scratch);
}

}  // namespace trex::kern::hd
