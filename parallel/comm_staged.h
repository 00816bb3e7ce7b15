// StagedComm: a Communicator over one backend's device memory that stages every buffer through
// host memory and runs the collective on a host communicator (MPI). It serves the backends that
// have no collective library of their own, and the device-path tests on a CPU (a backend whose
// memory the host may not touch: tests/unit/fenced_backend.h); on CUDA, NCCL moves device
// memory itself (parallel/comm_nccl.h, chosen by parallel/comm_device.h).
//
// Each operation copies its inputs to a host staging buffer (Backend::to_host, which waits for
// the device work enqueued before it, so the inputs are complete), starts the host collective
// and returns a Handle; completing the Handle (wait, or test returning true) copies the results
// back (Backend::to_device) and waits for that copy. Semantics, in-place forms and element types
// are the host communicator's (parallel/comm.h); results equal the host communicator's on the
// same data bit for bit. Nothing overlaps with device work while a copy runs: this is a
// correctness path, not a fast one.
#pragma once
#include <memory>
#include <span>
#include <string>
#include "kernels/backend.h"
#include "parallel/comm.h"

namespace trex::parallel {

class StagedComm final : public Communicator {
 public:
  // host: a communicator over host memory (same ranks), alive as long as this object; be: the
  // backend whose memory every buffer passed to this communicator is.
  StagedComm(Communicator& host, kern::Backend& be) : host_(&host), be_(be) {}
  // Owns `host` (split()).
  StagedComm(std::unique_ptr<Communicator> host, kern::Backend& be)
      : owned_(std::move(host)), host_(owned_.get()), be_(be) {}

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  std::string backend() const override { return "staged(" + host_->backend() + ")"; }
  void barrier() override;  // the device's work complete, then the host barrier
  [[noreturn]] void abort_job(int code) override;
  std::unique_ptr<Communicator> split(int color, int key) override;

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
  std::unique_ptr<Communicator> owned_;
  Communicator* host_;
  kern::Backend& be_;
};

}  // namespace trex::parallel
