// Time of a grouped GEMM at its shape: the routed experts' GEMMs of one MoE layer on one device
// (groups = local experts, each M = rows it received x N x K), as the roofline and the tile grid
// of the device bound it.
//
//   compute  FLOPs / (rate x tile-and-wave efficiency); rate = peak x the class efficiency (what the
//            kernel reaches at large shapes, plan/spec.h); the tile grid: every group is cut into
//            ceil(M / tm) x ceil(N / tile_n) output tiles, each tile runs on tile_sms SMs, the
//            tiles run in waves of sm_count / tile_sms units; efficiency = useful output elements
//            / (waves x units x tile area): the partial last wave and the padded edge tiles. tm is
//            the kernel's choice among tile_m, tile_m / 2 and tile_m / 4 (not below 64 rows), the
//            best of them (libraries pick the block M by shape; smaller tiles' lower per-SM rate is
//            not modelled).
//   memory   bytes / (bandwidth x memory efficiency): A (M x K) and B (N x K) at the input
//            precision, the output (M x N, bf16), and under `accumulate` the output read and
//            written again at that many bytes per element (the weight gradient added into the
//            main gradient in place, Megatron-Core's gradient-accumulation fusion).
//   time     max(compute, memory).
//
// The three GEMMs of a linear layer's training step: forward  M x N x K; data gradient M x K x N;
// weight gradient N x K x M (output N x K, accumulated).
#pragma once
#include <cstdint>
#include "plan/arch.h"
#include "plan/layout.h"
#include "plan/spec.h"

namespace trex::plan {

struct GemmShape {
  double groups = 1;        // GEMMs of the same N, K in one launch (local experts)
  double m = 0, n = 0, k = 0;
  double in_bytes = 2;      // bytes per A / B element (bf16 2, fp8 1 + scales, fp4 0.5 + scales)
  double out_bytes = 2;     // bytes per output element written
  double accumulate = 0;    // bytes per output element read and written again (0: plain write)
};

struct GemmDevice {
  double rate = 0;    // FLOP/s the kernel reaches at large shapes
  double mem_bw = 0;  // bytes/s at the memory efficiency
  int64_t sm_count = 0, tile_m = 128, tile_n = 256, tile_sms = 1;  // sm_count 0: no tile grid
};

struct GemmTime {
  double compute = 0, memory = 0, seconds = 0;
  double tile_eff = 1;  // useful share of the tile grid's waves
};

// The tile grid's useful share for `g`: 1 when the device has no sm_count.
double tile_efficiency(const GemmShape& g, const GemmDevice& d);
GemmTime gemm_time(const GemmShape& g, const GemmDevice& d);

// The device of a spec at a GEMM rate (FLOP/s at large shapes).
GemmDevice gemm_device(const ClusterSpec& s, double rate);

// The routed experts' GEMMs of one MoE layer on one device for `tokens` tokens: per local expert
// (experts / ep of them) M = the rows it receives, tokens x top-k x expert_load x ep x etp /
// experts (the busiest rank's); the up projection (gate and up: N = 2I / etp, K = d) and the down
// projection (N = d, K = I / etp), I = the expert's intermediate size. Forward, data gradient and
// weight gradient (accumulated into the main gradient in place, grad_bytes read and written).
// `in_bytes`: bytes per GEMM-input element under the recipe (2 for bf16). `pad_rows`: rows each
// expert computes beyond those it receives (the recipe's alignment, plan/precision.h): they add to
// every pass's FLOPs (M of the forward and data gradient, the reduction of the weight gradient), not
// to the tile grid, which is taken at the rows received (the padded count's tiles differ by at most
// the one partial tile the unpadded count already has).
struct ExpertGemms {
  double fwd = 0, dgrad = 0, wgrad = 0;  // seconds
  double rows = 0;                       // M: rows per local expert (received, before padding)
  double tile_eff = 1;                   // the forward's tile-grid efficiency (FLOP-weighted)
  bool memory_bound = false;             // some pass is bounded by HBM rather than the tensor cores
};
ExpertGemms expert_gemms(const LayerCost& L, const Layout& l, int64_t hidden, double tokens, const GemmDevice& d,
                         double in_bytes, double pad_rows = 0);

}  // namespace trex::plan
