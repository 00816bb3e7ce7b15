// Checks shared by the expert- and stage-shard tests (test_expert_shard.cpp, test_stage_shard.cpp).
#pragma once
#include <gtest/gtest.h>

#include <cstring>

#include "model/params.h"

namespace trex::test {

// Every tensor of a shard's slab (mp, laid out by ml) equals the whole model's (wp, wl; its rows,
// for a row slice), bit for bit.
inline void expect_slices_of(const float* mp, const model::ParamLayout& ml, const float* wp,
                             const model::ParamLayout& wl, const char* what) {
  for (const model::ParamEntry& e : ml.entries) {
    const model::ParamEntry* w = wl.find(e.name);
    ASSERT_TRUE(w) << what << ": " << e.name;
    EXPECT_EQ(0, std::memcmp(wp + w->offset + e.whole_begin(), mp + e.offset, e.shape.numel() * sizeof(float)))
        << what << ": " << e.name;
  }
}

}  // namespace trex::test
