// The rows of `trex bench kernels` (cli/cmd_bench_kernels.cpp): one builder per hot kernel that
// adds a call of it at one shape to a step's Plan, with the FLOPs and bytes of the call (formula at
// each builder; bytes = compulsory traffic: every operand read once, every output written once and
// also read when accumulated into) and a function that allocates its operands and returns the call
// to time. Calls of one kernel at one shape are one row; `where` collects the model's uses.
#pragma once
#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <vector>
#include "core/aligned.h"
#include "core/dtype.h"
#include "core/parallel.h"
#include "model/config.h"

namespace trex::cli::kbench {

using Runner = std::function<void()>;

// snprintf into a std::string (shapes, notes).
std::string fmt(const char* f, ...);

// Operands of one row: allocated right before it is timed, freed after, each on a 64-byte
// boundary (aligned_vector, as the step's activation arena hands out rows: kernels whose path
// depends on alignment take the step's path here too). Values uniform in [-amp, amp) from (seed, index), filled in parallel; seed
// 0 gives zeros.
class Bufs {
 public:
  float* f(int64_t n, uint64_t seed = 0, float amp = 1.f) {
    Vec<float>& v = f_.emplace_back(std::max<int64_t>(n, 1), 0.f);
    if (seed) fill(n, seed, [&](int64_t i, float x) { v[i] = amp * x; });
    return v.data();
  }
  bf16* b(int64_t n, uint64_t seed) {
    Vec<bf16>& v = b_.emplace_back(std::max<int64_t>(n, 1));
    fill(n, seed, [&](int64_t i, float x) { v[i] = f32_to_bf16(x); });
    return v.data();
  }
  int32_t* i32(int64_t n) { return i_.emplace_back(std::max<int64_t>(n, 1), 0).data(); }
  int64_t* i64(int64_t n) { return l_.emplace_back(std::max<int64_t>(n, 1), 0).data(); }

 private:
  template <class F>
  static void fill(int64_t n, uint64_t seed, F&& set) {
    parallel_for(n, 1 << 16, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) {
        uint64_t z = seed * 0x9E3779B97F4A7C15ull + (uint64_t)i * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 31)) * 0x94D049BB133111EBull;
        set(i, (float)((z >> 40) * (2.0 / 16777216.0) - 1.0));
      }
    });
  }
  template <class T>
  using Vec = aligned_vector<T>;
  std::deque<Vec<float>> f_;
  std::deque<Vec<bf16>> b_;
  std::deque<Vec<int32_t>> i_;
  std::deque<Vec<int64_t>> l_;
};

// One row: a kernel at one shape, with its calls per step and, once timed, its ms per call.
struct Op {
  std::string kernel, shape;
  std::vector<std::string> where;  // the model's uses of this row (projection names, ...)
  bool gemm_bf16 = false;          // rated against the best peak (bf16 GEMM); else the fp32 peak
  double flops = 0, bytes = 0;     // per call
  double scale = 1;                // timed on a part of the work: ms per call = timed ms x scale
  std::string note;                // how the timed call differs from the step's, if it does
  int64_t calls = 0;
  std::function<Runner(Bufs&)> make;  // allocates the operands, returns the timed call
  double ms = 0;
};

// The rows of one step, each (kernel, shape) once.
class Plan {
 public:
  void add(Op o, const std::string& where) {
    const std::string key = o.kernel + "|" + o.shape;
    auto it = index_.find(key);
    if (it == index_.end()) {
      index_[key] = ops.size();
      o.calls = 1;
      o.where = {where};
      ops.push_back(std::move(o));
      return;
    }
    Op& e = ops[it->second];
    ++e.calls;
    if (std::find(e.where.begin(), e.where.end(), where) == e.where.end()) e.where.push_back(where);
  }
  std::vector<Op> ops;

 private:
  std::map<std::string, size_t> index_;
};

// The run's shapes and the routing of its MoE layers.
struct Run {
  const model::ModelConfig& c;
  bool bf;                        // [train] precision bf16: GEMMs on bf16 copies
  int64_t B, T, N;                // sequences, their length, tokens
  std::vector<int32_t> idx;       // [N, K] experts of each (token, slot)
  std::vector<float> probs;       // [N, K]
  std::vector<int64_t> rows;      // [E] rows per expert
};

// Keys of query t (0-based in its row) in a DeepSeek-V4 layer (model/v4_attn.cpp's for_keys):
// the sliding window, then the formed compressed entries (HCA: all; CSA: the indexer's top-k).
struct V4Keys {
  model::AttnKind kind;
  int64_t W, m, nw, topk;
  int64_t window(int64_t t) const { return std::min(W, t + 1); }
  int64_t formed(int64_t t) const { return kind == model::AttnKind::Sliding ? 0 : std::min((t + 1) / m, nw); }
  int64_t compressed(int64_t t) const { return kind == model::AttnKind::CSA ? std::min(topk, formed(t)) : formed(t); }
};
const char* kind_name(model::AttnKind k);

// Dense GEMM (kern::gemm_bf16 when bf, else gemm_f32): C[M,N] = op(A) op(B) (+ C when beta = 1).
void gemm(Plan& p, const std::string& w, const char* what, bool bf, bool ta, bool tb, int64_t M, int64_t N,
          int64_t K, float beta);
// model::to_bf16 of n floats.
void to_bf16(Plan& p, const std::string& w, int64_t n);
// model::linear_fwd + linear_bwd on rows x in -> out (GEMMs fwd, dx, dW and the bf16 copies; x_cast
// false: the caller made x's bf16 copy, model::Act).
void linear(Plan& p, const Run& r, const std::string& w, int64_t rows, int64_t in, int64_t out, bool backward = true,
            bool x_cast = true);
// kern::grouped_gemm over the routed experts' rows (weight slab [E, out, in]): fwd, dx, dW.
void experts(Plan& p, const Run& r, const std::string& w, int64_t out, int64_t in);
// kern::rmsnorm_fwd (+ rmsnorm_bwd) on rows x d.
void rmsnorm(Plan& p, const std::string& w, int64_t rows, int64_t d, bool backward = true);
// kern::rope_apply on N tokens x H heads of D rotated dims at `off` in rows of stride st (heads sh apart).
void rope(Plan& p, const Run& r, const std::string& w, int64_t N, int H, int64_t st, int64_t sh, int64_t off, int D,
          bool inverse);
// kern::swiglu_fwd + swiglu_bwd on rows x F (clamp limit, 0 = none); bf16_grad: the backward
// rounds its output to bf16 (kern::swiglu_bwd_bf16, the routed experts of a bf16 run).
void swiglu(Plan& p, const std::string& w, int64_t rows, int64_t F, float limit, bool bf16_grad = false);
// kern::attention_fwd + attention_bwd (causal) of the run's B x T tokens.
void attention(Plan& p, const Run& r, const std::string& w, int H, int dqk, int dv, float scale);
// kern::sparse_attn_fwd + sparse_attn_bwd over a V4 layer's key lists.
void sparse_attn(Plan& p, const Run& r, const std::string& w, const V4Keys& ks, int H, int D);
// kern::indexer_topk of a CSA layer.
void indexer(Plan& p, const Run& r, const std::string& w, int64_t nw, int nh, int dI, int64_t m, int topk);
// kern::compress_pool_fwd (+ compress_pool_bwd): windows of m tokens, hd dims, c halves.
void compress_pool(Plan& p, const Run& r, const std::string& w, int64_t m, int64_t hd, int c, bool backward);
// kern::hc_{which}_fwd and / or _bwd (fwd, bwd), which = "pre", "post" or "head"; or, which =
// "pre_then_post", kern::hc_pre_bwd_then_post (a layer's MoE pre step and attention post step).
void hyper_conn(Plan& p, const Run& r, const std::string& w, const char* which, bool fwd = true, bool bwd = true);
// V4's grouped output projection o_a (kern::grouped_gemm fwd, dx, dW and the bf16 copies).
void grouped_oa(Plan& p, const Run& r, const std::string& w, int64_t G, int64_t Dg, int64_t olr);
// The MoE router: gate GEMMs (f32), model::router_select, router backward.
void router(Plan& p, const Run& r, const std::string& w);
// model/moe.cpp's dispatch / combine loops and their adjoints (bf16: the rows gathered in bf16).
void moe_glue(Plan& p, const Run& r, const std::string& w);
// kern::lm_head_ce with gradients.
void lm_head_ce(Plan& p, const Run& r, const std::string& w);
// zero_grads and sum_squares over n_all gradients, adamw_step over n_trained parameters.
void optimizer(Plan& p, const Run& r, int64_t n_all, int64_t n_trained);

}  // namespace trex::cli::kbench
