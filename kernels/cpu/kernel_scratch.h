// Per-thread scratch and denormal flushing shared by the attention kernels
// (kernels/cpu/attention_tiles.h, kernels/cpu/sparse_attn_tiles.h). Defined in a file built for
// baseline x86-64 (kernel_scratch.cpp: no ISA suffix), so every kernel links one ISA-neutral copy.
#pragma once
#include <cstddef>

namespace trex::kern::cpu {

// The calling thread's scratch of at least n floats, 64-byte aligned (2 MiB aligned and advised
// as huge pages from 4 MiB on): it grows to the largest request and is reused (contents
// undefined), valid until the thread's next call. Throws
// trex::Error when the allocation fails.
float* thread_scratch(size_t n);

// Flush-to-zero and denormals-are-zero while a work item runs (the previous MXCSR is restored by
// the destructor): a sharp softmax makes tiny probabilities whose products are denormal, and each
// one costs a microcode assist of ~100 cycles (measured: 80x slower at a score spread of a few
// hundred). Values below 2^-126 change the results by less than 1e-38.
class FlushDenormals {
 public:
  FlushDenormals();
  ~FlushDenormals();
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  unsigned old_;
};

}  // namespace trex::kern::cpu
