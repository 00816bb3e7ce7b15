// DeepSeek-V4 in bf16 against fp32 on one set of weights, independent of training dynamics:
// the same tiny config (CSA, HCA and sliding layers, hash routing, one MTP block; odd sizes), the
// same init and the same batch through Model(cfg, F32) and Model(cfg, BF16). The loss and every
// parameter tensor's gradient of the bf16 model are compared with the fp32 ones (relative L2
// per tensor), grouped by layer (layers.N, mtp.K, embed, head) and by kind.
//
// The yardstick: the fp32 model run on the weights rounded to bf16 ("weights-rounded"), i.e.
// the gradient change that rounding the weights alone causes. bf16 keeps 8 significant bits, a
// rounding has relative error <= u = 2^-9 ~ 2e-3 (~1.1e-3 rms). Measured on one draw with init
// 0.1 (as the smooth config below), rounding the weights to 8 / 12 / 16 bits moves the gradients
// by ~1.3e-2 / 7e-4 / 4e-5 relative L2: linear in the rounding (x16 per 4 bits), with a gradient
// condition of ~10 (a u of weight noise gives ~10 u of gradient change; the gradients of a
// random-init model on random targets are sums of per-token terms that mostly cancel). The bf16
// model also rounds the activations: both operands of every GEMM (projections, compressors,
// experts, shared experts, MTP projections, LM head; forward, dx and dW), so its error is
// expected at 1-3x the weights-rounded one: 1e-2 to 3e-2.
//
// Two configs:
//   - smooth: no discrete choice inside the step (every expert selected, K = E = 5; the indexer's
//     top-k at least the number of compressed entries; the SwiGLU clamp at its default 10, never
//     reached at init 0.1), so the gradient is a smooth function of the rounding. One draw's
//     per-tensor error still scatters (over 20 single draws the worst matrix ranged 1.6e-2 to
//     4.5e-2), so the errors are pooled over kDraws = 4 draws (own init, perturbation and batch
//     each): relative L2 over the 4 gradients together. Bounds:
//       loss: relative error <= 1e-3 in every draw (measured <= 1.4e-4 over 20 draws);
//       every matrix (ndim >= 2): relative L2 <= 3e-2 and <= 3 x weights-rounded + 1e-2
//         (measured: worst 2.1e-2 here; 10 disjoint sets of 4 draws all pass);
//       1-d tensors (norm weights, sinks, hc bases and scales), per layer together: relative L2
//         <= 3e-2. Alone, a 1-d gradient can be nearly all cancellation (|g| ~ 1e-5 for some hc
//         scales, against ~1e-1 for matrices) and its relative error is then meaningless (up to
//         0.5 in a single draw, in either run).
//   - discrete: tiny_v4 as the other tests use it (init 0.3, SwiGLU clamp 0.9, top-3 of 5 experts,
//     indexer top-3): routing, indexer selection and clamp boundaries flip under any rounding, and
//     the gradients then move by 10-30% in bf16 and in the weights-rounded fp32 run alike. That
//     test prints its table and bounds only the loss and the median tensor against the yardstick.
// A broken bf16 path trips the smooth bounds: the negative test scales one tensor's bf16 shadow
// by 1.05 (five tensors of different kinds in turn). Detection power (measured over the same 4
// draws, each of the 47 tensors read through the shadow in turn): a 1.05 scale trips 47 of 47,
// 1.03 41, 1.02 13, 1.01 only 3 (a 1% error is the size of what bf16 rounding itself does to the
// gradients).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>
#include "core/dtype.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "model/model.h"
#include "tests/tiny_configs.h"

using namespace trex;
using nlohmann::json;

namespace {

constexpr double kMtpWeight = 0.5;
constexpr int kDraws = 4;  // smooth config: independent inits and batches, pooled
// Smooth config bounds (see the top of the file).
constexpr double kLossBound = 1e-3;
constexpr double kMatrixBound = 3e-2;
constexpr double kRoundedFactor = 3.0, kRoundedFloor = 1e-2;
constexpr double kVectorGroupBound = 3e-2;
// Discrete config bounds.
constexpr double kLossBoundDiscrete = 2e-3;
constexpr double kMedianFactor = 2.0;

// tiny_v4 (hidden 22, 3 heads of 10, q_lora 9, o_lora 5 in 3 groups, 5 experts of 7, CSA rate 3 /
// HCA rate 7 / sliding window 5, hash routing in layer 0, hc_mult 3, one MTP block) with 3 experts
// per token and an indexer top-3 (no size a power of two).
json discrete_config() {
  json j = trex::testing::tiny_v4();
  j["num_experts_per_tok"] = 3;
  j["index_topk"] = 3;
  return j;
}

// The same shapes without discrete choices: all 5 experts per token (hash and top-k layers route
// to every expert), an indexer top-11 >= the compressed entries of 29 tokens at rate 3, the SwiGLU
// clamp at the V4 default 10 and init 0.1 (the clamp is never reached).
json smooth_config() {
  json j = trex::testing::tiny_v4();
  j["num_experts_per_tok"] = 5;
  j["index_topk"] = 11;
  j["swiglu_limit"] = 10.0;
  j["initializer_range"] = 0.1;
  return j;
}

// "layers.N", "mtp.K", "embed", "head" (final norm, hc_head, lm_head).
std::string layer_of(const std::string& n) {
  if (n.rfind("model.layers.", 0) == 0) return "layers." + n.substr(13, n.find('.', 13) - 13);
  if (n.rfind("mtp.", 0) == 0) return "mtp." + n.substr(4, n.find('.', 4) - 4);
  if (n == "model.embed_tokens.weight") return "embed";
  return "head";
}

bool has(const std::string& n, const char* s) { return n.find(s) != std::string::npos; }

std::string kind_of(const std::string& n) {
  if (has(n, ".compressor.indexer.")) return "indexer";
  if (has(n, ".compressor.")) return "compressor";
  if (has(n, "_hc.") || has(n, "hc_head.")) return "hc";
  if (has(n, "layernorm") || has(n, "norm.weight")) return "norms";
  if (has(n, ".self_attn.")) return "attention";
  if (has(n, ".shared_experts.")) return "shared";
  if (has(n, ".mlp.experts.")) return "experts";
  if (has(n, ".mlp.gate.")) return "router";
  if (has(n, "e_proj") || has(n, "h_proj")) return "mtp_proj";
  if (has(n, "embed_tokens")) return "embed";
  if (has(n, "lm_head")) return "lm_head";
  return "other";
}

struct Data {
  int64_t B, T;
  std::vector<int32_t> ids, tg;
  model::Batch batch() const { return {B, T, ids.data(), tg.data(), nullptr, nullptr}; }
};

Data make_data(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  Rng r(seed);
  Data d{B, T, {}, {}};
  for (int64_t i = 0; i < B * T; ++i) {
    d.ids.push_back((int32_t)(r.next_u64() % V));
    d.tg.push_back(i % 7 == 4 ? -100 : (int32_t)(r.next_u64() % V));
  }
  return d;
}

struct StepResult {
  model::LossParts lp;
  std::vector<float> g;
  model::ExpertLoad load;
};

StepResult run_step(model::Model& m, const model::Batch& b) {
  m.zero_grads();
  m.reset_load();
  StepResult r;
  r.lp = m.forward_backward(b, 1.f);
  r.g.assign(m.G(), m.G() + m.layout.total);
  r.load = m.expert_load();
  return r;
}

struct TensorErr {
  std::string name, layer, kind;
  bool matrix = false;
  double dd = 0, rr = 0;  // ||g - g_ref||^2, ||g_ref||^2 (summed over the draws pooled in)
  double rel = 0;         // ||g - g_ref|| / ||g_ref||
  double ref_norm = 0;    // ||g_ref||
  void finish() {
    rel = rr > 0 ? std::sqrt(dd / rr) : std::sqrt(dd);
    ref_norm = std::sqrt(rr);
  }
};

// Pools the errors of another draw into `acc` (relative L2 over the draws' gradients together).
void pool(std::vector<TensorErr>& acc, const std::vector<TensorErr>& e) {
  if (acc.empty()) {
    acc = e;
    return;
  }
  ASSERT_EQ(acc.size(), e.size());
  for (size_t i = 0; i < e.size(); ++i) {
    acc[i].dd += e[i].dd;
    acc[i].rr += e[i].rr;
    acc[i].finish();
  }
}

// Per trainable tensor; the frozen indexer must have no gradient in either run.
std::vector<TensorErr> compare(const model::Model& m, const std::vector<float>& ref, const std::vector<float>& g) {
  std::vector<TensorErr> out;
  for (const model::ParamEntry& e : m.layout.entries) {
    double dd = 0, rr = 0;
    for (int64_t i = e.offset; i < e.offset + e.shape.numel(); ++i) {
      const double d = (double)g[i] - ref[i];
      dd += d * d;
      rr += (double)ref[i] * ref[i];
    }
    if (e.frozen) {
      EXPECT_EQ(dd + rr, 0.0) << e.name;
      continue;
    }
    TensorErr t{e.name, layer_of(e.name), kind_of(e.name), e.shape.ndim >= 2, dd, rr};
    t.finish();
    out.push_back(t);
  }
  return out;
}

// The smooth config's bounds: the tensors (or 1-d groups) breaking one, as "what: why" lines.
std::vector<std::string> violations(const std::vector<TensorErr>& bf, const std::vector<TensorErr>& rounded) {
  std::vector<std::string> v;
  char b[320];
  std::map<std::string, std::pair<double, double>> vec;  // layer -> (sum |dg|^2, sum |g|^2) of its 1-d tensors
  for (size_t i = 0; i < bf.size(); ++i) {
    if (!bf[i].matrix) {
      vec[bf[i].layer].first += bf[i].dd;
      vec[bf[i].layer].second += bf[i].rr;
      continue;
    }
    const double lim = std::min(kMatrixBound, kRoundedFactor * rounded[i].rel + kRoundedFloor);
    if (!(bf[i].rel <= lim)) {
      std::snprintf(b, sizeof b, "%s: bf16 relative L2 %.3g > bound %.3g (weights-rounded fp32: %.3g)",
                    bf[i].name.c_str(), bf[i].rel, lim, rounded[i].rel);
      v.push_back(b);
    }
  }
  for (const auto& [layer, s] : vec) {
    const double rel = s.second > 0 ? std::sqrt(s.first / s.second) : std::sqrt(s.first);
    if (!(rel <= kVectorGroupBound)) {
      std::snprintf(b, sizeof b, "%s 1-d tensors together: bf16 relative L2 %.3g > bound %.3g", layer.c_str(), rel,
                    kVectorGroupBound);
      v.push_back(b);
    }
  }
  return v;
}

void print_report(const char* tag, const std::vector<TensorErr>& bf, const std::vector<TensorErr>& rounded) {
  std::vector<size_t> order(bf.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return bf[a].rel > bf[b].rel; });
  std::printf("[%s] worst tensors (relative L2 of the gradient: bf16 vs fp32 | weights-rounded fp32 vs fp32):\n", tag);
  for (size_t k = 0; k < std::min<size_t>(6, order.size()); ++k) {
    const size_t i = order[k];
    std::printf("[%s]   %-56s %-10s %.2e | %.2e  (|g| %.1e)\n", tag, bf[i].name.c_str(), bf[i].kind.c_str(), bf[i].rel,
                rounded[i].rel, bf[i].ref_norm);
  }
  std::printf("[%s] worst matrices:\n", tag);
  for (size_t k = 0, shown = 0; k < order.size() && shown < 5; ++k) {
    const size_t i = order[k];
    if (!bf[i].matrix) continue;
    ++shown;
    std::printf("[%s]   %-56s %-10s %.2e | %.2e  (|g| %.1e)\n", tag, bf[i].name.c_str(), bf[i].kind.c_str(), bf[i].rel,
                rounded[i].rel, bf[i].ref_norm);
  }
  // Per layer x kind: the worst tensor of each group.
  std::map<std::string, std::map<std::string, std::pair<double, double>>> grid;
  std::map<std::string, bool> kinds;
  for (size_t i = 0; i < bf.size(); ++i) {
    auto& c = grid[bf[i].layer][bf[i].kind];
    c.first = std::max(c.first, bf[i].rel);
    c.second = std::max(c.second, rounded[i].rel);
    kinds[bf[i].kind] = true;
  }
  std::printf("[%s] max relative L2 per layer and kind: bf16 (weights-rounded fp32)\n", tag);
  std::printf("[%s]   %-8s", tag, "layer");
  for (const auto& [k, _] : kinds) std::printf(" %-17s", k.c_str());
  std::printf("\n");
  for (const auto& [layer, row] : grid) {
    std::printf("[%s]   %-8s", tag, layer.c_str());
    for (const auto& [k, _] : kinds) {
      auto it = row.find(k);
      char b[40] = "-";
      if (it != row.end()) std::snprintf(b, sizeof b, "%.1e (%.1e)", it->second.first, it->second.second);
      std::printf(" %-17s", b);
    }
    std::printf("\n");
  }
}

// Three models on one set of weights: fp32, bf16, and fp32 on the weights rounded to bf16.
// Draw d: its own init, perturbation and batch.
struct Fixture {
  model::ModelConfig cfg;
  model::Model m32, mbf, mrnd;
  Data data;
  Fixture(const json& j, uint64_t d)
      : cfg(model::parse_config(j, "bf16 test config")),
        m32(cfg, kern::Prec::F32, {0.0, kMtpWeight}),
        mbf(cfg, kern::Prec::BF16, {0.0, kMtpWeight}),
        mrnd(cfg, kern::Prec::F32, {0.0, kMtpWeight}),
        data(make_data(2, 29, cfg.vocab_size, 17 + 101 * d)) {
    m32.init_random(7 + 101 * d);
    trex::testing::perturb_vectors(m32, 3 + 101 * d);  // non-constant norms, sinks, hc bases / scales
    for (model::Model* m : {&mbf, &mrnd}) {
      std::copy(m32.P(), m32.P() + m32.layout.total, m->P());
      m->buffers = m32.buffers;  // tid2eid, router biases
    }
    for (int64_t i = 0; i < mrnd.layout.total; ++i) mrnd.P()[i] = round_bf16(mrnd.P()[i]);
    mbf.refresh_bf16();
    mrnd.refresh_bf16();
  }
};

double rel_loss(const StepResult& a, const StepResult& ref) { return std::abs(a.lp.loss - ref.lp.loss) / ref.lp.loss; }

void print_loss(const char* tag, const StepResult& r32, const StepResult& rbf, const StepResult& rrnd) {
  std::printf("[%s] loss fp32 %.6f, bf16 %.6f (rel %.1e), weights-rounded fp32 %.6f (rel %.1e); ce %.6f / %.6f, "
              "mtp %.6f / %.6f\n",
              tag, r32.lp.loss, rbf.lp.loss, rel_loss(rbf, r32), rrnd.lp.loss, rel_loss(rrnd, r32), r32.lp.ce,
              rbf.lp.ce, r32.lp.mtp, rbf.lp.mtp);
}

double median_rel(const std::vector<TensorErr>& e) {
  std::vector<double> v;
  for (const TensorErr& t : e) v.push_back(t.rel);
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

TEST(V4Bf16Layers, SmoothConfigWithinRounding) {
  init_threads();
  std::vector<TensorErr> ebf, ernd;
  for (int d = 0; d < kDraws; ++d) {
    Fixture f(smooth_config(), d);
    const model::Batch b = f.data.batch();
    const StepResult r32 = run_step(f.m32, b), rbf = run_step(f.mbf, b), rrnd = run_step(f.mrnd, b);
    ASSERT_TRUE(std::isfinite(r32.lp.loss) && std::isfinite(rbf.lp.loss));
    ASSERT_GT(r32.lp.mtp, 0.0);
    if (d == 0) print_loss("v4 bf16 smooth", r32, rbf, rrnd);
    EXPECT_LE(rel_loss(rbf, r32), kLossBound) << "draw " << d;
    pool(ebf, compare(f.m32, r32.g, rbf.g));
    pool(ernd, compare(f.m32, r32.g, rrnd.g));
  }
  ASSERT_GT(ebf.size(), 60u);
  print_report("v4 bf16 smooth", ebf, ernd);
  std::printf("[v4 bf16 smooth] median tensor relative L2: bf16 %.2e, weights-rounded %.2e (%d draws pooled)\n",
              median_rel(ebf), median_rel(ernd), kDraws);
  for (const std::string& v : violations(ebf, ernd)) ADD_FAILURE() << v;
}

TEST(V4Bf16Layers, DiscreteConfigReport) {
  init_threads();
  Fixture f(discrete_config(), 0);
  const model::Batch b = f.data.batch();
  const StepResult r32 = run_step(f.m32, b), rbf = run_step(f.mbf, b), rrnd = run_step(f.mrnd, b);
  ASSERT_TRUE(std::isfinite(r32.lp.loss) && std::isfinite(rbf.lp.loss));
  print_loss("v4 bf16 discrete", r32, rbf, rrnd);
  EXPECT_LE(rel_loss(rbf, r32), kLossBoundDiscrete);
  // Routing by top-k of the f32 router on slightly different activations: a differing expert
  // load is a routing flip (equal loads do not prove there was none).
  int flips = 0, rflips = 0;
  for (int64_t l = 0; l < r32.load.L; ++l) {
    flips += r32.load[l] != rbf.load[l];
    rflips += r32.load[l] != rrnd.load[l];
  }
  std::printf("[v4 bf16 discrete] MoE layers with expert loads unlike fp32: bf16 %d, weights-rounded %d, of %lld\n",
              flips, rflips, (long long)r32.load.L);
  const std::vector<TensorErr> ebf = compare(f.m32, r32.g, rbf.g), ernd = compare(f.m32, r32.g, rrnd.g);
  print_report("v4 bf16 discrete", ebf, ernd);
  const double mb = median_rel(ebf), mr = median_rel(ernd);
  std::printf("[v4 bf16 discrete] median tensor relative L2: bf16 %.2e, weights-rounded %.2e\n", mb, mr);
  EXPECT_LE(mb, kMedianFactor * mr + kRoundedFloor);
}

TEST(V4Bf16Layers, BrokenShadowTripsTheBound) {
  // One tensor's bf16 shadow 5% off (what a stale or mis-scaled shadow looks like), five kinds in
  // turn, over the same draws: the smooth config's bounds must catch each.
  init_threads();
  std::vector<std::unique_ptr<Fixture>> fs;
  std::vector<StepResult> r32;
  std::vector<TensorErr> ernd, ebf;
  for (int d = 0; d < kDraws; ++d) {
    fs.push_back(std::make_unique<Fixture>(smooth_config(), d));
    Fixture& f = *fs.back();
    r32.push_back(run_step(f.m32, f.data.batch()));
    pool(ernd, compare(f.m32, r32[d].g, run_step(f.mrnd, f.data.batch()).g));
    pool(ebf, compare(f.m32, r32[d].g, run_step(f.mbf, f.data.batch()).g));
  }
  ASSERT_TRUE(violations(ebf, ernd).empty());
  for (const char* name :
       {"model.layers.0.self_attn.o_b_proj.weight", "model.layers.1.self_attn.compressor.kv_proj.weight",
        "model.layers.2.mlp.experts.gate_up_proj", "mtp.0.mlp.shared_experts.gate_proj.weight", "lm_head.weight"}) {
    std::vector<TensorErr> broken;
    for (int d = 0; d < kDraws; ++d) {
      Fixture& f = *fs[d];
      const model::ParamEntry* e = f.mbf.layout.find(name);
      ASSERT_TRUE(e) << name;
      const std::vector<bf16> intact = f.mbf.params_bf16;
      for (int64_t i = e->offset; i < e->offset + e->shape.numel(); ++i)
        f.mbf.params_bf16[i] = f32_to_bf16(1.05f * bf16_to_f32(f.mbf.params_bf16[i]));
      pool(broken, compare(f.m32, r32[d].g, run_step(f.mbf, f.data.batch()).g));
      f.mbf.params_bf16 = intact;
    }
    const std::vector<std::string> v = violations(broken, ernd);
    std::printf("[v4 bf16 broken] %s x 1.05: %zu bound(s) broken%s%s\n", name, v.size(),
                v.empty() ? "" : ", first: ", v.empty() ? "" : v[0].c_str());
    EXPECT_FALSE(v.empty()) << name;
  }
}
