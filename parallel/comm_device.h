// The communicator of a backend's device memory for the gradient and parameter collectives of a
// data-parallel run on a device (train/layout.cpp): NCCL on CUDA (one rank per GPU, the NCCL
// operations enqueued on the backend's stream, so they follow the kernels that wrote their
// inputs), a StagedComm (parallel/comm_staged.h: host staging over the host communicator) on any
// other backend whose memory the host cannot address, and none (null: the host communicator
// serves) on the CPU. TREX_DEVICE_COMM=staged chooses the staged path on CUDA too (an A/B check
// of NCCL). Collective over `host`.
#pragma once
#include <memory>
#include "kernels/backend.h"
#include "parallel/comm.h"

namespace trex::parallel {

std::unique_ptr<Communicator> make_device_comm(Communicator& host, kern::Backend& be);

}  // namespace trex::parallel
