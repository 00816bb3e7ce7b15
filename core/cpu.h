// CPU feature detection for runtime kernel selection. TREX_ISA=ref|avx2|avx512|avx512bf16 caps
// the level (for testing the fallbacks); by default the best the CPU supports is used. Avx2 means
// AVX2 + FMA + F16C without AVX-512: the kernels that have an AVX2 version (kernels/cpu/*_avx2.cpp)
// use it, the others run their scalar reference there.
// avx512bf16: some hypervisors hide the CPUID bit although the instruction executes; when the
// bit is absent trex runs one vdpbf16ps under a SIGILL guard and checks its result.
#pragma once
#include <immintrin.h>
#include <setjmp.h>
#include <signal.h>
#include <cstdlib>
#include <cstring>

namespace trex {

enum class Isa { Ref = 0, Avx2 = 1, Avx512 = 2, Avx512Bf16 = 3 };


namespace detail_cpu {

inline sigjmp_buf& probe_jmp() {  // only touched during the one-time probe below
  static sigjmp_buf b;
  return b;
}
inline void on_sigill(int) { siglongjmp(probe_jmp(), 1); }

__attribute__((target("avx512f,avx512bf16"))) inline float dpbf16_once() {
  __m512 acc = _mm512_set1_ps(1.f);
  __m512bh one = (__m512bh)_mm512_set1_epi16(0x3f80);  // bf16 1.0
  acc = _mm512_dpbf16_ps(acc, one, one);               // 1 + 1*1 + 1*1
  return _mm512_cvtss_f32(acc);
}

inline bool probe_bf16_dot() {
  struct sigaction sa {}, old {};
  sa.sa_handler = on_sigill;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGILL, &sa, &old);
  bool ok = false;
  if (sigsetjmp(probe_jmp(), 1) == 0) ok = dpbf16_once() == 3.f;
  sigaction(SIGILL, &old, nullptr);
  return ok;
}

}  // namespace detail_cpu

inline bool cpu_has_bf16_dot() {
  static const bool has = [] {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f")) return false;
    if (__builtin_cpu_supports("avx512bf16")) return true;
    return detail_cpu::probe_bf16_dot();
  }();
  return has;
}

inline Isa detect_isa() {
  __builtin_cpu_init();
  Isa best = Isa::Ref;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
    best = Isa::Avx2;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    best = Isa::Avx512;
  if (best == Isa::Avx512 && cpu_has_bf16_dot()) best = Isa::Avx512Bf16;
  if (const char* e = std::getenv("TREX_ISA")) {
    Isa cap = Isa::Avx512Bf16;
    if (!std::strcmp(e, "ref")) cap = Isa::Ref;
    else if (!std::strcmp(e, "avx2")) cap = Isa::Avx2;
    else if (!std::strcmp(e, "avx512")) cap = Isa::Avx512;
    if (static_cast<int>(cap) < static_cast<int>(best)) best = cap;
  }
  return best;
}

inline Isa cpu_isa() {
  static const Isa isa = detect_isa();
  return isa;
}

// TREX_ISA=ref: every kernel, GEMM included, runs its scalar reference. Without that, GEMM goes
// to oneDNN even on a CPU without AVX-512 (oneDNN picks AVX2 / SSE itself); only trex's own
// AVX-512 kernels fall back to the reference there.
inline bool isa_ref_forced() {
  static const bool forced = [] {
    const char* e = std::getenv("TREX_ISA");
    return e && !std::strcmp(e, "ref");
  }();
  return forced;
}

inline const char* isa_name(Isa i) {
  switch (i) {
    case Isa::Ref: return "ref";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
    case Isa::Avx512Bf16: return "avx512bf16";
  }
  return "?";
}

}  // namespace trex
