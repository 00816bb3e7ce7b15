// The MPI implementation of Communicator (OpenMPI; host memory), and MpiContext, the RAII owner
// of MPI_Init_thread / MPI_Finalize. Only the launcher (cli, test main) includes this header;
// everything else takes a Communicator&.
//
// Non-blocking collectives map to MPI_Iallreduce, MPI_Iallgather, MPI_Ialltoallv, MPI_Ibcast,
// MPI_Isend / MPI_Irecv. The f32 / bf16 sum reduce-scatter (the gradient buckets' and the
// context-parallel key gradients') is a direct exchange instead of MPI_(I)reduce_scatter_block:
// every rank sends block j of its buffer to rank j (MPI_Isend) and receives its own block from the
// others (MPI_Irecv), all posted at the start, then sums them in rank order when they are in
// (Handle::wait / test). On the 2-core test machine OpenMPI 4.1's MPI_Ireduce_scatter_block took
// 28 ms for a 32 MB buffer over 2 ranks and MPI_Reduce_scatter_block 25-30 ms, against 5 ms for
// the exchange and sum; each rank moves the same bytes as a ring. Other types and max keep MPI's.
// OpenMPI progresses non-blocking operations only inside MPI
// calls: Handle::test() (or any MPI call) drives them, so a compute loop that wants overlap calls
// test() now and then (GradSync does so in mark_ready). The blocking forms call the blocking MPI
// collectives (OpenMPI's tuned algorithms; measured 2x faster than libnbc for a 64 MB all-reduce).
// Counts above MpiCommOptions::max_chunk (INT_MAX by default: MPI-3 counts are int) are split
// into several MPI operations for the element-wise ops (all_reduce, broadcast, send/recv) and
// refused with a clear error for reduce_scatter, all_gather and all_to_all_v.
#pragma once
// The C API only (the deprecated MPI C++ bindings are not used and warn under -Wextra).
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <climits>
#include <memory>

#include "parallel/comm.h"

namespace trex::parallel {

enum class ThreadLevel { Single = 0, Funneled = 1, Serialized = 2, Multiple = 3 };

class MpiContext {
 public:
  // MPI_Init_thread requesting `need` (Serialized: any thread, one at a time), unless MPI is
  // already initialized; throws if the library provides less than `need`.
  MpiContext(int* argc, char*** argv, ThreadLevel need = ThreadLevel::Serialized);
  ~MpiContext();  // MPI_Finalize when this object initialized MPI (destroy communicators first)
  MpiContext(const MpiContext&) = delete;
  MpiContext& operator=(const MpiContext&) = delete;

  int world_rank() const { return rank_; }
  int world_size() const { return size_; }
  ThreadLevel provided() const { return provided_; }
  // A new communicator over all processes (a duplicate of MPI_COMM_WORLD, MPI_ERRORS_RETURN).
  std::unique_ptr<Communicator> world(size_t max_chunk = INT_MAX) const;
  // Ends every process of the job (MPI_Abort on MPI_COMM_WORLD).
  [[noreturn]] static void abort(int code);
  // True when mpirun / srun (OpenMPI, PMIx, PMI) started this process (checked before MPI_Init).
  static bool launched();
  // Ranks of this job on this node (OpenMPI's OMPI_COMM_WORLD_LOCAL_SIZE, else MPICH's
  // MPI_LOCALNRANKS, else SLURM_NTASKS_PER_NODE, else `fallback`).
  static int local_size(int fallback);

 private:
  bool owns_ = false;
  int rank_ = 0, size_ = 1;
  ThreadLevel provided_ = ThreadLevel::Single;
};

struct StagePool;  // comm_mpi.cpp

class MpiComm final : public Communicator {
 public:
  // Takes ownership of `comm` (MPI_Comm_free on destruction) and sets MPI_ERRORS_RETURN on it.
  // max_chunk: most elements per MPI call (tests lower it to exercise the splitting); must be
  // the same on every rank.
  explicit MpiComm(MPI_Comm comm, size_t max_chunk = INT_MAX);
  ~MpiComm() override;
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }
  void barrier() override;
  [[noreturn]] void abort_job(int code) override;
  std::unique_ptr<Communicator> split(int color, int key) override;
  MPI_Comm native() const { return comm_; }
  size_t max_chunk() const { return max_chunk_; }

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
  void do_all_reduce(const void* send, void* recv, size_t count, DType t, ReduceOp op) override;
  void do_reduce_scatter(const void* send, void* recv, size_t count, DType t, ReduceOp op) override;
  void do_all_gather(const void* send, void* recv, size_t count, DType t) override;
  void do_broadcast(void* buf, size_t count, DType t, int root) override;

 private:
  // One implementation per collective; `blocking` selects MPI_Allreduce or MPI_Iallreduce etc.
  Handle all_reduce_impl(const void* send, void* recv, size_t count, DType t, ReduceOp op, bool blocking);
  Handle reduce_scatter_impl(const void* send, void* recv, size_t count, DType t, ReduceOp op, bool blocking);
  Handle all_gather_impl(const void* send, void* recv, size_t count, DType t, bool blocking);
  Handle broadcast_impl(void* buf, size_t count, DType t, int root, bool blocking);
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm rs_comm_ = MPI_COMM_NULL;  // duplicate of comm_ for the reduce-scatter's messages
  int rank_ = 0, size_ = 1;
  size_t max_chunk_;
  std::shared_ptr<StagePool> pool_;  // reused f32 staging buffers of bf16 reductions
};

}  // namespace trex::parallel
