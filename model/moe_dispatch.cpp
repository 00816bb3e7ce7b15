// LocalDispatcher (model/moe_dispatch.h) and the row operations around the experts: the sort by
// expert, the gather of sorted rows, the probability-weighted combine and their adjoints.
#include <cstring>
#include "core/error.h"
#include "core/parallel.h"
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

const float* LocalDispatcher::saved_inputs(const MoeRoute& r, const Dispatch& D, const float* x, int64_t d,
                                           StackArena& A) const {
  float* xs = A.alloc<float>(r.rows * d);
  moe_gather(x, D.row_token, r.rows, d, xs);
  return xs;
}

void moe_sort(const int32_t* idx, int64_t N, int64_t K, int64_t E, std::vector<int64_t>& offsets,
              int32_t* row_token, int32_t* slot_row, int64_t* load) {
  const int64_t R = N * K;
  offsets.assign(E + 1, 0);
  for (int64_t i = 0; i < R; ++i) offsets[idx[i] + 1]++;
  for (int64_t e = 0; e < E; ++e) {
    if (load) load[e] += offsets[e + 1];
    offsets[e + 1] += offsets[e];
  }
  std::vector<int64_t> fill(offsets.begin(), offsets.end() - 1);
  for (int64_t i = 0; i < R; ++i) {
    const int64_t row = fill[idx[i]]++;
    row_token[row] = (int32_t)(i / K);
    slot_row[i] = (int32_t)row;
  }
}

void moe_gather(const float* x, const int32_t* row_token, int64_t R, int64_t d, float* xs) {
  parallel_for(R, 256, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) std::memcpy(xs + r * d, x + (int64_t)row_token[r] * d, d * sizeof(float));
  });
}

void moe_combine(const float* y, const float* probs, const int32_t* slot_row, int64_t N, int64_t K, int64_t d,
                 float* out) {
  parallel_for(N, 16, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      float* o = out + n * d;
      for (int64_t k = 0; k < K; ++k) {
        const float w = probs[n * K + k];
        const float* yr = y + (int64_t)slot_row[n * K + k] * d;
        for (int64_t j = 0; j < d; ++j) o[j] += w * yr[j];
      }
    }
  });
}

void moe_combine_bwd(const float* dout, const float* y, const float* probs, const int32_t* slot_row, int64_t N,
                     int64_t K, int64_t d, float* dy, float* dprobs) {
  parallel_for(N, 16, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      const float* g = dout + n * d;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t row = slot_row[n * K + k];
        const float w = probs[n * K + k];
        const float* yr = y + row * d;
        float* dyr = dy + row * d;
        double dot = 0;
        for (int64_t j = 0; j < d; ++j) {
          dyr[j] = w * g[j];
          dot += (double)g[j] * yr[j];
        }
        dprobs[n * K + k] = (float)dot;
      }
    }
  });
}

void moe_dispatch_bwd(const float* dxs, const int32_t* slot_row, int64_t N, int64_t K, int64_t d, float* dx) {
  parallel_for(N, 16, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      float* o = dx + n * d;
      for (int64_t k = 0; k < K; ++k) {
        const float* g = dxs + (int64_t)slot_row[n * K + k] * d;
        for (int64_t j = 0; j < d; ++j) o[j] += g[j];
      }
    }
  });
}

}  // namespace trex::model
