// Where the routed rows of a MoE layer (model/moe.h) are computed: one interface, one
// implementation per way of moving rows (DeepEP / Megatron-Core token dispatcher style).
//
// Row orders. "Sorted": this rank's (token, slot) rows sorted by global expert (Dispatch), R = N K
// of them. "Local": the rows this rank's experts compute, expert major, Rl of them; each local
// expert's rows are contiguous for the grouped GEMM. Dispatch moves sorted rows to the local order
// (possibly to other ranks), combine moves local rows back (its adjoint); the backward uses the
// same pair in the same direction (output gradients out along dispatch, input gradients back along
// combine).
//
//  - LocalDispatcher: every routed expert on this rank. Local order = sorted order; nothing moves.
//  - AllToAllDispatcher: the routed experts split over the ep group in equal contiguous ranges. The
//    per-expert row counts are exchanged first (plan), the rows travel over all-to-all-v.
//    "Received" order: source rank major, inside each source by local expert; the local order is
//    expert major, source rank minor.
// Collective implementations must be called by every rank of their group in the same order.
#pragma once
#include <cstdint>
#include <vector>
#include "core/stack_arena.h"
#include "parallel/comm.h"

namespace trex::model {

// The dispatch handle of a layer: this rank's rows sorted by expert.
struct Dispatch {
  std::vector<int64_t> offsets;  // [E + 1] first sorted row of each expert (the host's copy)
  const int32_t* row_token_dev = nullptr;  // [N*K] token of each sorted row (backend memory)
  const int32_t* slot_row_dev = nullptr;   // [N*K] sorted row of token n's k-th slot (n*K + k) (backend memory)
};

// The expert-parallel group of this rank. comm == null: every expert here.
struct ExpertParallel {
  parallel::Communicator* comm = nullptr;  // ep group, size ep
  int64_t first = 0, count = 0;            // routed experts computed here: [first, first + count)
  int64_t slab_first = 0;                  // the first expert in the slab (first when it is expert-sharded, else 0)
  mutable double wait_ms = 0;              // time blocked in the count exchange, dispatch and combine
  bool on() const { return comm != nullptr; }
};

// What one layer's dispatch does (made by MoeDispatcher::plan, kept for the backward).
struct MoeRoute {
  std::vector<int64_t> offsets;  // [El + 1] local order: first row of each local expert
  int64_t first = 0;             // the first routed expert computed here
  int64_t rows = 0;              // Rl: rows computed here
  float* inputs = nullptr;       // [Rl, d] local input rows kept for the backward (null: gathered again)
  // All-to-all only: rows to / from each rank, and the received -> local permutation.
  std::vector<size_t> send_rows, send_off;  // [ep] rows to / first sorted row for each rank
  std::vector<size_t> recv_rows, recv_off;  // [ep] rows from / first received row of each rank
  int32_t* perm = nullptr;                  // [Rl] local row -> received row
};

// One dispatch in flight: its local rows are valid after MoeDispatcher::wait.
struct MoeExchange {
  float* local = nullptr;        // [Rl, w] local rows
  float* recv = nullptr;         // [Rl, w] received order (all-to-all; reused by combine)
  parallel::Handle handle;
};

class MoeDispatcher {
 public:
  virtual ~MoeDispatcher() = default;
  // Fills r from this rank's sorted offsets [E + 1]; the route's own arrays (and r.inputs, [Rl, d],
  // where this dispatcher keeps the forward's local inputs) come from A and live as long as the
  // layer's saved activations. Collective for AllToAll.
  virtual void plan(const std::vector<int64_t>& offsets, int64_t d, StackArena& A, MoeRoute& r) const = 0;
  // Starts moving sorted [R, w] to the local order: into dst [Rl, w] when rows move (dst null:
  // scratch from A), else the local rows are `sorted` itself. Scratch comes from A.
  virtual MoeExchange dispatch(const MoeRoute& r, float* sorted, float* dst, int64_t w,
                               StackArena& A) const = 0;
  // Waits for the dispatch (the caller overlaps other work before it).
  virtual void wait(const MoeRoute& r, MoeExchange& x, int64_t w) const = 0;
  // Where the experts write their output rows [Rl, w] for combine: `sorted` itself when nothing
  // moves, else scratch from A.
  virtual float* output_rows(const MoeRoute& r, float* sorted, int64_t w, StackArena& A) const = 0;
  // Moves local rows [Rl, w] (from output_rows) back to sorted [R, w]; x: the layer's exchange of
  // this direction (its receive buffer is reused). Blocking.
  virtual void combine(const MoeRoute& r, MoeExchange& x, const float* local, float* sorted, int64_t w) const = 0;
  // The forward's local input rows [Rl, d] for the weight gradients: r.inputs, or null when the
  // caller gathers them again from x [N, d] by D (kern::gather_rows).
  virtual const float* saved_inputs(const MoeRoute& r, const Dispatch& D, const float* x, int64_t d,
                                    StackArena& A) const = 0;
  // True when dispatch and combine move rows between ranks: the layer then runs its shared
  // experts while the rows are in flight (their saved activations allocated before the exchange's
  // scratch); false: it runs them after the routed experts, reusing the routed experts' scratch.
  virtual bool in_flight() const = 0;
};

// Every routed expert on this rank.
class LocalDispatcher final : public MoeDispatcher {
 public:
  void plan(const std::vector<int64_t>& offsets, int64_t d, StackArena& A, MoeRoute& r) const override;
  MoeExchange dispatch(const MoeRoute& r, float* sorted, float* dst, int64_t w, StackArena& A) const override;
  void wait(const MoeRoute& r, MoeExchange& x, int64_t w) const override;
  float* output_rows(const MoeRoute& r, float* sorted, int64_t w, StackArena& A) const override;
  void combine(const MoeRoute& r, MoeExchange& x, const float* local, float* sorted, int64_t w) const override;
  const float* saved_inputs(const MoeRoute& r, const Dispatch& D, const float* x, int64_t d,
                            StackArena& A) const override;
  bool in_flight() const override { return false; }
};

// The routed experts split over ep.comm (ep.first / ep.count: this rank's range).
class AllToAllDispatcher final : public MoeDispatcher {
 public:
  explicit AllToAllDispatcher(const ExpertParallel& ep) : ep_(ep) {}
  void plan(const std::vector<int64_t>& offsets, int64_t d, StackArena& A, MoeRoute& r) const override;
  MoeExchange dispatch(const MoeRoute& r, float* sorted, float* dst, int64_t w, StackArena& A) const override;
  void wait(const MoeRoute& r, MoeExchange& x, int64_t w) const override;
  float* output_rows(const MoeRoute& r, float* sorted, int64_t w, StackArena& A) const override;
  void combine(const MoeRoute& r, MoeExchange& x, const float* local, float* sorted, int64_t w) const override;
  const float* saved_inputs(const MoeRoute& r, const Dispatch& D, const float* x, int64_t d,
                            StackArena& A) const override;
  bool in_flight() const override { return true; }

 private:
  const ExpertParallel& ep_;
};

// kern::moe_sort (kernels/router.h) into a vector of offsets, on host memory; load [E] (if set) +=
// the rows of each expert. (moe_forward runs the backend's moe_sort.)
void moe_sort(const int32_t* idx, int64_t N, int64_t K, int64_t E, std::vector<int64_t>& offsets,
              int32_t* row_token, int32_t* slot_row, int64_t* load);

}  // namespace trex::model
