// A host model of the CUDA sparse-attention kernels (kernels/cuda/sparse_attn.cu) for the CPU op
// harness ("sattn[hd]" in tests/ops/sparse_attn_ops.cpp): the same walk (32-row tiles, a lane's
// score as one D-long dot product (hd::dot4), the warp's butterfly sums, the online softmax started
// from the sink, dkv per query chunk into its own copy, the copies added in chunk order, dsink as a
// 256-thread block sum) on the same per-(query, head) functions, kernels/hd/sparse_attn.h. It proves
// the kernels' arithmetic and their NaN / empty-list rules on any machine, against the reference and
// under the same bounds; a GPU run then has only the launch and the synchronization left to prove.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>
#include "kernels/hd/dot.h"
#include "kernels/hd/sparse_attn.h"
#include "kernels/sparse_attn.h"

namespace trex::ops::hd_model {

constexpr int kLanes = 32, kTile = 32, kDkvHeads = 64, kBlock = 256;

// A warp's butterfly sum (__shfl_xor_sync with offsets 16, 8, 4, 2, 1); every lane ends equal.
inline float warp_sum(const float* v) {
  float a[kLanes], b[kLanes];
  for (int l = 0; l < kLanes; ++l) a[l] = v[l];
  for (int o = 16; o > 0; o >>= 1) {
    for (int l = 0; l < kLanes; ++l) b[l] = a[l] + a[l ^ o];
    for (int l = 0; l < kLanes; ++l) a[l] = b[l];
  }
  return a[0];
}

// A block's sum of one value per thread (kernels/cuda/reduce.cuh block_sum, kBlock threads).
inline float block_sum(const float* v) {
  float part[kLanes] = {};
  for (int w = 0; w < kBlock / kLanes; ++w) part[w] = warp_sum(v + w * kLanes);
  return warp_sum(part);
}

inline void sparse_attn_fwd(const kern::SparseAttnShape& sh, const float* q, const float* kv, int64_t M,
                            const int64_t* off, const int32_t* idx, const float* sink, float* o, float* lse) {
  (void)M;
  const int H = sh.H, D = sh.D;
  std::vector<float> acc(D);
  float s[kLanes], p[kLanes];
  for (int64_t i = 0; i < sh.N; ++i)
    for (int h = 0; h < H; ++h) {
      const float* qh = q + (i * H + h) * D;
      const int64_t b = off[i], n = off[i + 1] - b;
      kern::hd::SattnRow r = kern::hd::sattn_start(sink, h);
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t j0 = 0; j0 < n; j0 += kTile) {
        const int nt = static_cast<int>(n - j0 < kTile ? n - j0 : kTile);
        float mt = -INFINITY;
        for (int l = 0; l < kLanes; ++l) {
          s[l] = -INFINITY;
          if (l < nt) {
            const float* kr = kv + int64_t(idx[b + j0 + l]) * D;
            s[l] = sh.scale * kern::hd::dot4(qh, kr, D);
          }
          mt = std::fmax(mt, s[l]);  // fmaxf, as the warp's max: NaN only when every lane is NaN
        }
        const float mn = kern::hd::sattn_newmax(r.m, mt);
        for (int l = 0; l < kLanes; ++l) p[l] = kern::hd::sattn_prob(s[l], mn);
        const float corr = kern::hd::sattn_corr(r.m, mn);
        r = kern::hd::sattn_update(r, mn, warp_sum(p));
        for (int d = 0; d < D; ++d) acc[d] *= corr;
        for (int j = 0; j < nt; ++j) {
          const float* kr = kv + int64_t(idx[b + j0 + j]) * D;
          for (int d = 0; d < D; ++d) acc[d] += p[j] * kr[d];
        }
      }
      const bool none = r.m == -INFINITY;
      for (int d = 0; d < D; ++d) o[(i * H + h) * D + d] = none ? 0.f : acc[d] / r.l;
      lse[i * H + h] = kern::hd::sattn_lse(r);
    }
}

inline void sparse_attn_bwd(const kern::SparseAttnShape& sh, const float* q, const float* kv, int64_t M,
                            const int64_t* off, const int32_t* idx, const float* sink, const float* o,
                            const float* lse, const float* dO, float* dq, float* dkv, float* dsink, float* workspace) {
  (void)workspace;
  const int H = sh.H, D = sh.D;
  const int64_t N = sh.N, rows = N * H;
  // delta = dO . o (lane l sums dims l, l + 32, ...) and the dsink terms.
  std::vector<float> delta(rows), T(rows);
  float v[kBlock];
  for (int64_t row = 0; row < rows; ++row) {
    for (int l = 0; l < kLanes; ++l) {
      v[l] = 0.f;
      for (int d = l; d < D; d += kLanes) v[l] += dO[row * D + d] * o[row * D + d];
    }
    delta[row] = warp_sum(v);
    if (sink) T[row] = kern::hd::sattn_dsink_term(sink[row % H], lse[row], delta[row]);
  }
  if (sink)
    for (int h = 0; h < H; ++h) {
      for (int t = 0; t < kBlock; ++t) {
        v[t] = 0.f;
        for (int64_t i = t; i < N; i += kBlock) v[t] += T[i * H + h];
      }
      dsink[h] += block_sum(v);
    }
  // dq.
  std::vector<float> acc(D);
  float ds[kLanes];
  for (int64_t i = 0; i < N; ++i)
    for (int h = 0; h < H; ++h) {
      const float L = lse[i * H + h], dl = delta[i * H + h];
      const float* qh = q + (i * H + h) * D;
      const float* gh = dO + (i * H + h) * D;
      std::fill(acc.begin(), acc.end(), 0.f);
      const int64_t b = off[i], n = off[i + 1] - b;
      for (int64_t j0 = 0; j0 < n && L != -INFINITY; j0 += kTile) {
        const int nt = static_cast<int>(n - j0 < kTile ? n - j0 : kTile);
        for (int l = 0; l < nt; ++l) {
          const float* kr = kv + int64_t(idx[b + j0 + l]) * D;
          ds[l] = kern::hd::sattn_ds(kern::hd::sattn_bwd_prob(kern::hd::dot4(qh, kr, D), sh.scale, L),
                                     kern::hd::dot4(gh, kr, D), dl, sh.scale);
        }
        for (int j = 0; j < nt; ++j) {
          const float* kr = kv + int64_t(idx[b + j0 + j]) * D;
          for (int d = 0; d < D; ++d) acc[d] += ds[j] * kr[d];
        }
      }
      for (int d = 0; d < D; ++d) dq[(i * H + h) * D + d] = acc[d];
    }
  // dkv: chunk c into its own copy (chunk 0 into dkv), the copies added in chunk order.
  if (M == 0) return;
  const int C = kern::hd::sattn_dkv_chunks(N, M, D);
  const int64_t n_kv = M * D;
  std::vector<float> copies(size_t(C - 1) * size_t(n_kv), 0.f);
  std::vector<float> P(size_t(kDkvHeads) * kTile), S(size_t(kDkvHeads) * kTile);
  std::vector<char> skip(kDkvHeads);
  for (int c = 0; c < C; ++c) {
    float* dst = c == 0 ? dkv : copies.data() + int64_t(c - 1) * n_kv;
    for (int64_t i = N * c / C; i < N * (c + 1) / C; ++i) {
      const int64_t b = off[i], n = off[i + 1] - b;
      const float* qi = q + i * H * D;
      const float* gi = dO + i * H * D;
      for (int64_t j0 = 0; j0 < n; j0 += kTile) {
        const int nt = static_cast<int>(n - j0 < kTile ? n - j0 : kTile);
        for (int h0 = 0; h0 < H; h0 += kDkvHeads) {
          const int hn = H - h0 < kDkvHeads ? H - h0 : kDkvHeads;
          for (int hh = 0; hh < hn; ++hh) {
            const int h = h0 + hh;
            const float L = lse[i * H + h], dl = delta[i * H + h];
            skip[hh] = L == -INFINITY;
            for (int l = 0; l < kTile; ++l) {
              float p = 0.f, g = 0.f;
              if (l < nt && L != -INFINITY) {
                const float* kr = kv + int64_t(idx[b + j0 + l]) * D;
                p = kern::hd::sattn_bwd_prob(kern::hd::dot4(qi + h * D, kr, D), sh.scale, L);
                g = kern::hd::sattn_ds(p, kern::hd::dot4(gi + h * D, kr, D), dl, sh.scale);
              }
              P[hh * kTile + l] = p, S[hh * kTile + l] = g;
            }
          }
          for (int j = 0; j < nt; ++j)
            for (int d = 0; d < D; ++d) {
              float cacc = 0.f;
              for (int hh = 0; hh < hn; ++hh)
                if (!skip[hh])
                  cacc += S[hh * kTile + j] * qi[(h0 + hh) * D + d] + P[hh * kTile + j] * gi[(h0 + hh) * D + d];
              dst[int64_t(idx[b + j0 + j]) * D + d] += cacc;
            }
        }
      }
    }
  }
  for (int c = 0; c + 1 < C; ++c)
    for (int64_t e = 0; e < n_kv; ++e) dkv[e] += copies[size_t(c) * n_kv + e];
}

inline size_t sparse_attn_ws(const kern::SparseAttnShape&, int64_t) { return 0; }

}  // namespace trex::ops::hd_model
