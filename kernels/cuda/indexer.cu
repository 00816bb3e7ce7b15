// DeepSeek-V4's lightning-indexer top-k on CUDA (kernels/indexer.h), forward only. The per-query
// math (head terms, the valid count, the rank keys, the radix pass) is kernels/hd/indexer.h, which
// the CPU op harness runs against the reference's sort; this kernel walks the queries.
// A block of 8 warps per query (blocks loop over the queries; each block keeps one score row of
// nw floats in scratch):
//   scores: the query's q [nh, dI] and weights in shared memory, the batch row's keys gathered in
//     tiles of 32 (row stride dI + 1); lane j scores key j, warp w sums the heads h = w, w + 8, ...
//     in order, and the 8 warp partials are added in warp order (a fixed order: equal keys give
//     bitwise equal scores). Queries whose valid entries all fit the selection skip the scoring
//     (unless scores_out is asked for), as on the CPU.
//   selection: every valid entry's 64-bit rank key (score order with NaN highest and -0 == +0,
//     then the lower index) is distinct, so the cnt-th largest key, found by an 8-pass radix
//     selection over shared-memory histograms (integer counts: exact in any order), splits the
//     entries exactly; a block-wide ballot compaction then writes the selected indices in
//     ascending order, padded with -1. Results are independent of the launch.
#include <algorithm>
#include <string>
#include "kernels/cuda/check.h"
#include "kernels/cuda/ops_v4attn.h"
#include "kernels/hd/dot.h"
#include "kernels/hd/indexer.h"

namespace trex::kern::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kKeys = 32;        // keys per shared-memory tile
constexpr int kMaxBlocks = 1024;  // blocks (and score rows in scratch) at most

struct Args {
  int64_t B, T, nw, m, nwp;
  int nh, dI, topk;
  float scale;
};

__global__ void indexer_k(Args a, const float* __restrict__ q, const float* __restrict__ k,
                          const float* __restrict__ wts, const int32_t* __restrict__ pos, int32_t* __restrict__ cnt,
                          int32_t* __restrict__ sel, float* __restrict__ scores_out, float* __restrict__ rowbuf) {
  extern __shared__ float sm[];
  __shared__ int hist[256];
  __shared__ int warp_cnt[kWarps];
  __shared__ long long s_want;
  __shared__ int s_digit;
  const int ld = a.dI + 1, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* Qs = sm;                       // [nh, dI]
  float* Ks = Qs + a.nh * a.dI;         // [kKeys, dI + 1]
  float* Ws = Ks + kKeys * ld;          // [nh]
  float* Part = Ws + a.nh;              // [kWarps, kKeys]
  float* srow = rowbuf + blockIdx.x * a.nwp;
  const int64_t BT = a.B * a.T, kk = a.topk < a.nw ? a.topk : a.nw;
  for (int64_t bt = blockIdx.x; bt < BT; bt += gridDim.x) {
    const int64_t bb = bt / a.T;
    const int64_t nv = hd::indexer_nvalid(pos[bt], a.m, a.nw);
    const int64_t cn = kk < nv ? kk : nv;
    if ((nv > kk || scores_out) && nv > 0) {
      __syncthreads();  // the previous query's reads of Qs, Ws and srow done
      for (int e = threadIdx.x; e < a.nh * a.dI; e += blockDim.x) Qs[e] = q[bt * a.nh * a.dI + e];
      for (int e = threadIdx.x; e < a.nh; e += blockDim.x) Ws[e] = wts[bt * a.nh + e];
      for (int64_t s0 = 0; s0 < nv; s0 += kKeys) {
        const int nt = static_cast<int>(nv - s0 < kKeys ? nv - s0 : kKeys);
        __syncthreads();
        for (int e = threadIdx.x; e < nt * a.dI; e += blockDim.x) {
          const int j = e / a.dI, d = e - j * a.dI;
          Ks[j * ld + d] = k[(bb * a.nw + s0 + j) * a.dI + d];
        }
        __syncthreads();
        float part = 0.f;
        if (lane < nt) {
          const float* kr = Ks + lane * ld;
          for (int h = w; h < a.nh; h += kWarps) {
            const float* qh = Qs + h * a.dI;
            part = hd::indexer_head_term(part, Ws[h], hd::dot4(qh, kr, a.dI), a.scale);
          }
        }
        Part[w * kKeys + lane] = part;
        __syncthreads();
        if (threadIdx.x < nt) {
          float s = Part[threadIdx.x];
          for (int ww = 1; ww < kWarps; ++ww) s += Part[ww * kKeys + threadIdx.x];
          srow[s0 + threadIdx.x] = s;
        }
      }
      __syncthreads();  // srow complete
    }
    if (scores_out)
      for (int64_t s = threadIdx.x; s < a.nw; s += blockDim.x) scores_out[bt * a.nw + s] = s < nv ? srow[s] : -INFINITY;
    int32_t* so = sel + bt * a.topk;
    if (nv <= kk || cn == 0) {  // every valid entry (or none: topk = 0)
      for (int64_t j = threadIdx.x; j < a.topk; j += blockDim.x) so[j] = j < cn ? static_cast<int32_t>(j) : -1;
    } else {
      // The cn-th largest rank key among the nv valid entries, 8 bits at a time.
      uint64_t prefix = 0, mask = 0;
      int64_t want = cn;
      for (int shift = 56; shift >= 0; shift -= 8) {
        for (int j = threadIdx.x; j < 256; j += blockDim.x) hist[j] = 0;
        __syncthreads();
        for (int64_t s = threadIdx.x; s < nv; s += blockDim.x) {
          const uint64_t key = hd::indexer_rank_key(srow[s], s);
          if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
          int64_t wv = want;
          s_digit = hd::indexer_radix_pick(hist, &wv);
          s_want = wv;
        }
        __syncthreads();
        want = s_want;
        prefix |= uint64_t(s_digit) << shift;
        mask |= uint64_t(0xFF) << shift;
      }
      // Entries with key >= prefix (exactly cn of them), in index order.
      int64_t base = 0;
      for (int64_t s0 = 0; s0 < nv; s0 += blockDim.x) {
        const int64_t s = s0 + threadIdx.x;
        const bool take = s < nv && hd::indexer_rank_key(srow[s], s) >= prefix;
        const unsigned bal = __ballot_sync(0xffffffffu, take);
        __syncthreads();  // warp_cnt of the previous round read
        if (lane == 0) warp_cnt[w] = __popc(bal);
        __syncthreads();
        int before = 0, total = 0;
        for (int ww = 0; ww < kWarps; ++ww) {
          before += ww < w ? warp_cnt[ww] : 0;
          total += warp_cnt[ww];
        }
        if (take) so[base + before + __popc(bal & ((1u << lane) - 1u))] = static_cast<int32_t>(s);
        base += total;
      }
      for (int64_t j = cn + threadIdx.x; j < a.topk; j += blockDim.x) so[j] = -1;
    }
    if (threadIdx.x == 0) cnt[bt] = static_cast<int32_t>(cn);
  }
}

}  // namespace

void indexer_topk(const Ctx& c, const IndexerShape& sh, const float* q, const float* k, const float* wts,
                  const int32_t* pos, int32_t* cnt, int32_t* sel, float* scores_out, float* workspace) {
  (void)workspace;  // the score rows come from Scratch (one per block)
  if (sh.B < 0 || sh.T < 0 || sh.nw < 0 || sh.nh <= 0 || sh.dI <= 0 || sh.m < 1 || sh.topk < 0)
    throw Error("cuda indexer_topk: bad shape B=" + std::to_string(sh.B) + " T=" + std::to_string(sh.T) +
                " nw=" + std::to_string(sh.nw) + " nh=" + std::to_string(sh.nh) + " dI=" + std::to_string(sh.dI) +
                " m=" + std::to_string(sh.m) + " topk=" + std::to_string(sh.topk));
  if (sh.nw >= (int64_t{1} << 31))
    throw Error("cuda indexer_topk: nw=" + std::to_string(sh.nw) + " does not fit int32 indices");
  const int64_t BT = sh.B * sh.T;
  if (BT == 0) return;
  const Args a{sh.B, sh.T, sh.nw, sh.m, (sh.nw + 31) / 32 * 32, sh.nh, sh.dI, sh.topk, sh.softmax_scale};
  const size_t smem = (size_t(a.nh) * a.dI + size_t(kKeys) * (a.dI + 1) + a.nh + kWarps * kKeys) * sizeof(float);
  if (smem > 200 * 1024)
    throw Error("cuda indexer_topk: nh=" + std::to_string(a.nh) + " x dI=" + std::to_string(a.dI) +
                " query rows do not fit the kernel's shared memory (nh dI <= about 45000)");
  if (smem > 48 * 1024)
    TREX_CUDA_CHECK(cudaFuncSetAttribute(indexer_k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const int blocks = static_cast<int>(std::min<int64_t>(BT, kMaxBlocks));
  Scratch rows(c, size_t(blocks) * size_t(a.nwp) * sizeof(float));
  indexer_k<<<blocks, kThreads, smem, c.stream>>>(a, q, k, wts, pos, cnt, sel, scores_out, rows.as<float>());
  TREX_CUDA_LAUNCHED("indexer_topk");
}

}  // namespace trex::kern::cuda
