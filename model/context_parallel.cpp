// Context parallelism: the zigzag split, the local batch, the cp all-gather / reduce-scatter and
// the load-time checks. See context_parallel.h.
#include "model/context_parallel.h"

#include <cstring>

#include "core/error.h"
#include "core/timer.h"
#include "model/model.h"
#include "parallel/comm.h"

namespace trex::model {

CpSplit cp_split(int64_t T, const ContextParallel& cp) {
  check_cp_seq_len(T, cp.size, "the micro-batch's sequence length");
  return {T, T / (2 * cp.size), cp.rank, cp.size};
}

CpBatch cp_local_batch(const Batch& b, const CpSplit& s) {
  const int64_t B = b.B, T = b.T, Tl = s.local();
  TREX_CHECK(T == s.T, "cp_local_batch: rows of ", T, " positions, split made for ", s.T);
  CpBatch o;
  o.B = B, o.T = Tl;
  o.ids.resize(B * Tl), o.targets.resize(B * Tl), o.pos.resize(B * Tl), o.flat.resize(B * Tl), o.qidx.resize(Tl);
  if (b.seg) o.seg.resize(B * Tl);
  for (int64_t j = 0; j < Tl; ++j) o.qidx[j] = (int32_t)s.index(j);
  for (int64_t r = 0; r < B; ++r)
    for (int64_t j = 0; j < Tl; ++j) {
      const int64_t i = r * Tl + j, g = r * T + s.index(j);
      o.flat[i] = g;
      o.ids[i] = b.input_ids[g];
      o.targets[i] = b.targets[g];
      o.pos[i] = b.pos ? b.pos[g] : (int32_t)s.index(j);
      if (b.seg) o.seg[i] = b.seg[g];
    }
  return o;
}

namespace {

// [size][B][2c][w] (the all-gather's order) <-> [B][T][w] (sequence order): the chunk pair of
// every rank of every row. to_seq: gathered -> sequence order; else the reverse.
void permute(const CpSplit& s, int64_t B, const float* from, float* to, int64_t w, bool to_seq) {
  const int64_t c = s.c, Tl = s.local(), cw = c * w;
  for (int r = 0; r < s.size; ++r)
    for (int64_t b = 0; b < B; ++b)
      for (int half = 0; half < 2; ++half) {
        const int64_t chunk = half == 0 ? r : 2 * s.size - 1 - r;
        const float* g = nullptr;
        float* d = nullptr;
        const int64_t gi = ((r * B + b) * Tl + half * c) * w, si = (b * s.T + chunk * c) * w;
        if (to_seq) g = from + gi, d = to + si;
        else g = from + si, d = to + gi;
        std::memcpy(d, g, cw * sizeof(float));
      }
}

}  // namespace

void cp_all_gather(const ContextParallel& cp, const CpSplit& s, int64_t B, const float* local, float* full, int64_t w,
                   StackArena& A) {
  const auto mk = A.mark();
  CpGather g = cp_all_gather_start(cp, s, B, local, w, A);
  cp_all_gather_finish(cp, s, g, full);
  A.release(mk);
}

CpGather cp_all_gather_start(const ContextParallel& cp, const CpSplit& s, int64_t B, const float* local, int64_t w,
                             StackArena& A) {
  const int64_t n = B * s.local() * w;
  CpGather g;
  g.buf = A.alloc<float>(s.size * n), g.B = B, g.w = w;
  std::memcpy(g.buf + s.rank * n, local, n * sizeof(float));
  g.h = cp.comm->iall_gather(g.buf + s.rank * n, g.buf, (size_t)n, DType::F32);
  return g;
}

void cp_all_gather_finish(const ContextParallel& cp, const CpSplit& s, CpGather& g, float* full) {
  const double t0 = now_ms();
  g.h.wait();
  cp.wait_ms += now_ms() - t0;
  permute(s, g.B, g.buf, full, g.w, true);
}

void cp_reduce_scatter(const ContextParallel& cp, const CpSplit& s, int64_t B, const float* full, float* local,
                       int64_t w, StackArena& A) {
  const int64_t n = B * s.local() * w;
  const auto mk = A.mark();
  float* buf = A.alloc<float>(s.size * n);
  permute(s, B, full, buf, w, false);
  const double t0 = now_ms();
  cp.comm->reduce_scatter(buf, buf + s.rank * n, (size_t)n, DType::F32, parallel::ReduceOp::Sum);
  cp.wait_ms += now_ms() - t0;
  std::memcpy(local, buf + s.rank * n, n * sizeof(float));
  A.release(mk);
}

void pack_cols(const Ctx& c, float* dst, int64_t w, int64_t rows, std::initializer_list<ColsIn> parts) {
  const int64_t f = sizeof(float);
  int64_t off = 0;
  for (const ColsIn& q : parts) {
    if (q.cols) c.k().copy_rows(dst + off, w * f, q.p, q.cols * f, q.cols * f, rows);
    off += q.cols;
  }
  TREX_CHECK(off == w, "pack_cols: parts of ", off, " columns into rows of ", w);
}

void unpack_cols(const Ctx& c, const float* src, int64_t w, int64_t rows, std::initializer_list<ColsOut> parts) {
  const int64_t f = sizeof(float);
  int64_t off = 0;
  for (const ColsOut& q : parts) {
    if (q.cols) c.k().copy_rows(q.p, q.cols * f, src + off, w * f, q.cols * f, rows);
    off += q.cols;
  }
  TREX_CHECK(off == w, "unpack_cols: parts of ", off, " columns from rows of ", w);
}

void check_context_parallel(int cp) {
  TREX_USER_CHECK(cp >= 1, "set parallel.cp >= 1", "parallel.cp = ", cp, " must be >= 1");
}

void check_cp_seq_len(int64_t T, int cp, const char* field) {
  TREX_USER_CHECK(T % (2 * (int64_t)cp) == 0,
                  detail::cat("choose a sequence length that is a multiple of 2 x parallel.cp = ", 2 * cp,
                              ", or another parallel.cp"),
                  field, " = ", T, " is not a multiple of 2 x parallel.cp = ", 2 * cp,
                  " (each cp rank holds two of the ", 2 * cp, " equal chunks of every sequence)");
}

}  // namespace trex::model
