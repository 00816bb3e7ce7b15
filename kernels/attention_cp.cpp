// Context-parallel causal attention (see attention_cp.h): on the flash kernels, one call per run
// of consecutive query indices and batch row; else through GEMMs. GEMM work items: forward,
// (b, h, query block) with dynamic scheduling; backward, (b, h) (dk and dv accumulate over the
// query blocks of one head, so one thread owns a head). GEMMs inside a parallel region run on the
// calling thread.
#include "kernels/attention_cp.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "kernels/attention.h"
#include "kernels/gemm.h"

namespace trex::kern {

namespace {

constexpr int kBlock = 64;  // queries per block
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

void check(const AttnCpShape& sh, const int32_t* qidx) {
  TREX_CHECK(sh.B > 0 && sh.Tq > 0 && sh.Tk > 0 && sh.H > 0 && sh.Dqk > 0 && sh.Dv > 0, "attention_cp: bad shape B=",
             sh.B, " Tq=", sh.Tq, " Tk=", sh.Tk, " H=", sh.H, " Dqk=", sh.Dqk, " Dv=", sh.Dv);
  for (int t = 0; t < sh.Tq; ++t)
    TREX_CHECK(qidx[t] >= 0 && qidx[t] < sh.Tk, "attention_cp: query row ", t, " at index ", qidx[t], " outside [0, ",
               sh.Tk, ")");
}

// The keys block [q0, q0 + nq) may see: [0, 1 + the largest index of its queries).
int block_keys(const int32_t* qidx, int q0, int nq) {
  int m = 0;
  for (int i = 0; i < nq; ++i) m = std::max(m, qidx[q0 + i] + 1);
  return m;
}

// S[nq, nk] (row stride nk): positions a query may not see become -inf.
void mask_scores(const int32_t* qidx, const int32_t* seg_row, int q0, int nq, int nk, float* S) {
  for (int i = 0; i < nq; ++i) {
    const int t = qidx[q0 + i];
    float* s = S + (int64_t)i * nk;
    for (int j = t + 1; j < nk; ++j) s[j] = kNegInf;
    if (seg_row)
      for (int j = 0; j <= t && j < nk; ++j)
        if (seg_row[j] != seg_row[t]) s[j] = kNegInf;
  }
}

// exp(x) for x <= 0 (a score minus its row's maximum or lse; -inf: masked) over n values in place,
// in plain arithmetic the compiler vectorizes (no libm call): 2^(x log2 e) = 2^k 2^f with k =
// trunc, f in (-1, 0], 2^f by its Taylor series to degree 8 (relative error < 2e-7). Values below
// -87 (and -inf) give 0.
void exp_nonpos(float* x, int n) {
  for (int j = 0; j < n; ++j) {
    const float v = x[j];
    const float t = std::max(v * 1.44269504088896341f, -126.f);
    const int k = (int)t;  // toward zero: f = t - k in (-1, 0]
    const float f = (t - (float)k) * 0.693147180559945309f;
    float p = 1.f / 40320.f;
    p = p * f + 1.f / 5040.f;
    p = p * f + 1.f / 720.f;
    p = p * f + 1.f / 120.f;
    p = p * f + 1.f / 24.f;
    p = p * f + 1.f / 6.f;
    p = p * f + 0.5f;
    p = p * f + 1.f;
    p = p * f + 1.f;
    const int32_t bits = (k + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, sizeof scale);
    x[j] = v < -87.f ? 0.f : p * scale;
  }
}

struct Scratch {
  std::vector<float> S, dP;
};
thread_local Scratch t_scratch;

// ------------------------------------------------------------------------------ flash kernels --

// Local rows [j0, j0 + n) at sequence indices [p0, p0 + n).
struct Run {
  int j0, n, p0;
  int end() const { return p0 + n; }
};

// The maximal runs of consecutive indices of qidx, in local order.
std::vector<Run> runs_of(const int32_t* qidx, int Tq) {
  std::vector<Run> runs;
  for (int j = 0; j < Tq; ++j)
    if (!runs.empty() && qidx[j] == runs.back().end() && j == runs.back().j0 + runs.back().n)
      ++runs.back().n;
    else
      runs.push_back({j, 1, qidx[j]});
  return runs;
}

// One run of one batch row: Tq = n queries, the last of the keys [0, p0 + n).
AttnShape run_shape(const AttnCpShape& sh, const Run& r) {
  AttnShape a{1, r.end(), sh.H, sh.Dqk, sh.Dv, sh.scale, 0, sh.prec};
  a.Tq = r.n;
  return a;
}

bool use_flash(const AttnCpShape& sh) {
  return attention_supports_rows(AttnShape{1, 1, sh.H, sh.Dqk, sh.Dv, sh.scale, 0, sh.prec});
}

// lse [B, H, Tq] rows of a run <-> run [H, n].
void lse_of_run(const AttnCpShape& sh, int b, const Run& r, const float* lse, float* run) {
  for (int h = 0; h < sh.H; ++h)
    std::memcpy(run + (int64_t)h * r.n, lse + ((int64_t)b * sh.H + h) * sh.Tq + r.j0, sizeof(float) * r.n);
}
void lse_to_rows(const AttnCpShape& sh, int b, const Run& r, const float* run, float* lse) {
  for (int h = 0; h < sh.H; ++h)
    std::memcpy(lse + ((int64_t)b * sh.H + h) * sh.Tq + r.j0, run + (int64_t)h * r.n, sizeof(float) * r.n);
}

void flash_fwd(const AttnCpShape& sh, const float* q, const float* k, const float* v, const int32_t* qidx,
               const int32_t* seg, float* o, float* lse) {
  const int64_t ldq = (int64_t)sh.H * sh.Dqk, ldv = (int64_t)sh.H * sh.Dv;
  std::vector<float>& L = t_scratch.S;
  for (int b = 0; b < sh.B; ++b)
    for (const Run& r : runs_of(qidx, sh.Tq)) {
      L.resize((size_t)sh.H * r.n);
      const int64_t qr = (int64_t)b * sh.Tq + r.j0, kr = (int64_t)b * sh.Tk;
      attention_fwd(run_shape(sh, r), q + qr * ldq, k + kr * ldq, v + kr * ldv, o + qr * ldv, L.data(),
                    seg ? seg + kr : nullptr);
      lse_to_rows(sh, b, r, L.data(), lse);
    }
}

// Per batch row, the run reaching furthest overwrites its keys' dk, dv (the keys after it are
// seen by no local query: zero), the others add to them.
void flash_bwd(const AttnCpShape& sh, const float* q, const float* k, const float* v, const int32_t* qidx,
               const int32_t* seg, const float* o, const float* lse, const float* dO, float* dq, float* dk,
               float* dv) {
  const int64_t ldq = (int64_t)sh.H * sh.Dqk, ldv = (int64_t)sh.H * sh.Dv;
  std::vector<Run> runs = runs_of(qidx, sh.Tq);
  std::stable_sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) { return a.end() > b.end(); });
  std::vector<float>& L = t_scratch.S;
  for (int b = 0; b < sh.B; ++b) {
    const int64_t kr = (int64_t)b * sh.Tk, e = runs.front().end();
    std::memset(dk + (kr + e) * ldq, 0, sizeof(float) * (sh.Tk - e) * ldq);
    std::memset(dv + (kr + e) * ldv, 0, sizeof(float) * (sh.Tk - e) * ldv);
    for (size_t i = 0; i < runs.size(); ++i) {
      const Run& r = runs[i];
      AttnShape a = run_shape(sh, r);
      a.acc_dkv = i > 0;
      L.resize((size_t)sh.H * r.n);
      lse_of_run(sh, b, r, lse, L.data());
      const int64_t qr = (int64_t)b * sh.Tq + r.j0;
      attention_bwd(a, q + qr * ldq, k + kr * ldq, v + kr * ldv, o + qr * ldv, L.data(), dO + qr * ldv,
                    dq + qr * ldq, dk + kr * ldq, dv + kr * ldv, seg ? seg + kr : nullptr);
    }
  }
}

}  // namespace

void attention_cp_fwd(const AttnCpShape& sh, const float* q, const float* k, const float* v, const int32_t* qidx,
                      const int32_t* seg, float* o, float* lse) {
  check(sh, qidx);
  if (use_flash(sh)) return flash_fwd(sh, q, k, v, qidx, seg, o, lse);
  const int B = sh.B, Tq = sh.Tq, Tk = sh.Tk, H = sh.H, Dq = sh.Dqk, Dv = sh.Dv;
  const int nblk = (Tq + kBlock - 1) / kBlock;
  const int64_t ldq = (int64_t)H * Dq, ldv = (int64_t)H * Dv;
  parallel_dynamic((int64_t)B * H * nblk, [&](int64_t item) {
    const int blk = (int)(item % nblk);
    const int64_t bh = item / nblk;
    const int b = (int)(bh / H), h = (int)(bh % H);
    const int q0 = blk * kBlock, nq = std::min(Tq, q0 + kBlock) - q0;
    const int nk = block_keys(qidx, q0, nq);
    const int32_t* seg_row = seg ? seg + (int64_t)b * Tk : nullptr;
    std::vector<float>& S = t_scratch.S;
    S.resize((size_t)nq * nk);
    const float* Q = q + ((int64_t)b * Tq + q0) * ldq + (int64_t)h * Dq;
    const float* K = k + (int64_t)b * Tk * ldq + (int64_t)h * Dq;
    const float* V = v + (int64_t)b * Tk * ldv + (int64_t)h * Dv;
    float* O = o + ((int64_t)b * Tq + q0) * ldv + (int64_t)h * Dv;
    float* L = lse + ((int64_t)b * H + h) * Tq + q0;
    gemm_f32(false, true, nq, nk, Dq, sh.scale, Q, ldq, K, ldq, 0.f, S.data(), nk);  // S = scale Q K^T
    mask_scores(qidx, seg_row, q0, nq, nk, S.data());
    for (int i = 0; i < nq; ++i) {
      float* s = S.data() + (int64_t)i * nk;
      float m = kNegInf;
      for (int j = 0; j < nk; ++j) m = std::max(m, s[j]);
      if (m == kNegInf) {
        std::fill(s, s + nk, 0.f);
        L[i] = kNegInf;
        continue;
      }
      for (int j = 0; j < nk; ++j) s[j] -= m;
      exp_nonpos(s, nk);
      double sum = 0;
      for (int j = 0; j < nk; ++j) sum += s[j];
      const float inv = (float)(1.0 / sum);
      for (int j = 0; j < nk; ++j) s[j] *= inv;
      L[i] = m + (float)std::log(sum);
    }
    gemm_f32(false, false, nq, Dv, nk, 1.f, S.data(), nk, V, ldv, 0.f, O, ldv);  // O = P V
  });
}

void attention_cp_bwd(const AttnCpShape& sh, const float* q, const float* k, const float* v, const int32_t* qidx,
                      const int32_t* seg, const float* o, const float* lse, const float* dO, float* dq, float* dk,
                      float* dv) {
  check(sh, qidx);
  if (use_flash(sh)) return flash_bwd(sh, q, k, v, qidx, seg, o, lse, dO, dq, dk, dv);
  const int B = sh.B, Tq = sh.Tq, Tk = sh.Tk, H = sh.H, Dq = sh.Dqk, Dv = sh.Dv;
  const int64_t ldq = (int64_t)H * Dq, ldv = (int64_t)H * Dv;
  parallel_dynamic((int64_t)B * H, [&](int64_t bh) {
    const int b = (int)(bh / H), h = (int)(bh % H);
    const int32_t* seg_row = seg ? seg + (int64_t)b * Tk : nullptr;
    const int64_t kq = (int64_t)b * Tk * ldq + (int64_t)h * Dq, kv = (int64_t)b * Tk * ldv + (int64_t)h * Dv;
    const int64_t qq = (int64_t)b * Tq * ldq + (int64_t)h * Dq, qv = (int64_t)b * Tq * ldv + (int64_t)h * Dv;
    for (int t = 0; t < Tk; ++t) {  // dk, dv accumulate below: clear this head's rows
      std::fill(dk + kq + t * ldq, dk + kq + t * ldq + Dq, 0.f);
      std::fill(dv + kv + t * ldv, dv + kv + t * ldv + Dv, 0.f);
    }
    std::vector<float>& S = t_scratch.S;
    std::vector<float>& dP = t_scratch.dP;
    float Di[kBlock];
    for (int q0 = 0; q0 < Tq; q0 += kBlock) {
      const int nq = std::min(Tq, q0 + kBlock) - q0, nk = block_keys(qidx, q0, nq);
      S.resize((size_t)nq * nk);
      dP.resize((size_t)nq * nk);
      const float* Q = q + qq + (int64_t)q0 * ldq;
      const float* K = k + kq;
      const float* V = v + kv;
      const float* O = o + qv + (int64_t)q0 * ldv;
      const float* G = dO + qv + (int64_t)q0 * ldv;
      const float* L = lse + ((int64_t)b * H + h) * Tq + q0;
      // P = exp(scale Q K^T - lse), masked (rows without keys: P = 0).
      gemm_f32(false, true, nq, nk, Dq, sh.scale, Q, ldq, K, ldq, 0.f, S.data(), nk);
      mask_scores(qidx, seg_row, q0, nq, nk, S.data());
      for (int i = 0; i < nq; ++i) {
        float* s = S.data() + (int64_t)i * nk;
        if (L[i] == kNegInf) {
          std::fill(s, s + nk, 0.f);
          continue;
        }
        for (int j = 0; j < nk; ++j) s[j] -= L[i];
        exp_nonpos(s, nk);
      }
      // dV[0:nk] += P^T dO
      gemm_f32(true, false, nk, Dv, nq, 1.f, S.data(), nk, G, ldv, 1.f, dv + kv, ldv);
      // dP = dO V^T; D_i = dO_i . o_i; dS = P (dP - D) scale (in dP)
      gemm_f32(false, true, nq, nk, Dv, 1.f, G, ldv, V, ldv, 0.f, dP.data(), nk);
      for (int i = 0; i < nq; ++i) {
        double d = 0;
        for (int c = 0; c < Dv; ++c) d += (double)G[(int64_t)i * ldv + c] * O[(int64_t)i * ldv + c];
        Di[i] = (float)d;
      }
      for (int i = 0; i < nq; ++i) {
        const float* p = S.data() + (int64_t)i * nk;
        float* g = dP.data() + (int64_t)i * nk;
        for (int j = 0; j < nk; ++j) g[j] = p[j] * (g[j] - Di[i]) * sh.scale;
      }
      // dQ rows of this block (overwrite); dK[0:nk] += dS^T Q
      gemm_f32(false, false, nq, Dq, nk, 1.f, dP.data(), nk, K, ldq, 0.f, dq + qq + (int64_t)q0 * ldq, ldq);
      gemm_f32(true, false, nk, Dq, nq, 1.f, dP.data(), nk, Q, ldq, 1.f, dk + kq, ldq);
    }
  });
}

}  // namespace trex::kern
