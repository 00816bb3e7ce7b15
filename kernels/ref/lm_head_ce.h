// Scalar reference for the LM head + cross-entropy (the canonical definition of
// kernels/lm_head_ce.h); builds the full [N, V] logits, so small sizes only:
//   logit[n,v] = sum_j h[n,j] W[v,j]        lse_n = max_v logit + log sum_v exp(logit - max)
//   loss = sum over rows with labels[n] != -100 of (lse_n - logit[n, labels[n]])
//   p[n,v] = grad_scale * (softmax(logit[n,:])[v] - [v == labels[n]])   (0 for ignored rows)
//   dh[n,j] = sum_v p[n,v] W[v,j]   (OVERWRITES)      dW[v,j] += sum_n p[n,v] h[n,j]   (ACCUMULATES)
// round_p: p is rounded to bf16 before the two gradient sums (kernels/lm_head_ce.h: bf16 on the
// bf16 dot-product GEMMs).
// Labels outside [0, V) other than -100 are the caller's error (not checked here).
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>
#include "core/dtype.h"

namespace trex::kern::ref {

// h: [N, d]  W: [V, d]  labels: [N] -> returns sum of losses; dh: [N, d], dW: [V, d] or null
template <class T>
double lm_head_ce(int64_t N, int64_t d, int64_t V, const T* h, const T* W, const int32_t* labels, T grad_scale,
                  T* dh, T* dW, int64_t* n_valid, bool round_p = false) {
  std::vector<T> logit(static_cast<size_t>(N * V));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = 0; v < V; ++v) {
      T acc = 0;
      for (int64_t j = 0; j < d; ++j) acc += h[n * d + j] * W[v * d + j];
      logit[n * V + v] = acc;
    }
  double loss = 0;
  int64_t valid = 0;
  for (int64_t n = 0; n < N; ++n) {
    const T* l = &logit[n * V];
    T* p = &logit[n * V];  // becomes p in place
    const bool ok = labels[n] != -100;
    T mx = l[0];
    for (int64_t v = 1; v < V; ++v) mx = l[v] > mx ? l[v] : mx;
    T s = 0;
    for (int64_t v = 0; v < V; ++v) s += std::exp(l[v] - mx);
    const T lse = mx + std::log(s);
    if (ok) {
      ++valid;
      loss += static_cast<double>(lse - l[labels[n]]);
    }
    for (int64_t v = 0; v < V; ++v) p[v] = ok ? grad_scale * (std::exp(l[v] - lse) - (v == labels[n] ? T(1) : T(0))) : T(0);
    if (round_p)
      for (int64_t v = 0; v < V; ++v) p[v] = static_cast<T>(round_bf16(static_cast<float>(p[v])));
  }
  if (dh) {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < d; ++j) {
        T acc = 0;
        for (int64_t v = 0; v < V; ++v) acc += logit[n * V + v] * W[v * d + j];
        dh[n * d + j] = acc;
      }
    for (int64_t v = 0; v < V; ++v)
      for (int64_t j = 0; j < d; ++j) {
        T acc = 0;
        for (int64_t n = 0; n < N; ++n) acc += logit[n * V + v] * h[n * d + j];
        dW[v * d + j] += acc;
      }
  }
  if (n_valid) *n_valid = valid;
  return loss;
}

}  // namespace trex::kern::ref
