// AVX-512 gated window pooling. Lanes run over channels; a work item is one window and a block
// of up to kBlock channels (all of them for hd <= 512). Pass 1 takes the max logit over the
// window's slots, pass 2 sums e = exp(logit - max) and e * kv (out = their ratio); the backward
// adds a pass 3 that recomputes e and writes dkv, dgate and the dpb partial. Each pass reads the
// slot rows in order (contiguous runs of the block's channels) and keeps the per-channel max,
// sum and weighted sum in stack buffers; the window's rows stay in L2 between passes.
// Backward: windows are cut into compress_pool_chunks(B*nw) chunks (a function of the shape
// only), one dpb partial per chunk in the workspace, added in chunk order.
// GCC 12 reports false (maybe-)uninitialized warnings inside the AVX-512 intrinsic headers.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include "kernels/cpu/compress_pool_avx512.h"
#include <immintrin.h>
#include <algorithm>
#include <cstring>
#include <limits>
#include "core/parallel.h"
#include "kernels/compress_pool.h"
#include "kernels/cpu/simd_avx512.h"

namespace trex::kern::cpu {
namespace {

constexpr int64_t kBlock = 512;  // channels per work item (at most; stack buffers of 3 x 2 KiB)

using avx512::exp_ps;  // e^x, kernels/cpu/simd_avx512.h

using avx512::tail_mask;

struct Geo {
  int64_t T, m, hd, C, nw;  // C = c * hd
  int c;
};

// One series of m slots of a window: element offset of its row 0 at the item's first channel, and
// the matching column of pb.
struct Series {
  int64_t base, col;
};

// The series of window w of batch row b for the channel block starting at d0 (Ca of w-1, Cb of w).
inline int window_series(const Geo& g, int64_t b, int64_t w, int64_t d0, Series* s) {
  int n = 0;
  if (g.c == 2 && w > 0) s[n++] = {(b * g.T + (w - 1) * g.m) * g.C + d0, d0};
  const int64_t col = (g.c == 2 ? g.hd : 0) + d0;
  s[n++] = {(b * g.T + w * g.m) * g.C + col, col};
  return n;
}

// Per-window state: the channel block [d0, d0 + 16 nv) (last vector masked by ml) and the
// per-channel statistics in stack buffers: mx = max logit; pass 2: sm = sum e, ac = sum e * kv;
// backward pass 3: ac = out, sm = dout / sum.
struct Win {
  const Geo* g;
  const float *kv, *gate, *pb;
  float *dkv, *dgate, *part;
  float *mx, *sm, *ac;
  int64_t nv;
  __mmask16 ml;
};

// Rows r0 .. r0+R-1 of series s for every vector of the block; R rows share one load / store of
// the statistics. kPass 1: max; 2: sums; 3: backward writes (dkv, dgate, part += dlogit).
template <int kPass, int R>
inline void rows_step(const Win& k, const Series& s, int64_t r0) {
  const int64_t C = k.g->C;
  for (int64_t v = 0; v < k.nv; ++v) {
    const __mmask16 mk = v == k.nv - 1 ? k.ml : __mmask16(0xFFFF);
    const int64_t o = 16 * v;
    __m512 l[R];
#pragma GCC unroll 4
    for (int j = 0; j < R; ++j)
      l[j] = _mm512_add_ps(_mm512_maskz_loadu_ps(mk, k.gate + s.base + (r0 + j) * C + o),
                           _mm512_maskz_loadu_ps(mk, k.pb + (r0 + j) * C + s.col + o));
    __m512 m = _mm512_load_ps(k.mx + o);
    if constexpr (kPass == 1) {
#pragma GCC unroll 4
      for (int j = 0; j < R; ++j) m = _mm512_max_ps(m, l[j]);
      _mm512_store_ps(k.mx + o, m);
    } else if constexpr (kPass == 2) {
      __m512 sm = _mm512_load_ps(k.sm + o), ac = _mm512_load_ps(k.ac + o);
#pragma GCC unroll 4
      for (int j = 0; j < R; ++j) {
        const __m512 e = exp_ps(_mm512_sub_ps(l[j], m));
        sm = _mm512_add_ps(sm, e);
        ac = _mm512_fmadd_ps(e, _mm512_maskz_loadu_ps(mk, k.kv + s.base + (r0 + j) * C + o), ac);
      }
      _mm512_store_ps(k.sm + o, sm);
      _mm512_store_ps(k.ac + o, ac);
    } else {
      const __m512 gi = _mm512_load_ps(k.sm + o), out = _mm512_load_ps(k.ac + o);
#pragma GCC unroll 4
      for (int j = 0; j < R; ++j) {
        const int64_t off = s.base + (r0 + j) * C + o;
        float* pt = k.part + (r0 + j) * C + s.col + o;
        const __m512 e = exp_ps(_mm512_sub_ps(l[j], m));
        const __m512 dv = _mm512_mul_ps(e, gi);  // p * dout
        const __m512 dl = _mm512_mul_ps(dv, _mm512_sub_ps(_mm512_maskz_loadu_ps(mk, k.kv + off), out));
        _mm512_mask_storeu_ps(k.dkv + off, mk, dv);
        _mm512_mask_storeu_ps(k.dgate + off, mk, dl);
        _mm512_mask_storeu_ps(pt, mk, _mm512_add_ps(_mm512_maskz_loadu_ps(mk, pt), dl));
      }
    }
  }
}

template <int kPass>
void rows_pass(const Win& k, const Series* ser, int ns) {
  const int64_t m = k.g->m;
  for (int si = 0; si < ns; ++si) {
    int64_t r = 0;
    for (; r + 4 <= m; r += 4) rows_step<kPass, 4>(k, ser[si], r);
    switch (m - r) {
      case 3: rows_step<kPass, 3>(k, ser[si], r); break;
      case 2: rows_step<kPass, 2>(k, ser[si], r); break;
      case 1: rows_step<kPass, 1>(k, ser[si], r); break;
      default: break;
    }
  }
}

// Window w of row b, channels [d0, d0 + W) (W <= kBlock). The slots are read row by row (each a
// contiguous run of W floats: hardware prefetch friendly) while the per-channel statistics live in
// stack buffers (L1). Forward: writes out. Backward: writes dkv, dgate at the window's slots and
// adds dlogit into part ([m, C] partial of the window's chunk).
template <bool kBwd>
void window_block(const Geo& g, int64_t b, int64_t w, int64_t d0, int64_t W, const float* kv, const float* gate,
                  const float* pb, const float* dout, float* out, float* dkv, float* dgate, float* part) {
  alignas(64) float mx[kBlock], sm[kBlock], ac[kBlock];
  Series ser[2];
  const int ns = window_series(g, b, w, d0, ser);
  const int64_t nv = (W + 15) / 16;
  const Win k{&g, kv, gate, pb, dkv, dgate, part, mx, sm, ac, nv, tail_mask(W - 16 * (nv - 1))};
  for (int64_t v = 0; v < nv; ++v) {
    _mm512_store_ps(mx + 16 * v, _mm512_set1_ps(-std::numeric_limits<float>::infinity()));
    _mm512_store_ps(sm + 16 * v, _mm512_setzero_ps());
    _mm512_store_ps(ac + 16 * v, _mm512_setzero_ps());
  }
  rows_pass<1>(k, ser, ns);
  rows_pass<2>(k, ser, ns);
  const int64_t oo = (b * g.nw + w) * g.hd + d0;
  for (int64_t v = 0; v < nv; ++v) {
    const __mmask16 mk = v == nv - 1 ? k.ml : __mmask16(0xFFFF);
    const __m512 s = _mm512_load_ps(sm + 16 * v), o = _mm512_div_ps(_mm512_load_ps(ac + 16 * v), s);
    if constexpr (!kBwd) {
      _mm512_mask_storeu_ps(out + oo + 16 * v, mk, o);
    } else {  // ac <- out, sm <- dout / sum
      _mm512_store_ps(ac + 16 * v, o);
      _mm512_store_ps(sm + 16 * v, _mm512_div_ps(_mm512_maskz_loadu_ps(mk, dout + oo + 16 * v), s));
    }
  }
  if constexpr (kBwd) rows_pass<3>(k, ser, ns);
}

// Runs window_block for channel block cb (of kBlock channels) of window gw = b * nw + w.
template <bool kBwd>
void run_block(const Geo& g, int64_t gw, int64_t cb, const float* kv, const float* gate, const float* pb,
               const float* dout, float* out, float* dkv, float* dgate, float* part) {
  const int64_t d0 = cb * kBlock;
  window_block<kBwd>(g, gw / g.nw, gw % g.nw, d0, std::min(kBlock, g.hd - d0), kv, gate, pb, dout, out, dkv, dgate,
                     part);
}

}  // namespace

void compress_pool_fwd_avx512(int64_t B, int64_t T, int64_t m, int64_t hd, int c, const float* kv,
                              const float* gate, const float* pb, float* out) {
  const Geo g{T, m, hd, c * hd, T / m, c};
  const int64_t nb = (hd + kBlock - 1) / kBlock, items = B * g.nw * nb;
  parallel_for(items, 8, [&](int64_t i0, int64_t i1) {
    for (int64_t it = i0; it < i1; ++it)
      run_block<false>(g, it / nb, it % nb, kv, gate, pb, nullptr, out, nullptr, nullptr, nullptr);
  });
}

void compress_pool_bwd_avx512(int64_t B, int64_t T, int64_t m, int64_t hd, int c, const float* kv,
                              const float* gate, const float* pb, const float* dout, float* dkv, float* dgate,
                              float* dpb, float* workspace) {
  const Geo g{T, m, hd, c * hd, T / m, c};
  const int64_t C = g.C, BW = B * g.nw;
  // Elements that feed no window: trailing tokens, and for c = 2 the Ca half of the last window.
  parallel_for(B, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r0 = g.nw * m, n = (T - r0) * C;
      std::memset(dkv + (b * T + r0) * C, 0, sizeof(float) * n);
      std::memset(dgate + (b * T + r0) * C, 0, sizeof(float) * n);
      if (c == 2 && g.nw > 0)
        for (int64_t t = (g.nw - 1) * m; t < g.nw * m; ++t) {
          std::memset(dkv + (b * T + t) * C, 0, sizeof(float) * hd);
          std::memset(dgate + (b * T + t) * C, 0, sizeof(float) * hd);
        }
    }
  });
  if (BW == 0) return;
  const int64_t nch = compress_pool_chunks(BW), nb = (hd + kBlock - 1) / kBlock, mc = m * C;
  parallel_dynamic(nch * nb, [&](int64_t it) {
    const int64_t ch = it / nb, cb = it % nb, d0 = cb * kBlock, width = std::min(kBlock, hd - d0);
    float* part = workspace + ch * mc;
    for (int64_t r = 0; r < m; ++r)
      for (int h = 0; h < c; ++h) std::memset(part + r * C + h * hd + d0, 0, sizeof(float) * width);
    for (int64_t gw = ch * BW / nch, e = (ch + 1) * BW / nch; gw < e; ++gw)
      run_block<true>(g, gw, cb, kv, gate, pb, dout, nullptr, dkv, dgate, part);
  });
  // dpb += (((p_0 + p_1) + p_2) + ...), chunk order, per element: independent of the thread count.
  parallel_for(mc, 4096, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      float s = workspace[j];
      for (int64_t ch = 1; ch < nch; ++ch) s += workspace[ch * mc + j];
      dpb[j] += s;
    }
  });
}

}  // namespace trex::kern::cpu
