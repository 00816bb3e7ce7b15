// The host that launches the kernels. A step cannot finish faster than its CPU can issue the
// kernels of the step: per layer and micro-batch this module counts the kernels that the forward
// and the backward launch, by phase, as a PyTorch + Transformer Engine stack (Megatron-Core)
// launches them, and prices them with the spec's per-launch host cost ([host] in the spec).
//
// Two kinds of launch (ClusterSpec::host):
//   op     a framework-level op called from Python (module call, torch op, autograd node):
//          dispatcher, autograd bookkeeping and the CUDA launch; `op_us` each
//   inner  a further kernel launched from C++ inside such an op (the per-expert GEMMs of a
//          multi-stream grouped GEMM, the quantize / swizzle kernels of a low-precision linear,
//          the second GEMM of a linear's backward); `launch_us` each (the driver's launch)
// Under CUDA graphs a captured region costs one op per replay (the graph launch from Python),
// whatever its kernel count.
//
// Per module (fwd ops + inner / bwd ops + inner); q_f, s_f, q_b, s_b: the recipe's quantize
// kernels per GEMM input and swizzle kernels per GEMM call (precision_launches below):
//   linear            1 + q_f + s_f          / 1 + 1 + q_b + s_b   (dgrad and wgrad GEMMs)
//   grouped linear    1 + (E-1) + E q_f + s_f / 1 + (2E-1) + E q_b + s_b  (E local experts,
//                     one cuBLAS GEMM each: multi-stream grouped GEMM)
//   elementwise       1 / 1                  (norm: bwd + 1 inner for the weight-gradient reduction)
//   attention core    1 / 1 + 1              (fused attention; backward's dO.O preprocessing)
//   router            17 / 4 + 1  with dedup=1 (fused router + DeepEP / HybridEP preprocess, the
//                     Megatron-Core GB200 guide's count); 31 / 4 + 1 without (fused router only)
//   dispatch+combine  4 + 1 / 4 + 1 (dedup=1: dispatch + its layout kernel, permute, unpermute,
//                     combine); 6 / 6 (dedup=0: permute, all-to-all, chunk sort, each way)
//   tp collectives    tp_collectives each way (sequence-parallel all-gather / reduce-scatter)
// Layers: V3 (MLA): norm, [q_down linear, q norm, q_up linear | q linear], kv_down linear, kv norm,
// kv_up linear, 3 splits / concats, 2 RoPE, attention core, o linear, residual add; V3.2's
// indexer (forward only) 3 linears + 5 elementwise. V4: per sublayer a hyper-connection pre
// (norm, mixing linear, Sinkhorn fused, combine) and post (1); attention norm, q_a, q norm, q_b,
// kv linear, kv norm, 2 RoPE, [compressor: 2 linears, pooling, norm, RoPE], [CSA indexer,
// forward only: 2 linears, its compressor 2 linears + pooling + RoPE, scores, top-k], sparse
// attention core, inverse RoPE, o_a and o_b linears. FFN: norm; dense MLP (fc1, act, fc2) or
// MoE (router, dispatch / combine, grouped fc1, act, grouped fc2, shared fc1, act, fc2, add);
// residual add. Allocations, views and the optimizer's few multi-tensor kernels are not counted
// (host work too: the counts are a lower bound).
//
// Syncs: dropless MoE copies the tokens per expert to the host before the expert GEMMs (their
// split sizes) once per MoE layer forward; the host then waits for the device, so the host's lead
// cannot carry past it, and the device idles while the host launches what follows the sync up to
// the first expert GEMM (LayerLaunches::after_sync). Full CUDA graphs need a sync-free MoE
// (graphs=full implies it).
#pragma once
#include <cstdint>
#include <string>
#include "plan/arch.h"
#include "plan/layout.h"
#include "plan/spec.h"

namespace trex::plan {

enum class HostPhase { Attention, Router, Dispatch, Experts, Ffn, Collectives };
constexpr int kHostPhases = 6;
const char* host_phase_name(HostPhase p);

struct Launches {
  double ops = 0, inner = 0;
  double total() const { return ops + inner; }
};

// Kernels one micro-batch launches in one layer, per phase and direction.
struct LayerLaunches {
  Launches fwd[kHostPhases], bwd[kHostPhases];
  Launches total_fwd() const;
  Launches total_bwd() const;
  bool sync = false;  // a host sync in its forward (dropless MoE token counts)
  // What the host launches after the sync before the device has a long kernel again (dispatch,
  // its layout kernel, permute, the first grouped GEMM's op and quantize kernels): the device
  // idles for it.
  Launches after_sync;
};

// Quantize kernels per GEMM input and swizzle kernels per GEMM call, forward and backward.
struct RecipeLaunches {
  double q_f = 0, s_f = 0, q_b = 0, s_b = 0;
};
RecipeLaunches precision_launches(Precision p);

// `local_experts`: routed experts on one ep rank (n_experts / ep).
LayerLaunches layer_launches(const LayerCost& L, const Layout& l, int64_t local_experts);

// Host seconds of a set of launches launched eagerly: ops x op_us + inner x launch_us.
double host_seconds(const Launches& k, const HostCost& h);
// Host seconds of one layer's direction under the layout's graph mode (captured phases cost one
// op per graph).
double layer_host_seconds(const LayerLaunches& k, bool backward, const Layout& l, const HostCost& h);
// Whether phase `p` of a layer is inside a CUDA graph: partial = Megatron-Core's
// `attn moe_router moe_preprocess` scope (attention; router, preprocess and shared experts of
// MoE layers); full = everything.
bool captured(HostPhase p, bool moe, Graphs g);

}  // namespace trex::plan
