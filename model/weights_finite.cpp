// Loaded weights must be finite: a NaN or Inf in a checkpoint would otherwise train into NaN
// losses (skipped steps) or generate nothing. One pass over the parameter slab at load.
#include <cstring>
#include <vector>
#include "core/error.h"
#include "core/parallel.h"
#include "model/checkpoint.h"

namespace trex::model {

namespace {

// Non-finite values (NaN, +-Inf: all exponent bits set) in x[0, n).
int64_t count_nonfinite(const float* x, int64_t n) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, x + i, 4);
    bad += (u & 0x7f800000u) == 0x7f800000u;
  }
  return bad;
}

}  // namespace

void check_finite_weights(const Model& m, const std::string& where) {
  // x: [layout.total] parameters, then buffers (router biases, id tables): chunks in parallel.
  const int64_t total = m.layout.total, chunk = 1 << 20;
  const int64_t nchunks = (total + chunk - 1) / chunk;
  std::vector<int64_t> bad(nchunks, 0);
  const float* P = m.P();
  parallel_dynamic(nchunks, [&](int64_t c) {
    bad[c] = count_nonfinite(P + c * chunk, std::min(chunk, total - c * chunk));
  });
  int64_t n_bad = 0;
  for (int64_t b : bad) n_bad += b;
  n_bad += count_nonfinite(m.buffers.data(), (int64_t)m.buffers.size());
  if (n_bad == 0) return;
  // Name the tensors: the first one with its count, and how many are affected.
  std::string first;
  int64_t first_n = 0, tensors = 0;
  for (const ParamEntry& e : m.layout.entries) {
    const int64_t k = count_nonfinite(P + e.offset, e.shape.numel());
    if (k == 0) continue;
    if (tensors++ == 0) first = e.name, first_n = k;
  }
  for (const BufferEntry& b : m.layout.buffers) {
    const int64_t k = count_nonfinite(m.buffers.data() + b.offset, b.size);
    if (k == 0) continue;
    if (tensors++ == 0) first = b.name, first_n = k;
  }
  TREX_USER_FAIL("the checkpoint's weights are damaged or diverged: use an earlier checkpoint", where, ": tensor '",
                 first, "' holds ", first_n, " NaN / Inf values (", n_bad, " in ", tensors,
                 " tensors in all); trex does not load non-finite weights");
}

}  // namespace trex::model
