// bf16 GEMM on oneDNN's matmul primitive (see gemm_bf16_dnnl.h). One primitive per call: oneDNN's
// primitive cache (1024 entries by default) keeps the generated kernels, so a repeated primitive
// costs the descriptor set-up only. Without AMX the primitive of a GEMM with N >= 512 leaves every
// size to run time, so all such shapes of one (ta, tb, alpha, beta) share it (runtime_shapes
// below); other shapes, and all on the AMX tiles, have their own (measured in BENCHMARKS.md with
// the step it serves).
#include "kernels/gemm_bf16_dnnl.h"

#include <oneapi/dnnl/dnnl.h>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>
#include "core/cpu.h"
#include "core/error.h"
#include "kernels/peak.h"

namespace trex::kern {

namespace {

void check(dnnl_status_t st, const char* what) {
  TREX_CHECK(st == dnnl_success, "oneDNN bf16 matmul: ", what, " failed (status ", static_cast<int>(st), ")");
}

// The CPU engine (thread-safe) and this thread's stream (streams are not).
dnnl_engine_t engine() {
  static const dnnl_engine_t e = [] {
    dnnl_apply_isa_cap();
    dnnl_engine_t x = nullptr;
    check(dnnl_engine_create(&x, dnnl_cpu, 0), "engine");
    return x;
  }();
  return e;
}

// This thread's stream and scratchpad. The scratchpad is ours (dnnl_scratchpad_mode_user): by
// default oneDNN shares one scratchpad between primitives, which is wrong when grouped_gemm runs
// GEMMs on several threads at once.
struct PerThread {
  dnnl_stream_t s = nullptr;
  std::vector<unsigned char> scratch;
  ~PerThread() {
    if (s) dnnl_stream_destroy(s);
  }
  dnnl_stream_t stream() {
    if (!s) check(dnnl_stream_create(&s, engine(), dnnl_stream_default_flags), "stream");
    return s;
  }
};
thread_local PerThread t_local;

// Destroys the oneDNN objects of one call on every path out.
struct Objects {
  dnnl_primitive_attr_t attr = nullptr;
  dnnl_post_ops_t post = nullptr;
  dnnl_primitive_desc_t pd = nullptr;
  dnnl_primitive_t prim = nullptr;
  dnnl_memory_t mem[4] = {nullptr, nullptr, nullptr, nullptr};
  ~Objects() {
    for (dnnl_memory_t m : mem)
      if (m) dnnl_memory_destroy(m);
    if (prim) dnnl_primitive_destroy(prim);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (post) dnnl_post_ops_destroy(post);
    if (attr) dnnl_primitive_attr_destroy(attr);
  }
};

}  // namespace

bool amx_capped() {
  static const bool capped = [] {
    const char* e = std::getenv("TREX_ISA");
    if (!e) return false;
    for (const char* level : {"ref", "avx2", "avx512", "avx512bf16"})
      if (!std::strcmp(e, level)) return true;
    return false;
  }();
  return capped;
}

void dnnl_apply_isa_cap() {
  static const bool done = [] {
    if (!amx_capped()) return true;
    // Fails only after oneDNN generated a kernel, which every trex call site rules out.
    check(dnnl_set_max_cpu_isa(dnnl_cpu_isa_avx512_core_bf16), "capping the ISA below AMX (TREX_ISA)");
    return true;
  }();
  (void)done;
}

bool dnnl_uses_amx() {
  dnnl_apply_isa_cap();
  const int isa = static_cast<int>(dnnl_get_effective_cpu_isa());
  const int amx = static_cast<int>(dnnl_cpu_isa_avx512_core_amx);
  return (isa & amx) == amx;  // the ISA values are nested bit masks
}

bool bf16_dot_gemm() {
  static const bool units = [] {
    if (cpu_isa() < Isa::Avx512Bf16) return false;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512bf16")) return false;  // reported, not only probed
    // oneDNN runs the matmul on the AMX tiles where it can, else on vdpbf16ps, which on Intel's
    // Xeons runs at about half their FMA rate: 166 against 240-297 GFLOP/s widened on 2 cores of a
    // Sapphire Rapids class CPU with AMX capped (TREX_ISA=avx512bf16).
    return amx_bf16_usable() || bf16_dot_fast();
  }();
  // Read on every call, which costs nothing next to a GEMM: the parity test switches it between
  // two runs of one process (as TREX_ATTN, kernels/attention.cpp).
  const char* e = std::getenv("TREX_GEMM_BF16");
  const bool widen = e && !std::strcmp(e, "widen");
  TREX_USER_CHECK(!e || !*e || widen || !std::strcmp(e, "dot"),
                  "set TREX_GEMM_BF16 to dot (the bf16 dot-product units, the default where CPUID reports "
                  "AVX512_BF16) or widen (f32 panels on the FMA units), or unset it",
                  "environment variable TREX_GEMM_BF16=", e ? e : "", " names no bf16 GEMM path");
  return units && !widen;
}

namespace {

constexpr int64_t kKBlock = 32;  // the AMX bf16 tiles' reduction block (16 rows of 2 bf16 pairs)

// oneDNN before 3.0 runs some AMX bf16 matmuls with an odd K and a row-major B (K x N, not
// transposed) on a tile configuration that does not fit them and faults (SIGILL at tdpbf16ps;
// oneDNN issue #1661; Debian's 2.6.3 on a Sapphire Rapids class CPU: a dx GEMM with K = 63 in
// `trex bench kernels`, dW GEMMs with K = 73-89 in a tiny model's step). A transposed B (the
// forward's x W^T) with an odd K runs.
bool amx_odd_k_faults() {
  static const bool faults = [] { return dnnl_version()->major < 3 && amx_bf16_usable(); }();
  return faults;
}

// Operand descriptors of one matmul: row-major operands as strided 2-d views, op(A) [M, K],
// op(B) [K, N], C [M, N]. runtime: every size and leading dimension left to run time
// (DNNL_RUNTIME_DIM_VAL; only which stride is 1 stays), so one primitive serves every shape.
struct Descs {
  dnnl_memory_desc_t a, b, c;
};
Descs descs(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc,
            bool runtime) {
  if (runtime) M = N = K = lda = ldb = ldc = DNNL_RUNTIME_DIM_VAL;
  const dnnl_dims_t ad = {M, K}, bd = {K, N}, cd = {M, N};
  const dnnl_dims_t as = {ta ? 1 : lda, ta ? lda : 1}, bs = {tb ? 1 : ldb, tb ? ldb : 1}, cs = {ldc, 1};
  Descs d;
  check(dnnl_memory_desc_init_by_strides(&d.a, 2, ad, dnnl_bf16, as), "A descriptor");
  check(dnnl_memory_desc_init_by_strides(&d.b, 2, bd, dnnl_bf16, bs), "B descriptor");
  check(dnnl_memory_desc_init_by_strides(&d.c, 2, cd, dnnl_f32, cs), "C descriptor");
  return d;
}

// Primitives with the sizes left to run time, where oneDNN cannot use the AMX tiles. oneDNN 2.6
// then runs its gemm-based matmul (gemm:jit) instead of the brgemm one, and the primitive cache
// holds one primitive per (ta, tb, alpha, beta). Measured on 2 Zen 5 cores (bf16 dot peak 1148
// GFLOP/s): the MoE experts' GEMMs change their row counts every step, and each new shape cost
// oneDNN 0.4-0.6 ms to generate its brgemm kernels, 730-770 times a bench-v4 step at 8192 tokens
// (400-480 ms); and gemm:jit runs most shapes faster: 4096^3 830 -> 1012 GFLOP/s, the LM head's dh
// 1024 x 1024 x 16384 864 -> 985, a weight gradient 1024 x 1024 x 8192 (A transposed, C +=) 854 ->
// 942 (it adds to C in its own loop; brgemm's sum post-op re-reads C), 8192 x 1024 x 1024 equal.
// Slower: 8192 x 512 x 256 (1018 -> 915) and an expert's dW 1024 x 1024 x 1031 on one thread (505
// -> 469), which the generation cost outweighs. Only for N >= kRuntimeMinN: with fewer columns
// (N 96 or less at K 4096 measured) gemm:jit splits the reduction over the threads, so a call's
// bits would depend on whether it runs alone on all threads or on one (as a grouped GEMM's groups
// do), and narrow shapes ran up to 1.17x slower on it (8192 x 16 x 1024; 8192 x 128 x 1024 1.07x);
// from N = 128 to 512, K up to 16384, M 1 to 1024, 1 and 2 threads gave the same bits. The AMX
// tiles run only in the brgemm kernels.
constexpr int64_t kRuntimeMinN = 512;
bool runtime_shapes(int64_t N) {
  static const bool rt = !dnnl_uses_amx();
  return rt && N >= kRuntimeMinN;
}

// One oneDNN matmul; false: no implementation for these strides (nothing done).
bool matmul(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
            const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const Descs mem = descs(ta, tb, M, N, K, lda, ldb, ldc, false);
  const bool rt = runtime_shapes(N);
  const Descs prim = rt ? descs(ta, tb, M, N, K, lda, ldb, ldc, true) : mem;
  dnnl_matmul_desc_t md;
  check(dnnl_matmul_desc_init(&md, &prim.a, &prim.b, nullptr, &prim.c), "matmul descriptor");
  Objects o;
  check(dnnl_primitive_attr_create(&o.attr), "attributes");
  check(dnnl_primitive_attr_set_scratchpad_mode(o.attr, dnnl_scratchpad_mode_user), "scratchpad mode");
  if (alpha != 1.f) check(dnnl_primitive_attr_set_output_scales(o.attr, 1, 0, &alpha), "alpha");
  if (beta != 0.f) {  // C = alpha A B + beta C: a sum post-op over the old C
    check(dnnl_post_ops_create(&o.post), "post-ops");
    check(dnnl_post_ops_append_sum(o.post, beta), "beta");
    check(dnnl_primitive_attr_set_post_ops(o.attr, o.post), "post-ops");
  }
  if (dnnl_primitive_desc_create(&o.pd, &md, o.attr, engine(), nullptr) != dnnl_success) {
    o.pd = nullptr;
    return false;  // no implementation for these strides: the caller widens
  }
  check(dnnl_primitive_create(&o.prim, o.pd), "primitive");
  check(dnnl_memory_create(&o.mem[0], &mem.a, engine(), const_cast<bf16*>(A)), "A memory");
  check(dnnl_memory_create(&o.mem[1], &mem.b, engine(), const_cast<bf16*>(B)), "B memory");
  check(dnnl_memory_create(&o.mem[2], &mem.c, engine(), C), "C memory");
  const dnnl_memory_desc_t* smd = dnnl_primitive_desc_query_md(o.pd, dnnl_query_scratchpad_md, 0);
  const size_t sbytes = smd ? dnnl_memory_desc_get_size(smd) : 0;
  if (t_local.scratch.size() < sbytes) t_local.scratch.resize(sbytes);
  dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, o.mem[0]}, {DNNL_ARG_WEIGHTS, o.mem[1]}, {DNNL_ARG_DST, o.mem[2]}, {}};
  int nargs = 3;
  if (sbytes > 0) {
    check(dnnl_memory_create(&o.mem[3], smd, engine(), t_local.scratch.data()), "scratchpad memory");
    args[nargs++] = {DNNL_ARG_SCRATCHPAD, o.mem[3]};
  }
  dnnl_stream_t s = t_local.stream();
  check(dnnl_primitive_execute(o.prim, s, nargs, args), "execute");
  check(dnnl_stream_wait(s), "stream wait");
  return true;
}

// Operands copied with their reduction zero-padded to a multiple of kKBlock (this thread's).
struct KPadded {
  std::vector<bf16> a, b;
};
thread_local KPadded t_padded;
// The most elements both padded operands may hold (16 MiB of bf16): a larger GEMM pads only the
// last K % kKBlock steps of its reduction, so the copies stay small next to the operands.
constexpr int64_t kPadWhole = int64_t{1} << 23;

// src: rows x cols at ld -> dst: rows_pad x cols_pad (>= rows, cols), dense, the rest 0.
void copy_padded(const bf16* src, int64_t ld, int64_t rows, int64_t cols, int64_t rows_pad, int64_t cols_pad,
                 std::vector<bf16>& dst) {
  dst.assign(static_cast<size_t>(rows_pad * cols_pad), bf16{});
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dst.data() + r * cols_pad, src + r * ld, cols * sizeof(bf16));
}

// M = 1 on the run-time-shape primitives: oneDNN's gemm-based matmul takes a matrix-vector path
// for a single row, whose sums differ in the last bits from the same row's in any M >= 2 (measured:
// every M from 2 to 512 gives row 0 the same bits, M = 1 others). A lone row is multiplied as row
// 0 of two (the second zero, its result dropped), so a row's result does not depend on how many
// rows share the call (generation gives a prompt the same tokens alone and in a batch).
struct OneRow {
  std::vector<bf16> a;
  std::vector<float> c;
};
thread_local OneRow t_one_row;

bool one_row(bool ta, bool tb, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda, const bf16* B,
             int64_t ldb, float beta, float* C) {
  OneRow& r = t_one_row;
  r.a.assign(static_cast<size_t>(2 * K), bf16{});  // op(A) [2, K]: stored [K, 2] (ta) or [2, K]
  for (int64_t k = 0; k < K; ++k) r.a[static_cast<size_t>(ta ? 2 * k : k)] = A[ta ? k * lda : k];
  r.c.assign(static_cast<size_t>(2 * N), 0.f);
  if (beta != 0.f) std::memcpy(r.c.data(), C, sizeof(float) * N);
  if (!matmul(ta, tb, 2, N, K, alpha, r.a.data(), ta ? 2 : K, B, ldb, beta, r.c.data(), N)) return false;
  std::memcpy(C, r.c.data(), sizeof(float) * N);
  return true;
}

}  // namespace

bool gemm_bf16_dnnl(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
                    const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  // On the AMX tiles a reduction that is not a multiple of kKBlock runs on a slow tail path, or
  // (odd K with a row-major B, oneDNN before 3.0) not at all: an expert's weight gradient over 255
  // rows ran at 290 GFLOP/s against 920 over 256 (2 cores of a Sapphire Rapids class CPU). There
  // both operands are copied with the reduction zero-padded to a multiple of kKBlock (the padding
  // adds 0 x 0 to every sum); the copies move (M + N) Kp bf16 against the 2 M N Kp FLOPs. Where
  // they would exceed kPadWhole elements, the first K - K % kKBlock steps run in place and only
  // the rest is copied, padded to one block, and accumulated into C by a second matmul.
  static const bool amx = dnnl_uses_amx();
  if (M == 1 && runtime_shapes(N)) return one_row(ta, tb, N, K, alpha, A, lda, B, ldb, beta, C);
  const int64_t Kp = (K + kKBlock - 1) / kKBlock * kKBlock;
  if (Kp == K || !amx) {
    if ((K & 1) && !tb && amx_odd_k_faults()) return false;  // the caller widens
    return matmul(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  const int64_t K0 = (M + N) * Kp <= kPadWhole ? 0 : K / kKBlock * kKBlock;  // steps run in place
  if (K0 > 0 && !matmul(ta, tb, M, N, K0, alpha, A, lda, B, ldb, beta, C, ldc)) return false;
  // Steps K0 .. K of op(A) [M, K]: A stored [K, M] (ta: rows) or [M, K] (columns); of op(B)
  // [K, N]: B stored [K, N] (rows) or [N, K] (tb: columns); padded to Kt.
  const int64_t Kr = K - K0, Kt = Kp - K0;
  KPadded& p = t_padded;
  if (ta) copy_padded(A + K0 * lda, lda, Kr, M, Kt, M, p.a);
  else copy_padded(A + K0, lda, M, Kr, M, Kt, p.a);
  if (tb) copy_padded(B + K0, ldb, N, Kr, N, Kt, p.b);
  else copy_padded(B + K0 * ldb, ldb, Kr, N, Kt, N, p.b);
  const bool ok = matmul(ta, tb, M, N, Kt, alpha, p.a.data(), ta ? M : Kt, p.b.data(), tb ? Kt : N,
                         K0 > 0 ? 1.f : beta, C, ldc);
  TREX_CHECK(ok || K0 == 0, "oneDNN bf16 matmul: no implementation for the dense ", M, " x ", N, " x ", Kt,
             " block after the first ", K0, " steps of the reduction");
  return ok;
}

}  // namespace trex::kern
