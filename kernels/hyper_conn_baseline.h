// The mHC kernels' per-token loops in plain C++ (kernels/hyper_conn.h): the baseline that
// kernels/hyper_conn.cpp runs where the CPU has no AVX-512, one function per loop of
// kernels/cpu/hyper_conn_avx512.h, which must give the same bits (tests/unit/test_hyper_conn_avx512.cpp
// checks it against these). Dots keep 16 partial sums (lane l: the elements i = l mod 16) added in
// a fixed order, so they vectorize without reassociation; sums over the streams run in stream
// order. Include only from files built with the baseline flags (no -mfma: a product and a sum
// stay two roundings), as inline functions must compile alike everywhere they are used.
#pragma once
#include <cstdint>

namespace trex::kern::hc_baseline {

// sum_i a[i] * b[i], i < n
inline float dot(const float* a, const float* b, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; ++l) acc[l] += a[i + l] * b[i + l];
  for (int l = 0; i < n; ++i, ++l) acc[l] += a[i] * b[i];
  for (int w = 8; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

// y[i] += a * x[i]
inline void axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// out[j] = a . x_j for the n streams x [n, d]
inline void dots(int n, int64_t d, const float* a, const float* x, float* out) {
  for (int j = 0; j < n; ++j) out[j] = dot(a, x + j * d, d);
}

// y [d] = sum_j w[j] * x[j d + i]
inline void collapse(int n, int64_t d, const float* w, const float* x, float* y) {
  for (int64_t i = 0; i < d; ++i) y[i] = w[0] * x[i];
  for (int j = 1; j < n; ++j) axpy(w[j], x + j * d, y, d);
}

// One token: dx_j += p[j] * dy - c * x_j (dy null: dx_j -= c * x_j); x, dx [n, d]
inline void dx_update(int n, int64_t d, const float* p, float c, const float* dy, const float* x, float* dx) {
  for (int j = 0; j < n; ++j) {
    const float* xj = x + j * d;
    float* dxj = dx + j * d;
    const float pj = p[j];
    if (dy) {
      for (int64_t i = 0; i < d; ++i) dxj[i] += pj * dy[i] - c * xj[i];
    } else {
      for (int64_t i = 0; i < d; ++i) dxj[i] -= c * xj[i];
    }
  }
}

// Tokens [t0, t1) of hc_post_fwd: out_k = post[k] f + sum_j comb[j][k] x_j.
inline void post_fwd(int n, int64_t d, int64_t t0, int64_t t1, const float* x, const float* f, const float* post,
                     const float* comb, float* out) {
  const int64_t K = n * d;
  for (int64_t t = t0; t < t1; ++t) {
    const float* xt = x + t * K;
    const float* ft = f + t * d;
    const float* cm = comb + t * n * n;
    for (int k = 0; k < n; ++k) {
      float* o = out + t * K + k * d;
      const float pk = post[t * n + k];
      for (int64_t i = 0; i < d; ++i) o[i] = pk * ft[i];
      for (int j = 0; j < n; ++j) axpy(cm[j * n + k], xt + j * d, o, d);
    }
  }
}

// Tokens [t0, t1) of hc_post_bwd: df = sum_k post[k] g_k; dx_j = sum_k comb[j][k] g_k;
// dpost[k] = g_k . f; dcomb[j][k] = g_k . x_j (g = dout).
inline void post_bwd(int n, int64_t d, int64_t t0, int64_t t1, const float* x, const float* f, const float* post,
                     const float* comb, const float* dout, float* dx, float* df, float* dpost, float* dcomb) {
  const int64_t K = n * d;
  for (int64_t t = t0; t < t1; ++t) {
    const float* xt = x + t * K;
    const float* ft = f + t * d;
    const float* go = dout + t * K;
    const float* cm = comb + t * n * n;
    collapse(n, d, post + t * n, go, df + t * d);
    for (int j = 0; j < n; ++j) {
      float* dxj = dx + t * K + j * d;
      for (int64_t i = 0; i < d; ++i) dxj[i] = cm[j * n] * go[i];
      for (int k = 1; k < n; ++k) axpy(cm[j * n + k], go + k * d, dxj, d);
    }
    for (int k = 0; k < n; ++k) {
      dpost[t * n + k] = dot(go + k * d, ft, d);
      for (int j = 0; j < n; ++j) dcomb[(t * n + j) * n + k] = dot(go + k * d, xt + j * d, d);
    }
  }
}

}  // namespace trex::kern::hc_baseline
