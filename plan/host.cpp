#include "plan/host.h"

#include <algorithm>

namespace trex::plan {

const char* host_phase_name(HostPhase p) {
  switch (p) {
    case HostPhase::Attention: return "attention";
    case HostPhase::Router: return "router";
    case HostPhase::Dispatch: return "dispatch/combine";
    case HostPhase::Experts: return "routed experts";
    case HostPhase::Ffn: return "ffn (norm, shared / dense MLP, adds)";
    case HostPhase::Collectives: return "tp collectives";
  }
  return "?";
}

Launches LayerLaunches::total_fwd() const {
  Launches t;
  for (const Launches& k : fwd) t.ops += k.ops, t.inner += k.inner;
  return t;
}
Launches LayerLaunches::total_bwd() const {
  Launches t;
  for (const Launches& k : bwd) t.ops += k.ops, t.inner += k.inner;
  return t;
}

RecipeLaunches precision_launches(Precision p) {
  switch (p) {
    case Precision::BF16: return {0, 0, 0, 0};
    // 1x128 activations: quantize the input; backward: the output gradient and the transposed
    // re-quantization of the cached input (for the weight gradient).
    case Precision::FP8: return {1, 0, 2, 0};
    // current scaling: an amax pass, then the cast (row- and column-wise in one kernel), each way.
    case Precision::FP8Tensor: return {2, 0, 2, 0};
    // MX: one quantize kernel writes both copies; the scales are swizzled for the tensor core, one
    // fused swizzle per GEMM (Transformer Engine PR 2019), dgrad and wgrad each in the backward.
    case Precision::MXFP8:
    case Precision::MXFP4: return {1, 1, 1, 2};
  }
  return {};
}

namespace {

struct Counter {
  LayerLaunches k;
  RecipeLaunches q;
  void linear(HostPhase p, double n = 1, bool fwd_only = false) {
    Launches& f = k.fwd[(int)p];
    f.ops += n, f.inner += n * (q.q_f + q.s_f);
    if (fwd_only) return;
    Launches& b = k.bwd[(int)p];
    b.ops += n, b.inner += n * (1 + q.q_b + q.s_b);
  }
  void grouped(HostPhase p, double E) {
    Launches& f = k.fwd[(int)p];
    f.ops += 1, f.inner += (E - 1) + E * q.q_f + q.s_f;
    Launches& b = k.bwd[(int)p];
    b.ops += 1, b.inner += (2 * E - 1) + E * q.q_b + q.s_b;
  }
  void elementwise(HostPhase p, double n = 1, bool fwd_only = false) {
    k.fwd[(int)p].ops += n;
    if (!fwd_only) k.bwd[(int)p].ops += n;
  }
  void norm(HostPhase p, double n = 1) {
    k.fwd[(int)p].ops += n;
    k.bwd[(int)p].ops += n, k.bwd[(int)p].inner += n;
  }
  void attention_core() {
    k.fwd[(int)HostPhase::Attention].ops += 1;
    k.bwd[(int)HostPhase::Attention].ops += 1, k.bwd[(int)HostPhase::Attention].inner += 1;
  }
  void raw(HostPhase p, Launches f, Launches b) {
    k.fwd[(int)p].ops += f.ops, k.fwd[(int)p].inner += f.inner;
    k.bwd[(int)p].ops += b.ops, k.bwd[(int)p].inner += b.inner;
  }
};

}  // namespace

LayerLaunches layer_launches(const LayerCost& L, const Layout& l, int64_t local_experts) {
  Counter c;
  // The router, the hyper-connection mixing and the attention core stay bf16 under every recipe.
  const RecipeLaunches low = precision_launches(l.precision);
  c.q = low;
  const LayerModules& m = L.modules;
  using P = HostPhase;
  const P A = P::Attention;
  if (!m.v4) {
    c.norm(A);
    if (m.q_lora) c.linear(A), c.norm(A), c.linear(A);
    else c.linear(A);
    c.linear(A), c.norm(A), c.linear(A);  // kv down, kv norm, kv up
    c.elementwise(A, 3);                  // q split, k concat, kv split
    c.elementwise(A, 2);                  // RoPE on q and k
    if (m.indexer) c.linear(A, 3, true), c.elementwise(A, 5, true);  // V3.2 indexer, forward only
    c.attention_core();
    c.linear(A);                          // o
    c.elementwise(A);                     // residual add
  } else {
    c.q = {};
    c.linear(A), c.norm(A), c.elementwise(A, 2);  // hyper-connection pre: stream norm, mixing, Sinkhorn, combine
    c.q = low;
    c.norm(A), c.linear(A), c.norm(A), c.linear(A);  // q_a, q norm, q_b
    c.linear(A), c.norm(A);                           // kv, kv norm
    c.elementwise(A, 2);                              // RoPE q, k
    if (m.compressor) c.linear(A, 2), c.elementwise(A, 3);  // compressor kv / gate, pooling, norm, RoPE
    if (m.indexer) c.linear(A, 4, true), c.elementwise(A, 4, true);  // CSA indexer, forward only
    c.attention_core();
    c.elementwise(A);                                 // inverse RoPE on the output
    c.linear(A, 2);                                   // o_a (grouped, one batched GEMM), o_b
    c.elementwise(A);                                 // hyper-connection post
  }
  const P F = P::Ffn;
  if (m.v4) {
    c.q = {};
    c.linear(F), c.norm(F), c.elementwise(F, 2);  // hyper-connection pre of the FFN sublayer
    c.q = low;
  }
  c.norm(F);
  if (!L.moe) {
    c.linear(F), c.elementwise(F), c.linear(F);  // fc1, act, fc2
  } else {
    if (L.hash_routed) c.raw(P::Router, {3, 0}, {2, 0});  // id lookup, score GEMM, gather
    else if (l.ep_dedup) c.raw(P::Router, {17, 0}, {4, 1});
    else c.raw(P::Router, {31, 0}, {4, 1});
    if (l.ep_dedup) c.raw(P::Dispatch, {4, 1}, {4, 1});
    else c.raw(P::Dispatch, {6, 0}, {6, 0});
    const double E = (double)std::max<int64_t>(1, local_experts);
    c.grouped(P::Experts, E), c.elementwise(P::Experts), c.grouped(P::Experts, E);
    if (m.shared_expert) c.linear(F), c.elementwise(F), c.linear(F), c.elementwise(F);  // + the add to the routed output
    c.k.sync = l.graphs != Graphs::Full;
    c.k.after_sync = {3, 1 + E * c.q.q_f + c.q.s_f};  // dispatch, permute, fc1 | layout kernel, fc1 quantize + swizzle
  }
  c.elementwise(F);  // residual add / hyper-connection post
  if (l.tp > 1) c.raw(P::Collectives, {(double)L.tp_collectives, 0}, {(double)L.tp_collectives, 0});
  return c.k;
}

double host_seconds(const Launches& k, const HostCost& h) { return k.ops * h.op_s + k.inner * h.launch_s; }

bool captured(HostPhase p, bool moe, Graphs g) {
  if (g == Graphs::Full) return true;
  if (g == Graphs::Off) return false;
  return p == HostPhase::Attention || (moe && (p == HostPhase::Router || p == HostPhase::Ffn));
}

double layer_host_seconds(const LayerLaunches& k, bool backward, const Layout& l, const HostCost& h) {
  const bool moe = k.sync || k.fwd[(int)HostPhase::Router].ops > 0;
  double s = 0;
  bool attn_graph = false, moe_graph = false;
  for (int i = 0; i < kHostPhases; ++i) {
    const HostPhase p = (HostPhase)i;
    if (l.graphs == Graphs::Full) continue;  // one graph per micro-batch and model chunk (chunk_time)
    if (captured(p, moe, l.graphs)) {
      (p == HostPhase::Attention ? attn_graph : moe_graph) = true;
      continue;
    }
    s += host_seconds(backward ? k.bwd[i] : k.fwd[i], h);
  }
  // Partial graphs: one replay each of the attention graph and of the router / shared-expert graph.
  s += ((attn_graph ? 1 : 0) + (moe_graph ? 1 : 0)) * h.op_s;
  return s;
}

}  // namespace trex::plan
