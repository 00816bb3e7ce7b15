// BucketLayout: bucket boundaries, padding to dp, shard ranges and pieces, error messages.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/buckets.h"

using trex::parallel::BucketLayout;
using trex::parallel::FlatRange;

namespace {

std::string error_of(auto&& fn) {
  try {
    fn();
  } catch (const trex::Error& e) {
    return e.what();
  }
  return "";
}

// Every invariant of a layout built from `sizes`, bucket size `bs`, dp and align.
void check_layout(const std::vector<size_t>& sizes, size_t bs, int dp, size_t align) {
  SCOPED_TRACE(testing::Message() << "params " << sizes.size() << " bucket " << bs << " dp " << dp << " align "
                                  << align);
  BucketLayout L = BucketLayout::build(sizes, bs, dp, align);
  ASSERT_EQ(L.params.size(), sizes.size());
  size_t pos = 0;
  int next_param = 0;
  for (int b = 0; b < L.num_buckets(); ++b) {
    const auto& B = L.buckets[b];
    EXPECT_EQ(B.begin, pos) << "bucket " << b << " not contiguous";
    EXPECT_EQ(B.first_param, next_param);
    EXPECT_GT(B.num_params, 0);
    EXPECT_EQ(B.size % (dp * align), 0u) << "bucket " << b << " not padded to dp * align";
    EXPECT_GE(B.size, B.used);
    EXPECT_LT(B.size - B.used, dp * align) << "bucket " << b << " over-padded";
    size_t used = 0, off = B.begin;
    for (int p = B.first_param; p < B.first_param + B.num_params; ++p) {
      EXPECT_EQ(L.params[p].bucket, b);
      EXPECT_EQ(L.params[p].offset, off) << "param " << p << " not packed";
      EXPECT_EQ(L.params[p].size, sizes[p]);
      off += sizes[p];
      used += sizes[p];
    }
    EXPECT_EQ(B.used, used);
    if (bs > 0) {
      if (b + 1 < L.num_buckets()) {
        EXPECT_GE(B.used, bs) << "bucket " << b << " closed early";
      }
      EXPECT_LT(B.used - sizes[B.first_param + B.num_params - 1], bs) << "bucket " << b << " closed late";
    } else {
      EXPECT_EQ(L.num_buckets(), 1);
    }
    // Shards partition the bucket, equal sizes, aligned.
    size_t s_pos = B.begin;
    for (int r = 0; r < dp; ++r) {
      FlatRange s = L.shard(b, r);
      EXPECT_EQ(s.begin, s_pos);
      EXPECT_EQ(s.size(), B.size / dp);
      EXPECT_EQ((s.begin - B.begin) % align, 0u);
      s_pos = s.end;
    }
    EXPECT_EQ(s_pos, B.begin + B.size);
    pos += B.size;
    next_param += B.num_params;
  }
  EXPECT_EQ(next_param, static_cast<int>(sizes.size()));
  EXPECT_EQ(L.total, pos);
  size_t shard_total = 0;
  for (int b = 0; b < L.num_buckets(); ++b) shard_total += L.shard_size(b);
  EXPECT_EQ(L.shard_elems(), shard_total);
  // Shard pieces over all ranks cover every parameter element exactly once.
  std::vector<std::vector<int>> hits(sizes.size());
  for (size_t p = 0; p < sizes.size(); ++p) hits[p].assign(sizes[p], 0);
  for (int r = 0; r < dp; ++r)
    for (const auto& pc : L.shard_pieces(r)) {
      FlatRange s = L.shard(pc.bucket, r);
      EXPECT_GE(pc.flat_begin, s.begin);
      EXPECT_LE(pc.flat_begin + pc.size, s.end);
      EXPECT_EQ(pc.flat_begin, L.params[pc.param].offset + pc.param_offset);
      for (size_t i = 0; i < pc.size; ++i) hits[pc.param][pc.param_offset + i] += 1;
    }
  for (size_t p = 0; p < sizes.size(); ++p)
    for (size_t i = 0; i < sizes[p]; ++i) ASSERT_EQ(hits[p][i], 1) << "param " << p << " element " << i;
}

}  // namespace

TEST(ParallelBuckets, SmallOddExample) {
  const std::vector<size_t> sizes = {5, 7, 3, 11, 1};
  BucketLayout L = BucketLayout::build(sizes, 10, 3);
  ASSERT_EQ(L.num_buckets(), 3);
  EXPECT_EQ(L.buckets[0].used, 12u);  // 5 + 7 reaches 10
  EXPECT_EQ(L.buckets[0].size, 12u);
  EXPECT_EQ(L.buckets[1].used, 14u);  // 3 + 11
  EXPECT_EQ(L.buckets[1].size, 15u);
  EXPECT_EQ(L.buckets[2].used, 1u);
  EXPECT_EQ(L.buckets[2].size, 3u);
  EXPECT_EQ(L.total, 30u);
  EXPECT_EQ(L.params[3].offset, 15u);
  EXPECT_EQ(L.params[4].offset, 27u);
  EXPECT_EQ(L.shard(1, 2).begin, 22u);
  EXPECT_EQ(L.shard(1, 2).end, 27u);
  EXPECT_EQ(L.shard_elems(), 10u);
  // Rank 1 of bucket 1 ([17, 22)) holds the end of param 2? no: param 2 is [12, 15); it holds
  // param 3 elements [2, 7).
  auto pieces = L.shard_pieces(1);
  ASSERT_EQ(pieces.size(), 3u);  // bucket 0: [4, 8) -> p0[4,5) + p1[0,3); bucket 1: p3[2,7)
  EXPECT_EQ(pieces[0].param, 0);
  EXPECT_EQ(pieces[0].param_offset, 4u);
  EXPECT_EQ(pieces[1].param, 1);
  EXPECT_EQ(pieces[1].size, 3u);
  EXPECT_EQ(pieces[2].param, 3);
  EXPECT_EQ(pieces[2].param_offset, 2u);
  EXPECT_EQ(pieces[2].size, 5u);
  EXPECT_NE(L.str().find("bucket 1: params [2, 4) flat [12, 27) used 14 pad 1 shard 5"), std::string::npos) << L.str();
}

TEST(ParallelBuckets, Alignment) {
  const std::vector<size_t> sizes = {37, 129, 1000};
  BucketLayout L = BucketLayout::build(sizes, 100, 3, 16);
  ASSERT_EQ(L.num_buckets(), 2);        // 37 + 129 >= 100; 1000
  EXPECT_EQ(L.buckets[0].size, 192u);   // 166 -> multiple of 48
  EXPECT_EQ(L.buckets[1].size, 1008u);  // 1000 -> multiple of 48
  EXPECT_EQ(L.shard(1, 1).begin, 192u + 336u);
}

TEST(ParallelBuckets, BigParamGetsItsOwnBucketAndZeroMeansOne) {
  const std::vector<size_t> sizes = {3, 1000, 2, 2};
  BucketLayout L = BucketLayout::build(sizes, 10, 2);
  ASSERT_EQ(L.num_buckets(), 2);  // {3, 1000} reaches 10 at the big one; {2, 2} is the rest
  EXPECT_EQ(L.buckets[0].num_params, 2);
  EXPECT_EQ(L.buckets[1].used, 4u);
  BucketLayout one = BucketLayout::build(sizes, 0, 5);
  ASSERT_EQ(one.num_buckets(), 1);
  EXPECT_EQ(one.buckets[0].size, 1010u);
  BucketLayout empty = BucketLayout::build(std::vector<size_t>{}, 10, 3);
  EXPECT_EQ(empty.num_buckets(), 0);
  EXPECT_EQ(empty.total, 0u);
}

TEST(ParallelBuckets, InvariantsOverManyLayouts) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 60; ++trial) {
    std::vector<size_t> sizes(1 + rng() % 40);
    for (auto& s : sizes) s = rng() % 5 == 0 ? rng() % 3 : 1 + rng() % 300;  // zero-size params too
    const int dps[] = {1, 2, 3, 5, 7, 8};
    const size_t bss[] = {0, 1, 64, 257, 1000, 100000};
    check_layout(sizes, bss[trial % 6], dps[(trial / 6) % 6], trial % 4 == 0 ? 16 : 1);
  }
}

TEST(ParallelBuckets, Errors) {
  const std::vector<size_t> sizes = {4, 4};
  EXPECT_NE(error_of([&] { BucketLayout::build(sizes, 4, 0); }).find("dp = 0 must be >= 1"), std::string::npos);
  EXPECT_NE(error_of([&] { BucketLayout::build(sizes, 4, 2, 0); }).find("shard_align = 0 must be >= 1"),
            std::string::npos);
  BucketLayout L = BucketLayout::build(sizes, 4, 3);
  EXPECT_NE(error_of([&] { L.shard(2, 0); }).find("bucket 2 outside [0, 2)"), std::string::npos);
  EXPECT_NE(error_of([&] { L.shard(0, 3); }).find("dp rank 3 outside [0, 3)"), std::string::npos);
  EXPECT_NE(error_of([&] { L.shard_size(-1); }).find("bucket -1 outside"), std::string::npos);
}
