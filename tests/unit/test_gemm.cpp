// Unit tests for kernels/gemm.h, kernels/lm_head_ce.h and kernels/peak.h: hand-checked values
// (the op harness in tests/ops covers random shapes against the references).
#include <gtest/gtest.h>
#include <cmath>
#include <limits>
#include <string>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>
#include "core/cpu.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/gemm.h"
#include "kernels/gemm_bf16_dnnl.h"
#include "kernels/lm_head_ce.h"
#include "kernels/peak.h"

namespace {
using namespace trex;
using namespace trex::kern;

// A = [[1,2,3],[4,5,6]] (2x3), B = [[1,0],[0,1],[1,1]] (3x2): A @ B = [[4,5],[10,11]].
TEST(Gemm, AllTranspositionModes) {
  const float A[] = {1, 2, 3, 4, 5, 6}, At[] = {1, 4, 2, 5, 3, 6};
  const float B[] = {1, 0, 0, 1, 1, 1}, Bt[] = {1, 0, 1, 0, 1, 1};
  const float want[] = {4, 5, 10, 11};
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    float C[4] = {std::nanf(""), std::nanf(""), std::nanf(""), std::nanf("")};  // beta = 0: not read
    gemm_f32(ta, tb, 2, 2, 3, 1.f, ta ? At : A, ta ? 2 : 3, tb ? Bt : B, tb ? 3 : 2, 0.f, C, 2);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(C[i], want[i]) << "ta=" << ta << " tb=" << tb << " i=" << i;
  }
}

TEST(Gemm, AlphaBetaAndKZero) {
  const float A[] = {1, 2}, B[] = {3, 4};  // 1x2 @ 2x1 = 11
  float C[] = {1};
  gemm_f32(false, false, 1, 1, 2, 2.f, A, 2, B, 1, 3.f, C, 1);
  EXPECT_EQ(C[0], 25.f);
  gemm_f32(false, false, 1, 1, 0, 2.f, nullptr, 1, nullptr, 1, 0.5f, C, 1);  // K = 0: C = beta * C
  EXPECT_EQ(C[0], 12.5f);
}

TEST(Gemm, Bf16IsExactOnSmallIntegers) {
  std::vector<bf16> A(4 * 5), B(5 * 3);
  std::vector<float> Af(A.size()), Bf(B.size());
  for (size_t i = 0; i < A.size(); ++i) A[i] = f32_to_bf16(Af[i] = static_cast<float>(int(i % 7) - 3));
  for (size_t i = 0; i < B.size(); ++i) B[i] = f32_to_bf16(Bf[i] = static_cast<float>(int(i % 5) - 2));
  std::vector<float> C(12), Cf(12);
  gemm_bf16(false, false, 4, 3, 5, 1.f, A.data(), 5, B.data(), 3, 0.f, C.data(), 3);
  gemm_f32(false, false, 4, 3, 5, 1.f, Af.data(), 5, Bf.data(), 3, 0.f, Cf.data(), 3);
  EXPECT_EQ(C, Cf);
  gemm_mixed(Prec::F32, Prec::BF16, false, false, 4, 3, 5, 1.f, Af.data(), 5, B.data(), 3, 0.f, C.data(), 3);
  EXPECT_EQ(C, Cf);
}

TEST(Gemm, BadLeadingDimensionThrows) {
  float A[6] = {}, B[6] = {}, C[4] = {};
  EXPECT_THROW(gemm_f32(false, false, 2, 2, 3, 1.f, A, 2, B, 2, 0.f, C, 2), trex::Error);  // lda < K
}

// A row's bf16 product does not depend on how many rows share the call, nor on whether the call
// runs alone on all threads or on one thread inside a parallel region (a grouped GEMM's groups;
// generation batches its prompts): narrow and wide N (oneDNN's brgemm and, without AMX, its
// gemm-based kernels from N = 512 on), M from 1 to 33, K up to 4096, both B layouts.
TEST(Gemm, Bf16RowsIndependentOfRowCountAndThreads) {
  for (int64_t N : {24, 96, 512, 1024})
    for (int64_t K : {24, 1024, 4096})
      for (bool tb : {false, true}) {
        SCOPED_TRACE("N=" + std::to_string(N) + " K=" + std::to_string(K) + " tb=" + std::to_string(tb));
        std::vector<bf16> A(33 * K), B(N * K);
        unsigned r = 7;
        for (bf16& x : A) x = f32_to_bf16(static_cast<float>((r = r * 1103515245u + 12345u) >> 20) / 4096.f - 0.5f);
        for (bf16& x : B) x = f32_to_bf16(static_cast<float>((r = r * 1103515245u + 12345u) >> 20) / 4096.f - 0.5f);
        std::vector<float> one(N);
        gemm_bf16(false, tb, 1, N, K, 1.f, A.data(), K, B.data(), tb ? K : N, 0.f, one.data(), N);
        for (int64_t M : {2, 3, 9, 33}) {
          std::vector<float> all(M * N), inner(M * N);
          gemm_bf16(false, tb, M, N, K, 1.f, A.data(), K, B.data(), tb ? K : N, 0.f, all.data(), N);
#pragma omp parallel num_threads(2)
          {
#pragma omp master
            gemm_bf16(false, tb, M, N, K, 1.f, A.data(), K, B.data(), tb ? K : N, 0.f, inner.data(), N);
          }
          EXPECT_EQ(0, std::memcmp(one.data(), all.data(), N * sizeof(float))) << "M=" << M << ": row 0";
          EXPECT_EQ(0, std::memcmp(all.data(), inner.data(), M * N * sizeof(float))) << "M=" << M << ": threads";
        }
      }
}

// The row-invariant forms (generation): a row of an M-row call equals the row alone, bit for bit,
// for M across the register and thread tiles, on all threads or inside a parallel region, f32,
// bf16 and mixed, strided A and C, with beta 0 and 1; and the values are the product (double
// reference). K = 1000 is where oneDNN's sgemm changes its K blocking with M and the threads.
TEST(GemmRowsInvariant, EachRowEqualsTheRowAloneAndTheProduct) {
  const std::pair<Prec, Prec> precs[] = {{Prec::F32, Prec::F32}, {Prec::BF16, Prec::BF16}, {Prec::F32, Prec::BF16}};
  for (auto [pa, pb] : precs)
    for (int64_t N : {7, 65, 300})
      for (int64_t K : {13, 1000}) {
        SCOPED_TRACE("a_bf16=" + std::to_string(pa == Prec::BF16) + " b_bf16=" + std::to_string(pb == Prec::BF16) +
                     " N=" + std::to_string(N) + " K=" + std::to_string(K));
        const int64_t Mmax = 70, lda = K + 3, ldc = N + 5, ldb = K + 1;
        std::vector<float> Af(Mmax * lda), Bf(N * ldb);
        unsigned r = 11;
        auto next = [&] { return static_cast<float>((r = r * 1103515245u + 12345u) >> 20) / 4096.f - 0.5f; };
        for (float& x : Af) x = next();
        for (float& x : Bf) x = next();
        std::vector<bf16> Ab(Af.size()), Bb(Bf.size());
        if (pa == Prec::BF16)
          for (size_t i = 0; i < Af.size(); ++i) Af[i] = bf16_to_f32(Ab[i] = f32_to_bf16(Af[i]));
        if (pb == Prec::BF16)
          for (size_t i = 0; i < Bf.size(); ++i) Bf[i] = bf16_to_f32(Bb[i] = f32_to_bf16(Bf[i]));
        const void* A = pa == Prec::F32 ? (const void*)Af.data() : (const void*)Ab.data();
        const void* B = pb == Prec::F32 ? (const void*)Bf.data() : (const void*)Bb.data();
        const size_t ea = pa == Prec::F32 ? 4 : 2;
        std::vector<float> C0(Mmax * ldc);
        for (float& x : C0) x = next();
        for (float beta : {0.f, 1.f})
          for (int64_t M : {1, 3, 4, 5, 17, 64, 70}) {
            std::vector<float> all = C0, inner = C0;
            gemm_rows_invariant(pa, pb, M, N, K, 1.f, A, lda, B, ldb, beta, all.data(), ldc);
#pragma omp parallel num_threads(2)
            {
#pragma omp master
              gemm_rows_invariant(pa, pb, M, N, K, 1.f, A, lda, B, ldb, beta, inner.data(), ldc);
            }
            EXPECT_EQ(all, inner) << "M=" << M << " beta=" << beta << ": inside a parallel region";
            for (int64_t i : {int64_t{0}, M / 2, M - 1}) {
              std::vector<float> one(C0.begin() + i * ldc, C0.begin() + i * ldc + N);
              gemm_rows_invariant(pa, pb, 1, N, K, 1.f, (const char*)A + i * lda * ea, lda, B, ldb, beta, one.data(),
                                  N);
              EXPECT_EQ(0, std::memcmp(one.data(), all.data() + i * ldc, N * sizeof(float)))
                  << "M=" << M << " beta=" << beta << ": row " << i;
              for (int64_t j = 0; j < N; ++j) {
                double want = beta * C0[i * ldc + j];
                for (int64_t k = 0; k < K; ++k) want += (double)Af[i * lda + k] * Bf[j * ldb + k];
                ASSERT_NEAR(all[i * ldc + j], want, 1e-5 * std::sqrt((double)K) + 1e-6 * std::abs(want))
                    << "M=" << M << " row " << i << " col " << j;
              }
            }
            for (int64_t i = 0; i < Mmax; ++i)
              for (int64_t j = i < M ? N : 0; j < ldc; ++j)
                ASSERT_EQ(all[i * ldc + j], C0[i * ldc + j]) << "row " << i << " col " << j << " written";
          }
      }
}

// Grouped: each group gets what it gets alone (groups of 0, 2, 19 and 75 rows).
TEST(GemmRowsInvariant, GroupsEqualSingleCalls) {
  const int64_t N = 45, K = 1000;
  std::vector<float> A(96 * K), B(4 * N * K);
  unsigned r = 5;
  for (float& x : A) x = static_cast<float>((r = r * 1103515245u + 12345u) >> 20) / 4096.f - 0.5f;
  for (float& x : B) x = static_cast<float>((r = r * 1103515245u + 12345u) >> 20) / 4096.f - 0.5f;
  const int64_t rows[] = {0, 2, 19, 75}, first[] = {0, 0, 2, 21};
  std::vector<float> C(96 * N, 0.f), want(96 * N, 0.f);
  std::vector<GemmGroup> g;
  for (int e = 0; e < 4; ++e) {
    g.push_back({A.data() + first[e] * K, B.data() + e * N * K, C.data() + first[e] * N, rows[e], N, K, K, K, N});
    gemm_rows_invariant(Prec::F32, Prec::F32, rows[e], N, K, 1.f, A.data() + first[e] * K, K, B.data() + e * N * K, K,
                        0.f, want.data() + first[e] * N, N);
  }
  grouped_gemm_rows_invariant(Prec::F32, 1.f, 0.f, g.data(), 4);
  EXPECT_EQ(C, want);
}

TEST(GroupedGemm, EmptyGroupsAreSkipped) {
  const float A[] = {1, 2}, B[] = {3, 4};
  float C0[] = {7}, C1[] = {0};
  GemmGroup g[] = {{A, B, C0, 0, 1, 2, 2, 1, 1}, {A, B, C1, 1, 1, 2, 2, 1, 1}};
  grouped_gemm(Prec::F32, false, false, 1.f, 0.f, g, 2);
  EXPECT_EQ(C0[0], 7.f);
  EXPECT_EQ(C1[0], 11.f);
}

// With W = 0 all logits are 0: loss per row = log V, p = softmax - onehot = 1/V - [v == y].
TEST(LmHeadCe, ZeroWeightsGiveLogV) {
  const int64_t N = 3, d = 2, V = 5;
  std::vector<float> h = {1, 2, 3, 4, 5, 6}, W(V * d, 0.f), dh(N * d), dW(V * d, 0.f);
  std::vector<int32_t> y = {4, -100, 0};
  CeArgs a;
  a.N = N, a.d = d, a.V = V, a.h = h.data(), a.W = W.data(), a.labels = y.data();
  a.dh = dh.data(), a.dW = dW.data(), a.chunk = 2;
  int64_t nv = 0;
  double loss = lm_head_ce(a, &nv);
  EXPECT_EQ(nv, 2);
  EXPECT_NEAR(loss, 2 * std::log(5.0), 1e-6);
  for (float v : dh) EXPECT_EQ(v, 0.f);  // W = 0
  // dW[v, j] = sum over valid rows (1/V - [v == y]) h[n, j]; rows 0 and 2.
  for (int64_t v = 0; v < V; ++v)
    for (int64_t j = 0; j < d; ++j) {
      double want = (0.2 - (v == 4)) * h[0 * d + j] + (0.2 - (v == 0)) * h[2 * d + j];
      EXPECT_NEAR(dW[v * d + j], want, 1e-6) << v << "," << j;
    }
}

TEST(LmHeadCe, LabelOutOfRangeThrows) {
  std::vector<float> h(2, 1.f), W(6, 1.f);
  std::vector<int32_t> y = {3};
  CeArgs a;
  a.N = 1, a.d = 2, a.V = 3, a.h = h.data(), a.W = W.data(), a.labels = y.data();
  EXPECT_THROW(lm_head_ce(a, nullptr), trex::Error);
}

TEST(Peak, MeasuresSomething) {
  Peak p = measure_peak(0.02);
  EXPECT_GT(p.threads, 0);
  EXPECT_GT(p.fp32_gflops, 0.1);
  EXPECT_GT(p.bf16_gflops, 0.1);
  EXPECT_GE(p.best_gflops(), p.fp32_gflops);
  if (!p.bf16_native) {
    EXPECT_EQ(p.bf16_gflops, p.fp32_gflops);
  }
  EXPECT_GE(p.best_gflops(), p.amx_bf16_gflops);
  EXPECT_GE(p.amx_bf16_gflops, 0.0);
}

// Where the CPU reports AMX-BF16 and the process gets its tiles, the peak measures them (oneDNN
// runs the bf16 GEMMs there); a 16 x 16 x 32 tile product a cycle and core is far above the
// AVX-512 FMA rate. Elsewhere the AMX figure is 0 and the peak is that of the vector units.
TEST(Peak, CountsAmxTilesWhereUsable) {
  const Peak p = measure_peak(0.02);
  if (!amx_bf16_usable()) {
    EXPECT_EQ(p.amx_bf16_gflops, 0.0);
    GTEST_SKIP() << "no usable AMX-BF16 tiles on this CPU";
  }
  EXPECT_GT(p.amx_bf16_gflops, 2 * p.fp32_gflops);
  EXPECT_EQ(p.best_gflops(), p.amx_bf16_gflops);
}

// TREX_ISA below amx (the ctest entry gemm_isa_capped runs the Gemm and Peak tests with
// TREX_ISA=avx512bf16) keeps oneDNN's GEMMs off the AMX tiles and leaves the tiles out of the
// peak, so MFU is measured against the units the GEMMs run on.
TEST(Peak, IsaCapBelowAmxLeavesTheTilesOut) {
  if (!amx_capped()) GTEST_SKIP() << "TREX_ISA names no level below amx (ctest gemm_isa_capped sets it)";
  EXPECT_FALSE(dnnl_uses_amx());
  EXPECT_FALSE(amx_bf16_usable());
  EXPECT_EQ(measure_peak(0.02).amx_bf16_gflops, 0.0);
}

// bf16_dot_fast agrees with the peaks measured on every thread: a dot product well over 1.3x the
// FMAs (Zen 4: 2x) is fast, one slower (Intel's Xeons: about 0.5x) is not; between, the noise of a
// shared machine decides nothing here. TREX_BF16_DOT sets it (ctest bf16_dot_forced).
TEST(Peak, Bf16DotFastFollowsTheMeasuredRates) {
  if (const char* e = std::getenv("TREX_BF16_DOT")) {
    EXPECT_EQ(bf16_dot_fast(), cpu_isa() >= Isa::Avx512Bf16 && std::string(e) == "fast");
    return;
  }
  if (cpu_isa() < Isa::Avx512Bf16) {
    EXPECT_FALSE(bf16_dot_fast());
    GTEST_SKIP() << "no AVX512_BF16 on this CPU";
  }
  const Peak p = measure_peak(0.05);
  const double ratio = p.bf16_gflops / p.fp32_gflops;
  if (ratio > 1.6) {
    EXPECT_TRUE(bf16_dot_fast()) << "dot / fma " << ratio;
  } else if (ratio < 1.0) {
    EXPECT_FALSE(bf16_dot_fast()) << "dot / fma " << ratio;
  } else {
    GTEST_SKIP() << "dot / fma " << ratio << ": too close to tell on this machine";
  }
}

}  // namespace
