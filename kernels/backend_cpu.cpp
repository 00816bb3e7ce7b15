// The CPU backend: host memory and the kern:: functions. Its kernels run on the calling thread
// (with the thread pool) and are complete when they return, so streams and events are tokens
// that order nothing.
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include "core/cpu.h"
#include "core/error.h"
#include "kernels/backend.h"
#include "kernels/rmsnorm.h"
#include "kernels/rows.h"
#include "kernels/swiglu.h"

namespace trex::kern {

namespace {

class CpuBackend final : public Backend {
 public:
  const char* name() const override { return "cpu"; }
  std::string describe() const override { return std::string("cpu (") + isa_name(cpu_isa()) + ")"; }
  bool host_addressable() const override { return true; }

  void* alloc(size_t bytes) override {
    const size_t n = (bytes + 255) / 256 * 256;
    void* p = std::aligned_alloc(256, n ? n : 256);
    if (!p) throw Error("cpu backend: cannot allocate " + std::to_string(bytes) + " bytes of host memory");
    return p;
  }
  void release(void* p) override { std::free(p); }
  void to_device(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void to_host(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override { std::memmove(dst, src, bytes); }
  void zero(void* p, size_t bytes) override { kern::zero_bytes(p, bytes); }

  Stream new_stream() override { return reinterpret_cast<Stream>(++next_token_); }
  void delete_stream(Stream) override {}
  void set_stream(Stream s) override { stream_ = s; }
  Stream stream() const override { return stream_; }
  Event record() override { return reinterpret_cast<Event>(++next_token_); }
  void wait(Event) override {}
  void sync(Event) override {}
  void delete_event(Event) override {}
  void synchronize() override {}

  void gemm(Prec pa, Prec pb, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
            int64_t lda, const void* B, int64_t ldb, float beta, float* C, int64_t ldc) override {
    if (pa == Prec::F32 && pb == Prec::F32)
      gemm_f32(ta, tb, M, N, K, alpha, static_cast<const float*>(A), lda, static_cast<const float*>(B), ldb, beta, C, ldc);
    else if (pa == Prec::BF16 && pb == Prec::BF16)
      gemm_bf16(ta, tb, M, N, K, alpha, static_cast<const bf16*>(A), lda, static_cast<const bf16*>(B), ldb, beta, C, ldc);
    else
      gemm_mixed(pa, pb, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  void grouped_gemm(Prec prec, bool ta, bool tb, float alpha, float beta, const GemmGroup* groups,
                    int n_groups) override {
    kern::grouped_gemm(prec, ta, tb, alpha, beta, groups, n_groups);
  }
  void rmsnorm_fwd(const float* x, int64_t N, int64_t d, const float* w, float eps, float* y, float* rstd) override {
    kern::rmsnorm_fwd(x, N, d, w, eps, y, rstd);
  }
  void rmsnorm_bwd(const float* dy, const float* x, int64_t N, int64_t d, const float* w, const float* rstd,
                   float* dx, float* dw) override {
    kern::rmsnorm_bwd(dy, x, N, d, w, rstd, dx, dw);
  }
  void swiglu_fwd(const float* gu, int64_t N, int64_t F, float limit, float* h) override {
    kern::swiglu_fwd(gu, N, F, limit, h);
  }
  void swiglu_bwd(const float* dh, const float* gu, int64_t N, int64_t F, float limit, float* dgu) override {
    kern::swiglu_bwd(dh, gu, N, F, limit, dgu);
  }
  void swiglu_bwd_bf16(const float* dh, const float* gu, int64_t N, int64_t F, float limit, bf16* dgu) override {
    kern::swiglu_bwd_bf16(dh, gu, N, F, limit, dgu);
  }
  void rope_apply(float* x, int64_t N, int H, int64_t stride_tok, int64_t stride_head, int D, const int32_t* pos,
                  const float* cos, const float* sin, RopeLayout layout, bool inverse) override {
    kern::rope_apply(x, N, H, stride_tok, stride_head, D, pos, cos, sin, layout, inverse);
  }
  void adamw_step(const AdamWParams& hp, float* p, const float* g, float* m, float* v, int64_t n,
                  bf16* p_bf16) override {
    kern::adamw_step(hp, p, g, m, v, n, p_bf16);
  }
  double sum_squares(const float* x, int64_t n) override { return kern::sum_squares(x, n); }
  double sum_squares_segments(const float* base, const int64_t* offsets, const int64_t* sizes, int n) override {
    return kern::sum_squares_segments(base, offsets, sizes, n);
  }
  void attention_fwd(const AttnShape& sh, const float* q, const float* k, const float* v, float* o, float* lse,
                     const int32_t* seg) override {
    kern::attention_fwd(sh, q, k, v, o, lse, seg);
  }
  void attention_bwd(const AttnShape& sh, const float* q, const float* k, const float* v, const float* o,
                     const float* lse, const float* dO, float* dq, float* dk, float* dv,
                     const int32_t* seg) override {
    kern::attention_bwd(sh, q, k, v, o, lse, dO, dq, dk, dv, seg);
  }
  double lm_head_ce(const CeArgs& args, int64_t* n_valid) override { return kern::lm_head_ce(args, n_valid); }
  void copy_rows(void* dst, int64_t ldd, const void* src, int64_t lds, int64_t row_bytes, int64_t rows) override {
    kern::copy_rows(dst, ldd, src, lds, row_bytes, rows);
  }
  void add(float* y, const float* x, int64_t n) override { kern::add(y, x, n); }
  void row_dot(const float* a, const float* b, int64_t R, int64_t w, double* out) override {
    kern::row_dot(a, b, R, w, out);
  }
  void to_bf16(const float* x, int64_t ldx, int64_t rows, int64_t cols, bf16* y) override {
    kern::to_bf16(x, ldx, rows, cols, y);
  }
  void gather_rows(const float* src, const int32_t* idx, int64_t R, int64_t d, float* dst) override {
    kern::gather_rows(src, idx, R, d, dst);
  }
  void gather_rows_bf16(const bf16* src, const int32_t* idx, int64_t R, int64_t d, bf16* dst) override {
    kern::gather_rows_bf16(src, idx, R, d, dst);
  }
  void scatter_add_rows(const float* src, const int32_t* idx, int64_t R, int64_t d, float* dst) override {
    kern::scatter_add_rows(src, idx, R, d, dst);
  }
  void sum_heads(const float* x, int64_t N, int64_t H, int64_t ldn, int64_t ldh, int64_t w, float* y,
                 int64_t ldy) override {
    kern::sum_heads(x, N, H, ldn, ldh, w, y, ldy);
  }
  void moe_combine(const float* y, const float* probs, const int32_t* slot_row, int64_t N, int64_t K, int64_t d,
                   float* out) override {
    kern::moe_combine(y, probs, slot_row, N, K, d, out);
  }
  void moe_combine_bwd(const float* dout, const float* probs, const int32_t* slot_row, int64_t N, int64_t K, int64_t d,
                       float* dy) override {
    kern::moe_combine_bwd(dout, probs, slot_row, N, K, d, dy);
  }
  void moe_probs_bwd(const double* q, const float* probs, const int32_t* slot_row, int64_t N, int64_t K,
                     float* dprobs) override {
    kern::moe_probs_bwd(q, probs, slot_row, N, K, dprobs);
  }
  void moe_dispatch_bwd(const float* dxs, const int32_t* slot_row, int64_t N, int64_t K, int64_t d,
                        float* dx) override {
    kern::moe_dispatch_bwd(dxs, slot_row, N, K, d, dx);
  }
  void router_select(const RouterShape& s, const float* logits, const float* bias, const int32_t* fixed_idx,
                     float* scores, int32_t* idx, float* probs) override {
    kern::router_select(s, logits, bias, fixed_idx, scores, idx, probs);
  }
  void router_probs_bwd(const RouterShape& s, const float* scores, const int32_t* idx, const float* dprobs,
                        float* dscores) override {
    kern::router_probs_bwd(s, scores, idx, dprobs, dscores);
  }
  void router_scores_bwd(const RouterShape& s, const float* scores, const float* dscores, float* dlogits) override {
    kern::router_scores_bwd(s, scores, dscores, dlogits);
  }
  double router_aux(const RouterShape& s, const float* scores, const int32_t* idx, int64_t B, int64_t T, int64_t n0,
                    double alpha, float grad_scale, float* dscores) override {
    std::vector<double> cnt(B * s.E, 0.0);
    kern::router_aux_counts(s, idx, T, n0, cnt.data());
    const double loss = kern::router_aux_loss(s, scores, cnt.data(), B, T, n0, alpha, grad_scale, dscores);
    return dscores ? 0.0 : loss;
  }
  void moe_sort(const int32_t* idx, int64_t N, int64_t K, int64_t E, int64_t* offsets, int32_t* row_token,
                int32_t* slot_row) override {
    kern::moe_sort(idx, N, K, E, offsets, row_token, slot_row);
  }
  void hc_pre_fwd(const HcShape& s, const float* x, const float* fn, const float* base, const float* scale, float* y,
                  float* post, float* comb, float* mix, float* rstd) override {
    kern::hc_pre_fwd(s, x, fn, base, scale, y, post, comb, mix, rstd);
  }
  void hc_pre_bwd(const HcShape& s, const float* x, const float* fn, const float* base, const float* scale,
                  const float* mix, const float* rstd, const float* dy, const float* dpost, const float* dcomb,
                  float* dx, float* dfn, float* dbase, float* dscale, float* workspace) override {
    kern::hc_pre_bwd(s, x, fn, base, scale, mix, rstd, dy, dpost, dcomb, dx, dfn, dbase, dscale, workspace);
  }
  void hc_post_fwd(const HcShape& s, const float* x, const float* f, const float* post, const float* comb,
                   float* out) override {
    kern::hc_post_fwd(s, x, f, post, comb, out);
  }
  void hc_post_bwd(const HcShape& s, const float* x, const float* f, const float* post, const float* comb,
                   const float* dout, float* dx, float* df, float* dpost, float* dcomb) override {
    kern::hc_post_bwd(s, x, f, post, comb, dout, dx, df, dpost, dcomb);
  }
  void hc_pre_bwd_then_post(const HcShape& s, const float* x, const float* fn, const float* base, const float* scale,
                            const float* mix, const float* rstd, const float* dy, const float* dpost,
                            const float* dcomb, float* dx, float* dfn, float* dbase, float* dscale, float* workspace,
                            const HcPostBwd& next) override {
    kern::hc_pre_bwd_then_post(s, x, fn, base, scale, mix, rstd, dy, dpost, dcomb, dx, dfn, dbase, dscale, workspace,
                               next);
  }
  void hc_head_fwd(const HcShape& s, const float* x, const float* fn, const float* base, const float* scale, float* y,
                   float* mix, float* rstd) override {
    kern::hc_head_fwd(s, x, fn, base, scale, y, mix, rstd);
  }
  void hc_head_bwd(const HcShape& s, const float* x, const float* fn, const float* base, const float* scale,
                   const float* mix, const float* rstd, const float* dy, float* dx, float* dfn, float* dbase,
                   float* dscale, float* workspace) override {
    kern::hc_head_bwd(s, x, fn, base, scale, mix, rstd, dy, dx, dfn, dbase, dscale, workspace);
  }
  void compress_pool_fwd(int64_t B, int64_t T, int64_t m, int64_t hd, int c, const float* kv, const float* gate,
                         const float* pb, float* out) override {
    kern::compress_pool_fwd(B, T, m, hd, c, kv, gate, pb, out);
  }
  void compress_pool_bwd(int64_t B, int64_t T, int64_t m, int64_t hd, int c, const float* kv, const float* gate,
                         const float* pb, const float* dout, float* dkv, float* dgate, float* dpb,
                         float* workspace) override {
    kern::compress_pool_bwd(B, T, m, hd, c, kv, gate, pb, dout, dkv, dgate, dpb, workspace);
  }
  void indexer_topk(const IndexerShape& sh, const float* q, const float* k, const float* wts, const int32_t* pos,
                    int32_t* cnt, int32_t* sel, float* scores_out, float* workspace) override {
    kern::indexer_topk(sh, q, k, wts, pos, cnt, sel, scores_out, workspace);
  }
  void sparse_attn_fwd(const SparseAttnShape& sh, const float* q, const float* kv, int64_t M, const int64_t* off,
                       const int32_t* idx, const float* sink, float* o, float* lse) override {
    kern::sparse_attn_fwd(sh, q, kv, M, off, idx, sink, o, lse);
  }
  void sparse_attn_bwd(const SparseAttnShape& sh, const float* q, const float* kv, int64_t M, const int64_t* off,
                       const int32_t* idx, const float* sink, const float* o, const float* lse, const float* dO,
                       float* dq, float* dkv, float* dsink, float* workspace) override {
    kern::sparse_attn_bwd(sh, q, kv, M, off, idx, sink, o, lse, dO, dq, dkv, dsink, workspace);
  }
  void scale(float* x, int64_t n, float a) override { kern::scale(x, n, a); }
  void v4_key_offsets(const V4KeyShape& s, const int32_t* seg, const int32_t* cnt, const int32_t* sel,
                      int64_t* off) override {
    kern::v4_key_offsets(s, seg, cnt, sel, off);
  }
  void v4_key_fill(const V4KeyShape& s, const int32_t* seg, const int32_t* cnt, const int32_t* sel, const int64_t* off,
                   int32_t* idx) override {
    kern::v4_key_fill(s, seg, cnt, sel, off, idx);
  }

 private:
  Stream stream_ = nullptr;
  uintptr_t next_token_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

bool parse_device_name(std::string_view device, int* cuda_index) {
  int idx = -1;
  if (device == "cuda") {
    idx = 0;
  } else if (device.starts_with("cuda:") && device.size() > 5 && device.size() <= 9) {
    idx = 0;
    for (char ch : device.substr(5)) {
      if (ch < '0' || ch > '9') return false;
      idx = idx * 10 + (ch - '0');
    }
    if (idx > 1023) return false;
  } else if (device != "cpu") {
    return false;
  }
  if (cuda_index) *cuda_index = idx;
  return true;
}

std::unique_ptr<Backend> make_backend(std::string_view device) {
  int idx = -1;
  if (!parse_device_name(device, &idx))
    throw Error("device '" + std::string(device) + "' is not known: use cpu or cuda (cuda:N for device N)");
  if (idx < 0) return make_cpu_backend();
  std::string why;
  if (!cuda_available(&why)) throw Error("device '" + std::string(device) + "' cannot be used: " + why);
  return make_cuda_backend(idx);
}

}  // namespace trex::kern
