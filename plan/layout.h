// A parallel layout and run shape: dp x cp x tp x pp devices (ep and etp carved out of
// dp x cp x tp, as Megatron-Core does: the expert data-parallel size is
// edp = dp * cp * tp / (ep * etp)), batch shape, recompute, ZeRO stage, pipeline schedule,
// precision and overlap flags. Context parallelism (cp): each sequence is cut in 2 cp chunks and
// cp rank r holds chunks r and 2cp-1-r (balanced causal work); the ranks of a cp group exchange
// what attention needs (cp_exchange_elems, plan/arch.h), and every parameter is replicated over
// cp, so gradients are reduced (and ZeRO shards cut) over dp x cp. Rank order: tp fastest, then
// cp, then dp, then pp. Validation names the product or divisibility that fails.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include "plan/arch.h"

namespace trex::plan {

enum class Recompute { None, Selective, Full };
enum class Schedule { OneF1B, DualPipe };
// GEMM recipes (plan/precision.h): fp8 = DeepSeek-V3's 1x128 / 128x128 block scaling.
enum class Precision { BF16, FP8, FP8Tensor, MXFP8, MXFP4 };
// CUDA graphs (plan/host.h): off (every kernel launched eagerly), partial (Megatron-Core's
// `attn moe_router moe_preprocess` scope: attention, router, preprocess and shared experts
// captured; the routed experts eager), full (the whole iteration captured: needs a sync-free MoE).
enum class Graphs { Off, Partial, Full };
const char* recompute_name(Recompute r);
const char* schedule_name(Schedule s);
const char* precision_name(Precision p);
const char* graphs_name(Graphs g);

struct Layout {
  int64_t dp = 0;   // 0: devices / (tp * pp * cp)
  int64_t tp = 1, pp = 1, ep = 1;
  int64_t cp = 1;   // context parallel: ranks sharing each sequence
  int64_t etp = 1;  // expert tensor parallel (experts split over etp ranks of an ep group)
  int64_t mbs = 1;  // sequences per micro-batch
  int64_t gbs = 0;  // sequences per optimizer step; 0: 4 x devices
  int64_t seq = 4096;
  Recompute recompute = Recompute::None;
  // Megatron-Core's `mlp moe_act` recompute modules (recompute=mlp, or selective+mlp): the dense
  // MLP is replayed in the backward (its fc1 output and SwiGLU output not kept) and the routed
  // experts' SwiGLU output is recomputed. Ignored under full recompute.
  bool recompute_mlp = false;
  int zero = 1;     // 0 replicated, 1 optimizer state, 2 + gradients, 3 + parameters sharded over dp
  Schedule schedule = Schedule::OneF1B;
  Graphs graphs = Graphs::Off;  // CUDA graphs: off | partial | full (plan/host.h)
  Precision precision = Precision::BF16;  // bf16 | fp8 (block) | fp8-tensor | mxfp8 | mxfp4 (plan/precision.h)
  // Interleaved 1F1B: model chunks per pipeline rank (Megatron's virtual pipeline size); the
  // bubble is (pp-1)/vp micro-batch times and the pipeline transfers are vp times as many.
  int64_t vp = 1;
  bool overlap_ep = true, overlap_tp = false, overlap_dp = true, overlap_pp = false;
  bool overlap_cp = true;  // the cp exchange behind the attention (ring attention's p2p overlap)
  // With overlap_dp: the updated parameters' all-gather runs behind the next forward (Megatron-
  // Core); false: the step waits for it (trex's data parallel today, train/dist.h; Megatron-Bridge's
  // DeepSeek-V3 MXFP8 recipes of December 2025 turned it off). `--layout param_gather=overlap|exposed`.
  bool overlap_param_gather = true;
  bool mtp = false;          // train the checkpoint's MTP modules too
  // Train the sparse-attention indexer with its KL loss (DeepSeek-V3.2 / V4; trex's
  // train.indexer_loss_weight > 0, Megatron-Core's dsa_indexer_loss_coeff): the indexer's scoring
  // and projections get a backward and the main attention's scores over the selected keys are
  // computed again for the loss's target. `--layout indexer_loss=0|1`.
  bool indexer_loss = false;
  int grad_bytes = 4;        // main gradients (f32) that the optimizer reads and DP reduces
  int moment_bytes = 4;      // AdamW moments (f32; DeepSeek-V3 used bf16)
  bool ep_dedup = true;      // DeepEP-style: a token crosses to a remote node once, then fans out
  double expert_load = 1.0;  // busiest expert rank's tokens over the mean (1 = balanced routing)

  int64_t world() const { return dp * cp * tp * pp; }
  int64_t edp() const { return dp * cp * tp / (ep * etp); }
  int64_t dpcp() const { return dp * cp; }  // the ranks a dense gradient is reduced over (and ZeRO shards)
  // Tokens of one micro-batch on one device: its cp share, its tp share (sequence parallel).
  double local_tokens() const { return (double)mbs * (double)seq / (double)(tp * cp); }
  int64_t micro_batches() const { return gbs / (dp * mbs); }
  int64_t tokens_per_step() const { return gbs * seq; }
};

std::string recompute_label(const Layout& l);  // "selective", "mlp", "selective+mlp", ...

// Parses "dp=8,tp=2,pp=4,ep=8,cp=1,mbs=1,gbs=512,seq=4096,recompute=selective,zero=1,
// schedule=1f1b,vp=1,precision=bf16,overlap=ep+dp,mtp=0,moments=f32,grads=f32,dedup=1,expert_load=1.1,
// indexer_loss=0"
// on top of `base`; any subset of keys, any order.
Layout parse_layout(const std::string& s, Layout base);
std::string layout_string(const Layout& l);
// The keys a layout string sets (aliases normalized: micro_batch -> mbs, global_batch -> gbs).
std::vector<std::string> layout_keys(const std::string& s);

// Every violated constraint, each naming what fails; empty when the layout is valid. `l.dp` and
// `l.gbs` are derived first when 0.
std::vector<std::string> layout_problems(Layout& l, const ArchModel& a, int64_t devices);
// Derives dp / gbs and throws UserError with the first problem (all of them in the message).
void validate_layout(Layout& l, const ArchModel& a, int64_t devices);

// Decoder layers per pipeline stage: the contiguous split that minimizes the heaviest stage (then
// the spread), a stage weighing the sum of its layers' weights plus `first_extra` on the first
// stage (embedding) and `last_extra` on the last (head, MTP). Every stage holds >= 1 layer.
// paired (DualPipe): then single layers move between neighbouring stages while that lowers the
// heaviest rank, rank r running stages r and pp-1-r.
std::vector<int64_t> stage_layers(const std::vector<double>& layer_weight, double first_extra, double last_extra,
                                  int64_t pp, bool paired = false);

// One pipeline stage's share of the model.
struct Chunk {
  int64_t stage = 0, first_layer = 0, n_layers = 0;
  bool embed = false, head = false;  // first stage: embedding; last stage: final norm, head (and MTP)
};
// Stages pipeline rank r runs: {r} under 1F1B, {r, pp-1-r} under DualPipe (two directions).
std::vector<int64_t> rank_chunks(const Layout& l, int64_t r);

}  // namespace trex::plan
