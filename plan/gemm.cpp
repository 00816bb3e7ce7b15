#include "plan/gemm.h"

#include <algorithm>
#include <cmath>

namespace trex::plan {

double tile_efficiency(const GemmShape& g, const GemmDevice& d) {
  if (d.sm_count <= 0 || g.m <= 0 || g.n <= 0 || g.groups <= 0) return 1;
  const double units = std::max<double>(1, std::floor((double)d.sm_count / (double)std::max<int64_t>(1, d.tile_sms)));
  const double tn = (double)d.tile_n;
  double best = 0;
  // The kernel's M tile: tile_m, or a half or a quarter of it for few rows, not below 64 rows
  // (grouped-GEMM libraries pick the block M by shape: DeepGEMM's 64 / 128 / 256).
  for (int64_t div = 1; div <= 4; div *= 2) {
    if (div > 1 && d.tile_m / div < 64) break;
    const double tm = (double)(d.tile_m / div);
    const double tiles = g.groups * std::ceil(g.m / tm) * std::ceil(g.n / tn);
    const double waves = std::ceil(tiles / units);
    best = std::max(best, g.groups * g.m * g.n / (waves * units * tm * tn));
  }
  return best;
}

GemmTime gemm_time(const GemmShape& g, const GemmDevice& d) {
  GemmTime t;
  if (g.m <= 0 || g.n <= 0 || g.k <= 0 || g.groups <= 0) return t;
  const double flops = 2 * g.groups * g.m * g.n * g.k;
  t.tile_eff = tile_efficiency(g, d);
  t.compute = flops / (d.rate * t.tile_eff);
  const double bytes = g.groups * ((g.m * g.k + g.n * g.k) * g.in_bytes + g.m * g.n * (g.out_bytes + 2 * g.accumulate));
  t.memory = d.mem_bw > 0 ? bytes / d.mem_bw : 0;
  t.seconds = std::max(t.compute, t.memory);
  return t;
}

GemmDevice gemm_device(const ClusterSpec& s, double rate) {
  GemmDevice d;
  d.rate = rate;
  d.mem_bw = s.mem_bw * s.eff.memory;
  d.sm_count = s.sm_count;
  d.tile_m = s.tile_m, d.tile_n = s.tile_n, d.tile_sms = s.tile_sms;
  return d;
}

ExpertGemms expert_gemms(const LayerCost& L, const Layout& l, int64_t hidden, double tokens, const GemmDevice& dev,
                         double in_bytes, double pad_rows) {
  ExpertGemms x;
  if (!L.moe || L.expert_fwd <= 0 || L.n_experts <= 0 || L.topk <= 0) return x;
  const double d = (double)hidden, I = L.expert_fwd / (6.0 * (double)L.topk * d);  // expert_fwd = 2 k 3 d I
  const double etp = (double)l.etp, local = (double)L.n_experts / (double)l.ep;
  x.rows = tokens * (double)L.topk * l.expert_load * (double)l.ep * etp / (double)L.n_experts;
  const double pad = x.rows > 0 ? (x.rows + std::max(0.0, pad_rows)) / x.rows : 1;  // padded rows' work
  auto run = [&](double m, double n, double k, double out, double acc) {
    GemmTime g = gemm_time(GemmShape{local, m, n, k, in_bytes, out, acc}, dev);
    g.compute *= pad;
    g.seconds = std::max(g.compute, g.memory);
    x.memory_bound = x.memory_bound || g.memory > g.compute;
    return g;
  };
  const double up = 2 * I / etp, down = I / etp;
  const GemmTime f1 = run(x.rows, up, d, 2, 0), f2 = run(x.rows, d, down, 2, 0);
  x.fwd = f1.seconds + f2.seconds;
  x.tile_eff = (f1.compute * f1.tile_eff + f2.compute * f2.tile_eff) / std::max(1e-300, f1.compute + f2.compute);
  x.dgrad = run(x.rows, d, up, 2, 0).seconds + run(x.rows, down, d, 2, 0).seconds;
  x.wgrad = run(up, d, x.rows, 0, l.grad_bytes).seconds + run(d, down, x.rows, 0, l.grad_bytes).seconds;
  return x;
}

}  // namespace trex::plan
