// Test backends built on the CPU backend (tests/unit/test_backend.cpp, test_device_model.cpp):
// every method forwards to a CPU backend; a derived class sees each kernel-table call and copy
// between enter() and leave(), and may claim memory the host cannot address or allocate its own.
#pragma once
#include <memory>
#include <string>
#include "kernels/backend.h"

namespace trex::testing {

class ForwardingBackend : public kern::Backend {
 public:
  int calls = 0;  // kernel-table calls and copies so far
  bool host_addressable() const override { return false; }
  void* alloc(size_t n) override { return in_->alloc(n); }
  void release(void* p) override { in_->release(p); }
  void to_device(void* d, const void* s, size_t n) override { Call c(*this); in_->to_device(d, s, n); }
  void to_host(void* d, const void* s, size_t n) override { Call c(*this); in_->to_host(d, s, n); }
  void copy(void* d, const void* s, size_t n) override { Call c(*this); in_->copy(d, s, n); }
  void zero(void* p, size_t n) override { Call c(*this); in_->zero(p, n); }
  kern::Stream new_stream() override { return in_->new_stream(); }
  void delete_stream(kern::Stream s) override { in_->delete_stream(s); }
  void set_stream(kern::Stream s) override { in_->set_stream(s); }
  kern::Stream stream() const override { return in_->stream(); }
  kern::Event record() override { return in_->record(); }
  void wait(kern::Event e) override { in_->wait(e); }
  void sync(kern::Event e) override { in_->sync(e); }
  void delete_event(kern::Event e) override { in_->delete_event(e); }
  void synchronize() override { in_->synchronize(); }

#define TREX_FORWARD(call) \
  Call c_(*this);          \
  return in_->call
  void gemm(kern::Prec pa, kern::Prec pb, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float al, const void* A,
            int64_t lda, const void* B, int64_t ldb, float be, float* C, int64_t ldc) override {
    TREX_FORWARD(gemm(pa, pb, ta, tb, M, N, K, al, A, lda, B, ldb, be, C, ldc));
  }
  void grouped_gemm(kern::Prec p, bool ta, bool tb, float al, float be, const kern::GemmGroup* g, int n) override {
    TREX_FORWARD(grouped_gemm(p, ta, tb, al, be, g, n));
  }
  void rmsnorm_fwd(const float* x, int64_t N, int64_t d, const float* w, float eps, float* y, float* r) override {
    TREX_FORWARD(rmsnorm_fwd(x, N, d, w, eps, y, r));
  }
  void rmsnorm_bwd(const float* dy, const float* x, int64_t N, int64_t d, const float* w, const float* r, float* dx,
                   float* dw) override {
    TREX_FORWARD(rmsnorm_bwd(dy, x, N, d, w, r, dx, dw));
  }
  void swiglu_fwd(const float* gu, int64_t N, int64_t F, float l, float* h) override {
    TREX_FORWARD(swiglu_fwd(gu, N, F, l, h));
  }
  void swiglu_bwd(const float* dh, const float* gu, int64_t N, int64_t F, float l, float* dgu) override {
    TREX_FORWARD(swiglu_bwd(dh, gu, N, F, l, dgu));
  }
  void swiglu_bwd_bf16(const float* dh, const float* gu, int64_t N, int64_t F, float l, bf16* dgu) override {
    TREX_FORWARD(swiglu_bwd_bf16(dh, gu, N, F, l, dgu));
  }
  void rope_apply(float* x, int64_t N, int H, int64_t st, int64_t sh, int D, const int32_t* pos, const float* c,
                  const float* s, kern::RopeLayout lay, bool inv) override {
    TREX_FORWARD(rope_apply(x, N, H, st, sh, D, pos, c, s, lay, inv));
  }
  void adamw_step(const kern::AdamWParams& hp, float* p, const float* g, float* m, float* v, int64_t n,
                  bf16* pb) override {
    TREX_FORWARD(adamw_step(hp, p, g, m, v, n, pb));
  }
  double sum_squares(const float* x, int64_t n) override { TREX_FORWARD(sum_squares(x, n)); }
  double sum_squares_segments(const float* base, const int64_t* offsets, const int64_t* sizes, int n) override {
    TREX_FORWARD(sum_squares_segments(base, offsets, sizes, n));
  }
  void attention_fwd(const kern::AttnShape& sh, const float* q, const float* k, const float* v, float* o, float* l,
                     const int32_t* seg) override {
    TREX_FORWARD(attention_fwd(sh, q, k, v, o, l, seg));
  }
  void attention_bwd(const kern::AttnShape& sh, const float* q, const float* k, const float* v, const float* o,
                     const float* l, const float* dO, float* dq, float* dk, float* dv, const int32_t* seg) override {
    TREX_FORWARD(attention_bwd(sh, q, k, v, o, l, dO, dq, dk, dv, seg));
  }
  double lm_head_ce(const kern::CeArgs& a, int64_t* nv) override { TREX_FORWARD(lm_head_ce(a, nv)); }
  void copy_rows(void* d, int64_t ldd, const void* s, int64_t lds, int64_t rb, int64_t rows) override {
    TREX_FORWARD(copy_rows(d, ldd, s, lds, rb, rows));
  }
  void add(float* y, const float* x, int64_t n) override { TREX_FORWARD(add(y, x, n)); }
  void row_dot(const float* a, const float* b, int64_t R, int64_t w, double* o) override {
    TREX_FORWARD(row_dot(a, b, R, w, o));
  }
  void to_bf16(const float* x, int64_t ldx, int64_t r, int64_t c, bf16* y) override {
    TREX_FORWARD(to_bf16(x, ldx, r, c, y));
  }
  void gather_rows(const float* s, const int32_t* i, int64_t R, int64_t d, float* o) override {
    TREX_FORWARD(gather_rows(s, i, R, d, o));
  }
  void gather_rows_bf16(const bf16* s, const int32_t* i, int64_t R, int64_t d, bf16* o) override {
    TREX_FORWARD(gather_rows_bf16(s, i, R, d, o));
  }
  void scatter_add_rows(const float* s, const int32_t* i, int64_t R, int64_t d, float* o) override {
    TREX_FORWARD(scatter_add_rows(s, i, R, d, o));
  }
  void sum_heads(const float* x, int64_t N, int64_t H, int64_t ldn, int64_t ldh, int64_t w, float* y,
                 int64_t ldy) override {
    TREX_FORWARD(sum_heads(x, N, H, ldn, ldh, w, y, ldy));
  }
  void moe_combine(const float* y, const float* p, const int32_t* sr, int64_t N, int64_t K, int64_t d,
                   float* o) override {
    TREX_FORWARD(moe_combine(y, p, sr, N, K, d, o));
  }
  void moe_combine_bwd(const float* g, const float* p, const int32_t* sr, int64_t N, int64_t K, int64_t d,
                       float* dy) override {
    TREX_FORWARD(moe_combine_bwd(g, p, sr, N, K, d, dy));
  }
  void moe_probs_bwd(const double* q, const float* p, const int32_t* sr, int64_t N, int64_t K, float* dp) override {
    TREX_FORWARD(moe_probs_bwd(q, p, sr, N, K, dp));
  }
  void moe_dispatch_bwd(const float* g, const int32_t* sr, int64_t N, int64_t K, int64_t d, float* dx) override {
    TREX_FORWARD(moe_dispatch_bwd(g, sr, N, K, d, dx));
  }
  void router_select(const kern::RouterShape& s, const float* lg, const float* b, const int32_t* fx, float* sc,
                     int32_t* id, float* pr) override {
    TREX_FORWARD(router_select(s, lg, b, fx, sc, id, pr));
  }
  void router_probs_bwd(const kern::RouterShape& s, const float* sc, const int32_t* id, const float* dp,
                        float* ds) override {
    TREX_FORWARD(router_probs_bwd(s, sc, id, dp, ds));
  }
  void router_scores_bwd(const kern::RouterShape& s, const float* sc, const float* ds, float* dl) override {
    TREX_FORWARD(router_scores_bwd(s, sc, ds, dl));
  }
  double router_aux(const kern::RouterShape& s, const float* sc, const int32_t* id, int64_t B, int64_t T, int64_t n0,
                    double a, float gs, float* ds) override {
    TREX_FORWARD(router_aux(s, sc, id, B, T, n0, a, gs, ds));
  }
  void moe_sort(const int32_t* id, int64_t N, int64_t K, int64_t E, int64_t* off, int32_t* rt, int32_t* sr) override {
    TREX_FORWARD(moe_sort(id, N, K, E, off, rt, sr));
  }
  void hc_pre_fwd(const kern::HcShape& s, const float* x, const float* fn, const float* base, const float* sc, float* y,
                  float* post, float* comb, float* mix, float* rstd) override {
    TREX_FORWARD(hc_pre_fwd(s, x, fn, base, sc, y, post, comb, mix, rstd));
  }
  void hc_pre_bwd(const kern::HcShape& s, const float* x, const float* fn, const float* base, const float* sc,
                  const float* mix, const float* rstd, const float* dy, const float* dpost, const float* dcomb,
                  float* dx, float* dfn, float* dbase, float* dscale, float* ws) override {
    TREX_FORWARD(hc_pre_bwd(s, x, fn, base, sc, mix, rstd, dy, dpost, dcomb, dx, dfn, dbase, dscale, ws));
  }
  void hc_post_fwd(const kern::HcShape& s, const float* x, const float* f, const float* post, const float* comb,
                   float* out) override {
    TREX_FORWARD(hc_post_fwd(s, x, f, post, comb, out));
  }
  void hc_post_bwd(const kern::HcShape& s, const float* x, const float* f, const float* post, const float* comb,
                   const float* dout, float* dx, float* df, float* dpost, float* dcomb) override {
    TREX_FORWARD(hc_post_bwd(s, x, f, post, comb, dout, dx, df, dpost, dcomb));
  }
  void hc_head_fwd(const kern::HcShape& s, const float* x, const float* fn, const float* base, const float* sc,
                   float* y, float* mix, float* rstd) override {
    TREX_FORWARD(hc_head_fwd(s, x, fn, base, sc, y, mix, rstd));
  }
  void hc_head_bwd(const kern::HcShape& s, const float* x, const float* fn, const float* base, const float* sc,
                   const float* mix, const float* rstd, const float* dy, float* dx, float* dfn, float* dbase,
                   float* dscale, float* ws) override {
    TREX_FORWARD(hc_head_bwd(s, x, fn, base, sc, mix, rstd, dy, dx, dfn, dbase, dscale, ws));
  }
  void compress_pool_fwd(int64_t B, int64_t T, int64_t m, int64_t hd, int c, const float* kv, const float* gate,
                         const float* pb, float* out) override {
    TREX_FORWARD(compress_pool_fwd(B, T, m, hd, c, kv, gate, pb, out));
  }
  void compress_pool_bwd(int64_t B, int64_t T, int64_t m, int64_t hd, int c, const float* kv, const float* gate,
                         const float* pb, const float* dout, float* dkv, float* dgate, float* dpb, float* ws) override {
    TREX_FORWARD(compress_pool_bwd(B, T, m, hd, c, kv, gate, pb, dout, dkv, dgate, dpb, ws));
  }
  void indexer_topk(const kern::IndexerShape& sh, const float* q, const float* k, const float* wts, const int32_t* pos,
                    int32_t* cnt, int32_t* sel, float* scores, float* ws) override {
    TREX_FORWARD(indexer_topk(sh, q, k, wts, pos, cnt, sel, scores, ws));
  }
  void sparse_attn_fwd(const kern::SparseAttnShape& sh, const float* q, const float* kv, int64_t M, const int64_t* off,
                       const int32_t* idx, const float* sink, float* o, float* lse) override {
    TREX_FORWARD(sparse_attn_fwd(sh, q, kv, M, off, idx, sink, o, lse));
  }
  void sparse_attn_bwd(const kern::SparseAttnShape& sh, const float* q, const float* kv, int64_t M, const int64_t* off,
                       const int32_t* idx, const float* sink, const float* o, const float* lse, const float* dO,
                       float* dq, float* dkv, float* dsink, float* ws) override {
    TREX_FORWARD(sparse_attn_bwd(sh, q, kv, M, off, idx, sink, o, lse, dO, dq, dkv, dsink, ws));
  }
  void scale(float* x, int64_t n, float a) override { TREX_FORWARD(scale(x, n, a)); }
  void v4_key_offsets(const kern::V4KeyShape& s, const int32_t* seg, const int32_t* cnt, const int32_t* sel,
                      int64_t* off) override {
    TREX_FORWARD(v4_key_offsets(s, seg, cnt, sel, off));
  }
  void v4_key_fill(const kern::V4KeyShape& s, const int32_t* seg, const int32_t* cnt, const int32_t* sel,
                   const int64_t* off, int32_t* idx) override {
    TREX_FORWARD(v4_key_fill(s, seg, cnt, sel, off, idx));
  }
#undef TREX_FORWARD

 protected:
  virtual void enter() {}  // before each kernel-table call and copy
  virtual void leave() {}  // after it

 private:
  struct Call {
    ForwardingBackend& b;
    explicit Call(ForwardingBackend& fb) : b(fb) { ++b.calls, b.enter(); }
    ~Call() { b.leave(); }
  };
  std::unique_ptr<kern::Backend> in_ = kern::make_cpu_backend();
};

}  // namespace trex::testing
