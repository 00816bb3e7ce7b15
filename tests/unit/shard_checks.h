// Checks shared by the expert-, stage- and tp-shard tests (test_expert_shard.cpp, test_stage_shard.cpp,
// test_tp_shard.cpp).
#pragma once
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "model/params.h"

namespace trex::test {

// Every tensor of a shard's slab (mp, laid out by ml) equals the whole model's (wp, wl; its part,
// for an expert shard's rows or a tp slice), bit for bit.
inline void expect_slices_of(const float* mp, const model::ParamLayout& ml, const float* wp,
                             const model::ParamLayout& wl, const char* what) {
  std::vector<float> part;
  for (const model::ParamEntry& e : ml.entries) {
    const model::ParamEntry* w = wl.find(e.name);
    ASSERT_TRUE(w) << what << ": " << e.name;
    part.resize((size_t)e.shape.numel());
    e.take_from_whole(wp + w->offset, part.data());
    EXPECT_EQ(0, std::memcmp(part.data(), mp + e.offset, e.shape.numel() * sizeof(float))) << what << ": " << e.name;
  }
}

}  // namespace trex::test
