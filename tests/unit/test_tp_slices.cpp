// Tensor-parallel slices in one process: MLA heads (model/mla.cpp), DeepSeek-V4 heads and output
// groups (model/v4_attn.cpp), SwiGLU MLP columns (mlp_weights_tp). For each tp size S every rank
// runs forward and backward on the same input and output gradient with a zeroed gradient slab;
// summed over the ranks, `out`, `dx` and every gradient of the layer must equal the whole layer's
// (S = 1), and the gradient of each sliced weight must be exactly 0 outside the rank's slice.
// Shapes are odd on purpose (hidden 40, 6 heads, compress rates 3 and 5 with T = 13).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>
#include "core/error.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "core/stack_arena.h"
#include "kernels/rope.h"
#include "model/mla.h"
#include "model/mlp.h"
#include "model/model.h"
#include "model/v4_attn.h"
#include "tests/tiny_configs.h"

using namespace trex;
using nlohmann::json;
using model::TpSlice;

namespace {

// One rank's (or the whole layer's) results: out [N, d], dx [N, d], the gradient slab.
struct Pass {
  std::vector<float> out, dx, grad;
};

// A weight sliced across the ranks: equal parts of its rows (cols = false) or of its columns.
struct SliceRule {
  std::string suffix;  // end of the parameter name
  bool cols;
};

// max |sum_r a_r - ref| / max |ref| over [off, off + n) (absolute when ref is all zero).
double sum_err(const std::vector<const std::vector<float>*>& parts, const std::vector<float>& ref, int64_t off,
               int64_t n) {
  double err = 0, scale = 0;
  for (int64_t i = off; i < off + n; ++i) {
    double s = 0;
    for (const auto* p : parts) s += (*p)[i];
    err = std::max(err, std::abs(s - (double)ref[i]));
    scale = std::max(scale, std::abs((double)ref[i]));
  }
  return scale > 0 ? err / scale : err;
}

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

struct Worst {
  double out = 0, dx = 0, grad = 0;
};

// The three checks for the entries whose names start with `prefix`, against the full pass.
void compare(const model::ParamLayout& L, const std::string& prefix, const std::vector<SliceRule>& rules,
             const Pass& full, const std::vector<Pass>& ranks, double tol, const std::string& what, Worst& w) {
  const int64_t S = (int64_t)ranks.size();
  std::vector<const std::vector<float>*> outs, dxs, grads;
  for (const Pass& p : ranks) outs.push_back(&p.out), dxs.push_back(&p.dx), grads.push_back(&p.grad);
  const double eo = sum_err(outs, full.out, 0, (int64_t)full.out.size());
  const double ed = sum_err(dxs, full.dx, 0, (int64_t)full.dx.size());
  EXPECT_LE(eo, tol) << what << ": out";
  EXPECT_LE(ed, tol) << what << ": dx";
  w.out = std::max(w.out, eo);
  w.dx = std::max(w.dx, ed);
  int64_t seen = 0, sliced = 0;
  std::vector<char> inside(L.total, 0);
  for (const model::ParamEntry& e : L.entries) {
    if (e.name.rfind(prefix, 0) != 0) continue;
    ++seen;
    const int64_t n = e.shape.numel();
    for (int64_t i = 0; i < n; ++i) inside[e.offset + i] = 1;
    const double eg = sum_err(grads, full.grad, e.offset, n);
    EXPECT_LE(eg, tol) << what << ": gradient of " << e.name;
    w.grad = std::max(w.grad, eg);
    const SliceRule* rule = nullptr;
    for (const SliceRule& r : rules)
      if (ends_with(e.name, r.suffix)) rule = &r;
    if (!rule) continue;
    ++sliced;
    const int64_t R = e.shape[0], C = e.shape.ndim > 1 ? n / R : 1, part = (rule->cols ? C : R) / S;
    ASSERT_EQ((rule->cols ? C : R) % S, 0) << e.name;
    double gmax = 0;
    for (int64_t i = 0; i < n; ++i) gmax = std::max(gmax, (double)std::abs(full.grad[e.offset + i]));
    EXPECT_GT(gmax, 0) << what << ": " << e.name << " has no gradient at all (the check would be void)";
    for (int64_t r = 0; r < S; ++r) {
      int64_t outside_nonzero = 0;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t k = rule->cols ? i % C : i / C;
        if ((k < r * part || k >= (r + 1) * part) && ranks[r].grad[e.offset + i] != 0.f) ++outside_nonzero;
      }
      EXPECT_EQ(outside_nonzero, 0) << what << ": rank " << r << " touched other ranks' part of " << e.name;
    }
  }
  EXPECT_GT(seen, 0) << what << ": no parameter named " << prefix;
  EXPECT_EQ(sliced, (int64_t)rules.size()) << what << ": a sliced tensor is missing";
  // Nothing outside the layer's own tensors gets a gradient.
  for (int64_t r = 0; r < S; ++r) {
    int64_t stray = 0;
    for (int64_t i = 0; i < L.total; ++i) stray += !inside[i] && ranks[r].grad[i] != 0.f;
    EXPECT_EQ(stray, 0) << what << ": rank " << r << " wrote gradients outside " << prefix;
  }
}

std::vector<float> randn(int64_t n, uint64_t seed, double scale = 1.0) {
  Rng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = (float)(scale * r.normal());
  return v;
}

using trex::testing::perturb_vectors;

std::vector<int32_t> two_docs(int64_t B, int64_t T) {
  std::vector<int32_t> seg(B * T);
  for (int64_t i = 0; i < B * T; ++i) seg[i] = (int32_t)((i % T) < T / 2 + (i / T) ? 0 : 1);
  return seg;
}

// ---------------------------------------------------------------- MLA (DeepSeek-V3)

json mla_cfg() {
  return {{"vocab_size", 31}, {"hidden_size", 40}, {"num_hidden_layers", 2}, {"num_attention_heads", 6},
          {"q_lora_rank", 14}, {"kv_lora_rank", 11}, {"qk_nope_head_dim", 6}, {"qk_rope_head_dim", 4},
          {"v_head_dim", 5}, {"intermediate_size", 30}, {"moe_intermediate_size", 9}, {"n_routed_experts", 6},
          {"n_shared_experts", 1}, {"num_experts_per_tok", 2}, {"first_k_dense_replace", 1}, {"n_group", 3},
          {"topk_group", 2}, {"initializer_range", 0.3}, {"max_position_embeddings", 16}};
}

Pass run_mla(model::Model& m, int64_t l, TpSlice tp, int64_t B, int64_t T, const int32_t* seg,
             const std::vector<float>& x, const std::vector<float>& dout, bool backward = true) {
  StackArena A(size_t(1) << 20);
  model::Ctx c{m.prec, &A, nullptr, &m.backend()};
  const int64_t N = B * T, d = m.cfg.hidden_size;
  std::vector<int32_t> pos(N);
  for (int64_t i = 0; i < N; ++i) pos[i] = (int32_t)(i % T);
  model::AttnIn ai{&m.cfg, &m.layout.layers[l], m.P(), m.Pb(), m.G(), &m.rope_table(T), pos.data(), seg, B, T};
  ai.tp = tp;
  m.zero_grads();
  Pass p{std::vector<float>(N * d), std::vector<float>(N * d), {}};
  model::MlaSaved s;
  model::mla_forward(c, ai, x.data(), p.out.data(), s);
  if (backward) model::mla_backward(c, ai, s, dout.data(), p.dx.data());
  p.grad.assign(m.G(), m.G() + m.layout.total);
  return p;
}

Worst check_mla(const json& j, int64_t B, int64_t T, bool packed, const std::vector<int64_t>& sizes) {
  init_threads();
  model::ModelConfig cfg = model::parse_config(j, "tp test config");
  model::Model m(cfg, kern::Prec::F32);
  m.init_random(17);
  perturb_vectors(m, 5);
  const int64_t N = B * T, d = cfg.hidden_size;
  const std::vector<int32_t> seg = two_docs(B, T);
  const std::vector<SliceRule> rules = {
      {cfg.q_lora_rank ? "q_b_proj.weight" : "q_proj.weight", false}, {"kv_b_proj.weight", false}, {"o_proj.weight", true}};
  Worst w;
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::vector<float> x = randn(N * d, 100 + l), dout = randn(N * d, 200 + l);
    const Pass full = run_mla(m, l, {}, B, T, packed ? seg.data() : nullptr, x, dout);
    for (int64_t S : sizes) {
      std::vector<Pass> ranks;
      for (int64_t r = 0; r < S; ++r) ranks.push_back(run_mla(m, l, {r, S}, B, T, packed ? seg.data() : nullptr, x, dout));
      const std::string what = "MLA layer " + std::to_string(l) + " S=" + std::to_string(S) + (packed ? " packed" : "");
      compare(m.layout, "model.layers." + std::to_string(l) + ".self_attn.", rules, full, ranks, 1e-5, what, w);
    }
  }
  return w;
}

void report(const char* name, const Worst& w) {
  std::printf("[tp %s] worst relative error: out %.2e  dx %.2e  grad %.2e\n", name, w.out, w.dx, w.grad);
}

TEST(TpSlice, MlaQLora) {
  Worst w = check_mla(mla_cfg(), 2, 7, false, {2, 3, 6});
  report("mla q_lora", w);
}

TEST(TpSlice, MlaQLoraPacked) {
  Worst w = check_mla(mla_cfg(), 2, 9, true, {2, 3});
  report("mla q_lora packed", w);
}

TEST(TpSlice, MlaQProj) {
  json j = mla_cfg();
  j["q_lora_rank"] = nullptr;
  Worst w = check_mla(j, 2, 7, false, {2, 3, 6});
  report("mla q_proj", w);
}

TEST(TpSlice, MlaRejectsIndivisibleHeads) {
  init_threads();
  model::Model m(model::parse_config(mla_cfg(), "tp test config"), kern::Prec::F32);
  m.init_random(1);
  const std::vector<float> x = randn(2 * 5 * 40, 1), dout = randn(2 * 5 * 40, 2);
  EXPECT_THROW(run_mla(m, 0, {1, 4}, 2, 5, nullptr, x, dout), Error);
}

// ---------------------------------------------------------------- DeepSeek-V4 attention

json v4_cfg(int64_t groups) {
  return {{"model_type", "deepseek_v4"}, {"vocab_size", 37}, {"hidden_size", 40}, {"num_hidden_layers", 3},
          {"num_attention_heads", 6}, {"head_dim", 10}, {"partial_rotary_factor", 0.4}, {"q_lora_rank", 9},
          {"o_groups", groups}, {"o_lora_rank", 5}, {"moe_intermediate_size", 7}, {"n_routed_experts", 5},
          {"num_experts_per_tok", 2}, {"n_shared_experts", 1}, {"sliding_window", 5},
          {"compress_rates", {{"compressed_sparse_attention", 3}, {"heavily_compressed_attention", 5}}},
          {"layer_types", {"compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"}},
          {"mlp_layer_types", {"moe", "moe", "moe"}}, {"index_n_heads", 5}, {"index_head_dim", 6},
          {"index_topk", 2}, {"hc_mult", 3}, {"hc_sinkhorn_iters", 5}, {"swiglu_limit", 0.9},
          {"compress_rope_theta", 5000.0}, {"initializer_range", 0.3}, {"max_position_embeddings", 64}};
}

struct V4Tables {
  std::vector<float> cos[2], sin[2];  // main, compress: [T, rd/2]
  V4Tables(const model::ModelConfig& c, int64_t T) {
    const double theta[2] = {c.rope_theta, c.v4.compress_rope_theta};
    for (int k = 0; k < 2; ++k) {
      kern::RopeParams rp{};
      rp.dim = (int)c.qk_rope_head_dim;
      rp.theta = theta[k];
      cos[k].assign(T * (rp.dim / 2), 0.f);
      sin[k].assign(T * (rp.dim / 2), 0.f);
      kern::rope_tables(rp, T, cos[k].data(), sin[k].data());
    }
  }
};

Pass run_v4(model::Model& m, int64_t l, TpSlice tp, int64_t B, int64_t T, const int32_t* seg, const V4Tables& tb,
            const std::vector<float>& x, const std::vector<float>& dout, bool backward = true) {
  StackArena A(size_t(1) << 20);
  model::Ctx c{m.prec, &A, nullptr, &m.backend()};
  const int64_t N = B * T, d = m.cfg.hidden_size;
  const int k = m.cfg.v4.attn[l] == model::AttnKind::Sliding ? 0 : 1;
  model::V4AttnIn ai{&m.cfg, &m.layout.v4[l], l, m.P(), m.Pb(), m.G(), tb.cos[k].data(), tb.sin[k].data(),
                     tb.cos[1].data(), tb.sin[1].data(), seg, B, T};
  ai.tp = tp;
  m.zero_grads();
  Pass p{std::vector<float>(N * d), std::vector<float>(N * d), {}};
  model::V4AttnSaved s;
  model::v4_attn_forward(c, ai, x.data(), p.out.data(), s);
  if (backward) model::v4_attn_backward(c, ai, s, dout.data(), p.dx.data());
  p.grad.assign(m.G(), m.G() + m.layout.total);
  return p;
}

const std::vector<SliceRule> kV4Rules = {
    {"self_attn.q_b_proj.weight", false}, {"self_attn.sinks", false}, {"self_attn.o_a_proj.weight", false},
    {"self_attn.o_b_proj.weight", true}};  // (not the indexer's q_b_proj, which runs in full)

Worst check_v4(int64_t groups, int64_t B, int64_t T, bool packed, const std::vector<int64_t>& sizes) {
  init_threads();
  model::ModelConfig cfg = model::parse_config(v4_cfg(groups), "tp test config");
  model::Model m(cfg, kern::Prec::F32);
  m.init_random(23);
  perturb_vectors(m, 9);
  const int64_t N = B * T, d = cfg.hidden_size;
  const V4Tables tb(cfg, T);
  const std::vector<int32_t> seg = two_docs(B, T);
  Worst w;
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    // Inputs of unit RMS, as the layer sees them after input_layernorm.
    const std::vector<float> x = randn(N * d, 300 + l), dout = randn(N * d, 400 + l);
    const Pass full = run_v4(m, l, {}, B, T, packed ? seg.data() : nullptr, tb, x, dout);
    for (int64_t S : sizes) {
      std::vector<Pass> ranks;
      for (int64_t r = 0; r < S; ++r)
        ranks.push_back(run_v4(m, l, {r, S}, B, T, packed ? seg.data() : nullptr, tb, x, dout));
      const char* kinds[] = {"sliding", "CSA", "HCA"};
      const std::string what = std::string("V4 ") + kinds[(int)cfg.v4.attn[l]] + " layer " + std::to_string(l) +
                               " G=" + std::to_string(groups) + " S=" + std::to_string(S) + (packed ? " packed" : "");
      compare(m.layout, "model.layers." + std::to_string(l) + ".self_attn.", kV4Rules, full, ranks, 1e-5, what, w);
    }
  }
  return w;
}

TEST(TpSlice, V4SixGroups) {
  Worst w = check_v4(6, 2, 13, false, {2, 3, 6});
  report("v4 o_groups 6", w);
}

TEST(TpSlice, V4ThreeGroupsPacked) {
  Worst w = check_v4(3, 2, 13, true, {3});
  report("v4 o_groups 3 packed", w);
}

TEST(TpSlice, V4RejectsIndivisibleGroups) {
  init_threads();
  model::ModelConfig cfg = model::parse_config(v4_cfg(3), "tp test config");
  model::Model m(cfg, kern::Prec::F32);
  m.init_random(1);
  const V4Tables tb(cfg, 7);
  const std::vector<float> x = randn(7 * 40, 1), dout = randn(7 * 40, 2);
  EXPECT_THROW(run_v4(m, 2, {0, 2}, 1, 7, nullptr, tb, x, dout), Error);  // 6 heads, 3 groups
  EXPECT_THROW(run_v4(m, 2, {0, 4}, 1, 7, nullptr, tb, x, dout), Error);  // 6 heads
}

// ---------------------------------------------------------------- SwiGLU MLP (mlp_weights_tp)

TEST(TpSlice, MlpColumns) {
  init_threads();
  const int64_t d = 22, F = 30, N = 11;
  // One slab laid out as a model's: gate|up [2F, d] at 0, down [d, F] after it.
  model::ParamLayout L;
  L.entries.push_back({"mlp.gate_proj.weight", 0, Shape{F, d}, true});
  L.entries.push_back({"mlp.up_proj.weight", F * d, Shape{F, d}, true});
  L.entries.push_back({"mlp.down_proj.weight", 2 * F * d, Shape{d, F}, true});
  L.total = 3 * F * d;
  const std::vector<float> P = randn(L.total, 7, 0.3), x = randn(N * d, 8), dy = randn(N * d, 9);
  const std::vector<SliceRule> rules = {{"gate_proj.weight", false}, {"up_proj.weight", false}, {"down_proj.weight", true}};
  Worst w;
  for (float limit : {0.f, 0.7f}) {
    auto run = [&](TpSlice tp) {
      StackArena A(size_t(1) << 20);
      const auto cpu = kern::make_cpu_backend();
      model::Ctx c{kern::Prec::F32, &A, nullptr, cpu.get()};
      Pass p{std::vector<float>(N * d), std::vector<float>(N * d), std::vector<float>(L.total, 0.f)};
      model::MlpW mw = model::mlp_weights_tp(P.data(), nullptr, p.grad.data(), 0, 2 * F * d, d, F, tp);
      mw.limit = limit;
      model::MlpSaved s;
      model::mlp_forward(c, mw, x.data(), N, p.out.data(), 0.f, s);
      model::mlp_backward(c, mw, s, N, dy.data(), p.dx.data(), false);
      return p;
    };
    const Pass full = run({});
    for (int64_t S : {2, 3, 5}) {
      std::vector<Pass> ranks;
      for (int64_t r = 0; r < S; ++r) ranks.push_back(run({r, S}));
      compare(L, "mlp.", rules, full, ranks, 1e-5, "MLP S=" + std::to_string(S) + " limit " + std::to_string(limit), w);
    }
  }
  report("mlp", w);
}

// ---------------------------------------------------------------- bf16 smoke

TEST(TpSlice, Bf16Smoke) {
  init_threads();
  auto rel = [](const std::vector<Pass>& ranks, const std::vector<float>& ref, bool dx) {
    std::vector<const std::vector<float>*> parts;
    for (const Pass& p : ranks) parts.push_back(dx ? &p.dx : &p.out);
    return sum_err(parts, ref, 0, (int64_t)ref.size());
  };
  {
    model::Model m(model::parse_config(mla_cfg(), "tp test config"), kern::Prec::BF16);
    m.init_random(3);
    const int64_t B = 2, T = 7, N = B * T, d = m.cfg.hidden_size;
    const std::vector<float> x = randn(N * d, 1), dout = randn(N * d, 2);
    const Pass full = run_mla(m, 0, {}, B, T, nullptr, x, dout);
    const std::vector<Pass> ranks = {run_mla(m, 0, {0, 2}, B, T, nullptr, x, dout),
                                     run_mla(m, 0, {1, 2}, B, T, nullptr, x, dout)};
    const double eo = rel(ranks, full.out, false), ed = rel(ranks, full.dx, true);
    EXPECT_LE(eo, 2e-2);
    EXPECT_LE(ed, 2e-2);
    std::printf("[tp bf16 mla S=2] relative error: out %.2e  dx %.2e\n", eo, ed);
  }
  {
    model::Model m(model::parse_config(v4_cfg(6), "tp test config"), kern::Prec::BF16);
    m.init_random(3);
    perturb_vectors(m, 4);
    const int64_t B = 2, T = 13, N = B * T, d = m.cfg.hidden_size;
    const V4Tables tb(m.cfg, T);
    const std::vector<float> x = randn(N * d, 1), dout = randn(N * d, 2);
    const Pass full = run_v4(m, 0, {}, B, T, nullptr, tb, x, dout);
    const std::vector<Pass> ranks = {run_v4(m, 0, {0, 2}, B, T, nullptr, tb, x, dout),
                                     run_v4(m, 0, {1, 2}, B, T, nullptr, tb, x, dout)};
    const double eo = rel(ranks, full.out, false), ed = rel(ranks, full.dx, true);
    EXPECT_LE(eo, 2e-2);
    EXPECT_LE(ed, 2e-2);
    std::printf("[tp bf16 v4 CSA S=2] relative error: out %.2e  dx %.2e\n", eo, ed);
  }
}

}  // namespace
