// DeepSeek-V4 attention under context parallelism: the local queries' positions and key lists.
// See v4_context_parallel.h; the attention itself is model/v4_attn.cpp (V4AttnIn::cp).
#include "model/v4_context_parallel.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "kernels/hd/v4_rows.h"

namespace trex::model {

int32_t* v4_cp_query_positions(const CpAttn& cp, int64_t B, StackArena& A) {
  const int64_t Tl = cp.split.local();
  int32_t* p = A.alloc<int32_t>(std::max<int64_t>(B * Tl, 1));
  for (int64_t i = 0; i < B * Tl; ++i) p[i] = cp.qidx[i % Tl];
  return p;
}

void v4_cp_key_lists(const kern::V4KeyShape& ks, const CpAttn& cp, const int32_t* seg, const int32_t* cnt,
                     const int32_t* sel, int64_t* off, int32_t** idx, StackArena& A) {
  const int64_t B = ks.B, T = ks.T, Tl = cp.split.local(), Nl = B * Tl, topk = ks.topk;
  TREX_CHECK(T == cp.split.T, "v4_cp_key_lists: rows of ", T, " positions, split made for ", cp.split.T);
  // Local query i is whole-row query g(i) = b T + qidx[i % Tl]; the selection moves to those rows
  // (the other rows' stay empty: nothing reads them) so the lists are one process's, row for row.
  auto whole = [&](int64_t i) { return (i / Tl) * T + cp.qidx[i % Tl]; };
  // (Heap scratch: the arena keeps only the lists.)
  std::vector<int32_t> vcnt, vsel;
  if (ks.kind == kern::V4Keys::Csa) {
    vcnt.assign(B * T, 0), vsel.assign(std::max<int64_t>(B * T * topk, 1), -1);
    for (int64_t i = 0; i < Nl; ++i) {
      const int64_t g = whole(i);
      vcnt[g] = cnt[i];
      std::memcpy(vsel.data() + g * topk, sel + i * topk, topk * sizeof(int32_t));
    }
  }
  const int32_t* wcnt = vcnt.empty() ? nullptr : vcnt.data();
  const int32_t* wsel = vsel.empty() ? nullptr : vsel.data();
  off[0] = 0;
  for (int64_t i = 0; i < Nl; ++i) off[i + 1] = off[i] + kern::hd::v4_query_keys(ks, seg, wcnt, wsel, whole(i), nullptr);
  int32_t* out = A.alloc<int32_t>(std::max<int64_t>(off[Nl], 1));
  parallel_for(Nl, 64, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) kern::hd::v4_query_keys(ks, seg, wcnt, wsel, whole(i), out + off[i]);
  });
  *idx = out;
}

}  // namespace trex::model
