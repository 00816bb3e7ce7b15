// Sequence parallel (Megatron-Core's --sequence-parallel) on a tensor-parallel group: outside the
// tensor-parallel blocks (attention, dense MLP) each tp rank keeps only a shard of the
// micro-batch's N = B * T tokens, so the norms, the residual stream, V4's hyper-connections, the
// MoE layers (router, experts, shared experts), the embedding and the LM head with its loss run
// on N / tp tokens instead of all N on every tp rank. Before a tensor-parallel block the shards
// are all-gathered into the whole [N, w]; after it the partial outputs are reduce-scattered
// back into the shards (the all-reduce of plain tensor parallelism, split in two). Backward is
// the adjoint: the output gradient is all-gathered, the input gradient reduce-scattered.
//
// Shards: rank r holds the contiguous token rows [n0, n0 + rows) of the flattened [B * T] batch,
// balanced (N / tp rows, the first N % tp ranks one more), so a shard may start or end inside a
// sequence. The collectives move equal blocks of `block` = ceil(N / tp) rows per rank; with N a
// multiple of tp they run in place on the [N, w] buffer, otherwise through a padded workspace.
#pragma once
#include <algorithm>
#include <cstdint>

#include "core/stack_arena.h"

namespace trex::parallel {
class Communicator;
}

namespace trex::model {

struct SeqShard {
  int64_t N = 0;      // tokens of the micro-batch
  int64_t n0 = 0;     // first token row held here
  int64_t rows = 0;   // token rows held here
  int64_t block = 0;  // rows per rank in the collectives: ceil(N / size)
  int rank = 0, size = 1;
  bool on() const { return size > 1; }
  int64_t first_of(int r) const { return r * (N / size) + std::min<int64_t>(r, N % size); }
  int64_t rows_of(int r) const { return N / size + (r < N % size ? 1 : 0); }
};

// The shard of rank `rank` of `size` for N tokens (size 1: everything).
SeqShard seq_shard(int64_t N, int rank, int size);

// local: [s.rows, w] on every rank -> full: [s.N, w], every rank's rows in token order.
// Blocking, over the tp group comm; A holds the padded workspace when N % size != 0. Adds the
// time blocked to *wait_ms.
void sp_all_gather(parallel::Communicator& comm, const SeqShard& s, const float* local, float* full, int64_t w,
                   StackArena& A, double* wait_ms);

// full: [s.N, w], a partial sum on every rank (overwritten: used as the send buffer) -> local:
// [s.rows, w] = the sum over the ranks of this rank's rows.
void sp_reduce_scatter(parallel::Communicator& comm, const SeqShard& s, float* full, float* local, int64_t w,
                       StackArena& A, double* wait_ms);

}  // namespace trex::model
