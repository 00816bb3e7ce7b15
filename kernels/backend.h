// The backend seam (docs/DESIGN.md, "Backends"): one object per process, chosen at start, that
// owns the device's memory, copies to and from the host, streams and events, and the kernel
// table. The CPU backend (kernels/backend_cpu.cpp) runs the kern:: functions on host memory;
// the CUDA backend (kernels/cuda/) runs cuBLASLt and trex's CUDA kernels on device memory. A
// third accelerator is a new folder implementing this class, nothing else.
//
// Kernel table: every method has the signature and the semantics of the kern:: function of the
// same name (its header states shapes, overwrite / accumulate rules and precision), except that
// every pointer is memory of this backend (alloc()). Work is enqueued in order on the current
// stream (set_stream; the backend's default stream at start) and is complete for the host only
// after sync() / synchronize(), or a method that returns a value to the host (sum_squares,
// lm_head_ce), which waits for it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/compress_pool.h"
#include "kernels/gemm.h"
#include "kernels/hyper_conn.h"
#include "kernels/indexer.h"
#include "kernels/lm_head_ce.h"
#include "kernels/router.h"
#include "kernels/rope.h"
#include "kernels/rows.h"
#include "kernels/sparse_attn.h"
#include "kernels/v4_rows.h"

namespace trex::kern {

struct StreamImpl;
struct EventImpl;
using Stream = StreamImpl*;  // null: the backend's default stream
using Event = EventImpl*;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;   // "cpu", "cuda"
  virtual std::string describe() const = 0;  // e.g. "NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)"
  // True when host code may read and write this backend's memory directly (the CPU backend).
  virtual bool host_addressable() const = 0;

  // --- memory ---------------------------------------------------------------------------------
  // bytes of device memory, 256-byte aligned; throws trex::Error naming the size and what is free.
  virtual void* alloc(size_t bytes) = 0;
  virtual void release(void* p) = 0;
  virtual void to_device(void* dst, const void* host_src, size_t bytes) = 0;  // ordered on the stream
  virtual void to_host(void* host_dst, const void* src, size_t bytes) = 0;    // waits for the copy
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;            // device to device
  virtual void zero(void* p, size_t bytes) = 0;

  // --- streams and events ---------------------------------------------------------------------
  virtual Stream new_stream() = 0;
  virtual void delete_stream(Stream s) = 0;
  virtual void set_stream(Stream s) = 0;  // where the following work is enqueued
  virtual Stream stream() const = 0;
  virtual Event record() = 0;             // an event after the work enqueued so far on stream()
  virtual void wait(Event e) = 0;         // stream() waits (on the device) for e
  virtual void sync(Event e) = 0;         // the host waits for e
  virtual void delete_event(Event e) = 0;
  virtual void synchronize() = 0;         // the host waits for all work of this backend

  // --- kernel table ---------------------------------------------------------------------------
  virtual void gemm(Prec pa, Prec pb, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
                    int64_t lda, const void* B, int64_t ldb, float beta, float* C, int64_t ldc) = 0;
  // groups: a HOST array of descriptors whose A, B, C point into this backend's memory.
  virtual void grouped_gemm(Prec prec, bool ta, bool tb, float alpha, float beta, const GemmGroup* groups,
                            int n_groups) = 0;
  virtual void rmsnorm_fwd(const float* x, int64_t N, int64_t d, const float* w, float eps, float* y,
                           float* rstd) = 0;
  virtual void rmsnorm_bwd(const float* dy, const float* x, int64_t N, int64_t d, const float* w, const float* rstd,
                           float* dx, float* dw) = 0;
  virtual void swiglu_fwd(const float* gu, int64_t N, int64_t F, float limit, float* h) = 0;
  virtual void swiglu_bwd(const float* dh, const float* gu, int64_t N, int64_t F, float limit, float* dgu) = 0;
  virtual void swiglu_bwd_bf16(const float* dh, const float* gu, int64_t N, int64_t F, float limit, bf16* dgu) = 0;
  virtual void rope_apply(float* x, int64_t N, int H, int64_t stride_tok, int64_t stride_head, int D,
                          const int32_t* pos, const float* cos, const float* sin, RopeLayout layout,
                          bool inverse) = 0;
  virtual void adamw_step(const AdamWParams& hp, float* p, const float* g, float* m, float* v, int64_t n,
                          bf16* p_bf16) = 0;
  virtual double sum_squares(const float* x, int64_t n) = 0;
  // offsets, sizes: HOST arrays of n segments of base.
  virtual double sum_squares_segments(const float* base, const int64_t* offsets, const int64_t* sizes, int n) = 0;
  virtual void attention_fwd(const AttnShape& sh, const float* q, const float* k, const float* v, float* o,
                             float* lse, const int32_t* seg) = 0;
  virtual void attention_bwd(const AttnShape& sh, const float* q, const float* k, const float* v, const float* o,
                             const float* lse, const float* dO, float* dq, float* dk, float* dv,
                             const int32_t* seg) = 0;
  // args' pointers (workspace too, when set) are this backend's memory.
  virtual double lm_head_ce(const CeArgs& args, int64_t* n_valid) = 0;
  // Row operations (kernels/rows.h).
  virtual void copy_rows(void* dst, int64_t ldd, const void* src, int64_t lds, int64_t row_bytes, int64_t rows) = 0;
  virtual void add(float* y, const float* x, int64_t n) = 0;
  virtual void row_dot(const float* a, const float* b, int64_t R, int64_t w, double* out) = 0;
  virtual void to_bf16(const float* x, int64_t ldx, int64_t rows, int64_t cols, bf16* y) = 0;
  virtual void gather_rows(const float* src, const int32_t* idx, int64_t R, int64_t d, float* dst) = 0;
  virtual void gather_rows_bf16(const bf16* src, const int32_t* idx, int64_t R, int64_t d, bf16* dst) = 0;
  virtual void scatter_add_rows(const float* src, const int32_t* idx, int64_t R, int64_t d, float* dst) = 0;
  virtual void sum_heads(const float* x, int64_t N, int64_t H, int64_t ldn, int64_t ldh, int64_t w, float* y,
                         int64_t ldy) = 0;
  virtual void moe_combine(const float* y, const float* probs, const int32_t* slot_row, int64_t N, int64_t K,
                           int64_t d, float* out) = 0;
  virtual void moe_combine_bwd(const float* dout, const float* probs, const int32_t* slot_row, int64_t N, int64_t K,
                               int64_t d, float* dy) = 0;
  virtual void moe_probs_bwd(const double* q, const float* probs, const int32_t* slot_row, int64_t N, int64_t K,
                             float* dprobs) = 0;
  virtual void moe_dispatch_bwd(const float* dxs, const int32_t* slot_row, int64_t N, int64_t K, int64_t d,
                                float* dx) = 0;
  // The MoE router (kernels/router.h).
  virtual void router_select(const RouterShape& s, const float* logits, const float* bias, const int32_t* fixed_idx,
                             float* scores, int32_t* idx, float* probs) = 0;
  virtual void router_probs_bwd(const RouterShape& s, const float* scores, const int32_t* idx, const float* dprobs,
                                float* dscores) = 0;
  virtual void router_scores_bwd(const RouterShape& s, const float* scores, const float* dscores, float* dlogits) = 0;
  // router_aux_counts over these rows (they hold every token of the sequences they touch), then
  // router_aux_loss. dscores null: returns the loss (waits for it); else adds the gradient and
  // returns 0 (no wait).
  virtual double router_aux(const RouterShape& s, const float* scores, const int32_t* idx, int64_t B, int64_t T,
                            int64_t n0, double alpha, float grad_scale, float* dscores) = 0;
  virtual void moe_sort(const int32_t* idx, int64_t N, int64_t K, int64_t E, int64_t* offsets, int32_t* row_token,
                        int32_t* slot_row) = 0;
  // DeepSeek-V4: hyper-connections (kernels/hyper_conn.h), the compressors' pooling
  // (kernels/compress_pool.h), the indexer's top-k (kernels/indexer.h), the sparse attention with
  // sinks (kernels/sparse_attn.h) and the step's row operations (kernels/v4_rows.h). Workspaces
  // are this backend's memory of the size the kern:: header names (a device backend may use its
  // own scratch besides).
  virtual void hc_pre_fwd(const HcShape& s, const float* x, const float* fn, const float* base, const float* scale,
                          float* y, float* post, float* comb, float* mix, float* rstd) = 0;
  virtual void hc_pre_bwd(const HcShape& s, const float* x, const float* fn, const float* base, const float* scale,
                          const float* mix, const float* rstd, const float* dy, const float* dpost, const float* dcomb,
                          float* dx, float* dfn, float* dbase, float* dscale, float* workspace) = 0;
  virtual void hc_post_fwd(const HcShape& s, const float* x, const float* f, const float* post, const float* comb,
                           float* out) = 0;
  virtual void hc_post_bwd(const HcShape& s, const float* x, const float* f, const float* post, const float* comb,
                           const float* dout, float* dx, float* df, float* dpost, float* dcomb) = 0;
  // hc_pre_bwd, then hc_post_bwd(next) with dout = the dx it leaves (kernels/hyper_conn.h
  // hc_pre_bwd_then_post). What dx holds afterwards is the backend's choice: the CPU leaves it as it
  // was, this default (two calls) writes the sum there.
  virtual void hc_pre_bwd_then_post(const HcShape& s, const float* x, const float* fn, const float* base,
                                    const float* scale, const float* mix, const float* rstd, const float* dy,
                                    const float* dpost, const float* dcomb, float* dx, float* dfn, float* dbase,
                                    float* dscale, float* workspace, const HcPostBwd& next) {
    hc_pre_bwd(s, x, fn, base, scale, mix, rstd, dy, dpost, dcomb, dx, dfn, dbase, dscale, workspace);
    hc_post_bwd(s, next.x, next.f, next.post, next.comb, dx, next.dx, next.df, next.dpost, next.dcomb);
  }
  virtual void hc_head_fwd(const HcShape& s, const float* x, const float* hc_fn, const float* hc_base,
                           const float* hc_scale, float* y, float* mix, float* rstd) = 0;
  virtual void hc_head_bwd(const HcShape& s, const float* x, const float* hc_fn, const float* hc_base,
                           const float* hc_scale, const float* mix, const float* rstd, const float* dy, float* dx,
                           float* dfn, float* dbase, float* dscale, float* workspace) = 0;
  virtual void compress_pool_fwd(int64_t B, int64_t T, int64_t m, int64_t hd, int c, const float* kv,
                                 const float* gate, const float* pb, float* out) = 0;
  virtual void compress_pool_bwd(int64_t B, int64_t T, int64_t m, int64_t hd, int c, const float* kv,
                                 const float* gate, const float* pb, const float* dout, float* dkv, float* dgate,
                                 float* dpb, float* workspace) = 0;
  virtual void indexer_topk(const IndexerShape& sh, const float* q, const float* k, const float* wts,
                            const int32_t* pos, int32_t* cnt, int32_t* sel, float* scores_out, float* workspace) = 0;
  virtual void sparse_attn_fwd(const SparseAttnShape& sh, const float* q, const float* kv, int64_t M,
                               const int64_t* off, const int32_t* idx, const float* sink, float* o, float* lse) = 0;
  virtual void sparse_attn_bwd(const SparseAttnShape& sh, const float* q, const float* kv, int64_t M,
                               const int64_t* off, const int32_t* idx, const float* sink, const float* o,
                               const float* lse, const float* dO, float* dq, float* dkv, float* dsink,
                               float* workspace) = 0;
  virtual void scale(float* x, int64_t n, float a) = 0;
  virtual void v4_key_offsets(const V4KeyShape& s, const int32_t* seg, const int32_t* cnt, const int32_t* sel,
                              int64_t* off) = 0;
  virtual void v4_key_fill(const V4KeyShape& s, const int32_t* seg, const int32_t* cnt, const int32_t* sel,
                           const int64_t* off, int32_t* idx) = 0;
};

// The spelling of a device: "cpu" (*cuda_index = -1), "cuda" (0) or "cuda:N" (N in 0..1023).
// False for anything else.
bool parse_device_name(std::string_view device, int* cuda_index);
// "cpu" or "cuda" (-> the first CUDA device, or "cuda:N"). Throws trex::Error naming the value
// and why it cannot be used: unknown name, trex built without CUDA, no CUDA device.
std::unique_ptr<Backend> make_backend(std::string_view device);
std::unique_ptr<Backend> make_cpu_backend();
// Defined by kernels/cuda/backend_cuda.cu, or by kernels/nocuda/backend_nocuda.cpp in a build
// without CUDA. cuda_available() says whether make_cuda_backend can succeed, and if not, why.
std::unique_ptr<Backend> make_cuda_backend(int device);
bool cuda_available(std::string* why);

// Owns n elements of T in a backend's memory.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Backend& be, size_t n) : be_(&be), n_(n), p_(n ? static_cast<T*>(be.alloc(n * sizeof(T))) : nullptr) {}
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : be_(o.be_), n_(o.n_), p_(o.p_) { o.p_ = nullptr; o.n_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      be_ = o.be_, n_ = o.n_, p_ = o.p_;
      o.p_ = nullptr, o.n_ = 0;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return p_; }
  size_t size() const { return n_; }
  void upload(const T* host) { if (n_) be_->to_device(p_, host, n_ * sizeof(T)); }
  void download(T* host) const { if (n_) be_->to_host(host, p_, n_ * sizeof(T)); }
  void reset() {
    if (p_) be_->release(p_);
    p_ = nullptr;
    n_ = 0;
  }

 private:
  Backend* be_ = nullptr;
  size_t n_ = 0;
  T* p_ = nullptr;
};

}  // namespace trex::kern
