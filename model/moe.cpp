#include "model/moe.h"

#include <algorithm>
#include <cstring>
#include "core/error.h"
#include "core/parallel.h"
#include "core/timer.h"
#include "kernels/gemm.h"
#include "kernels/swiglu.h"

namespace trex::model {

namespace {

MlpW shared_w(const MoeIn& in) {
  MlpW w = mlp_weights(in.P, in.Pb, in.G, in.p->sh_gu, in.p->sh_down, in.cfg->hidden_size,
                       in.cfg->shared_intermediate());
  w.limit = in.swiglu_limit;
  return w;
}

// One grouped GEMM over experts [0, off.size() - 1) of a weight slab that starts at that range's
// first expert: make(e, r0, M) builds expert e's group for its rows [r0, r0 + M). Element size of
// the operands: 2 (bf16 copies) or 4 (f32).
template <class Make>
void over_experts(const Ctx& c, const std::vector<int64_t>& off, bool ta, bool tb, float beta, Make make) {
  std::vector<kern::GemmGroup> g;
  for (size_t e = 0; e + 1 < off.size(); ++e) {
    const int64_t r0 = off[e], M = off[e + 1] - r0;
    if (M) g.push_back(make((int64_t)e, r0, M));
  }
  if (ta || !tb) return c.k().grouped_gemm(c.prec, ta, tb, 1.f, beta, g.data(), (int)g.size());
  grouped_gemm_fwd(c, c.prec, beta, g.data(), (int)g.size());  // the forward: X @ W_e^T
}

size_t elem(const Ctx& c) { return c.prec == kern::Prec::BF16 ? 2 : 4; }

// Y[rows, out] = X[rows, in] @ W_e^T  (W slab [E, out, in])
void expert_gemm_fwd(const Ctx& c, const std::vector<int64_t>& off, const void* X, const void* Wslab, int64_t out,
                     int64_t in, float* Y) {
  const size_t es = elem(c);
  over_experts(c, off, false, true, 0.f, [&](int64_t e, int64_t r0, int64_t M) {
    return kern::GemmGroup{(const char*)X + r0 * in * es, (const char*)Wslab + e * out * in * es, Y + r0 * out, M,
                           out, in, in, in, out};
  });
}
// dX[rows, in] = dY[rows, out] @ W_e
void expert_gemm_dx(const Ctx& c, const std::vector<int64_t>& off, const void* dY, const void* Wslab, int64_t out,
                    int64_t in, float* dX) {
  const size_t es = elem(c);
  over_experts(c, off, false, false, 0.f, [&](int64_t e, int64_t r0, int64_t M) {
    return kern::GemmGroup{(const char*)dY + r0 * out * es, (const char*)Wslab + e * out * in * es, dX + r0 * in, M,
                           in, out, out, in, in};
  });
}
// dW_e[out, in] += dY_e^T @ X_e
void expert_gemm_dw(const Ctx& c, const std::vector<int64_t>& off, const void* dY, const void* X, int64_t out,
                    int64_t in, float* dWslab) {
  const size_t es = elem(c);
  over_experts(c, off, true, false, 1.f, [&](int64_t e, int64_t r0, int64_t M) {
    return kern::GemmGroup{(const char*)dY + r0 * out * es, (const char*)X + r0 * in * es, dWslab + e * out * in, out,
                           in, M, out, in, in};
  });
}

// The weights of routed experts [e0, ...): gate|up [.., 2F, d] and down [.., d, F], in the
// precision of the GEMMs; and their gradient slabs.
struct ExpertW {
  const void *gu, *down;
  float *dgu, *ddown;
};
ExpertW expert_w(const Ctx& c, const MoeIn& in, int64_t e0) {
  const ModelConfig& m = *in.cfg;
  const int64_t d = m.hidden_size, F = m.moe_intermediate_size;
  const int64_t j = e0 - in.slab_first;  // index into the experts this slab holds
  const int64_t gu = in.p->exp_gu + j * 2 * F * d, dn = in.p->exp_down + j * d * F;
  const bool bf = c.prec == kern::Prec::BF16;
  return {bf ? (const void*)(in.Pb + gu) : (const void*)(in.P + gu),
          bf ? (const void*)(in.Pb + dn) : (const void*)(in.P + dn), in.G ? in.G + gu : nullptr,
          in.G ? in.G + dn : nullptr};
}

// Routed experts on rows grouped by expert (off: [n + 1], experts e0 ..): xs [rows, d] ->
// gu [rows, 2F], h [rows, F], y [rows, d]. h null: a scratch one, released (recompute "moe_act").
// xsb non-null: the rows already in bf16 (a BF16 run's GEMM operand; xs is then not read).
void experts_fwd(const Ctx& c, const MoeIn& in, const std::vector<int64_t>& off, int64_t e0, const float* xs,
                 const bf16* xsb, float* gu, float* h, float* y) {
  const int64_t d = in.cfg->hidden_size, F = in.cfg->moe_intermediate_size, R = off.back();
  const ExpertW w = expert_w(c, in, e0);
  StackArena& A = *c.ws;
  auto mk = A.mark();
  if (!h) h = A.alloc<float>(R * F);
  const void* xin = xsb;
  if (!xin) {
    ProfScope ps(c.prof, "fwd.moe.experts.cast");
    xin = gemm_input(c, xs, R * d);
  }
  {
    ProfScope ps(c.prof, "fwd.moe.experts.gemm");
    expert_gemm_fwd(c, off, xin, w.gu, 2 * F, d, gu);
  }
  {
    ProfScope ps(c.prof, "fwd.moe.experts.act");
    c.k().swiglu_fwd(gu, R, F, in.swiglu_limit, h);
  }
  const void* hin = nullptr;
  {
    ProfScope ps(c.prof, "fwd.moe.experts.cast");
    hin = gemm_input(c, h, R * F);
  }
  {
    ProfScope ps(c.prof, "fwd.moe.experts.gemm");
    expert_gemm_fwd(c, off, hin, w.down, d, F, y);
  }
  A.release(mk);
}

// The rows' inputs of experts_bwd: the kept rows, or (rows null) gathered from the tokens x
// [tokens, d] by row_token [rows] when the backward reaches the gate|up projection, from xb, x's
// bf16 copy, where the caller made one (a BF16 run: the GEMM operand, the bits of rounding the
// gathered rows).
struct ExpertInputs {
  const float* rows = nullptr;
  const float* x = nullptr;
  const int32_t* row_token = nullptr;
  const bf16* xb = nullptr;
};

// Backward of experts_fwd: dy [rows, d] -> dxs [rows, d] (overwrite; it may be dy itself, read in
// full before dxs is written); the experts' weight gradients accumulate. xs, gu, h: the forward's
// (h null: computed again from gu, as the forward did). q non-null (the outputs y were not kept,
// MoeIn::recompute_out): q [rows] = dy . y, the router probabilities' gradient times p
// (kern::moe_probs_bwd), without y: dy . (h W_down^T) = (dy W_down) . h = dh . h, with dh the down
// projection's input gradient that the backward computes anyway (a dot of width F a row instead
// of the down projection run again). The same value up to rounding: the dot runs over F instead of
// d, and a bf16 run's dh comes from dy rounded to bf16.
void experts_bwd(const Ctx& c, const MoeIn& in, const std::vector<int64_t>& off, int64_t e0, const ExpertInputs& xs,
                 const float* gu, const float* h, const float* dy, float* dxs, double* q) {
  const int64_t d = in.cfg->hidden_size, F = in.cfg->moe_intermediate_size, R = off.back();
  const ExpertW w = expert_w(c, in, e0);
  StackArena& A = *c.ws;
  auto mk = A.mark();
  auto cast = [&](const float* x, int64_t n) {
    ProfScope ps(c.prof, "bwd.moe.experts.cast");
    return gemm_input(c, x, n);
  };
  // The down projection's backward, q and the SwiGLU's backward: dgu first (the gate|up GEMMs'
  // operand: in a BF16 run rounded by the SwiGLU's backward itself, no f32 copy), the rest (h when
  // recomputed, dh, the GEMM inputs' copies) scratch released before the gate|up projection's
  // backward.
  const bool bf = c.prec == kern::Prec::BF16;
  float* dgu = bf ? nullptr : A.alloc<float>(R * 2 * F);
  bf16* dgub = bf ? A.alloc<bf16>(R * 2 * F) : nullptr;
  {
    auto mh = A.mark();
    const float* hb = h;
    if (!hb) {  // the forward's h computed again from gu, as the forward did
      ProfScope ps(c.prof, "bwd.moe.experts.act");
      float* hr = A.alloc<float>(R * F);
      c.k().swiglu_fwd(gu, R, F, in.swiglu_limit, hr);
      hb = hr;
    }
    float* dh = A.alloc<float>(R * F);
    const void* dyin = cast(dy, R * d);
    const void* hin = cast(hb, R * F);
    {
      ProfScope ps(c.prof, "bwd.moe.experts.gemm");
      expert_gemm_dx(c, off, dyin, w.down, d, F, dh);
      expert_gemm_dw(c, off, dyin, hin, d, F, w.ddown);
    }
    {
      ProfScope ps(c.prof, "bwd.moe.experts.act");
      if (q) c.k().row_dot(dh, hb, R, F, q);
      if (bf) c.k().swiglu_bwd_bf16(dh, gu, R, F, in.swiglu_limit, dgub);
      else c.k().swiglu_bwd(dh, gu, R, F, in.swiglu_limit, dgu);
    }
    A.release(mh);
  }
  const void* dguin = bf ? static_cast<const void*>(dgub) : cast(dgu, R * 2 * F);
  const void* xin = nullptr;
  if (xs.rows) {
    xin = cast(xs.rows, R * d);
  } else if (xs.xb) {
    bf16* g = A.alloc<bf16>(R * d);
    c.k().gather_rows_bf16(xs.xb, xs.row_token, R, d, g);
    xin = g;
  } else {
    float* g = A.alloc<float>(R * d);
    c.k().gather_rows(xs.x, xs.row_token, R, d, g);
    xin = cast(g, R * d);
  }
  ProfScope ps(c.prof, "bwd.moe.experts.gemm");
  expert_gemm_dx(c, off, dguin, w.gu, 2 * F, d, dxs);
  expert_gemm_dw(c, off, dguin, xin, 2 * F, d, w.dgu);
  A.release(mk);
}

}  // namespace

double moe_forward(const Ctx& c, const MoeIn& in, const float* x, float* out, MoeSaved& s, int64_t* load) {
  const ModelConfig& m = *in.cfg;
  const LayerParams& p = *in.p;
  TREX_CHECK(in.dispatcher, "moe_forward: MoeIn::dispatcher is not set");
  const MoeDispatcher& disp = *in.dispatcher;
  const int64_t N = in.tokens(), d = m.hidden_size, E = m.n_routed_experts, K = m.num_experts_per_tok;
  const int64_t F = m.moe_intermediate_size, Fs = m.shared_intermediate(), R = N * K;
  StackArena& A = *c.ws;
  s.x = x;

  // Route (f32 gate) on the backend: the logits, the scores, each token's experts and the sort of
  // the (token, slot) pairs by expert. The host gets the E + 1 expert offsets (the plan of the
  // expert GEMMs) and the aux loss's value.
  const kern::RouterShape rs = router_shape(m, N);
  {
    ProfScope ps(c.prof, "fwd.moe.route");
    float* logits = A.alloc<float>(N * E);
    {
      ProfScope ps2(c.prof, "fwd.moe.route.logits");
      gemm_fwd(c, kern::Prec::F32, kern::Prec::F32, N, E, d, x, d, in.P + p.router, d, 0.f, logits, E);
    }
    s.route.scores = logits;  // in place
    s.route.idx = A.alloc<int32_t>(R);
    s.route.probs = A.alloc<float>(R);
    ProfScope ps3(c.prof, "fwd.moe.route.select");
    const int32_t* fixed = in.hash_idx ? c.device(in.hash_idx, R) : nullptr;
    c.k().router_select(rs, logits, fixed ? nullptr : in.bias, fixed, s.route.scores, s.route.idx, s.route.probs);
  }
  s.probs_dev = s.route.probs;
  // Dispatch: counting sort of the (token, slot) pairs by expert (stable in token order), the plan
  // of the rows computed here, then the sorted rows out while the shared experts run.
  Dispatch& D = s.disp;
  {
    ProfScope ps(c.prof, "fwd.moe.route.sort");
    int32_t* row_token = A.alloc<int32_t>(R);
    int32_t* slot_row = A.alloc<int32_t>(R);
    int64_t* off = A.alloc<int64_t>(E + 1);
    c.k().moe_sort(s.route.idx, N, K, E, off, row_token, slot_row);
    D.row_token_dev = row_token, D.slot_row_dev = slot_row;
    const int64_t* off_h = c.host(off, E + 1);
    D.offsets.assign(off_h, off_h + E + 1);
    if (load)
      for (int64_t e = 0; e < E; ++e) load[e] += D.offsets[e + 1] - D.offsets[e];
  }
  double aux = 0;
  if (in.aux_alpha > 0) {
    ProfScope ps(c.prof, "fwd.moe.route.aux");
    // Sequence parallel sums the counts over the shards on the host (a CPU-only layout).
    TREX_CHECK(!in.seq_sum || c.host_memory(), "moe_forward: sequence parallel needs host-addressable memory");
    aux = in.seq_sum ? seq_aux_loss(m, s.route, in.B, in.T, in.aux_alpha, 1.f, nullptr, in.n0, N, in.seq_sum, in.T_seq)
                     : c.k().router_aux(rs, s.route.scores, s.route.idx, in.B, in.T, in.n0, in.aux_alpha, 1.f, nullptr);
  }
  MoeRoute& r = s.local;
  {
    ProfScope ps(c.prof, "fwd.moe.dispatch");
    disp.plan(D.offsets, d, A, r);
  }
  const int64_t Rl = std::max<int64_t>(r.rows, 1);
  s.gu = A.alloc<float>(Rl * 2 * F);
  s.h = in.recompute_act ? nullptr : A.alloc<float>(Rl * F);
  // The shared experts write `out`: while the rows are in flight, else after the routed experts
  // (in the space their scratch leaves). Their gu and h, and the routed rows' outputs y [R, d]
  // (sorted order), are kept, or scratch under recompute_shared / recompute_out.
  const bool overlap = disp.in_flight(), shared = m.n_shared_experts > 0;
  auto shared_saved = [&] { s.shared.gu = A.alloc<float>(N * 2 * Fs), s.shared.h = A.alloc<float>(N * Fs); };
  if (shared && !in.recompute_shared) shared_saved();
  if (!in.recompute_out) s.y = A.alloc<float>(R * d);
  auto mk = A.mark();
  float* y = in.recompute_out ? A.alloc<float>(R * d) : s.y;
  if (shared && in.recompute_shared) shared_saved();
  // A BF16 run with every routed expert here (nothing moves): x rounded to bf16 once, the operand
  // of the shared experts' gate|up projection and the source of the routed rows, gathered in bf16
  // (no f32 copy of the rows, no second rounding).
  const Act xa = !overlap ? act_with_bf16(c, x, N * d) : Act(x);
  auto shared_fwd = [&] {
    ProfScope ps(c.prof, "fwd.moe.shared");
    if (shared) mlp_forward_saved(c, shared_w(in), xa, N, out, 0.f, s.shared);
    else c.k().zero(out, N * d * sizeof(float));
  };
  auto mk2 = A.mark();
  MoeExchange xin;
  bf16* xsb = nullptr;
  {
    ProfScope ps(c.prof, "fwd.moe.dispatch");
    if (xa.b) {
      xsb = A.alloc<bf16>(R * d);
      c.k().gather_rows_bf16(xa.b, D.row_token_dev, R, d, xsb);
    } else {
      float* xs = A.alloc<float>(R * d);
      c.k().gather_rows(x, D.row_token_dev, R, d, xs);
      xin = disp.dispatch(r, xs, r.inputs, d, A);
    }
  }
  if (overlap) shared_fwd();
  if (!xsb) {
    ProfScope ps(c.prof, "fwd.moe.dispatch");
    disp.wait(r, xin, d);
  }
  float* yl = disp.output_rows(r, y, d, A);
  {
    ProfScope ps(c.prof, "fwd.moe.experts");
    experts_fwd(c, in, r.offsets, r.first, xin.local, xsb, s.gu, s.h, yl);
  }
  {
    ProfScope ps(c.prof, "fwd.moe.combine");
    disp.combine(r, xin, yl, y, d);
  }
  A.release(mk2);
  if (!overlap) shared_fwd();
  {
    ProfScope ps(c.prof, "fwd.moe.combine");
    c.k().moe_combine(y, s.probs_dev, D.slot_row_dev, N, K, d, out);  // the routed outputs in slot order per token
  }
  A.release(mk);
  if (in.recompute_shared) s.shared.gu = s.shared.h = nullptr;  // rebuilt by moe_backward
  if (in.recompute_out) s.y = nullptr;
  return aux;
}

void moe_backward(const Ctx& c, const MoeIn& in, const MoeSaved& s, const float* dout, float* dx) {
  const ModelConfig& m = *in.cfg;
  const LayerParams& p = *in.p;
  const MoeDispatcher& disp = *in.dispatcher;
  const int64_t N = in.tokens(), d = m.hidden_size, E = m.n_routed_experts, K = m.num_experts_per_tok;
  const int64_t R = N * K;
  const Dispatch& D = s.disp;
  const MoeRoute& r = s.local;
  StackArena& A = *c.ws;
  auto mk = A.mark();

  // Combine adjoint: dy[row] = p * dout[token]; the probabilities' gradient dout[token] . y[row]
  // = q[row] / p with q = dy . y: here from the kept y, else (recompute_out) from the experts'
  // backward as dh . h, back along the combine route with the rows' input gradients.
  const bool overlap = disp.in_flight();
  float* dy = A.alloc<float>(R * d);
  float* dprobs = A.alloc<float>(R);
  double* q = A.alloc<double>(R);  // sorted order
  // On one rank the rows' input gradients overwrite dy (experts_bwd reads it in full first).
  float* dxs = overlap ? A.alloc<float>(R * d) : dy;
  // A BF16 run on one rank: x rounded to bf16 once, for the shared and the routed experts' weight
  // gradients (the routed rows gathered from it), as in the forward.
  const Act xa = !overlap ? act_with_bf16(c, s.x, N * d) : Act(s.x);
  auto shared_bwd = [&] {  // writes dx: while dy is in flight, else after the routed experts
    ProfScope ps(c.prof, "bwd.moe.shared");
    if (m.n_shared_experts == 0) {
      c.k().zero(dx, N * d * sizeof(float));
      return;
    }
    const MlpW w = shared_w(in);
    auto ms = A.mark();
    MlpSaved sv = s.shared;
    sv.xb = xa.b;
    if (!sv.gu) {  // recompute_shared: the forward's gu and h again
      sv.gu = A.alloc<float>(N * 2 * w.F), sv.h = A.alloc<float>(N * w.F);
      mlp_hidden(c, w, Act(s.shared.x, xa.b), N, sv);
    }
    mlp_backward(c, w, sv, N, dout, dx, false);
    A.release(ms);
  };
  auto mk2 = A.mark();
  MoeExchange dyx;
  {
    ProfScope ps(c.prof, "bwd.moe.combine");
    c.k().moe_combine_bwd(dout, s.probs_dev, D.slot_row_dev, N, K, d, dy);
    if (s.y) c.k().row_dot(dy, s.y, R, d, q);
    dyx = disp.dispatch(r, dy, nullptr, d, A);  // dy out along the dispatch route
  }
  if (overlap) shared_bwd();
  {
    ProfScope ps(c.prof, "bwd.moe.dispatch");
    disp.wait(r, dyx, d);
  }
  // Experts: down, SwiGLU, gate|up -> dx rows in local order, then back along the combine route.
  float* dxl = disp.output_rows(r, dxs, d, A);
  // q travels as two floats a row (the dispatcher moves f32 rows).
  double* ql = s.y ? nullptr : (double*)disp.output_rows(r, (float*)q, 2, A);
  {
    ProfScope ps(c.prof, "bwd.moe.experts");
    // The rows' inputs: kept by the dispatcher, else gathered again inside experts_bwd.
    const ExpertInputs xl{disp.saved_inputs(r, D, s.x, d, A), s.x, D.row_token_dev, xa.b};
    experts_bwd(c, in, r.offsets, r.first, xl, s.gu, s.h, dyx.local, dxl, ql);
  }
  {
    ProfScope ps(c.prof, "bwd.moe.dispatch");
    disp.combine(r, dyx, dxl, dxs, d);
    if (ql) disp.combine(r, dyx, (const float*)ql, (float*)q, 2);  // dyx's receive buffer [Rl, d] holds [Rl, 2]
  }
  A.release(mk2);
  if (!overlap) shared_bwd();
  {
    ProfScope ps(c.prof, "bwd.moe.dispatch");
    c.k().moe_dispatch_bwd(dxs, D.slot_row_dev, N, K, d, dx);  // the dispatch's adjoint: back to tokens, fixed slot order
  }

  // Router: probs (and the aux loss) -> scores -> logits -> x and the gate weight (f32).
  ProfScope ps(c.prof, "bwd.moe.route");
  const kern::RouterShape rs = router_shape(m, N);
  c.k().moe_probs_bwd(q, s.probs_dev, D.slot_row_dev, N, K, dprobs);
  float* dlogits = A.alloc<float>(N * E);
  c.k().zero(dlogits, N * E * sizeof(float));
  c.k().router_probs_bwd(rs, s.route.scores, s.route.idx, dprobs, dlogits);
  if (in.aux_alpha > 0) {
    if (in.seq_sum)
      seq_aux_loss(m, s.route, in.B, in.T, in.aux_alpha, in.aux_grad_scale, dlogits, in.n0, N, in.seq_sum, in.T_seq);
    else
      c.k().router_aux(rs, s.route.scores, s.route.idx, in.B, in.T, in.n0, in.aux_alpha, in.aux_grad_scale, dlogits);
  }
  c.k().router_scores_bwd(rs, s.route.scores, dlogits, dlogits);
  c.k().gemm(kern::Prec::F32, kern::Prec::F32, false, false, N, d, E, 1.f, dlogits, E, in.P + p.router, d, 1.f, dx, d);
  c.k().gemm(kern::Prec::F32, kern::Prec::F32, true, false, E, d, N, 1.f, dlogits, E, s.x, d, 1.f, in.G + p.router, d);
  A.release(mk);
}

}  // namespace trex::model
