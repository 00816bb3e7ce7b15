#include "model/seq_parallel.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/timer.h"
#include "parallel/comm.h"

namespace trex::model {

SeqShard seq_shard(int64_t N, int rank, int size) {
  TREX_CHECK(size >= 1 && rank >= 0 && rank < size && N >= 0, "seq_shard: rank ", rank, " of ", size, ", N ", N);
  SeqShard s;
  s.N = N, s.rank = rank, s.size = size;
  s.block = (N + size - 1) / size;
  s.n0 = s.first_of(rank);
  s.rows = s.rows_of(rank);
  return s;
}

void sp_all_gather(parallel::Communicator& comm, const SeqShard& s, const float* local, float* full, int64_t w,
                   StackArena& A, double* wait_ms) {
  const int64_t bw = s.block * w;
  if (s.N % s.size == 0) {  // equal shards: in place in full
    if (full + s.n0 * w != local) std::memcpy(full + s.n0 * w, local, s.rows * w * sizeof(float));
    const double t0 = now_ms();
    comm.all_gather(full + s.n0 * w, full, (size_t)bw, DType::F32);
    *wait_ms += now_ms() - t0;
    return;
  }
  const auto mk = A.mark();
  float* pad = A.alloc<float>(s.size * bw);  // [size, block, w]
  std::memcpy(pad + s.rank * bw, local, s.rows * w * sizeof(float));
  std::memset(pad + s.rank * bw + s.rows * w, 0, (s.block - s.rows) * w * sizeof(float));
  const double t0 = now_ms();
  comm.all_gather(pad + s.rank * bw, pad, (size_t)bw, DType::F32);
  *wait_ms += now_ms() - t0;
  for (int r = 0; r < s.size; ++r)
    std::memcpy(full + s.first_of(r) * w, pad + r * bw, s.rows_of(r) * w * sizeof(float));
  A.release(mk);
}

void sp_reduce_scatter(parallel::Communicator& comm, const SeqShard& s, float* full, float* local, int64_t w,
                       StackArena& A, double* wait_ms) {
  const int64_t bw = s.block * w;
  if (s.N % s.size == 0) {  // equal shards: in place in full
    const double t0 = now_ms();
    comm.reduce_scatter(full, full + s.n0 * w, (size_t)bw, DType::F32, parallel::ReduceOp::Sum);
    *wait_ms += now_ms() - t0;
    if (local != full + s.n0 * w) std::memcpy(local, full + s.n0 * w, s.rows * w * sizeof(float));
    return;
  }
  const auto mk = A.mark();
  float* pad = A.alloc<float>(s.size * bw);
  for (int r = 0; r < s.size; ++r) {
    const int64_t n = s.rows_of(r);
    std::memcpy(pad + r * bw, full + s.first_of(r) * w, n * w * sizeof(float));
    std::memset(pad + r * bw + n * w, 0, (s.block - n) * w * sizeof(float));
  }
  const double t0 = now_ms();
  comm.reduce_scatter(pad, pad + s.rank * bw, (size_t)bw, DType::F32, parallel::ReduceOp::Sum);
  *wait_ms += now_ms() - t0;
  std::memcpy(local, pad + s.rank * bw, s.rows * w * sizeof(float));
  A.release(mk);
}

}  // namespace trex::model
