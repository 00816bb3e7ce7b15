// The activation arena (core/stack_arena.h): host memory as one contiguous stack (the bytes in use
// are the allocations not released, whatever their sizes), a block source as a chain of blocks.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <vector>
#include "core/stack_arena.h"

namespace trex {
namespace {

TEST(StackArena, HostStackCountsOnlyLiveBytes) {
  StackArena A(size_t(1) << 20);  // grows 1 MiB at a time
  float* a = A.alloc<float>(1000);  // 4000 -> 4032 bytes
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
  EXPECT_EQ(A.used(), 4032u);
  const auto m = A.mark();
  // Allocations larger than the growth step, then a small one: one contiguous range, no skipped tail.
  std::byte* b = A.alloc<std::byte>((size_t(3) << 20) + 1);
  std::byte* c = A.alloc<std::byte>(10);
  EXPECT_EQ(b, reinterpret_cast<std::byte*>(a) + 4032);
  EXPECT_EQ(c, b + (size_t(3) << 20) + 64);
  EXPECT_EQ(A.used(), 4032u + (size_t(3) << 20) + 64 + 64);
  b[(size_t(3) << 20)] = std::byte{7};  // the whole allocation is writable
  A.release(m);
  EXPECT_EQ(A.used(), 4032u);
  // The block chain this replaces skipped the rest of a block when the next allocation did not
  // fit it; a stack takes 2 MiB then 3 MiB at offset 2 MiB: 5 MiB in use, not 6.
  const auto m2 = A.mark();
  A.alloc<std::byte>(size_t(2) << 20);
  A.alloc<std::byte>(size_t(3) << 20);
  EXPECT_EQ(A.used(), 4032u + (size_t(5) << 20));
  EXPECT_EQ(A.peak(), 4032u + (size_t(5) << 20));
  A.release(m2);
  A.alloc<std::byte>(0);  // an empty allocation takes one 64-byte slot
  EXPECT_EQ(A.used(), 4032u + 64);
  EXPECT_EQ(A.peak(), 4032u + (size_t(5) << 20));
  EXPECT_GE(A.reserved(), A.peak());
  EXPECT_TRUE(A.host());
}

// Sizes past the address space reserved (or past size_t) are errors, not a wrapped allocation.
TEST(StackArena, ImpossibleSizesAreErrors) {
  StackArena A(size_t(1) << 20);
  A.alloc<float>(16);
  EXPECT_THROW(A.alloc<std::byte>(size_t(1) << 62), Error);
  EXPECT_THROW(A.alloc<double>(SIZE_MAX / 4), Error);
  EXPECT_EQ(A.used(), 64u);  // a failed allocation takes nothing
  EXPECT_NE(A.alloc<float>(16), nullptr);
}

TEST(StackArena, SteadyStateStepsTakeNoMemory) {
  StackArena A(size_t(1) << 20);
  auto step = [&A] {
    A.reset();
    float* x = A.alloc_zero<float>(300000);
    for (int i = 0; i < 300000; i += 4096) EXPECT_EQ(x[i], 0.f);
    const auto m = A.mark();
    A.alloc<double>(500000);
    A.release(m);
    A.alloc<int32_t>(70000);
  };
  step();
  const size_t grows = A.grows(), reserved = A.reserved(), peak = A.peak();
  EXPECT_GT(grows, 0u);
  for (int s = 0; s < 3; ++s) step();
  EXPECT_EQ(A.grows(), grows);
  EXPECT_EQ(A.reserved(), reserved);
  EXPECT_EQ(A.peak(), peak);
  EXPECT_EQ(peak, 1200000u + 4000000u);  // both multiples of 64
}

TEST(StackArena, BlockSourceChainsBlocksAndReserveSizesTheFirst) {
  int allocs = 0, releases = 0;
  auto src = std::make_shared<BlockSource>(BlockSource{
      [&allocs](size_t n) {
        ++allocs;
        return std::aligned_alloc(64, n);
      },
      [&releases](void* p) {
        ++releases;
        std::free(p);
      }});
  {
    StackArena A(size_t(1) << 20);
    A.use_source(src);
    EXPECT_FALSE(A.host());
    A.alloc<std::byte>(size_t(768) << 10);  // 0.75 MiB in a 1 MiB block
    A.alloc<std::byte>(size_t(512) << 10);  // does not fit the rest: a new block; the tail counts
    EXPECT_EQ(A.used(), (size_t(1) << 20) + (size_t(512) << 10));
    EXPECT_EQ(allocs, 2);
    A.reserve(size_t(64) << 20);  // blocks exist: no effect
    EXPECT_EQ(allocs, 2);
  }
  EXPECT_EQ(releases, 2);
  {
    StackArena A(size_t(1) << 20);
    A.use_source(src);
    A.reserve(size_t(3) << 20);
    EXPECT_EQ(allocs, 3);
    A.alloc<std::byte>(size_t(768) << 10);
    A.alloc<std::byte>(size_t(2) << 20);  // fits the reserved block
    EXPECT_EQ(allocs, 3);
    EXPECT_EQ(A.used(), (size_t(768) << 10) + (size_t(2) << 20));
    EXPECT_EQ(A.reserved(), size_t(3) << 20);
    EXPECT_THROW(A.alloc_zero<float>(4), Error);
  }
  EXPECT_EQ(releases, 3);
}

}  // namespace
}  // namespace trex
