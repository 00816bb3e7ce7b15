// AllToAllDispatcher (model/moe_dispatch.h): the routed rows travel to the rank holding their
// expert over all-to-all-v and back.
#include <algorithm>
#include <cstring>
#include "core/error.h"
#include "core/parallel.h"
#include "core/timer.h"
#include "model/moe_dispatch.h"

namespace trex::model {

namespace {

// Row counts / offsets -> element counts / offsets of rows of width w.
std::vector<size_t> times(const std::vector<size_t>& v, int64_t w) {
  std::vector<size_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = v[i] * (size_t)w;
  return o;
}

// recv [Rl, w] (received order) -> local [Rl, w] (local order), and back.
void to_local(const MoeRoute& r, const float* recv, float* local, int64_t w) {
  parallel_for(r.rows, 256, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) std::memcpy(local + i * w, recv + (int64_t)r.perm[i] * w, w * sizeof(float));
  });
}
void from_local(const MoeRoute& r, const float* local, float* recv, int64_t w) {
  parallel_for(r.rows, 256, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) std::memcpy(recv + (int64_t)r.perm[i] * w, local + i * w, w * sizeof(float));
  });
}

// Rows of at least one (an empty buffer still gets a valid pointer).
int64_t at_least_one(int64_t rows) { return std::max<int64_t>(rows, 1); }

}  // namespace

// Exchanges the per-expert row counts (a small all-to-all of int64), then fills the rows to and
// from every rank, the local experts' offsets and the received -> local permutation.
void AllToAllDispatcher::plan(const std::vector<int64_t>& offsets, int64_t d, StackArena& A, MoeRoute& r) const {
  const double t0 = now_ms();
  parallel::Communicator& comm = *ep_.comm;
  const int P = comm.size();
  const int64_t El = ep_.count, E = (int64_t)offsets.size() - 1;
  TREX_CHECK(El > 0 && El * P == E, "expert parallel: ", E, " experts do not split into ", P, " ranks of ", El);
  TREX_CHECK(ep_.first == comm.rank() * El, "expert parallel: rank ", comm.rank(), " holds experts from ", ep_.first,
             ", expected ", comm.rank() * El);
  // Row counts per expert: mine for every expert out, every source's for my experts in.
  std::vector<int64_t> mine(E), theirs(E);
  for (int64_t e = 0; e < E; ++e) mine[e] = offsets[e + 1] - offsets[e];
  std::vector<size_t> cnt(P, (size_t)El), off(P);
  for (int p = 0; p < P; ++p) off[p] = (size_t)(p * El);
  comm.all_to_all_v(mine.data(), cnt, off, theirs.data(), cnt, off, DType::I64);

  r.first = ep_.first;
  r.send_rows.assign(P, 0), r.send_off.assign(P, 0), r.recv_rows.assign(P, 0), r.recv_off.assign(P, 0);
  for (int p = 0; p < P; ++p) {
    r.send_off[p] = (size_t)offsets[p * El];
    r.send_rows[p] = (size_t)(offsets[(p + 1) * El] - offsets[p * El]);
    for (int64_t j = 0; j < El; ++j) r.recv_rows[p] += (size_t)theirs[p * El + j];
    if (p > 0) r.recv_off[p] = r.recv_off[p - 1] + r.recv_rows[p - 1];
  }
  r.rows = (int64_t)(r.recv_off[P - 1] + r.recv_rows[P - 1]);
  r.offsets.assign(El + 1, 0);
  for (int64_t j = 0; j < El; ++j) {
    r.offsets[j + 1] = r.offsets[j];
    for (int p = 0; p < P; ++p) r.offsets[j + 1] += theirs[p * El + j];
  }
  // Local row of (expert j, source p, k-th row) <- received row recv_off[p] + (rows of p before j) + k.
  r.perm = A.alloc<int32_t>(at_least_one(r.rows));
  int64_t lr = 0;
  for (int64_t j = 0; j < El; ++j)
    for (int p = 0; p < P; ++p) {
      int64_t src = (int64_t)r.recv_off[p];
      for (int64_t i = 0; i < j; ++i) src += theirs[p * El + i];
      for (int64_t k = 0; k < theirs[p * El + j]; ++k) r.perm[lr++] = (int32_t)(src + k);
    }
  r.inputs = A.alloc<float>(at_least_one(r.rows) * d);  // the received inputs stay for the backward
  ep_.wait_ms += now_ms() - t0;
}

MoeExchange AllToAllDispatcher::dispatch(const MoeRoute& r, float* sorted, float* dst, int64_t w,
                                         StackArena& A) const {
  MoeExchange x;
  x.recv = A.alloc<float>(at_least_one(r.rows) * w);
  x.local = dst ? dst : A.alloc<float>(at_least_one(r.rows) * w);
  x.handle = ep_.comm->iall_to_all_v(sorted, times(r.send_rows, w), times(r.send_off, w), x.recv,
                                     times(r.recv_rows, w), times(r.recv_off, w), DType::F32);
  return x;
}

void AllToAllDispatcher::wait(const MoeRoute& r, MoeExchange& x, int64_t w) const {
  const double t0 = now_ms();
  x.handle.wait();
  ep_.wait_ms += now_ms() - t0;
  to_local(r, x.recv, x.local, w);
}

float* AllToAllDispatcher::output_rows(const MoeRoute& r, float*, int64_t w, StackArena& A) const {
  return A.alloc<float>(at_least_one(r.rows) * w);
}

void AllToAllDispatcher::combine(const MoeRoute& r, MoeExchange& x, const float* local, float* sorted,
                                 int64_t w) const {
  from_local(r, local, x.recv, w);
  const double t0 = now_ms();
  ep_.comm->all_to_all_v(x.recv, times(r.recv_rows, w), times(r.recv_off, w), sorted, times(r.send_rows, w),
                         times(r.send_off, w), DType::F32);
  ep_.wait_ms += now_ms() - t0;
}

const float* AllToAllDispatcher::saved_inputs(const MoeRoute& r, const Dispatch&, const float*, int64_t,
                                              StackArena&) const {
  return r.inputs;
}

}  // namespace trex::model
