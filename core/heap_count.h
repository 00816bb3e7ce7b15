// Heap allocations during a measured stretch (`trex bench step --profile`): calls to the global
// operator new / delete and the time spent in them. The counting needs the replacement of the
// global operators in cli/heap_hooks.cpp, linked into the trex executable (and the unit tests)
// only: heap_counter() is defined there, so the library never refers to it. Counting is on only
// inside a HeapCountScope (a relaxed atomic flag); outside it a `new` costs one relaxed load more.
// Not seen: malloc / aligned_alloc called directly (the arenas' blocks, kernel scratch, oneDNN).
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace trex {

struct HeapCounter {
  std::atomic<bool> on{false};
  std::atomic<int64_t> allocs{0};  // operator new calls, every form
  std::atomic<int64_t> frees{0};   // operator delete calls on non-null pointers
  std::atomic<int64_t> bytes{0};   // bytes requested by those news
  std::atomic<int64_t> ns{0};      // time inside new and delete

  void record_alloc(size_t n, int64_t t_ns) {
    allocs.fetch_add(1, std::memory_order_relaxed);
    bytes.fetch_add((int64_t)n, std::memory_order_relaxed);
    ns.fetch_add(t_ns, std::memory_order_relaxed);
  }
  void record_free(int64_t t_ns) {
    frees.fetch_add(1, std::memory_order_relaxed);
    ns.fetch_add(t_ns, std::memory_order_relaxed);
  }
  void clear() {
    allocs = 0;
    frees = 0;
    bytes = 0;
    ns = 0;
  }
};

// The process's counter (cli/heap_hooks.cpp).
HeapCounter& heap_counter();

// Counts every thread's heap calls into `c` for the scope's lifetime (nesting keeps it on).
class HeapCountScope {
 public:
  explicit HeapCountScope(HeapCounter& c) : c_(c), prev_(c.on.exchange(true, std::memory_order_relaxed)) {}
  ~HeapCountScope() { c_.on.store(prev_, std::memory_order_relaxed); }
  HeapCountScope(const HeapCountScope&) = delete;
  HeapCountScope& operator=(const HeapCountScope&) = delete;

 private:
  HeapCounter& c_;
  bool prev_;
};

}  // namespace trex
