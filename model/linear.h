// Linear layers (no bias) over a token-major activation: y = x @ W^T with W [out, in] as stored
// in Hugging Face checkpoints. Precision: F32 runs f32 GEMMs; BF16 feeds the GEMM bf16 copies
// of x and W (W from the bf16 shadow refreshed after each optimizer step) and accumulates in f32.
// Parameter gradients accumulate (dW +=); activation gradients overwrite unless `dx_accum`.
#pragma once
#include <cstdint>
#include "core/dtype.h"
#include "core/profile.h"
#include "core/stack_arena.h"
#include "core/error.h"
#include "kernels/backend.h"
#include "kernels/gemm.h"

namespace trex::model {

// What a module's forward / backward runs with: the precision, scratch, an optional profiler and
// the backend (kernels/backend.h) whose kernel table does the math. The model owns the backend
// (Model::backend()); every Ctx a model builds points at it. Activations and ws are the backend's
// memory; what the host computes itself (routing, the sort by expert) lives in hs, and host() /
// device() move arrays between the two (no copy where the host can address the backend's memory).
struct Ctx {
  kern::Prec prec = kern::Prec::F32;
  StackArena* ws = nullptr;  // scratch for bf16 copies and temporaries (backend memory)
  Profiler* prof = nullptr;  // optional timing of named regions
  kern::Backend* be = nullptr;
  StackArena* hs = nullptr;  // host scratch; null: ws (a backend the host can address)
  // Generation (model/generate.h): the forward GEMMs give each row what it gets alone, whatever
  // the other rows of the call (kernels/gemm.h: gemm_rows_invariant; host memory only).
  bool rows_invariant = false;
  kern::Backend& k() const {
    TREX_CHECK(be, "model::Ctx without a backend");
    return *be;
  }
  bool host_memory() const { return k().host_addressable(); }
  StackArena& host_ws() const { return hs ? *hs : *ws; }
  // x [n] of backend memory readable by the host: x itself, or a copy in hs (waits for the work so far).
  template <class T>
  T* host(const T* x, int64_t n) const {
    if (host_memory()) return const_cast<T*>(x);
    T* h = hs->alloc<T>((size_t)n);
    if (n) k().to_host(h, x, (size_t)n * sizeof(T));
    return h;
  }
  // x [n] of host memory as backend memory: x itself, or a copy in ws.
  template <class T>
  T* device(const T* x, int64_t n) const {
    if (host_memory()) return const_cast<T*>(x);
    T* d = ws->alloc<T>((size_t)n);
    if (n) k().to_device(d, x, (size_t)n * sizeof(T));
    return d;
  }
};

// Weight pointers of one matrix: f32 master and (in bf16 mode) its bf16 shadow. ld is the row
// stride of the weight (and of its gradient) in elements, 0 = `in`: a column slice of a wider
// matrix (a row-parallel linear under tensor parallelism) is a pointer to its first column with
// ld = the full width.
struct W {
  const float* f = nullptr;
  const bf16* b = nullptr;
  int64_t ld = 0;
};

// Tensor-parallel slice of a layer: this rank computes part `rank` of `size` equal parts (heads,
// output groups or MLP columns). size 1 = the whole layer. held: the model's layout holds only
// this part of the split tensors (model/params.h TpShard), so they start at their own offsets
// with the slice's row length; else they are whole and the slice is found inside them.
struct TpSlice {
  int64_t rank = 0, size = 1;
  bool held = false;
  bool on() const { return size > 1; }
};

// The input x of a linear: its f32 values, and optionally b, their bf16 copy (round to nearest even,
// as the linears make it) made once by a caller that feeds x to several linears; BF16 runs then
// take b instead of rounding x again. b is ignored by F32 runs.
struct Act {
  const float* f = nullptr;
  const bf16* b = nullptr;
  Act(const float* x) : f(x) {}  // NOLINT(google-explicit-constructor): a plain f32 input
  Act(const float* x, const bf16* xb) : f(x), b(xb) {}
};
// x [n] with its bf16 copy from c.ws when c.prec is BF16 (else x alone).
Act act_with_bf16(const Ctx& c, const float* x, int64_t n);

// x: [N, in]  W: [out, in]  ->  y: [N, out] with row stride ldy (0 = out)  (y = beta*y + x @ W^T)
void linear_fwd(const Ctx&, Act x, int64_t N, int64_t in, W w, int64_t out, float* y, float beta = 0.f,
                int64_t ldy = 0);
// dy: [N, out] (row stride ldy, 0 = out)  x: [N, in]  ->  dx: [N, in] (= or += dy @ W; skipped if
// null), dW: [out, in] (row stride w.ld) += dy^T @ x (skipped if null)
void linear_bwd(const Ctx&, const float* dy, Act x, int64_t N, int64_t in, W w, int64_t out, float* dx,
                bool dx_accum, float* dW, int64_t ldy = 0);

// Forward GEMMs through c: C = A @ B^T (+ beta C), A stored [M, K], B [N, K] (a weight), on the
// backend, or in the row-invariant form when c.rows_invariant (kernels/gemm.h).
void gemm_fwd(const Ctx& c, kern::Prec pa, kern::Prec pb, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda,
              const void* B, int64_t ldb, float beta, float* C, int64_t ldc);
void grouped_gemm_fwd(const Ctx& c, kern::Prec prec, float beta, const kern::GemmGroup* groups, int n_groups);

// Converts n floats to bf16 (round to nearest even), threaded (host memory).
void to_bf16(const float* x, bf16* y, int64_t n);

// A GEMM operand of n floats: x itself (F32), or a bf16 copy from c.ws (BF16 mode).
const void* gemm_input(const Ctx& c, const float* x, int64_t n);

}  // namespace trex::model
