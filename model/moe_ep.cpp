#include "model/moe_ep.h"

#include <cstring>
#include "core/error.h"
#include "core/parallel.h"

namespace trex::model {

void ep_plan(const ExpertParallel& ep, const std::vector<int64_t>& offsets, StackArena& A, EpRoute& r) {
  parallel::Communicator& comm = *ep.comm;
  const int P = comm.size();
  const int64_t El = ep.count, E = (int64_t)offsets.size() - 1;
  TREX_CHECK(El > 0 && El * P == E, "expert parallel: ", E, " experts do not split into ", P, " ranks of ", El);
  TREX_CHECK(ep.first == comm.rank() * El, "expert parallel: rank ", comm.rank(), " holds experts from ", ep.first,
             ", expected ", comm.rank() * El);
  // Row counts per expert: mine for every expert out, every source's for my experts in.
  std::vector<int64_t> mine(E), theirs(E);
  for (int64_t e = 0; e < E; ++e) mine[e] = offsets[e + 1] - offsets[e];
  std::vector<size_t> cnt(P, (size_t)El), off(P);
  for (int p = 0; p < P; ++p) off[p] = (size_t)(p * El);
  comm.all_to_all_v(mine.data(), cnt, off, theirs.data(), cnt, off, DType::I64);

  r.send_rows.assign(P, 0), r.send_off.assign(P, 0), r.recv_rows.assign(P, 0), r.recv_off.assign(P, 0);
  for (int p = 0; p < P; ++p) {
    r.send_off[p] = (size_t)offsets[p * El];
    r.send_rows[p] = (size_t)(offsets[(p + 1) * El] - offsets[p * El]);
    for (int64_t j = 0; j < El; ++j) r.recv_rows[p] += (size_t)theirs[p * El + j];
    if (p > 0) r.recv_off[p] = r.recv_off[p - 1] + r.recv_rows[p - 1];
  }
  r.Rl = (int64_t)(r.recv_off[P - 1] + r.recv_rows[P - 1]);
  r.offsets.assign(El + 1, 0);
  for (int64_t j = 0; j < El; ++j) {
    r.offsets[j + 1] = r.offsets[j];
    for (int p = 0; p < P; ++p) r.offsets[j + 1] += theirs[p * El + j];
  }
  // Local row of (expert j, source p, k-th row) <- received row recv_off[p] + (rows of p before j) + k.
  r.perm = A.alloc<int32_t>(std::max<int64_t>(r.Rl, 1));
  int64_t lr = 0;
  for (int64_t j = 0; j < El; ++j)
    for (int p = 0; p < P; ++p) {
      int64_t src = (int64_t)r.recv_off[p];
      for (int64_t i = 0; i < j; ++i) src += theirs[p * El + i];
      for (int64_t k = 0; k < theirs[p * El + j]; ++k) r.perm[lr++] = (int32_t)(src + k);
    }
}

namespace {
// Row counts / offsets -> element counts / offsets of rows of width w.
std::vector<size_t> times(const std::vector<size_t>& v, int64_t w) {
  std::vector<size_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = v[i] * (size_t)w;
  return o;
}
}  // namespace

parallel::Handle ep_dispatch_rows(const ExpertParallel& ep, const EpRoute& r, const float* sorted, float* recv,
                                  int64_t w) {
  return ep.comm->iall_to_all_v(sorted, times(r.send_rows, w), times(r.send_off, w), recv, times(r.recv_rows, w),
                                times(r.recv_off, w), DType::F32);
}

void ep_combine_rows(const ExpertParallel& ep, const EpRoute& r, const float* recv, float* sorted, int64_t w) {
  ep.comm->all_to_all_v(recv, times(r.recv_rows, w), times(r.recv_off, w), sorted, times(r.send_rows, w),
                        times(r.send_off, w), DType::F32);
}

void ep_to_local(const EpRoute& r, const float* recv, float* local, int64_t w) {
  parallel_for(r.Rl, 256, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) std::memcpy(local + i * w, recv + (int64_t)r.perm[i] * w, w * sizeof(float));
  });
}

void ep_from_local(const EpRoute& r, const float* local, float* recv, int64_t w) {
  parallel_for(r.Rl, 256, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) std::memcpy(recv + (int64_t)r.perm[i] * w, local + i * w, w * sizeof(float));
  });
}

}  // namespace trex::model
