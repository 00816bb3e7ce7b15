// Indexer op cases shared by trex_ops (tests/ops/compress_pool_ops.cpp) and trex_cuda_ops
// (tests/ops_cuda/v4_attn_ops.cpp): the case shape and its name, the inputs (causal, packed and
// shifted positions; duplicated keys, a NaN key and a NaN query for the ties cases), the shapes
// both harnesses test and the check of an implementation's outputs against the reference.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>
#include "core/rng.h"
#include "kernels/indexer.h"
#include "kernels/ref/indexer.h"
#include "tests/ops/harness.h"

namespace trex::ops {

enum class PosKind { Causal, Packed, Offset };

struct IdxCfg {
  int64_t B, T;
  int nh, dI;
  int64_t m;
  int topk;
  PosKind pk;
};

// Odd shapes, topk > nw, topk 0, m = 1, a single head and dim, nw < 1 entry per query.
inline constexpr IdxCfg kIdxTests[] = {
    {1, 37, 3, 5, 2, 4, PosKind::Causal},        {2, 129, 8, 64, 4, 16, PosKind::Packed},
    {1, 1000, 13, 37, 4, 100, PosKind::Causal},  {2, 256, 64, 128, 4, 32, PosKind::Offset},
    {1, 300, 9, 16, 3, 1000, PosKind::Causal},   {3, 77, 1, 1, 1, 5, PosKind::Packed},
    {1, 520, 17, 70, 5, 31, PosKind::Offset},    {2, 64, 8, 64, 4, 0, PosKind::Causal},
    {1, 3, 4, 8, 4, 2, PosKind::Causal},
};
inline constexpr IdxCfg kIdxTiesTests[] = {{2, 400, 7, 20, 2, 13, PosKind::Causal},
                                           {1, 130, 16, 64, 1, 40, PosKind::Offset}};

inline std::string indexer_cfg_name(const char* tag, const IdxCfg& c, const char* extra = "") {
  const char* pk = c.pk == PosKind::Causal ? "pos=t" : c.pk == PosKind::Packed ? "packed" : "offset";
  char buf[200];
  std::snprintf(buf, sizeof buf, "%s B=%ld T=%ld nh=%d dI=%d m=%ld topk=%d %s%s", tag, (long)c.B, (long)c.T,
                c.nh, c.dI, (long)c.m, c.topk, pk, extra);
  return buf;
}

struct IdxData {
  kern::IndexerShape sh;
  std::vector<float> q, k, w;
  std::vector<int32_t> pos;
  // ties: every key row s of a batch row equals row s % 5 (5 distinct scores per query, many
  // exact ties), key row 3 has a NaN (its score is NaN for every query) and one query's q is NaN.
  IdxData(const IdxCfg& c, uint64_t seed, bool ties = false) {
    sh = {c.B, c.T, c.T / c.m, c.nh, c.dI, c.m, c.topk, 1.f / std::sqrt(static_cast<float>(c.dI))};
    Rng r(seed);
    q.resize(c.B * c.T * c.nh * c.dI), k.resize(c.B * sh.nw * c.dI), w.resize(c.B * c.T * c.nh);
    fill_normal(q.data(), q.size(), r);
    fill_normal(k.data(), k.size(), r);
    fill_normal(w.data(), w.size(), r, 1.0 / std::sqrt(c.nh));
    if (ties) {
      for (int64_t b = 0; b < c.B; ++b)
        for (int64_t s = 5; s < sh.nw; ++s)
          std::copy_n(k.data() + (b * sh.nw + s % 5) * c.dI, c.dI, k.data() + (b * sh.nw + s) * c.dI);
      for (int64_t b = 0; b < c.B; ++b)
        if (sh.nw > 3) k[(b * sh.nw + 3) * c.dI + c.dI / 2] = std::numeric_limits<float>::quiet_NaN();
      q[(c.B * c.T - 1) * c.nh * c.dI] = std::numeric_limits<float>::quiet_NaN();
    }
    pos.resize(c.B * c.T);
    for (int64_t b = 0; b < c.B; ++b) {
      const int64_t cut = 1 + static_cast<int64_t>(r.next_u64() % (c.T - 1));
      const int64_t off = static_cast<int64_t>(r.next_u64() % (c.T / 2 + 1));
      for (int64_t t = 0; t < c.T; ++t) {
        int64_t v = t;
        if (c.pk == PosKind::Packed) v = t < cut ? t : t - cut;  // two documents
        if (c.pk == PosKind::Offset) v = t + off - c.T / 4;      // shifted, some negative
        pos[b * c.T + t] = static_cast<int32_t>(v);
      }
    }
  }
};

// The outputs of one implementation on d (with scores_out: sc, cnt, sel; without: cnt2, sel2)
// against the reference: scores to NMSE 1e-11; selection: same count; indices ascending and valid;
// a top-k of the reference scores up to float rounding (min selected >= max unselected - tol);
// identical with and without scores_out. With ties the scores are 5 well separated values and
// NaN: the selection must equal the reference's exactly.
inline bool indexer_check(const std::string& name, const IdxCfg& c, const IdxData& d, bool ties,
                          const Guarded<float>& sc, const Guarded<int32_t>& cnt, const Guarded<int32_t>& sel,
                          const Guarded<int32_t>& cnt2, const Guarded<int32_t>& sel2, bool ws_ok) {
  const auto& sh = d.sh;
  const size_t nq = c.B * c.T, ns = nq * sh.nw;
  std::vector<float> sc_r(ns);
  std::vector<int32_t> cnt_r(nq), sel_r(nq * c.topk);
  kern::ref::indexer_topk<float>(sh, d.q.data(), d.k.data(), d.w.data(), d.pos.data(), cnt_r.data(), sel_r.data(),
                                 sc_r.data());
  bool mism;
  const double e = nmse(sc.data(), sc_r.data(), ns, &mism);
  bool ok = report(name, "scores", e, 1e-11, !mism && sc.guard_ok() && ws_ok, "nan/-inf/guard");
  // Selection: same count; indices ascending and valid; a top-k of the reference scores up to
  // float rounding (min selected >= max unselected - tol); identical with and without scores_out.
  // With ties the scores are 5 well separated values and NaN: the selection must be exact.
  size_t bad = 0, same = 0;
  for (size_t i = 0; i < nq; ++i) {
    const int32_t* s = sel.data() + i * c.topk;
    const float* r = sc_r.data() + i * sh.nw;
    const int64_t nv = kern::indexer_valid_count(d.pos[i], c.m, sh.nw);
    bool qok = cnt.data()[i] == cnt_r[i] && cnt.data()[i] == std::min<int64_t>({c.topk, sh.nw, nv});
    std::vector<char> in(sh.nw, 0);
    float lo = std::numeric_limits<float>::infinity(), hi = -lo, amax = 0;
    for (int j = 0; j < c.topk; ++j) {
      if (j < cnt.data()[i]) {
        qok &= s[j] >= 0 && s[j] < nv && (j == 0 || s[j] > s[j - 1]);
        if (qok) in[s[j]] = 1, lo = std::min(lo, r[s[j]]);
      } else {
        qok &= s[j] == -1;
      }
    }
    for (int64_t j = 0; j < nv; ++j) {
      amax = std::max(amax, std::fabs(r[j]));
      if (!in[j]) hi = std::max(hi, r[j]);
    }
    const bool eq = std::equal(s, s + c.topk, sel_r.data() + i * c.topk);
    qok &= ties ? eq : lo >= hi - 1e-5f * std::max(amax, 1e-3f);
    same += eq;
    bad += !qok;
  }
  size_t diff2 = 0;
  for (size_t i = 0; i < nq; ++i) diff2 += cnt2.data()[i] != cnt.data()[i];
  for (size_t i = 0; i < nq * c.topk; ++i) diff2 += sel2.data()[i] != sel.data()[i];
  char extra[96];
  std::snprintf(extra, sizeof extra, "(%zu/%zu queries identical to ref)", same, nq);
  ok &= report(name, "select", static_cast<double>(bad), 0, sel.guard_ok() && cnt.guard_ok(), "guard");
  std::printf("     %s\n", extra);
  ok &= report(name, "no-scores", static_cast<double>(diff2), 0, sel2.guard_ok() && cnt2.guard_ok(), "guard");
  return ok;
}

}  // namespace trex::ops
