#include "kernels/router.h"

#include <algorithm>
#include <vector>
#include "core/error.h"
#include "core/parallel.h"
#include "kernels/hd/router.h"

namespace trex::kern {

void router_select(const RouterShape& s, const float* logits, const float* bias, const int32_t* fixed_idx,
                   float* scores, int32_t* idx, float* probs) {
  const int64_t E = s.E, K = s.K;
  parallel_for(s.N, 16, [&](int64_t b, int64_t e) {
    std::vector<float> gscore(s.groups);
    std::vector<unsigned char> gkeep(s.groups);
    for (int64_t n = b; n < e; ++n) {
      hd::router_scores_row(s, logits + n * E, scores + n * E);
      hd::router_select_row(s, scores + n * E, bias, fixed_idx ? fixed_idx + n * K : nullptr, gscore.data(),
                            gkeep.data(), idx + n * K, probs + n * K);
    }
  });
}

void router_probs_bwd(const RouterShape& s, const float* scores, const int32_t* idx, const float* dprobs,
                      float* dscores) {
  const int64_t E = s.E, K = s.K;
  parallel_for(s.N, 64, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n)
      hd::router_probs_bwd_row(s, scores + n * E, idx + n * K, dprobs + n * K, dscores + n * E);
  });
}

void router_scores_bwd(const RouterShape& s, const float* scores, const float* dscores, float* dlogits) {
  const int64_t E = s.E;
  parallel_for(s.N, 64, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) hd::router_scores_bwd_row(s, scores + n * E, dscores + n * E, dlogits + n * E);
  });
}

void router_aux_counts(const RouterShape& s, const int32_t* idx, int64_t T, int64_t n0, double* cnt) {
  const int64_t E = s.E, K = s.K;
  for (int64_t i = 0; i < s.N; ++i) {
    const int64_t b = (n0 + i) / T;
    for (int64_t k = 0; k < K; ++k) cnt[b * E + idx[i * K + k]] += 1.0;
  }
}

double router_aux_loss(const RouterShape& s, const float* scores, const double* cnt, int64_t B, int64_t T, int64_t n0,
                       double alpha, float grad_scale, float* dscores, int64_t Tn) {
  const int64_t E = s.E, K = s.K, N = s.N, Ts = Tn > 0 ? Tn : T;  // Ts: the sequences' length
  TREX_CHECK(n0 >= 0 && n0 + N <= B * T, "router_aux_loss: rows [", n0, ", ", n0 + N, ") outside the ", B, " x ", T,
             " batch");
  double total = 0;
  std::vector<double> f(E), P(E);
  const int64_t b0 = N > 0 ? n0 / T : 0, b1 = N > 0 ? (n0 + N - 1) / T + 1 : 0;
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t i0 = std::max(b * T, n0) - n0, i1 = std::min((b + 1) * T, n0 + N) - n0;  // its rows here
    std::fill(P.begin(), P.end(), 0.0);
    for (int64_t i = i0; i < i1; ++i) {
      const float* sc = scores + i * E;
      double Z = 0;
      for (int64_t e = 0; e < E; ++e) Z += sc[e];
      for (int64_t e = 0; e < E; ++e) P[e] += sc[e] / Z;
    }
    double L = 0;
    for (int64_t e = 0; e < E; ++e) {
      f[e] = cnt[b * E + e] * ((double)E / (double)(K * Ts));
      P[e] /= (double)Ts;
      L += f[e] * P[e];
    }
    total += alpha * L / B;
    if (!dscores) continue;
    // dL/ds'_{t,i} = alpha f_i / (T B);  s'_i = s_i / Z  =>  ds_i = (g_i - sum_j g_j s'_j) / Z
    for (int64_t i = i0; i < i1; ++i) {
      const float* sc = scores + i * E;
      double Z = 0, dot = 0;
      for (int64_t e = 0; e < E; ++e) Z += sc[e];
      for (int64_t e = 0; e < E; ++e) dot += alpha * f[e] / (Ts * B) * (sc[e] / Z);
      for (int64_t e = 0; e < E; ++e) dscores[i * E + e] += grad_scale * (float)((alpha * f[e] / (Ts * B) - dot) / Z);
    }
  }
  return total;
}

void moe_sort(const int32_t* idx, int64_t N, int64_t K, int64_t E, int64_t* offsets, int32_t* row_token,
              int32_t* slot_row) {
  const int64_t R = N * K;
  std::fill(offsets, offsets + E + 1, int64_t(0));
  for (int64_t i = 0; i < R; ++i) offsets[idx[i] + 1]++;
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
  std::vector<int64_t> fill(offsets, offsets + E);
  for (int64_t i = 0; i < R; ++i) {
    const int64_t row = fill[idx[i]]++;
    row_token[row] = (int32_t)(i / K);
    slot_row[i] = (int32_t)row;
  }
}

}  // namespace trex::kern
