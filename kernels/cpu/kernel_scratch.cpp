#include "kernels/cpu/kernel_scratch.h"

#include <immintrin.h>
#include <sys/mman.h>

#include <cstdlib>
#include "core/error.h"

namespace trex::kern::cpu {

namespace {

struct Scratch {
  float* p = nullptr;
  size_t cap = 0;
  ~Scratch() { std::free(p); }
  float* get(size_t n) {
    if (n > cap) {
      std::free(p);
      // From 4 MiB on, whole 2 MiB huge pages where the OS allows: the packed panels of a (b, h)
      // are walked row by row, and 4 KiB pages make that hard on the TLB.
      constexpr size_t kHuge = size_t{2} << 20;
      size_t bytes = (n * sizeof(float) + 63) & ~size_t{63};
      const bool huge = bytes >= 2 * kHuge;
      if (huge) bytes = (bytes + kHuge - 1) & ~(kHuge - 1);
      p = static_cast<float*>(std::aligned_alloc(huge ? kHuge : 64, bytes));
      TREX_CHECK(p, "attention kernel: cannot allocate ", bytes, " bytes of per-thread scratch");
#ifdef MADV_HUGEPAGE
      if (huge) madvise(p, bytes, MADV_HUGEPAGE);  // a hint; failure is harmless
#endif
      cap = n;
    }
    return p;
  }
};

}  // namespace

float* thread_scratch(size_t n) {
  static thread_local Scratch s;
  return s.get(n);
}

FlushDenormals::FlushDenormals() : old_(_mm_getcsr()) { _mm_setcsr(old_ | 0x8040); }  // FTZ (bit 15) | DAZ (bit 6)
FlushDenormals::~FlushDenormals() { _mm_setcsr(old_); }

}  // namespace trex::kern::cpu
