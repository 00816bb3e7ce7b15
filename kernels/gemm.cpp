// GEMM dispatch: oneDNN sgemm for f32; bf16 x bf16 on oneDNN's bf16 matmul where CPUID reports
// the bf16 dot-product units (kernels/gemm_bf16_dnnl.h; TREX_GEMM_BF16=widen turns it off), else
// bf16 operands widened to f32 panels then sgemm;
// grouped GEMM scheduled by size; TREX_ISA=ref runs the scalar reference (kernels/ref/gemm.h).
#include "kernels/gemm.h"
#include <oneapi/dnnl/dnnl.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>
#include "core/cpu.h"
#include "core/error.h"
#include "core/parallel.h"
#include "kernels/cpu/gemm_avx512.h"
#include "kernels/cpu/gemm_rows_avx512.h"
#include "kernels/gemm_bf16_dnnl.h"
#include "kernels/ref/gemm.h"

namespace trex::kern {
namespace {

// Widened panels: the operand whose free extent (M for A, N for B) is smaller is widened whole
// for one K block (at most kFullPanel floats); the other in blocks of [kPartMin, kPartPanel]
// floats. Each bf16 element is then widened once per call unless min(M, N) > kFullPanel / kc.
// Measured on 2 cores (tests/ops/gemm_ops.cpp perf): 8 MiB blocked panels beat 2 MiB ones by
// up to 18% for M=2048 N=7168 K=1024 (sgemm re-packs the whole side once per call). The minimum
// panel is 2 MiB: with 512 KiB ones a narrow GEMM ran as many small sgemm calls (8192 x 128 x
// 1024: 64 calls of 128 rows), and 2 MiB ran it 1.4x faster (its dW 128 x 1024 x 8192 1.25x,
// M = 256 or 64 by 1024 x 1024 1.2x) with M <= 64 by up to 7168 x 1024 unchanged (2 cores of
// a Sapphire Rapids class Xeon, best of repeated runs). One shape of bench-v4 measured slower, in
// two runs: 1024 x 512 x 8192 with A transposed (the shared experts' down dW), 1.12x, now one
// block of 1024 rows for each K block where it was two of 512; bench-v4's dW rows together 0.965x.
constexpr int64_t kFullPanel = int64_t{1} << 21;  // 8 MiB of f32
constexpr int64_t kPartPanel = int64_t{1} << 21;  // 8 MiB of f32
constexpr int64_t kPartMin = int64_t{1} << 19;    // 2 MiB of f32
constexpr int64_t kKcWhole = 1024;                // K up to this is one block
constexpr int64_t kKc = 512;                      // else equal K blocks of about this size

// Per-thread scratch for widened panels (bounded by kFullPanel + kPartPanel floats).
struct Scratch {
  std::vector<float> buf;
  float* get(size_t n) {
    if (buf.size() < n) buf.resize(n);
    return buf.data();
  }
};
thread_local Scratch t_scratch;

void check_args(const char* fn, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda,
                const void* B, int64_t ldb, const float* C, int64_t ldc) {
  TREX_CHECK(M >= 0 && N >= 0 && K >= 0, fn, ": M=", M, " N=", N, " K=", K);
  if (M == 0 || N == 0) return;
  TREX_CHECK(C && ldc >= N, fn, ": C=", static_cast<const void*>(C), " ldc=", ldc, " N=", N);
  if (K == 0) return;
  TREX_CHECK(A && lda >= std::max<int64_t>(1, ta ? M : K), fn, ": lda=", lda, " ta=", ta, " M=", M, " K=", K);
  TREX_CHECK(B && ldb >= std::max<int64_t>(1, tb ? K : N), fn, ": ldb=", ldb, " tb=", tb, " N=", N, " K=", K);
}

// C = beta * C for K == 0 (beta == 0 writes zeros without reading C).
void scale_c(int64_t M, int64_t N, float beta, float* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i) {
    float* c = C + i * ldc;
    if (beta == 0.f) std::memset(c, 0, sizeof(float) * N);
    else if (beta != 1.f)
      for (int64_t j = 0; j < N; ++j) c[j] *= beta;
  }
}

void sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  dnnl_apply_isa_cap();
  dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  TREX_CHECK(st == dnnl_success, "dnnl_sgemm failed: status ", static_cast<int>(st), " M=", M, " N=", N,
             " K=", K, " lda=", lda, " ldb=", ldb, " ldc=", ldc);
}

}  // namespace

void widen_bf16(const bf16* src, int64_t lds, int64_t rows, int64_t cols, float* dst) {
  const bool avx = cpu_isa() >= Isa::Avx512;
  parallel_for(rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1)), [&](int64_t r0, int64_t r1) {
    if (avx) return cpu::bf16_to_f32_2d_avx512(src + r0 * lds, lds, r1 - r0, cols, dst + r0 * cols, cols);
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t j = 0; j < cols; ++j) dst[r * cols + j] = bf16_to_f32(src[r * lds + j]);
  });
}

namespace {

// Block size for n items with blocks of at most `cap` (>= 16): equal blocks, a multiple of 16
// unless one block holds all n.
int64_t balanced(int64_t n, int64_t cap) {
  cap = std::max<int64_t>(16, cap);
  if (n <= cap) return n;
  const int64_t nb = (n + cap - 1) / cap, per = (n + nb - 1) / nb;
  return std::min(n, (per + 15) / 16 * 16);
}

// A stored matrix (f32 or bf16) and a block of it in stored coordinates, widened if needed.
struct Operand {
  Prec p;
  const void* base;
  int64_t ld;
  // Block rows [r0, r0+rn), cols [c0, c0+cn) as f32: a pointer into the operand when it is
  // f32, else widened into buf (stride cn). Returns the pointer and sets *ld_out.
  const float* block(int64_t r0, int64_t rn, int64_t c0, int64_t cn, float* buf, int64_t* ld_out) const {
    if (p == Prec::F32) {
      *ld_out = ld;
      return static_cast<const float*>(base) + r0 * ld + c0;
    }
    widen_bf16(static_cast<const bf16*>(base) + r0 * ld + c0, ld, rn, cn, buf);
    *ld_out = cn;
    return buf;
  }
};

// The fast path; arguments already checked, M, N, K > 0.
void gemm_fast(Prec pa, Prec pb, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
               int64_t lda, const void* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (pa == Prec::F32 && pb == Prec::F32)
    return sgemm(ta, tb, M, N, K, alpha, static_cast<const float*>(A), lda, static_cast<const float*>(B), ldb,
                 beta, C, ldc);
  // Both bf16 on a CPU whose bf16 dot units run at full rate (unless TREX_GEMM_BF16=widen): oneDNN's matmul.
  if (pa == Prec::BF16 && pb == Prec::BF16 && bf16_dot_gemm() &&
      gemm_bf16_dnnl(ta, tb, M, N, K, alpha, static_cast<const bf16*>(A), lda, static_cast<const bf16*>(B), ldb, beta,
                     C, ldc))
    return;
  const int64_t kc = K <= kKcWhole ? K : balanced(K, kKc);
  const bool a_whole = M <= N;  // A is the side widened whole per K block
  // The whole side's panel (rows up to kFullPanel / kc); the blocked side's panel is about as
  // large (sgemm re-packs the whole side once per call), within [kPartMin, kPartPanel] floats
  // so small ones stay in L2 while widened.
  const int64_t whole = balanced(a_whole ? M : N, kFullPanel / kc);
  const int64_t part = balanced(a_whole ? N : M, std::clamp(whole * kc, kPartMin, kPartPanel) / kc);
  const int64_t mc = a_whole ? whole : part, nc = a_whole ? part : whole;
  const Operand opa{pa, A, lda}, opb{pb, B, ldb};
  float* sa = nullptr;
  float* sb = nullptr;
  {
    size_t na = pa == Prec::BF16 ? static_cast<size_t>(mc * kc) : 0;
    size_t nb = pb == Prec::BF16 ? static_cast<size_t>(nc * kc) : 0;
    float* s = t_scratch.get(na + nb);
    sa = s;
    sb = s + na;
  }
  for (int64_t k0 = 0; k0 < K; k0 += kc) {
    const int64_t kb = std::min(kc, K - k0);
    const float bk = k0 == 0 ? beta : 1.f;
    // Outer loop over the whole-widened side, inner over the blocked side.
    const int64_t outer_n = a_whole ? M : N, outer_c = a_whole ? mc : nc;
    const int64_t inner_n = a_whole ? N : M, inner_c = a_whole ? nc : mc;
    for (int64_t o0 = 0; o0 < outer_n; o0 += outer_c) {
      const int64_t ob = std::min(outer_c, outer_n - o0);
      int64_t ld_o;
      const float* po;
      if (a_whole) po = ta ? opa.block(k0, kb, o0, ob, sa, &ld_o) : opa.block(o0, ob, k0, kb, sa, &ld_o);
      else po = tb ? opb.block(o0, ob, k0, kb, sb, &ld_o) : opb.block(k0, kb, o0, ob, sb, &ld_o);
      for (int64_t i0 = 0; i0 < inner_n; i0 += inner_c) {
        const int64_t ib = std::min(inner_c, inner_n - i0);
        int64_t ld_i;
        const float* pi;
        if (a_whole) pi = tb ? opb.block(i0, ib, k0, kb, sb, &ld_i) : opb.block(k0, kb, i0, ib, sb, &ld_i);
        else pi = ta ? opa.block(k0, kb, i0, ib, sa, &ld_i) : opa.block(i0, ib, k0, kb, sa, &ld_i);
        if (a_whole) sgemm(ta, tb, ob, ib, kb, alpha, po, ld_o, pi, ld_i, bk, C + o0 * ldc + i0, ldc);
        else sgemm(ta, tb, ib, ob, kb, alpha, pi, ld_i, po, ld_o, bk, C + i0 * ldc + o0, ldc);
      }
    }
  }
}

template <class TA, class TB>
void gemm_ref(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A, int64_t lda,
              const void* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  ref::gemm<float>(ta, tb, M, N, K, alpha, static_cast<const TA*>(A), lda, static_cast<const TB*>(B), ldb, beta, C,
                   ldc);
}

// Checked entry shared by all public functions.
void gemm_any(const char* fn, Prec pa, Prec pb, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
              const void* A, int64_t lda, const void* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  check_args(fn, ta, tb, M, N, K, A, lda, B, ldb, C, ldc);
  if (M == 0 || N == 0) return;
  if (K == 0) return scale_c(M, N, beta, C, ldc);
  if (isa_ref_forced()) {
    if (pa == Prec::F32 && pb == Prec::F32) return gemm_ref<float, float>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    if (pa == Prec::F32) return gemm_ref<float, bf16>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    if (pb == Prec::F32) return gemm_ref<bf16, float>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return gemm_ref<bf16, bf16>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  gemm_fast(pa, pb, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace

void gemm_f32(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  gemm_any("gemm_f32", Prec::F32, Prec::F32, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
               const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  gemm_any("gemm_bf16", Prec::BF16, Prec::BF16, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_mixed(Prec pa, Prec pb, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
                int64_t lda, const void* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  gemm_any("gemm_mixed", pa, pb, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// Schedule: groups sorted by work (M*N*K), largest first. While the largest remaining group
// holds more than 1/(2T) of the remaining work (T threads) it runs alone on all threads (a
// thread-per-group schedule would leave threads idle behind it); the rest run concurrently,
// one thread each, dynamically scheduled, so no barrier is paid per group and the tail is at
// most about one small group. Groups below kMinSharedWork never run on all threads.
constexpr double kMinSharedWork = 16.0 * 1024 * 1024;

void grouped_gemm(Prec prec, bool ta, bool tb, float alpha, float beta, const GemmGroup* groups, int n_groups) {
  TREX_CHECK(n_groups >= 0 && (n_groups == 0 || groups), "grouped_gemm: n_groups=", n_groups);
  std::vector<int> order;
  std::vector<double> work(n_groups, 0.0);
  double rem = 0;
  for (int g = 0; g < n_groups; ++g) {
    const GemmGroup& q = groups[g];
    check_args("grouped_gemm", ta, tb, q.M, q.N, q.K, q.A, q.lda, q.B, q.ldb, q.C, q.ldc);
    if (q.M == 0 || q.N == 0) continue;
    work[g] = static_cast<double>(q.M) * q.N * std::max<int64_t>(q.K, 1);
    rem += work[g];
    order.push_back(g);
  }
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return work[a] > work[b]; });
  auto run = [&](int g) {
    const GemmGroup& q = groups[g];
    gemm_any("grouped_gemm", prec, prec, ta, tb, q.M, q.N, q.K, alpha, q.A, q.lda, q.B, q.ldb, beta, q.C, q.ldc);
  };
  const int T = num_threads();
  size_t i = 0;
  for (; i < order.size(); ++i) {
    const double w = work[order[i]];
    if (T > 1 && i + 1 < order.size() && (w < kMinSharedWork || w * 2 * T <= rem)) break;
    run(order[i]);  // alone on all threads
    rem -= w;
  }
  const int64_t left = static_cast<int64_t>(order.size() - i);
  parallel_dynamic(left, [&](int64_t k) { run(order[i + k]); });
}

namespace {

// Tiles of the row-invariant forms (threads take whole tiles): rows x columns.
constexpr int64_t kInvRows = 64, kInvCols = 64;

struct InvTile {
  int g;
  int64_t r0, c0;
};

// The portable form of cpu::gemm_rows_abt_avx512: per element, 8 partial sums over k (k mod 8),
// added in a fixed order; the same operations whatever the tile.
template <class TA, class TB>
void rows_abt_portable(int64_t i0, int64_t i1, int64_t n0, int64_t n1, int64_t K, float alpha, const void* A,
                       int64_t lda, const void* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  auto val = [](auto x) { return ref::widen<float>(x); };
  for (int64_t i = i0; i < i1; ++i) {
    const TA* a = static_cast<const TA*>(A) + i * lda;
    for (int64_t n = n0; n < n1; ++n) {
      const TB* b = static_cast<const TB*>(B) + n * ldb;
      float p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t k = 0;
      for (; k + 8 <= K; k += 8)
        for (int j = 0; j < 8; ++j) p[j] += val(a[k + j]) * val(b[k + j]);
      for (int j = 0; k + j < K; ++j) p[j] += val(a[k + j]) * val(b[k + j]);
      const float s = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
      float* y = C + i * ldc + n;
      *y = beta == 0.f ? alpha * s : std::fma(beta, *y, alpha * s);
    }
  }
}

void invariant_tile(Prec pa, Prec pb, float alpha, float beta, const GemmGroup& q, int64_t r0, int64_t c0) {
  const int64_t r1 = std::min(q.M, r0 + kInvRows), c1 = std::min(q.N, c0 + kInvCols);
  const bool abf = pa == Prec::BF16, bbf = pb == Prec::BF16;
  if (cpu_isa() >= Isa::Avx512 && !isa_ref_forced())
    return cpu::gemm_rows_abt_avx512(abf, bbf, r0, r1, c0, c1, q.K, alpha, q.A, q.lda, q.B, q.ldb, beta, q.C, q.ldc);
  auto f = abf ? (bbf ? &rows_abt_portable<bf16, bf16> : &rows_abt_portable<bf16, float>)
               : (bbf ? &rows_abt_portable<float, bf16> : &rows_abt_portable<float, float>);
  f(r0, r1, c0, c1, q.K, alpha, q.A, q.lda, q.B, q.ldb, beta, q.C, q.ldc);
}

void invariant_groups(Prec pa, Prec pb, float alpha, float beta, const GemmGroup* groups, int n_groups) {
  std::vector<InvTile> tiles;
  for (int g = 0; g < n_groups; ++g) {
    const GemmGroup& q = groups[g];
    check_args("gemm_rows_invariant", false, true, q.M, q.N, q.K, q.A, q.lda, q.B, q.ldb, q.C, q.ldc);
    for (int64_t r0 = 0; r0 < q.M; r0 += kInvRows)
      for (int64_t c0 = 0; c0 < q.N; c0 += kInvCols) tiles.push_back({g, r0, c0});
  }
  parallel_dynamic((int64_t)tiles.size(), [&](int64_t t) {
    const InvTile& x = tiles[(size_t)t];
    invariant_tile(pa, pb, alpha, beta, groups[x.g], x.r0, x.c0);
  });
}

}  // namespace

void gemm_rows_invariant(Prec pa, Prec pb, int64_t M, int64_t N, int64_t K, float alpha, const void* A, int64_t lda,
                         const void* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const GemmGroup g{A, B, C, M, N, K, lda, ldb, ldc};
  invariant_groups(pa, pb, alpha, beta, &g, 1);
}

void grouped_gemm_rows_invariant(Prec prec, float alpha, float beta, const GemmGroup* groups, int n_groups) {
  TREX_CHECK(n_groups >= 0 && (n_groups == 0 || groups), "grouped_gemm_rows_invariant: n_groups=", n_groups);
  invariant_groups(prec, prec, alpha, beta, groups, n_groups);
}

}  // namespace trex::kern
