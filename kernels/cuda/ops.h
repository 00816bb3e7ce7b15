// The CUDA kernel table behind CudaBackend (kernels/cuda/backend_cuda.cu). Each function has the
// semantics of the kern:: function of the same name (kernels/*.h); every pointer is device
// memory, and the work is enqueued on ctx.stream (nothing waits unless the function returns a
// value to the host).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cstdint>
#include <unordered_map>
#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/compress_pool.h"
#include "kernels/gemm.h"
#include "kernels/hyper_conn.h"
#include "kernels/lm_head_ce.h"
#include "kernels/rope.h"
#include "kernels/router.h"
#include "kernels/v4_rows.h"

namespace trex::kern::cuda {

struct Ctx;

// cuBLASLt plans by GEMM size class (kernels/cuda/gemm.cu): the descriptor and the algorithm of
// each class seen, made on first use. Owned by the backend; at most kMaxPlans (then cleared).
struct LtKey {
  bool bf16_in, ta, tb;
  int64_t M, N, K, lda, ldb, ldc, batch, sa, sb, sc;
  int64_t align;  // bytes every pointer is aligned to (a power of two <= 256)
  bool operator==(const LtKey&) const = default;
};
struct LtKeyHash {
  size_t operator()(const LtKey& k) const;
};
struct LtPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatmulAlgo_t algo{};
};
class LtPlans {
 public:
  static constexpr size_t kMaxPlans = 8192;
  // Classes: a plan per size class (the default); Exact: per exact size; Off: no table, every
  // product plans for itself. The backend reads TREX_CUDA_GEMM_PLANS = exact | off once.
  enum class Mode { Classes, Exact, Off };
  Mode mode = Mode::Classes;
  LtPlans() = default;
  ~LtPlans();
  LtPlans(const LtPlans&) = delete;
  LtPlans& operator=(const LtPlans&) = delete;
  const LtPlan& get(const Ctx& ctx, const LtKey& k);
  void clear();
  size_t size() const { return plans_.size(); }

 private:
  std::unordered_map<LtKey, LtPlan, LtKeyHash> plans_;
};

struct Ctx {
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* lt_ws = nullptr;  // cuBLASLt workspace
  size_t lt_ws_bytes = 0;
  LtPlans* plans = nullptr;  // null: each GEMM plans for itself
};

void gemm(const Ctx& c, Prec pa, Prec pb, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
          const void* A, int64_t lda, const void* B, int64_t ldb, float beta, float* C, int64_t ldc);
// Strided batches of one shape: C_i = alpha op(A_i) op(B_i) + beta C_i with A_i = A + i sa (elements
// of the operand's type), B_i = B + i sb, C_i = C + i sc, i < batch; A and B both of prec.
void gemm_batched(const Ctx& c, Prec prec, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                  const void* A, int64_t lda, int64_t sa, const void* B, int64_t ldb, int64_t sb, float beta, float* C,
                  int64_t ldc, int64_t sc, int64_t batch);
void grouped_gemm(const Ctx& c, Prec prec, bool ta, bool tb, float alpha, float beta, const GemmGroup* groups,
                  int n_groups);

void rmsnorm_fwd(const Ctx& c, const float* x, int64_t N, int64_t d, const float* w, float eps, float* y, float* rstd);
void rmsnorm_bwd(const Ctx& c, const float* dy, const float* x, int64_t N, int64_t d, const float* w,
                 const float* rstd, float* dx, float* dw);
void swiglu_fwd(const Ctx& c, const float* gu, int64_t N, int64_t F, float limit, float* h);
void swiglu_bwd(const Ctx& c, const float* dh, const float* gu, int64_t N, int64_t F, float limit, float* dgu);
void swiglu_bwd_bf16(const Ctx& c, const float* dh, const float* gu, int64_t N, int64_t F, float limit, bf16* dgu);
void rope_apply(const Ctx& c, float* x, int64_t N, int H, int64_t stride_tok, int64_t stride_head, int D,
                const int32_t* pos, const float* cos, const float* sin, RopeLayout layout, bool inverse);
void adamw_step(const Ctx& c, const AdamWParams& hp, float* p, const float* g, float* m, float* v, int64_t n,
                bf16* p_bf16);
double sum_squares(const Ctx& c, const float* x, int64_t n);
double sum_squares_segments(const Ctx& c, const float* base, const int64_t* offsets, const int64_t* sizes, int n);
void attention_fwd(const Ctx& c, const AttnShape& sh, const float* q, const float* k, const float* v, float* o,
                   float* lse, const int32_t* seg);
void attention_bwd(const Ctx& c, const AttnShape& sh, const float* q, const float* k, const float* v, const float* o,
                   const float* lse, const float* dO, float* dq, float* dk, float* dv, const int32_t* seg);
double lm_head_ce(const Ctx& c, const CeArgs& args, int64_t* n_valid);
// Row operations (kernels/rows.h, kernels/cuda/rows.cu).
void copy_rows(const Ctx& c, void* dst, int64_t ldd, const void* src, int64_t lds, int64_t row_bytes, int64_t rows);
void add(const Ctx& c, float* y, const float* x, int64_t n);
void row_dot(const Ctx& c, const float* a, const float* b, int64_t R, int64_t w, double* out);
void to_bf16(const Ctx& c, const float* x, int64_t ldx, int64_t rows, int64_t cols, bf16* y);
void gather_rows(const Ctx& c, const float* src, const int32_t* idx, int64_t R, int64_t d, float* dst);
void gather_rows_bf16(const Ctx& c, const bf16* src, const int32_t* idx, int64_t R, int64_t d, bf16* dst);
void scatter_add_rows(const Ctx& c, const float* src, const int32_t* idx, int64_t R, int64_t d, float* dst);
void sum_heads(const Ctx& c, const float* x, int64_t N, int64_t H, int64_t ldn, int64_t ldh, int64_t w, float* y,
               int64_t ldy);
void moe_combine(const Ctx& c, const float* y, const float* probs, const int32_t* slot_row, int64_t N, int64_t K,
                 int64_t d, float* out);
void moe_combine_bwd(const Ctx& c, const float* dout, const float* probs, const int32_t* slot_row, int64_t N,
                     int64_t K, int64_t d, float* dy);
void moe_probs_bwd(const Ctx& c, const double* q, const float* probs, const int32_t* slot_row, int64_t N, int64_t K,
                   float* dprobs);
void moe_dispatch_bwd(const Ctx& c, const float* dxs, const int32_t* slot_row, int64_t N, int64_t K, int64_t d,
                      float* dx);
// The MoE router (kernels/router.h, kernels/cuda/router.cu).
void router_select(const Ctx& c, const RouterShape& s, const float* logits, const float* bias, const int32_t* fixed_idx,
                   float* scores, int32_t* idx, float* probs);
void router_probs_bwd(const Ctx& c, const RouterShape& s, const float* scores, const int32_t* idx, const float* dprobs,
                      float* dscores);
void router_scores_bwd(const Ctx& c, const RouterShape& s, const float* scores, const float* dscores, float* dlogits);
double router_aux(const Ctx& c, const RouterShape& s, const float* scores, const int32_t* idx, int64_t B, int64_t T,
                  int64_t n0, double alpha, float grad_scale, float* dscores);
void moe_sort(const Ctx& c, const int32_t* idx, int64_t N, int64_t K, int64_t E, int64_t* offsets, int32_t* row_token,
              int32_t* slot_row);

// DeepSeek-V4's hyper-connections (kernels/hyper_conn.h, kernels/cuda/hyper_conn.cu). The
// backward's workspace is the CPU's (hc_*_bwd_workspace_floats), of which they use the first
// 2 N R + N n + N floats (R = (2 + n) n; the head's R = n); the Sinkhorn history of hc_pre_bwd
// lives in scratch of its own.
void hc_pre_fwd(const Ctx& c, const HcShape& s, const float* x, const float* fn, const float* base, const float* scale,
                float* y, float* post, float* comb, float* mix, float* rstd);
void hc_pre_bwd(const Ctx& c, const HcShape& s, const float* x, const float* fn, const float* base, const float* scale,
                const float* mix, const float* rstd, const float* dy, const float* dpost, const float* dcomb, float* dx,
                float* dfn, float* dbase, float* dscale, float* workspace);
void hc_post_fwd(const Ctx& c, const HcShape& s, const float* x, const float* f, const float* post, const float* comb,
                 float* out);
void hc_post_bwd(const Ctx& c, const HcShape& s, const float* x, const float* f, const float* post, const float* comb,
                 const float* dout, float* dx, float* df, float* dpost, float* dcomb);
void hc_head_fwd(const Ctx& c, const HcShape& s, const float* x, const float* hc_fn, const float* hc_base,
                 const float* hc_scale, float* y, float* mix, float* rstd);
void hc_head_bwd(const Ctx& c, const HcShape& s, const float* x, const float* hc_fn, const float* hc_base,
                 const float* hc_scale, const float* mix, const float* rstd, const float* dy, float* dx, float* dfn,
                 float* dbase, float* dscale, float* workspace);
// The compressors' pooling (kernels/compress_pool.h, kernels/cuda/compress_pool.cu; the workspace
// is not used).
void compress_pool_fwd(const Ctx& c, int64_t B, int64_t T, int64_t m, int64_t hd, int cc, const float* kv,
                       const float* gate, const float* pb, float* out);
void compress_pool_bwd(const Ctx& c, int64_t B, int64_t T, int64_t m, int64_t hd, int cc, const float* kv,
                       const float* gate, const float* pb, const float* dout, float* dkv, float* dgate, float* dpb,
                       float* workspace);
// DeepSeek-V4's row operations (kernels/v4_rows.h, kernels/cuda/v4_rows.cu).
void scale(const Ctx& c, float* x, int64_t n, float a);
void v4_key_offsets(const Ctx& c, const V4KeyShape& s, const int32_t* seg, const int32_t* cnt, const int32_t* sel,
                    int64_t* off);
void v4_key_fill(const Ctx& c, const V4KeyShape& s, const int32_t* seg, const int32_t* cnt, const int32_t* sel,
                 const int64_t* off, int32_t* idx);

// Device scratch ordered on ctx.stream (the stream-ordered allocator): freed when it goes out of
// scope, after the work enqueued so far.
class Scratch {
 public:
  Scratch(const Ctx& c, size_t bytes);
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <class T>
  T* as() const { return static_cast<T*>(p_); }

 private:
  cudaStream_t s_;
  void* p_ = nullptr;
};

}  // namespace trex::kern::cuda
