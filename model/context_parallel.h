// Context parallelism (Megatron-Core's --context-parallel-size, torchtitan's context_parallel):
// the cp ranks of a data rank all receive the same micro-batch, and each computes on its share of
// every sequence. The T positions of a row are cut into 2 cp chunks of c = T / (2 cp); cp rank r
// holds chunks r and 2 cp - 1 - r (zigzag: the early chunk sees few keys, the late one many, so
// every rank does the same causal attention work). Everything per token (embedding, norms, MLP,
// MoE, head and loss, MTP) runs on the local B x 2c tokens; only the attention needs the others:
// MLA all-gathers the per-token inputs of its key / value up-projection (the normalized latent
// and the roped k_pe, kv_lora_rank + qk_rope_head_dim floats a token) over the cp group,
// up-projects every key and value locally, and attends its queries to the keys before them
// (kernels/attention_cp.h); its backward reduce-scatters their gradients back to the owners.
// DeepSeek-V3.2 also all-gathers the lightning indexer's keys (index_head_dim floats a token), so
// each local query ranks every key of its document before it (model/v32_indexer.h).
// Tensor parallel: the cp group is the ranks of one tp rank (parallel/dims.h), each gathering the
// latents its heads read; the latent's gradient is partial over tp and the cp reduce-scatter
// (linear) keeps it so, the tp reduction of the layer's input gradient completes it. DeepSeek-V4
// the same way (model/v4_context_parallel.h): each tp rank gathers the key side over its cp group.
//
// Local token order: row b of the local batch is [chunk r | chunk 2 cp - 1 - r] of row b.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "core/stack_arena.h"
#include "model/config.h"
#include "model/linear.h"
#include "parallel/comm.h"

namespace trex::model {

struct Batch;

struct ContextParallel {
  parallel::Communicator* comm = nullptr;  // cp group (null: off)
  int rank = 0, size = 1;
  mutable double wait_ms = 0;  // time blocked in the cp collectives
  bool on() const { return comm != nullptr; }
};

// The zigzag split of rows of T positions over `size` ranks (T a multiple of 2 size).
struct CpSplit {
  int64_t T = 0, c = 0;  // sequence length, chunk length T / (2 size)
  int rank = 0, size = 1;
  int64_t local() const { return 2 * c; }  // positions of a row held per rank
  // Sequence index of local position j of rank r.
  int64_t index(int r, int64_t j) const { return j < c ? r * c + j : (2 * size - 1 - r) * c + (j - c); }
  int64_t index(int64_t j) const { return index(rank, j); }
};
CpSplit cp_split(int64_t T, const ContextParallel& cp);

// The part of a micro-batch one cp rank computes on: [B, 2c] ids, targets, positions (the
// tokens' own: b.pos, else their sequence index) and document ids (null without b.seg), the
// sequence index of each local position ([2c], for the attention) and the flat [B T] index of
// each local token ([B 2c], for the MTP inputs).
struct CpBatch {
  std::vector<int32_t> ids, targets, pos, seg, qidx;
  std::vector<int64_t> flat;
  int64_t B = 0, T = 0;
};
CpBatch cp_local_batch(const Batch& full, const CpSplit& s);

// What the MLA attention needs of context parallelism (AttnIn::cp).
struct CpAttn {
  const ContextParallel* cp = nullptr;
  CpSplit split;
  const int32_t* qidx = nullptr;      // [2c] sequence index of each local position
  const int32_t* seg_full = nullptr;  // [B, T] the whole rows' document ids, or null
};

// local: [B, 2c, w] on every cp rank -> full: [B, T, w], every rank's chunks in sequence order.
void cp_all_gather(const ContextParallel& cp, const CpSplit& s, int64_t B, const float* local, float* full, int64_t w,
                   StackArena& A);
// cp_all_gather in two halves, so that work that does not need the keys runs while the
// collective is in flight (MLA: the query projection). start copies local into a buffer from A
// and starts the all-gather; finish waits (cp.wait_ms) and writes full. Allocate what the work in
// between keeps before start: A must not be released below the buffer until finish.
struct CpGather {
  parallel::Handle h;
  float* buf = nullptr;  // [size][B][2c][w]
  int64_t B = 0, w = 0;
};
CpGather cp_all_gather_start(const ContextParallel& cp, const CpSplit& s, int64_t B, const float* local, int64_t w,
                             StackArena& A);
void cp_all_gather_finish(const ContextParallel& cp, const CpSplit& s, CpGather& g, float* full);
// full: [B, T, w], a partial sum on every cp rank -> local: [B, 2c, w] = the sum over the cp ranks
// of this rank's chunks (the adjoint of cp_all_gather).
void cp_reduce_scatter(const ContextParallel& cp, const CpSplit& s, int64_t B, const float* full, float* local,
                       int64_t w, StackArena& A);

// Several per-token tensors exchanged in one collective travel packed side by side: rows of
// [rows, w] with w the sum of the parts' columns. A part is [rows, cols] with contiguous rows; a
// part of 0 columns is skipped (its pointer may be null).
struct ColsIn {
  const float* p;
  int64_t cols;
};
struct ColsOut {
  float* p;
  int64_t cols;
};
// dst [rows, w] <- the parts side by side.
void pack_cols(const Ctx& c, float* dst, int64_t w, int64_t rows, std::initializer_list<ColsIn> parts);
// The parts <- src [rows, w], side by side.
void unpack_cols(const Ctx& c, const float* src, int64_t w, int64_t rows, std::initializer_list<ColsOut> parts);

// Throws trex::UserError (naming parallel.cp, the value and what to do) when cp < 1. Every model
// family runs context parallel, with tensor parallelism and DeepSeek-V4's indexer loss too.
void check_context_parallel(int cp);
// The same for a sequence length: T must be a multiple of 2 cp.
void check_cp_seq_len(int64_t T, int cp, const char* field);

}  // namespace trex::model
