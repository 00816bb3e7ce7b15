// The peak of the activation arena (Model::acts) over one training step, computed from the
// config: what train/preflight.h's start-up memory check and `trex bench step` report as the
// activation estimate.
#pragma once
#include <cstdint>
#include "kernels/gemm.h"
#include "model/config.h"
#include "model/model.h"
#include "model/params.h"

namespace trex::train {

// Peak bytes of the activation arena (Model::acts, core/stack_arena.h) over one forward_backward
// of B x T tokens: the step's arena allocations replayed on sizes alone, in the engine's order
// (model/model.cpp run, model/model_v4.cpp run_v4 and the modules they call). A formula of the
// config, not a measurement:
//   - live bytes = every saved activation of the layers passed so far (under full recompute only
//     each layer's kept input [N, d] or V4 streams [N, n, d]; the replayed layer's set is rebuilt
//     inside the backward's mark; under selective recompute of "moe" (recompute Selective with
//     ix.recompute_modules holding model::kRecomputeMoe) no MoE block's activations, one block's
//     rebuilt inside its layer's backward; with "moe_act" (model::kRecomputeMoeAct) no routed
//     experts' h, a scratch one in their forward and backward; with "moe_out"
//     (kRecomputeMoeOut) no routed experts' outputs y, scratch in their forward; with "shared_experts"
//     (kRecomputeSharedExperts) no shared experts' gu and h, scratch in their forward and
//     backward; on DeepSeek-V4 with
//     "mla_up_proj" (kRecomputeMlaUpProj) no q_b output, with "mhc" (kRecomputeMhc) no mid-layer
//     streams and no mix inputs / logits, each rebuilt as scratch in the layer's backward)
//     + the transients of the point
//     reached: the bf16 copies of GEMM
//     inputs (bf16 runs), the LM head / cross-entropy workspace (kern::lm_head_ce_workspace_floats),
//     the backward's gradient buffers, the attention, indexer, compressor and hyper-connection
//     workspaces (their kernels' *_workspace_floats);
//   - MoE: N x top_k token-sorted rows (dropless, so exact on one rank); under expert parallel the
//     rows a rank receives depend on the routing and the estimate takes their expectation, N x top_k
//     (the busiest rank of an unbalanced routing sits above it);
//   - DeepSeek-V4 key lists: one document per row (packed rows attend fewer keys: an upper bound);
//   - every allocation rounded up to 64 bytes (host memory holds the arena as one contiguous
//     stack: the bytes in use are the allocations not yet released);
//   the peak is the maximum over the forward and the backward of the bytes in use.
// c: the config as Model holds it (with_mtp applied when the run trains MTP blocks); tp / ep:
// tensor / expert parallel sizes (this rank's heads, output groups and dense MLP columns);
// sequence_parallel (tp > 1): everything outside the attention and the dense MLPs on the rank's
// shard of the B x T tokens, ceil(B T / tp) rows (rank 0's, the largest), plus the all-gathered
// inputs and partial outputs of the split blocks and, for uneven shards, the collectives' padded
// workspace (model/seq_parallel.h).
// stage (pipeline parallel): one stage_forward_backward of that stage (model/model.h; the
// pipeline's forward-only calls stay below it): its layers, the head and V4's MTP blocks on the
// last stage; the stage inputs of the micro-batches in flight are held outside the arena
// (train/pipeline.cpp) and not counted.
// ix: the run's indexer options (train.indexer_loss_weight / indexer_stage / indexer_recall): on
// DeepSeek-V4 the CSA layers' indexer loss adds its saved pairs (one int32 entry and one float per
// attended (query, compressed entry) pair, and the pair offsets), the recomputed projections of its
// forward and backward, and the dense warm-up attends every visible compressed entry.
// DeepSeek-V3.2: the indexer's selection scratch, the key lists (one document a row: packed rows
// attend fewer keys, an upper bound) and the padded rows of the sparse attention; with the indexer
// loss its kept pairs and recomputed projections.
// cp > 1 (context parallel; T a multiple of 2 cp): every per-token activation on the rank's
// B x T / cp tokens; the MLA layers (DeepSeek-V3 / V3.2 / V2) also hold the gathered latents and
// rope keys and the keys and values of the whole rows ([B T, ...]), and the backward their
// gradients (model/context_parallel.h); DeepSeek-V3.2 the gathered indexer keys too, and the key
// lists of the cp rank attending the most keys. The attention kernel's scratch is thread-local,
// outside the arena.
// DeepSeek-V4 (model/v4_context_parallel.h): the key side of every attention layer on the rank's
// held rows (its tokens and their halos: kv projection, sliding KV rows, the compressors'
// projections and the indexer's, and their gradients in the backward), its own entries' pooling,
// every rank's compressed entries, and the exchanges' buffers; with the indexer loss its kept pairs
// of the rank's queries. Each cp rank's step is replayed (their held rows, entries, key lists and
// pairs differ) and the estimate is the largest rank's peak.
double activation_peak_bytes(const model::ModelConfig& c, int64_t B, int64_t T, kern::Prec prec,
                             model::Recompute recompute, int64_t tp = 1, int64_t ep = 1,
                             bool sequence_parallel = false, const model::StageShard& stage = {},
                             const model::TrainOptions& ix = {}, int64_t cp = 1);

}  // namespace trex::train
