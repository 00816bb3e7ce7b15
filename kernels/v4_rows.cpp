// CPU side of kernels/v4_rows.h: the per-query math of kernels/hd/v4_rows.h over all queries.
#include "kernels/v4_rows.h"
#include "core/parallel.h"
#include "kernels/hd/v4_rows.h"

namespace trex::kern {

void scale(float* x, int64_t n, float a) {
  parallel_for(n, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) x[i] *= a;
  });
}

void v4_key_offsets(const V4KeyShape& s, const int32_t* seg, const int32_t* cnt, const int32_t* sel, int64_t* off) {
  const int64_t N = s.B * s.T;
  off[0] = 0;
  for (int64_t i = 0; i < N; ++i) off[i + 1] = off[i] + hd::v4_query_keys(s, seg, cnt, sel, i, nullptr);
}

void v4_key_fill(const V4KeyShape& s, const int32_t* seg, const int32_t* cnt, const int32_t* sel, const int64_t* off,
                 int32_t* idx) {
  parallel_for(s.B * s.T, 64, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hd::v4_query_keys(s, seg, cnt, sel, i, idx + off[i]);
  });
}

}  // namespace trex::kern
