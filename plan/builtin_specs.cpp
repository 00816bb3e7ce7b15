// The built-in cluster specs, compiled in: a copy of plan/specs/*.toml (test_plan_specs checks
// that each string equals its file). After editing a spec file, regenerate this file with:
//   TREX_REGEN_SPECS=1 trex_tests --gtest_filter=PlanSpecs.BuiltinsEqualFiles   (from the repo root)
#include "plan/spec.h"

namespace trex::plan {

namespace {
struct Builtin {
  const char* name;
  const char* text;
};
const Builtin kSpecs[] = {
    {"h800", R"TOML(# NVIDIA H800 SXM5 80GB in an 8-GPU HGX node (the GPU of the DeepSeek-V3 training cluster).
# Units: TFLOP/s dense, GB = 1e9 bytes, GB/s per device and direction, microseconds, watts, USD.
name = "h800"
description = "NVIDIA H800 SXM5 80GB, 8 per node, NVLink 400 GB/s bidirectional, 8 x 400 Gb/s InfiniBand"
source = "NVIDIA H100/H800 datasheet (dense bf16 989.4, fp8 1978.9 TFLOP/s); DeepSeek-V3 report sec. 3.1 (NVLink ~160 GB/s achieved, IB 50 GB/s, 20 of 132 SMs for communication, $2 per GPU-hour)"
note = "cost and power are stated example figures: replace them with your own; sustained_clock unset: the fitted fp8 efficiencies (docs/PLAN.md) carry the clock a whole run holds"

[device]
peak_bf16_tflops = 989.4
peak_fp8_tflops = 1978.9
memory_gb = 80
memory_bandwidth_gbs = 3350
reserved_gb = 4            # CUDA context, NCCL buffers, allocator fragmentation (example)
sm_count = 132             # SMs (H100 SXM5 / H800 / H200)
tile_m = 128               # grouped-GEMM output tile per MMA unit: 128 x 256 on one SM (DeepGEMM / CUTLASS SM90 warpgroup MMA)
tile_n = 256
tile_sms = 1
sparse_attention_slot_pad = 64  # FlashMLA sparse attention: every query over its full slot list (window + top-k or all entries), padded to 64

[network]
devices_per_node = 8
intra_node_gbs = 200       # NVLink, one direction
intra_node_latency_us = 3
inter_node_gbs = 50        # one 400 Gb/s IB NIC per GPU
inter_node_latency_us = 8

[cost]
price_per_device_hour = 2.0  # the rental price the DeepSeek-V3 report assumes
power_w = 1275               # DGX H100-class system, 10.2 kW / 8 GPUs, all-in
pue = 1.0

[efficiency]
gemm = 0.70                # cuBLAS bf16 on large shapes
gemm_fp8 = 0.45           # tuned on DeepSeek-V3 (docs/PLAN.md): end-to-end fp8 GEMM rate incl. scaling overheads
grouped_gemm = 0.60
grouped_gemm_fp8 = 0.45   # tuned on DeepSeek-V3 (docs/PLAN.md)
attention = 0.50           # FlashAttention-3-class, forward and backward averaged
memory = 0.75
net_intra = 0.80           # 160 of 200 GB/s
net_inter = 0.85
overlap = 0.90
comm_compute_share = 0.15  # DeepEP: 20 of 132 SMs run communication while overlapping
goodput = 0.90             # tuned on DeepSeek-V3: its GPU-hours cover the whole run, not steady-state steps

[host]                     # the CPU that launches the kernels (plan/host.h, docs/PLAN.md "The host")
cpu = "x86"
op_us = 13.5               # per framework op: torch.nn.Linear forward, 13.48 us of CPU on an H100 DGX (Xeon Platinum 8480C), https://github.com/NVIDIA/TransformerEngine/issues/2053
launch_us = 3.0            # per kernel launched from C++: raw cuLaunchKernel 3.0 us (measured on GB200, https://github.com/meta-pytorch/tritonbench/pull/1017; no x86 figure found, the same taken)
)TOML"},
    {"h100", R"TOML(# NVIDIA H100 SXM5 80GB in an 8-GPU HGX node.
# Units: TFLOP/s dense, GB = 1e9 bytes, GB/s per device and direction, microseconds, watts, USD.
name = "h100"
description = "NVIDIA H100 SXM5 80GB, 8 per node, NVLink 900 GB/s bidirectional, 8 x 400 Gb/s InfiniBand"
source = "NVIDIA H100 datasheet (dense bf16 989.4, fp8 1978.9 TFLOP/s, 3.35 TB/s HBM3, NVLink 900 GB/s)"
note = "cost and power are stated example figures: replace them with your own; sustained_clock unset: the fitted fp8 efficiencies (docs/PLAN.md) carry the clock a whole run holds"

[device]
peak_bf16_tflops = 989.4
peak_fp8_tflops = 1978.9
memory_gb = 80
memory_bandwidth_gbs = 3350
reserved_gb = 4
sm_count = 132             # SMs (H100 SXM5 / H800 / H200)
tile_m = 128               # grouped-GEMM output tile per MMA unit: 128 x 256 on one SM (DeepGEMM / CUTLASS SM90 warpgroup MMA)
tile_n = 256
tile_sms = 1
sparse_attention_slot_pad = 64  # FlashMLA sparse attention: every query over its full slot list (window + top-k or all entries), padded to 64

[network]
devices_per_node = 8
intra_node_gbs = 450
intra_node_latency_us = 3
inter_node_gbs = 50
inter_node_latency_us = 8

[cost]
price_per_device_hour = 2.5  # example cloud rental price
power_w = 1275               # DGX H100 10.2 kW / 8 GPUs, all-in
pue = 1.0

[efficiency]
gemm = 0.70
gemm_fp8 = 0.45           # tuned on DeepSeek-V3 (docs/PLAN.md): end-to-end fp8 GEMM rate incl. scaling overheads
grouped_gemm = 0.60
grouped_gemm_fp8 = 0.45   # tuned on DeepSeek-V3 (docs/PLAN.md)
attention = 0.50
memory = 0.75
net_intra = 0.80
net_inter = 0.85
overlap = 0.90
comm_compute_share = 0.15

[host]                     # the CPU that launches the kernels (plan/host.h, docs/PLAN.md "The host")
cpu = "x86"
op_us = 13.5               # per framework op: torch.nn.Linear forward, 13.48 us of CPU on an H100 DGX (Xeon Platinum 8480C), https://github.com/NVIDIA/TransformerEngine/issues/2053
launch_us = 3.0            # per kernel launched from C++: raw cuLaunchKernel 3.0 us (measured on GB200, https://github.com/meta-pytorch/tritonbench/pull/1017; no x86 figure found, the same taken)
)TOML"},
    {"h200", R"TOML(# NVIDIA H200 SXM 141GB in an 8-GPU HGX node.
# Units: TFLOP/s dense, GB = 1e9 bytes, GB/s per device and direction, microseconds, watts, USD.
name = "h200"
description = "NVIDIA H200 SXM 141GB, 8 per node, NVLink 900 GB/s bidirectional, 8 x 400 Gb/s InfiniBand"
source = "NVIDIA H200 datasheet (dense bf16 989.4, fp8 1978.9 TFLOP/s, 141 GB HBM3e at 4.8 TB/s)"
note = "cost and power are stated example figures: replace them with your own; sustained_clock unset: the fitted fp8 efficiencies (docs/PLAN.md) carry the clock a whole run holds"

[device]
peak_bf16_tflops = 989.4
peak_fp8_tflops = 1978.9
memory_gb = 141
memory_bandwidth_gbs = 4800
reserved_gb = 4
sm_count = 132             # SMs (H100 SXM5 / H800 / H200)
tile_m = 128               # grouped-GEMM output tile per MMA unit: 128 x 256 on one SM (DeepGEMM / CUTLASS SM90 warpgroup MMA)
tile_n = 256
tile_sms = 1
sparse_attention_slot_pad = 64  # FlashMLA sparse attention: every query over its full slot list (window + top-k or all entries), padded to 64

[network]
devices_per_node = 8
intra_node_gbs = 450
intra_node_latency_us = 3
inter_node_gbs = 50
inter_node_latency_us = 8

[cost]
price_per_device_hour = 3.5  # example cloud rental price
power_w = 1275               # HGX H200 system power / 8 GPUs, all-in (example)
pue = 1.0

[efficiency]
gemm = 0.70
gemm_fp8 = 0.45           # tuned on DeepSeek-V3 (docs/PLAN.md): end-to-end fp8 GEMM rate incl. scaling overheads
grouped_gemm = 0.60
grouped_gemm_fp8 = 0.45   # tuned on DeepSeek-V3 (docs/PLAN.md)
attention = 0.50
memory = 0.75
net_intra = 0.80
net_inter = 0.85
overlap = 0.90
comm_compute_share = 0.15

[host]                     # the CPU that launches the kernels (plan/host.h, docs/PLAN.md "The host")
cpu = "x86"
op_us = 13.5               # per framework op: torch.nn.Linear forward, 13.48 us of CPU on an H100 DGX (Xeon Platinum 8480C), https://github.com/NVIDIA/TransformerEngine/issues/2053
launch_us = 3.0            # per kernel launched from C++: raw cuLaunchKernel 3.0 us (measured on GB200, https://github.com/meta-pytorch/tritonbench/pull/1017; no x86 figure found, the same taken)
)TOML"},
    {"b200", R"TOML(# NVIDIA B200 in an 8-GPU HGX/DGX B200 node.
# Units: TFLOP/s dense, GB = 1e9 bytes, GB/s per device and direction, microseconds, watts, USD.
name = "b200"
description = "NVIDIA B200 180GB, 8 per node, NVLink 5 1.8 TB/s bidirectional, 8 x 400 Gb/s InfiniBand"
source = "NVIDIA DGX B200 datasheet (72 PFLOP/s fp8 training / 8 GPUs = 9 sparse, 4.5 dense; bf16 2.25 dense; 1,440 GB HBM3e at 64 TB/s per 8 GPUs; ~14.3 kW); HGX B200 at 1000 W: bf16 2250, fp8 4500, fp4 9000 TFLOP/s dense (https://glennklockwood.com/garden/processors/B200); NVLink 5 900 GB/s per direction, 180 GB, 7.7 TB/s (https://verda.com/blog/gb300-nvl72-architecture); 8 x ConnectX-7 400 Gb/s per HGX B200 (https://rillor.com/insights/connectx-7-vs-connectx-8-and-nvlink5); GEMM rates: maximum achievable matmul FLOP/s (MAMF), https://github.com/stas00/ml-engineering/blob/master/compute/accelerator/README.md#maximum-achievable-matmul-flops-comparison-table; MXFP8 grouped-GEMM and quantize kernels at DeepSeek-V3 shapes on B200, https://github.com/pytorch/ao/blob/main/torchao/prototype/moe_training/README.md (MXFP8 kernel breakdown by pass); B200 clock under sustained tensor work at 1000 W, https://github.com/flashinfer-ai/flashinfer/pull/2899; 148 SMs (https://chipsandcheese.com/p/nvidias-b200-keeping-the-cuda-juggernaut); device-to-device copy over 6,000 GB/s (https://www.newmind.ai/journal/18); MXFP8 / BF16 GEMM kernel and quantize times in Transformer Engine, https://github.com/NVIDIA/TransformerEngine/blob/main/docs/examples/gemm_profiling/gemm_profiling.rst (B300)"
note = "cost and power are stated example figures: replace them with your own; GEMM efficiencies, quantize, swizzle and sustained_clock are derived in docs/PLAN.md (Blackwell: GEMMs, clocks and quantization)"

[device]
peak_bf16_tflops = 2250
peak_fp8_tflops = 4500
peak_fp4_tflops = 9000
mx_formats = true          # block-scaled MMA (MXFP8 / MXFP4 / NVFP4) in the tensor cores
memory_gb = 180
memory_bandwidth_gbs = 8000   # DGX datasheet 64 TB/s / 8; 7.7 TB/s in some listings
reserved_gb = 4
sustained_clock = 0.85      # back-to-back tensor work at the 1000 W limit: SM clock 1965 -> ~1580 MHz, TFLOP/s -15% (https://github.com/flashinfer-ai/flashinfer/pull/2899)
sm_count = 148             # SMs
tile_m = 256               # grouped-GEMM output tile per MMA unit: Blackwell's 2-SM UMMA, 256 x 256 on an SM pair (CUTLASS / DeepGEMM SM100 2-CTA kernels)
tile_n = 256
tile_sms = 2
sparse_attention_slot_pad = 64  # FlashMLA sparse attention: every query over its full slot list (window + top-k or all entries), padded to 64

[network]
devices_per_node = 8
intra_node_gbs = 900
intra_node_latency_us = 3
inter_node_gbs = 50
inter_node_latency_us = 8

[cost]
price_per_device_hour = 5.0  # example cloud rental price
power_w = 1790               # DGX B200 14.3 kW / 8 GPUs, all-in
pue = 1.0

[efficiency]
gemm = 0.676               # MAMF bf16 0.776 (B200) x 0.872 (Hopper: gemm 0.70 / H100 MAMF 0.803)
gemm_fp8 = 0.619           # gemm 0.677 x 1.83 / 2: Transformer Engine MXFP8 over BF16 GEMM kernels, pre-quantized, 1.83x (B300, its GEMM profiling guide)
grouped_gemm = 0.580       # MAMF bf16 0.776 x 0.747 (Hopper: grouped_gemm 0.60 / H100 MAMF 0.803)
grouped_gemm_fp8 = 0.495   # MXFP8 grouped GEMMs at DeepSeek-V3 shapes on B200 (torchao): 0.421 sustained = 0.495 at boost (/ 0.85); x MAMF fp8 0.763 / 0.763
attention = 0.50
sparse_attention = 0.26      # DeepSeek-V4 sparse attention at its shape (64 heads, d 512), forward + backward: 3 / (1 / 0.644 + 2.5 / 0.248): FlashMLA sparse forward up to 1450 of 2250 TFLOP/s on B200 (https://github.com/deepseek-ai/FlashMLA, README), cuDNN sparse backward 557 TFLOP/s at top-k 512, seq 4096, SM100, counted as 2.5 x the forward (https://github.com/NVIDIA/cudnn-frontend/pull/318); the planner charges the backward as 2 x the forward
memory = 0.75              # B200 device-to-device copy over 6,000 of 8,000 GB/s (https://www.newmind.ai/journal/18)
quantize = 0.57            # MXFP8 quantize kernels on B200 (torchao, DeepSeek-V3 shapes): rowwise 4.91, columnwise 4.25 TB/s -> 4.55 of 8 TB/s
swizzle = 0.19             # MX scale swizzle before each GEMM: torchao's CUDA scale-rearrange kernels on B200 (its README, MXFP8 kernel breakdown by pass): 7168 x 4096 and 2048 x 4096 e8m0 scales read and written in 31.6 + 17.4 us -> 1.54 of 8 TB/s
net_intra = 0.80
net_inter = 0.85
overlap = 0.90
comm_compute_share = 0.15

[host]                     # the CPU that launches the kernels (plan/host.h, docs/PLAN.md "The host")
cpu = "x86"
op_us = 13.5               # per framework op: torch.nn.Linear forward, 13.48 us of CPU on an H100 DGX (Xeon Platinum 8480C), https://github.com/NVIDIA/TransformerEngine/issues/2053
launch_us = 3.0            # per kernel launched from C++: raw cuLaunchKernel 3.0 us (measured on GB200, https://github.com/meta-pytorch/tritonbench/pull/1017; no x86 figure found, the same taken)
)TOML"},
    {"gb200-nvl72", R"TOML(# NVIDIA GB200 NVL72: 72 B200-class GPUs (at 1200 W) and 36 Grace CPUs in one rack, all 72 GPUs on
# one NVLink 5 domain through 9 NVSwitch trays; racks joined by InfiniBand (one NIC per GPU).
# The "node" here is the NVLink domain: 72 GPUs. (A 256-GPU job spans 4 racks; Megatron places
# its expert groups inside a rack.)
# Units: TFLOP/s dense, GB = 1e9 bytes, GB/s per device and direction, microseconds, watts, USD.
name = "gb200-nvl72"
description = "NVIDIA GB200 NVL72: 72 Blackwell GPUs per NVLink 5 domain (900 GB/s per GPU and direction), 400 Gb/s InfiniBand per GPU between racks"
source = "GB200 variant of B200 at 1200 W: bf16 2500, fp8 5000, fp4 10000 TFLOP/s dense, 8 TB/s (https://glennklockwood.com/garden/processors/B200); 13.5 TB HBM3e per 72 GPUs, ~120 kW per rack (https://awesomeagents.ai/hardware/nvidia-gb200-nvl72); NVLink 5 1.8 TB/s bidirectional per GPU, 72 GPUs act as one domain, InfiniBand between racks (https://docs.nvidia.com/dgx/dgxgb200-user-guide/networking.html); 400 Gb/s ConnectX-7 per GPU for east-west traffic on B200-class systems (https://rillor.com/insights/connectx-7-vs-connectx-8-and-nvlink5); GEMM rates: maximum achievable matmul FLOP/s (MAMF), https://github.com/stas00/ml-engineering/blob/master/compute/accelerator/README.md#maximum-achievable-matmul-flops-comparison-table (GB200 row); MXFP8 grouped-GEMM and quantize kernels at DeepSeek-V3 shapes on B200, https://github.com/pytorch/ao/blob/main/torchao/prototype/moe_training/README.md (MXFP8 kernel breakdown by pass); sustained clock extrapolated from B200 clock under sustained tensor work at 1000 W, https://github.com/flashinfer-ai/flashinfer/pull/2899; MXFP8 / BF16 GEMM kernel and quantize times in Transformer Engine, https://github.com/NVIDIA/TransformerEngine/blob/main/docs/examples/gemm_profiling/gemm_profiling.rst (B300)"
note = "cost and power are stated example figures: replace them with your own; GEMM efficiencies, quantize, swizzle and sustained_clock are derived in docs/PLAN.md (Blackwell: GEMMs, clocks and quantization); sustained_clock is extrapolated, not measured"

[device]
peak_bf16_tflops = 2500
peak_fp8_tflops = 5000
peak_fp4_tflops = 10000
mx_formats = true
memory_gb = 186            # 13.5 TB / 72, rounded down
memory_bandwidth_gbs = 8000
reserved_gb = 4
sustained_clock = 0.81      # 1200 W: B200's measured 1580 MHz at 1000 W (https://github.com/flashinfer-ai/flashinfer/pull/2899) x (1200/1000)^(1/3) (dynamic power ~ f^3) = 1679 MHz of the 2062 MHz the 2500 TFLOP/s spec implies (148 SMs x 8192 FLOP/clk); extrapolated, not measured
sm_count = 148             # SMs
tile_m = 256               # grouped-GEMM output tile per MMA unit: Blackwell's 2-SM UMMA, 256 x 256 on an SM pair (CUTLASS / DeepGEMM SM100 2-CTA kernels)
tile_n = 256
tile_sms = 2
sparse_attention_slot_pad = 64  # FlashMLA sparse attention: every query over its full slot list (window + top-k or all entries), padded to 64

[network]
devices_per_node = 72      # the NVLink domain
intra_node_gbs = 900       # NVLink 5, one direction
intra_node_latency_us = 3
inter_node_gbs = 50        # one 400 Gb/s NIC per GPU
inter_node_latency_us = 8

[cost]
price_per_device_hour = 6.0  # example
power_w = 1670               # ~120 kW rack / 72 GPUs, all-in
pue = 1.0

[efficiency]
gemm = 0.635               # MAMF bf16 0.729 (GB200) x 0.872 (Hopper: gemm 0.70 / H100 MAMF 0.803)
gemm_fp8 = 0.582           # gemm 0.636 x 1.83 / 2: Transformer Engine MXFP8 over BF16 GEMM kernels, pre-quantized, 1.83x (B300, its GEMM profiling guide)
grouped_gemm = 0.545       # MAMF bf16 0.729 x 0.747 (Hopper: grouped_gemm 0.60 / H100 MAMF 0.803)
grouped_gemm_fp8 = 0.469   # MXFP8 grouped GEMMs at DeepSeek-V3 shapes on B200 (torchao): 0.421 sustained = 0.495 at boost (/ 0.85); x MAMF fp8 0.723 / 0.763
attention = 0.50
sparse_attention = 0.26      # DeepSeek-V4 sparse attention at its shape (64 heads, d 512), forward + backward: 3 / (1 / 0.644 + 2.5 / 0.248): FlashMLA sparse forward up to 1450 of 2250 TFLOP/s on B200 (https://github.com/deepseek-ai/FlashMLA, README), cuDNN sparse backward 557 TFLOP/s at top-k 512, seq 4096, SM100, counted as 2.5 x the forward (https://github.com/NVIDIA/cudnn-frontend/pull/318); the planner charges the backward as 2 x the forward
memory = 0.75              # B200 device-to-device copy over 6,000 of 8,000 GB/s (https://www.newmind.ai/journal/18)
quantize = 0.57            # MXFP8 quantize kernels on B200 (torchao, DeepSeek-V3 shapes): rowwise 4.91, columnwise 4.25 TB/s -> 4.55 of 8 TB/s
swizzle = 0.19             # MX scale swizzle before each GEMM: torchao's CUDA scale-rearrange kernels on B200 (its README, MXFP8 kernel breakdown by pass): 7168 x 4096 and 2048 x 4096 e8m0 scales read and written in 31.6 + 17.4 us -> 1.54 of 8 TB/s
net_intra = 0.80
net_inter = 0.85
overlap = 0.90
comm_compute_share = 0.15

[host]                     # the CPU that launches the kernels (plan/host.h, docs/PLAN.md "The host")
cpu = "grace"
op_us = 37.0               # per framework op: torch.nn.Linear forward, 37.08 us of CPU on GB200 (33.17 on GH200), https://github.com/NVIDIA/TransformerEngine/issues/2053
launch_us = 3.0            # per kernel launched from C++: raw cuLaunchKernel 3.0 us on GB200, https://github.com/meta-pytorch/tritonbench/pull/1017
)TOML"},
    {"gb300-nvl72", R"TOML(# NVIDIA GB300 NVL72: 72 Blackwell Ultra GPUs and 36 Grace CPUs in one rack, one NVLink 5 domain of
# 72 GPUs; a ConnectX-8 SuperNIC (800 Gb/s) per GPU between racks.
# Units: TFLOP/s dense, GB = 1e9 bytes, GB/s per device and direction, microseconds, watts, USD.
name = "gb300-nvl72"
description = "NVIDIA GB300 NVL72: 72 Blackwell Ultra GPUs per NVLink 5 domain (900 GB/s per GPU and direction), 800 Gb/s ConnectX-8 per GPU between racks"
source = "GB300 per GPU: fp4 15, fp8 5, bf16 2.5 PFLOP/s dense, 279 GB HBM3e at 8 TB/s, 1.4 kW, NVLink 5 900 GB/s per direction (https://verda.com/blog/gb300-nvl72-architecture); ConnectX-8 800 Gb/s per GPU (https://vendordeep.com/report/nvidia-launches-blackwell-ultra-gb300); rack up to 142 kW, 4 GPUs and 4 ConnectX-8 per compute tray (https://docs.nvidia.com/enterprise-reference-architectures/nvl72-ai-factory/latest/components.html); GEMM rates: maximum achievable matmul FLOP/s (MAMF), https://github.com/stas00/ml-engineering/blob/master/compute/accelerator/README.md#maximum-achievable-matmul-flops-comparison-table (B300 row); MXFP8 grouped-GEMM and quantize kernels at DeepSeek-V3 shapes on B200, https://github.com/pytorch/ao/blob/main/torchao/prototype/moe_training/README.md (MXFP8 kernel breakdown by pass); sustained clock extrapolated from B200 clock under sustained tensor work at 1000 W, https://github.com/flashinfer-ai/flashinfer/pull/2899; 160 SMs per Blackwell Ultra GPU (https://itkb.uw.cz/2026/06/nvidia-h200-vs-b300-precisions-cores.html); MXFP8 / BF16 GEMM kernel and quantize times in Transformer Engine, https://github.com/NVIDIA/TransformerEngine/blob/main/docs/examples/gemm_profiling/gemm_profiling.rst (B300)"
note = "cost and power are stated example figures: replace them with your own; GEMM efficiencies, quantize, swizzle and sustained_clock are derived in docs/PLAN.md (Blackwell: GEMMs, clocks and quantization); sustained_clock is extrapolated, not measured"

[device]
peak_bf16_tflops = 2500
peak_fp8_tflops = 5000
peak_fp4_tflops = 15000
mx_formats = true
memory_gb = 279
memory_bandwidth_gbs = 8000
reserved_gb = 4
sustained_clock = 0.93      # 1400 W: 1580 MHz x (1400/1000)^(1/3) = 1768 MHz of the 1907 MHz the 2500 TFLOP/s spec implies (160 SMs x 8192 FLOP/clk); extrapolated, not measured
sm_count = 160             # SMs
tile_m = 256               # grouped-GEMM output tile per MMA unit: Blackwell's 2-SM UMMA, 256 x 256 on an SM pair (CUTLASS / DeepGEMM SM100 2-CTA kernels)
tile_n = 256
tile_sms = 2
sparse_attention_slot_pad = 64  # FlashMLA sparse attention: every query over its full slot list (window + top-k or all entries), padded to 64

[network]
devices_per_node = 72      # the NVLink domain
intra_node_gbs = 900       # NVLink 5, one direction
intra_node_latency_us = 3
inter_node_gbs = 100       # one 800 Gb/s ConnectX-8 per GPU
inter_node_latency_us = 8

[cost]
price_per_device_hour = 7.0  # example
power_w = 1970               # 142 kW rack / 72 GPUs, all-in
pue = 1.0

[efficiency]
gemm = 0.685               # MAMF bf16 0.786 (B300) x 0.872 (Hopper: gemm 0.70 / H100 MAMF 0.803)
gemm_fp8 = 0.627           # gemm 0.685 x 1.83 / 2: Transformer Engine MXFP8 over BF16 GEMM kernels, pre-quantized, 1.83x (B300, its GEMM profiling guide)
grouped_gemm = 0.587       # MAMF bf16 0.786 x 0.747 (Hopper: grouped_gemm 0.60 / H100 MAMF 0.803)
grouped_gemm_fp8 = 0.484   # MXFP8 grouped GEMMs at DeepSeek-V3 shapes on B200 (torchao): 0.421 sustained = 0.495 at boost (/ 0.85); x MAMF fp8 0.745 / 0.763
attention = 0.50
sparse_attention = 0.26      # DeepSeek-V4 sparse attention at its shape (64 heads, d 512), forward + backward: 3 / (1 / 0.644 + 2.5 / 0.248): FlashMLA sparse forward up to 1450 of 2250 TFLOP/s on B200 (https://github.com/deepseek-ai/FlashMLA, README), cuDNN sparse backward 557 TFLOP/s at top-k 512, seq 4096, SM100, counted as 2.5 x the forward (https://github.com/NVIDIA/cudnn-frontend/pull/318); the planner charges the backward as 2 x the forward
memory = 0.75              # B200 device-to-device copy over 6,000 of 8,000 GB/s (https://www.newmind.ai/journal/18)
quantize = 0.57            # MXFP8 quantize kernels on B200 (torchao, DeepSeek-V3 shapes): rowwise 4.91, columnwise 4.25 TB/s -> 4.55 of 8 TB/s
swizzle = 0.19             # MX scale swizzle before each GEMM: torchao's CUDA scale-rearrange kernels on B200 (its README, MXFP8 kernel breakdown by pass): 7168 x 4096 and 2048 x 4096 e8m0 scales read and written in 31.6 + 17.4 us -> 1.54 of 8 TB/s
net_intra = 0.80
net_inter = 0.85
overlap = 0.90
comm_compute_share = 0.15

[host]                     # the CPU that launches the kernels (plan/host.h, docs/PLAN.md "The host")
cpu = "grace"
op_us = 37.0               # per framework op: torch.nn.Linear forward, 37.08 us of CPU on GB200 (33.17 on GH200), https://github.com/NVIDIA/TransformerEngine/issues/2053
launch_us = 3.0            # per kernel launched from C++: raw cuLaunchKernel 3.0 us on GB200, https://github.com/meta-pytorch/tritonbench/pull/1017
)TOML"},
    {"mi300x", R"TOML(# AMD Instinct MI300X (CDNA 3) in an 8-GPU OAM platform: a fully connected Infinity Fabric (xGMI)
# mesh inside the node, one 400 Gb/s NIC per GPU between nodes.
# Units: TFLOP/s dense, GB = 1e9 bytes, GB/s per device and direction, microseconds, watts, USD.
name = "mi300x"
description = "AMD Instinct MI300X 192GB, 8 per node on a fully connected Infinity Fabric mesh (7 links), 400 Gb/s RoCE/InfiniBand per GPU"
source = "bf16 1307.4, fp8 2614.9 TFLOP/s dense, 5.3 TB/s, 192 GB, 750 W (https://raw.githubusercontent.com/alpharomercoma/MI300X-vs-H200/6077fdc7bfc215171c33435b7cd76ca4c5f2b236/METHODOLOGY.md); Infinity Fabric 128 GB/s bidirectional per link, 448 GB/s aggregate (https://www.emergentmind.com/topics/amd-mi300x-gpu); 8 per node, fully connected xGMI mesh (https://gpu.blog/gpus/instinct-mi300x-mi300x)"
note = "no MX formats or fp4 on CDNA 3; inter-node 400 Gb/s per GPU is the usual build, not a vendor figure; cost and power are stated example figures; efficiencies are untuned estimates"

[device]
peak_bf16_tflops = 1307.4
peak_fp8_tflops = 2614.9
memory_gb = 192
memory_bandwidth_gbs = 5300
reserved_gb = 6

[network]
devices_per_node = 8
intra_node_gbs = 448       # 7 links x 64 GB/s per direction; a collective uses all of them
intra_node_latency_us = 5
inter_node_gbs = 50
inter_node_latency_us = 10

[cost]
price_per_device_hour = 2.0  # example
power_w = 1250               # 750 W GPU plus its share of the host and network (example)
pue = 1.0

[efficiency]
gemm = 0.55                # hipBLASLt bf16 reaches about half the paper peak on large shapes
gemm_fp8 = 0.45
grouped_gemm = 0.45
grouped_gemm_fp8 = 0.40
attention = 0.40
memory = 0.70
net_intra = 0.70           # all-to-all over point-to-point links, no switch
net_inter = 0.80
overlap = 0.85
comm_compute_share = 0.15
)TOML"},
    {"mi355x", R"TOML(# AMD Instinct MI355X (CDNA 4, liquid-cooled, 1400 W) in an 8-GPU OAM platform: Infinity Fabric
# mesh inside the node, one 400 Gb/s NIC per GPU between nodes.
# Units: TFLOP/s dense, GB = 1e9 bytes, GB/s per device and direction, microseconds, watts, USD.
name = "mi355x"
description = "AMD Instinct MI355X 288GB, 8 per node on an Infinity Fabric mesh, 400 Gb/s per GPU between nodes"
source = "fp8 5 PFLOP/s (per-CU fp8 rate doubled over MI300X; ISSCC 2026: https://www.world-today-news.com/?p=7253162); 288 GB HBM3E at 8 TB/s, 1400 W (https://aiwiki.ai/wiki/amd_instinct_mi355x); MXFP4/MXFP6 support, ~10 PFLOP/s fp4 (https://www.jaredwatkins.com/research/ai-accelerators/amd-instinct/mi350-series/); 8 x AMD Pollara 400G per 8-GPU node (https://raw.githubusercontent.com/mlcommons/inference_results_v6.1/main/closed/Crusoe/systems/512xMI355X_Crusoe_GPT.json)"
note = "bf16 = half the fp8 rate, as on every CDNA generation (not a quoted figure); Infinity Fabric bandwidth assumed equal to MI300X's (no figure found); cost and power are stated example figures; efficiencies are untuned estimates"

[device]
peak_bf16_tflops = 2500
peak_fp8_tflops = 5000
peak_fp4_tflops = 10000
mx_formats = true
memory_gb = 288
memory_bandwidth_gbs = 8000
reserved_gb = 6

[network]
devices_per_node = 8
intra_node_gbs = 448
intra_node_latency_us = 5
inter_node_gbs = 50
inter_node_latency_us = 10

[cost]
price_per_device_hour = 3.0  # example
power_w = 2000               # 1400 W GPU plus its share of the host and network (example)
pue = 1.0

[efficiency]
gemm = 0.55
gemm_fp8 = 0.45
grouped_gemm = 0.45
grouped_gemm_fp8 = 0.40
attention = 0.40
memory = 0.70
net_intra = 0.70
net_inter = 0.80
overlap = 0.85
comm_compute_share = 0.15
)TOML"},
    {"ascend-910c", R"TOML(# Huawei Ascend 910C in a CloudMatrix384 SuperPoD. One device = one 910C die, the unit CANN
# exposes as an NPU and runs one rank on (an Atlas A3 server shows 16: 8 chips x 2 dies).
# The "node" here is the Unified-Bus scale-up domain: 384 chips = 768 dies, all-to-all over UB;
# SuperPoDs are joined by RDMA.
# Units: TFLOP/s dense, GB = 1e9 bytes, GB/s per device and direction, microseconds, watts, USD.
name = "ascend-910c"
description = "Huawei Ascend 910C die (half a chip), CloudMatrix384 SuperPoD: 768 dies on the Unified Bus, RDMA between SuperPoDs"
source = "Zuo et al., Serving LLMs on Huawei CloudMatrix384, arXiv:2506.12708 (910C: 2 dies, 752 TFLOP/s dense bf16, 128 GB at 3.2 TB/s per chip; UB 196 GB/s per die and direction; RDMA 200 Gb/s per die); SemiAnalysis (CloudMatrix384 ~559 kW all-in)"
note = "no fp8 matmul on 910C (peak_fp8 = 0); cost and power are stated example figures; efficiencies are untuned estimates (docs/PLAN.md)"

[device]
peak_bf16_tflops = 376
peak_fp8_tflops = 0
memory_gb = 64
memory_bandwidth_gbs = 1600
reserved_gb = 4

[network]
devices_per_node = 768
intra_node_gbs = 196       # Unified Bus, one direction per die
intra_node_latency_us = 3
inter_node_gbs = 25        # RDMA plane, 200 Gb/s per die
inter_node_latency_us = 10

[cost]
price_per_device_hour = 1.0  # example
power_w = 728                # CloudMatrix384 ~559 kW / 768 dies, all-in
pue = 1.0

[efficiency]
gemm = 0.60
grouped_gemm = 0.55
attention = 0.40
memory = 0.70
net_intra = 0.75
net_inter = 0.80
overlap = 0.85
comm_compute_share = 0.0
)TOML"},
    {"cloudmatrix384", R"TOML(# Huawei CloudMatrix384 SuperPoD (supernode): 384 Ascend 910C chips and 192 Kunpeng CPUs on one
# Unified-Bus fabric, the spec of the ascend-910c built-in under the supernode's name, with its
# sources as URLs. One device = one 910C die, the unit CANN
# exposes as an NPU and runs one rank on (an Atlas A3 server shows 16: 8 chips x 2 dies).
# The "node" here is the Unified-Bus scale-up domain: 384 chips = 768 dies, all-to-all over UB;
# SuperPoDs are joined by RDMA.
# Units: TFLOP/s dense, GB = 1e9 bytes, GB/s per device and direction, microseconds, watts, USD.
name = "cloudmatrix384"
description = "Huawei Ascend 910C die (half a chip), CloudMatrix384 SuperPoD: 768 dies on the Unified Bus, RDMA between SuperPoDs"
source = "Zuo et al., Serving LLMs on Huawei CloudMatrix384, https://arxiv.org/abs/2506.12708 (910C: 2 dies, 752 TFLOP/s dense bf16, 128 GB at 3.2 TB/s per chip; UB 196 GB/s per die and direction; RDMA 200 Gb/s per die); SemiAnalysis (CloudMatrix384 ~559 kW all-in)"
note = "no fp8 matmul on 910C (peak_fp8 = 0); cost and power are stated example figures; efficiencies are untuned estimates (docs/PLAN.md)"

[device]
peak_bf16_tflops = 376
peak_fp8_tflops = 0
memory_gb = 64
memory_bandwidth_gbs = 1600
reserved_gb = 4

[network]
devices_per_node = 768
intra_node_gbs = 196       # Unified Bus, one direction per die
intra_node_latency_us = 3
inter_node_gbs = 25        # RDMA plane, 200 Gb/s per die
inter_node_latency_us = 10

[cost]
price_per_device_hour = 1.0  # example
power_w = 728                # CloudMatrix384 ~559 kW / 768 dies, all-in
pue = 1.0

[efficiency]
gemm = 0.60
grouped_gemm = 0.55
attention = 0.40
memory = 0.70
net_intra = 0.75
net_inter = 0.80
overlap = 0.85
comm_compute_share = 0.0
)TOML"},
};
}  // namespace

std::vector<std::string> builtin_spec_names() {
  std::vector<std::string> n;
  for (const Builtin& b : kSpecs) n.push_back(b.name);
  return n;
}

const char* builtin_spec_text(const std::string& name) {
  for (const Builtin& b : kSpecs)
    if (name == b.name) return b.text;
  return nullptr;
}

}  // namespace trex::plan
