// Causal softmax attention on CUDA (kernels/attention.h: [B,T,H,D] layout, Dqk != Dv, packed
// documents through seg, sliding window), forward and backward, flash style: no T x T matrix,
// online softmax (kernels/hd/softmax.h's rule), f32 throughout.
// Layout of the work: a block of 4 warps takes 4 consecutive rows (queries in forward and dq,
// keys in dk/dv); the other side streams through shared memory in tiles of 32 rows, one row per
// lane for the scores, then each lane owns the output dims lane, lane + 32, ... Every output is
// written by exactly one warp: no atomics, results independent of the launch order.
// Backward (FlashAttention-2): Dt = rowsum(dO * O); p = exp(scale q.k - lse); dp = dO.v;
// ds = p (dp - Dt); dq = scale sum_s ds k; dk = scale sum_t ds q; dv = sum_t p dO.
// A second path computes the same through cuBLASLt, one head at a time with its T x T scores in
// scratch (2 T^2 floats): S = scale Q K^T, the masked softmax rows (P, lse), O = P V; backward
// P from lse, dP = dO V^T, dV = P^T dO, dS = P (dP - Dt), dQ = scale dS K, dK = scale dS^T Q.
// Every GEMM is f32 with f32 compute (no TF32), so the results agree with the flash path to
// rounding. It is used while T <= 16384 (the scratch stays under 2 GiB); TREX_CUDA_ATTENTION =
// flash | gemm forces one (the op harness runs both). A third path, for AttnShape::prec == BF16,
// runs the GEMMs on bf16 operands (kernels/cuda/attention_bf16.cu).
#include <cmath>
#include <cstdlib>
#include <string>
#include "kernels/cuda/attention_geo.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"

namespace trex::kern::cuda {

namespace {

constexpr int kRows = 4;      // rows (warps) per block
constexpr int kTile = 32;     // streamed rows per tile
constexpr int kMaxD = 512;    // largest head dim (Dqk and Dv)
constexpr int kPer = kMaxD / 32;

__device__ __forceinline__ int64_t row_off(const Geo& g, int b, int t, int h, int D) {
  return ((int64_t(b) * g.T + t) * g.H + h) * D;
}

// Rows [r0, r0 + n) of head h, D wide, into smem at row stride ld (zeros past T).
__device__ void load_rows(const Geo& g, const float* src, int b, int h, int r0, int n, int D, float* dst, int ld) {
  for (int i = threadIdx.x; i < n * D; i += blockDim.x) {
    const int r = i / D, d = i % D, t = r0 + r;
    dst[r * ld + d] = t < g.T ? src[row_off(g, b, t, h, D) + d] : 0.f;
  }
}

// The keys that query rows [t0, t0 + kRows) can see start in the tile at *first (a multiple of
// kTile; the sliding window's lower edge) and end at *last.
__device__ void key_range(const Geo& g, int t0, int* first, int* last) {
  *last = min(g.T - 1, t0 + kRows - 1);
  const int s = g.window > 0 ? max(0, t0 - g.window + 1) : 0;
  *first = s - s % kTile;
}

__global__ void attn_fwd_k(Geo g, const float* __restrict__ q, const float* __restrict__ k,
                           const float* __restrict__ v, float* __restrict__ o, float* __restrict__ lse) {
  extern __shared__ float sm[];
  const int lq = g.Dqk + 1, lv = g.Dv + 1;
  float* Ks = sm;                     // [kTile, lq]
  float* Vs = Ks + kTile * lq;        // [kTile, lv]
  float* Qs = Vs + kTile * lv;        // [kRows, Dqk]
  const int b = blockIdx.z, h = blockIdx.y, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int t0 = blockIdx.x * kRows, t = t0 + w;
  const bool live = t < g.T;
  load_rows(g, q, b, h, t0, kRows, g.Dqk, Qs, g.Dqk);
  float acc[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) acc[i] = 0.f;
  float m = -INFINITY, l = 0.f;
  int s_begin, t_last;
  key_range(g, t0, &s_begin, &t_last);
  for (int s0 = s_begin; s0 <= t_last; s0 += kTile) {
    __syncthreads();
    load_rows(g, k, b, h, s0, kTile, g.Dqk, Ks, lq);
    load_rows(g, v, b, h, s0, kTile, g.Dv, Vs, lv);
    __syncthreads();
    if (!live) continue;
    const int s = s0 + lane;
    float sc = -INFINITY;
    if (s < g.T && visible(g, b, t, s)) {
      float dot = 0.f;
      for (int d = 0; d < g.Dqk; ++d) dot += Qs[w * g.Dqk + d] * Ks[lane * lq + d];
      sc = g.scale * dot;
    }
    const float mt = warp_max(sc), mn = max(m, mt);
    if (mn == -INFINITY) continue;
    const float p = sc == -INFINITY ? 0.f : expf(sc - mn);
    const float corr = m == -INFINITY ? 0.f : expf(m - mn);
    l = l * corr + warp_sum(p);
    m = mn;
#pragma unroll
    for (int i = 0; i < kPer; ++i) acc[i] *= corr;
    for (int j = 0; j < kTile; ++j) {
      const float pj = __shfl_sync(0xffffffffu, p, j);
      if (pj == 0.f) continue;
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int d = lane + 32 * i;
        if (d < g.Dv) acc[i] += pj * Vs[j * lv + d];
      }
    }
  }
  if (!live) return;
  const float inv = l > 0.f ? 1.f / l : 0.f;
  float* orow = o + row_off(g, b, t, h, g.Dv);
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int d = lane + 32 * i;
    if (d < g.Dv) orow[d] = acc[i] * inv;
  }
  if (lane == 0) lse[(int64_t(b) * g.H + h) * g.T + t] = l > 0.f ? m + logf(l) : -INFINITY;
}

// Dt[b,h,t] = sum_d dO * O (one warp per row).
__global__ void attn_rowdot_k(Geo g, const float* __restrict__ o, const float* __restrict__ dO, float* __restrict__ Dt) {
  const int64_t row = blockIdx.x * int64_t(kRows) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= int64_t(g.B) * g.T * g.H) return;
  const float* a = o + row * g.Dv;
  const float* c = dO + row * g.Dv;
  float s = 0.f;
  for (int d = lane; d < g.Dv; d += 32) s += a[d] * c[d];
  s = warp_sum(s);
  if (lane == 0) {
    const int h = static_cast<int>(row % g.H);
    const int64_t bt = row / g.H;
    const int b = static_cast<int>(bt / g.T), t = static_cast<int>(bt % g.T);
    Dt[(int64_t(b) * g.H + h) * g.T + t] = s;
  }
}

// dq: a warp per query row, key tiles streamed.
__global__ void attn_dq_k(Geo g, const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                          const float* __restrict__ lse, const float* __restrict__ Dt, const float* __restrict__ dO,
                          float* __restrict__ dq) {
  extern __shared__ float sm[];
  const int lq = g.Dqk + 1, lv = g.Dv + 1;
  float* Ks = sm;
  float* Vs = Ks + kTile * lq;
  float* Qs = Vs + kTile * lv;   // [kRows, Dqk]
  float* Gs = Qs + kRows * g.Dqk;  // [kRows, Dv]  dO rows
  const int b = blockIdx.z, h = blockIdx.y, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int t0 = blockIdx.x * kRows, t = t0 + w;
  const bool live = t < g.T;
  load_rows(g, q, b, h, t0, kRows, g.Dqk, Qs, g.Dqk);
  load_rows(g, dO, b, h, t0, kRows, g.Dv, Gs, g.Dv);
  const float L = live ? lse[(int64_t(b) * g.H + h) * g.T + t] : 0.f;
  const float Dr = live ? Dt[(int64_t(b) * g.H + h) * g.T + t] : 0.f;
  float acc[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) acc[i] = 0.f;
  int s_begin, t_last;
  key_range(g, t0, &s_begin, &t_last);
  for (int s0 = s_begin; s0 <= t_last; s0 += kTile) {
    __syncthreads();
    load_rows(g, k, b, h, s0, kTile, g.Dqk, Ks, lq);
    load_rows(g, v, b, h, s0, kTile, g.Dv, Vs, lv);
    __syncthreads();
    if (!live) continue;
    const int s = s0 + lane;
    float ds = 0.f;
    if (s < g.T && visible(g, b, t, s) && L != -INFINITY) {
      float dot = 0.f, dp = 0.f;
      for (int d = 0; d < g.Dqk; ++d) dot += Qs[w * g.Dqk + d] * Ks[lane * lq + d];
      for (int d = 0; d < g.Dv; ++d) dp += Gs[w * g.Dv + d] * Vs[lane * lv + d];
      const float p = expf(g.scale * dot - L);
      ds = p * (dp - Dr);
    }
    for (int j = 0; j < kTile; ++j) {
      const float dj = __shfl_sync(0xffffffffu, ds, j);
      if (dj == 0.f) continue;
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int d = lane + 32 * i;
        if (d < g.Dqk) acc[i] += dj * Ks[j * lq + d];
      }
    }
  }
  if (!live) return;
  float* out = dq + row_off(g, b, t, h, g.Dqk);
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int d = lane + 32 * i;
    if (d < g.Dqk) out[d] = g.scale * acc[i];
  }
}

// dk, dv: a warp per key row, query tiles streamed.
__global__ void attn_dkv_k(Geo g, const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                           const float* __restrict__ lse, const float* __restrict__ Dt, const float* __restrict__ dO,
                           float* __restrict__ dk, float* __restrict__ dv) {
  extern __shared__ float sm[];
  const int lq = g.Dqk + 1, lv = g.Dv + 1;
  float* Qs = sm;                  // [kTile, lq]
  float* Gs = Qs + kTile * lq;     // [kTile, lv]  dO
  float* Ks = Gs + kTile * lv;     // [kRows, Dqk]
  float* Vs = Ks + kRows * g.Dqk;  // [kRows, Dv]
  float* Ls = Vs + kRows * g.Dv;   // [kTile] lse
  float* Ds = Ls + kTile;          // [kTile] Dt
  const int b = blockIdx.z, h = blockIdx.y, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int s_first = blockIdx.x * kRows, s = s_first + w;
  const bool live = s < g.T;
  load_rows(g, k, b, h, s_first, kRows, g.Dqk, Ks, g.Dqk);
  load_rows(g, v, b, h, s_first, kRows, g.Dv, Vs, g.Dv);
  float ak[kPer], av[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) ak[i] = av[i] = 0.f;
  int t_end = g.T;
  if (g.window > 0) t_end = min(g.T, s_first + kRows - 1 + g.window);
  for (int tb = s_first - s_first % kTile; tb < t_end; tb += kTile) {
    __syncthreads();
    load_rows(g, q, b, h, tb, kTile, g.Dqk, Qs, lq);
    load_rows(g, dO, b, h, tb, kTile, g.Dv, Gs, lv);
    if (threadIdx.x < kTile) {
      const int t = tb + threadIdx.x;
      const int64_t li = (int64_t(b) * g.H + h) * g.T + t;
      Ls[threadIdx.x] = t < g.T ? lse[li] : -INFINITY;
      Ds[threadIdx.x] = t < g.T ? Dt[li] : 0.f;
    }
    __syncthreads();
    if (!live) continue;
    const int t = tb + lane;
    float p = 0.f, ds = 0.f;
    if (t < g.T && visible(g, b, t, s) && Ls[lane] != -INFINITY) {
      float dot = 0.f, dp = 0.f;
      for (int d = 0; d < g.Dqk; ++d) dot += Qs[lane * lq + d] * Ks[w * g.Dqk + d];
      for (int d = 0; d < g.Dv; ++d) dp += Gs[lane * lv + d] * Vs[w * g.Dv + d];
      p = expf(g.scale * dot - Ls[lane]);
      ds = p * (dp - Ds[lane]);
    }
    for (int j = 0; j < kTile; ++j) {
      const float pj = __shfl_sync(0xffffffffu, p, j), dj = __shfl_sync(0xffffffffu, ds, j);
      if (pj == 0.f && dj == 0.f) continue;
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int d = lane + 32 * i;
        if (d < g.Dv) av[i] += pj * Gs[j * lv + d];
        if (d < g.Dqk) ak[i] += dj * Qs[j * lq + d];
      }
    }
  }
  if (!live) return;
  float* ok = dk + row_off(g, b, s, h, g.Dqk);
  float* ov = dv + row_off(g, b, s, h, g.Dv);
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int d = lane + 32 * i;
    if (d < g.Dqk) ok[d] = g.scale * ak[i];
    if (d < g.Dv) ov[d] = av[i];
  }
}

Geo geo(const AttnShape& sh, const int32_t* seg) {
  if (sh.Dqk > kMaxD || sh.Dv > kMaxD || sh.Dqk < 1 || sh.Dv < 1)
    throw Error("cuda attention: head dims Dqk=" + std::to_string(sh.Dqk) + " Dv=" + std::to_string(sh.Dv) +
                " are outside 1.." + std::to_string(kMaxD));
  return {sh.B, sh.T, sh.H, sh.Dqk, sh.Dv, sh.scale, sh.window, seg};
}

template <class K>
void set_smem(K kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    TREX_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

// --- The GEMM path ---------------------------------------------------------------------------

// Row t of head (b, h): the scaled scores S [T, T] -> P (0 where the key is not visible) and
// lse[b, h, t] (-inf and a zero row when no key is visible). One block per row.
__global__ void softmax_rows_k(Geo g, int b, int h, float* __restrict__ S, float* __restrict__ lse) {
  const int t = blockIdx.x;
  float* row = S + int64_t(t) * g.T;
  float m = -INFINITY;
  for (int s = threadIdx.x; s <= t; s += blockDim.x)
    if (visible(g, b, t, s)) m = fmaxf(m, row[s]);
  m = block_max(m);
  float l = 0.f;
  if (m != -INFINITY)
    for (int s = threadIdx.x; s <= t; s += blockDim.x)
      if (visible(g, b, t, s)) l += expf(row[s] - m);
  l = block_sum(l);
  for (int s = threadIdx.x; s < g.T; s += blockDim.x)
    row[s] = (m != -INFINITY && visible(g, b, t, s)) ? expf(row[s] - m) / l : 0.f;
  if (threadIdx.x == 0) lse[(int64_t(b) * g.H + h) * g.T + t] = m == -INFINITY ? -INFINITY : m + logf(l);
}

// Backward: S -> P = exp(S - lse) where visible (in place).
__global__ void probs_from_lse_k(Geo g, int b, int h, float* __restrict__ S, const float* __restrict__ lse) {
  const int64_t n = int64_t(g.T) * g.T;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int t = static_cast<int>(i / g.T), s = static_cast<int>(i % g.T);
    const float L = lse[(int64_t(b) * g.H + h) * g.T + t];
    S[i] = (L != -INFINITY && visible(g, b, t, s)) ? expf(S[i] - L) : 0.f;
  }
}

// dS = P (dP - Dt[t]) (into dP).
__global__ void dscores_k(Geo g, int b, int h, const float* __restrict__ P, float* __restrict__ dP,
                          const float* __restrict__ Dt) {
  const int64_t n = int64_t(g.T) * g.T;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int t = static_cast<int>(i / g.T);
    dP[i] = P[i] * (dP[i] - Dt[(int64_t(b) * g.H + h) * g.T + t]);
  }
}

// Which path: TREX_CUDA_ATTENTION = flash | gemm forces an f32 one; else bf16 operands
// (attention_bf16.cu) when the caller allows them and T <= 32768, the f32 GEMMs while
// T <= 16384, the flash kernels beyond.
enum class Path { Flash, Gemm, Bf16 };
Path path_of(const AttnShape& sh) {
  const char* e = std::getenv("TREX_CUDA_ATTENTION");
  if (e && std::string(e) == "flash") return Path::Flash;
  if (e && std::string(e) == "gemm") return Path::Gemm;
  if (sh.prec == Prec::BF16 && sh.T <= 32768) return Path::Bf16;
  return sh.T <= 16384 ? Path::Gemm : Path::Flash;
}

// Head (b, h)'s rows of a [B, T, H, D] tensor: its first element and row stride.
struct HeadView {
  int64_t off, ld;
};
HeadView head(const Geo& g, int b, int h, int D) { return {(int64_t(b) * g.T * g.H + h) * D, int64_t(g.H) * D}; }

void attention_fwd_gemm(const Ctx& c, const Geo& g, const float* q, const float* k, const float* v, float* o,
                        float* lse) {
  Scratch S(c, size_t(g.T) * g.T * sizeof(float));
  for (int b = 0; b < g.B; ++b)
    for (int h = 0; h < g.H; ++h) {
      const HeadView hq = head(g, b, h, g.Dqk), hv = head(g, b, h, g.Dv);
      gemm(c, Prec::F32, Prec::F32, false, true, g.T, g.T, g.Dqk, g.scale, q + hq.off, hq.ld, k + hq.off, hq.ld, 0.f,
           S.as<float>(), g.T);
      softmax_rows_k<<<g.T, 256, 0, c.stream>>>(g, b, h, S.as<float>(), lse);
      TREX_CUDA_LAUNCHED("attention_fwd softmax");
      gemm(c, Prec::F32, Prec::F32, false, false, g.T, g.Dv, g.T, 1.f, S.as<float>(), g.T, v + hv.off, hv.ld, 0.f,
           o + hv.off, hv.ld);
    }
}

void attention_bwd_gemm(const Ctx& c, const Geo& g, const float* q, const float* k, const float* v,
                        const float* lse, const float* Dt, const float* dO, float* dq, float* dk, float* dv) {
  const size_t tt = size_t(g.T) * g.T;
  Scratch P(c, tt * sizeof(float)), dP(c, tt * sizeof(float));
  for (int b = 0; b < g.B; ++b)
    for (int h = 0; h < g.H; ++h) {
      const HeadView hq = head(g, b, h, g.Dqk), hv = head(g, b, h, g.Dv);
      gemm(c, Prec::F32, Prec::F32, false, true, g.T, g.T, g.Dqk, g.scale, q + hq.off, hq.ld, k + hq.off, hq.ld, 0.f,
           P.as<float>(), g.T);
      probs_from_lse_k<<<grid_for(int64_t(tt)), 256, 0, c.stream>>>(g, b, h, P.as<float>(), lse);
      TREX_CUDA_LAUNCHED("attention_bwd probs");
      gemm(c, Prec::F32, Prec::F32, false, true, g.T, g.T, g.Dv, 1.f, dO + hv.off, hv.ld, v + hv.off, hv.ld, 0.f,
           dP.as<float>(), g.T);
      gemm(c, Prec::F32, Prec::F32, true, false, g.T, g.Dv, g.T, 1.f, P.as<float>(), g.T, dO + hv.off, hv.ld, 0.f,
           dv + hv.off, hv.ld);
      dscores_k<<<grid_for(int64_t(tt)), 256, 0, c.stream>>>(g, b, h, P.as<float>(), dP.as<float>(), Dt);
      TREX_CUDA_LAUNCHED("attention_bwd dscores");
      gemm(c, Prec::F32, Prec::F32, false, false, g.T, g.Dqk, g.T, g.scale, dP.as<float>(), g.T, k + hq.off, hq.ld,
           0.f, dq + hq.off, hq.ld);
      gemm(c, Prec::F32, Prec::F32, true, false, g.T, g.Dqk, g.T, g.scale, dP.as<float>(), g.T, q + hq.off, hq.ld,
           0.f, dk + hq.off, hq.ld);
    }
}

}  // namespace

void attention_fwd(const Ctx& c, const AttnShape& sh, const float* q, const float* k, const float* v, float* o,
                   float* lse, const int32_t* seg) {
  if (sh.B <= 0 || sh.T <= 0 || sh.H <= 0) return;
  if (sh.rows() != sh.T || sh.acc_dkv)
    throw Error("cuda attention: query rows Tq != T and acc_dkv (context parallelism) are CPU-only");
  const Path path = path_of(sh);
  if (path != Path::Flash) {
    const Geo g{sh.B, sh.T, sh.H, sh.Dqk, sh.Dv, sh.scale, sh.window, seg};
    if (path == Path::Bf16)
      attention_fwd_bf16(c, g, q, k, v, o, lse);
    else
      attention_fwd_gemm(c, g, q, k, v, o, lse);
    return;
  }
  const Geo g = geo(sh, seg);
  const size_t smem = (kTile * (g.Dqk + 1) + kTile * (g.Dv + 1) + kRows * g.Dqk) * sizeof(float);
  set_smem(attn_fwd_k, smem);
  const dim3 grid((g.T + kRows - 1) / kRows, g.H, g.B);
  attn_fwd_k<<<grid, kRows * 32, smem, c.stream>>>(g, q, k, v, o, lse);
  TREX_CUDA_LAUNCHED("attention_fwd");
}

void attention_bwd(const Ctx& c, const AttnShape& sh, const float* q, const float* k, const float* v, const float* o,
                   const float* lse, const float* dO, float* dq, float* dk, float* dv, const int32_t* seg) {
  if (sh.B <= 0 || sh.T <= 0 || sh.H <= 0) return;
  if (sh.rows() != sh.T || sh.acc_dkv)
    throw Error("cuda attention: query rows Tq != T and acc_dkv (context parallelism) are CPU-only");
  const Path path = path_of(sh);
  const Geo g = path != Path::Flash ? Geo{sh.B, sh.T, sh.H, sh.Dqk, sh.Dv, sh.scale, sh.window, seg} : geo(sh, seg);
  const int64_t rows = int64_t(g.B) * g.T * g.H;
  Scratch Dt(c, rows * sizeof(float));
  attn_rowdot_k<<<static_cast<unsigned>((rows + kRows - 1) / kRows), kRows * 32, 0, c.stream>>>(g, o, dO,
                                                                                                 Dt.as<float>());
  TREX_CUDA_LAUNCHED("attention_bwd rowdot");
  if (path == Path::Bf16) {
    attention_bwd_bf16(c, g, q, k, v, lse, Dt.as<float>(), dO, dq, dk, dv);
    return;
  }
  if (path == Path::Gemm) {
    attention_bwd_gemm(c, g, q, k, v, lse, Dt.as<float>(), dO, dq, dk, dv);
    return;
  }
  const dim3 grid((g.T + kRows - 1) / kRows, g.H, g.B);
  const size_t smem_q =
      (kTile * (g.Dqk + 1) + kTile * (g.Dv + 1) + kRows * g.Dqk + kRows * g.Dv) * sizeof(float);
  set_smem(attn_dq_k, smem_q);
  attn_dq_k<<<grid, kRows * 32, smem_q, c.stream>>>(g, q, k, v, lse, Dt.as<float>(), dO, dq);
  TREX_CUDA_LAUNCHED("attention_bwd dq");
  const size_t smem_kv = smem_q + 2 * kTile * sizeof(float);
  set_smem(attn_dkv_k, smem_kv);
  attn_dkv_k<<<grid, kRows * 32, smem_kv, c.stream>>>(g, q, k, v, lse, Dt.as<float>(), dO, dk, dv);
  TREX_CUDA_LAUNCHED("attention_bwd dk dv");
}

}  // namespace trex::kern::cuda
