// Activation arena: a stack of 64-byte-aligned allocations. mark() / release() free everything
// allocated after the mark; the first training step grows it to the size the step needs, later
// steps reset it and reuse the same memory, so steady-state steps make no system allocation.
//
// Host memory: one contiguous range. The arena reserves address space once (PROT_NONE, no memory
// behind it) and makes it writable as the stack's high-water mark passes each growth step, so the
// bytes in use are exactly the bytes allocated and not released, and a long sequence's large
// allocations never leave unused tails behind (as a chain of separate blocks does when an
// allocation does not fit the rest of the current one). Pages become resident when first written.
//
// A BlockSource (a backend's device memory: the host must not read or write such blocks, and
// alloc_zero is refused on them) cannot grow in place: there the arena is a chain of blocks. An
// allocation that does not fit the rest of the current block starts the next one and the skipped
// tail counts as used; reserve() sizes the first block (train/loop.cpp: the activation estimate)
// so that a step fits one block.
#pragma once
#include <sys/mman.h>
#include <unistd.h>
#include <algorithm>
#include <cstddef>
#include <cstdint>
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
  // grow_bytes: host memory is made writable in steps of this size; a block source's blocks are
  // at least this size.
  explicit StackArena(size_t grow_bytes = size_t(64) << 20) : step_(std::max(round_up(grow_bytes), kAlign)) {}
  ~StackArena() { free_all(); }
  // Returns all memory and takes later blocks from src (null: host memory); the peak is kept.
  void use_source(std::shared_ptr<BlockSource> src) {
    free_all();
    src_ = std::move(src);
  }
  StackArena(const StackArena&) = delete;
  StackArena& operator=(const StackArena&) = delete;

  struct Mark {
    size_t block, offset;
  };

  template <class T>
  T* alloc(size_t n) {
    TREX_CHECK(n <= (SIZE_MAX - kAlign) / sizeof(T), "activation arena: allocation of ", n, " elements of ",
               sizeof(T), " bytes overflows");
    size_t bytes = round_up(n * sizeof(T));
    if (bytes == 0) bytes = kAlign;
    std::byte* p = src_ ? alloc_block(bytes) : alloc_host(bytes);
    const size_t in_use = used();
    if (in_use > peak_) peak_ = in_use;
    return reinterpret_cast<T*>(p);
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
  // A block source's first block of at least `bytes` (before any allocation; no effect on host
  // memory, which grows in place, or once blocks exist).
  void reserve(size_t bytes) {
    if (src_ && blocks_.empty()) new_block(round_up(bytes));
  }
  // Bytes in use now (a block source's blocks before the current one counted whole), memory taken
  // from the system (host: made writable), and the high-water mark of bytes in use.
  size_t used() const {
    size_t s = 0;
    for (size_t i = 0; i < cur_ && i < blocks_.size(); ++i) s += blocks_[i].size;
    return s + off_;
  }
  size_t reserved() const { return src_ ? block_bytes_ : committed_; }
  size_t grows() const { return grows_; }  // times it took memory from the system (never returned)
  size_t peak() const { return peak_; }
  bool host() const { return !src_; }  // host memory

 private:
  static constexpr size_t kAlign = 64;
  static size_t round_to(size_t b, size_t unit) { return (b + unit - 1) / unit * unit; }
  static size_t round_up(size_t b) { return round_to(b, kAlign); }
  struct Block {
    std::byte* ptr;
    size_t size;
  };

  // Host: one range of address space, reserved on first use, made writable as the stack grows.
  std::byte* alloc_host(size_t bytes) {
    const size_t end = off_ + bytes;
    TREX_CHECK(end >= off_, "activation arena: allocation of ", bytes, " bytes overflows");
    if (end > committed_) commit(end);
    std::byte* p = base_ + off_;
    off_ = end;
    return p;
  }
  void commit(size_t end) {
    if (!base_) reserve_range(end);
    TREX_CHECK(end <= range_, "activation arena: out of memory: ", end, " bytes in use exceed the ", range_,
               " bytes of address space it reserved (twice this machine's memory, or less under ulimit -v)");
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t to = std::min(round_to(round_to(end, step_), page), range_);
    TREX_CHECK(mprotect(base_ + committed_, to - committed_, PROT_READ | PROT_WRITE) == 0,
               "activation arena: out of memory growing to ", to, " bytes");
    committed_ = to;
    ++grows_;
  }
  void reserve_range(size_t need) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), phys = (size_t)sysconf(_SC_PHYS_PAGES) * page;
    // Twice the machine's memory: the stack can never usefully grow past it. A smaller range when
    // the address space is limited (ulimit -v), down to what this allocation needs.
    size_t want = std::max(2 * phys, need + step_);
    want = round_to(want, page);
    const size_t least = round_to(need + step_, page);
    for (;;) {
      void* p = mmap(nullptr, want, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p != MAP_FAILED) {
        base_ = static_cast<std::byte*>(p);
        range_ = want;
        return;
      }
      TREX_CHECK(want > least, "activation arena: cannot reserve ", least, " bytes of address space");
      want = std::max(least, want / 2 / page * page);
    }
  }

  // Block source: a chain of blocks.
  std::byte* alloc_block(size_t bytes) {
    while (cur_ < blocks_.size() && off_ + bytes > blocks_[cur_].size) {
      ++cur_;
      off_ = 0;
    }
    if (cur_ == blocks_.size()) new_block(bytes), off_ = 0;
    std::byte* p = blocks_[cur_].ptr + off_;
    off_ += bytes;
    return p;
  }
  void new_block(size_t bytes) {
    const size_t sz = std::max(bytes, step_);
    void* p = src_->alloc(sz);
    TREX_CHECK(p, "activation arena: out of memory allocating ", sz, " bytes");
    blocks_.push_back({static_cast<std::byte*>(p), sz});
    block_bytes_ += sz;
    ++grows_;
  }

  void free_all() {
    for (Block& b : blocks_) src_->release(b.ptr);
    blocks_.clear();
    if (base_) munmap(base_, range_);
    base_ = nullptr;
    range_ = committed_ = block_bytes_ = 0;
    cur_ = 0, off_ = 0;
  }

  size_t step_;
  std::shared_ptr<BlockSource> src_;
  // host memory
  std::byte* base_ = nullptr;
  size_t range_ = 0, committed_ = 0;
  // block source
  std::vector<Block> blocks_;
  size_t block_bytes_ = 0;
  size_t cur_ = 0, off_ = 0, grows_ = 0, peak_ = 0;
};

}  // namespace trex
