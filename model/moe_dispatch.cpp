// LocalDispatcher (model/moe_dispatch.h) and the sort of a layer's (token, slot) rows by expert.
#include <cstring>
#include "core/error.h"
#include "core/parallel.h"
#include "kernels/router.h"
#include "model/moe_dispatch.h"

namespace trex::model {

void LocalDispatcher::plan(const std::vector<int64_t>& offsets, int64_t, StackArena&, MoeRoute& r) const {
  r.offsets = offsets;
  r.first = 0;
  r.rows = offsets.back();
  r.inputs = nullptr;  // the backward gathers the inputs again (saves R d floats a layer)
}

MoeExchange LocalDispatcher::dispatch(const MoeRoute&, float* sorted, float*, int64_t, StackArena&) const {
  MoeExchange x;
  x.local = sorted;  // local order = sorted order
  return x;
}

void LocalDispatcher::wait(const MoeRoute&, MoeExchange&, int64_t) const {}

float* LocalDispatcher::output_rows(const MoeRoute&, float* sorted, int64_t, StackArena&) const { return sorted; }

void LocalDispatcher::combine(const MoeRoute&, MoeExchange&, const float* local, float* sorted, int64_t) const {
  TREX_CHECK(local == sorted, "LocalDispatcher::combine: the experts' rows must be output_rows' buffer");
}

const float* LocalDispatcher::saved_inputs(const MoeRoute&, const Dispatch&, const float*, int64_t,
                                           StackArena&) const {
  return nullptr;  // gathered again by the caller
}

void moe_sort(const int32_t* idx, int64_t N, int64_t K, int64_t E, std::vector<int64_t>& offsets,
              int32_t* row_token, int32_t* slot_row, int64_t* load) {
  offsets.assign(E + 1, 0);
  kern::moe_sort(idx, N, K, E, offsets.data(), row_token, slot_row);
  if (load)
    for (int64_t e = 0; e < E; ++e) load[e] += offsets[e + 1] - offsets[e];
}

}  // namespace trex::model
