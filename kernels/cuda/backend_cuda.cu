// CudaBackend: device memory (cudaMalloc), copies, streams and events, and the kernel table of
// kernels/cuda/ops.h. One object per process and device; the cuBLASLt handle and its workspace
// live here.
#include <cstdio>
#include <cstdlib>
#include <string>
#include "kernels/backend.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/ops_v4attn.h"

namespace trex::kern {

namespace {

cudaStream_t cs(Stream s) { return reinterpret_cast<cudaStream_t>(s); }
cudaEvent_t ce(Event e) { return reinterpret_cast<cudaEvent_t>(e); }

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    int n = 0;
    TREX_CUDA_CHECK(cudaGetDeviceCount(&n));
    if (device < 0 || device >= n)
      throw Error("device 'cuda:" + std::to_string(device) + "': this machine has " + std::to_string(n) +
                  " CUDA device(s) (0.." + std::to_string(n - 1) + ")");
    TREX_CUDA_CHECK(cudaSetDevice(device));
    TREX_CUDA_CHECK(cudaGetDeviceProperties(&prop_, device));
    TREX_CUDA_CHECK(cudaStreamCreateWithFlags(&default_stream_, cudaStreamNonBlocking));
    TREX_CUBLAS_CHECK(cublasLtCreate(&ctx_.lt));
    ctx_.lt_ws_bytes = size_t(64) << 20;
    TREX_CUDA_CHECK(cudaMalloc(&ctx_.lt_ws, ctx_.lt_ws_bytes));
    ctx_.stream = default_stream_;
    ctx_.plans = &plans_;
    if (const char* e = std::getenv("TREX_CUDA_GEMM_PLANS"))  // A/B runs: exact | off
      plans_.mode = std::string(e) == "off" ? cuda::LtPlans::Mode::Off
                    : std::string(e) == "exact" ? cuda::LtPlans::Mode::Exact
                                                : cuda::LtPlans::Mode::Classes;
    // Keep freed scratch in the stream-ordered pool instead of returning it at every
    // synchronization (the attention's scratch is GiBs, taken and freed each layer).
    cudaMemPool_t pool;
    TREX_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
    uint64_t keep = UINT64_MAX;
    TREX_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  }
  ~CudaBackend() override {
    cudaStreamSynchronize(default_stream_);
    plans_.clear();
    cudaFree(ctx_.lt_ws);
    cublasLtDestroy(ctx_.lt);
    cudaStreamDestroy(default_stream_);
  }

  const char* name() const override { return "cuda"; }
  std::string describe() const override {
    char mem[32];
    std::snprintf(mem, sizeof mem, "%.1f", prop_.totalGlobalMem / double(1 << 30));
    return std::string(prop_.name) + " (sm_" + std::to_string(prop_.major) + std::to_string(prop_.minor) + ", " +
           std::to_string(prop_.multiProcessorCount) + " SMs, " + mem + " GiB)";
  }
  bool host_addressable() const override { return false; }

  void* alloc(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes ? bytes : 256);
    if (e != cudaSuccess) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      throw Error("cuda: cannot allocate " + std::to_string(bytes) + " bytes on " + prop_.name + " (" +
                  std::to_string(free_b >> 20) + " MiB free of " + std::to_string(total_b >> 20) +
                  " MiB): " + cudaGetErrorString(e));
    }
    return p;
  }
  void release(void* p) override { TREX_CUDA_CHECK(cudaFree(p)); }
  void to_device(void* dst, const void* src, size_t bytes) override {
    TREX_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ctx_.stream));
    // The host buffer may be pageable and reused by the caller at once: wait for the copy.
    TREX_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
  }
  void to_host(void* dst, const void* src, size_t bytes) override {
    TREX_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, ctx_.stream));
    TREX_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    TREX_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx_.stream));
  }
  void zero(void* p, size_t bytes) override { TREX_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, ctx_.stream)); }

  Stream new_stream() override {
    cudaStream_t s;
    TREX_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return reinterpret_cast<Stream>(s);
  }
  void delete_stream(Stream s) override {
    if (s && cs(s) != default_stream_) TREX_CUDA_CHECK(cudaStreamDestroy(cs(s)));
  }
  void set_stream(Stream s) override { ctx_.stream = s ? cs(s) : default_stream_; }
  Stream stream() const override { return reinterpret_cast<Stream>(ctx_.stream); }
  Event record() override {
    cudaEvent_t e;
    TREX_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    TREX_CUDA_CHECK(cudaEventRecord(e, ctx_.stream));
    return reinterpret_cast<Event>(e);
  }
  void wait(Event e) override { TREX_CUDA_CHECK(cudaStreamWaitEvent(ctx_.stream, ce(e), 0)); }
  void sync(Event e) override { TREX_CUDA_CHECK(cudaEventSynchronize(ce(e))); }
  void delete_event(Event e) override { TREX_CUDA_CHECK(cudaEventDestroy(ce(e))); }
  void synchronize() override { TREX_CUDA_CHECK(cudaDeviceSynchronize()); }

  void gemm(Prec pa, Prec pb, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
            int64_t lda, const void* B, int64_t ldb, float beta, float* C, int64_t ldc) override {
    cuda::gemm(ctx_, pa, pb, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  void grouped_gemm(Prec prec, bool ta, bool tb, float alpha, float beta, const GemmGroup* groups,
                    int n_groups) override {
    cuda::grouped_gemm(ctx_, prec, ta, tb, alpha, beta, groups, n_groups);
  }
  void rmsnorm_fwd(const float* x, int64_t N, int64_t d, const float* w, float eps, float* y, float* rstd) override {
    cuda::rmsnorm_fwd(ctx_, x, N, d, w, eps, y, rstd);
  }
  void rmsnorm_bwd(const float* dy, const float* x, int64_t N, int64_t d, const float* w, const float* rstd,
                   float* dx, float* dw) override {
    cuda::rmsnorm_bwd(ctx_, dy, x, N, d, w, rstd, dx, dw);
  }
  void swiglu_fwd(const float* gu, int64_t N, int64_t F, float limit, float* h) override {
    cuda::swiglu_fwd(ctx_, gu, N, F, limit, h);
  }
  void swiglu_bwd(const float* dh, const float* gu, int64_t N, int64_t F, float limit, float* dgu) override {
    cuda::swiglu_bwd(ctx_, dh, gu, N, F, limit, dgu);
  }
  void swiglu_bwd_bf16(const float* dh, const float* gu, int64_t N, int64_t F, float limit, bf16* dgu) override {
    cuda::swiglu_bwd_bf16(ctx_, dh, gu, N, F, limit, dgu);
  }
  void rope_apply(float* x, int64_t N, int H, int64_t stride_tok, int64_t stride_head, int D, const int32_t* pos,
                  const float* cos, const float* sin, RopeLayout layout, bool inverse) override {
    cuda::rope_apply(ctx_, x, N, H, stride_tok, stride_head, D, pos, cos, sin, layout, inverse);
  }
  void adamw_step(const AdamWParams& hp, float* p, const float* g, float* m, float* v, int64_t n,
                  bf16* p_bf16) override {
    cuda::adamw_step(ctx_, hp, p, g, m, v, n, p_bf16);
  }
  double sum_squares_segments(const float* base, const int64_t* offsets, const int64_t* sizes, int n) override {
    return cuda::sum_squares_segments(ctx_, base, offsets, sizes, n);
  }
  double sum_squares(const float* x, int64_t n) override { return cuda::sum_squares(ctx_, x, n); }
  void attention_fwd(const AttnShape& sh, const float* q, const float* k, const float* v, float* o, float* lse,
                     const int32_t* seg) override {
    cuda::attention_fwd(ctx_, sh, q, k, v, o, lse, seg);
  }
  void attention_bwd(const AttnShape& sh, const float* q, const float* k, const float* v, const float* o,
                     const float* lse, const float* dO, float* dq, float* dk, float* dv,
                     const int32_t* seg) override {
    cuda::attention_bwd(ctx_, sh, q, k, v, o, lse, dO, dq, dk, dv, seg);
  }
  double lm_head_ce(const CeArgs& args, int64_t* n_valid) override { return cuda::lm_head_ce(ctx_, args, n_valid); }
  void copy_rows(void* dst, int64_t ldd, const void* src, int64_t lds, int64_t row_bytes, int64_t rows) override {
    cuda::copy_rows(ctx_, dst, ldd, src, lds, row_bytes, rows);
  }
  void add(float* y, const float* x, int64_t n) override { cuda::add(ctx_, y, x, n); }
  void row_dot(const float* a, const float* b, int64_t R, int64_t w, double* out) override {
    cuda::row_dot(ctx_, a, b, R, w, out);
  }
  void to_bf16(const float* x, int64_t ldx, int64_t rows, int64_t cols, bf16* y) override {
    cuda::to_bf16(ctx_, x, ldx, rows, cols, y);
  }
  void gather_rows(const float* src, const int32_t* idx, int64_t R, int64_t d, float* dst) override {
    cuda::gather_rows(ctx_, src, idx, R, d, dst);
  }
  void gather_rows_bf16(const bf16* src, const int32_t* idx, int64_t R, int64_t d, bf16* dst) override {
    cuda::gather_rows_bf16(ctx_, src, idx, R, d, dst);
  }
  void scatter_add_rows(const float* src, const int32_t* idx, int64_t R, int64_t d, float* dst) override {
    cuda::scatter_add_rows(ctx_, src, idx, R, d, dst);
  }
  void sum_heads(const float* x, int64_t N, int64_t H, int64_t ldn, int64_t ldh, int64_t w, float* y,
                 int64_t ldy) override {
    cuda::sum_heads(ctx_, x, N, H, ldn, ldh, w, y, ldy);
  }
  void moe_combine(const float* y, const float* probs, const int32_t* slot_row, int64_t N, int64_t K, int64_t d,
                   float* out) override {
    cuda::moe_combine(ctx_, y, probs, slot_row, N, K, d, out);
  }
  void moe_combine_bwd(const float* dout, const float* probs, const int32_t* slot_row, int64_t N, int64_t K, int64_t d,
                       float* dy) override {
    cuda::moe_combine_bwd(ctx_, dout, probs, slot_row, N, K, d, dy);
  }
  void moe_probs_bwd(const double* q, const float* probs, const int32_t* slot_row, int64_t N, int64_t K,
                     float* dprobs) override {
    cuda::moe_probs_bwd(ctx_, q, probs, slot_row, N, K, dprobs);
  }
  void moe_dispatch_bwd(const float* dxs, const int32_t* slot_row, int64_t N, int64_t K, int64_t d,
                        float* dx) override {
    cuda::moe_dispatch_bwd(ctx_, dxs, slot_row, N, K, d, dx);
  }
  void router_select(const RouterShape& s, const float* logits, const float* bias, const int32_t* fixed_idx,
                     float* scores, int32_t* idx, float* probs) override {
    cuda::router_select(ctx_, s, logits, bias, fixed_idx, scores, idx, probs);
  }
  void router_probs_bwd(const RouterShape& s, const float* scores, const int32_t* idx, const float* dprobs,
                        float* dscores) override {
    cuda::router_probs_bwd(ctx_, s, scores, idx, dprobs, dscores);
  }
  void router_scores_bwd(const RouterShape& s, const float* scores, const float* dscores, float* dlogits) override {
    cuda::router_scores_bwd(ctx_, s, scores, dscores, dlogits);
  }
  double router_aux(const RouterShape& s, const float* scores, const int32_t* idx, int64_t B, int64_t T, int64_t n0,
                    double alpha, float grad_scale, float* dscores) override {
    return cuda::router_aux(ctx_, s, scores, idx, B, T, n0, alpha, grad_scale, dscores);
  }
  void moe_sort(const int32_t* idx, int64_t N, int64_t K, int64_t E, int64_t* offsets, int32_t* row_token,
                int32_t* slot_row) override {
    cuda::moe_sort(ctx_, idx, N, K, E, offsets, row_token, slot_row);
  }
  void hc_pre_fwd(const HcShape& s, const float* x, const float* fn, const float* base, const float* scale, float* y,
                  float* post, float* comb, float* mix, float* rstd) override {
    cuda::hc_pre_fwd(ctx_, s, x, fn, base, scale, y, post, comb, mix, rstd);
  }
  void hc_pre_bwd(const HcShape& s, const float* x, const float* fn, const float* base, const float* scale,
                  const float* mix, const float* rstd, const float* dy, const float* dpost, const float* dcomb,
                  float* dx, float* dfn, float* dbase, float* dscale, float* workspace) override {
    cuda::hc_pre_bwd(ctx_, s, x, fn, base, scale, mix, rstd, dy, dpost, dcomb, dx, dfn, dbase, dscale, workspace);
  }
  void hc_post_fwd(const HcShape& s, const float* x, const float* f, const float* post, const float* comb,
                   float* out) override {
    cuda::hc_post_fwd(ctx_, s, x, f, post, comb, out);
  }
  void hc_post_bwd(const HcShape& s, const float* x, const float* f, const float* post, const float* comb,
                   const float* dout, float* dx, float* df, float* dpost, float* dcomb) override {
    cuda::hc_post_bwd(ctx_, s, x, f, post, comb, dout, dx, df, dpost, dcomb);
  }
  void hc_head_fwd(const HcShape& s, const float* x, const float* fn, const float* base, const float* scale, float* y,
                   float* mix, float* rstd) override {
    cuda::hc_head_fwd(ctx_, s, x, fn, base, scale, y, mix, rstd);
  }
  void hc_head_bwd(const HcShape& s, const float* x, const float* fn, const float* base, const float* scale,
                   const float* mix, const float* rstd, const float* dy, float* dx, float* dfn, float* dbase,
                   float* dscale, float* workspace) override {
    cuda::hc_head_bwd(ctx_, s, x, fn, base, scale, mix, rstd, dy, dx, dfn, dbase, dscale, workspace);
  }
  void compress_pool_fwd(int64_t B, int64_t T, int64_t m, int64_t hd, int c, const float* kv, const float* gate,
                         const float* pb, float* out) override {
    cuda::compress_pool_fwd(ctx_, B, T, m, hd, c, kv, gate, pb, out);
  }
  void compress_pool_bwd(int64_t B, int64_t T, int64_t m, int64_t hd, int c, const float* kv, const float* gate,
                         const float* pb, const float* dout, float* dkv, float* dgate, float* dpb,
                         float* workspace) override {
    cuda::compress_pool_bwd(ctx_, B, T, m, hd, c, kv, gate, pb, dout, dkv, dgate, dpb, workspace);
  }
  void indexer_topk(const IndexerShape& sh, const float* q, const float* k, const float* wts, const int32_t* pos,
                    int32_t* cnt, int32_t* sel, float* scores_out, float* workspace) override {
    cuda::indexer_topk(ctx_, sh, q, k, wts, pos, cnt, sel, scores_out, workspace);
  }
  void sparse_attn_fwd(const SparseAttnShape& sh, const float* q, const float* kv, int64_t M, const int64_t* off,
                       const int32_t* idx, const float* sink, float* o, float* lse) override {
    cuda::sparse_attn_fwd(ctx_, sh, q, kv, M, off, idx, sink, o, lse);
  }
  void sparse_attn_bwd(const SparseAttnShape& sh, const float* q, const float* kv, int64_t M, const int64_t* off,
                       const int32_t* idx, const float* sink, const float* o, const float* lse, const float* dO,
                       float* dq, float* dkv, float* dsink, float* workspace) override {
    cuda::sparse_attn_bwd(ctx_, sh, q, kv, M, off, idx, sink, o, lse, dO, dq, dkv, dsink, workspace);
  }
  void scale(float* x, int64_t n, float a) override { cuda::scale(ctx_, x, n, a); }
  void v4_key_offsets(const V4KeyShape& s, const int32_t* seg, const int32_t* cnt, const int32_t* sel,
                      int64_t* off) override {
    cuda::v4_key_offsets(ctx_, s, seg, cnt, sel, off);
  }
  void v4_key_fill(const V4KeyShape& s, const int32_t* seg, const int32_t* cnt, const int32_t* sel, const int64_t* off,
                   int32_t* idx) override {
    cuda::v4_key_fill(ctx_, s, seg, cnt, sel, off, idx);
  }

 private:
  int device_;
  cudaDeviceProp prop_{};
  cudaStream_t default_stream_ = nullptr;
  cuda::LtPlans plans_;
  cuda::Ctx ctx_;
};

}  // namespace

namespace cuda {

Scratch::Scratch(const Ctx& c, size_t bytes) : s_(c.stream) {
  if (bytes) TREX_CUDA_CHECK(cudaMallocAsync(&p_, bytes, s_));
}
Scratch::~Scratch() {
  if (p_) cudaFreeAsync(p_, s_);
}

}  // namespace cuda

bool cuda_available(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    cudaGetLastError();
    if (why)
      *why = std::string("no CUDA device (") + (e != cudaSuccess ? cudaGetErrorString(e) : "none found") + ")";
    return false;
  }
  return true;
}

std::unique_ptr<Backend> make_cuda_backend(int device) { return std::make_unique<CudaBackend>(device); }

}  // namespace trex::kern
