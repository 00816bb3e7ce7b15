#include "model/moe.h"

#include <cstring>
#include "core/parallel.h"
#include "core/timer.h"
#include "kernels/gemm.h"
#include "kernels/swiglu.h"
#include "model/moe_ep.h"

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
  kern::grouped_gemm(c.prec, ta, tb, 1.f, beta, g.data(), (int)g.size());
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
  const int64_t j = e0 - (in.ep ? in.ep->slab_first : 0);  // index into the experts this slab holds
  const int64_t gu = in.p->exp_gu + j * 2 * F * d, dn = in.p->exp_down + j * d * F;
  const bool bf = c.prec == kern::Prec::BF16;
  return {bf ? (const void*)(in.Pb + gu) : (const void*)(in.P + gu),
          bf ? (const void*)(in.Pb + dn) : (const void*)(in.P + dn), in.G ? in.G + gu : nullptr,
          in.G ? in.G + dn : nullptr};
}

// Routed experts on rows grouped by expert (off: [n + 1], experts e0 ..): xs [rows, d] ->
// gu [rows, 2F], h [rows, F], y [rows, d].
void experts_fwd(const Ctx& c, const MoeIn& in, const std::vector<int64_t>& off, int64_t e0, const float* xs,
                 float* gu, float* h, float* y) {
  const int64_t d = in.cfg->hidden_size, F = in.cfg->moe_intermediate_size, R = off.back();
  const ExpertW w = expert_w(c, in, e0);
  StackArena& A = *c.ws;
  auto mk = A.mark();
  expert_gemm_fwd(c, off, gemm_input(c, xs, R * d), w.gu, 2 * F, d, gu);
  kern::swiglu_fwd(gu, R, F, in.swiglu_limit, h);
  expert_gemm_fwd(c, off, gemm_input(c, h, R * F), w.down, d, F, y);
  A.release(mk);
}

// Backward of experts_fwd: dy [rows, d] -> dxs [rows, d] (overwrite); the experts' weight
// gradients accumulate. xs, gu, h: the forward's.
void experts_bwd(const Ctx& c, const MoeIn& in, const std::vector<int64_t>& off, int64_t e0, const float* xs,
                 const float* gu, const float* h, const float* dy, float* dxs) {
  const int64_t d = in.cfg->hidden_size, F = in.cfg->moe_intermediate_size, R = off.back();
  const ExpertW w = expert_w(c, in, e0);
  StackArena& A = *c.ws;
  auto mk = A.mark();
  float* dh = A.alloc<float>(R * F);
  const void* dyin = gemm_input(c, dy, R * d);
  expert_gemm_dx(c, off, dyin, w.down, d, F, dh);
  expert_gemm_dw(c, off, dyin, gemm_input(c, h, R * F), d, F, w.ddown);
  float* dgu = A.alloc<float>(R * 2 * F);
  kern::swiglu_bwd(dh, gu, R, F, in.swiglu_limit, dgu);
  const void* dguin = gemm_input(c, dgu, R * 2 * F);
  expert_gemm_dx(c, off, dguin, w.gu, 2 * F, d, dxs);
  expert_gemm_dw(c, off, dguin, gemm_input(c, xs, R * d), 2 * F, d, w.dgu);
  A.release(mk);
}

}  // namespace

void moe_sort(const int32_t* idx, int64_t N, int64_t K, int64_t E, std::vector<int64_t>& offsets,
              int32_t* row_token, int32_t* slot_row, int64_t* load) {
  const int64_t R = N * K;
  offsets.assign(E + 1, 0);
  for (int64_t i = 0; i < R; ++i) offsets[idx[i] + 1]++;
  for (int64_t e = 0; e < E; ++e) {
    if (load) load[e] += offsets[e + 1];
    offsets[e + 1] += offsets[e];
  }
  std::vector<int64_t> fill(offsets.begin(), offsets.end() - 1);
  for (int64_t i = 0; i < R; ++i) {
    const int64_t row = fill[idx[i]]++;
    row_token[row] = (int32_t)(i / K);
    slot_row[i] = (int32_t)row;
  }
}

void moe_gather(const float* x, const int32_t* row_token, int64_t R, int64_t d, float* xs) {
  parallel_for(R, 256, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) std::memcpy(xs + r * d, x + (int64_t)row_token[r] * d, d * sizeof(float));
  });
}

void moe_combine(const float* y, const float* probs, const int32_t* slot_row, int64_t N, int64_t K, int64_t d,
                 float* out) {
  parallel_for(N, 16, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      float* o = out + n * d;
      for (int64_t k = 0; k < K; ++k) {
        const float w = probs[n * K + k];
        const float* yr = y + (int64_t)slot_row[n * K + k] * d;
        for (int64_t j = 0; j < d; ++j) o[j] += w * yr[j];
      }
    }
  });
}

void moe_combine_bwd(const float* dout, const float* y, const float* probs, const int32_t* slot_row, int64_t N,
                     int64_t K, int64_t d, float* dy, float* dprobs) {
  parallel_for(N, 16, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      const float* g = dout + n * d;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t row = slot_row[n * K + k];
        const float w = probs[n * K + k];
        const float* yr = y + row * d;
        float* dyr = dy + row * d;
        double dot = 0;
        for (int64_t j = 0; j < d; ++j) {
          dyr[j] = w * g[j];
          dot += (double)g[j] * yr[j];
        }
        dprobs[n * K + k] = (float)dot;
      }
    }
  });
}

void moe_dispatch_bwd(const float* dxs, const int32_t* slot_row, int64_t N, int64_t K, int64_t d, float* dx) {
  parallel_for(N, 16, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      float* o = dx + n * d;
      for (int64_t k = 0; k < K; ++k) {
        const float* g = dxs + (int64_t)slot_row[n * K + k] * d;
        for (int64_t j = 0; j < d; ++j) o[j] += g[j];
      }
    }
  });
}

double moe_forward(const Ctx& c, const MoeIn& in, const float* x, float* out, MoeSaved& s, int64_t* load) {
  const ModelConfig& m = *in.cfg;
  const LayerParams& p = *in.p;
  const int64_t N = in.tokens(), d = m.hidden_size, E = m.n_routed_experts, K = m.num_experts_per_tok;
  const int64_t F = m.moe_intermediate_size, R = N * K;
  StackArena& A = *c.ws;
  s.x = x;

  // Route (f32 gate).
  s.route.scores = A.alloc<float>(N * E);
  s.route.idx = A.alloc<int32_t>(R);
  s.route.probs = A.alloc<float>(R);
  {
    ProfScope ps(c.prof, "fwd.moe.route");
    kern::gemm_f32(false, true, N, E, d, 1.f, x, d, in.P + p.router, d, 0.f, s.route.scores, E);
    router_select(m, s.route.scores, in.hash_idx ? nullptr : in.bias, N, s.route, in.hash_idx);
  }
  double aux = in.aux_alpha > 0 ? seq_aux_loss(m, s.route, in.B, in.T, in.aux_alpha, 1.f, nullptr, in.n0, N, in.seq_sum) : 0.0;

  // Dispatch: counting sort of (token, slot) pairs by expert, stable in token order.
  Dispatch& D = s.disp;
  D.row_token = A.alloc<int32_t>(R);
  D.slot_row = A.alloc<int32_t>(R);
  moe_sort(s.route.idx, N, K, E, D.offsets, D.row_token, D.slot_row, load);

  // Expert compute on sorted rows; the shared experts write `out`.
  auto shared_fwd = [&] {
    if (m.n_shared_experts > 0) mlp_forward(c, shared_w(in), x, N, out, 0.f, s.shared);
    else std::memset(out, 0, N * d * sizeof(float));
  };
  s.y = A.alloc<float>(R * d);
  if (!in.ep) {
    s.gu = A.alloc<float>(R * 2 * F);
    s.h = A.alloc<float>(R * F);
    ProfScope ps(c.prof, "fwd.moe.experts");
    auto mk = A.mark();
    float* xs = A.alloc<float>(R * d);
    moe_gather(x, D.row_token, R, d, xs);
    experts_fwd(c, in, D.offsets, 0, xs, s.gu, s.h, s.y);
    A.release(mk);
    shared_fwd();
  } else {
    // Expert parallel: the counts first, then the rows out while the shared experts run.
    EpRoute& r = s.ep;
    {
      ProfScope ps(c.prof, "fwd.moe.dispatch");
      const double t0 = now_ms();
      ep_plan(*in.ep, D.offsets, A, r);
      in.ep->wait_ms += now_ms() - t0;
    }
    const int64_t Rl = std::max<int64_t>(r.Rl, 1);
    r.xl = A.alloc<float>(Rl * d);
    s.gu = A.alloc<float>(Rl * 2 * F);
    s.h = A.alloc<float>(Rl * F);
    const int64_t Fs = m.shared_intermediate();  // the shared experts' saved activations stay below
    if (m.n_shared_experts > 0) s.shared.gu = A.alloc<float>(N * 2 * Fs), s.shared.h = A.alloc<float>(N * Fs);
    auto mk = A.mark();
    float* xs = A.alloc<float>(R * d);
    float* xr = A.alloc<float>(Rl * d);  // received order (in and out)
    float* yl = A.alloc<float>(Rl * d);
    moe_gather(x, D.row_token, R, d, xs);
    parallel::Handle h = ep_dispatch_rows(*in.ep, r, xs, xr, d);
    if (m.n_shared_experts > 0) mlp_forward_saved(c, shared_w(in), x, N, out, 0.f, s.shared);
    else std::memset(out, 0, N * d * sizeof(float));
    {
      ProfScope ps(c.prof, "fwd.moe.dispatch");
      const double t0 = now_ms();
      h.wait();
      in.ep->wait_ms += now_ms() - t0;
    }
    ep_to_local(r, xr, r.xl, d);
    {
      ProfScope ps(c.prof, "fwd.moe.experts");
      experts_fwd(c, in, r.offsets, in.ep->first, r.xl, s.gu, s.h, yl);
    }
    {
      ProfScope ps(c.prof, "fwd.moe.combine");
      ep_from_local(r, yl, xr, d);
      const double t0 = now_ms();
      ep_combine_rows(*in.ep, r, xr, s.y, d);
      in.ep->wait_ms += now_ms() - t0;
    }
    A.release(mk);
  }

  // Combine: add the routed outputs in slot order per token.
  moe_combine(s.y, s.route.probs, D.slot_row, N, K, d, out);
  return aux;
}

void moe_backward(const Ctx& c, const MoeIn& in, const MoeSaved& s, const float* dout, float* dx) {
  const ModelConfig& m = *in.cfg;
  const LayerParams& p = *in.p;
  const int64_t N = in.tokens(), d = m.hidden_size, E = m.n_routed_experts, K = m.num_experts_per_tok;
  const int64_t R = N * K;
  const Dispatch& D = s.disp;
  StackArena& A = *c.ws;
  auto mk = A.mark();

  // Combine adjoint: dy[row] = p * dout[token]; dprobs = dout[token] . y[row].
  float* dy = A.alloc<float>(R * d);
  float* dprobs = A.alloc<float>(R);
  moe_combine_bwd(dout, s.y, s.route.probs, D.slot_row, N, K, d, dy, dprobs);

  // Experts: down, SwiGLU, gate|up -> dxs [R, d] in sorted order. The shared experts write dx.
  auto shared_bwd = [&] {
    if (m.n_shared_experts > 0) mlp_backward(c, shared_w(in), s.shared, N, dout, dx, false);
    else std::memset(dx, 0, N * d * sizeof(float));
  };
  float* dxs = A.alloc<float>(R * d);
  if (!in.ep) {
    auto t_exp = now_ms();
    auto mk2 = A.mark();
    float* xs = A.alloc<float>(R * d);
    moe_gather(s.x, D.row_token, R, d, xs);
    experts_bwd(c, in, D.offsets, 0, xs, s.gu, s.h, dy, dxs);
    A.release(mk2);
    if (c.prof) c.prof->add("bwd.moe.experts", now_ms() - t_exp);
    shared_bwd();
  } else {
    // Expert parallel: dy out along the dispatch route (the shared experts run meanwhile), the
    // local experts' backward, dx back along the combine route.
    const EpRoute& r = s.ep;
    const int64_t Rl = std::max<int64_t>(r.Rl, 1);
    auto mk2 = A.mark();
    float* dyr = A.alloc<float>(Rl * d);  // received order (in and out)
    float* dyl = A.alloc<float>(Rl * d);
    parallel::Handle h = ep_dispatch_rows(*in.ep, r, dy, dyr, d);
    shared_bwd();
    {
      ProfScope ps(c.prof, "bwd.moe.dispatch");
      const double t0 = now_ms();
      h.wait();
      in.ep->wait_ms += now_ms() - t0;
    }
    ep_to_local(r, dyr, dyl, d);
    float* dxl = A.alloc<float>(Rl * d);
    {
      ProfScope ps(c.prof, "bwd.moe.experts");
      experts_bwd(c, in, r.offsets, in.ep->first, r.xl, s.gu, s.h, dyl, dxl);
    }
    {
      ProfScope ps(c.prof, "bwd.moe.combine");
      ep_from_local(r, dxl, dyr, d);
      const double t0 = now_ms();
      ep_combine_rows(*in.ep, r, dyr, dxs, d);
      in.ep->wait_ms += now_ms() - t0;
    }
    A.release(mk2);
  }
  // Dispatch adjoint: gather back to tokens, fixed slot order.
  moe_dispatch_bwd(dxs, D.slot_row, N, K, d, dx);

  // Router: probs (and the aux loss) -> scores -> logits -> x and the gate weight (f32).
  float* dsc = A.alloc_zero<float>(N * E);
  router_probs_backward(m, s.route, dprobs, N, dsc);
  if (in.aux_alpha > 0) seq_aux_loss(m, s.route, in.B, in.T, in.aux_alpha, in.aux_grad_scale, dsc, in.n0, N, in.seq_sum);
  router_scores_backward(m, s.route.scores, dsc, N, dsc);
  kern::gemm_f32(false, false, N, d, E, 1.f, dsc, E, in.P + p.router, d, 1.f, dx, d);
  kern::gemm_f32(true, false, E, d, N, 1.f, dsc, E, s.x, d, 1.f, in.G + p.router, d);
  A.release(mk);
}

}  // namespace trex::model
