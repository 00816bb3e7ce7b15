// The global operator new / delete, every standard form (plain, array, nothrow, aligned, sized),
// replaced to count heap calls and their time while a HeapCountScope is on (core/heap_count.h).
// Linked into the trex executable and the unit tests, never into the library. Memory comes from
// malloc / aligned_alloc as in libstdc++; a failed new runs the new-handler, then throws.
#include <cstdlib>
#include <new>

#include "core/heap_count.h"
#include "core/par_stats.h"

namespace trex {

namespace {
constinit HeapCounter g_heap;  // constant-initialized: safe for news made before main

void* raw_alloc(std::size_t n, std::size_t align) {
  if (n == 0) n = 1;
  for (;;) {
    void* p;
    if (align <= alignof(std::max_align_t)) {
      p = std::malloc(n);
    } else {
      const std::size_t sz = (n + align - 1) / align * align;  // aligned_alloc: size a multiple of align
      p = std::aligned_alloc(align, sz);
    }
    if (p) return p;
    std::new_handler h = std::get_new_handler();
    if (!h) return nullptr;
    h();
  }
}

void* counted_alloc(std::size_t n, std::size_t align) {
  if (!g_heap.on.load(std::memory_order_relaxed)) return raw_alloc(n, align);
  const int64_t t0 = par_now_ns();
  void* p = raw_alloc(n, align);
  g_heap.record_alloc(n, par_now_ns() - t0);
  return p;
}

void* alloc_or_throw(std::size_t n, std::size_t align) {
  void* p = counted_alloc(n, align);
  if (!p) throw std::bad_alloc();
  return p;
}

// The nothrow forms: a throwing new-handler must not escape them.
void* nothrow_alloc(std::size_t n, std::size_t align) noexcept {
  try {
    return counted_alloc(n, align);
  } catch (...) {
    return nullptr;
  }
}

void counted_free(void* p) noexcept {
  if (!p) return;
  if (!g_heap.on.load(std::memory_order_relaxed)) return std::free(p);
  const int64_t t0 = par_now_ns();
  std::free(p);
  g_heap.record_free(par_now_ns() - t0);
}

constexpr std::size_t kPlain = alignof(std::max_align_t);
}  // namespace

HeapCounter& heap_counter() { return g_heap; }

}  // namespace trex

using trex::alloc_or_throw;
using trex::nothrow_alloc;
using trex::counted_free;
using trex::kPlain;

void* operator new(std::size_t n) { return alloc_or_throw(n, kPlain); }
void* operator new[](std::size_t n) { return alloc_or_throw(n, kPlain); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return nothrow_alloc(n, kPlain); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return nothrow_alloc(n, kPlain); }
void* operator new(std::size_t n, std::align_val_t a) { return alloc_or_throw(n, (std::size_t)a); }
void* operator new[](std::size_t n, std::align_val_t a) { return alloc_or_throw(n, (std::size_t)a); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return nothrow_alloc(n, (std::size_t)a);
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return nothrow_alloc(n, (std::size_t)a);
}

void operator delete(void* p) noexcept { counted_free(p); }
void operator delete[](void* p) noexcept { counted_free(p); }
void operator delete(void* p, std::size_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::size_t) noexcept { counted_free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { counted_free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { counted_free(p); }
void operator delete(void* p, std::align_val_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { counted_free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { counted_free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { counted_free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { counted_free(p); }
