#include "plan/measure.h"

#include <unistd.h>
#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>
#include "core/cpu.h"
#include "core/host_memory.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "core/timer.h"
#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/gemm.h"
#include "kernels/lm_head_ce.h"
#include "kernels/indexer.h"
#include "kernels/sparse_attn.h"
#include "kernels/peak.h"
#include "kernels/rmsnorm.h"

namespace trex::plan {

namespace {

std::vector<bf16> random_bf16(size_t n, uint64_t seed) {
  Rng r(seed);
  std::vector<bf16> v(n);
  for (auto& x : v) x = f32_to_bf16((float)r.normal());
  return v;
}

// Appends the times (ms) of runs of fn filling about `seconds`, at least min_runs of them.
void append_runs(const std::function<void()>& fn, double seconds, size_t min_runs, std::vector<double>& t) {
  double spent = 0;
  for (size_t k = 0; k < min_runs || (spent < seconds * 1000 && k < 200); ++k) {
    double t0 = now_ms();
    fn();
    t.push_back(now_ms() - t0);
    spent += t.back();
  }
}

double median_of(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

double median_ms(const std::function<void()>& fn, double seconds) {
  fn();  // warm-up (JIT, first touch)
  std::vector<double> t;
  append_runs(fn, seconds, 5, t);
  return median_of(t);
}

namespace {

// A triad d = a + 0.5 b over 3 x 128 MB (12 bytes an element), threaded.
struct Triad {
  static constexpr int64_t n = int64_t{32} << 20;
  std::vector<float> a = std::vector<float>(n, 1.f), b = std::vector<float>(n, 2.f), d = std::vector<float>(n, 0.f);
  void operator()() {
    parallel_for(n, 1 << 16, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) d[i] = a[i] + 0.5f * b[i];
    });
  }
  static double gbs(double ms) { return 3.0 * n * 4 / (ms / 1000) / 1e9; }
};

}  // namespace

double triad_gbs(double seconds) {
  Triad t;
  return Triad::gbs(median_ms(std::ref(t), seconds));
}

namespace {

// One op class of the calibration: run() does it once; its figure comes from the median time.
struct Probe {
  const char* key;
  std::function<void()> run;
  double flops = 0;        // a run's FLOPs, rated against the peak; 0: a memory probe, rated in bytes
  std::vector<double> ms;  // every timed run, over all passes
};

// Dense GEMM: the three shapes of a linear layer (fwd, dx, dW) in bf16. FLOPs per run via `flops`.
std::function<void()> dense_gemm(double& flops) {
  const int64_t M = 2048, N = 1024, K = 1024;
  flops = 3 * 2.0 * M * N * K;
  struct S {
    std::vector<bf16> A = random_bf16(M * K, 1), B = random_bf16(N * K, 2), G = random_bf16(M * N, 3);
    std::vector<float> C = std::vector<float>(std::max(M * N, N * K));
  };
  auto st = std::make_shared<S>();
  return [st] {
    S& s = *st;
    kern::gemm_bf16(false, true, M, N, K, 1.f, s.A.data(), K, s.B.data(), K, 0.f, s.C.data(), N);
    kern::gemm_bf16(false, false, M, K, N, 1.f, s.G.data(), N, s.B.data(), K, 0.f, s.C.data(), K);
    kern::gemm_bf16(true, false, N, K, M, 1.f, s.G.data(), N, s.A.data(), K, 1.f, s.C.data(), K);
  };
}

// Grouped expert GEMMs of a routed-expert MLP, forward and backward as the MoE layer runs them:
// 32 experts, d 1024, I 512; up (gate|up, [2I, d]) and down ([d, I]), each as Y = X W^T,
// dX = dY W, dW += dY^T X, bf16 operands. The experts get 224-288 token rows each (about 256),
// not all one count: a routed step gives each expert its own, mostly not a multiple of a
// kernel's block, and the tails cost (kernels/gemm_bf16_dnnl.cpp).
std::function<void()> grouped_gemm(double& flops) {
  constexpr int E = 32;
  constexpr int64_t d = 1024, I = 512;
  struct S {
    std::vector<int64_t> r0 = std::vector<int64_t>(E + 1, 0);
    std::vector<bf16> X, Wu, Hh, Wd, dYu, dYd;
    std::vector<float> Yu, Yd, dX, dH, dWu, dWd;
    std::vector<kern::GemmGroup> fu, fd, xu, xd, wu, wd;
  };
  auto st = std::make_shared<S>();
  S& s = *st;
  for (int e = 0; e < E; ++e) s.r0[e + 1] = s.r0[e] + 224 + (e * 37) % 65;
  const int64_t R = s.r0[E];
  flops = 3 * 2.0 * R * 3 * I * d;
  s.X = random_bf16(R * d, 4), s.Wu = random_bf16(E * 2 * I * d, 5), s.Hh = random_bf16(R * I, 9);
  s.Wd = random_bf16(E * d * I, 10), s.dYu = random_bf16(R * 2 * I, 11), s.dYd = random_bf16(R * d, 12);
  s.Yu.resize(R * 2 * I), s.Yd.resize(R * d), s.dX.resize(R * d), s.dH.resize(R * I);
  s.dWu.assign(E * 2 * I * d, 0.f), s.dWd.assign(E * d * I, 0.f);
  for (int e = 0; e < E; ++e) {
    const int64_t o = s.r0[e], rows = s.r0[e + 1] - o;
    const bf16 *x = s.X.data() + o * d, *wup = s.Wu.data() + e * 2 * I * d, *h = s.Hh.data() + o * I,
               *wdn = s.Wd.data() + e * d * I, *gu = s.dYu.data() + o * 2 * I, *gd = s.dYd.data() + o * d;
    s.fu.push_back({x, wup, s.Yu.data() + o * 2 * I, rows, 2 * I, d, d, d, 2 * I});
    s.fd.push_back({h, wdn, s.Yd.data() + o * d, rows, d, I, I, I, d});
    s.xu.push_back({gu, wup, s.dX.data() + o * d, rows, d, 2 * I, 2 * I, d, d});
    s.xd.push_back({gd, wdn, s.dH.data() + o * I, rows, I, d, d, I, I});
    s.wu.push_back({gu, x, s.dWu.data() + e * 2 * I * d, 2 * I, d, rows, 2 * I, d, d});
    s.wd.push_back({gd, h, s.dWd.data() + e * d * I, d, I, rows, d, I, I});
  }
  return [st] {
    S& s = *st;
    kern::grouped_gemm(kern::Prec::BF16, false, true, 1.f, 0.f, s.fu.data(), E);
    kern::grouped_gemm(kern::Prec::BF16, false, true, 1.f, 0.f, s.fd.data(), E);
    kern::grouped_gemm(kern::Prec::BF16, false, false, 1.f, 0.f, s.xd.data(), E);
    kern::grouped_gemm(kern::Prec::BF16, true, false, 1.f, 1.f, s.wd.data(), E);
    kern::grouped_gemm(kern::Prec::BF16, false, false, 1.f, 0.f, s.xu.data(), E);
    kern::grouped_gemm(kern::Prec::BF16, true, false, 1.f, 1.f, s.wu.data(), E);
  };
}

// LM head fused with cross-entropy (kernels/lm_head_ce.h), loss and gradients: 2048 rows, d 1024,
// vocabulary 16384, bf16. Rated in the planner's 6 N V d (the fused kernel computes the logits
// twice; that cost is part of what is measured).
std::function<void()> lm_head(double& flops) {
  constexpr int64_t N = 2048, d = 1024, V = 16384;
  flops = 6.0 * N * V * d;
  struct S {
    std::vector<bf16> Hb = random_bf16(N * d, 13), Wb = random_bf16(V * d, 14);
    std::vector<float> h = std::vector<float>(N * d, 0.f), W = std::vector<float>(V * d, 0.f),
                       dh = std::vector<float>(N * d), dW = std::vector<float>(V * d, 0.f), work;
    std::vector<int32_t> labels = std::vector<int32_t>(N);
    kern::CeArgs a;
  };
  auto st = std::make_shared<S>();
  S& s = *st;
  for (int64_t i = 0; i < N; ++i) s.labels[i] = (int32_t)((i * 7919) % V);
  kern::CeArgs& a = s.a;
  a.prec = kern::Prec::BF16;
  a.N = N, a.d = d, a.V = V;
  a.h = s.h.data(), a.h_b = s.Hb.data(), a.W = s.W.data(), a.W_b = s.Wb.data(), a.labels = s.labels.data();
  a.dh = s.dh.data(), a.dW = s.dW.data();
  s.work.resize(kern::lm_head_ce_workspace_floats(a));
  a.workspace = s.work.data();
  return [st] { kern::lm_head_ce(st->a, nullptr); };
}

// Attention forward + backward (causal, MLA-like head dims), bf16 products as in a bf16 run.
std::function<void()> attention(double& flops) {
  constexpr int B = 1, T = 2048, H = 8, Dqk = 96, Dv = 64;
  flops = 3.0 * 2.0 * (Dqk + Dv) * ((double)T * (T + 1) / 2) * H * B;  // bwd = 2 x fwd matmul FLOPs
  struct S {
    std::vector<float> q = std::vector<float>((size_t)B * T * H * Dqk), k = q,
                       v = std::vector<float>((size_t)B * T * H * Dv), o = v,
                       lse = std::vector<float>((size_t)B * H * T), dO = v, dq = q, dk = q, dv = v;
  };
  auto st = std::make_shared<S>();
  Rng r(6);
  for (auto* vec : {&st->q, &st->k, &st->v, &st->dO})
    for (auto& x : *vec) x = (float)r.normal();
  return [st] {
    S& s = *st;
    const kern::AttnShape sh{B, T, H, Dqk, Dv, 0.1f, 0, kern::Prec::BF16};
    kern::attention_fwd(sh, s.q.data(), s.k.data(), s.v.data(), s.o.data(), s.lse.data());
    kern::attention_bwd(sh, s.q.data(), s.k.data(), s.v.data(), s.o.data(), s.lse.data(), s.dO.data(), s.dq.data(),
                        s.dk.data(), s.dv.data());
  };
}

// DeepSeek-V4 attention core (kernels/sparse_attn.h), forward + backward, at a CSA layer of
// bench-v4: 16 heads of 128 sharing one kv row per key; each query attends its sliding window
// of 128 and up to 128 of the compressed entries formed so far (rate 4).
std::function<void()> sparse_attention(double& flops) {
  constexpr int64_t N = 2048, win = 128, topk = 128, m = 4, nw = N / m, M = N + nw;
  constexpr int H = 16, D = 128;
  struct S {
    std::vector<float> q = std::vector<float>((size_t)N * H * D), kv = std::vector<float>((size_t)M * D), o = q,
                       lse = std::vector<float>((size_t)N * H), dO = q, dq = q, dkv = kv, sink = std::vector<float>(H),
                       dsink = sink, work;
    std::vector<int64_t> off = std::vector<int64_t>(N + 1, 0);
    std::vector<int32_t> idx;
  };
  auto st = std::make_shared<S>();
  S& s = *st;
  Rng r(7);
  for (auto* vec : {&s.q, &s.kv, &s.dO, &s.sink})
    for (auto& x : *vec) x = (float)r.normal();
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t u = std::max<int64_t>(0, i - win + 1); u <= i; ++u) s.idx.push_back((int32_t)u);
    const int64_t formed = (i + 1) / m;
    for (int64_t w = std::max<int64_t>(0, formed - topk); w < formed; ++w) s.idx.push_back((int32_t)(N + w));
    s.off[i + 1] = (int64_t)s.idx.size();
  }
  const kern::SparseAttnShape sh{N, H, D, 0.088f, kern::Prec::BF16};  // bf16 products as in a bf16 run
  s.work.resize(std::max<size_t>(kern::sparse_attn_bwd_workspace_floats(sh, M), 1));
  flops = 3.0 * 2.0 * H * (2.0 * D) * (double)s.off[N];  // the planner's 2 H (dqk + dv) per attended key
  return [st, sh] {
    S& s = *st;
    kern::sparse_attn_fwd(sh, s.q.data(), s.kv.data(), M, s.off.data(), s.idx.data(), s.sink.data(), s.o.data(),
                          s.lse.data());
    kern::sparse_attn_bwd(sh, s.q.data(), s.kv.data(), M, s.off.data(), s.idx.data(), s.sink.data(), s.o.data(),
                          s.lse.data(), s.dO.data(), s.dq.data(), s.dkv.data(), s.dsink.data(), s.work.data());
  };
}

// The CSA indexer (kernels/indexer.h, forward only): 16 heads of 64 scoring every compressed
// entry formed so far, then the top 128.
std::function<void()> indexer(double& flops) {
  constexpr int64_t T = 2048, m = 4, nw = T / m;
  constexpr int nh = 16, dI = 64, topk = 128;
  struct S {
    std::vector<float> q = std::vector<float>((size_t)T * nh * dI), k = std::vector<float>((size_t)nw * dI),
                       wts = std::vector<float>((size_t)T * nh), work;
    std::vector<int32_t> pos = std::vector<int32_t>(T), cnt = pos, sel = std::vector<int32_t>((size_t)T * topk);
  };
  auto st = std::make_shared<S>();
  S& s = *st;
  Rng r(8);
  for (auto* vec : {&s.q, &s.k, &s.wts})
    for (auto& x : *vec) x = (float)r.normal();
  for (int64_t t = 0; t < T; ++t) s.pos[t] = (int32_t)t;
  const kern::IndexerShape sh{1, T, nw, nh, dI, m, topk, 0.125f};
  s.work.resize(std::max<size_t>(kern::indexer_workspace_floats(sh), 1));
  double scored = 0;
  for (int64_t t = 0; t < T; ++t) scored += (double)((t + 1) / m);
  flops = 2.0 * nh * dI * scored;
  return [st, sh] {
    S& s = *st;
    kern::indexer_topk(sh, s.q.data(), s.k.data(), s.wts.data(), s.pos.data(), s.cnt.data(), s.sel.data(), nullptr,
                       s.work.data());
  };
}

}  // namespace

Calibration measure_calibration(double seconds) {
  Calibration c = default_calibration();
  c.measured = true;
  c.note = "measured by trex bench calibrate";
  c.written_by = "trex bench calibrate";
  c.isa = isa_name(cpu_isa());
  c.threads = num_threads();
  c.ranks_per_node = 1;
  c.mem_gb = machine_memory_bytes() / 1e9;
  c.mem_available_gb = available_memory_bytes() / 1e9;
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  c.machine = std::string(host) + " (" + std::to_string(c.threads) + " threads)";

  // Compute probes: the FLOPs of one run and the planner's efficiency key.
  std::vector<Probe> probes;
  for (auto [key, make] : std::initializer_list<std::pair<const char*, std::function<void()> (*)(double&)>>{
           {"gemm", dense_gemm}, {"grouped_gemm", grouped_gemm}, {"head", lm_head}, {"attention", attention},
           {"sparse_attention", sparse_attention}, {"indexer", indexer}}) {
    Probe p{key, {}, 0, {}};
    p.run = make(p.flops);
    probes.push_back(std::move(p));
  }
  // Memory probes: a threaded triad (the bandwidth), a memory-bound model op (RMSNorm forward:
  // read x, write y) against it, and the optimizer step as train/optimizer.cpp runs it on every
  // parameter: the gradient's sum of squares (norm clipping), then AdamW with the bf16 copy;
  // rated in the planner's bytes per parameter (f32 grad, master and moments read; master and
  // moments written; bf16 written).
  auto triad = std::make_shared<Triad>();
  probes.push_back({"triad", [triad] { (*triad)(); }, 0, {}});
  constexpr int64_t rn = 16384, rd = 1024, on = int64_t{16} << 20;
  struct Mem {
    std::vector<float> a = std::vector<float>(rn * rd, 1.f), d = std::vector<float>(rn * rd),
                       w = std::vector<float>(rd, 1.f), rs = std::vector<float>(rn);
    std::vector<float> p = std::vector<float>(on, 0.5f), g = std::vector<float>(on, 1e-3f),
                       m1 = std::vector<float>(on, 0.f), v1 = std::vector<float>(on, 0.f);
    std::vector<bf16> pb = std::vector<bf16>(on);
    int64_t t = 0;
  };
  auto mem = std::make_shared<Mem>();
  probes.push_back({"memory", [mem] {
                      kern::rmsnorm_fwd(mem->a.data(), rn, rd, mem->w.data(), 1e-6f, mem->d.data(), mem->rs.data());
                    }, 0, {}});
  probes.push_back({"optimizer", [mem] {
                      Mem& s = *mem;
                      const double ss = kern::sum_squares(s.g.data(), on);
                      kern::AdamWParams hp{1e-4, 0.9, 0.95, 1e-8, 0.1, ++s.t, (float)(1.0 / (1.0 + ss))};
                      kern::adamw_step(hp, s.p.data(), s.g.data(), s.m1.data(), s.v1.data(), on, s.pb.data());
                    }, 0, {}});

  // The ops take turns: kPasses passes over all of them, each op running about seconds / kPasses
  // a pass, and the peak measured at the start of every pass and at the end. On a shared machine
  // whose speed drifts over minutes, a slow spell then slows every op a little instead of one op
  // all the way; each figure is the median of all its runs, as a step runs its ops at their
  // typical speed, and the peak the best of its measurements (a peak measured low, another
  // process on a core, would make every efficiency too high).
  constexpr int kPasses = 3;
  // The planner's matmul peak is the rate trex's bf16 GEMMs run at: the best of the FMA and
  // bf16-dot peaks (bf16 operands are widened to f32 where the FMA units are faster).
  c.bf16_gflops = c.fp32_gflops = 0;
  for (Probe& p : probes) p.run();  // warm-up (JIT, first touch)
  for (int pass = 0; pass <= kPasses; ++pass) {
    const kern::Peak now = kern::measure_peak(0.5);
    c.bf16_gflops = std::max(c.bf16_gflops, now.best_gflops());
    c.fp32_gflops = std::max(c.fp32_gflops, now.fp32_gflops);
    if (pass == kPasses) break;
    for (Probe& p : probes) append_runs(p.run, seconds / kPasses, 2, p.ms);
  }
  for (const Probe& p : probes)
    if (p.flops > 0) c.efficiency[p.key] = std::min(1.0, p.flops / (median_of(p.ms) / 1000) / (c.bf16_gflops * 1e9));
  auto ms_of = [&](const char* key) {
    for (const Probe& p : probes)
      if (std::string(p.key) == key) return median_of(p.ms);
    return 0.0;
  };
  c.mem_bw_gbs = Triad::gbs(ms_of("triad"));
  c.efficiency["memory"] = std::min(1.0, 2.0 * rn * rd * 4 / (ms_of("memory") / 1000) / 1e9 / c.mem_bw_gbs);
  c.efficiency["optimizer"] = std::min(1.0, 30.0 * on / (ms_of("optimizer") / 1000) / 1e9 / c.mem_bw_gbs);
  return c;
}

}  // namespace trex::plan
