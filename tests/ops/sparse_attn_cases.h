// Sparse-attention op cases shared by trex_ops (tests/ops/sparse_attn_ops.cpp) and trex_cuda_ops
// (tests/ops_cuda/v4_attn_ops.cpp): the case shape and its name, the kv row lists (a sliding
// window plus random earlier / compressed rows, shuffled; empty lists), the inputs, the shapes
// both harnesses test and their error bounds against the reference in double.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>
#include "core/rng.h"
#include "kernels/sparse_attn.h"
#include "tests/ops/harness.h"

namespace trex::ops {

struct SattnCfg {
  int64_t N;
  int H, D;
  int window;       // rows [i - window + 1, i] of the first N rows of kv
  int extra;        // plus up to this many random earlier rows or compressed rows [N, N + i/4]
  int empty_every;  // > 0: every empty_every-th query has no keys at all
  bool sink;
  float sharp;       // scale = sharp / sqrt(D)
  bool nan = false;  // a NaN in one element of q and of kv (NaN/Inf positions must agree)
};

// Odd and round H (1..72, padded head lanes) and D (8..512), lists of lengths 0..~300 (several
// key tiles), queries without keys, with and without a sink, sharp scores, NaN inputs.
inline constexpr SattnCfg kSattnTests[] = {
    {1, 1, 16, 1, 0, 0, true, 1.f},        {7, 3, 24, 4, 2, 3, true, 1.f},
    {37, 5, 40, 9, 5, 5, false, 1.f},      {300, 16, 128, 128, 64, 0, true, 1.f},
    {129, 3, 512, 20, 150, 0, true, 1.f},  {200, 17, 72, 50, 30, 0, false, 1.f},
    {150, 40, 33, 140, 10, 11, true, 3.f}, {260, 64, 128, 100, 40, 0, true, 1.f},
    {1000, 2, 48, 64, 0, 7, true, 1.f},    {90, 16, 256, 130, 300, 13, false, 4.f},
    {5, 4, 16, 3, 0, 1, true, 1.f},        {6, 2, 16, 3, 0, 1, false, 1.f},
    {140, 72, 8, 20, 9, 0, true, 1.f},     {133, 33, 200, 40, 20, 17, true, 2.f},
    {60, 5, 40, 9, 5, 0, true, 1.f, true}, {300, 16, 64, 100, 40, 0, true, 40.f},
};

// NaN without a sink: a query whose scores are all NaN (the NaN in q) attends nothing by the
// reference's rule (o = 0, lse = -inf: its max skips NaN), while its other queries that list the
// NaN kv row turn NaN. The CUDA kernels and their host model follow the reference here; the CPU's
// fast kernels give NaN for the all-NaN query, so trex_ops runs this case on the model only.
inline constexpr SattnCfg kSattnNanNoSink = {61, 3, 24, 5, 3, 4, false, 1.f, true};

inline std::string sattn_cfg_name(const char* op, const SattnCfg& c) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "%s N=%lld H=%d D=%d win=%d extra=%d%s%s%s%s", op,
                static_cast<long long>(c.N), c.H, c.D, c.window, c.extra,
                c.empty_every ? (" empty/" + std::to_string(c.empty_every)).c_str() : "",
                c.sink ? " sink" : "", c.sharp != 1.f ? " sharp" : "", c.nan ? " nan" : "");
  return buf;
}

inline kern::SparseAttnShape sattn_shape_of(const SattnCfg& c, bool bf16) {
  kern::SparseAttnShape sh{c.N, c.H, c.D, c.sharp / std::sqrt(static_cast<float>(c.D))};
  if (bf16) sh.prec = kern::Prec::BF16;
  return sh;
}
// kv rows: the N window rows and the compressed rows after them (M is no round number).
inline int64_t sattn_rows_of(const SattnCfg& c) { return c.N + c.N / 4 + 1; }

struct SattnLists {
  std::vector<int64_t> off;
  std::vector<int32_t> idx;
};

// Query i: its window, then up to `extra` distinct rows drawn from the earlier rows before the
// window and the compressed rows [N, N + i/4], the whole list shuffled.
inline SattnLists sattn_make_lists(const SattnCfg& c, Rng& r) {
  SattnLists L;
  L.off.push_back(0);
  std::vector<char> used(static_cast<size_t>(sattn_rows_of(c)), 0);
  std::vector<int32_t> row;
  for (int64_t i = 0; i < c.N; ++i) {
    row.clear();
    if (!(c.empty_every > 0 && i % c.empty_every == c.empty_every - 1)) {
      const int64_t w0 = std::max<int64_t>(0, i - c.window + 1);
      for (int64_t j = w0; j <= i; ++j) row.push_back(static_cast<int32_t>(j));
      const int64_t pool = w0 + i / 4 + 1;
      const int64_t want = std::min<int64_t>(c.extra, pool);
      for (int32_t x : row) used[x] = 1;
      while (static_cast<int64_t>(row.size()) < (i - w0 + 1) + want) {
        int64_t k = static_cast<int64_t>(r.next_u64() % static_cast<uint64_t>(pool));
        const int32_t x = static_cast<int32_t>(k < w0 ? k : c.N + (k - w0));
        if (!used[x]) used[x] = 1, row.push_back(x);
      }
      for (int32_t x : row) used[x] = 0;
      for (size_t a = row.size(); a > 1; --a) std::swap(row[a - 1], row[r.next_u64() % a]);
    }
    L.idx.insert(L.idx.end(), row.begin(), row.end());
    L.off.push_back(static_cast<int64_t>(L.idx.size()));
  }
  return L;
}

struct SattnInputs {
  std::vector<float> q, kv, sink, dO, dkv0, dsink0;
};
inline SattnInputs sattn_make_inputs(const SattnCfg& c, Rng& r) {
  const size_t nq = size_t(c.N) * c.H * c.D, nkv = size_t(sattn_rows_of(c)) * c.D;
  SattnInputs in{std::vector<float>(nq), std::vector<float>(nkv), std::vector<float>(c.H),
                 std::vector<float>(nq), std::vector<float>(nkv), std::vector<float>(c.H)};
  fill_normal(in.q.data(), nq, r), fill_normal(in.kv.data(), nkv, r);
  fill_normal(in.sink.data(), c.H, r, 2.0), fill_normal(in.dO.data(), nq, r);
  fill_normal(in.dkv0.data(), nkv, r, 0.25), fill_normal(in.dsink0.data(), c.H, r, 0.25);
  return in;
}
// The NaN case: one element of q and one of kv.
inline void sattn_put_nans(const SattnCfg& c, SattnInputs& in) {
  if (!c.nan) return;
  in.q[(size_t(c.N / 2) * c.H + c.H - 1) * c.D + 1] = std::nanf("");
  in.kv[size_t(c.N / 3) * c.D] = std::nanf("");
}

// NMSE bounds against the reference in double: o, lse and the gradients.
// fp32 scores of size ~sharp carry absolute errors ~sharp * 1e-7 into exp(): the gradients'
// NMSE grows like sharp^2 (the float reference itself is at 2e-10 for sharp = 40).
// bf16 (q, kv, dO, P and dS rounded to nearest even bf16, relative error <= 2^-9 each, f32
// accumulation): the bounds of the MLA bf16 kernel (tests/ops/attention_ops.cpp), scaled by
// the same sharpness factor. The AVX512_BF16 kernel's worst over these cases (Zen 4), sharp
// <= 4: o 2.2e-5, lse 5.2e-7, dq 6.8e-5, dkv 5.5e-5, dsink 9.2e-5 (a 2-head sum over many
// queries); sharp 40 (bounds x100): o 1.9e-4, lse 1.0e-6, gradients 4.2e-3.
struct SattnBounds {
  double o, lse, grad;
};
inline SattnBounds sattn_bounds(const SattnCfg& c, bool bf16) {
  const double cond = std::max(1.0, double(c.sharp) * c.sharp / 16);
  if (bf16) return {1e-4 * cond, 1e-5 * cond, 3e-4 * cond};
  return {1e-10 * cond, 1e-12 * cond, 1e-10 * cond};
}

}  // namespace trex::ops
