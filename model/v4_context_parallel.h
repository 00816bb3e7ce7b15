// Context parallelism for DeepSeek-V4's attention (model/context_parallel.h has the split and the
// collectives; docs/PARALLEL.md, "Context parallelism"). Each cp rank holds the 2c local tokens of
// every row and computes their queries; the key side moves as little as the layer needs
// (V4CpKeys, the halo design):
//   sliding rows: a local chunk k (positions [k c, (k + 1) c)) attends rows back to k c - W + 1;
//             the rank receives that halo of the per-token key-side projections (kv(x) and the
//             compressor's c_kv(x) / c_gate(x), packed) from the ranks holding it, point to point
//             (one all-to-all-v; its own rows are copied, not sent), and runs kv_norm and RoPE
//             over its held rows [B, np, w] (its local rows plus the halos, np <= 2 c + 2 halo);
//   compressed entries: entry w belongs to the rank holding its window's last token (w + 1) m - 1;
//             the owner pools it from its held rows (a window crossing a rank boundary reads the
//             halo: up to cc m - 1 rows before the chunk), normalizes and ropes it; the entries of
//             every rank are then all-gathered [B, nw, hd], so every query sees each visible one;
//   the CSA indexer's keys: the same, from its own compressor's halo rows (model/v4_indexer.h).
// The backward is the adjoint: the entries' gradients (each rank's queries' share) are
// reduce-scattered to their owners, whose pooling backward adds into their held rows'
// gradients; the held rows' gradients go back to the ranks owning them in the reverse
// all-to-all-v and are summed there; the owners' projection backward gives dx and the weight
// gradients (partial on each cp rank, summed by the gradient sync). A row travels only as a halo
// (W - 1 or cc m rows before each chunk), an entry once: the exchange no longer grows with the
// sequence's length for the sliding rows, and the compressed entries are the rows m times fewer.
// Tensor parallel: the cp group is the ranks of one tp rank (parallel/dims.h). The key side runs
// in full on every tp rank (V4AttnIn::tp), so each tp rank exchanges it over its own cp group; the
// gradients returned are its heads' share, partial over tp through the (linear) exchanges, and the
// tp reduction of the layer's input gradient and of the attention's unsliced weights completes
// them, as without cp.
// The indexer's KL loss and recall (train.indexer_loss_weight, train.indexer_recall) are per
// local query, scored against every compressed entry (model/v4_indexer.h).
#pragma once
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "core/stack_arena.h"
#include "kernels/v4_rows.h"
#include "model/context_parallel.h"
#include "model/linear.h"

namespace trex::model {

// The key rows one cp rank holds for one V4 layer (sliding window W, compress rate m, cc compressor
// channels: 2 CSA, 1 HCA, 0 sliding) and the exchanges that fill them. Every rank computes every
// rank's plan (a function of the split and the layer only), so the all-to-all-v's counts agree.
struct V4CpKeys {
  int64_t T = 0, c = 0;       // the whole rows' length, the chunk length
  int64_t np = 0;             // held rows a batch row
  std::vector<int32_t> pos;   // [np] sequence index of held row j, ascending
  std::vector<int32_t> slot;  // [T] held row of sequence index u, or -1
  // Compressed entries (nw = T / m a row; 0 for sliding layers): the entries whose window's last
  // token lies in local chunk h (h = 0: chunk rank, 1: chunk 2 cp - 1 - rank) are [e0, e0 + n);
  // the owner pools them from its held rows [s0, s0 + L) (a multiple of m), whose pooled entries
  // skip .. skip + n are they (the ones before are windows of the previous chunk).
  int64_t nw = 0, emax = 0;  // entries a row; the most any chunk of any rank owns (the gather's pad)
  struct Own {
    int64_t e0 = 0, n = 0, s0 = 0, L = 0, skip = 0;
  } own[2];
  // The halo exchange, in rows of one batch row (times B w at use). To rank q: local rows
  // send_rows[send_at[q] .. send_at[q + 1]) (in the order of q's held rows); from rank q: held rows
  // recv_rows[recv_at[q] .. recv_at[q + 1]). Both include this rank itself (rank), whose block
  // pairs its local rows with their held rows and is copied directly, not sent.
  int rank = 0;
  std::vector<int32_t> send_rows, recv_rows;
  std::vector<int64_t> send_at, recv_at;
  int64_t own_rows() const { return send_at[rank + 1] - send_at[rank]; }  // the self block
  int64_t sent_rows() const { return send_at.back() - own_rows(); }      // to the other ranks
  int64_t received_rows() const { return recv_at.back() - own_rows(); }  // from them
  std::vector<int64_t> chunk_e0, chunk_n;  // [2 cp] every chunk's entries (first, count)
};
// -> the plan of rank s.rank for a layer of window W, rate m (0: sliding), cc channels.
V4CpKeys v4_cp_keys(const CpSplit& s, int64_t W, int64_t m, int cc);

// The halo exchange: local [B, 2c, w] (this rank's tokens) -> held [B, np, w].
void v4_cp_halo_gather(const ContextParallel& cp, const V4CpKeys& k, int64_t B, const float* local, float* held,
                       int64_t w, StackArena& A);
// v4_cp_halo_gather in two halves, so that work that needs neither side runs while the rows
// travel (the attention: the query projection), as MLA's cp_all_gather_start / _finish: start
// packs the rows the other ranks hold into buffers from A and starts the all-to-all-v; finish
// waits (cp.wait_ms), copies this rank's own rows and unpacks the others' into held. local must
// stay unchanged and A must not be released below the buffers until finish: allocate what the
// work in between keeps before start.
struct V4HaloMove {
  parallel::Handle h;
  float *sb = nullptr, *rb = nullptr;  // the other ranks' blocks, to send and received
  const float* from = nullptr;         // the sending side's rows (the own block is copied from it)
  int64_t B = 0, w = 0;
  bool to_held = true;
};
V4HaloMove v4_cp_halo_gather_start(const ContextParallel& cp, const V4CpKeys& k, int64_t B, const float* local,
                                   int64_t w, StackArena& A);
void v4_cp_halo_gather_finish(const ContextParallel& cp, const V4CpKeys& k, V4HaloMove& g, float* held);
// Its adjoint: held [B, np, w] (partial sums: this rank's share) -> local [B, 2c, w] = the sum over
// the cp ranks of the rows each holds of this rank's tokens (overwritten).
void v4_cp_halo_return(const ContextParallel& cp, const V4CpKeys& k, int64_t B, const float* held, float* local,
                       int64_t w, StackArena& A);
// v4_cp_halo_return of several tensors in one exchange: the held rows' [B np, cols_i] -> the local
// tokens' [B 2c, cols_i] (the same widths, in the same order), packed side by side in
// [B np, w] and [B 2c, w] from c.ws (released on return).
void v4_cp_halo_return_cols(const Ctx& c, const ContextParallel& cp, const V4CpKeys& k, int64_t B,
                            std::initializer_list<ColsIn> held, std::initializer_list<ColsOut> local);
// The entries: own [B, 2, emax, w] (this rank's, chunk h's n at [b, h, 0 .. n)) -> all [B, nw, w],
// every rank's, in order.
void v4_cp_entries_gather(const ContextParallel& cp, const V4CpKeys& k, int64_t B, const float* own, float* all,
                          int64_t w, StackArena& A);
// Its adjoint: all [B, nw, w] (partial sums) -> own [B, 2, emax, w], the sums over the cp ranks
// of this rank's entries (the padding rows 0).
void v4_cp_entries_return(const ContextParallel& cp, const V4CpKeys& k, int64_t B, const float* all, float* own,
                          int64_t w, StackArena& A);
// The sequence index of the first token of this rank's entry j of chunk h (j < emax; the
// padding's 0): [B, 2, emax] positions for RoPE (w m), host memory from A.
int32_t* v4_cp_entry_positions(const V4CpKeys& k, int64_t B, int64_t m, StackArena& A);

// The owners' pooling (kernels/compress_pool.h) over their held rows: kv, gate [B, np, cc hd] ->
// pool [B, 2, emax, hd] (the padding rows 0).
void v4_cp_pool_fwd(const Ctx& c, const V4CpKeys& k, int64_t B, int64_t m, int64_t hd, int cc, const float* kv,
                    const float* gate, const float* pb, float* pool);
// Its backward: dpool [B, 2, emax, hd] -> dkv, dgate [B, np, cc hd] (+=: two chunks' windows may
// share rows), dpb [m, cc hd] (+=).
void v4_cp_pool_bwd(const Ctx& c, const V4CpKeys& k, int64_t B, int64_t m, int64_t hd, int cc, const float* kv,
                    const float* gate, const float* pb, const float* dpool, float* dkv, float* dgate, float* dpb);

// The sequence index of each local query: [B Tl] (query i of local row i / Tl sits at
// qidx[i % Tl]), host memory from A.
int32_t* v4_cp_query_positions(const CpAttn& cp, int64_t B, StackArena& A);

// The key lists of the local queries (kernels/v4_rows.h's lists) against the held rows: ks is
// the whole rows' shape (ks.T = the sequence length, ks.nw its entries); key row b np + j is held
// row j of row b (k.pos[j]), row B np + b nw + w entry w. seg: the whole rows' documents [B, T] or
// null; cnt [Nl], sel [Nl, topk]: the indexer's selection of the local queries (Csa only).
// -> off [Nl + 1], and idx [off[Nl]] allocated from A.
void v4_cp_key_lists(const kern::V4KeyShape& ks, const CpAttn& cp, const V4CpKeys& k, const int32_t* seg,
                     const int32_t* cnt, const int32_t* sel, int64_t* off, int32_t** idx, StackArena& A);

}  // namespace trex::model
