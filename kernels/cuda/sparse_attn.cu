// Sparse shared-KV sink attention on CUDA (kernels/sparse_attn.h: DeepSeek-V4's attention core),
// forward and backward, f32 throughout. The per-(query, head) arithmetic is kernels/hd/sparse_attn.h
// and kernels/hd/dot.h; the CPU op harness runs it in these kernels' order against the reference
// (tests/ops/sparse_attn_hd_model.h). These kernels walk the lists.
// Forward and dq: a block per (query i, group of up to 8 heads), a warp per head. The block gathers
// the query's listed kv rows into shared memory in tiles of 32 (all its heads share them; its heads'
// q rows, and dO for dq, stay in shared memory too). In a tile, lane j takes row j's score (a D-long
// dot product, four running sums, row stride D + 1: no bank conflicts), the warp updates its online
// softmax started from the sink, then each lane accumulates output dims lane, lane + 32, ...
// (D <= 512) over the tile's rows. dq: p = exp(scale q.k - lse), ds = scale p (dO.k - dO.o),
// dq = sum ds k, the same walk.
// dkv (accumulated onto every listed row; a row is listed by many queries): the queries are cut into
// C fixed chunks (hd::sattn_dkv_chunks: a function of N, M and D only); block c walks its chunk's
// queries in order and adds each query's contributions [rows, D] = [scale dS | P] [rows, 2H] x
// [q ; dO] [2H, D] into its own [M, D] copy (chunk 0 straight into dkv): a query's rows are
// distinct, so no two threads add to one element at a time. Per tile of rows and pass of up to 64
// heads, P and dS [heads, 32] go to shared memory (a warp per head, a lane per row), then a thread
// per (dim, 8 rows) sums over the heads. The copies are then added to dkv in chunk order, and dsink
// sums per-query terms in a fixed order: every result is independent of the launch and bitwise
// reproducible. Not the CPU's bits (the sums run in another order): the op harness holds them to
// the CPU kernels' bounds against the reference in double.
// SparseAttnShape::prec == BF16 runs the same f32 kernels (bf16 rounding is allowed, not required);
// tensor-core (mma) paths for it are not written yet. The workspace argument is not used: the
// delta, dsink and dkv-copy scratch comes from Scratch (up to 1 GiB of copies).
#include <algorithm>
#include <string>
#include "kernels/cuda/check.h"
#include "kernels/cuda/ops_v4attn.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/hd/dot.h"
#include "kernels/hd/sparse_attn.h"

namespace trex::kern::cuda {

namespace {

constexpr int kTile = 32;     // listed rows per shared-memory tile
constexpr int kHeads = 8;     // heads (warps) per block in forward and dq
constexpr int kMaxD = 512;    // largest head dim (each lane keeps D / 32 output dims)
constexpr int kPer = kMaxD / 32;
constexpr int kDkvThreads = 256;
constexpr int kDkvHeads = 64;  // heads per pass of the dkv kernel (its P and dS tiles)
constexpr int kDkvRows = 8;    // rows per thread in the dkv product

struct Args {
  int64_t N, M;
  int H, D;
  float scale;
};

// Tile rows idx[b + j0 .. b + j0 + nt) of kv into Ks [kTile, D + 1].
__device__ __forceinline__ void gather_tile(const Args& a, const float* __restrict__ kv,
                                            const int32_t* __restrict__ idx, int64_t first, int nt, float* Ks) {
  const int ld = a.D + 1;
  for (int e = threadIdx.x; e < nt * a.D; e += blockDim.x) {
    const int j = e / a.D, d = e - j * a.D;
    Ks[j * ld + d] = kv[int64_t(idx[first + j]) * a.D + d];
  }
}

// Rows (i, h0 .. h0 + blockDim / 32) of a [N, H, D] tensor into S [heads, D] (zeros past H).
__device__ __forceinline__ void load_heads(const Args& a, const float* __restrict__ x, int64_t i, int h0, float* S) {
  const int nh = blockDim.x >> 5;
  for (int e = threadIdx.x; e < nh * a.D; e += blockDim.x) {
    const int hh = h0 + e / a.D;
    S[e] = hh < a.H ? x[(i * a.H + hh) * a.D + e % a.D] : 0.f;
  }
}

__global__ void fwd_k(Args a, const float* __restrict__ q, const float* __restrict__ kv,
                      const int64_t* __restrict__ off, const int32_t* __restrict__ idx,
                      const float* __restrict__ sink, float* __restrict__ o, float* __restrict__ lse) {
  extern __shared__ float sm[];
  const int ld = a.D + 1, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* Ks = sm;                // [kTile, D + 1]
  float* Qs = Ks + kTile * ld;   // [heads, D]
  const int64_t i = blockIdx.x;
  const int h0 = blockIdx.y * (blockDim.x >> 5), h = h0 + w;
  const bool live = h < a.H;
  load_heads(a, q, i, h0, Qs);
  const float* qh = Qs + w * a.D;
  const int64_t b = off[i], n = off[i + 1] - b;
  hd::SattnRow r = hd::sattn_start(sink, live ? h : 0);
  float acc[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) acc[k] = 0.f;
  for (int64_t j0 = 0; j0 < n; j0 += kTile) {
    const int nt = static_cast<int>(n - j0 < kTile ? n - j0 : kTile);
    __syncthreads();  // the previous tile (and, first, Qs) done
    gather_tile(a, kv, idx, b + j0, nt, Ks);
    __syncthreads();
    if (!live) continue;
    float s = -INFINITY;
    if (lane < nt) {
      const float* kr = Ks + lane * ld;
      s = a.scale * hd::dot4(qh, kr, a.D);
    }
    const float mn = hd::sattn_newmax(r.m, warp_max(s));
    const float p = hd::sattn_prob(s, mn);
    const float corr = hd::sattn_corr(r.m, mn);
    r = hd::sattn_update(r, mn, warp_sum(p));
#pragma unroll
    for (int k = 0; k < kPer; ++k) acc[k] *= corr;
    for (int j = 0; j < nt; ++j) {
      const float pj = __shfl_sync(0xffffffffu, p, j);
      const float* kr = Ks + j * ld;
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const int d = lane + 32 * k;
        if (d < a.D) acc[k] += pj * kr[d];
      }
    }
  }
  if (!live) return;
  const bool none = r.m == -INFINITY;
  float* orow = o + (i * a.H + h) * a.D;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int d = lane + 32 * k;
    if (d < a.D) orow[d] = none ? 0.f : acc[k] / r.l;
  }
  if (lane == 0) lse[i * a.H + h] = hd::sattn_lse(r);
}

// delta [N, H] = dO . o (a warp per row) and, with a sink, T [N, H] = the row's dsink term.
__global__ void delta_k(Args a, const float* __restrict__ o, const float* __restrict__ dO,
                        const float* __restrict__ lse, const float* __restrict__ sink, float* __restrict__ delta,
                        float* __restrict__ T) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= a.N * a.H) return;
  float s = 0.f;
  for (int d = lane; d < a.D; d += 32) s += dO[row * a.D + d] * o[row * a.D + d];
  s = warp_sum(s);
  if (lane == 0) {
    delta[row] = s;
    if (sink) T[row] = hd::sattn_dsink_term(sink[row % a.H], lse[row], s);
  }
}

// dsink[h] += sum_i T[i, h]: a block per head, a fixed order for a fixed block size.
__global__ void dsink_k(Args a, const float* __restrict__ T, float* __restrict__ dsink) {
  const int h = blockIdx.x;
  float s = 0.f;
  for (int64_t i = threadIdx.x; i < a.N; i += blockDim.x) s += T[i * a.H + h];
  s = block_sum(s);
  if (threadIdx.x == 0) dsink[h] += s;
}

__global__ void dq_k(Args a, const float* __restrict__ q, const float* __restrict__ kv, const int64_t* __restrict__ off,
                     const int32_t* __restrict__ idx, const float* __restrict__ lse, const float* __restrict__ delta,
                     const float* __restrict__ dO, float* __restrict__ dq) {
  extern __shared__ float sm[];
  const int ld = a.D + 1, nh = blockDim.x >> 5, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* Ks = sm;                // [kTile, D + 1]
  float* Qs = Ks + kTile * ld;   // [heads, D]
  float* Gs = Qs + nh * a.D;     // [heads, D] dO
  const int64_t i = blockIdx.x;
  const int h0 = blockIdx.y * nh, h = h0 + w;
  const bool live = h < a.H;
  load_heads(a, q, i, h0, Qs);
  load_heads(a, dO, i, h0, Gs);
  const float* qh = Qs + w * a.D;
  const float* gh = Gs + w * a.D;
  const float L = live ? lse[i * a.H + h] : -INFINITY;
  const float dl = live ? delta[i * a.H + h] : 0.f;
  const bool skip = L == -INFINITY;  // the reference leaves such a query out: dq = 0
  const int64_t b = off[i], n = off[i + 1] - b;
  float acc[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) acc[k] = 0.f;
  for (int64_t j0 = 0; j0 < n; j0 += kTile) {
    const int nt = static_cast<int>(n - j0 < kTile ? n - j0 : kTile);
    __syncthreads();
    gather_tile(a, kv, idx, b + j0, nt, Ks);
    __syncthreads();
    if (!live || skip) continue;
    float ds = 0.f;
    if (lane < nt) {
      const float* kr = Ks + lane * ld;
      ds = hd::sattn_ds(hd::sattn_bwd_prob(hd::dot4(qh, kr, a.D), a.scale, L), hd::dot4(gh, kr, a.D), dl, a.scale);
    }
    for (int j = 0; j < nt; ++j) {
      const float dj = __shfl_sync(0xffffffffu, ds, j);
      const float* kr = Ks + j * ld;
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const int d = lane + 32 * k;
        if (d < a.D) acc[k] += dj * kr[d];
      }
    }
  }
  if (!live) return;
  float* out = dq + (i * a.H + h) * a.D;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int d = lane + 32 * k;
    if (d < a.D) out[d] = acc[k];
  }
}

// Chunk blockIdx.x of C: queries [N c / C, N (c + 1) / C) in order, their dkv contributions into
// dst = dkv (chunk 0) or copies + (c - 1) M D. Per query and tile of its rows, per pass of up to
// kDkvHeads heads: P and dS [heads, kTile] into shared memory (warp per head, lane per row), then
// dst[row j, d] += sum_h dS[h, j] q[i, h, d] + P[h, j] dO[i, h, d], a thread per (d, 8 rows).
__global__ void dkv_k(Args a, int C, const float* __restrict__ q, const float* __restrict__ kv,
                      const int64_t* __restrict__ off, const int32_t* __restrict__ idx, const float* __restrict__ lse,
                      const float* __restrict__ delta, const float* __restrict__ dO, float* __restrict__ dkv,
                      float* __restrict__ copies) {
  extern __shared__ float sm[];
  const int ld = a.D + 1, nw = blockDim.x >> 5, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* Ks = sm;                      // [kTile, D + 1]
  float* Ps = Ks + kTile * ld;         // [kDkvHeads, kTile]
  float* Ss = Ps + kDkvHeads * kTile;  // [kDkvHeads, kTile]
  int* skip = reinterpret_cast<int*>(Ss + kDkvHeads * kTile);  // [kDkvHeads]
  int* rows = skip + kDkvHeads;                                // [kTile]
  const int c = blockIdx.x;
  float* dst = c == 0 ? dkv : copies + int64_t(c - 1) * a.M * a.D;
  const int64_t i_end = a.N * (c + 1) / C;
  for (int64_t i = a.N * c / C; i < i_end; ++i) {
    const int64_t b = off[i], n = off[i + 1] - b;
    const float* qi = q + i * a.H * a.D;
    const float* gi = dO + i * a.H * a.D;
    for (int64_t j0 = 0; j0 < n; j0 += kTile) {
      const int nt = static_cast<int>(n - j0 < kTile ? n - j0 : kTile);
      __syncthreads();  // the previous tile's adds done
      gather_tile(a, kv, idx, b + j0, nt, Ks);
      if (threadIdx.x < nt) rows[threadIdx.x] = idx[b + j0 + threadIdx.x];
      for (int h0 = 0; h0 < a.H; h0 += kDkvHeads) {
        const int hn = min(kDkvHeads, a.H - h0);
        __syncthreads();  // Ks and rows loaded; the previous pass's Ps / Ss read
        for (int hh = w; hh < hn; hh += nw) {
          const int h = h0 + hh;
          const float L = lse[i * a.H + h], dl = delta[i * a.H + h];
          float p = 0.f, ds = 0.f;
          if (lane < nt && L != -INFINITY) {
            const float* kr = Ks + lane * ld;
            const float* qh = qi + int64_t(h) * a.D;
            const float* gh = gi + int64_t(h) * a.D;
            p = hd::sattn_bwd_prob(hd::dot4(qh, kr, a.D), a.scale, L);
            ds = hd::sattn_ds(p, hd::dot4(gh, kr, a.D), dl, a.scale);
          }
          Ps[hh * kTile + lane] = p;
          Ss[hh * kTile + lane] = ds;
          if (lane == 0) skip[hh] = L == -INFINITY;
        }
        __syncthreads();
        const int groups = (nt + kDkvRows - 1) / kDkvRows;
        for (int e = threadIdx.x; e < groups * a.D; e += blockDim.x) {
          const int g = e / a.D, d = e - g * a.D, jb = g * kDkvRows;
          float cacc[kDkvRows];
#pragma unroll
          for (int r = 0; r < kDkvRows; ++r) cacc[r] = 0.f;
          for (int hh = 0; hh < hn; ++hh) {
            if (skip[hh]) continue;  // a query without keys adds nothing (the reference skips it)
            const int64_t qo = int64_t(h0 + hh) * a.D + d;
            const float qv = qi[qo], gv = gi[qo];
            const float* ph = Ps + hh * kTile + jb;
            const float* sh = Ss + hh * kTile + jb;
#pragma unroll
            for (int r = 0; r < kDkvRows; ++r) cacc[r] += sh[r] * qv + ph[r] * gv;
          }
#pragma unroll
          for (int r = 0; r < kDkvRows; ++r)
            if (jb + r < nt) dst[int64_t(rows[jb + r]) * a.D + d] += cacc[r];
        }
      }
    }
  }
}

// dkv [n] += copies [c, n] for c = 0 .. C - 2 in order.
__global__ void add_copies_k(int64_t n, int C, const float* __restrict__ copies, float* __restrict__ dkv) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    float s = dkv[e];
    for (int c = 0; c + 1 < C; ++c) s += copies[int64_t(c) * n + e];
    dkv[e] = s;
  }
}

Args args_of(const SparseAttnShape& sh, int64_t M) {
  if (sh.N < 0 || sh.H <= 0 || sh.D <= 0 || M < 0)
    throw Error("cuda sparse_attn: bad shape N=" + std::to_string(sh.N) + " H=" + std::to_string(sh.H) +
                " D=" + std::to_string(sh.D) + " M=" + std::to_string(M));
  if (sh.D > kMaxD)
    throw Error("cuda sparse_attn: head dim D=" + std::to_string(sh.D) + " is above " + std::to_string(kMaxD) +
                ", the largest the CUDA kernel keeps per warp");
  return {sh.N, M, sh.H, sh.D, sh.scale};
}

template <class K>
void set_smem(K kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    TREX_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

// Warps per block in forward and dq: one per head, up to kHeads.
int heads_per_block(int H) { return H < kHeads ? H : kHeads; }

}  // namespace

void sparse_attn_fwd(const Ctx& c, const SparseAttnShape& sh, const float* q, const float* kv, int64_t M,
                     const int64_t* off, const int32_t* idx, const float* sink, float* o, float* lse) {
  const Args a = args_of(sh, M);
  if (a.N == 0) return;
  const int hb = heads_per_block(a.H);
  const size_t smem = (size_t(kTile) * (a.D + 1) + size_t(hb) * a.D) * sizeof(float);
  set_smem(fwd_k, smem);
  const dim3 grid(static_cast<unsigned>(a.N), static_cast<unsigned>((a.H + hb - 1) / hb));
  fwd_k<<<grid, hb * 32, smem, c.stream>>>(a, q, kv, off, idx, sink, o, lse);
  TREX_CUDA_LAUNCHED("sparse_attn_fwd");
}

void sparse_attn_bwd(const Ctx& c, const SparseAttnShape& sh, const float* q, const float* kv, int64_t M,
                     const int64_t* off, const int32_t* idx, const float* sink, const float* o, const float* lse,
                     const float* dO, float* dq, float* dkv, float* dsink, float* workspace) {
  (void)workspace;  // the kernels' scratch comes from Scratch (sizes the CPU's workspace does not cover)
  const Args a = args_of(sh, M);
  if ((sink == nullptr) != (dsink == nullptr))
    throw Error("cuda sparse_attn_bwd: dsink must be given exactly when sink is");
  if (a.N == 0) return;
  const int64_t rows = a.N * a.H;
  Scratch D(c, size_t(rows) * sizeof(float) * (sink ? 2 : 1));
  float* delta = D.as<float>();
  float* T = sink ? delta + rows : nullptr;
  delta_k<<<static_cast<unsigned>((rows + 7) / 8), 256, 0, c.stream>>>(a, o, dO, lse, sink, delta, T);
  TREX_CUDA_LAUNCHED("sparse_attn_bwd delta");
  if (sink) {
    dsink_k<<<a.H, 256, 0, c.stream>>>(a, T, dsink);
    TREX_CUDA_LAUNCHED("sparse_attn_bwd dsink");
  }
  const int hb = heads_per_block(a.H);
  const size_t smem_q = (size_t(kTile) * (a.D + 1) + 2 * size_t(hb) * a.D) * sizeof(float);
  set_smem(dq_k, smem_q);
  const dim3 grid(static_cast<unsigned>(a.N), static_cast<unsigned>((a.H + hb - 1) / hb));
  dq_k<<<grid, hb * 32, smem_q, c.stream>>>(a, q, kv, off, idx, lse, delta, dO, dq);
  TREX_CUDA_LAUNCHED("sparse_attn_bwd dq");
  if (a.M == 0) return;  // no kv rows: every list is empty
  const int C = hd::sattn_dkv_chunks(a.N, a.M, a.D);
  const int64_t n = a.M * a.D;
  Scratch copies(c, size_t(C - 1) * size_t(n) * sizeof(float));
  if (C > 1)
    TREX_CUDA_CHECK(cudaMemsetAsync(copies.as<float>(), 0, size_t(C - 1) * size_t(n) * sizeof(float), c.stream));
  const size_t smem_kv = (size_t(kTile) * (a.D + 1) + 2 * size_t(kDkvHeads) * kTile) * sizeof(float) +
                         (kDkvHeads + kTile) * sizeof(int);
  set_smem(dkv_k, smem_kv);
  dkv_k<<<C, kDkvThreads, smem_kv, c.stream>>>(a, C, q, kv, off, idx, lse, delta, dO, dkv, copies.as<float>());
  TREX_CUDA_LAUNCHED("sparse_attn_bwd dkv");
  if (C > 1) {
    add_copies_k<<<grid_for(n), 256, 0, c.stream>>>(n, C, copies.as<float>(), dkv);
    TREX_CUDA_LAUNCHED("sparse_attn_bwd dkv copies");
  }
}

}  // namespace trex::kern::cuda
