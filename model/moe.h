// DeepSeekMoE layer in named stages: route -> dispatch (permute tokens so each expert's rows are
// contiguous) -> grouped expert GEMMs (gate|up, SwiGLU, down) -> combine (probability-weighted
// sum back to token order), plus the shared experts on every token. Dispatch and combine are
// each other's adjoint and share one handle (the routing map and the row permutation).
// Dropless: every (token, slot) pair is computed. Parameter gradients accumulate.
//
// Expert parallel (MoeIn::ep set): the routed experts are split over the ranks of the ep group
// in equal contiguous ranges; each rank routes its own tokens, the per-expert row counts are
// exchanged first, then the sorted rows travel to the rank holding their expert over
// all-to-all-v (dispatch), the local experts run on the rows of every rank, and the outputs come
// back the same way (combine). The shared experts run while the dispatch is in flight. Backward
// is the adjoint: the output gradients go out along the dispatch route and the input gradients
// come back along the combine route. Gradients land only in the local experts' slab ranges.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>
#include "model/config.h"
#include "model/linear.h"
#include "model/mlp.h"
#include "model/params.h"
#include "model/router.h"

namespace trex::parallel {
class Communicator;
}

namespace trex::model {

// The expert-parallel group of this rank (model/moe_ep.cpp). comm == null: every expert here.
struct ExpertParallel {
  parallel::Communicator* comm = nullptr;  // ep group, size ep
  int64_t first = 0, count = 0;            // routed experts computed here: [first, first + count)
  int64_t slab_first = 0;                  // the first expert in the slab (first when it is expert-sharded, else 0)
  mutable double wait_ms = 0;              // time blocked in the count exchange, dispatch and combine
  bool on() const { return comm != nullptr; }
};

// What one MoE layer's dispatch over the ep group did (rows are (token, slot) pairs).
struct EpRoute {
  std::vector<size_t> send_rows, send_off;  // [ep] rows to / first sorted row for each rank
  std::vector<size_t> recv_rows, recv_off;  // [ep] rows from / first received row of each rank
  std::vector<int64_t> offsets;             // [count + 1] local order: rows of each local expert
  int32_t* perm = nullptr;                  // [Rl] local row -> received row
  int64_t Rl = 0;                           // rows computed here
  float* xl = nullptr;                      // [Rl, d] received inputs in local order (dW of gate|up)
};

// The dispatch handle: rows sorted by expert.
struct Dispatch {
  std::vector<int64_t> offsets;  // [E + 1] first row of each expert
  int32_t* row_token = nullptr;  // [N*K] token of each sorted row
  int32_t* slot_row = nullptr;   // [N*K] sorted row of token n's k-th slot (n*K + k)
};

struct MoeSaved {
  const float* x = nullptr;  // [N, d]
  RouterOut route;
  Dispatch disp;
  float* gu = nullptr;  // [N*K, 2F] sorted rows (expert parallel: [Rl, 2F] local rows)
  float* h = nullptr;   // [N*K, F]             (expert parallel: [Rl, F])
  float* y = nullptr;   // [N*K, d] expert outputs before weighting, sorted rows
  MlpSaved shared;
  EpRoute ep;           // expert parallel only
};

struct MoeIn {
  const ModelConfig* cfg;
  const LayerParams* p;
  const float* P;
  const bf16* Pb;
  float* G;
  const float* bias;  // [E] e_score_correction_bias
  int64_t B, T;
  double aux_alpha = 0;   // sequence-wise aux loss coefficient (0 = off)
  float aux_grad_scale = 1.f;
  const int32_t* hash_idx = nullptr;  // [N, K] fixed experts (DeepSeek-V4 hash layers) or null
  float swiglu_limit = 0.f;           // clamp of routed and shared experts (V4), 0 = none
  const ExpertParallel* ep = nullptr;  // expert parallel (collective: every rank of the group calls)
  // Sequence parallel (model/seq_parallel.h): x holds the token rows [n0, n0 + rows) of the B x T
  // batch (rows < 0: all B T of them) and seq_sum sums the aux loss's [B, E] selection counts over
  // the shards (a collective of the tp group); the aux loss returned is this shard's part.
  int64_t n0 = 0, rows = -1;
  std::function<void(double*, size_t)> seq_sum;
  int64_t tokens() const { return rows >= 0 ? rows : B * T; }
};

// The row operations of a layer around its experts (R = N K rows; also timed alone by
// trex bench kernels, cli/bench_kernels_rows.cpp).
// Counting sort of the (token, slot) pairs by expert idx [R], stable in token order: offsets
// [E + 1], row_token [R], slot_row [R] (Dispatch); load [E] (if set) += the rows of each expert.
void moe_sort(const int32_t* idx, int64_t N, int64_t K, int64_t E, std::vector<int64_t>& offsets,
              int32_t* row_token, int32_t* slot_row, int64_t* load);
// xs [R, d] = x [row_token[r]] (the token of every sorted row).
void moe_gather(const float* x, const int32_t* row_token, int64_t R, int64_t d, float* xs);
// out [N, d] += sum_k probs[n K + k] y[slot_row[n K + k]] (slot order per token).
void moe_combine(const float* y, const float* probs, const int32_t* slot_row, int64_t N, int64_t K, int64_t d,
                 float* out);
// The combine's adjoint: dy[slot_row[n K + k]] = probs[n K + k] dout[n] and
// dprobs[n K + k] = dout[n] . y[slot_row[n K + k]].
void moe_combine_bwd(const float* dout, const float* y, const float* probs, const int32_t* slot_row, int64_t N,
                     int64_t K, int64_t d, float* dy, float* dprobs);
// The dispatch's adjoint: dx [N, d] += sum_k dxs[slot_row[n K + k]] (fixed slot order).
void moe_dispatch_bwd(const float* dxs, const int32_t* slot_row, int64_t N, int64_t K, int64_t d, float* dx);

// x: [N, d] -> out: [N, d]; returns the aux loss (0 when off); adds expert loads into `load` [E].
double moe_forward(const Ctx&, const MoeIn&, const float* x, float* out, MoeSaved& s, int64_t* load);
// dout: [N, d] -> dx: [N, d] (overwrite)
void moe_backward(const Ctx&, const MoeIn&, const MoeSaved& s, const float* dout, float* dx);

}  // namespace trex::model
