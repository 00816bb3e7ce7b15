// Op cases for DeepSeek-V4's compressed-attention kernels:
//   compress_pool (kernels/compress_pool.h):
//     test: dispatched fwd / bwd against the float reference (dpb accumulating onto random
//           values, NaN / -inf logits, T < m, m = 1, trailing tokens), dkv / dgate / dpb bitwise
//           independent of the thread count, and both against numbers from the real HF modules;
//     grad: reference backward in double against finite differences of the reference forward;
//     perf: GB/s of fwd and bwd at the HCA, CSA and indexer-compressor shapes of DeepSeek-V4.
//   indexer (kernels/indexer.h), dispatched, the AVX2 kernel called directly ("indexer[avx2]",
//   kernels/cpu/indexer_avx2.h; skipped on a CPU without AVX2 + FMA) and a bf16 shape
//   ("indexer[bf16]": the AVX512_BF16 scores; skipped on other CPUs; its data's q and k rounded to
//   bf16, and the unrounded data must give the same bits):
//     test: scores against the reference, the selection against the exact top-k of the
//           reference scores (up to float rounding at the boundary), with and without
//           scores_out (the fast path skips scoring when it can: same selection required);
//           with duplicated keys (ties), a NaN key and a NaN query the selection must equal the
//           reference's exactly (lower index first, NaN above every number); outputs bitwise
//           equal with 1 thread and all threads;
//     perf: GFLOP/s of the scoring actually done (valid entries of queries with more than topk
//           valid entries) and, side by side, kern::gemm_f32 on the same dense product; also at
//           the bench-v4 shape (B=1, T=2048, nh=16, dI=64, m=4, topk=128).
#include <omp.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/parallel.h"
#include "kernels/attention.h"
#include "kernels/compress_pool.h"
#include "kernels/cpu/indexer_avx2.h"
#include "kernels/gemm.h"
#include "kernels/indexer.h"
#include "kernels/ref/compress_pool.h"
#include "kernels/ref/indexer.h"
#include "tests/ops/harness.h"
#include "tests/ops/indexer_cases.h"
#include "tests/ops/indexer_hd_model.h"

namespace {

using namespace trex;
using namespace trex::ops;

// ---------------------------------------------------------------- compress_pool

struct PoolCfg {
  int64_t B, T, m, hd;
  int c;
};

std::string pool_name(const PoolCfg& p, const char* extra = "") {
  char buf[160];
  std::snprintf(buf, sizeof buf, "compress_pool B=%ld T=%ld m=%ld hd=%ld c=%d%s", (long)p.B, (long)p.T, (long)p.m,
                (long)p.hd, p.c, extra);
  return buf;
}

struct PoolData {
  std::vector<float> kv, gate, pb, dout, dpb0;
  size_t n, nout, npb;
  PoolData(const PoolCfg& p, uint64_t seed, double gscale) {
    Rng r(seed);
    n = static_cast<size_t>(p.B * p.T * p.c * p.hd);
    nout = static_cast<size_t>(p.B * (p.T / p.m) * p.hd);
    npb = static_cast<size_t>(p.m * p.c * p.hd);
    kv.resize(n), gate.resize(n), pb.resize(npb), dout.resize(nout), dpb0.resize(npb);
    fill_normal(kv.data(), n, r);
    fill_normal(gate.data(), n, r, gscale);
    fill_normal(pb.data(), npb, r, 0.5);
    fill_normal(dout.data(), nout, r);
    fill_normal(dpb0.data(), npb, r);
  }
};

// Fast fwd / bwd vs the float reference. special: a NaN logit, a NaN value and -inf logits
// (one channel with all slots at -inf) in batch row 0.
bool pool_test(const PoolCfg& p, bool special, double gscale = 2.0) {
  const std::string name = pool_name(p, special ? " nan/-inf" : "");
  PoolData d(p, 100 + p.T * 3 + p.m * 5 + p.hd + p.c, gscale);
  const int64_t C = p.c * p.hd, nw = p.T / p.m;
  if (special && nw >= 2) {
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    d.gate[p.m * C + C - 1] = nan;  // a slot of window 1, last channel
    d.kv[(p.m - 1) * C + C - 1] = nan;  // a slot of window 0, last channel
    d.gate[0] = -inf;  // one slot (window 0 for c = 1, window 1 for c = 2): weight 0
    for (int64_t r = 0; r < p.m; ++r) {  // every slot of window 1, channel 1: NaN output
      d.gate[(p.m + r) * C + (p.c == 2 ? p.hd + 1 : 1)] = -inf;
      if (p.c == 2) d.gate[r * C + 1] = -inf;
    }
  }
  Guarded<float> out(d.nout), dkv(d.n), dgate(d.n), dpb(d.npb);
  std::vector<float> out_r(d.nout), dkv_r(d.n), dgate_r(d.n), dpb_r(d.dpb0);
  for (size_t i = 0; i < d.npb; ++i) dpb[i] = d.dpb0[i];
  for (size_t i = 0; i < d.n; ++i) dkv[i] = dgate[i] = 7.f;  // must be overwritten
  std::vector<float> ws(kern::compress_pool_bwd_workspace_floats(p.B, p.T, p.m, p.hd, p.c) + 1);
  kern::compress_pool_fwd(p.B, p.T, p.m, p.hd, p.c, d.kv.data(), d.gate.data(), d.pb.data(), out.data());
  kern::compress_pool_bwd(p.B, p.T, p.m, p.hd, p.c, d.kv.data(), d.gate.data(), d.pb.data(), d.dout.data(),
                          dkv.data(), dgate.data(), dpb.data(), ws.data());
  kern::ref::compress_pool_fwd<float>(p.B, p.T, p.m, p.hd, p.c, d.kv.data(), d.gate.data(), d.pb.data(),
                                      out_r.data());
  kern::ref::compress_pool_bwd<float>(p.B, p.T, p.m, p.hd, p.c, d.kv.data(), d.gate.data(), d.pb.data(),
                                      d.dout.data(), dkv_r.data(), dgate_r.data(), dpb_r.data());
  bool m1, m2, m3, m4;
  const double e1 = nmse(out.data(), out_r.data(), d.nout, &m1), e2 = nmse(dkv.data(), dkv_r.data(), d.n, &m2);
  const double e3 = nmse(dgate.data(), dgate_r.data(), d.n, &m3), e4 = nmse(dpb.data(), dpb_r.data(), d.npb, &m4);
  bool zeros = true;  // elements feeding no window (trailing tokens, Ca of the last window): exactly 0
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t t = 0; t < p.T; ++t)
      for (int64_t j = 0; j < C; ++j) {
        const bool unused = t >= nw * p.m || (p.c == 2 && t >= (nw - 1) * p.m && j < p.hd);
        const size_t i = (b * p.T + t) * C + j;
        if (unused && (dkv[i] != 0.f || dgate[i] != 0.f || dkv_r[i] != 0.f || dgate_r[i] != 0.f)) zeros = false;
      }
  bool ok = report(name, "out", e1, 1e-11, !m1 && out.guard_ok(), "nan/guard");
  ok &= report(name, "dkv", e2, 1e-11, !m2 && zeros && dkv.guard_ok(), "nan/zeros/guard");
  ok &= report(name, "dgate", e3, 1e-11, !m3 && dgate.guard_ok(), "nan/guard");
  ok &= report(name, "dpb", e4, 1e-11, !m4 && dpb.guard_ok(), "nan/guard");
  return ok;
}

// Backward bitwise equal for 1 and 3 threads.
bool pool_determinism(const PoolCfg& p) {
  PoolData d(p, 9, 1.0);
  std::vector<float> dkv1(d.n), dkv3(d.n), dg1(d.n), dg3(d.n), dpb1(d.dpb0), dpb3(d.dpb0);
  std::vector<float> ws(kern::compress_pool_bwd_workspace_floats(p.B, p.T, p.m, p.hd, p.c));
  const int nt = num_threads();
  omp_set_num_threads(1);
  kern::compress_pool_bwd(p.B, p.T, p.m, p.hd, p.c, d.kv.data(), d.gate.data(), d.pb.data(), d.dout.data(),
                          dkv1.data(), dg1.data(), dpb1.data(), ws.data());
  omp_set_num_threads(3);
  kern::compress_pool_bwd(p.B, p.T, p.m, p.hd, p.c, d.kv.data(), d.gate.data(), d.pb.data(), d.dout.data(),
                          dkv3.data(), dg3.data(), dpb3.data(), ws.data());
  omp_set_num_threads(nt);
  size_t bad = 0;
  for (size_t i = 0; i < d.n; ++i) bad += std::memcmp(&dkv1[i], &dkv3[i], 4) != 0 || std::memcmp(&dg1[i], &dg3[i], 4);
  for (size_t i = 0; i < d.npb; ++i) bad += std::memcmp(&dpb1[i], &dpb3[i], 4) != 0;
  return report(pool_name(p, " determinism"), "bitwise", static_cast<double>(bad), 0);
}

// Reference backward (double) vs finite differences of the reference forward (double) of
// L = sum(P * out), w.r.t. kv, gate and pb.
bool pool_grad(const PoolCfg& p) {
  const std::string name = pool_name(p);
  Rng r(31 + p.T + p.m + p.hd + p.c);
  const size_t n = p.B * p.T * p.c * p.hd, nout = p.B * (p.T / p.m) * p.hd, npb = p.m * p.c * p.hd;
  std::vector<double> kv(n), gate(n), pb(npb), P(nout), out(nout), dkv(n), dgate(n), dpb(npb, 0.0);
  fill_normal(kv.data(), n, r);
  fill_normal(gate.data(), n, r);
  fill_normal(pb.data(), npb, r);
  fill_normal(P.data(), nout, r);
  auto loss = [&] {
    kern::ref::compress_pool_fwd<double>(p.B, p.T, p.m, p.hd, p.c, kv.data(), gate.data(), pb.data(), out.data());
    double s = 0;
    for (size_t i = 0; i < nout; ++i) s += P[i] * out[i];
    return s;
  };
  kern::ref::compress_pool_bwd<double>(p.B, p.T, p.m, p.hd, p.c, kv.data(), gate.data(), pb.data(), P.data(),
                                       dkv.data(), dgate.data(), dpb.data());
  bool ok = report(name, "dkv", fd_check(kv, loss, dkv), 1e-7);
  ok &= report(name, "dgate", fd_check(gate, loss, dgate), 1e-7);
  ok &= report(name, "dpb", fd_check(pb, loss, dpb), 1e-7);
  return ok;
}

// Numbers from the real HF modules (transformers' DeepseekV4HCACompressor with m = 3, hd = 4, T = 8,
// and DeepseekV4CSACompressor with m = 2, hd = 4, T = 7; random weights; cache=None): kv and gate
// are the kv_proj / gate_proj outputs, out is the input of kv_norm (the pooled entries), and dkv,
// dgate, dpb = torch.autograd.grad((out * dout).sum(), [kv, gate, position_bias]). Produced by
// the script quoted in tests/unit/test_indexer.cpp (the same run gives the indexer numbers there).
const float kHca_kv[] = {
    1.28265238, -0.797401726, -0.360224068, 4.04521227, -0.762519896, 5.96365356, 2.32420683, -1.55719697,
    -0.31761685, -1.6276319, 1.96973586, -2.32172418, 2.95983601, 1.63338506, 0.0285963956, 2.28719115,
    -0.0136182802, 0.948039055, 4.70832014, -2.86744618, 0.98432219, 3.20482373, 2.47791719, -1.84733438,
    3.92576623, -5.75432777, 4.10965824, 6.49462891, 2.36785674, -0.331372172, 0.592749357, 2.2264812
};
const float kHca_gate[] = {
    -1.36536539, 1.97538579, -0.323274702, 0.609588981, 1.54497457, -1.76055288, -0.51296097, -1.56867874,
    0.642583132, -0.140159681, -0.97461462, 0.987350047, -1.71353555, 0.544169009, 1.48918164, -0.316069067,
    3.43687391, -0.886836231, 3.10658598, -2.31972885, -0.569567561, -1.22531211, -1.00729239, 0.553981245,
    -2.56671548, 4.62265682, 0.822676182, 2.65495348, -3.03125334, 0.921848953, -0.765949368, 2.02601361
};
const float kHca_pb[] = {
    0.325501531, -0.479144931, 1.37900829, 2.5285573, 0.410741657, -0.988007128, -0.908073366, 0.542273641,
    0.110254891, -2.2590096, 0.606699586, -0.138309658
};
const float kHca_out[] = {
    -0.587829173, -0.720023394, 0.233552366, 3.38948584, 0.0151174488, 1.58789849, 1.6342411, 1.62776458
};
const float kHca_dout[] = {
    0.647212803, -0.0411671698, -0.17749308, -0.500039279, 0.86727494, -0.273192227, -0.460768133, -0.0990937129
};
const float kHca_dkv[] = {
    0.0239685234, -0.0397875868, -0.133972421, -0.447705328, 0.479297549, -0.000570497999, -0.0112556014,
    -0.0069558532, 0.143946752, -0.000809081946, -0.0322650708, -0.045378089, 0.00453163451, -0.233006433,
    -0.297283858, -0.0836709216, 0.851272523, -0.0334883854, -0.15217182, -0.0015479757, 0.0114707937,
    -0.00669740699, -0.0113124615, -0.0138748102, 0, 0, 0, 0, 0, 0, 0, 0
};
const float kHca_dgate[] = {
    0.0448326804, 0.00307869585, 0.0795496628, -0.293572098, -0.0837288424, -0.00381302438, -0.0235315748,
    0.0344084017, 0.0388961807, 0.000734329573, -0.0560180843, 0.259163797, 0.0133443894, -0.0105986446,
    0.477332264, -0.055174835, -0.0244619362, 0.0214278642, -0.46778819, 0.00695847673, 0.0111175478,
    -0.0108292056, -0.00954405405, 0.0482163429, 0, 0, 0, 0, 0, 0, 0, 0
};
const float kHca_dpb[] = {
    0.0581770688, -0.00751994876, 0.556881905, -0.348746926, -0.108190775, 0.0176148396, -0.491319776,
    0.0413668789, 0.0500137284, -0.0100948764, -0.0655621365, 0.30738014
};
const float kCsa_kv[] = {
    -0.067510277, -0.232809722, 0.337915838, -1.13346159, 0.193282664, -0.0733545274, -1.62774754, 0.285839438,
    0.421366036, -1.82837868, 0.843303561, -2.39641714, -0.795099437, -0.738922954, 0.932719827, -2.75620508,
    3.56742334, 0.806430817, 7.94765472, 0.0423929691, -0.0393234193, -2.38960028, 8.64658165, -5.62683058,
    -1.21537828, 1.43408918, 3.74491191, 0.220730662, -1.2565918, 4.13624001, 0.355305076, -0.485504568,
    0.406653583, 3.21454525, 6.93562937, 2.97369623, -5.4254179, 0.606935561, 6.20834017, -5.40575409,
    -1.79609263, 3.12459803, 0.853788853, 0.10638684, -0.376940846, -0.0535313487, -0.71667254, 1.55482793,
    -0.0272711515, -0.553201437, -1.12862825, 2.88217306, -0.48690176, 2.68592691, 2.24000478, -0.129971147
};
const float kCsa_gate[] = {
    -1.2204299, 0.0595793724, 0.492963225, -0.712873816, -0.29622972, -0.417323232, 0.465311587, 0.0134573728,
    -5.70221663, 1.321316, -0.264585316, 0.157188296, -0.47240144, -1.4792304, -2.22709656, 1.21064401,
    1.86801934, 6.28342533, -7.64746618, 0.0615553856, -1.04703093, 2.71601057, 2.74267197, -0.207003117,
    2.49406576, 0.353031039, -2.01583171, 0.826779902, -0.00656914711, 2.9216125, 4.94522762, -2.30078316,
    8.08754158, 4.74896717, -8.85742188, 0.376326859, 2.2715807, 2.78051281, 2.475173, -0.846890867, 7.34141445,
    -2.13505697, 1.04971552, 0.496527135, -0.221281171, 3.02355862, 5.61765766, -1.19978225, 0.00527660549,
    -0.0821795762, -1.11805701, 1.52421474, 0.996084154, 0.200907826, -2.13063955, -0.586336613
};
const float kCsa_pb[] = {
    0.404864877, 0.341540873, -0.349918365, -0.234396145, -0.54519242, 0.27512145, -1.18339014, -0.820163965,
    1.13651896, 0.735287845, 1.86219871, 0.444163144, 0.489616752, 1.25138021, -1.77161241, -0.0209305771
};
const float kCsa_out[] = {
    -0.500933111, -0.391896248, -1.53495181, -2.3924396, -0.90917033, 2.19125366, 1.55895114, -2.57603431,
    -0.776478946, 0.730900109, -0.150816977, 0.0532756597
};
const float kCsa_dout[] = {
    2.6347518, -1.63384652, -1.4230665, -1.6080395, -1.62661898, -0.339672238, 0.747810483, -0.834322214,
    0.880317688, 1.4455837, 1.23773587, 0.758938015
};
const float kCsa_dkv[] = {
    -0.31599167, -0.00538932066, 0.0248332657, -0.12124712, 0.784165561, -0.851885974, -1.37149215, -0.19228822,
    -0.00743042538, -0.0282163918, 0.106351808, -0.570465267, 1.85058618, -0.781960547, -0.0515743382,
    -1.41575122, 0.157173187, 1.28213596, 8.11428617e-06, 0.130585611, -0.145337284, -0.0718392655, 0.102352329,
    -0.111936718, 0.610970616, 0.00505124778, 0.0206894167, 0.553251565, -1.15785956, -0.234227255, 0.514273107,
    -0.0306731295, 0, 0, 0, 0, 0.0909993574, 0.0361237563, 0.0877979398, 0.0293066651, 0, 0, 0, 0, 0.0211745445,
    0.122272849, 1.12924039, 0.0457941778, 0, 0, 0, 0, 0, 0, 0, 0
};
const float kCsa_dgate[] = {
    -0.265957564, 0.0130640566, -0.0303222947, -0.174907744, 0.544380069, -0.271361232, 0.127268687, -0.515001476,
    -0.00988645107, 0.113419533, -0.0761104077, -0.10246519, -0.544380128, 0.271361202, -0.127268523, 0.515001655,
    0.68274498, 0.0968407169, 6.57133132e-05, -0.00142112561, -0.126421198, 0.329085231, 0.725435495, 0.34149614,
    -0.268154532, 0.00355198281, 0.0806003585, 0.0926447287, 0.40226528, -0.455568761, -0.619002819,
    -0.0641230866, 0, 0, 0, 0, -0.423050493, -0.0044780639, 0.55832088, -0.159985945, 0, 0, 0, 0, 0.00846003834,
    -0.0959146619, -0.638986945, 0.0687623546, 0, 0, 0, 0, 0, 0, 0, 0
};
const float kCsa_dpb[] = {
    0.416787416, 0.109904774, -0.0302565806, -0.176328868, -0.00509163737, 0.0532459356, 1.41102505, -0.333491266,
    -0.278040975, 0.116971515, 0.00448995084, -0.00982046127, -0.133654803, -0.280122221, -1.38525832, 0.519640923
};

bool close_to(const char* what, const std::string& name, const float* got, const float* want, size_t n) {
  double mx = 0, err = 0;
  for (size_t i = 0; i < n; ++i) {
    mx = std::max(mx, std::fabs(static_cast<double>(want[i])));
    err = std::max(err, std::fabs(static_cast<double>(got[i]) - want[i]));
  }
  return report(name, what, err / std::max(mx, 1e-30), 2e-6);
}

bool pool_hf(const char* tag, int64_t T, int64_t m, int c, const float* kv, const float* gate, const float* pb,
             const float* out, const float* dout, const float* dkv, const float* dgate, const float* dpb) {
  const int64_t hd = 4, nw = T / m, n = T * c * hd;
  const std::string name = std::string("compress_pool vs HF ") + tag;
  std::vector<float> o(nw * hd), gk(n), gg(n), gp(m * c * hd, 0.f),
      ws(kern::compress_pool_bwd_workspace_floats(1, T, m, hd, c));
  kern::compress_pool_fwd(1, T, m, hd, c, kv, gate, pb, o.data());
  kern::compress_pool_bwd(1, T, m, hd, c, kv, gate, pb, dout, gk.data(), gg.data(), gp.data(), ws.data());
  bool ok = close_to("out", name, o.data(), out, o.size());
  ok &= close_to("dkv", name, gk.data(), dkv, gk.size());
  ok &= close_to("dgate", name, gg.data(), dgate, gg.size());
  ok &= close_to("dpb", name, gp.data(), dpb, gp.size());
  kern::ref::compress_pool_fwd<float>(1, T, m, hd, c, kv, gate, pb, o.data());
  std::fill(gp.begin(), gp.end(), 0.f);
  kern::ref::compress_pool_bwd<float>(1, T, m, hd, c, kv, gate, pb, dout, gk.data(), gg.data(), gp.data());
  ok &= close_to("ref out", name, o.data(), out, o.size());
  ok &= close_to("ref dkv", name, gk.data(), dkv, gk.size());
  ok &= close_to("ref dgate", name, gg.data(), dgate, gg.size());
  ok &= close_to("ref dpb", name, gp.data(), dpb, gp.size());
  return ok;
}

void pool_perf(const PoolCfg& p) {
  PoolData d(p, 3, 1.0);
  std::vector<float> out(d.nout), dkv(d.n), dgate(d.n), dpb(d.npb, 0.f);
  std::vector<float> ws(kern::compress_pool_bwd_workspace_floats(p.B, p.T, p.m, p.hd, p.c));
  const double tf = time_ms([&] {
    kern::compress_pool_fwd(p.B, p.T, p.m, p.hd, p.c, d.kv.data(), d.gate.data(), d.pb.data(), out.data());
  });
  const double tb = time_ms([&] {
    kern::compress_pool_bwd(p.B, p.T, p.m, p.hd, p.c, d.kv.data(), d.gate.data(), d.pb.data(), d.dout.data(),
                            dkv.data(), dgate.data(), dpb.data(), ws.data());
  });
  const double fb = 4.0 * (2 * d.n + d.nout), bb = 4.0 * (4 * d.n + 2 * d.nout);  // bytes moved
  std::printf("perf %-44s fwd %.3f ms %.1f GB/s   bwd %.3f ms %.1f GB/s\n", pool_name(p).c_str(), tf,
              fb / tf * 1e-6, tb, bb / tb * 1e-6);
}

// ---------------------------------------------------------------- indexer

// The implementation under test: the dispatched one, the AVX2 kernel called directly, or the host
// model of the CUDA kernel.
using IdxFn = void (*)(const kern::IndexerShape&, const float*, const float*, const float*, const int32_t*,
                       int32_t*, int32_t*, float*, float*);
struct IdxImpl {
  const char* tag;
  IdxFn fn;
  bool (*usable)();
  const char* lacks = "";   // why it is skipped where usable() is false
  bool bf16_data = false;  // its scores round q and k to bf16: the test data's are rounded first
};
bool idx_always() { return true; }
bool idx_has_avx2_fma() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
// "indexer[bf16]": a bf16 shape through the dispatch, where it takes the AVX512_BF16 scores
// (kern::attention_bf16_kernels; TREX_ATTN=f32 or another CPU: skipped).
void indexer_bf16(const kern::IndexerShape& sh, const float* q, const float* k, const float* w, const int32_t* pos,
                  int32_t* cnt, int32_t* sel, float* sc, float* ws) {
  kern::IndexerShape s = sh;
  s.prec = kern::Prec::BF16;
  kern::indexer_topk(s, q, k, w, pos, cnt, sel, sc, ws);
}
bool idx_has_bf16() { return kern::attention_bf16_kernels(kern::Prec::BF16); }
// "indexer[hd]": the host model of the CUDA kernel (tests/ops/indexer_hd_model.h).
const IdxImpl kIdxImpls[] = {
    {"indexer", kern::indexer_topk, idx_always},
    {"indexer[avx2]", kern::cpu::indexer_topk_avx2, idx_has_avx2_fma, "CPU lacks AVX2 + FMA"},
    {"indexer[bf16]", indexer_bf16, idx_has_bf16, "no bf16 attention kernels: CPU without AVX512_BF16 or TREX_ATTN=f32",
     true},
    {"indexer[hd]", hd_model::indexer_topk, idx_always}};

// q and k rounded to bf16 in place (nearest even).
void round_to_bf16(std::vector<float>& v) {
  for (float& x : v) x = round_bf16(x);
}

std::string idx_name(const IdxImpl& im, const IdxCfg& c, const char* extra = "") {
  return indexer_cfg_name(im.tag, c, extra);
}

bool idx_skipped(const IdxImpl& im, const std::string& name) {
  if (im.usable()) return false;
  std::printf("skip %-48s (%s)\n", name.c_str(), im.lacks);
  return true;
}

bool idx_test(const IdxImpl& im, const IdxCfg& c, bool ties) {
  const std::string name = idx_name(im, c, ties ? " ties/nan" : "");
  if (idx_skipped(im, name)) return true;
  IdxData d(c, 500 + c.T + c.nh * 7 + c.dI, ties);
  const auto& sh = d.sh;
  const size_t nq = c.B * c.T, ns = nq * sh.nw;
  Guarded<float> sc(ns), ws(kern::indexer_workspace_floats(sh));
  Guarded<int32_t> cnt(nq), sel(nq * c.topk), cnt2(nq), sel2(nq * c.topk);
  bool rounds = true;
  if (im.bf16_data) {  // the unrounded data first: the kernel must round it itself, to the same bits
    im.fn(sh, d.q.data(), d.k.data(), d.w.data(), d.pos.data(), cnt2.data(), sel2.data(), sc.data(), ws.data());
    const std::vector<float> sc_raw(sc.data(), sc.data() + ns);
    const std::vector<int32_t> sel_raw(sel2.data(), sel2.data() + nq * c.topk);
    round_to_bf16(d.q), round_to_bf16(d.k);
    im.fn(sh, d.q.data(), d.k.data(), d.w.data(), d.pos.data(), cnt.data(), sel.data(), sc.data(), ws.data());
    rounds = std::memcmp(sc_raw.data(), sc.data(), ns * sizeof(float)) == 0 &&
             std::equal(sel_raw.begin(), sel_raw.end(), sel.data());
  }
  im.fn(sh, d.q.data(), d.k.data(), d.w.data(), d.pos.data(), cnt.data(), sel.data(), sc.data(), ws.data());
  im.fn(sh, d.q.data(), d.k.data(), d.w.data(), d.pos.data(), cnt2.data(), sel2.data(), nullptr, ws.data());
  bool ok = indexer_check(name, c, d, ties, sc, cnt, sel, cnt2, sel2, ws.guard_ok());
  if (im.bf16_data) ok &= report(name, "rounds", rounds ? 0.0 : 1.0, 0);
  return ok;
}

// cnt, sel and scores_out bitwise equal with 1 thread and with all threads.
bool idx_determinism(const IdxImpl& im, const IdxCfg& c) {
  const std::string name = idx_name(im, c, " determinism");
  if (idx_skipped(im, name)) return true;
  IdxData d(c, 31);
  const auto& sh = d.sh;
  const size_t nq = c.B * c.T;
  std::vector<float> ws(kern::indexer_workspace_floats(sh));
  auto run = [&](std::vector<int32_t>& out, std::vector<float>& sc) {
    std::vector<int32_t> cnt(nq), sel(nq * c.topk);
    sc.assign(nq * sh.nw, 0.f);
    im.fn(sh, d.q.data(), d.k.data(), d.w.data(), d.pos.data(), cnt.data(), sel.data(), sc.data(), ws.data());
    out = cnt;
    out.insert(out.end(), sel.begin(), sel.end());
  };
  std::vector<int32_t> a, b;
  std::vector<float> sa, sb;
  const int nt = num_threads();
  omp_set_num_threads(1);
  run(a, sa);
  omp_set_num_threads(nt);
  run(b, sb);
  size_t bad = a != b;
  for (size_t i = 0; i < sa.size(); ++i) bad += std::memcmp(&sa[i], &sb[i], sizeof(float)) != 0;
  return report(name, "bitwise", static_cast<double>(bad), 0);
}

void idx_perf(const IdxImpl& im, const IdxCfg& c) {
  if (idx_skipped(im, idx_name(im, c))) return;
  IdxData d(c, 7);
  const auto& sh = d.sh;
  const size_t nq = c.B * c.T;
  std::vector<int32_t> cnt(nq), sel(nq * c.topk);
  std::vector<float> ws(kern::indexer_workspace_floats(sh));
  double flops = 0;  // scoring actually needed: valid entries of queries with more than topk of them
  for (size_t i = 0; i < nq; ++i) {
    const int64_t nv = kern::indexer_valid_count(d.pos[i], c.m, sh.nw);
    if (nv > std::min<int64_t>(c.topk, sh.nw)) flops += 2.0 * nv * c.nh * c.dI;
  }
  const double t = time_ms(
      [&] {
        im.fn(sh, d.q.data(), d.k.data(), d.w.data(), d.pos.data(), cnt.data(), sel.data(), nullptr, ws.data());
      },
      3);
  // Side by side: the dense [T*nh, dI] x [dI, nw] product of one batch row with sgemm (oneDNN),
  // the causal half of it being what a GEMM-based indexer would need at least.
  const int64_t tq = 64;  // queries per sgemm call (bounded product buffer)
  std::vector<float> C(static_cast<size_t>(tq * c.nh * sh.nw));
  const double tg = time_ms(
      [&] {
        for (int64_t b = 0; b < c.B; ++b)
          for (int64_t t0 = 0; t0 < c.T; t0 += tq)
            kern::gemm_f32(false, true, std::min(tq, c.T - t0) * c.nh, sh.nw, c.dI, 1.f,
                           d.q.data() + (b * c.T + t0) * c.nh * c.dI, c.dI, d.k.data() + b * sh.nw * c.dI, c.dI,
                           0.f, C.data(), sh.nw);
      },
      3);
  const double dense = 2.0 * c.B * c.T * c.nh * c.dI * sh.nw;
  std::printf("perf %-56s %.2f ms  %.1f GFLOP/s (%.2f GFLOP needed)   sgemm dense %.2f ms %.1f GFLOP/s\n",
              idx_name(im, c).c_str(), t, flops / t * 1e-6, flops * 1e-9, tg, dense / tg * 1e-6);
}

}  // namespace

TREX_OP_CASES(compress_pool_cases) {
  const PoolCfg tests[] = {
      {1, 7, 3, 5, 1},     {2, 37, 4, 37, 2},    {3, 130, 5, 129, 2}, {1, 300, 23, 64, 1},
      {2, 260, 128, 100, 1}, {1, 259, 128, 16, 2}, {2, 9, 1, 20, 2},  {2, 9, 1, 33, 1},
      {2, 3, 4, 17, 2},    {1, 4, 4, 8, 2},      {1, 1000, 4, 128, 2}, {1, 512, 128, 512, 1},
      {1, 37, 4, 600, 2},  {2, 50, 7, 1030, 1},
  };
  for (const PoolCfg& p : tests) cases.push_back({pool_name(p), [p] { return pool_test(p, false); }, nullptr, nullptr});
  for (const PoolCfg& p : {PoolCfg{1, 20, 4, 19, 2}, PoolCfg{2, 15, 3, 33, 1}})
    cases.push_back({pool_name(p, " nan"), [p] { return pool_test(p, true); }, nullptr, nullptr});
  cases.push_back({"compress_pool large logits", [] { return pool_test({2, 64, 8, 40, 2}, false, 60.0); }, nullptr,
                   nullptr});
  for (const PoolCfg& p : {PoolCfg{3, 1001, 4, 77, 2}, PoolCfg{2, 700, 23, 130, 1}})
    cases.push_back({pool_name(p, " determinism"), [p] { return pool_determinism(p); }, nullptr, nullptr});
  cases.push_back({"compress_pool vs HF hca", [] {
                     return pool_hf("hca", 8, 3, 1, kHca_kv, kHca_gate, kHca_pb, kHca_out, kHca_dout, kHca_dkv,
                                    kHca_dgate, kHca_dpb);
                   },
                   nullptr, nullptr});
  cases.push_back({"compress_pool vs HF csa", [] {
                     return pool_hf("csa", 7, 2, 2, kCsa_kv, kCsa_gate, kCsa_pb, kCsa_out, kCsa_dout, kCsa_dkv,
                                    kCsa_dgate, kCsa_dpb);
                   },
                   nullptr, nullptr});
  const PoolCfg grads[] = {{1, 7, 3, 2, 1}, {2, 7, 2, 3, 2}, {1, 9, 1, 2, 2}, {1, 3, 4, 2, 2}, {1, 11, 5, 3, 2}};
  for (const PoolCfg& p : grads) cases.push_back({pool_name(p), nullptr, [p] { return pool_grad(p); }, nullptr});
  const PoolCfg perfs[] = {{1, 8192, 128, 512, 1}, {1, 8192, 4, 512, 2}, {1, 8192, 4, 128, 2}};
  for (const PoolCfg& p : perfs) cases.push_back({pool_name(p), nullptr, nullptr, [p] { pool_perf(p); }});

  const IdxCfg iperfs[] = {{1, 2048, 16, 64, 4, 128, PosKind::Causal},  // bench-v4 CSA indexer
                           {1, 8192, 64, 128, 4, 512, PosKind::Causal},
                           {4, 2048, 8, 64, 4, 64, PosKind::Causal},
                           {2, 4096, 32, 128, 4, 256, PosKind::Packed}};
  const IdxCfg idet = {2, 700, 11, 40, 3, 50, PosKind::Packed};
  for (const IdxImpl& im : kIdxImpls) {
    for (const IdxCfg& c : kIdxTests)
      cases.push_back({idx_name(im, c), [&im, c] { return idx_test(im, c, false); }, nullptr, nullptr});
    for (const IdxCfg& c : kIdxTiesTests)
      cases.push_back({idx_name(im, c, " ties/nan"), [&im, c] { return idx_test(im, c, true); }, nullptr, nullptr});
    cases.push_back({idx_name(im, idet, " determinism"), [&im, idet] { return idx_determinism(im, idet); }, nullptr,
                     nullptr});
    for (const IdxCfg& c : iperfs)
      if (std::string(im.tag) != "indexer[hd]")  // the host model is not a kernel to time
        cases.push_back({idx_name(im, c), nullptr, nullptr, [&im, c] { idx_perf(im, c); }});
  }
  cases.push_back({"indexer[hd] rank keys", [] { return hd_model::rank_keys_test(); }, nullptr, nullptr});
}
