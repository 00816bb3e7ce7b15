// The activation arena's peak for one training step, from the config alone. See
// activation_estimate.h.
#include "train/activation_estimate.h"

#include <algorithm>
#include <functional>
#include <map>
#include <tuple>
#include <vector>
#include "core/error.h"
#include "kernels/compress_pool.h"
#include "kernels/hyper_conn.h"
#include "kernels/indexer.h"
#include "kernels/lm_head_ce.h"
#include "kernels/sparse_attn.h"
#include "model/v4_context_parallel.h"

namespace trex::train {

namespace {

// ---- Activation arena peak (activation_peak_bytes) ------------------------------------------
// StackArena (core/stack_arena.h, host memory: one contiguous stack) replayed on sizes alone:
// each allocation rounded up to 64 bytes (0 -> 64); mark / release as the arena's.
class ArenaReplay {
 public:
  using Mark = size_t;
  void bytes(size_t n) {
    size_t b = (n + kAlign - 1) / kAlign * kAlign;
    if (b == 0) b = kAlign;
    used_ += b;
    peak_ = std::max(peak_, used_);
  }
  Mark mark() const { return used_; }
  void release(Mark m) { used_ = m; }
  size_t peak() const { return peak_; }

 private:
  static constexpr size_t kAlign = 64;
  size_t used_ = 0, peak_ = 0;
};

// One training step's arena allocations in the engine's order: model/model.cpp run() (V3) and
// model/model_v4.cpp run_v4() with the modules they call. Each function below mirrors the
// engine function of the same name, allocation by allocation; keep them in step.
struct StepWalk {
  const model::ModelConfig& c;
  const int64_t B, T, N, d;
  const int64_t cp, NK;          // context parallel: N = B T / cp local tokens, NK = B T keys (N without cp)
  const bool bf;                 // bf16 GEMM inputs (transient bf16 copies of activations)
  const bool replay;             // full recompute
  const bool drop_moe;           // selective recompute of "moe": MoE blocks replayed before their backward
  const bool moe_act;            // selective recompute of "moe_act": the experts' h recomputed in the backward
  const bool shared_act;         // "shared_experts": the shared experts' gu and h recomputed in the backward
  const bool moe_out;            // "moe_out": the routed experts' outputs y not kept (scratch of their forward)
  const bool up_proj;            // "mla_up_proj": V4's q_b output qb recomputed in the backward
  const bool mhc;                // "mhc": V4's mid-layer streams and hyper-connection inputs recomputed
  const int64_t tp, ep;          // tensor / expert parallel sizes
  const bool sp;                 // sequence parallel (tp > 1)
  const int64_t Nl;              // token rows outside the split blocks: N, or rank 0's shard (the largest)
  const int64_t l0, l1;          // the decoder layers run (a pipeline stage's, or all)
  const bool last;               // the stage computes the head (and V4's MTP blocks)
  // The indexer loss (V4 CSA layers, V3.2 every layer): computed in the forward (loss or recall),
  // its backward, the dense warm-up.
  const bool ix_fwd, ix_bwd, ix_dense;
  // Context parallel, DeepSeek-V4: the cp rank whose step this replays (its queries are those of
  // chunks rank and 2 cp - 1 - rank: their key lists and indexer pairs).
  int64_t rank = 0;
  ArenaReplay A;

  StepWalk(const model::ModelConfig& cfg, int64_t b, int64_t t, kern::Prec p, model::Recompute r, int64_t tp_,
           int64_t ep_, bool sp_, const model::StageShard& st, const model::TrainOptions& o, int64_t cp_)
      : c(cfg), B(b), T(t), N(b * t / std::max<int64_t>(cp_, 1)), d(cfg.hidden_size), cp(std::max<int64_t>(cp_, 1)),
        NK(b * t), bf(p == kern::Prec::BF16), replay(r == model::Recompute::Full),
        drop_moe(r == model::Recompute::Selective && (o.recompute_modules & model::kRecomputeMoe)),
        moe_act(r == model::Recompute::Selective && (o.recompute_modules & model::kRecomputeMoeAct)),
        shared_act(r == model::Recompute::Selective && (o.recompute_modules & model::kRecomputeSharedExperts)),
        moe_out(r == model::Recompute::Selective && (o.recompute_modules & model::kRecomputeMoeOut)),
        up_proj(r == model::Recompute::Selective && (o.recompute_modules & model::kRecomputeMlaUpProj)),
        mhc(r == model::Recompute::Selective && (o.recompute_modules & model::kRecomputeMhc)),
        tp(std::max<int64_t>(tp_, 1)), ep(std::max<int64_t>(ep_, 1)), sp(sp_ && tp > 1),
        Nl(sp ? (N + tp - 1) / tp : N), l0(st.on() ? st.l0 : 0), l1(st.on() ? st.l1 : cfg.num_hidden_layers),
        last(!st.on() || st.last), ix_fwd(cfg.indexer_layers() > 0 && o.indexer_metrics()),
        ix_bwd(cfg.indexer_layers() > 0 && o.indexer_loss()), ix_dense(cfg.indexer_layers() > 0 && o.dense_warmup()) {}

  void f32(int64_t n) { A.bytes((size_t)n * 4); }
  void i32(int64_t n) { A.bytes((size_t)n * 4); }
  void i64(int64_t n) { A.bytes((size_t)n * 8); }
  void b16(int64_t n) { A.bytes((size_t)n * 2); }
  void gemm_input(int64_t n) {  // model/linear.cpp
    if (bf) b16(n);
  }
  void linear_fwd(int64_t rows, int64_t in) {  // bf16: a released copy of x
    if (!bf) return;
    const auto m = A.mark();
    b16(rows * in);
    A.release(m);
  }
  // bf16: copies of dy and (unless the caller made x's copy: x_cast false) x (dW is always set)
  void linear_bwd(int64_t rows, int64_t in, int64_t out, bool x_cast = true) {
    if (!bf) return;
    const auto m = A.mark();
    b16(rows * out);
    if (x_cast) b16(rows * in);
    A.release(m);
  }
  size_t ce_workspace() const {
    kern::CeArgs ce{};
    ce.prec = bf ? kern::Prec::BF16 : kern::Prec::F32;  // (bf16 on the dot-product GEMMs: + p in bf16)
    ce.N = Nl, ce.d = d, ce.V = c.vocab_size;
    return kern::lm_head_ce_workspace_floats(ce);
  }

  // model/mlp.cpp on n token rows (F: this rank's columns; split: gate and up rows apart under
  // tensor parallel).
  void mlp_forward(int64_t n, int64_t F, bool split) {
    f32(n * 2 * F), f32(n * F);  // saved gu, h
    linear_fwd(n, d);
    if (split) linear_fwd(n, d);
    linear_fwd(n, F);
  }
  void mlp_backward(int64_t n, int64_t F, bool split, bool x_cast = true) {  // x_cast: MlpSaved::xb null
    const auto m = A.mark();
    f32(n * F);  // dh
    linear_bwd(n, F, d);
    f32(n * 2 * F);  // dgu
    if (split) linear_bwd(n, d, F, x_cast), linear_bwd(n, d, F, x_cast);
    else linear_bwd(n, d, 2 * F, x_cast);
    A.release(m);
  }

  // model/model.cpp tp_block_in / tp_block_out_buf / tp_block_out around a split block of width w
  // under sequence parallel: the all-gathered input and the partial output ([N, w] each), and the
  // padded workspace of the collectives when the shards are uneven (model/seq_parallel.cpp).
  void sp_pad(int64_t w) {
    if (!sp || N % tp == 0) return;
    const auto m = A.mark();
    f32(tp * ((N + tp - 1) / tp) * w);
    A.release(m);
  }
  void block_in(int64_t w) {
    if (!sp) return;
    f32(N * w);
    sp_pad(w);
  }
  void block_out_buf(int64_t w) {
    if (sp) f32(N * w);
  }

  // model/moe.cpp. Rows R = tokens x K (dropless: every (token, slot) pair; tokens = Nl, this
  // rank's rows). Expert parallel: the rows this rank computes depend on the routing; the estimate
  // takes their expectation, R (each rank sends its R rows and receives as many under balanced
  // routing).
  // rows_bf16: the rows come in bf16 (one rank, bf16: gathered from x's bf16 copy, no rounding
  // here).
  void experts_fwd(int64_t R, int64_t F, bool rows_bf16) {
    const auto m = A.mark();
    if (moe_act) f32(R * F);  // h, a scratch one
    if (!rows_bf16) gemm_input(R * d);
    gemm_input(R * F);
    A.release(m);
  }
  // gather: the rows' inputs gathered again (one rank), in bf16 from x's copy when bf.
  void experts_bwd(int64_t R, int64_t F, bool gather) {
    const auto m = A.mark();
    if (bf) b16(R * 2 * F);  // dgu, rounded by the SwiGLU's backward
    else f32(R * 2 * F);     // dgu
    const auto mh = A.mark();
    if (moe_act) f32(R * F);  // h, computed again
    f32(R * F);          // dh
    gemm_input(R * d);   // dy
    gemm_input(R * F);   // h
    A.release(mh);
    if (gather && bf) b16(R * d);    // xs, gathered in bf16
    else if (gather) f32(R * d);     // xs, gathered (f32: the GEMM's operand itself)
    else gemm_input(R * d);          // xs, the kept rows rounded
    A.release(m);
  }
  // model/moe.cpp on this rank's Nl token rows (MoeIn::tokens()), with the dispatcher's own
  // buffers (model/moe_dispatch.h: LocalDispatcher when ep = 1, else AllToAllDispatcher, whose
  // Rl rows are estimated as R: balanced routing).
  void moe_forward() {
    const int64_t E = c.n_routed_experts, K = c.num_experts_per_tok, F = c.moe_intermediate_size, R = Nl * K;
    const int64_t Fs = c.shared_intermediate(), Rl = std::max<int64_t>(R, 1);
    const bool moves = ep > 1, shared = c.n_shared_experts > 0;
    f32(Nl * E), i32(R), f32(R);  // scores, idx, probs
    i32(R), i32(R), i64(E + 1);  // row_token, slot_row, offsets
    if (moves) i32(Rl), f32(Rl * d);  // plan: perm, the kept inputs
    f32(Rl * 2 * F);                   // gu
    if (!moe_act) f32(Rl * F);         // h
    if (shared && !shared_act) f32(Nl * 2 * Fs), f32(Nl * Fs);  // the shared experts' gu, h
    if (!moe_out) f32(R * d);                                   // y
    const auto m = A.mark();
    if (moe_out) f32(R * d);                                   // y, scratch
    if (shared && shared_act) f32(Nl * 2 * Fs), f32(Nl * Fs);  // the shared experts' gu, h, scratch
    if (!moves) gemm_input(Nl * d);                            // x in bf16 (one rank)
    const auto m2 = A.mark();
    if (!moves && bf) b16(R * d);                        // xs, gathered in bf16
    else f32(R * d);                                     // xs
    if (moves) f32(Rl * d);                              // dispatch: received rows
    if (moves && shared) linear_fwd(Nl, d), linear_fwd(Nl, Fs);
    if (moves) f32(Rl * d);                              // output rows
    experts_fwd(Rl, F, !moves && bf);
    A.release(m2);
    if (!moves && shared) linear_fwd(Nl, Fs);  // after the routed experts (gate|up on x's copy)
    A.release(m);
  }
  void shared_backward(bool x_cast) {  // moe_backward's shared_bwd; x_cast false: on x's bf16 copy
    const int64_t Fs = c.shared_intermediate();
    const auto m = A.mark();
    if (shared_act) f32(Nl * 2 * Fs), f32(Nl * Fs);  // gu, h again
    if (shared_act && x_cast) linear_fwd(Nl, d);
    mlp_backward(Nl, Fs, false, x_cast);
    A.release(m);
  }
  void moe_backward() {
    const int64_t E = c.n_routed_experts, K = c.num_experts_per_tok, F = c.moe_intermediate_size, R = Nl * K;
    const int64_t Rl = std::max<int64_t>(R, 1);
    const bool moves = ep > 1;
    const auto m = A.mark();
    f32(R * d), f32(R), f32(2 * R);  // dy, dprobs, q (double)
    if (moves) f32(R * d);       // dxs (one rank: dy's buffer)
    if (!moves) gemm_input(Nl * d);  // x in bf16 (one rank)
    const bool shared = c.n_shared_experts > 0;
    const auto m2 = A.mark();
    if (moves) f32(Rl * d), f32(Rl * d);  // dispatch: received rows, local rows
    if (moves && shared) shared_backward(true);  // while dy is in flight
    if (moves) f32(Rl * d);             // output rows (dxl)
    if (moves && moe_out) f32(2 * Rl);  // and ql (double)
    experts_bwd(Rl, F, !moves);
    A.release(m2);
    if (!moves && shared) shared_backward(false);  // after the routed experts
    f32(Nl * E);  // dscores
    A.release(m);
  }

  // Selective recompute of "moe" (model.cpp run(), model_v4.cpp layer_forward / moe_replay): the
  // block's activations released after its forward, rebuilt (with a scratch output) before its
  // backward.
  void moe_forward_kept() {
    const auto m = A.mark();
    moe_forward();
    if (drop_moe) A.release(m);
  }
  void moe_replayed() {
    if (!drop_moe) return;
    f32(Nl * d);  // the block's output again
    moe_forward();
  }

  // model/mla.cpp (H: this rank's heads).
  void mla_forward() {
    const int64_t H = c.num_attention_heads / tp, dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim;
    const int64_t dqk = c.qk_head_dim(), dv = c.v_head_dim, r = c.kv_lora_rank, rq = c.q_lora_rank;
    f32(N * H * dqk);  // Q
    if (rq) {
      f32(N * rq), f32(N), f32(N * rq);  // qa, rstd, qan
      linear_fwd(N, d);
      linear_fwd(N, rq);
    } else {
      linear_fwd(N, d);
    }
    f32(N * r), f32(N), f32(N * r), f32(N * (dr ? dr : 1));  // lat, rstd, latn, k_pe
    auto m = A.mark();
    f32(N * (r + dr));  // kva
    linear_fwd(N, d);
    A.release(m);
    if (cp > 1) {  // the gathered [latn | k_pe] of the whole rows (model/context_parallel.cpp)
      f32(NK * r), f32(NK * (dr ? dr : 1));  // latn_all, kpe_all
      m = A.mark();
      f32(N * (r + dr)), f32(NK * (r + dr)), f32(NK * (r + dr));  // local, gathered, the all-gather's buffer
      A.release(m);
    }
    f32(NK * H * dqk), f32(NK * H * dv);  // K, V (the whole rows' under cp)
    m = A.mark();
    f32(NK * H * (dn + dv));  // kv
    linear_fwd(NK, r);
    A.release(m);
    if (c.is_v32()) v32_attn_forward();
    else f32(N * H * dv), f32(N * H);  // O, lse
    linear_fwd(N, H * dv);
  }

  // model/v32_indexer.cpp, model/v32_indexer_loss.cpp: DeepSeek-V3.2's selection and sparse
  // attention. Key lists: one document a row (packed rows attend fewer keys: an upper bound); under
  // cp, of the cp rank whose queries attend the most keys.
  int64_t v32_topk() const { return std::min<int64_t>(c.v32.index_topk, std::max<int64_t>(T, 1)); }
  int64_t v32_keys() const {  // (query, key) pairs of this rank's B x T / cp queries (per head)
    const int64_t kt = v32_topk(), ch = T / (2 * cp);
    int64_t best = 0;
    for (int64_t r = 0; r < cp; ++r) {
      int64_t n = 0;
      for (int64_t j = 0; j < T / cp; ++j) {
        const int64_t q = cp == 1 ? j : (j < ch ? r * ch + j : (2 * cp - 1 - r) * ch + (j - ch));
        n += ix_dense ? q + 1 : std::min(kt, q + 1);
      }
      best = std::max(best, n);
    }
    return B * best;
  }
  void v32_index_keys_all() {  // the local keys and the all-gather's buffer (cp)
    if (cp == 1) return;
    const auto m = A.mark();
    f32(N * c.v32.index_head_dim), f32(NK * c.v32.index_head_dim);
    A.release(m);
  }
  void v32_index_project() {  // v32_indexer_loss.cpp project
    const int64_t nI = c.v32.index_n_heads, dI = c.v32.index_head_dim;
    f32(N * nI * dI), f32(N * nI), f32(NK * dI);
    v32_index_keys_all();
  }
  void v32_attn_forward() {
    const int64_t H = c.num_attention_heads / tp, nI = c.v32.index_n_heads, dI = c.v32.index_head_dim;
    const int64_t dqk = c.qk_head_dim(), dv = c.v_head_dim, D = dqk + dv, R = N * H, RK = NK * H, kt = v32_topk();
    const int64_t keys = v32_keys();
    i32(N), i32(N * kt), i32(N), i32(N);  // cnt, sel, start, self
    auto m = A.mark();
    f32(N * nI * dI), f32(N * nI), f32(NK * dI);  // iq, wts, ik
    v32_index_keys_all();
    i32(T);  // iota
    const kern::IndexerShape row{1, T, T, (int)nI, (int)dI, 1, (int)kt, 1.f};
    f32((int64_t)std::max<size_t>(kern::indexer_workspace_floats(row), 1));
    A.release(m);
    i64(R + 1), i32(std::max<int64_t>(keys * H, 1));  // off, idx
    f32(R * D), f32(RK * D), f32(R * D), f32(R), f32(R * dv);  // Qp, KVp, Op, lse, O
    if (ix_fwd) {  // v32_index_loss_forward: the kept pairs' dI, then the recomputed projections
      f32(std::max<int64_t>(keys, 1));
      m = A.mark();
      v32_index_project();
      A.release(m);
    }
  }
  void v32_attn_backward() {
    const int64_t H = c.num_attention_heads / tp, nI = c.v32.index_n_heads, dI = c.v32.index_head_dim;
    const int64_t dqk = c.qk_head_dim(), dv = c.v_head_dim, D = dqk + dv, R = N * H, RK = NK * H;
    auto m = A.mark();
    f32(R * D), f32(R * D), f32(RK * D);  // dOp, dQp, dKVp
    const kern::SparseAttnShape sh{R, 1, (int)D, 1.f};
    f32((int64_t)std::max<size_t>(kern::sparse_attn_bwd_workspace_floats(sh, RK), 1));
    A.release(m);
    if (!ix_bwd) return;
    m = A.mark();  // v32_index_loss_backward
    v32_index_project();
    f32(N * nI), f32(N * nI * dI), f32(NK * dI);  // dw, dq, dk
    if (cp > 1) {  // the reduce-scatter's buffer
      const auto m2 = A.mark();
      f32(NK * dI);
      A.release(m2);
    }
    f32(N * dI), f32(N * dI);  // y0, dy0
    A.release(m);
  }
  void mla_backward() {
    const int64_t H = c.num_attention_heads / tp, dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim;
    const int64_t dqk = c.qk_head_dim(), dv = c.v_head_dim, r = c.kv_lora_rank, rq = c.q_lora_rank;
    const auto m = A.mark();
    f32(N * H * dv);  // dO
    linear_bwd(N, H * dv, d);
    f32(N * H * dqk), f32(NK * H * dqk), f32(NK * H * dv);  // dQ, dK, dV
    if (c.is_v32()) v32_attn_backward();
    f32(NK * H * (dn + dv)), f32(N * (r + dr));              // dkv, dkva
    f32(N * r);                                              // dlatn
    if (cp > 1) {
      f32(NK * (r + dr)), f32(NK * r);  // dall, dlatn_all
      linear_bwd(NK, r, H * (dn + dv));
      const auto m2 = A.mark();
      f32(NK * (r + dr));  // the reduce-scatter's buffer
      A.release(m2);
    } else {
      linear_bwd(N, r, H * (dn + dv));
    }
    f32(N * r);  // dlat
    linear_bwd(N, d, r + dr);
    if (rq) {
      f32(N * rq);
      linear_bwd(N, rq, H * dqk);
      f32(N * rq);
      linear_bwd(N, d, rq);
    } else {
      linear_bwd(N, d, H * dqk);
    }
    A.release(m);
  }

  // model/model.cpp run(): DeepSeek-V3.
  void v3_layer_forward(int64_t l) {
    f32(Nl * d), f32(Nl), f32(Nl * d);  // n1, rstd1, h_mid
    block_in(d), block_out_buf(d);
    mla_forward();
    sp_pad(d);
    f32(Nl * d), f32(Nl), f32(Nl * d);  // n2, rstd2, h_out
    if (c.is_moe_layer(l)) {
      moe_forward_kept();
      return;
    }
    block_in(d), block_out_buf(d);
    mlp_forward(N, c.intermediate_size / tp, tp > 1);
    sp_pad(d);
  }
  void v3_forward_kept(int64_t l) {
    if (!replay) return v3_layer_forward(l);
    f32(Nl * d);  // the kept input of the next layer
    const auto m = A.mark();
    v3_layer_forward(l);
    A.release(m);
  }
  void v3_layer_backward(int64_t l) {
    const auto m = A.mark();
    if (replay) v3_layer_forward(l);
    if (c.is_moe_layer(l)) {
      moe_replayed();
      moe_backward();
    } else {
      block_in(d), block_out_buf(d);
      mlp_backward(N, c.intermediate_size / tp, tp > 1);
      sp_pad(d);
    }
    block_in(d), block_out_buf(d);
    mla_backward();
    sp_pad(d);
    A.release(m);
  }
  // A head's scratch (model/model.cpp, model/mtp_v3.cpp, model/model_v4.cpp): the normed rows,
  // their bf16 copy and the LM head's workspace, released once the head has run.
  void head_scratch() {
    const auto m = A.mark();
    f32(Nl * d);
    if (bf) b16(Nl * d);
    f32((int64_t)ce_workspace());
    A.release(m);
  }
  void v3_head() {
    f32(Nl), f32(Nl * d);  // rstd, dh
    head_scratch();
  }
  void run_v3() {
    const int64_t Lm = c.num_hidden_layers, D = last ? c.v3_mtp_layers : 0;
    i32(N);       // positions
    f32(Nl * d);  // embedding (a later stage: the previous stage's output)
    for (int64_t l = l0; l < l1; ++l) v3_forward_kept(l);
    if (last) v3_head();
    for (int64_t k = 0; k < D; ++k) {  // model/mtp_v3.cpp
      i32(Nl), i32(Nl);                                 // ids, tg
      f32(Nl * d), f32(Nl * d), f32(Nl * d), f32(Nl), f32(Nl);  // e, en, hn, e_rstd, h_rstd
      f32(Nl * 2 * d), f32(Nl * d);                     // cat, x
      linear_fwd(Nl, 2 * d);
      v3_forward_kept(Lm + k);
      v3_head();
    }
    f32(Nl * d), f32(Nl * d), f32(Nl * d);  // dx (a stage before the last: dy), tmp, tmp2
    if (D) f32(Nl * d), f32(Nl * d);       // MTP dh, dprev
    for (int64_t k = D - 1; k >= 0; --k) {
      const auto m = A.mark();
      v3_layer_backward(Lm + k);
      f32(Nl * 2 * d);  // dcat
      linear_bwd(Nl, 2 * d, d);
      f32(Nl * d), f32(Nl * d), f32(Nl * d);  // den, dhn, de
      A.release(m);
    }
    for (int64_t l = l1 - 1; l >= l0; --l) v3_layer_backward(l);
  }

  // model/v4_attn.cpp (H, G: this rank's heads and output groups). Context parallel
  // (model/v4_context_parallel.h): the key side (kvp, KV's sliding rows, the compressors'
  // projections, the indexer's) holds this rank's held rows (B np: its tokens and their halos),
  // the pooled entries before their norm its own, KV every entry; the queries are the local N.
  int64_t v4_query_keys(int64_t l, int64_t t) const {  // key-list entries of the query at t
    const model::V4Config& v = c.v4;
    const model::AttnKind k = v.attn[l];
    const int64_t m = v.rate(l), nw = k == model::AttnKind::Sliding ? 0 : T / m;
    int64_t n = std::min<int64_t>(t + 1, v.sliding_window);
    if (k == model::AttnKind::HCA) n += std::min<int64_t>((t + 1) / m, nw);
    if (k == model::AttnKind::CSA) n += v4_entries(l, t);
    return n;
  }
  // The sequence index of local query j of a row (context parallel: of cp rank `rank`, chunks
  // rank and 2 cp - 1 - rank).
  int64_t v4_seq_index(int64_t j) const {
    if (cp == 1) return j;
    const int64_t ch = T / (2 * cp);
    return j < ch ? rank * ch + j : (2 * cp - 1 - rank) * ch + (j - ch);
  }
  // Key-list entries of one row's (local) queries, one document a row.
  int64_t v4_keys(int64_t l) const {
    int64_t n = 0;
    for (int64_t j = 0; j < T / cp; ++j) n += v4_query_keys(l, v4_seq_index(j));
    return n;
  }
  // Context parallel, DeepSeek-V4: this rank's held rows and own entries for layer l
  // (model/v4_context_parallel.h v4_cp_keys; the CSA indexer's plan is its layer's).
  std::map<std::tuple<int64_t, int64_t, int>, model::V4CpKeys> plans;
  const model::V4CpKeys& v4_cp_plan(int64_t l) {
    const model::V4Config& v = c.v4;
    const model::AttnKind k = v.attn[l];
    const int cc = k == model::AttnKind::CSA ? 2 : k == model::AttnKind::HCA ? 1 : 0;
    const auto key = std::make_tuple(v.sliding_window, v.rate(l), cc);
    auto it = plans.find(key);
    if (it == plans.end()) {
      const model::CpSplit s{T, T / (2 * cp), (int)rank, (int)cp};
      it = plans.emplace(key, model::v4_cp_keys(s, v.sliding_window, v.rate(l), cc)).first;
    }
    return it->second;
  }
  // v4_cp_halo_gather / v4_cp_halo_return's blocks of the other ranks (ret: the return, the
  // other way round; the rank's own rows are copied directly); between: the work run while a
  // gather's rows travel (v4_cp_halo_gather_start / _finish).
  void halo_collective(const model::V4CpKeys& k, int64_t w, bool ret, const std::function<void()>& between = {}) {
    const auto m = A.mark();
    const int64_t S = k.sent_rows() * B * w, R = k.received_rows() * B * w;
    f32(std::max<int64_t>(ret ? R : S, 1)), f32(std::max<int64_t>(ret ? S : R, 1));
    if (between) between();
    A.release(m);
  }
  // model/v4_attn.cpp v4_cp_gather_keys / v4_cp_return_keys and model/v4_indexer.cpp's exchange
  // and return_keys: the packed local and held rows [N | B np, w] and, inside, the exchange's
  // blocks. A gather (tw > 0) computes its projections into t [N, tw] first, released before the
  // exchange (the attention's) or after it (keep_t: the indexer's).
  void halo_exchange(const model::V4CpKeys& k, int64_t w, int64_t tw = 0, int64_t projections = 0,
                     bool keep_t = false, const std::function<void()>& between = {}) {
    const int64_t NH = B * k.np;
    const auto m = A.mark();
    if (tw) {
      f32(N * w), f32(NH * w);  // loc, all
      const auto mt = A.mark();
      f32(N * tw);
      for (int64_t i = 0; i < projections; ++i) linear_fwd(N, d);
      if (!keep_t) A.release(mt);
      halo_collective(k, w, false, between);
    } else {
      f32(NH * w), f32(N * w);  // all, loc
      halo_collective(k, w, true);
    }
    A.release(m);
  }
  // v4_cp_entries_gather / _return: the collective's buffer [cp, B, 2, emax, w].
  void entries_collective(const model::V4CpKeys& k, int64_t w) {
    if (k.emax == 0) return;
    const auto m = A.mark();
    f32(cp * B * 2 * k.emax * w);
    A.release(m);
  }
  int64_t pool_rows(const model::V4CpKeys& k) const { return std::max(k.own[0].L, k.own[1].L); }
  void cp_pool_fwd(const model::V4CpKeys& k, int64_t m, int64_t hd) {  // v4_cp_pool_fwd
    if (!pool_rows(k)) return;
    const auto mk = A.mark();
    f32(pool_rows(k) / m * hd);
    A.release(mk);
  }
  void cp_pool_bwd(const model::V4CpKeys& k, int64_t m, int64_t hd, int cc) {  // v4_cp_pool_bwd
    const int64_t L = pool_rows(k);
    if (!L) return;
    const auto mk = A.mark();
    f32(L / m * hd), f32(L * cc * hd), f32(L * cc * hd);  // dt, dk, dg
    f32((int64_t)std::max<size_t>(kern::compress_pool_bwd_workspace_floats(1, L, m, hd, cc), 1));
    A.release(mk);
  }
  // The owners' entries: v4_cp_entry_positions, the normed and roped copy, the gather.
  void cp_own_entries(const model::V4CpKeys& k, int64_t hd) {
    const auto m = A.mark();
    f32(B * 2 * k.emax * hd);  // own
    entries_collective(k, hd);
    A.release(m);
  }
  // Compressed entries a query at t of a CSA layer attends (the dense warm-up: every visible one).
  int64_t v4_entries(int64_t l, int64_t t) const {
    const model::V4Config& v = c.v4;
    const int64_t vis = std::min<int64_t>((t + 1) / v.rate(l), T / v.rate(l));
    return ix_dense ? vis : std::min<int64_t>(vis, v.index_topk);
  }
  // model/v4_indexer.cpp project (positions first): keep, the key path's backward inputs too.
  void v4_index_project(int64_t l, bool keep) {
    const model::V4Config& v = c.v4;
    const int64_t dI = v.index_head_dim, nI = v.index_n_heads, m = v.rate(l), nw = T / m;
    i32(std::max<int64_t>(N, 1)), i32(std::max<int64_t>(B * nw, 1));  // positions
    if (cp > 1) i32(std::max<int64_t>(B * 2 * v4_cp_plan(l).emax, 1));  // the own entries'
    f32(std::max<int64_t>(B * nw, 1) * dI);                            // k
    if (nw > 0 && cp > 1) {
      const model::V4CpKeys& k = v4_cp_plan(l);
      const int64_t NH = B * k.np, NO = B * 2 * k.emax;
      f32(NH * 2 * dI), f32(NH * 2 * dI);  // kv, gate (the held rows)
      halo_exchange(k, 4 * dI, 2 * dI, 2, true);
      f32(NO * dI);            // pool (the own entries)
      if (keep) f32(NO);       // rstd
      cp_pool_fwd(k, m, dI);
      cp_own_entries(k, dI);
    } else if (nw > 0) {
      f32(N * 2 * dI), f32(N * 2 * dI);  // kv, gate
      linear_fwd(N, d), linear_fwd(N, d);
      f32(B * nw * dI);  // pool
      if (keep) f32(B * nw);  // rstd
    }
    f32(N * nI * dI);  // q
    linear_fwd(N, c.q_lora_rank);
    f32(N * nI);  // w
    linear_fwd(N, d);
  }
  int64_t v4_index_pairs(int64_t l) const {  // of the (rank's) local queries, one document a row
    int64_t n = 0;
    for (int64_t j = 0; j < T / cp; ++j) n += v4_entries(l, v4_seq_index(j));
    return B * n;
  }
  void v4_attn_forward(int64_t l) {
    const model::V4Config& v = c.v4;
    const model::AttnKind kind = v.attn[l];
    const int64_t H = c.num_attention_heads / tp, G = v.o_groups / tp, hd = v.head_dim, qr = c.q_lora_rank;
    const int64_t m = v.rate(l), nw = kind == model::AttnKind::Sliding ? 0 : T / m;
    const int64_t cc = kind == model::AttnKind::CSA ? 2 : kind == model::AttnKind::HCA ? 1 : 0;
    const model::V4CpKeys* kp = cp > 1 ? &v4_cp_plan(l) : nullptr;
    const int64_t NK = kp ? B * kp->np : N, M = NK + B * nw;  // key rows: the held ones under cp
    i32(N);                                             // tpos
    if (kp) i32(std::max<int64_t>(NK, 1));              // kpos
    f32(N * qr), f32(N), f32(N * qr);  // qa, rstd, qres
    if (!up_proj) f32(N * H * hd);     // qb
    f32(N * H);                        // q_rstd
    auto query_path = [&] {            // q_a, q_b (cp: while the key side's halos travel)
      linear_fwd(N, d);
      if (!up_proj) linear_fwd(N, qr);
    };
    auto mk = A.mark();
    f32(M * hd), f32(NK * hd), f32(NK);  // KV, kvp, kv_rstd
    if (kp) {
      if (cc) f32(NK * cc * hd), f32(NK * cc * hd);  // ckv, cgate
      halo_exchange(*kp, hd + 2 * cc * hd, std::max(hd, cc * hd), cc ? 3 : 1, false, query_path);
      if (kind != model::AttnKind::Sliding) {  // the own entries: cpool, c_rstd
        const int64_t NO = B * 2 * kp->emax;
        f32(std::max<int64_t>(NO, 1) * hd), f32(std::max<int64_t>(NO, 1));
        if (nw > 0) {
          i32(std::max<int64_t>(NO, 1));  // epos
          cp_pool_fwd(*kp, m, hd);
          cp_own_entries(*kp, hd);
        }
      }
    } else {
      i32(std::max<int64_t>(B * nw, 1));  // cpos
      if (kind != model::AttnKind::Sliding) {
        f32(N * cc * hd), f32(N * cc * hd);                                          // ckv, cgate
        f32(std::max<int64_t>(B * nw, 1) * hd), f32(std::max<int64_t>(B * nw, 1));  // cpool, c_rstd
      }
      linear_fwd(N, d);  // x's bf16 copy: q_a, kv and the compressor's kv and gate on it
      if (!up_proj) linear_fwd(N, qr);
    }
    if (kind == model::AttnKind::CSA) {  // v4_index_select
      const int64_t dI = v.index_head_dim, nI = v.index_n_heads, topk = v.index_topk;
      i32(N), i32(N * topk);  // cnt, sel
      mk = A.mark();
      v4_index_project(l, false);
      const kern::IndexerShape sh{B, N / B, nw, (int)nI, (int)dI, m, (int)topk, 1.f};
      f32((int64_t)std::max<size_t>(kern::indexer_workspace_floats(sh), 1));
      A.release(mk);
    }
    i64(N + 1);                                      // off
    i32(std::max<int64_t>(B * v4_keys(l), 1));      // idx
    f32(N * H * hd), f32(N * H);                    // O, lse
    const int64_t olr = v.o_lora_rank;
    f32(N * G * olr);  // Y
    const bool ix = kind == model::AttnKind::CSA && ix_fwd;
    if (ix) {  // v4_index_loss_pairs: ix_off, ix_ent, ix_dI
      const int64_t pairs = v4_index_pairs(l);
      i64(N + 1), i32(std::max<int64_t>(pairs, 1)), f32(std::max<int64_t>(pairs, 1));
    }
    const auto mq = A.mark();  // the scratch: qb (mla_up_proj), Q, Or
    if (up_proj) f32(N * H * hd), linear_fwd(N, qr);
    v4_queries(H, hd);
    if (ix) {  // v4_index_loss_forward's scratch
      mk = A.mark();
      v4_index_project(l, false);
      A.release(mk);
    }
    f32(N * H * hd);  // Or
    mk = A.mark();    // grouped_fwd
    gemm_input(N * H * hd);
    A.release(mk);
    A.release(mq);
    linear_fwd(N, G * olr);
  }
  void v4_queries(int64_t H, int64_t hd) {  // model/v4_attn.cpp: Q, then the norm's ones
    f32(N * H * hd);
    const auto mk = A.mark();
    f32(hd);
    A.release(mk);
  }
  void v4_attn_backward(int64_t l) {
    const model::V4Config& v = c.v4;
    const model::AttnKind kind = v.attn[l];
    const int64_t H = c.num_attention_heads / tp, G = v.o_groups / tp, hd = v.head_dim, qr = c.q_lora_rank;
    const int64_t m = v.rate(l), nw = kind == model::AttnKind::Sliding ? 0 : T / m;
    const model::V4CpKeys* kp = cp > 1 ? &v4_cp_plan(l) : nullptr;
    const int64_t NK = kp ? B * kp->np : N, M = NK + B * nw;  // as in the forward
    const int64_t GO = G * v.o_lora_rank;
    const auto mk = A.mark();
    i32(N);       // tpos
    if (kp) i32(std::max<int64_t>(NK, 1));  // kpos
    f32(N * GO);  // dY
    linear_bwd(N, GO, d);
    f32(N * H * hd);  // dO
    auto mw = A.mark();
    f32(N * H * hd);  // Or
    gemm_input(N * GO);  // grouped_bwd
    gemm_input(N * H * hd);
    A.release(mw);
    f32(N * H * hd), f32(M * hd);  // dQ, dKV
    if (up_proj) f32(N * H * hd), linear_fwd(N, qr);  // qb again
    mw = A.mark();
    f32(N * H * hd), f32(N * H);  // Q, its rstd
    const auto mo = A.mark();
    f32(hd);  // ones (v4_queries)
    A.release(mo);
    const kern::SparseAttnShape sh{N, (int)H, (int)hd, 1.f};
    f32((int64_t)std::max<size_t>(kern::sparse_attn_bwd_workspace_floats(sh, M), 1));
    A.release(mw);
    f32(NK * hd);  // dkvp
    const bool comp = kind != model::AttnKind::Sliding && nw > 0;
    if (comp && kp) {
      const int cc = kind == model::AttnKind::CSA ? 2 : 1;
      const int64_t NO = B * 2 * kp->emax;
      f32(NO * hd);  // dCo
      entries_collective(*kp, hd);
      i32(NO), f32(NO * hd);                 // epos, dpool
      f32(NK * cc * hd), f32(NK * cc * hd);  // dckv, dcg (the held rows)
      cp_pool_bwd(*kp, m, hd, cc);
    } else if (comp) {
      const int cc = kind == model::AttnKind::CSA ? 2 : 1;
      i32(B * nw), f32(B * nw * hd);         // cpos, dpool
      f32(NK * cc * hd), f32(NK * cc * hd);  // dckv, dcg
      mw = A.mark();
      f32((int64_t)std::max<size_t>(kern::compress_pool_bwd_workspace_floats(B, T, m, hd, cc), 1));
      A.release(mw);
    }
    if (kp) {  // lkvp, lckv, lcg; the return; the projections
      const int64_t cw = comp ? (kind == model::AttnKind::CSA ? 2 : 1) * hd : 0;
      f32(N * hd);
      if (cw) f32(N * cw), f32(N * cw);
      halo_exchange(*kp, hd + 2 * cw);
      linear_bwd(N, d, hd);
      if (cw) linear_bwd(N, d, cw), linear_bwd(N, d, cw);
    }
    f32(N * H * hd);  // dqb
    mw = A.mark();
    f32(hd), f32(hd);  // dw, ones
    A.release(mw);
    f32(N * qr);  // dqres
    linear_bwd(N, qr, H * hd);
    f32(N * qr);  // dqa
    if (cp == 1) {  // the projections of x on one bf16 copy of x: kv, the compressor's kv and gate, q_a
      gemm_input(N * d);
      linear_bwd(N, d, hd, false);
      if (comp) {
        const int64_t cw = (kind == model::AttnKind::CSA ? 2 : 1) * hd;
        linear_bwd(N, d, cw, false), linear_bwd(N, d, cw, false);
      }
      linear_bwd(N, d, qr, false);
    } else {
      linear_bwd(N, d, qr);
    }
    A.release(mk);
    // v4_index_loss_backward (under cp also on a rank without pairs: the exchange needs it)
    if (kind == model::AttnKind::CSA && ix_bwd && nw > 0 && (cp > 1 || v4_index_pairs(l) > 0)) {
      const int64_t dI = v.index_head_dim, nI = v.index_n_heads, NE = B * nw;
      const auto mi = A.mark();
      v4_index_project(l, true);
      f32(N * nI), f32(N * nI * dI), f32(NE * dI);  // dw, dq, dk
      linear_bwd(N, d, nI);
      linear_bwd(N, qr, nI * dI);
      if (kp) {
        const int64_t NO = B * 2 * kp->emax;
        f32(NO * dI);  // dko
        entries_collective(*kp, dI);
        f32(NO * dI), f32(NK * 2 * dI), f32(NK * 2 * dI);  // dpool, hkv, hg (the held rows)
        cp_pool_bwd(*kp, m, dI, 2);
        f32(N * 2 * dI), f32(N * 2 * dI);  // dkv, dg; return_keys's exchange
        halo_exchange(*kp, 4 * dI);
      } else {
        f32(NE * dI), f32(N * 2 * dI), f32(N * 2 * dI);  // dpool, dkv, dg
        const auto mw2 = A.mark();
        f32((int64_t)std::max<size_t>(kern::compress_pool_bwd_workspace_floats(B, T, m, dI, 2), 1));
        A.release(mw2);
      }
      linear_bwd(N, d, 2 * dI), linear_bwd(N, d, 2 * dI);
      A.release(mi);
    }
  }

  // model/model_v4.cpp run_v4(): DeepSeek-V4 (hyper-connection streams n, MTP blocks).
  void hc_alloc(int64_t n) { f32(Nl * d), f32(Nl * n), f32(Nl * n * n), f32(Nl * (2 + n) * n), f32(Nl); }
  void v4_block_input(int64_t n) {  // model_v4.cpp block_input: the mix, the normed input and its rstd
    if (!mhc) {
      hc_alloc(n);
      f32(Nl * d), f32(Nl);  // nrm, rstd
      return;
    }
    f32(Nl * n), f32(Nl * n * n), f32(Nl * d), f32(Nl);  // post, comb, nrm, rstd
    const auto m = A.mark();
    f32(Nl * d), f32(Nl * (2 + n) * n), f32(Nl);  // y, mix, rstd (scratch)
    A.release(m);
  }
  void v4_layer_forward(int64_t l) {
    const int64_t n = c.v4.hc_mult;
    if (mhc) f32(Nl * n * d);  // out (holding X_mid first)
    v4_block_input(n);
    f32(Nl * d);  // a
    block_in(d), block_out_buf(d);
    v4_attn_forward(l);
    sp_pad(d);
    if (!mhc) f32(Nl * n * d);  // X_mid
    v4_block_input(n);
    f32(Nl * d);  // f
    moe_forward_kept();
    const auto m = A.mark();
    f32(Nl * n * d);  // out (mhc: the copy of X_mid, scratch)
    if (mhc) A.release(m);
  }
  void v4_forward_kept(int64_t l) {
    if (!replay) return v4_layer_forward(l);
    f32(Nl * c.v4.hc_mult * d);  // kept
    const auto m = A.mark();
    v4_layer_forward(l);
    A.release(m);
  }
  void v4_backward_replayed(int64_t l) {
    const auto m = A.mark();
    if (replay) v4_layer_forward(l);
    moe_replayed();
    const int64_t n = c.v4.hc_mult;
    auto mm = A.mark();
    if (mhc) f32(Nl * n * d);  // X_mid again (hc_post_bwd)
    A.release(mm);
    moe_backward();
    if (mhc) f32(Nl * n * d), hc_alloc(n);  // X_mid and the ffn mix again
    A.release(mm);
    block_in(d), block_out_buf(d);
    v4_attn_backward(l);
    sp_pad(d);
    mm = A.mark();
    if (mhc) hc_alloc(n);  // the attention's mix again
    A.release(mm);
    A.release(m);
  }
  void v4_head_forward() {
    const int64_t n = c.v4.hc_mult;
    f32(Nl * d), f32(Nl * n), f32(Nl);  // yh, mix, rstdh
    f32(Nl), f32(Nl * d);               // rstdf, dhf
    head_scratch();
  }
  void v4_head_backward(const kern::HcShape& hs) {
    const auto m = A.mark();
    f32(Nl * d);  // dyh
    f32((int64_t)std::max<size_t>(kern::hc_head_bwd_workspace_floats(hs), 1));
    A.release(m);
  }
  void run_v4() {
    const model::V4Config& v = c.v4;
    const int64_t n = v.hc_mult, Lm = c.num_hidden_layers, D = v.mtp_layers, K = c.num_experts_per_tok;
    const kern::HcShape hs{Nl, (int)n, d, (int)v.hc_sinkhorn_iters, (float)v.hc_eps, (float)c.rms_norm_eps};
    f32(Nl * n * d);  // embedded streams (a later stage: the previous stage's output)
    for (int64_t l = 0; l < Lm; ++l)
      if (v.hash[l]) i32(Nl * K);  // hash routes (of every layer, on every stage)
    for (int64_t l = l0; l < l1; ++l) v4_forward_kept(l);
    if (!last) {  // a stage before the last: the backward scratch, dX from the next stage, its layers
      f32(Nl * n * d), f32(Nl * d), f32(Nl * n), f32(Nl * n * n), f32(Nl * d), f32(Nl * d);  // dX2 df dpost dcomb dnorm dy
      f32((int64_t)std::max<size_t>(kern::hc_pre_bwd_workspace_floats(hs), 1));
      f32(Nl * n * d);  // dX
      for (int64_t l = l1 - 1; l >= l0; --l) v4_backward_replayed(l);
      return;
    }
    v4_head_forward();
    for (int64_t k = 0; k < D; ++k) {
      i32(Nl), i32(Nl);                  // ids, tg
      f32(Nl * d), f32(Nl * d), f32(Nl);  // e, en, e_rstd
      f32(Nl * n);                       // h_rstd
      f32(Nl * d);                      // ep
      linear_fwd(Nl, d);
      f32(Nl * n * d);  // X
      auto m = A.mark();
      f32(Nl * n * d);  // hn (scratch)
      linear_fwd(Nl * n, d);
      A.release(m);
      f32(Nl * n * d), i32(Nl * n);  // ep over the streams (scratch), its rows
      A.release(m);
      v4_forward_kept(Lm + k);
      v4_head_forward();
    }
    f32(Nl * n * d), f32(Nl * d), f32(Nl * n), f32(Nl * n * n), f32(Nl * d), f32(Nl * d);  // dX2 df dpost dcomb dnorm dy
    f32((int64_t)std::max<size_t>(kern::hc_pre_bwd_workspace_floats(hs), 1));
    f32(Nl * n * d);           // dX
    if (D) f32(Nl * n * d);    // dprev
    for (int64_t k = D - 1; k >= 0; --k) {
      v4_head_backward(hs);
      v4_backward_replayed(Lm + k);
      const auto m = A.mark();
      f32(Nl * n * d), f32(Nl * n);  // hn again, its rstd
      f32(Nl * n * d);  // dhn
      linear_bwd(Nl * n, d, d);
      f32(Nl * d), f32(Nl * d);  // dep, den
      linear_bwd(Nl, d, d);
      f32(Nl * d);  // de
      i32(Nl);      // embed_backward's rows
      A.release(m);
    }
    v4_head_backward(hs);
    for (int64_t l = l1 - 1; l >= l0; --l) v4_backward_replayed(l);
  }
};

}  // namespace

double activation_peak_bytes(const model::ModelConfig& c, int64_t B, int64_t T, kern::Prec prec,
                             model::Recompute recompute, int64_t tp, int64_t ep, bool sequence_parallel,
                             const model::StageShard& stage, const model::TrainOptions& ix, int64_t cp) {
  TREX_CHECK(B > 0 && T > 0, "activation_peak_bytes: empty batch ", B, " x ", T);
  TREX_CHECK(cp <= 1 || T % (2 * cp) == 0,
             "activation_peak_bytes: context parallel ", cp, " on a ", c.model_type, " model, rows of ", T);
  TREX_CHECK(!stage.on() || (0 <= stage.l0 && stage.l0 <= stage.l1 && stage.l1 <= c.num_hidden_layers),
             "activation_peak_bytes: stage layers [", stage.l0, ", ", stage.l1, ") of ", c.num_hidden_layers);
  if (!c.is_v4()) {
    StepWalk w(c, B, T, prec, recompute, tp, ep, sequence_parallel, stage, ix, cp);
    w.run_v3();
    return (double)w.A.peak();
  }
  // DeepSeek-V4: each cp rank's step (their key lists and indexer pairs differ), the largest.
  double peak = 0;
  for (int64_t r = 0; r < std::max<int64_t>(cp, 1); ++r) {
    StepWalk w(c, B, T, prec, recompute, tp, ep, sequence_parallel, stage, ix, cp);
    w.rank = r;
    w.run_v4();
    peak = std::max(peak, (double)w.A.peak());
  }
  return peak;
}


}  // namespace trex::train
