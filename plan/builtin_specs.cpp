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
note = "cost and power are stated example figures: replace them with your own"

[device]
peak_bf16_tflops = 989.4
peak_fp8_tflops = 1978.9
memory_gb = 80
memory_bandwidth_gbs = 3350
reserved_gb = 4            # CUDA context, NCCL buffers, allocator fragmentation (example)

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
)TOML"},
    {"h100", R"TOML(# NVIDIA H100 SXM5 80GB in an 8-GPU HGX node.
# Units: TFLOP/s dense, GB = 1e9 bytes, GB/s per device and direction, microseconds, watts, USD.
name = "h100"
description = "NVIDIA H100 SXM5 80GB, 8 per node, NVLink 900 GB/s bidirectional, 8 x 400 Gb/s InfiniBand"
source = "NVIDIA H100 datasheet (dense bf16 989.4, fp8 1978.9 TFLOP/s, 3.35 TB/s HBM3, NVLink 900 GB/s)"
note = "cost and power are stated example figures: replace them with your own"

[device]
peak_bf16_tflops = 989.4
peak_fp8_tflops = 1978.9
memory_gb = 80
memory_bandwidth_gbs = 3350
reserved_gb = 4

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
)TOML"},
    {"h200", R"TOML(# NVIDIA H200 SXM 141GB in an 8-GPU HGX node.
# Units: TFLOP/s dense, GB = 1e9 bytes, GB/s per device and direction, microseconds, watts, USD.
name = "h200"
description = "NVIDIA H200 SXM 141GB, 8 per node, NVLink 900 GB/s bidirectional, 8 x 400 Gb/s InfiniBand"
source = "NVIDIA H200 datasheet (dense bf16 989.4, fp8 1978.9 TFLOP/s, 141 GB HBM3e at 4.8 TB/s)"
note = "cost and power are stated example figures: replace them with your own"

[device]
peak_bf16_tflops = 989.4
peak_fp8_tflops = 1978.9
memory_gb = 141
memory_bandwidth_gbs = 4800
reserved_gb = 4

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
)TOML"},
    {"b200", R"TOML(# NVIDIA B200 in an 8-GPU HGX/DGX B200 node.
# Units: TFLOP/s dense, GB = 1e9 bytes, GB/s per device and direction, microseconds, watts, USD.
name = "b200"
description = "NVIDIA B200 180GB, 8 per node, NVLink 5 1.8 TB/s bidirectional, 8 x 400 Gb/s InfiniBand"
source = "NVIDIA DGX B200 datasheet (72 PFLOP/s fp8 training / 8 GPUs = 9 sparse, 4.5 dense; bf16 2.25 dense; 1,440 GB HBM3e at 64 TB/s per 8 GPUs; ~14.3 kW)"
note = "cost and power are stated example figures: replace them with your own"

[device]
peak_bf16_tflops = 2250
peak_fp8_tflops = 4500
memory_gb = 180
memory_bandwidth_gbs = 8000
reserved_gb = 4

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
gemm = 0.65
gemm_fp8 = 0.60
grouped_gemm = 0.55
grouped_gemm_fp8 = 0.50
attention = 0.50
memory = 0.75
net_intra = 0.80
net_inter = 0.85
overlap = 0.90
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
