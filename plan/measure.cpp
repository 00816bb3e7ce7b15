#include "plan/measure.h"

#include <unistd.h>
#include <algorithm>
#include <cstring>
#include <vector>
#include "core/cpu.h"
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

}  // namespace

double median_ms(const std::function<void()>& fn, double seconds) {
  fn();  // warm-up (JIT, first touch)
  std::vector<double> t;
  double spent = 0;
  while (t.size() < 5 || (spent < seconds * 1000 && t.size() < 200)) {
    double t0 = now_ms();
    fn();
    t.push_back(now_ms() - t0);
    spent += t.back();
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

double triad_gbs(double seconds) {
  const int64_t n = int64_t{32} << 20;  // 3 x 128 MB
  std::vector<float> a(n, 1.f), b(n, 2.f), d(n, 0.f);
  const double ms = median_ms([&] {
    parallel_for(n, 1 << 16, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) d[i] = a[i] + 0.5f * b[i];
    });
  }, seconds);
  return 3.0 * n * 4 / (ms / 1000) / 1e9;
}

Calibration measure_calibration(double seconds) {
  Calibration c = default_calibration();
  c.measured = true;
  c.note = "measured by trex bench calibrate";
  c.written_by = "trex bench calibrate";
  c.isa = isa_name(cpu_isa());
  c.threads = num_threads();
  c.ranks_per_node = 1;
  kern::Peak pk = kern::measure_peak(0.5);
  // The planner's matmul peak is the rate trex's bf16 GEMMs run at: the best of the FMA and
  // bf16-dot peaks (bf16 operands are widened to f32 where the FMA units are faster).
  c.bf16_gflops = pk.best_gflops();
  c.fp32_gflops = pk.fp32_gflops;
  const double peak = pk.best_gflops() * 1e9;
  c.mem_gb = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGE_SIZE) / 1e9;
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  c.machine = std::string(host) + " (" + std::to_string(c.threads) + " threads)";

  // Memory bandwidth: a threaded triad over arrays far larger than the caches.
  {
    c.mem_bw_gbs = triad_gbs(seconds);
    // A memory-bound model op (RMSNorm forward: read x, write y) against that bandwidth.
    const int64_t N = 16384, dd = 1024;
    std::vector<float> a(N * dd, 1.f), d(N * dd), w(dd, 1.f), rs(N);
    double ms2 = median_ms([&] { kern::rmsnorm_fwd(a.data(), N, dd, w.data(), 1e-6f, d.data(), rs.data()); }, seconds);
    c.efficiency["memory"] = std::min(1.0, 2.0 * N * dd * 4 / (ms2 / 1000) / 1e9 / c.mem_bw_gbs);
  }
  // Dense GEMM: the three shapes of a linear layer (fwd, dx, dW) in bf16.
  {
    const int64_t M = 2048, N = 1024, K = 1024;
    auto A = random_bf16(M * K, 1), B = random_bf16(N * K, 2), G = random_bf16(M * N, 3);
    std::vector<float> C(std::max(M * N, N * K));
    double ms = median_ms([&] {
      kern::gemm_bf16(false, true, M, N, K, 1.f, A.data(), K, B.data(), K, 0.f, C.data(), N);
      kern::gemm_bf16(false, false, M, K, N, 1.f, G.data(), N, B.data(), K, 0.f, C.data(), K);
      kern::gemm_bf16(true, false, N, K, M, 1.f, G.data(), N, A.data(), K, 1.f, C.data(), K);
    }, seconds);
    c.efficiency["gemm"] = 3 * 2.0 * M * N * K / (ms / 1000) / peak;
  }
  // Grouped expert GEMMs of a routed-expert MLP, forward and backward as the MoE layer runs them:
  // 32 experts, d 1024, I 512; up (gate|up, [2I, d]) and down ([d, I]), each as Y = X W^T,
  // dX = dY W, dW += dY^T X, bf16 operands. The experts get 224-288 token rows each (about 256),
  // not all one count: a routed step gives each expert its own, mostly not a multiple of a
  // kernel's block, and the tails cost (kernels/gemm_bf16_dnnl.cpp).
  {
    const int E = 32;
    const int64_t d = 1024, I = 512;
    std::vector<int64_t> r0(E + 1, 0);
    for (int e = 0; e < E; ++e) r0[e + 1] = r0[e] + 224 + (e * 37) % 65;
    const int64_t R = r0[E];
    auto X = random_bf16(R * d, 4), Wu = random_bf16(E * 2 * I * d, 5), Hh = random_bf16(R * I, 9),
         Wd = random_bf16(E * d * I, 10), dYu = random_bf16(R * 2 * I, 11), dYd = random_bf16(R * d, 12);
    std::vector<float> Yu(R * 2 * I), Yd(R * d), dX(R * d), dH(R * I), dWu(E * 2 * I * d, 0.f), dWd(E * d * I, 0.f);
    std::vector<kern::GemmGroup> fu, fd, xu, xd, wu, wd;
    for (int e = 0; e < E; ++e) {
      const int64_t o = r0[e], rows = r0[e + 1] - o;
      const bf16 *x = X.data() + o * d, *wup = Wu.data() + e * 2 * I * d, *h = Hh.data() + o * I,
                 *wdn = Wd.data() + e * d * I, *gu = dYu.data() + o * 2 * I, *gd = dYd.data() + o * d;
      fu.push_back({x, wup, Yu.data() + o * 2 * I, rows, 2 * I, d, d, d, 2 * I});
      fd.push_back({h, wdn, Yd.data() + o * d, rows, d, I, I, I, d});
      xu.push_back({gu, wup, dX.data() + o * d, rows, d, 2 * I, 2 * I, d, d});
      xd.push_back({gd, wdn, dH.data() + o * I, rows, I, d, d, I, I});
      wu.push_back({gu, x, dWu.data() + e * 2 * I * d, 2 * I, d, rows, 2 * I, d, d});
      wd.push_back({gd, h, dWd.data() + e * d * I, d, I, rows, d, I, I});
    }
    double ms = median_ms([&] {
      kern::grouped_gemm(kern::Prec::BF16, false, true, 1.f, 0.f, fu.data(), E);
      kern::grouped_gemm(kern::Prec::BF16, false, true, 1.f, 0.f, fd.data(), E);
      kern::grouped_gemm(kern::Prec::BF16, false, false, 1.f, 0.f, xd.data(), E);
      kern::grouped_gemm(kern::Prec::BF16, true, false, 1.f, 1.f, wd.data(), E);
      kern::grouped_gemm(kern::Prec::BF16, false, false, 1.f, 0.f, xu.data(), E);
      kern::grouped_gemm(kern::Prec::BF16, true, false, 1.f, 1.f, wu.data(), E);
    }, seconds);
    c.efficiency["grouped_gemm"] = 3 * 2.0 * R * 3 * I * d / (ms / 1000) / peak;
  }
  // LM head fused with cross-entropy (kernels/lm_head_ce.h), loss and gradients: 2048 rows, d 1024,
  // vocabulary 16384, bf16. Rated in the planner's 6 N V d (the fused kernel computes the logits
  // twice; that cost is part of what is measured).
  {
    const int64_t N = 2048, d = 1024, V = 16384;
    auto Hb = random_bf16(N * d, 13), Wb = random_bf16(V * d, 14);
    std::vector<float> h(N * d, 0.f), W(V * d, 0.f), dh(N * d), dW(V * d, 0.f);
    std::vector<int32_t> labels(N);
    for (int64_t i = 0; i < N; ++i) labels[i] = (int32_t)((i * 7919) % V);
    kern::CeArgs a;
    a.prec = kern::Prec::BF16;
    a.N = N, a.d = d, a.V = V;
    a.h = h.data(), a.h_b = Hb.data(), a.W = W.data(), a.W_b = Wb.data(), a.labels = labels.data();
    a.dh = dh.data(), a.dW = dW.data();
    std::vector<float> work(kern::lm_head_ce_workspace_floats(a));
    a.workspace = work.data();
    double ms = median_ms([&] { kern::lm_head_ce(a, nullptr); }, seconds);
    c.efficiency["head"] = 6.0 * N * V * d / (ms / 1000) / peak;
  }
  // Attention forward + backward (causal, MLA-like head dims), bf16 products as in a bf16 run.
  {
    const int B = 1, T = 2048, H = 8, Dqk = 96, Dv = 64;
    Rng r(6);
    std::vector<float> q((size_t)B * T * H * Dqk), k(q.size()), v((size_t)B * T * H * Dv), o(v.size()),
        lse((size_t)B * H * T), dO(v.size()), dq(q.size()), dk(q.size()), dv(v.size());
    for (auto* vec : {&q, &k, &v, &dO})
      for (auto& x : *vec) x = (float)r.normal();
    kern::AttnShape sh{B, T, H, Dqk, Dv, 0.1f, 0, kern::Prec::BF16};
    double ms = median_ms([&] {
      kern::attention_fwd(sh, q.data(), k.data(), v.data(), o.data(), lse.data());
      kern::attention_bwd(sh, q.data(), k.data(), v.data(), o.data(), lse.data(), dO.data(), dq.data(), dk.data(),
                          dv.data());
    }, seconds);
    const double fwd = 2.0 * (Dqk + Dv) * ((double)T * (T + 1) / 2) * H * B;
    c.efficiency["attention"] = 3.0 * fwd / (ms / 1000) / peak;  // bwd = 2 x fwd matmul FLOPs
  }
  // DeepSeek-V4 attention core (kernels/sparse_attn.h), forward + backward, at a CSA layer of
  // bench-v4: 16 heads of 128 sharing one kv row per key; each query attends its sliding window
  // of 128 and up to 128 of the compressed entries formed so far (rate 4).
  {
    const int64_t N = 2048, win = 128, topk = 128, m = 4, nw = N / m, M = N + nw;
    const int H = 16, D = 128;
    Rng r(7);
    std::vector<float> q((size_t)N * H * D), kv((size_t)M * D), o(q.size()), lse((size_t)N * H), dO(q.size()),
        dq(q.size()), dkv(kv.size()), sink(H), dsink(H);
    for (auto* vec : {&q, &kv, &dO, &sink})
      for (auto& x : *vec) x = (float)r.normal();
    std::vector<int64_t> off(N + 1, 0);
    std::vector<int32_t> idx;
    for (int64_t i = 0; i < N; ++i) {
      for (int64_t u = std::max<int64_t>(0, i - win + 1); u <= i; ++u) idx.push_back((int32_t)u);
      const int64_t formed = (i + 1) / m;
      for (int64_t w = std::max<int64_t>(0, formed - topk); w < formed; ++w) idx.push_back((int32_t)(N + w));
      off[i + 1] = (int64_t)idx.size();
    }
    const kern::SparseAttnShape sh{N, H, D, 0.088f, kern::Prec::BF16};  // bf16 products as in a bf16 run
    std::vector<float> work(std::max<size_t>(kern::sparse_attn_bwd_workspace_floats(sh, M), 1));
    double ms = median_ms([&] {
      kern::sparse_attn_fwd(sh, q.data(), kv.data(), M, off.data(), idx.data(), sink.data(), o.data(), lse.data());
      kern::sparse_attn_bwd(sh, q.data(), kv.data(), M, off.data(), idx.data(), sink.data(), o.data(), lse.data(),
                            dO.data(), dq.data(), dkv.data(), dsink.data(), work.data());
    }, seconds);
    const double fwd = 2.0 * H * (2.0 * D) * (double)off[N];  // the planner's 2 H (dqk + dv) per attended key
    c.efficiency["sparse_attention"] = 3.0 * fwd / (ms / 1000) / peak;
  }
  // The CSA indexer (kernels/indexer.h, forward only): 16 heads of 64 scoring every compressed
  // entry formed so far, then the top 128.
  {
    const int64_t T = 2048, m = 4, nw = T / m;
    const int nh = 16, dI = 64, topk = 128;
    Rng r(8);
    std::vector<float> q((size_t)T * nh * dI), k((size_t)nw * dI), wts((size_t)T * nh);
    for (auto* vec : {&q, &k, &wts})
      for (auto& x : *vec) x = (float)r.normal();
    std::vector<int32_t> pos(T), cnt(T), sel((size_t)T * topk);
    for (int64_t t = 0; t < T; ++t) pos[t] = (int32_t)t;
    const kern::IndexerShape sh{1, T, nw, nh, dI, m, topk, 0.125f};
    std::vector<float> work(std::max<size_t>(kern::indexer_workspace_floats(sh), 1));
    double ms = median_ms([&] {
      kern::indexer_topk(sh, q.data(), k.data(), wts.data(), pos.data(), cnt.data(), sel.data(), nullptr, work.data());
    }, seconds);
    double scored = 0;
    for (int64_t t = 0; t < T; ++t) scored += (double)((t + 1) / m);
    c.efficiency["indexer"] = 2.0 * nh * dI * scored / (ms / 1000) / peak;
  }
  // The optimizer step as train/optimizer.cpp runs it on every parameter: the gradient's sum of
  // squares (norm clipping), then AdamW with the bf16 copy; rated in the planner's bytes per
  // parameter (f32 grad, master and moments read; master and moments written; bf16 written).
  {
    const int64_t n = int64_t{16} << 20;
    std::vector<float> p(n, 0.5f), g(n, 1e-3f), m1(n, 0.f), v1(n, 0.f);
    std::vector<bf16> pb(n);
    int64_t t = 0;
    double ms = median_ms([&] {
      const double ss = kern::sum_squares(g.data(), n);
      kern::AdamWParams hp{1e-4, 0.9, 0.95, 1e-8, 0.1, ++t, (float)(1.0 / (1.0 + ss))};
      kern::adamw_step(hp, p.data(), g.data(), m1.data(), v1.data(), n, pb.data());
    }, seconds);
    c.efficiency["optimizer"] = std::min(1.0, 30.0 * n / (ms / 1000) / 1e9 / c.mem_bw_gbs);
  }
  // The peak once more, now that the caches and clocks are warm: a peak measured low (another
  // process on a core) would make every efficiency too high, so the best of the two is the peak.
  kern::Peak pk2 = kern::measure_peak(0.5);
  if (pk2.best_gflops() > pk.best_gflops()) {
    const double f = pk.best_gflops() / pk2.best_gflops();
    for (const char* k : {"gemm", "grouped_gemm", "head", "attention", "sparse_attention", "indexer"}) c.efficiency[k] *= f;
    c.bf16_gflops = pk2.best_gflops();
    c.fp32_gflops = std::max(c.fp32_gflops, pk2.fp32_gflops);
  }
  for (const char* k : {"gemm", "grouped_gemm", "head", "attention", "sparse_attention", "indexer"})
    c.efficiency[k] = std::min(1.0, c.efficiency[k]);
  return c;
}

}  // namespace trex::plan
