// The NCCL implementation of Communicator (GPU device memory). Built only with TREX_WITH_NCCL
// (CMake option TREX_CUDA); compiled and linked on the development machine, not yet run on a
// GPU (docs/PARALLEL.md).
//
// - Every buffer is a device pointer on this communicator's device.
// - Operations are enqueued on the communicator's CUDA stream (its own, or one the caller gives,
//   e.g. the compute stream, so that inputs written there are ordered before the collective).
//   A Handle completes when an event recorded after the operation has; wait() blocks the host
//   on it and then checks ncclCommGetAsyncError.
// - BF16 reductions: widened to an f32 stream-ordered staging buffer, reduced in f32, rounded
//   once (the same result as the MPI backend; twice the bytes on the wire).
// - send / recv: NCCL has no tags; messages between a pair arrive in the order they were posted
//   whatever the tag (the interface only promises order per tag, so this is compatible).
// - split(): ncclCommSplit (collective over every rank of this communicator).
#pragma once
#if TREX_WITH_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <memory>

#include "kernels/backend.h"
#include "parallel/comm.h"

namespace trex::parallel {

class NcclComm final : public Communicator {
 public:
  // Collective over `bootstrap` (an MpiComm, say): rank 0 creates the NCCL unique id and
  // broadcasts it; every rank then joins on `device` (cudaSetDevice is called). stream: nullptr
  // creates a non-blocking stream owned by the communicator.
  static std::unique_ptr<NcclComm> create(Communicator& bootstrap, int device, cudaStream_t stream = nullptr);
  // Takes ownership of `comm`.
  NcclComm(ncclComm_t comm, int device, cudaStream_t stream);
  ~NcclComm() override;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  void barrier() override;  // a 1-element all-reduce, then a stream synchronize
  std::unique_ptr<Communicator> split(int color, int key) override;
  ncclComm_t native() const { return comm_; }
  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }

 protected:
  Handle do_iall_reduce(const void* send, void* recv, size_t count, DType t, ReduceOp op) override;
  Handle do_ireduce_scatter(const void* send, void* recv, size_t count, DType t, ReduceOp op) override;
  Handle do_iall_gather(const void* send, void* recv, size_t count, DType t) override;
  Handle do_iall_to_all_v(const void* send, std::span<const size_t> send_counts, std::span<const size_t> send_displs,
                          void* recv, std::span<const size_t> recv_counts, std::span<const size_t> recv_displs,
                          DType t) override;
  Handle do_ibroadcast(void* buf, size_t count, DType t, int root) override;
  Handle do_isend(const void* buf, size_t count, DType t, int dst, int tag) override;
  Handle do_irecv(void* buf, size_t count, DType t, int src, int tag) override;

 private:
  Handle record();  // an event after the work enqueued so far
  ncclComm_t comm_ = nullptr;
  int device_ = 0, rank_ = 0, size_ = 1;
  cudaStream_t stream_ = nullptr;
  bool own_stream_ = false;
  int32_t* scratch_ = nullptr;  // device int for barrier()
};

// An NcclComm on the calling thread's current CUDA device (the one the CUDA backend set) whose
// operations are enqueued on `stream` (a kern::Backend's stream(): the cudaStream_t it wraps), so
// that they are ordered after the kernels that wrote their inputs. Collective over `bootstrap`.
std::unique_ptr<Communicator> make_nccl_comm(Communicator& bootstrap, kern::Stream stream);

}  // namespace trex::parallel
#endif  // TREX_WITH_NCCL
