// Causal softmax attention on the bf16 tensor cores (AttnShape::prec == BF16): the GEMM path of
// kernels/cuda/attention.cu with its operands rounded to bf16 and f32 accumulation, as
// FlashAttention and PyTorch's bf16 SDPA compute. Forward: S = scale Q K^T (f32), the masked
// softmax rows (lse in f32, P rounded to bf16), O = P V. Backward: P = exp(S - lse), dP = dO V^T,
// dS = P (dP - Dt) rounded to bf16, dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO.
//
// Layout of the work:
//  - q, k, v (and dO) are packed once per call into bf16 [B, H, Tp, Dp] (head-major, rows padded
//    to Tp = T rounded up to 8, head dims to Dp = D rounded up to 8, the padding zero), so every
//    GEMM operand is 16-byte aligned and one strided-batched cuBLASLt call covers a group of heads;
//  - causality: the queries are cut into up to 4 row chunks; chunk [r0, r1) multiplies only keys
//    [0, r1) (padded to 8), so the GEMMs do (n + 1) / 2n of the square's work instead of all of it;
//  - scratch per chunk and head group: S / P f32, dP f32, P and dS in bf16 (12 bytes per score),
//    the head group sized to keep it under kScratch bytes;
//  - dK and dV accumulate over the chunks in f32 [H, Tp, Dp] (beta = 1), then are unpacked.
// Every output element is written by one GEMM or one thread: results do not depend on timing.
#include <cuda_bf16.h>
#include <algorithm>
#include <cmath>
#include "kernels/cuda/attention_geo.cuh"
#include "kernels/cuda/check.h"

namespace trex::kern::cuda {

namespace {

constexpr size_t kScratch = size_t(1536) << 20;  // scores' scratch per chunk and head group
constexpr int kMaxChunks = 4;

int64_t up8(int64_t x) { return (x + 7) / 8 * 8; }

// x [B, T, H, D] f32 -> y [B, H, Tp, Dp] bf16, zero where t >= T or d >= D.
__global__ void pack_heads_k(const float* __restrict__ x, int B, int T, int H, int D, int Tp, int Dp,
                             __nv_bfloat16* __restrict__ y) {
  const int64_t n = int64_t(B) * H * Tp * Dp;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int d = int(i % Dp);
    const int64_t r = i / Dp;
    const int t = int(r % Tp), h = int((r / Tp) % H), b = int(r / (int64_t(Tp) * H));
    y[i] = __float2bfloat16(t < T && d < D ? x[((int64_t(b) * T + t) * H + h) * D + d] : 0.f);
  }
}

// src [hb, rows, Dp] (head-group-major, batch stride src_hs) -> dst [B, T, H, D] rows
// [r0, r0 + rows) of batch row b, heads [h0, h0 + hb), the first D columns (overwrite).
__global__ void unpack_heads_k(const float* __restrict__ src, int64_t src_hs, int Dp, int b, int h0, int hb, int r0,
                               int rows, int T, int H, int D, float* __restrict__ dst) {
  const int64_t n = int64_t(hb) * rows * D;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int d = int(i % D), r = int((i / D) % rows), j = int(i / (int64_t(D) * rows));
    dst[((int64_t(b) * T + r0 + r) * H + h0 + j) * D + d] = src[j * src_hs + int64_t(r) * Dp + d];
  }
}

// Forward softmax of one query row per block: S [hb, rows, ld] (scaled scores of keys [0, ld))
// -> P bf16 (0 where not visible) and lse[b, h, t] (-inf and a zero row when nothing is visible).
__global__ void softmax_bf16_k(Geo g, int b, int h0, int r0, int rows, int ld, const float* __restrict__ S,
                               __nv_bfloat16* __restrict__ P, float* __restrict__ lse) {
  const int r = blockIdx.x, j = blockIdx.y, t = r0 + r, h = h0 + j;
  const int64_t off = (int64_t(j) * rows + r) * ld;
  const float* row = S + off;
  float m = -INFINITY;
  for (int s = threadIdx.x; s <= t; s += blockDim.x)
    if (visible(g, b, t, s)) m = fmaxf(m, row[s]);
  m = block_max(m);
  float l = 0.f;
  if (m != -INFINITY)
    for (int s = threadIdx.x; s <= t; s += blockDim.x)
      if (visible(g, b, t, s)) l += expf(row[s] - m);
  l = block_sum(l);
  for (int s = threadIdx.x; s < ld; s += blockDim.x)
    P[off + s] = __float2bfloat16((m != -INFINITY && visible(g, b, t, s)) ? expf(row[s] - m) / l : 0.f);
  if (threadIdx.x == 0) lse[(int64_t(b) * g.H + h) * g.T + t] = m == -INFINITY ? -INFINITY : m + logf(l);
}

// Backward: S [hb, rows, ld] -> P = exp(S - lse) where visible, in f32 (in place) and bf16 (Pb).
__global__ void probs_bf16_k(Geo g, int b, int h0, int r0, int rows, int ld, int hb, float* __restrict__ S,
                             __nv_bfloat16* __restrict__ Pb, const float* __restrict__ lse) {
  const int64_t n = int64_t(hb) * rows * ld;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int s = int(i % ld), r = int((i / ld) % rows), j = int(i / (int64_t(ld) * rows)), t = r0 + r;
    const float L = lse[(int64_t(b) * g.H + h0 + j) * g.T + t];
    const float p = (L != -INFINITY && visible(g, b, t, s)) ? expf(S[i] - L) : 0.f;
    S[i] = p;
    Pb[i] = __float2bfloat16(p);
  }
}

// dS = P (dP - Dt[b, h, t]) in bf16.
__global__ void dscores_bf16_k(Geo g, int b, int h0, int r0, int rows, int ld, int hb, const float* __restrict__ P,
                               const float* __restrict__ dP, const float* __restrict__ Dt,
                               __nv_bfloat16* __restrict__ dS) {
  const int64_t n = int64_t(hb) * rows * ld;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int r = int((i / ld) % rows), j = int(i / (int64_t(ld) * rows));
    dS[i] = __float2bfloat16(P[i] * (dP[i] - Dt[(int64_t(b) * g.H + h0 + j) * g.T + r0 + r]));
  }
}

// The problem cut into row chunks and head groups.
struct Plan {
  int64_t Tp, Dq, Dv;      // padded rows and head dims
  int nc;                  // row chunks
  int hb;                  // heads per group
  int64_t rows_max;         // the longest chunk
  int64_t r(int i, int T) const { return i == nc ? T : std::min<int64_t>(T, up8(int64_t(T) * i / nc)); }
};

Plan plan_of(const Geo& g) {
  Plan p;
  p.Tp = up8(g.T), p.Dq = up8(g.Dqk), p.Dv = up8(g.Dv);
  p.nc = g.T >= 2048 ? kMaxChunks : g.T >= 512 ? 2 : 1;
  p.rows_max = 0;
  for (int i = 0; i < p.nc; ++i) p.rows_max = std::max(p.rows_max, p.r(i + 1, g.T) - p.r(i, g.T));
  const int64_t per_head = 12 * p.rows_max * p.Tp;
  p.hb = int(std::clamp<int64_t>(int64_t(kScratch / size_t(std::max<int64_t>(per_head, 1))), 1, g.H));
  return p;
}

__nv_bfloat16* packed(const Scratch& s) { return s.as<__nv_bfloat16>(); }

void pack(const Ctx& c, const Geo& g, const Plan& p, const float* x, int D, int64_t Dp, const Scratch& dst) {
  const int64_t n = int64_t(g.B) * g.H * p.Tp * Dp;
  pack_heads_k<<<grid_for(n), 256, 0, c.stream>>>(x, g.B, g.T, g.H, D, int(p.Tp), int(Dp), packed(dst));
  TREX_CUDA_LAUNCHED("attention bf16 pack");
}

void unpack(const Ctx& c, const Geo& g, const float* src, int64_t src_hs, int64_t Dp, int b, int h0, int hb, int r0,
            int rows, int D, float* dst) {
  unpack_heads_k<<<grid_for(int64_t(hb) * rows * D), 256, 0, c.stream>>>(src, src_hs, int(Dp), b, h0, hb, r0, rows,
                                                                        g.T, g.H, D, dst);
  TREX_CUDA_LAUNCHED("attention bf16 unpack");
}

}  // namespace

void attention_fwd_bf16(const Ctx& c, const Geo& g, const float* q, const float* k, const float* v, float* o,
                        float* lse) {
  const Plan p = plan_of(g);
  const size_t b2 = sizeof(__nv_bfloat16);
  Scratch Qb(c, g.B * g.H * p.Tp * p.Dq * b2), Kb(c, g.B * g.H * p.Tp * p.Dq * b2), Vb(c, g.B * g.H * p.Tp * p.Dv * b2);
  pack(c, g, p, q, g.Dqk, p.Dq, Qb), pack(c, g, p, k, g.Dqk, p.Dq, Kb), pack(c, g, p, v, g.Dv, p.Dv, Vb);
  const int64_t rows_max = p.rows_max;
  const size_t elems = size_t(p.hb) * rows_max * p.Tp;
  Scratch S(c, elems * sizeof(float)), P(c, elems * b2), O(c, size_t(p.hb) * rows_max * p.Dv * sizeof(float));
  const int64_t hsq = p.Tp * p.Dq, hsv = p.Tp * p.Dv;  // one head's packed rows
  for (int b = 0; b < g.B; ++b)
    for (int h0 = 0; h0 < g.H; h0 += p.hb) {
      const int hb = std::min(p.hb, g.H - h0);
      const int64_t head0 = int64_t(b) * g.H + h0;
      for (int i = 0; i < p.nc; ++i) {
        const int64_t r0 = p.r(i, g.T), r1 = p.r(i + 1, g.T), rows = r1 - r0, ld = up8(r1);
        if (rows <= 0) continue;
        gemm_batched(c, Prec::BF16, false, true, rows, ld, p.Dq, g.scale, packed(Qb) + head0 * hsq + r0 * p.Dq,
                     p.Dq, hsq, packed(Kb) + head0 * hsq, p.Dq, hsq, 0.f, S.as<float>(), ld, rows * ld, hb);
        softmax_bf16_k<<<dim3(unsigned(rows), unsigned(hb)), 256, 0, c.stream>>>(g, b, h0, int(r0), int(rows), int(ld),
                                                                                S.as<float>(), packed(P), lse);
        TREX_CUDA_LAUNCHED("attention bf16 softmax");
        gemm_batched(c, Prec::BF16, false, false, rows, p.Dv, ld, 1.f, packed(P), ld, rows * ld,
                     packed(Vb) + head0 * hsv, p.Dv, hsv, 0.f, O.as<float>(), p.Dv, rows * p.Dv, hb);
        unpack(c, g, O.as<float>(), rows * p.Dv, p.Dv, b, h0, hb, int(r0), int(rows), g.Dv, o);
      }
    }
}

void attention_bwd_bf16(const Ctx& c, const Geo& g, const float* q, const float* k, const float* v,
                        const float* lse, const float* Dt, const float* dO, float* dq, float* dk, float* dv) {
  const Plan p = plan_of(g);
  const size_t b2 = sizeof(__nv_bfloat16), f4 = sizeof(float);
  const size_t nq = size_t(g.B) * g.H * p.Tp * p.Dq, nv = size_t(g.B) * g.H * p.Tp * p.Dv;
  Scratch Qb(c, nq * b2), Kb(c, nq * b2), Vb(c, nv * b2), dOb(c, nv * b2);
  pack(c, g, p, q, g.Dqk, p.Dq, Qb), pack(c, g, p, k, g.Dqk, p.Dq, Kb), pack(c, g, p, v, g.Dv, p.Dv, Vb);
  pack(c, g, p, dO, g.Dv, p.Dv, dOb);
  // dK, dV of one batch row: f32 [H, Tp, D], accumulated over the row chunks.
  const int64_t hsq = p.Tp * p.Dq, hsv = p.Tp * p.Dv;
  Scratch dKa(c, size_t(g.H) * hsq * f4), dVa(c, size_t(g.H) * hsv * f4);
  const int64_t rows_max = p.rows_max;
  const size_t elems = size_t(p.hb) * rows_max * p.Tp;
  Scratch S(c, elems * f4), dP(c, elems * f4), Pb(c, elems * b2), dSb(c, elems * b2);
  Scratch dQc(c, size_t(p.hb) * rows_max * p.Dq * f4);
  for (int b = 0; b < g.B; ++b) {
    TREX_CUDA_CHECK(cudaMemsetAsync(dKa.as<float>(), 0, size_t(g.H) * hsq * f4, c.stream));
    TREX_CUDA_CHECK(cudaMemsetAsync(dVa.as<float>(), 0, size_t(g.H) * hsv * f4, c.stream));
    for (int h0 = 0; h0 < g.H; h0 += p.hb) {
      const int hb = std::min(p.hb, g.H - h0);
      const int64_t head0 = int64_t(b) * g.H + h0;
      const __nv_bfloat16 *Qh = packed(Qb) + head0 * hsq, *Kh = packed(Kb) + head0 * hsq;
      const __nv_bfloat16 *Vh = packed(Vb) + head0 * hsv, *dOh = packed(dOb) + head0 * hsv;
      float *dKh = dKa.as<float>() + int64_t(h0) * hsq, *dVh = dVa.as<float>() + int64_t(h0) * hsv;
      for (int i = 0; i < p.nc; ++i) {
        const int64_t r0 = p.r(i, g.T), r1 = p.r(i + 1, g.T), rows = r1 - r0, ld = up8(r1), n = int64_t(hb) * rows * ld;
        if (rows <= 0) continue;
        gemm_batched(c, Prec::BF16, false, true, rows, ld, p.Dq, g.scale, Qh + r0 * p.Dq, p.Dq, hsq, Kh, p.Dq, hsq, 0.f,
                     S.as<float>(), ld, rows * ld, hb);
        probs_bf16_k<<<grid_for(n), 256, 0, c.stream>>>(g, b, h0, int(r0), int(rows), int(ld), hb, S.as<float>(),
                                                         packed(Pb), lse);
        TREX_CUDA_LAUNCHED("attention bf16 probs");
        gemm_batched(c, Prec::BF16, false, true, rows, ld, p.Dv, 1.f, dOh + r0 * p.Dv, p.Dv, hsv, Vh, p.Dv, hsv, 0.f,
                     dP.as<float>(), ld, rows * ld, hb);
        // dV[0, ld) += P^T dO_rows
        gemm_batched(c, Prec::BF16, true, false, ld, p.Dv, rows, 1.f, packed(Pb), ld, rows * ld, dOh + r0 * p.Dv,
                     p.Dv, hsv, 1.f, dVh, p.Dv, hsv, hb);
        dscores_bf16_k<<<grid_for(n), 256, 0, c.stream>>>(g, b, h0, int(r0), int(rows), int(ld), hb, S.as<float>(),
                                                           dP.as<float>(), Dt, packed(dSb));
        TREX_CUDA_LAUNCHED("attention bf16 dscores");
        // dQ_rows = scale dS K[0, ld);  dK[0, ld) += scale dS^T Q_rows
        gemm_batched(c, Prec::BF16, false, false, rows, p.Dq, ld, g.scale, packed(dSb), ld, rows * ld, Kh, p.Dq,
                     hsq, 0.f, dQc.as<float>(), p.Dq, rows * p.Dq, hb);
        unpack(c, g, dQc.as<float>(), rows * p.Dq, p.Dq, b, h0, hb, int(r0), int(rows), g.Dqk, dq);
        gemm_batched(c, Prec::BF16, true, false, ld, p.Dq, rows, g.scale, packed(dSb), ld, rows * ld,
                     Qh + r0 * p.Dq, p.Dq, hsq, 1.f, dKh, p.Dq, hsq, hb);
      }
    }
    unpack(c, g, dKa.as<float>(), hsq, p.Dq, b, 0, g.H, 0, g.T, g.Dqk, dk);
    unpack(c, g, dVa.as<float>(), hsv, p.Dv, b, 0, g.H, 0, g.T, g.Dv, dv);
  }
}

}  // namespace trex::kern::cuda
