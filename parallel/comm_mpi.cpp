// MpiContext and MpiComm: Communicator over OpenMPI. See comm_mpi.h for the rules.
#include "parallel/comm_mpi.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "core/error.h"
#include "kernels/gemm.h"
#include "kernels/rows.h"

namespace trex::parallel {

namespace {

int world_rank_or_minus1() {
  int init = 0, fin = 0, r = -1;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

[[noreturn]] void mpi_fail(const char* file, int line, const char* call, int rc) {
  char msg[MPI_MAX_ERROR_STRING + 1] = {0};
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) std::snprintf(msg, sizeof msg, "error code %d", rc);
  ::trex::detail::fail(
      file, line, ::trex::detail::cat("MPI call failed on world rank ", world_rank_or_minus1(), ": ", call, ": ", msg));
}

}  // namespace

}  // namespace trex::parallel

// An MPI return code other than MPI_SUCCESS becomes a trex::Error carrying file:line, the call
// and MPI_Error_string (communicators use MPI_ERRORS_RETURN, so errors come back as codes).
#define TREX_CHECK_MPI(call)                                               \
  do {                                                                     \
    int trex_mpi_rc_ = (call);                                             \
    if (trex_mpi_rc_ != MPI_SUCCESS) [[unlikely]]                          \
      ::trex::parallel::mpi_fail(__FILE__, __LINE__, #call, trex_mpi_rc_); \
  } while (0)

namespace trex::parallel {

// f32 staging buffers of bf16 reductions and of the sum reduce-scatter's received blocks, kept
// between calls (a fresh 64 MB buffer costs more in page faults than the conversion itself).
// Shared by a communicator and its requests.
struct StagePool {
  struct Buf {
    std::unique_ptr<float[]> p;
    size_t cap = 0;
  };
  std::vector<Buf> free;
  Buf take(size_t n) {
    for (size_t i = 0; i < free.size(); ++i)
      if (free[i].cap >= n) {
        Buf b = std::move(free[i]);
        free.erase(free.begin() + static_cast<std::ptrdiff_t>(i));
        return b;
      }
    return Buf{std::unique_ptr<float[]>(new float[n]), n};  // uninitialized: widen() writes it all
  }
  // Kept buffers never outnumber those in use at one time so far (one is kept only when given
  // back), and every sum reduce-scatter in flight holds one: 64 covers a backward's gradient
  // buckets in flight; a fresh buffer per bucket costs its page faults at every step.
  void give(Buf b) {
    if (free.size() < 64) free.push_back(std::move(b));
  }
};

namespace {

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32:
      return MPI_FLOAT;
    case DType::F64:
      return MPI_DOUBLE;
    case DType::BF16:
      return MPI_UINT16_T;  // moved as bits; reductions go through f32 staging
    case DType::I32:
      return MPI_INT32_T;
    case DType::I64:
      return MPI_INT64_T;
    case DType::U8:
      return MPI_UINT8_T;
    default:
      TREX_FAIL("no MPI type for ", dtype_name(t));
  }
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::Sum ? MPI_SUM : MPI_MAX; }

// One or more MPI requests, plus what must live until they complete (bf16 f32 staging, int count
// arrays) and what to do once they have (widen back to bf16, move an in-place result).
class MpiRequest final : public Request {
 public:
  std::vector<MPI_Request> reqs;
  std::shared_ptr<StagePool> pool;  // set with stage
  StagePool::Buf stage;
  std::vector<int> ints;
  std::function<void()> finish;

  ~MpiRequest() override {
    if (pool && stage.p) pool->give(std::move(stage));
  }
  float* take_stage(const std::shared_ptr<StagePool>& from, size_t n) {
    pool = from;
    stage = pool->take(n);
    return stage.p.get();
  }

  void wait() override {
    if (!reqs.empty()) TREX_CHECK_MPI(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE));
    complete();
  }
  bool test() override {
    int flag = 1;
    if (!reqs.empty())
      TREX_CHECK_MPI(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &flag, MPI_STATUSES_IGNORE));
    if (flag) complete();
    return flag != 0;
  }
  MPI_Request* add() { return &reqs.emplace_back(MPI_REQUEST_NULL); }

 private:
  void complete() {
    if (done_) return;
    done_ = true;
    if (finish) finish();
  }
  bool done_ = false;
};

void widen(const void* src, float* dst, size_t n) {
  const int64_t len = static_cast<int64_t>(n);
  kern::widen_bf16(static_cast<const bf16*>(src), len, 1, len, dst);  // bf16_to_f32's bits, vectorized
}
void narrow(const float* src, void* dst, size_t n) {
  const int64_t len = static_cast<int64_t>(n);
  kern::to_bf16(src, len, static_cast<bf16*>(dst));  // f32_to_bf16's bits, vectorized
}

// The sum reduce-scatter's pieces: the index in tmp of rank `from`'s block (tmp holds the ranks
// other than `rank`, in rank order), and out [count] = the sum over the `size` ranks in rank order
// of this rank's block (its own `own`, the others' from tmp [size - 1][count]).
size_t slot(int from, int rank) { return static_cast<size_t>(from < rank ? from : from - 1); }

void sum_blocks(float* out, const float* own, const float* tmp, size_t count, int rank, int size) {
  // In blocks that stay in cache; out may be own (in place): each block is read before it is written.
  constexpr size_t kBlock = 2048;
  alignas(64) float acc[kBlock];
  for (size_t i0 = 0; i0 < count; i0 += kBlock) {
    const size_t m = std::min(kBlock, count - i0);
    for (int j = 0; j < size; ++j) {
      const float* x = (j == rank ? own : tmp + slot(j, rank) * count) + i0;
      if (j == 0)
        std::memcpy(acc, x, m * sizeof(float));
      else
        for (size_t i = 0; i < m; ++i) acc[i] += x[i];
    }
    std::memcpy(out + i0, acc, m * sizeof(float));
  }
}

const char* kTooLargeHint = " exceed the MPI count limit of this communicator (max_chunk = ";

}  // namespace

// --- MpiContext --------------------------------------------------------------------------------

MpiContext::MpiContext(int* argc, char*** argv, ThreadLevel need) {
  static_assert(MPI_THREAD_SINGLE < MPI_THREAD_FUNNELED && MPI_THREAD_FUNNELED < MPI_THREAD_SERIALIZED &&
                MPI_THREAD_SERIALIZED < MPI_THREAD_MULTIPLE);
  const int levels[] = {MPI_THREAD_SINGLE, MPI_THREAD_FUNNELED, MPI_THREAD_SERIALIZED, MPI_THREAD_MULTIPLE};
  int init = 0, prov = MPI_THREAD_SINGLE;
  TREX_CHECK_MPI(MPI_Initialized(&init));
  if (!init) {
    TREX_CHECK_MPI(MPI_Init_thread(argc, argv, levels[static_cast<int>(need)], &prov));
    owns_ = true;
  } else {
    TREX_CHECK_MPI(MPI_Query_thread(&prov));
  }
  TREX_CHECK_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  TREX_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  TREX_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  for (int i = 0; i < 4; ++i)
    if (prov == levels[i]) provided_ = static_cast<ThreadLevel>(i);
  if (static_cast<int>(provided_) < static_cast<int>(need)) {
    if (owns_) MPI_Finalize();
    owns_ = false;
    TREX_FAIL("the MPI library provides thread level ", static_cast<int>(provided_), " but trex needs ",
              static_cast<int>(need),
              " (0 single, 1 funneled, 2 serialized, 3 multiple); use an MPI built with "
              "thread support (OpenMPI: --enable-mpi-thread-multiple)");
  }
}

MpiContext::~MpiContext() {
  int fin = 0;
  MPI_Finalized(&fin);
  if (owns_ && !fin) MPI_Finalize();
}

std::unique_ptr<Communicator> MpiContext::world(size_t max_chunk) const {
  MPI_Comm dup = MPI_COMM_NULL;
  TREX_CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &dup));
  return std::make_unique<MpiComm>(dup, max_chunk);
}

void MpiContext::abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();
}

bool MpiContext::launched() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"})
    if (const char* e = std::getenv(v); e && *e) return true;
  return false;
}

int MpiContext::local_size(int fallback) {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
    if (const char* e = std::getenv(v); e && *e) {
      const int n = std::atoi(e);
      if (n > 0) return n;
    }
  return fallback;
}

// --- MpiComm -----------------------------------------------------------------------------------

MpiComm::MpiComm(MPI_Comm comm, size_t max_chunk)
    : comm_(comm), max_chunk_(max_chunk), pool_(std::make_shared<StagePool>()) {
  TREX_CHECK(comm != MPI_COMM_NULL, "MpiComm needs a communicator (got MPI_COMM_NULL)");
  TREX_CHECK(max_chunk >= 1 && max_chunk <= static_cast<size_t>(INT_MAX), "max_chunk ", max_chunk,
             " outside [1, INT_MAX]");
  TREX_CHECK_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  TREX_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
  TREX_CHECK_MPI(MPI_Comm_size(comm_, &size_));
  // The reduce-scatter's point-to-point messages travel on their own communicator, so they never
  // match a caller's isend / irecv tags on comm_.
  TREX_CHECK_MPI(MPI_Comm_dup(comm_, &rs_comm_));
  TREX_CHECK_MPI(MPI_Comm_set_errhandler(rs_comm_, MPI_ERRORS_RETURN));
}

MpiComm::~MpiComm() {
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin && rs_comm_ != MPI_COMM_NULL) MPI_Comm_free(&rs_comm_);
  if (!fin && comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_SELF && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiComm::barrier() { TREX_CHECK_MPI(MPI_Barrier(comm_)); }

void MpiComm::abort_job(int code) {
  MPI_Abort(comm_, code);  // OpenMPI ends every process of the job
  std::abort();
}

std::unique_ptr<Communicator> MpiComm::split(int color, int key) {
  MPI_Comm nc = MPI_COMM_NULL;
  TREX_CHECK_MPI(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &nc));
  if (nc == MPI_COMM_NULL) return nullptr;
  return std::make_unique<MpiComm>(nc, max_chunk_);
}

Handle MpiComm::do_iall_reduce(const void* send, void* recv, size_t count, DType t, ReduceOp op) {
  return all_reduce_impl(send, recv, count, t, op, false);
}
void MpiComm::do_all_reduce(const void* send, void* recv, size_t count, DType t, ReduceOp op) {
  all_reduce_impl(send, recv, count, t, op, true).wait();
}
void MpiComm::do_reduce_scatter(const void* send, void* recv, size_t count, DType t, ReduceOp op) {
  reduce_scatter_impl(send, recv, count, t, op, true).wait();
}
Handle MpiComm::do_ireduce_scatter(const void* send, void* recv, size_t count, DType t, ReduceOp op) {
  return reduce_scatter_impl(send, recv, count, t, op, false);
}
void MpiComm::do_all_gather(const void* send, void* recv, size_t count, DType t) {
  all_gather_impl(send, recv, count, t, true).wait();
}
Handle MpiComm::do_iall_gather(const void* send, void* recv, size_t count, DType t) {
  return all_gather_impl(send, recv, count, t, false);
}
void MpiComm::do_broadcast(void* buf, size_t count, DType t, int root) {
  broadcast_impl(buf, count, t, root, true).wait();
}
Handle MpiComm::do_ibroadcast(void* buf, size_t count, DType t, int root) {
  return broadcast_impl(buf, count, t, root, false);
}

Handle MpiComm::all_reduce_impl(const void* send, void* recv, size_t count, DType t, ReduceOp op, bool blocking) {
  if (count == 0) return Handle();
  auto req = std::make_unique<MpiRequest>();
  MpiRequest* r = req.get();
  const void* src = send;
  void* dst = recv;
  MPI_Datatype mt = mpi_type(t);
  size_t es = dtype_size(t);
  if (t == DType::BF16) {  // sum / max in f32, rounded to bf16 once
    float* st = r->take_stage(pool_, count);
    widen(send, st, count);
    src = dst = st;
    mt = MPI_FLOAT;
    es = 4;
    r->finish = [st, recv, count] { narrow(st, recv, count); };
  }
  for (size_t off = 0; off < count; off += max_chunk_) {
    const int n = static_cast<int>(std::min(max_chunk_, count - off));
    char* d = static_cast<char*>(dst) + off * es;
    const void* s = src == dst ? MPI_IN_PLACE : static_cast<const char*>(src) + off * es;
    if (blocking)
      TREX_CHECK_MPI(MPI_Allreduce(s, d, n, mt, mpi_op(op), comm_));
    else
      TREX_CHECK_MPI(MPI_Iallreduce(s, d, n, mt, mpi_op(op), comm_, r->add()));
  }
  return Handle(std::move(req));
}

Handle MpiComm::reduce_scatter_impl(const void* send, void* recv, size_t count, DType t, ReduceOp op, bool blocking) {
  TREX_CHECK(count <= max_chunk_, "reduce_scatter: ", count, " elements per rank", kTooLargeHint, max_chunk_,
             "); use smaller buckets");
  if (count == 0) return Handle();
  auto req = std::make_unique<MpiRequest>();
  MpiRequest* r = req.get();
  const size_t es = dtype_size(t);
  const int n = static_cast<int>(count);
  const bool in_place = static_cast<const char*>(send) + rank_ * count * es == static_cast<const char*>(recv);
  if (op == ReduceOp::Sum && (t == DType::F32 || t == DType::BF16)) {
    // Direct exchange (comm_mpi.h): this rank's block j goes to rank j, the size - 1 others'
    // copies of block rank_ come into tmp, and once all have arrived they are summed in rank order.
    const size_t others = static_cast<size_t>(size_ - 1) * count;
    const float* src = static_cast<const float*>(send);
    float* tmp = nullptr;
    if (t == DType::BF16) {
      float* st = r->take_stage(pool_, count * size_ + others);
      widen(send, st, count * size_);
      src = st, tmp = st + count * size_;
      float* own = st + rank_ * count;
      r->finish = [own, tmp, recv, count, rank = rank_, size = size_] {
        sum_blocks(own, own, tmp, count, rank, size);
        narrow(own, recv, count);
      };
    } else {
      tmp = others ? r->take_stage(pool_, others) : nullptr;
      const float* own = src + rank_ * count;
      r->finish = [own, tmp, recv, count, rank = rank_, size = size_] {
        sum_blocks(static_cast<float*>(recv), own, tmp, count, rank, size);
      };
    }
    for (int s = 1; s < size_; ++s) {  // receive from rank_ - s, send to rank_ + s
      const int from = (rank_ - s + size_) % size_;
      TREX_CHECK_MPI(MPI_Irecv(tmp + slot(from, rank_) * count, n, MPI_FLOAT, from, 0, rs_comm_, r->add()));
    }
    for (int s = 1; s < size_; ++s) {
      const int to = (rank_ + s) % size_;
      TREX_CHECK_MPI(MPI_Isend(src + to * count, n, MPI_FLOAT, to, 0, rs_comm_, r->add()));
    }
  } else if (in_place) {
    void* base = const_cast<void*>(send);
    if (blocking)
      TREX_CHECK_MPI(MPI_Reduce_scatter_block(MPI_IN_PLACE, base, n, mpi_type(t), mpi_op(op), comm_));
    else
      TREX_CHECK_MPI(MPI_Ireduce_scatter_block(MPI_IN_PLACE, base, n, mpi_type(t), mpi_op(op), comm_, r->add()));
    if (rank_ != 0)  // MPI leaves the in-place result in the first block
      r->finish = [base, recv, count, es] { std::memcpy(recv, base, count * es); };
  } else {
    if (blocking)
      TREX_CHECK_MPI(MPI_Reduce_scatter_block(send, recv, n, mpi_type(t), mpi_op(op), comm_));
    else
      TREX_CHECK_MPI(MPI_Ireduce_scatter_block(send, recv, n, mpi_type(t), mpi_op(op), comm_, r->add()));
  }
  return Handle(std::move(req));
}

Handle MpiComm::all_gather_impl(const void* send, void* recv, size_t count, DType t, bool blocking) {
  TREX_CHECK(count <= max_chunk_, "all_gather: ", count, " elements per rank", kTooLargeHint, max_chunk_,
             "); use smaller buckets");
  if (count == 0) return Handle();
  auto req = std::make_unique<MpiRequest>();
  const size_t es = dtype_size(t);
  const int n = static_cast<int>(count);
  const bool in_place = static_cast<const char*>(recv) + rank_ * count * es == static_cast<const char*>(send);
  const void* s = in_place ? MPI_IN_PLACE : send;
  const int sn = in_place ? 0 : n;
  const MPI_Datatype st = in_place ? MPI_DATATYPE_NULL : mpi_type(t);
  if (blocking)
    TREX_CHECK_MPI(MPI_Allgather(s, sn, st, recv, n, mpi_type(t), comm_));
  else
    TREX_CHECK_MPI(MPI_Iallgather(s, sn, st, recv, n, mpi_type(t), comm_, req->add()));
  return Handle(std::move(req));
}

Handle MpiComm::do_iall_to_all_v(const void* send, std::span<const size_t> send_counts,
                                 std::span<const size_t> send_displs, void* recv, std::span<const size_t> recv_counts,
                                 std::span<const size_t> recv_displs, DType t) {
  auto req = std::make_unique<MpiRequest>();
  const size_t n = static_cast<size_t>(size_);
  req->ints.resize(4 * n);
  const std::span<const size_t> in[4] = {send_counts, send_displs, recv_counts, recv_displs};
  const char* names[4] = {"send_counts", "send_displs", "recv_counts", "recv_displs"};
  for (int a = 0; a < 4; ++a)
    for (size_t i = 0; i < n; ++i) {
      TREX_CHECK(in[a][i] <= max_chunk_, "all_to_all_v: ", names[a], "[", i, "] = ", in[a][i], " elements",
                 kTooLargeHint, max_chunk_, "); send fewer elements per call");
      req->ints[a * n + i] = static_cast<int>(in[a][i]);
    }
  const int* p = req->ints.data();
  TREX_CHECK_MPI(
      MPI_Ialltoallv(send, p, p + n, mpi_type(t), recv, p + 2 * n, p + 3 * n, mpi_type(t), comm_, req->add()));
  return Handle(std::move(req));
}

Handle MpiComm::broadcast_impl(void* buf, size_t count, DType t, int root, bool blocking) {
  auto req = std::make_unique<MpiRequest>();
  const size_t es = dtype_size(t);
  for (size_t off = 0; off < count; off += max_chunk_) {
    const int n = static_cast<int>(std::min(max_chunk_, count - off));
    char* p = static_cast<char*>(buf) + off * es;
    if (blocking)
      TREX_CHECK_MPI(MPI_Bcast(p, n, mpi_type(t), root, comm_));
    else
      TREX_CHECK_MPI(MPI_Ibcast(p, n, mpi_type(t), root, comm_, req->add()));
  }
  return Handle(std::move(req));
}

Handle MpiComm::do_isend(const void* buf, size_t count, DType t, int dst, int tag) {
  // The tag is checked by MPI (0 .. MPI_TAG_UB); a bad one comes back as MPI_ERR_TAG.
  auto req = std::make_unique<MpiRequest>();
  const size_t es = dtype_size(t);
  for (size_t off = 0; off < count; off += max_chunk_) {  // chunks of one tag arrive in order
    const int n = static_cast<int>(std::min(max_chunk_, count - off));
    TREX_CHECK_MPI(MPI_Isend(static_cast<const char*>(buf) + off * es, n, mpi_type(t), dst, tag, comm_, req->add()));
  }
  if (count == 0) TREX_CHECK_MPI(MPI_Isend(buf, 0, mpi_type(t), dst, tag, comm_, req->add()));
  return Handle(std::move(req));
}

Handle MpiComm::do_irecv(void* buf, size_t count, DType t, int src, int tag) {
  TREX_CHECK(tag >= 0, "recv tag ", tag, " must be >= 0 (MPI_ANY_TAG is not part of the interface)");
  auto req = std::make_unique<MpiRequest>();
  const size_t es = dtype_size(t);
  for (size_t off = 0; off < count; off += max_chunk_) {
    const int n = static_cast<int>(std::min(max_chunk_, count - off));
    TREX_CHECK_MPI(MPI_Irecv(static_cast<char*>(buf) + off * es, n, mpi_type(t), src, tag, comm_, req->add()));
  }
  if (count == 0) TREX_CHECK_MPI(MPI_Irecv(buf, 0, mpi_type(t), src, tag, comm_, req->add()));
  return Handle(std::move(req));
}

}  // namespace trex::parallel
