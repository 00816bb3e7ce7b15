// Arenas: one 64-byte-aligned slab each for parameters, gradients, optimizer state and
// activations. Allocation is a bump of an offset; the activation arena is reset every step
// (mark / release), so a training step allocates nothing from the system.
#pragma once
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include "core/error.h"
#include "core/tensor.h"

namespace trex {

class Arena {
 public:
  Arena() = default;
  Arena(std::string name, size_t capacity) { reserve(std::move(name), capacity); }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  Arena(Arena&&) = default;
  Arena& operator=(Arena&&) = default;

  void reserve(std::string name, size_t capacity) {
    name_ = std::move(name);
    cap_ = round_up(capacity);
    used_ = 0;
    peak_ = 0;
    void* p = cap_ ? std::aligned_alloc(kAlign, cap_) : nullptr;
    TREX_CHECK(cap_ == 0 || p, "arena '", name_, "': cannot allocate ", cap_, " bytes");
    buf_.reset(static_cast<std::byte*>(p));
  }

  // Uninitialized storage for n elements of T, 64-byte aligned.
  template <class T>
  T* alloc(size_t n) {
    size_t bytes = round_up(n * sizeof(T));
    TREX_CHECK(used_ + bytes <= cap_, "arena '", name_, "' full: need ", used_ + bytes, " of ", cap_,
               " bytes");
    T* p = reinterpret_cast<T*>(buf_.get() + used_);
    used_ += bytes;
    if (used_ > peak_) peak_ = used_;
    return p;
  }
  template <class T>
  T* alloc_zero(size_t n) {
    T* p = alloc<T>(n);
    std::memset(static_cast<void*>(p), 0, n * sizeof(T));
    return p;
  }
  TensorView view(DType t, Shape s) {
    size_t bytes = static_cast<size_t>(s.numel()) * dtype_size(t);
    return TensorView(alloc<std::byte>(bytes), t, s);
  }

  size_t mark() const { return used_; }
  void release(size_t m) { used_ = m; }
  void reset() { used_ = 0; }
  void zero() {
    if (cap_) std::memset(buf_.get(), 0, cap_);
  }
  std::byte* base() const { return buf_.get(); }
  size_t used() const { return used_; }
  size_t peak() const { return peak_; }
  size_t capacity() const { return cap_; }

  static constexpr size_t kAlign = 64;
  static size_t round_up(size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::string name_;
  std::unique_ptr<std::byte, Free> buf_;
  size_t cap_ = 0, used_ = 0, peak_ = 0;
};

}  // namespace trex
