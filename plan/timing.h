// Step time of a layout: compute per micro-batch on each pipeline rank (FLOPs / (peak x per-class
// efficiency), memory-bound traffic / (bandwidth x efficiency)), communication (TP all-reduce or
// reduce-scatter + all-gather per layer, EP all-to-all dispatch + combine, PP send/recv, DP
// reduce-scatter / all-gather of gradients and parameters), the part of it hidden behind compute
// per overlap flag, the pipeline bubble, and the optimizer step. Formulas in docs/PLAN.md.
#pragma once
#include <vector>
#include "plan/arch.h"
#include "plan/layout.h"
#include "plan/spec.h"

namespace trex::plan {

// Pipeline stages balanced by forward time on this device (LM head and MTP modules on the last
// stage; under DualPipe balanced per rank pair).
std::vector<Chunk> pipeline_chunks(const ArchModel& a, const ClusterSpec& s, const Layout& l);

// 1F1B bubble share of the pipeline time: (pp - 1) / (m + pp - 1).
double bubble_fraction_1f1b(int64_t pp, int64_t m);

// A communication group as placed on the cluster (Megatron order: tp fastest, then ep inside
// dp, then pp): members, nodes spanned, and the effective per-device bandwidth and latency.
struct Group {
  int64_t size = 1, nodes = 1;
  double bw = 0, lat = 0;  // bytes/s (efficiency applied), s
};
Group place_group(const ClusterSpec& s, int64_t size, int64_t stride);
double ring_all_reduce(const Group& g, double bytes);      // 2(n-1)/n S/bw + 2(n-1) lat
double ring_reduce_scatter(const Group& g, double bytes);  // (n-1)/n S/bw + (n-1) lat (S = full buffer)
// One EP all-to-all (dispatch or combine) of `tokens` tokens per device, `elem_bytes` per hidden
// element: time on the slower of the intra- and inter-node links.
struct A2A {
  double intra_bytes = 0, inter_bytes = 0, seconds = 0;
};
A2A ep_all_to_all(const ClusterSpec& s, const Layout& l, const LayerCost& layer, int64_t hidden, double tokens,
                  double elem_bytes);

struct StepTime {
  int64_t micro_batches = 0, slow_rank = 0;
  // Per micro-batch on the slowest pipeline rank (seconds).
  double fwd = 0, bwd = 0, recompute = 0;       // compute (with the communication-share slowdown)
  double gemm = 0, experts = 0, attention = 0, memory_bound = 0;  // forward compute by class
  // The routed experts' GEMMs at their shapes (plan/gemm.h): backward (data + weight gradients),
  // rows per local expert, the tile grid's efficiency, and whether HBM bounds some pass.
  double experts_bwd = 0, expert_rows = 0, expert_tile_eff = 1;
  bool expert_memory_bound = false;
  double quant_fwd = 0, quant_bwd = 0;  // low-precision quantize / transpose kernels (memory_bound has the forward's)
  // Of quant_fwd + quant_bwd: the MX scale swizzle (activations and weights) and the routed experts'
  // padding copies (plan/precision.h), both directions.
  double swizzle = 0, pad_copies = 0;
  double ep_intra_s = 0, ep_inter_s = 0;  // one layer-set's all-to-all bytes on each link alone, per micro-batch
  double comm_tp = 0, comm_ep = 0, comm_pp = 0, comm_dp_mb = 0;  // per micro-batch communication
  double comm_cp = 0;  // context parallel: keys and values (and their gradients) per micro-batch
  double exposed_mb = 0;                        // communication left exposed per micro-batch
  double t_mb = 0;                              // fwd + bwd + recompute + exposed, or the host's bound
  double device_t_mb = 0;                       // the device alone: fwd + bwd + recompute + exposed
  // The host (plan/host.h): seconds it spends launching one micro-batch's kernels, the kernels,
  // and the host syncs of its forward (dropless MoE token counts), on the slowest rank.
  double host_mb = 0, launches_mb = 0, host_syncs_mb = 0;
  std::vector<double> rank_t_mb;                // t_mb of every pipeline rank
  // Per step (seconds).
  double compute = 0, exposed_comm = 0, bubble = 0, optimizer = 0, step = 0;
  double host_wait = 0;  // what the host adds to the device's micro-batches (m x (t_mb - device_t_mb))
  double weight_cast = 0;  // low precision: quantizing the updated weights once per step
  double dp_comm = 0, dp_exposed = 0;           // gradient / parameter collectives (all ZeRO stages)
  double ep_inter_bytes_mb = 0, ep_intra_bytes_mb = 0;  // one all-to-all direction pair, per device
  // Throughput over wall time: steady-state steps x the spec's goodput.
  double goodput = 1;
  double tokens_per_step = 0, tokens_per_s = 0, model_flops_per_token = 0, mfu = 0;
};

StepTime plan_time(const ArchModel& a, const ClusterSpec& s, const Layout& l);

}  // namespace trex::plan
