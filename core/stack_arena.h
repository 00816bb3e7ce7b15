// Activation arena: a stack of 64-byte-aligned blocks. The first training step grows it to the
// size the step needs; later steps reset it and reuse the same blocks, so steady-state steps
// make no system allocation. mark() / release() free everything allocated after the mark.
// Its blocks come from host memory, or from a BlockSource (a backend's device memory: the host
// must not read or write such blocks, and alloc_zero is refused on them).
#pragma once
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>
#include "core/error.h"

namespace trex {

// Where the blocks of a StackArena come from when not from host memory.
struct BlockSource {
  std::function<void*(size_t)> alloc;  // bytes -> block (64-byte aligned at least); throws when out of memory
  std::function<void(void*)> release;
};

class StackArena {
 public:
  explicit StackArena(size_t block_bytes = size_t(64) << 20) : block_(block_bytes) {}
    ~StackArena() { free_blocks(); }
  // Returns every block and takes later ones from src (null: host memory); the peak is kept.
  void use_source(std::shared_ptr<BlockSource> src) {
    free_blocks();
    cur_ = 0, off_ = 0, reserved_ = 0;
    src_ = std::move(src);
  }
  StackArena(const StackArena&) = delete;
  StackArena& operator=(const StackArena&) = delete;

  struct Mark {
    size_t block, offset;
  };

  template <class T>
  T* alloc(size_t n) {
    size_t bytes = round_up(n * sizeof(T));
    if (bytes == 0) bytes = kAlign;
    while (cur_ < blocks_.size() && off_ + bytes > blocks_[cur_].size) {
      ++cur_;
      off_ = 0;
    }
    if (cur_ == blocks_.size()) {
      size_t sz = bytes > block_ ? bytes : block_;
      void* p = src_ ? src_->alloc(sz) : std::aligned_alloc(kAlign, sz);
      TREX_CHECK(p, "activation arena: out of memory allocating ", sz, " bytes");
      blocks_.push_back({static_cast<std::byte*>(p), sz});
      reserved_ += sz;
      off_ = 0;
    }
    T* p = reinterpret_cast<T*>(blocks_[cur_].ptr + off_);
    off_ += bytes;
    size_t in_use = used();
    if (in_use > peak_) peak_ = in_use;
    return p;
  }
  template <class T>
  T* alloc_zero(size_t n) {
    TREX_CHECK(!src_, "StackArena::alloc_zero on device blocks: zero them through their backend");
    T* p = alloc<T>(n);
    std::memset(static_cast<void*>(p), 0, n * sizeof(T));
    return p;
  }

  Mark mark() const { return {cur_, off_}; }
  void release(Mark m) {
    cur_ = m.block;
    off_ = m.offset;
  }
  void reset() { cur_ = 0, off_ = 0; }
  // Bytes in use now (blocks before the current one counted whole), reserved, and high-water mark.
  size_t used() const {
    size_t s = 0;
    for (size_t i = 0; i < cur_ && i < blocks_.size(); ++i) s += blocks_[i].size;
    return s + off_;
  }
  size_t reserved() const { return reserved_; }
  size_t blocks() const { return blocks_.size(); }  // taken from the system so far (never returned)
  size_t peak() const { return peak_; }
  bool host() const { return !src_; }  // blocks in host memory

 private:
  static constexpr size_t kAlign = 64;
  static size_t round_up(size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }
  struct Block {
    std::byte* ptr;
    size_t size;
  };
  void free_blocks() {
    for (Block& b : blocks_) src_ ? src_->release(b.ptr) : std::free(b.ptr);
    blocks_.clear();
  }
  size_t block_;
  std::shared_ptr<BlockSource> src_;
  std::vector<Block> blocks_;
  size_t cur_ = 0, off_ = 0, reserved_ = 0, peak_ = 0;
};

}  // namespace trex
