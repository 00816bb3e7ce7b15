// Storage on cache-line (64-byte) boundaries for standard containers: aligned_vector<T> is a
// std::vector whose data() starts on a cache line, as the activation arena's blocks do
// (core/stack_arena.h), so that rows of a multiple of 64 bytes never straddle two lines.
#pragma once
#include <cstddef>
#include <new>
#include <vector>

namespace trex {

template <class T, std::size_t Align = 64>
struct AlignedAllocator {
  using value_type = T;
  template <class U>
  struct rebind {
    using other = AlignedAllocator<U, Align>;
  };
  AlignedAllocator() = default;
  template <class U>
  AlignedAllocator(const AlignedAllocator<U, Align>&) {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{Align})); }
  void deallocate(T* p, std::size_t) { ::operator delete(p, std::align_val_t{Align}); }
  template <class U>
  bool operator==(const AlignedAllocator<U, Align>&) const {
    return true;
  }
};

template <class T>
using aligned_vector = std::vector<T, AlignedAllocator<T>>;

}  // namespace trex
