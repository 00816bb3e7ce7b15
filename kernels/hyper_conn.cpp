// mHC kernels (see kernels/hyper_conn.h). Baseline x86-64 code: the heavy work is the
// projection x @ fn^T and its two backward products, done by kern::gemm_f32 (oneDNN sgemm), and
// a few streaming loops over x written with independent partial sums so they vectorize. The
// per-token coefficient math (sigmoids, softmax, Sinkhorn and its backward, O(iters * n^2)) is
// the reference's (kernels/ref/hyper_conn.h).
//
// The per-token passes over the streams (dots, collapse, post mixing and its backward) run in
// kernels/cpu/hyper_conn_avx512.cpp on CPUs with AVX-512, else in their baseline loops
// (kernels/hyper_conn_baseline.h); both give the same bits, as do the coefficients of 4 streams,
// which AVX-512 computes for 16 tokens at a time. With AVX-512 the forward projection, the input
// gradient (dx += dmix @ fn + pre (x) dy - c x, one pass over each token's rows where the baseline
// runs sgemm and then its dx update) and the weight gradient dfn (summed in the same pass while
// the rows are in L1, where the baseline reads x again in an sgemm over all tokens) run on
// register-tiled loops there too, with fused multiply-adds.
//
// Work is cut into token chunks that depend only on the shape; each chunk runs its passes back
// to back (projection + norm + coefficients + collapse in forward; dots, coefficient backward,
// dx and dfn in backward). Every GEMM runs on one thread (inside an active parallel region, or
// with one thread in all), so results are bitwise independent of the thread count. dfn is one GEMM
// per fixed column block over all tokens, or (AVX-512) partials of fixed chunk groups added in
// group order; dbase / dscale are summed over tokens in order.
#include "kernels/hyper_conn.h"
#include <omp.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#include "core/cpu.h"
#include "core/error.h"
#include "core/parallel.h"
#include "kernels/cpu/hyper_conn_avx512.h"
#include "kernels/cpu/kernel_scratch.h"
#include "kernels/gemm.h"
#include "kernels/hyper_conn_baseline.h"
#include "kernels/ref/hyper_conn.h"

namespace trex::kern {
namespace {

constexpr int kMaxN = kHcMaxStreams;  // stack buffers of n floats
constexpr int64_t kColBlock = 512;     // dfn column block

void check_shape(const HcShape& s, const char* fn, bool need_iters) {
  TREX_CHECK(s.N >= 0 && s.n >= 1 && s.n <= kMaxN && s.d >= 1, fn, ": N=", s.N, " n=", s.n, " d=", s.d);
  TREX_CHECK(!need_iters || s.iters >= 1, fn, ": iters=", s.iters);
  TREX_CHECK(s.hc_eps >= 0 && s.norm_eps >= 0, fn, ": hc_eps=", s.hc_eps, " norm_eps=", s.norm_eps);
}

// Tokens per chunk: 32, or 16 when N < 256 (more chunks to balance). Measured on 1 core
// (noisy shared VM; min of 5 runs, N=2048 d=1024 and N=512 d=7168, n=4): chunks of 32 beat
// 128 by ~15% in forward and ~25% in backward (the chunk's x is re-read from L2), although
// sgemm alone prefers longer chunks.
constexpr int64_t kMaxChunk = 32;
int64_t chunk_tokens(const HcShape& s) { return s.N < 256 || cpu_isa() >= Isa::Avx512 ? 16 : kMaxChunk; }

// The coefficients of 16 tokens at a time on AVX-512 (kernels/cpu/hyper_conn_avx512.h): DeepSeek-V4's
// 4 streams; other counts run the per-token code (the same bits).
bool lanes4(const HcShape& s) { return s.n == 4 && cpu_isa() >= Isa::Avx512; }

int64_t num_chunks(const HcShape& s) {
  const int64_t ct = chunk_tokens(s);
  return (s.N + ct - 1) / ct;
}

// fn(b) for b in [0, nb), dynamically scheduled. With more than one thread available it always
// runs inside an active parallel region (also for nb == 1), so the sgemm calls in fn run on a
// single thread and cannot split their reduction differently for another thread count.
template <class F>
void for_each_block(int64_t nb, F&& fn) {
  if (nb == 1 && !omp_in_parallel() && num_threads() > 1) {
#pragma omp parallel num_threads(2)
    {
      if (omp_get_thread_num() == 0) fn(int64_t{0});
    }
    return;
  }
  parallel_dynamic(nb, fn);
}

// The per-token loops: AVX-512 where the CPU has it, else the baseline (the same bits).
inline float dot(const float* a, const float* b, int64_t n) {
  return cpu_isa() >= Isa::Avx512 ? cpu::hc_dot_avx512(a, b, n) : hc_baseline::dot(a, b, n);
}

inline void collapse(int n, int64_t d, const float* w, const float* x, float* y) {
  if (cpu_isa() >= Isa::Avx512) return cpu::hc_collapse_avx512(n, d, w, x, y);
  hc_baseline::collapse(n, d, w, x, y);
}

// next: the next token's a and x are fetched on the way (AVX-512), which holds them at +d and +n d.
inline void stream_dots(int n, int64_t d, const float* a, const float* x, float* out, bool next = false) {
  if (cpu_isa() >= Isa::Avx512)
    return cpu::hc_dots_avx512(n, d, a, x, out, next ? a + d : nullptr, next ? x + n * d : nullptr);
  hc_baseline::dots(n, d, a, x, out);
}


// The projection's weights fn [R, K] as the forward's chunks read them: with AVX-512 and from
// kPackTokens tokens on, packed once a call (kernels/cpu/hyper_conn_avx512.h hc_pack_proj_avx512;
// 8192 tokens, n = 4, d = 1024, 2 Zen 5 cores: 6.3 ms against 9.7 unpacked); else fn itself. A
// decoding step's few tokens would not repay the copy. Either way the same bits.
constexpr int64_t kPackTokens = 64;
struct ProjWeights {
  const float* fn = nullptr;
  bool packed = false;
  std::vector<float> buf;
};
ProjWeights proj_weights(const HcShape& s, int R, const float* fn) {
  ProjWeights w;
  w.fn = fn;
  if (cpu_isa() < Isa::Avx512 || s.N < kPackTokens) return w;
  const int64_t K = s.n * s.d;
  w.buf.resize(static_cast<size_t>(cpu::hc_pack_proj_floats(R, K)) + 16);
  float* p = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(w.buf.data()) + 63) & ~uintptr_t{63});
  cpu::hc_pack_proj_avx512(R, K, fn, p);
  w.fn = p;
  w.packed = true;
  return w;
}

// Forward projection of one chunk of tokens [t0, t0+tc): mix = rstd * (x @ fn^T) ([tc, R]). With
// AVX-512 a register-tiled loop (kernels/cpu/hyper_conn_avx512.h): sgemm on these 32 x R x n d
// blocks packs fn again every call. Side by side over 8192 tokens (n = 4, d = 1024, 64-byte
// aligned rows, 2 Sapphire Rapids class cores) the sgemm calls took 10.0-14.2 ms, the loop 6.3-9.0.
void project_chunk(const HcShape& s, int R, int64_t t0, int64_t tc, const float* x, const ProjWeights& w, float* mix,
                   float* rstd) {
  const int64_t K = s.n * s.d;
  if (cpu_isa() >= Isa::Avx512) cpu::hc_project_avx512(R, K, tc, x + t0 * K, w.fn, mix + t0 * R, w.packed);
  else if (s.rows_invariant)
    gemm_rows_invariant(Prec::F32, Prec::F32, tc, R, K, 1.f, x + t0 * K, K, w.fn, K, 0.f, mix + t0 * R, R);
  else gemm_f32(false, true, tc, R, K, 1.f, x + t0 * K, K, w.fn, K, 0.f, mix + t0 * R, R);
  for (int64_t t = t0; t < t0 + tc; ++t) {
    const float* xt = x + t * K;
    const float r = 1.f / std::sqrt(dot(xt, xt, K) / static_cast<float>(K) + s.norm_eps);
    rstd[t] = r;
    for (int q = 0; q < R; ++q) mix[t * R + q] *= r;
  }
}

// Parameter gradients shared by pre and head backward.
// dmixs: [N, R] (dmix * rstd)  x: [N, K] -> dfn: [R, K] (+=), in fixed column blocks.
void dfn_gemm(const HcShape& s, int R, const float* dmixs, const float* x, float* dfn) {
  const int64_t K = s.n * s.d, nb = (K + kColBlock - 1) / kColBlock;
  for_each_block(nb, [&](int64_t b) {
    const int64_t c0 = b * kColBlock, cb = std::min(kColBlock, K - c0);
    gemm_f32(true, false, R, cb, s.N, 1.f, dmixs, R, x + c0, K, 1.f, dfn + c0, K);
  });
}

// The AVX-512 backward's part of a workspace, after the floats every path uses (start), 64-byte
// aligned: fn [R, K] packed for the input gradient (kernels/cpu/hyper_conn_avx512.h), then the
// projection's weight gradient in partials [groups, packed]: the chunks fall into at most
// kDfnGroups groups of consecutive chunks (a function of the shape), each group's run in order by
// one thread, its dfn summed into its own partial (laid out as the packed fn) by the input
// gradient's pass, the partials added in group order.
constexpr int64_t kDfnGroups = 16;
int64_t dfn_group_chunks(const HcShape& s) { return (num_chunks(s) + kDfnGroups - 1) / kDfnGroups; }
int64_t dfn_groups(const HcShape& s) { return (num_chunks(s) + dfn_group_chunks(s) - 1) / dfn_group_chunks(s); }

struct AvxBwd {
  float* fn_packed = nullptr;  // [hc_pack_fn_floats]
  float* part = nullptr;       // [groups, hc_pack_fn_floats]; null: the baseline path
};
size_t avx_bwd_floats(const HcShape& s, int R) {
  if (cpu_isa() < Isa::Avx512) return 0;
  return static_cast<size_t>((1 + dfn_groups(s)) * cpu::hc_pack_fn_floats(s.n, R, s.d)) + 32;
}
AvxBwd avx_bwd(const HcShape& s, int R, const float* fn, float* start) {
  auto align = [](float* p) { return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t{63}); };
  AvxBwd w;
  w.fn_packed = align(start);
  cpu::hc_pack_fn_avx512(s.n, R, s.d, fn, w.fn_packed);
  w.part = w.fn_packed + cpu::hc_pack_fn_floats(s.n, R, s.d);
  return w;
}

// The backward's chunk loop and dfn. AVX-512 (w.part set): body(c, part) for every chunk c, with
// part its group's partial of dfn (packed), which body adds the chunk's dmixs^T x to; groups spread
// over the threads; then dfn += the partials in group order. Else body(c, nullptr) for every chunk,
// then dfn_gemm over all tokens.
template <class Body>
void chunks_then_dfn(const HcShape& s, int R, const AvxBwd& w, const float* dmixs, const float* x, float* dfn,
                     Body&& body) {
  if (!w.part) {
    for_each_block(num_chunks(s), [&](int64_t c) { body(c, nullptr); });
    return dfn_gemm(s, R, dmixs, x, dfn);
  }
  const int64_t nc = num_chunks(s), per = dfn_group_chunks(s), P = cpu::hc_pack_fn_floats(s.n, R, s.d);
  for_each_block(dfn_groups(s), [&](int64_t g) {
    float* part = w.part + g * P;
    std::fill(part, part + P, 0.f);
    for (int64_t c = g * per; c < std::min(nc, (g + 1) * per); ++c) body(c, part);
  });
  // packed: for stream j and block b of 32 columns, [R, 32] (hc_pack_fn_avx512)
  const int64_t ng = dfn_groups(s), d = s.d, K = s.n * d, nb = (d + 31) / 32;
  parallel_for(s.n * nb, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t jb = b0; jb < b1; ++jb) {
      const int64_t j = jb / nb, i0 = jb % nb * 32, w0 = std::min<int64_t>(32, d - i0);
      for (int q = 0; q < R; ++q) {
        const int64_t o = (jb * R + q) * 32;
        float* out = dfn + q * K + j * d + i0;
        for (int64_t l = 0; l < w0; ++l) {
          float a = w.part[o + l];
          for (int64_t g = 1; g < ng; ++g) a += w.part[g * P + o + l];
          out[l] += a;
        }
      }
    }
  });
}

// dz: [N, R]  mix: [N, R] -> dbase: [R] (+=), dscale: [ngroups] (+=), summed over tokens in order.
void reduce_base_scale(const HcShape& s, int R, int ngroups, const float* dz, const float* mix, float* dbase,
                       float* dscale) {
  const int n = s.n;
  double ds[3] = {0, 0, 0};
  for (int q = 0; q < R; ++q) {
    const int g = std::min(q / n, ngroups - 1);
    double b = 0, sc = 0;
    for (int64_t t = 0; t < s.N; ++t) {
      b += dz[t * R + q];
      sc += static_cast<double>(dz[t * R + q]) * mix[t * R + q];
    }
    dbase[q] += static_cast<float>(b);
    ds[g] += sc;
  }
  for (int g = 0; g < ngroups; ++g) dscale[g] += static_cast<float>(ds[g]);
}

}  // namespace

void hc_pre_fwd(const HcShape& s, const float* x, const float* fn, const float* base, const float* scale, float* y,
                float* post, float* comb, float* mix, float* rstd) {
  check_shape(s, "hc_pre_fwd", true);
  if (s.N == 0) return;
  TREX_CHECK(x && fn && base && scale && y && post && comb && mix && rstd, "hc_pre_fwd: null pointer");
  const int n = s.n, R = (2 + n) * n;
  const int64_t d = s.d, K = n * d, ct = chunk_tokens(s);
  const ProjWeights w = proj_weights(s, R, fn);
  for_each_block(num_chunks(s), [&](int64_t c) {
    const int64_t t0 = c * ct, tc = std::min(ct, s.N - t0);
    project_chunk(s, R, t0, tc, x, w, mix, rstd);
    if (lanes4(s)) {  // 16 tokens' coefficients at a time, then each token's collapse
      float pre[cpu::kHcLanes * 4];
      for (int64_t g0 = t0; g0 < t0 + tc; g0 += cpu::kHcLanes) {
        const int64_t gn = std::min<int64_t>(cpu::kHcLanes, t0 + tc - g0);
        cpu::hc_coeffs4_fwd_avx512(s.iters, s.hc_eps, gn, mix + g0 * R, base, scale, pre, post + g0 * n,
                                   comb + g0 * n * n);
        for (int64_t t = g0; t < g0 + gn; ++t) collapse(n, d, pre + (t - g0) * n, x + t * K, y + t * d);
      }
      return;
    }
    float pre[kMaxN];
    for (int64_t t = t0; t < t0 + tc; ++t) {
      ref::hc_coeffs_fwd<float>(n, s.iters, s.hc_eps, mix + t * R, base, scale, pre, post + t * n,
                                comb + t * n * n, nullptr);
      collapse(n, d, pre, x + t * K, y + t * d);
    }
  });
}

size_t hc_pre_bwd_workspace_floats(const HcShape& s) {
  const size_t N = static_cast<size_t>(s.N), n = static_cast<size_t>(s.n), R = (2 + n) * n;
  return 2 * N * R + N * n + N + static_cast<size_t>(num_chunks(s)) * ref::hc_coeffs_scratch(s.n, s.iters) +
         avx_bwd_floats(s, static_cast<int>(R));
}

namespace {

// hc_post_bwd on tokens [t0, t1) (pointers at token 0): the AVX-512 loops or the baseline's.
void post_bwd_tokens(int n, int64_t d, int64_t t0, int64_t t1, const float* x, const float* f, const float* post,
                     const float* comb, const float* dout, float* dx, float* df, float* dpost, float* dcomb) {
  if (cpu_isa() >= Isa::Avx512) cpu::hc_post_bwd_avx512(n, d, t0, t1, x, f, post, comb, dout, dx, df, dpost, dcomb);
  else hc_baseline::post_bwd(n, d, t0, t1, x, f, post, comb, dout, dx, df, dpost, dcomb);
}

// hc_pre_bwd (next null: dx += the gradient, in place) or hc_pre_bwd_then_post (next set: dx is
// read; each chunk's sum goes to a scratch of the thread, the post step's dout).
void pre_bwd(const HcShape& s, const float* x, const float* fn, const float* base, const float* scale,
             const float* mix, const float* rstd, const float* dy, const float* dpost, const float* dcomb,
             const float* dx_in, float* dx, float* dfn, float* dbase, float* dscale, float* workspace,
             const HcPostBwd* next) {
  const int n = s.n, R = (2 + n) * n;
  const int64_t d = s.d, K = n * d, N = s.N, ct = chunk_tokens(s);
  const size_t cs = ref::hc_coeffs_scratch(n, s.iters);
  float* dz = workspace;        // [N, R] gradient of the pre-activations
  float* dmixs = dz + N * R;    // [N, R] dmix * rstd
  float* pre = dmixs + N * R;   // [N, n]
  float* cx = pre + N * n;      // [N] coefficient of x in dx (RMSNorm backward)
  float* scr = cx + N;          // [chunks, cs]
  const bool v512 = cpu_isa() >= Isa::Avx512, four = lanes4(s);
  const AvxBwd w = v512 ? avx_bwd(s, R, fn, scr + num_chunks(s) * cs) : AvxBwd{};
  // The thread's scratch: the coefficients' history (4 streams), then (next) the chunk's dx rows.
  const int64_t hist = four ? (cpu::hc_coeffs4_scratch_floats(s.iters) + 15) / 16 * 16 : 0;
  const int64_t rows = next ? ct * K : 0;
  auto chunk = [&](int64_t c, float* part) {
    const int64_t t0 = c * ct, tc = std::min(ct, N - t0);
    float* tls = hist + rows > 0 ? cpu::thread_scratch(static_cast<size_t>(hist + rows)) : nullptr;
    float* dxc = next ? tls + hist : dx + t0 * K;  // this chunk's dx rows
    if (next) std::memcpy(dxc, dx_in + t0 * K, static_cast<size_t>(tc * K) * sizeof(float));
    float dpre[kMaxChunk * kMaxN];  // [tc, n]
    for (int64_t t = t0; t < t0 + tc; ++t) {
      float* dp = dpre + (t - t0) * n;
      if (dy) stream_dots(n, d, dy + t * d, x + t * K, dp, t + 1 < N);
      else std::fill(dp, dp + n, 0.f);
    }
    if (four) {  // 16 tokens at a time, in the scratch of this thread (the same bits as below)
      for (int64_t g0 = t0; g0 < t0 + tc; g0 += cpu::kHcLanes)
        cpu::hc_coeffs4_bwd_avx512(s.iters, s.hc_eps, std::min<int64_t>(cpu::kHcLanes, t0 + tc - g0), mix + g0 * R,
                                   base, scale, dpre + (g0 - t0) * n, dpost ? dpost + g0 * n : nullptr,
                                   dcomb ? dcomb + g0 * n * n : nullptr, dz + g0 * R, pre + g0 * n, tls);
    } else {
      for (int64_t t = t0; t < t0 + tc; ++t)
        ref::hc_coeffs_bwd<float>(n, s.iters, s.hc_eps, mix + t * R, base, scale, dpre + (t - t0) * n,
                                  dpost ? dpost + t * n : nullptr, dcomb ? dcomb + t * n * n : nullptr, dz + t * R,
                                  pre + t * n, scr + c * cs);
    }
    for (int64_t t = t0; t < t0 + tc; ++t) {
      const float* m = mix + t * R;
      const float* z = dz + t * R;
      // dmix = dz * scale; the RMSNorm backward needs sum(g * xhat) = dmix . mix.
      const float r = rstd[t];
      float dm = 0;
      for (int q = 0; q < R; ++q) {
        const float dmq = z[q] * scale[std::min(q / n, 2)];
        dmixs[t * R + q] = dmq * r;
        dm += dmq * m[q];
      }
      cx[t] = r * r * dm / static_cast<float>(K);
    }
    // dx += dmixs @ fn + pre (x) dy - cx * x
    if (v512) {
      cpu::hc_pre_dx_avx512(n, R, d, tc, dmixs + t0 * R, w.fn_packed, pre + t0 * n, cx + t0,
                            dy ? dy + t0 * d : nullptr, x + t0 * K, dxc, true, part);
    } else {
      gemm_f32(false, false, tc, K, R, 1.f, dmixs + t0 * R, R, fn, K, 1.f, dxc, K);
      for (int64_t t = 0; t < tc; ++t)
        hc_baseline::dx_update(n, d, pre + (t0 + t) * n, cx[t0 + t], dy ? dy + (t0 + t) * d : nullptr,
                               x + (t0 + t) * K, dxc + t * K);
    }
    if (!next) return;
    // The post step on the chunk's tokens, its dout the rows just summed (hc_post_bwd's loops).
    const HcPostBwd& p = *next;
    const float *px = p.x + t0 * K, *pf = p.f + t0 * d, *pp = p.post + t0 * n, *pc = p.comb + t0 * n * n;
    float *pdx = p.dx + t0 * K, *pdf = p.df + t0 * d, *pdp = p.dpost + t0 * n, *pdc = p.dcomb + t0 * n * n;
    post_bwd_tokens(n, d, 0, tc, px, pf, pp, pc, dxc, pdx, pdf, pdp, pdc);
  };
  chunks_then_dfn(s, R, w, dmixs, x, dfn, chunk);
  reduce_base_scale(s, R, 3, dz, mix, dbase, dscale);
}

}  // namespace

void hc_pre_bwd(const HcShape& s, const float* x, const float* fn, const float* base, const float* scale,
                const float* mix, const float* rstd, const float* dy, const float* dpost, const float* dcomb,
                float* dx, float* dfn, float* dbase, float* dscale, float* workspace) {
  check_shape(s, "hc_pre_bwd", true);
  if (s.N == 0) return;
  TREX_CHECK(x && fn && base && scale && mix && rstd && dx && dfn && dbase && dscale && workspace,
             "hc_pre_bwd: null pointer");
  pre_bwd(s, x, fn, base, scale, mix, rstd, dy, dpost, dcomb, dx, dx, dfn, dbase, dscale, workspace, nullptr);
}

void hc_pre_bwd_then_post(const HcShape& s, const float* x, const float* fn, const float* base, const float* scale,
                          const float* mix, const float* rstd, const float* dy, const float* dpost, const float* dcomb,
                          const float* dx, float* dfn, float* dbase, float* dscale, float* workspace,
                          const HcPostBwd& next) {
  check_shape(s, "hc_pre_bwd_then_post", true);
  if (s.N == 0) return;
  TREX_CHECK(x && fn && base && scale && mix && rstd && dx && dfn && dbase && dscale && workspace && next.x &&
                 next.f && next.post && next.comb && next.dx && next.df && next.dpost && next.dcomb,
             "hc_pre_bwd_then_post: null pointer");
  TREX_CHECK(next.x != next.dx, "hc_pre_bwd_then_post: the post step's dx must not alias its x");
  pre_bwd(s, x, fn, base, scale, mix, rstd, dy, dpost, dcomb, dx, nullptr, dfn, dbase, dscale, workspace, &next);
}

void hc_post_fwd(const HcShape& s, const float* x, const float* f, const float* post, const float* comb,
                 float* out) {
  check_shape(s, "hc_post_fwd", false);
  if (s.N == 0) return;
  TREX_CHECK(x && f && post && comb && out, "hc_post_fwd: null pointer");
  TREX_CHECK(out != x, "hc_post_fwd: out must not alias x");
  const int n = s.n;
  const int64_t d = s.d, K = n * d;
  const bool v512 = cpu_isa() >= Isa::Avx512;
  parallel_for(s.N, std::max<int64_t>(1, 16384 / K), [&](int64_t t0, int64_t t1) {
    if (v512) cpu::hc_post_fwd_avx512(n, d, t0, t1, x, f, post, comb, out);
    else hc_baseline::post_fwd(n, d, t0, t1, x, f, post, comb, out);
  });
}

void hc_post_bwd(const HcShape& s, const float* x, const float* f, const float* post, const float* comb,
                 const float* dout, float* dx, float* df, float* dpost, float* dcomb) {
  check_shape(s, "hc_post_bwd", false);
  if (s.N == 0) return;
  TREX_CHECK(x && f && post && comb && dout && dx && df && dpost && dcomb, "hc_post_bwd: null pointer");
  const int n = s.n;
  const int64_t d = s.d, K = n * d;
  parallel_for(s.N, std::max<int64_t>(1, 8192 / K), [&](int64_t t0, int64_t t1) {
    post_bwd_tokens(n, d, t0, t1, x, f, post, comb, dout, dx, df, dpost, dcomb);
  });
}

void hc_head_fwd(const HcShape& s, const float* x, const float* hc_fn, const float* hc_base, const float* hc_scale,
                 float* y, float* mix, float* rstd) {
  check_shape(s, "hc_head_fwd", false);
  if (s.N == 0) return;
  TREX_CHECK(x && hc_fn && hc_base && hc_scale && y && mix && rstd, "hc_head_fwd: null pointer");
  const int n = s.n;
  const int64_t d = s.d, K = n * d, ct = chunk_tokens(s);
  const ProjWeights w = proj_weights(s, n, hc_fn);
  for_each_block(num_chunks(s), [&](int64_t c) {
    const int64_t t0 = c * ct, tc = std::min(ct, s.N - t0);
    project_chunk(s, n, t0, tc, x, w, mix, rstd);
    float pre[kMaxN];
    for (int64_t t = t0; t < t0 + tc; ++t) {
      for (int j = 0; j < n; ++j)
        pre[j] = ref::hc_sigmoid(mix[t * n + j] * hc_scale[0] + hc_base[j]) + s.hc_eps;
      collapse(n, d, pre, x + t * K, y + t * d);
    }
  });
}

size_t hc_head_bwd_workspace_floats(const HcShape& s) {
  const size_t N = static_cast<size_t>(s.N), n = static_cast<size_t>(s.n);
  return 3 * N * n + N + avx_bwd_floats(s, s.n);
}

void hc_head_bwd(const HcShape& s, const float* x, const float* hc_fn, const float* hc_base, const float* hc_scale,
                 const float* mix, const float* rstd, const float* dy, float* dx, float* dfn, float* dbase,
                 float* dscale, float* workspace) {
  check_shape(s, "hc_head_bwd", false);
  if (s.N == 0) return;
  TREX_CHECK(x && hc_fn && hc_base && hc_scale && mix && rstd && dy && dx && dfn && dbase && dscale && workspace,
             "hc_head_bwd: null pointer");
  const int n = s.n;
  const int64_t d = s.d, K = n * d, N = s.N, ct = chunk_tokens(s);
  float* dz = workspace;       // [N, n]
  float* dmixs = dz + N * n;   // [N, n]
  float* pre = dmixs + N * n;  // [N, n]
  float* cx = pre + N * n;     // [N]
  const bool v512 = cpu_isa() >= Isa::Avx512;
  const AvxBwd w = v512 ? avx_bwd(s, n, hc_fn, cx + N) : AvxBwd{};
  auto chunk = [&](int64_t c, float* part) {
    const int64_t t0 = c * ct, tc = std::min(ct, N - t0);
    float dyx[kMaxN];
    for (int64_t t = t0; t < t0 + tc; ++t) {
      const float r = rstd[t];
      float dm = 0;
      stream_dots(n, d, dy + t * d, x + t * K, dyx, t + 1 < N);
      for (int j = 0; j < n; ++j) {
        const float mj = mix[t * n + j];
        const float sg = ref::hc_sigmoid(mj * hc_scale[0] + hc_base[j]);
        pre[t * n + j] = sg + s.hc_eps;
        const float z = dyx[j] * sg * (1.f - sg);
        dz[t * n + j] = z;
        dmixs[t * n + j] = z * hc_scale[0] * r;
        dm += z * hc_scale[0] * mj;
      }
      cx[t] = r * r * dm / static_cast<float>(K);
    }
    // dx = dmixs @ fn + pre (x) dy - cx * x
    if (v512)
      return cpu::hc_pre_dx_avx512(n, n, d, tc, dmixs + t0 * n, w.fn_packed, pre + t0 * n, cx + t0, dy + t0 * d, x + t0 * K,
                                   dx + t0 * K, false, part);
    gemm_f32(false, false, tc, K, n, 1.f, dmixs + t0 * n, n, hc_fn, K, 0.f, dx + t0 * K, K);
    for (int64_t t = t0; t < t0 + tc; ++t)
      hc_baseline::dx_update(n, d, pre + t * n, cx[t], dy + t * d, x + t * K, dx + t * K);
  };
  chunks_then_dfn(s, n, w, dmixs, x, dfn, chunk);
  reduce_base_scale(s, n, 1, dz, mix, dbase, dscale);
}

}  // namespace trex::kern
