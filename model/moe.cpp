#include "model/moe.h"

#include <cstring>
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

// One grouped GEMM over the experts with rows: make(e, r0, M) builds expert e's group for its
// sorted rows [r0, r0 + M). Element size of the operands: 2 (bf16 copies) or 4 (f32).
template <class Make>
void over_experts(const Ctx& c, const Dispatch& D, int64_t E, bool ta, bool tb, float beta, Make make) {
  std::vector<kern::GemmGroup> g;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = D.offsets[e], M = D.offsets[e + 1] - r0;
    if (M) g.push_back(make(e, r0, M));
  }
  kern::grouped_gemm(c.prec, ta, tb, 1.f, beta, g.data(), (int)g.size());
}

size_t elem(const Ctx& c) { return c.prec == kern::Prec::BF16 ? 2 : 4; }

// Y[rows, out] = X[rows, in] @ W_e^T  (W slab [E, out, in])
void expert_gemm_fwd(const Ctx& c, const Dispatch& D, int64_t E, const void* X, const void* Wslab, int64_t out,
                     int64_t in, float* Y) {
  const size_t es = elem(c);
  over_experts(c, D, E, false, true, 0.f, [&](int64_t e, int64_t r0, int64_t M) {
    return kern::GemmGroup{(const char*)X + r0 * in * es, (const char*)Wslab + e * out * in * es, Y + r0 * out, M,
                           out, in, in, in, out};
  });
}
// dX[rows, in] = dY[rows, out] @ W_e
void expert_gemm_dx(const Ctx& c, const Dispatch& D, int64_t E, const void* dY, const void* Wslab, int64_t out,
                    int64_t in, float* dX) {
  const size_t es = elem(c);
  over_experts(c, D, E, false, false, 0.f, [&](int64_t e, int64_t r0, int64_t M) {
    return kern::GemmGroup{(const char*)dY + r0 * out * es, (const char*)Wslab + e * out * in * es, dX + r0 * in, M,
                           in, out, out, in, in};
  });
}
// dW_e[out, in] += dY_e^T @ X_e
void expert_gemm_dw(const Ctx& c, const Dispatch& D, int64_t E, const void* dY, const void* X, int64_t out,
                    int64_t in, float* dWslab) {
  const size_t es = elem(c);
  over_experts(c, D, E, true, false, 1.f, [&](int64_t e, int64_t r0, int64_t M) {
    return kern::GemmGroup{(const char*)dY + r0 * out * es, (const char*)X + r0 * in * es, dWslab + e * out * in, out,
                           in, M, out, in, in};
  });
}

}  // namespace

double moe_forward(const Ctx& c, const MoeIn& in, const float* x, float* out, MoeSaved& s, int64_t* load) {
  const ModelConfig& m = *in.cfg;
  const LayerParams& p = *in.p;
  const int64_t N = in.B * in.T, d = m.hidden_size, E = m.n_routed_experts, K = m.num_experts_per_tok;
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
  double aux = in.aux_alpha > 0 ? seq_aux_loss(m, s.route, in.B, in.T, in.aux_alpha, 1.f, nullptr) : 0.0;

  // Dispatch: counting sort of (token, slot) pairs by expert, stable in token order.
  Dispatch& D = s.disp;
  D.offsets.assign(E + 1, 0);
  for (int64_t i = 0; i < R; ++i) D.offsets[s.route.idx[i] + 1]++;
  for (int64_t e = 0; e < E; ++e) {
    if (load) load[e] += D.offsets[e + 1];
    D.offsets[e + 1] += D.offsets[e];
  }
  D.row_token = A.alloc<int32_t>(R);
  D.slot_row = A.alloc<int32_t>(R);
  {
    std::vector<int64_t> fill(D.offsets.begin(), D.offsets.end() - 1);
    for (int64_t i = 0; i < R; ++i) {
      int64_t row = fill[s.route.idx[i]]++;
      D.row_token[row] = (int32_t)(i / K);
      D.slot_row[i] = (int32_t)row;
    }
  }

  // Expert compute on sorted rows.
  s.gu = A.alloc<float>(R * 2 * F);
  s.h = A.alloc<float>(R * F);
  s.y = A.alloc<float>(R * d);
  {
    ProfScope ps(c.prof, "fwd.moe.experts");
    auto mk = A.mark();
    float* xs = A.alloc<float>(R * d);
    parallel_for(R, 256, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) std::memcpy(xs + r * d, x + (int64_t)D.row_token[r] * d, d * sizeof(float));
    });
    const bool bf = c.prec == kern::Prec::BF16;
    const void* xin = gemm_input(c, xs, R * d);
    expert_gemm_fwd(c, D, E, xin, bf ? (const void*)(in.Pb + p.exp_gu) : (const void*)(in.P + p.exp_gu), 2 * F, d, s.gu);
    kern::swiglu_fwd(s.gu, R, F, in.swiglu_limit, s.h);
    const void* hin = gemm_input(c, s.h, R * F);
    expert_gemm_fwd(c, D, E, hin, bf ? (const void*)(in.Pb + p.exp_down) : (const void*)(in.P + p.exp_down), d, F, s.y);
    A.release(mk);
  }

  // Shared experts write `out`, then combine adds the routed outputs in slot order per token.
  if (m.n_shared_experts > 0) {
    mlp_forward(c, shared_w(in), x, N, out, 0.f, s.shared);
  } else {
    std::memset(out, 0, N * d * sizeof(float));
  }
  parallel_for(N, 16, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      float* o = out + n * d;
      for (int64_t k = 0; k < K; ++k) {
        const float w = s.route.probs[n * K + k];
        const float* y = s.y + (int64_t)D.slot_row[n * K + k] * d;
        for (int64_t j = 0; j < d; ++j) o[j] += w * y[j];
      }
    }
  });
  return aux;
}

void moe_backward(const Ctx& c, const MoeIn& in, const MoeSaved& s, const float* dout, float* dx) {
  const ModelConfig& m = *in.cfg;
  const LayerParams& p = *in.p;
  const int64_t N = in.B * in.T, d = m.hidden_size, E = m.n_routed_experts, K = m.num_experts_per_tok;
  const int64_t F = m.moe_intermediate_size, R = N * K;
  const Dispatch& D = s.disp;
  StackArena& A = *c.ws;
  auto mk = A.mark();
  const bool bf = c.prec == kern::Prec::BF16;

  // Combine adjoint: dy[row] = p * dout[token]; dprobs = dout[token] . y[row].
  float* dy = A.alloc<float>(R * d);
  float* dprobs = A.alloc<float>(R);
  parallel_for(N, 16, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      const float* g = dout + n * d;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t row = D.slot_row[n * K + k];
        const float w = s.route.probs[n * K + k];
        const float* y = s.y + row * d;
        float* dyr = dy + row * d;
        double dot = 0;
        for (int64_t j = 0; j < d; ++j) {
          dyr[j] = w * g[j];
          dot += (double)g[j] * y[j];
        }
        dprobs[n * K + k] = (float)dot;
      }
    }
  });

  // Experts: down, SwiGLU, gate|up.
  auto t_exp = now_ms();
  float* dh = A.alloc<float>(R * F);
  const void* dyin = gemm_input(c, dy, R * d);
  expert_gemm_dx(c, D, E, dyin, bf ? (const void*)(in.Pb + p.exp_down) : (const void*)(in.P + p.exp_down), d, F, dh);
  const void* hin = gemm_input(c, s.h, R * F);
  expert_gemm_dw(c, D, E, dyin, hin, d, F, in.G + p.exp_down);
  float* dgu = A.alloc<float>(R * 2 * F);
  kern::swiglu_bwd(dh, s.gu, R, F, in.swiglu_limit, dgu);
  float* dxs = A.alloc<float>(R * d);
  const void* dguin = gemm_input(c, dgu, R * 2 * F);
  expert_gemm_dx(c, D, E, dguin, bf ? (const void*)(in.Pb + p.exp_gu) : (const void*)(in.P + p.exp_gu), 2 * F, d, dxs);
  {
    float* xs = A.alloc<float>(R * d);
    parallel_for(R, 256, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) std::memcpy(xs + r * d, s.x + (int64_t)D.row_token[r] * d, d * sizeof(float));
    });
    const void* xin = gemm_input(c, xs, R * d);
    expert_gemm_dw(c, D, E, dguin, xin, 2 * F, d, in.G + p.exp_gu);
  }

  if (c.prof) c.prof->add("bwd.moe.experts", now_ms() - t_exp);
  // Dispatch adjoint (gather back to tokens, fixed slot order) + shared experts.
  if (m.n_shared_experts > 0) {
    mlp_backward(c, shared_w(in), s.shared, N, dout, dx, false);
  } else {
    std::memset(dx, 0, N * d * sizeof(float));
  }
  parallel_for(N, 16, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      float* o = dx + n * d;
      for (int64_t k = 0; k < K; ++k) {
        const float* g = dxs + (int64_t)D.slot_row[n * K + k] * d;
        for (int64_t j = 0; j < d; ++j) o[j] += g[j];
      }
    }
  });

  // Router: probs (and the aux loss) -> scores -> logits -> x and the gate weight (f32).
  float* dsc = A.alloc_zero<float>(N * E);
  router_probs_backward(m, s.route, dprobs, N, dsc);
  if (in.aux_alpha > 0) seq_aux_loss(m, s.route, in.B, in.T, in.aux_alpha, in.aux_grad_scale, dsc);
  router_scores_backward(m, s.route.scores, dsc, N, dsc);
  kern::gemm_f32(false, false, N, d, E, 1.f, dsc, E, in.P + p.router, d, 1.f, dx, d);
  kern::gemm_f32(true, false, E, d, N, 1.f, dsc, E, s.x, d, 1.f, in.G + p.router, d);
  A.release(mk);
}

}  // namespace trex::model
