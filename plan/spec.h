// Device and cluster description for the planner (TOML): compute peaks, memory, network tiers,
// cost figures, and the per-op efficiency table the time model divides peaks by. Built-in specs
// live in plan/specs/*.toml and are compiled in (plan/builtin_specs.cpp); "cpu-this" is built
// from the calibration file that `trex bench` writes (plan/calibration.h).
//
// Units inside the program are SI: FLOP/s, bytes, bytes/s, seconds, watts, dollars.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace trex::plan {

struct ArchModel;
struct Layout;
struct RankMemory;

// Fractions of a peak a class of work reaches on this device with the software at hand. These are
// the only knobs the validation may tune (docs/PLAN.md says which and why).
struct Efficiency {
  double gemm = 0.7;              // dense bf16 GEMM, of peak_bf16
  double gemm_fp8 = 0.6;          // dense fp8 GEMM, of peak_fp8
  double grouped_gemm = 0.6;      // routed-expert grouped GEMM (bf16), of peak_bf16
  double grouped_gemm_fp8 = 0.5;  // routed-expert grouped GEMM (fp8), of peak_fp8
  double attention = 0.5;         // attention core (flash-style QK^T/PV), of peak_bf16
  // DeepSeek-V4 attention core over gathered key lists (sliding window + compressed entries) and
  // the CSA indexer's scoring, of peak_bf16; 0 = the `attention` value (specs without them).
  double sparse_attention = 0;
  double indexer = 0;
  // The LM head with its cross-entropy, forward + backward as one fused op (logit traffic
  // included), rated in 6 x tokens x vocab x hidden, of peak_bf16; 0 = the `gemm` rate plus the
  // logits' traffic at the `memory` rate (an unfused head).
  double head = 0;
  // The optimizer step (gradient norm + AdamW + bf16 copy), of memory bandwidth; 0 = `memory`.
  double optimizer = 0;
  double optimizer_or_memory() const { return optimizer > 0 ? optimizer : memory; }
  double sparse_attention_or_dense() const { return sparse_attention > 0 ? sparse_attention : attention; }
  double indexer_or_dense() const { return indexer > 0 ? indexer : attention; }
  // fp4 GEMMs (precision=mxfp4), of peak_fp4; 0 = the fp8 values.
  double gemm_fp4 = 0, grouped_gemm_fp4 = 0;
  double gemm_fp4_or_fp8() const { return gemm_fp4 > 0 ? gemm_fp4 : gemm_fp8; }
  double grouped_gemm_fp4_or_fp8() const { return grouped_gemm_fp4 > 0 ? grouped_gemm_fp4 : grouped_gemm_fp8; }
  double memory = 0.7;            // memory-bound ops, of memory bandwidth
  // The low-precision recipes' quantize / transpose kernels (read bf16, write the fp8 copies and
  // their scales), of memory bandwidth; 0 = `memory`.
  double quantize = 0;
  double quantize_or_memory() const { return quantize > 0 ? quantize : memory; }
  // The MX recipes' scale-swizzle kernels (rearranging the block scales into the tensor core's
  // layout before each GEMM: small gathers, far from streaming bandwidth), of memory bandwidth;
  // 0 = `quantize`.
  double swizzle = 0;
  double swizzle_or_quantize() const { return swizzle > 0 ? swizzle : quantize_or_memory(); }
  double net_intra = 0.8;         // collectives inside a node, of intra-node bandwidth
  double net_inter = 0.8;         // collectives across nodes, of inter-node bandwidth
  double overlap = 0.9;           // share of overlappable communication actually hidden
  double comm_compute_share = 0;  // compute units lent to communication kernels while overlapping
  double goodput = 1.0;           // share of wall time in productive steady-state steps (the rest:
                                  // failures and restarts, checkpoints, evaluation, stragglers)
};

// The CPU that launches the kernels (plan/host.h): host seconds per framework-level op (Python
// dispatch, autograd, launch) and per further kernel launched from C++ inside an op. Both 0: the
// host is not modelled (cpu-this: trex's CPU engine runs its kernels on the host itself).
struct HostCost {
  std::string cpu;      // "x86", "grace", "arm" or "" (not modelled)
  double op_s = 0;      // seconds per framework-level op
  double launch_s = 0;  // seconds per inner kernel launch
  bool modelled() const { return op_s > 0 || launch_s > 0; }
};

struct ClusterSpec {
  std::string name, description, source, note;
  // Device.
  double peak_bf16 = 0, peak_fp8 = 0;  // FLOP/s, dense; peak_fp8 = 0: no fp8 matmul
  double peak_fp4 = 0;                 // FLOP/s, dense; 0: no fp4 matmul (precision=mxfp4 refused)
  bool mx_formats = false;             // hardware block-scaled (MX) matmul: precision=mxfp8 / mxfp4
  // Share of the spec's tensor rates that a long run of back-to-back tensor work sustains at the
  // power limit (the clock drops from boost once the board reaches it); scales every FLOP rate
  // (GEMMs, attention, head), not the memory-bound work. 1: the efficiencies already are
  // sustained rates (fitted on whole runs, or measured over long runs).
  double sustained_clock = 1;
  double mem_bytes = 0, mem_bw = 0;    // bytes, bytes/s
  // The tile grid of the routed experts' grouped GEMMs (plan/gemm.h): SMs, and the output tile
  // one MMA unit of tile_sms SMs computes (Hopper 128 x 256 on one SM; Blackwell's 2-SM UMMA
  // 256 x 256 on a pair). sm_count 0: the GEMMs run at their class rate whatever their shape.
  int64_t sm_count = 0, tile_m = 128, tile_n = 256, tile_sms = 1;
  double reserved_bytes = 0;
  // The sparse-attention kernels' slot lists (plan/arch.h kernel_attended_keys): 0, each query
  // over its attended keys (trex's kernels); > 0, every query over its full slot list padded to a
  // multiple of this (FlashMLA's sparse kernels: 64). [device] sparse_attention_slot_pad.
  int64_t sparse_slot_pad = 0;
  // Bytes per saved activation element: 0 = as a bf16 GPU run stores each tensor (SavedTensor::
  // bytes); 4 for cpu-this, where trex's CPU engine keeps every saved activation in f32.
  double activation_bytes = 0;
  // true for cpu-this: trex's CPU engine keeps the f32 master weights on every data-parallel rank
  // (ZeRO-1 shards the AdamW moments only, and the all-gather after the update moves f32); false:
  // the master is sharded with the moments and bf16 parameters are gathered (Megatron-Core).
  bool replicated_f32_master = false;
  // true for cpu-this: the devices run trex's own engine.
  bool runs_trex = false;
  // The memory per device of a layout as the engine that runs it counts it: on cpu-this trex's
  // start-up memory check (train::layout_memory, train/preflight.h), installed by the CLI, which
  // sees the trainer. It fills a pipeline rank's parameters, gradients, optimizer state,
  // activations and buffers, or returns false for a layout the engine does not run (the formulas
  // of plan/memory.h then stand). Null: the formulas.
  std::function<bool(const ArchModel&, const Layout&, RankMemory&)> engine_memory;
  // Share of the data-parallel gradient that the communication library copies while the bucket
  // reduce-scatters are in flight, per (dp-1)/dp of it: 1 for cpu-this (OpenMPI's non-blocking
  // in-place reduce-scatter works on a temporary, and trex keeps every bucket in flight until the
  // end of the backward; measured in docs/PLAN.md), 0 for NCCL-style in-place rings.
  double dp_reduce_temp = 0;           // runtime, allocator and framework reserve
  // Network: per device, one direction.
  int64_t devices_per_node = 1;        // devices in one scale-up (fast) domain
  double intra_bw = 0, intra_lat = 0;  // bytes/s, s
  double inter_bw = 0, inter_lat = 0;
  // Cost: stated example figures unless the user supplies their own.
  double price_per_device_hour = 0;  // dollars
  double power_w = 0;                // watts per device, all-in
  double pue = 1.0;                  // facility overhead multiplier on power
  Efficiency eff;
  HostCost host;

  double usable_bytes() const { return mem_bytes - reserved_bytes; }
};

// Parses spec TOML text; `where` names the source in errors. Unknown keys are errors.
ClusterSpec parse_spec_toml(const std::string& text, const std::string& where);
// Name (built-in or "cpu-this") or path to a TOML file. `calibration` is the calibration file
// for cpu-this ("" = default location, see plan/calibration.h).
ClusterSpec load_spec(const std::string& name_or_path, const std::string& calibration = "");
std::vector<std::string> builtin_spec_names();  // h800 ... cloudmatrix384 (plan/specs/*.toml)
const char* builtin_spec_text(const std::string& name);  // the compiled-in TOML, nullptr if none

}  // namespace trex::plan
