// Communicator: the vendor-neutral interface of trex's parallel layer. model/ and train/ code
// receive a Communicator& and never see MPI or NCCL; parallel/comm_mpi.h (OpenMPI, host memory)
// and parallel/comm_nccl.h (NCCL, device memory, compiled with TREX_WITH_NCCL) implement it.
//
// Every collective has an asynchronous form (`i` prefix) that returns a Handle, and a blocking
// form that waits on it. Rules shared by all implementations:
//  - Counts and displacements are in elements. Element types: F32, F64, BF16, I32, I64, U8
//    (trex::DType). Reductions: Sum and Max. BF16 sums are accumulated in f32 precision and
//    rounded to bf16 once (the MPI backend converts to an f32 staging buffer; see PARALLEL.md).
//  - Buffers must stay valid and must not be touched until the Handle has completed.
//  - Every rank of a communicator starts the same collectives in the same order.
//  - A communicator is used by one thread at a time (MPI_THREAD_SERIALIZED).
//  - Errors throw trex::Error with file:line and the backend's message.
#pragma once
#include <cstddef>
#include <cstdlib>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/log.h"

namespace trex::parallel {

enum class ReduceOp { Sum, Max };

// The DType of a C++ element type accepted by the communicators.
template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>)
    return DType::F32;
  else if constexpr (std::is_same_v<T, double>)
    return DType::F64;
  else if constexpr (std::is_same_v<T, bf16>)
    return DType::BF16;
  else if constexpr (std::is_same_v<T, int32_t>)
    return DType::I32;
  else if constexpr (std::is_same_v<T, int64_t>)
    return DType::I64;
  else if constexpr (std::is_same_v<T, uint8_t>)
    return DType::U8;
  else
    static_assert(sizeof(T) == 0, "communicators take float, double, bf16, int32_t, int64_t, uint8_t");
}

// True for the element types the communicators accept.
inline bool comm_dtype_ok(DType t) {
  return t == DType::F32 || t == DType::F64 || t == DType::BF16 || t == DType::I32 || t == DType::I64 || t == DType::U8;
}

// Backend side of a Handle: one or more operations in flight.
class Request {
 public:
  virtual ~Request() = default;
  virtual void wait() = 0;  // blocks until complete; throws on error
  virtual bool test() = 0;  // true when complete (also drives progress)
};

// An operation in flight. Move-only; an empty Handle is complete. The destructor waits if the
// operation is still pending (a collective is never abandoned); errors there are logged.
class Handle {
 public:
  Handle() = default;
  explicit Handle(std::unique_ptr<Request> r) : req_(std::move(r)) {}
  Handle(Handle&&) noexcept = default;
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      finish_quietly();
      req_ = std::move(o.req_);
    }
    return *this;
  }
  ~Handle() { finish_quietly(); }

  void wait() {
    if (!req_) return;
    auto r = std::move(req_);
    r->wait();
  }
  bool test() {
    if (!req_) return true;
    if (!req_->test()) return false;
    req_.reset();
    return true;
  }
  bool pending() const { return req_ != nullptr; }

 private:
  void finish_quietly() noexcept {
    try {
      wait();
    } catch (const std::exception& e) {
      TREX_LOG_WARN("communication handle dropped with an error: ", e.what());
    }
  }
  std::unique_ptr<Request> req_;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "mpi", "nccl", ...

  // --- asynchronous collectives -------------------------------------------------------------
  // recv[i] = op over ranks of send[i], i < count. In place when send == recv.
  Handle iall_reduce(const void* send, void* recv, size_t count, DType t, ReduceOp op) {
    check_type(t, "all_reduce");
    return do_iall_reduce(send, recv, count, t, op);
  }
  // send: [size() * count], block r = elements [r * count, (r + 1) * count); recv: [count] =
  // op over ranks of their block rank(). In place when recv == send + rank() * count (elements);
  // the other blocks of send are undefined afterwards.
  Handle ireduce_scatter(const void* send, void* recv, size_t count, DType t, ReduceOp op) {
    check_type(t, "reduce_scatter");
    return do_ireduce_scatter(send, recv, count, t, op);
  }
  // send: [count]; recv: [size() * count], block r from rank r. In place when
  // send == recv + rank() * count (elements).
  Handle iall_gather(const void* send, void* recv, size_t count, DType t) {
    check_type(t, "all_gather");
    return do_iall_gather(send, recv, count, t);
  }
  // Counts and displacements [size()] in elements: to rank r goes
  // send[send_displs[r], + send_counts[r]); from rank r comes recv[recv_displs[r], + recv_counts[r]).
  // Zero counts are allowed. The count arrays are copied (they may go away after the call).
  Handle iall_to_all_v(const void* send, std::span<const size_t> send_counts, std::span<const size_t> send_displs,
                       void* recv, std::span<const size_t> recv_counts, std::span<const size_t> recv_displs, DType t) {
    check_type(t, "all_to_all_v");
    const size_t n = static_cast<size_t>(size());
    TREX_CHECK(send_counts.size() == n && send_displs.size() == n && recv_counts.size() == n && recv_displs.size() == n,
               "all_to_all_v: count / displacement arrays must have size() = ", n, " entries");
    return do_iall_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs, t);
  }
  // buf[count] from `root` to every rank.
  Handle ibroadcast(void* buf, size_t count, DType t, int root) {
    check_type(t, "broadcast");
    check_peer(root, "broadcast root");
    return do_ibroadcast(buf, count, t, root);
  }
  // Point to point. Messages between a pair with the same tag arrive in order.
  Handle isend(const void* buf, size_t count, DType t, int dst, int tag) {
    check_type(t, "send");
    check_peer(dst, "send destination");
    return do_isend(buf, count, t, dst, tag);
  }
  Handle irecv(void* buf, size_t count, DType t, int src, int tag) {
    check_type(t, "recv");
    check_peer(src, "recv source");
    return do_irecv(buf, count, t, src, tag);
  }

  // --- blocking forms -----------------------------------------------------------------------
  void all_reduce(const void* send, void* recv, size_t count, DType t, ReduceOp op) {
    check_type(t, "all_reduce");
    do_all_reduce(send, recv, count, t, op);
  }
  void reduce_scatter(const void* send, void* recv, size_t count, DType t, ReduceOp op) {
    check_type(t, "reduce_scatter");
    do_reduce_scatter(send, recv, count, t, op);
  }
  void all_gather(const void* send, void* recv, size_t count, DType t) {
    check_type(t, "all_gather");
    do_all_gather(send, recv, count, t);
  }
  void all_to_all_v(const void* send, std::span<const size_t> send_counts, std::span<const size_t> send_displs,
                    void* recv, std::span<const size_t> recv_counts, std::span<const size_t> recv_displs, DType t) {
    iall_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs, t).wait();
  }
  void broadcast(void* buf, size_t count, DType t, int root) {
    check_type(t, "broadcast");
    check_peer(root, "broadcast root");
    do_broadcast(buf, count, t, root);
  }
  void send(const void* buf, size_t count, DType t, int dst, int tag) { isend(buf, count, t, dst, tag).wait(); }
  void recv(void* buf, size_t count, DType t, int src, int tag) { irecv(buf, count, t, src, tag).wait(); }
  virtual void barrier() = 0;
  // Ends the whole parallel job, every rank (a rank that cannot go on while the others would
  // wait for it forever: train/loop.cpp's watchdog). MPI: MPI_Abort; the default std::abort.
  // May be called from any thread.
  [[noreturn]] virtual void abort_job(int code) { std::abort(); }

  // --- typed helpers (T: float, double, bf16, int32_t, int64_t, uint8_t) ----------------------
  template <class T>
  Handle iall_reduce(T* data, size_t n, ReduceOp op = ReduceOp::Sum) {  // in place
    return iall_reduce(data, data, n, dtype_of<T>(), op);
  }
  template <class T>
  void all_reduce(T* data, size_t n, ReduceOp op = ReduceOp::Sum) {  // in place
    all_reduce(data, data, n, dtype_of<T>(), op);
  }
  template <class T>
  T all_reduce_value(T v, ReduceOp op = ReduceOp::Sum) {  // one scalar (norms, flags)
    all_reduce(&v, 1, op);
    return v;
  }
  template <class T>
  void broadcast(T* data, size_t n, int root) {
    broadcast(data, n, dtype_of<T>(), root);
  }

  // --- sub-communicators ----------------------------------------------------------------------
  // Ranks passing the same color >= 0 form a new communicator, ordered by (key, rank); a rank
  // passing color < 0 gets nullptr. Collective over every rank of this communicator.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
  // The group `members` (ranks of this communicator, in the new rank order) that contains the
  // caller. Collective over every rank of this communicator; each passes the members of its own
  // group; groups must be equal or disjoint (a partition, as the groups of ParallelDims are).
  std::unique_ptr<Communicator> group(std::span<const int> members) {
    int me = -1, color = -1;
    for (size_t i = 0; i < members.size(); ++i) {
      TREX_CHECK(members[i] >= 0 && members[i] < size(), "group member ", members[i], " outside [0, ", size(), ")");
      if (members[i] == rank()) me = static_cast<int>(i);
      if (color < 0 || members[i] < color) color = members[i];
    }
    TREX_CHECK(me >= 0, "group: rank ", rank(), " is not in the member list it passed");
    return split(color, me);
  }

 protected:
  virtual Handle do_iall_reduce(const void* send, void* recv, size_t count, DType t, ReduceOp op) = 0;
  virtual Handle do_ireduce_scatter(const void* send, void* recv, size_t count, DType t, ReduceOp op) = 0;
  virtual Handle do_iall_gather(const void* send, void* recv, size_t count, DType t) = 0;
  virtual Handle do_iall_to_all_v(const void* send, std::span<const size_t> send_counts,
                                  std::span<const size_t> send_displs, void* recv, std::span<const size_t> recv_counts,
                                  std::span<const size_t> recv_displs, DType t) = 0;
  virtual Handle do_ibroadcast(void* buf, size_t count, DType t, int root) = 0;
  virtual Handle do_isend(const void* buf, size_t count, DType t, int dst, int tag) = 0;
  virtual Handle do_irecv(void* buf, size_t count, DType t, int src, int tag) = 0;
  // Blocking collectives. By default they wait on the asynchronous form; a backend overrides them
  // when its blocking calls are faster (OpenMPI: the tuned blocking algorithms beat libnbc).
  virtual void do_all_reduce(const void* send, void* recv, size_t count, DType t, ReduceOp op) {
    do_iall_reduce(send, recv, count, t, op).wait();
  }
  virtual void do_reduce_scatter(const void* send, void* recv, size_t count, DType t, ReduceOp op) {
    do_ireduce_scatter(send, recv, count, t, op).wait();
  }
  virtual void do_all_gather(const void* send, void* recv, size_t count, DType t) {
    do_iall_gather(send, recv, count, t).wait();
  }
  virtual void do_broadcast(void* buf, size_t count, DType t, int root) { do_ibroadcast(buf, count, t, root).wait(); }

 private:
  static void check_type(DType t, const char* what) {
    TREX_CHECK(comm_dtype_ok(t), what, ": element type ", dtype_name(t),
               " is not supported (F32, F64, BF16, I32, I64, U8)");
  }
  void check_peer(int r, const char* what) const {
    TREX_CHECK(r >= 0 && r < size(), what, " ", r, " outside [0, ", size(), ")");
  }
};

}  // namespace trex::parallel
