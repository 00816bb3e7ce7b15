// kernels/attention_cp.h against the scalar reference of causal attention (kernels/ref/attention.h):
// a context-parallel rank's query rows (any subset of the positions, in any order) against the
// whole rows' keys give the reference's outputs and lse on those rows; with the output gradient
// of the other rows 0, the reference's dq on those rows and its dk, dv on every key. On a CPU with
// the flash kernels this runs them (one call per run of consecutive indices, dk and dv added over
// the runs), else the GEMM path; f32 to 2e-5 of each value, bf16 (AttnCpShape::prec) to the bf16
// kernel's bounds of tests/ops/attention_ops.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/rng.h"
#include "kernels/attention_cp.h"
#include "kernels/ref/attention.h"

using namespace trex;

namespace {

std::vector<float> randn(size_t n, uint64_t seed) {
  Rng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = (float)r.normal();
  return v;
}

// f32: every value within 2e-5 (relative above 1); bf16: normalized squared error below nmse.
void expect_close(const std::vector<float>& a, const std::vector<float>& b, const char* what, double nmse = 0) {
  ASSERT_EQ(a.size(), b.size());
  if (nmse > 0) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) num += (double)(a[i] - b[i]) * (a[i] - b[i]), den += (double)b[i] * b[i];
    EXPECT_LE(num, nmse * den) << what;
    return;
  }
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 2e-5f * (1.f + std::fabs(b[i]))) << what << " at " << i;
}

struct Dims {
  int T = 12, H = 3, Dq = 7, Dv = 5;
  kern::Prec prec = kern::Prec::F32;
};

void check(const std::vector<int32_t>& qidx, bool packed, Dims dm = {}) {
  const int B = 2, T = dm.T, H = dm.H, Dq = dm.Dq, Dv = dm.Dv, Tq = (int)qidx.size();
  const float scale = 0.4f;
  const bool bf = dm.prec == kern::Prec::BF16;
  const auto q = randn((size_t)B * T * H * Dq, 1), k = randn((size_t)B * T * H * Dq, 2),
             v = randn((size_t)B * T * H * Dv, 3), dO_local = randn((size_t)B * Tq * H * Dv, 4);
  std::vector<int32_t> seg;
  if (packed)
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t) seg.push_back(t < T / 3 + b ? 0 : t < 3 * T / 4 ? 1 : 2);
  const int32_t* sg = packed ? seg.data() : nullptr;
  kern::AttnShape sh{B, T, H, Dq, Dv, scale};
  std::vector<float> o((size_t)B * T * H * Dv), lse((size_t)B * H * T);
  kern::ref::attention_fwd<float>(sh, q.data(), k.data(), v.data(), o.data(), lse.data(), sg);
  // The local rows of q, and of the reference's o and lse.
  std::vector<float> ql, ol_ref, lse_ref((size_t)B * H * Tq), dO((size_t)B * T * H * Dv, 0.f);
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < Tq; ++j) {
      const int64_t g = (int64_t)b * T + qidx[j];
      ql.insert(ql.end(), q.begin() + g * H * Dq, q.begin() + (g + 1) * H * Dq);
      ol_ref.insert(ol_ref.end(), o.begin() + g * H * Dv, o.begin() + (g + 1) * H * Dv);
      for (int h = 0; h < H; ++h) lse_ref[((size_t)b * H + h) * Tq + j] = lse[((size_t)b * H + h) * T + qidx[j]];
      std::copy(dO_local.begin() + ((int64_t)b * Tq + j) * H * Dv, dO_local.begin() + ((int64_t)b * Tq + j + 1) * H * Dv,
                dO.begin() + g * H * Dv);
    }
  const kern::AttnCpShape cs{B, Tq, T, H, Dq, Dv, scale, dm.prec};
  std::vector<float> ol(ol_ref.size()), lsel(lse_ref.size());
  kern::attention_cp_fwd(cs, ql.data(), k.data(), v.data(), qidx.data(), sg, ol.data(), lsel.data());
  expect_close(ol, ol_ref, "o", bf ? 1e-4 : 0);
  expect_close(lsel, lse_ref, "lse", bf ? 1e-5 : 0);
  std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
  kern::ref::attention_bwd<float>(sh, q.data(), k.data(), v.data(), o.data(), lse.data(), dO.data(), dq.data(),
                                  dk.data(), dv.data(), sg);
  std::vector<float> dql(ql.size()), dkc(k.size(), 7.f), dvc(v.size(), 7.f), dq_ref;
  kern::attention_cp_bwd(cs, ql.data(), k.data(), v.data(), qidx.data(), sg, ol.data(), lsel.data(), dO_local.data(),
                         dql.data(), dkc.data(), dvc.data());
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < Tq; ++j) {
      const int64_t g = (int64_t)b * T + qidx[j];
      dq_ref.insert(dq_ref.end(), dq.begin() + g * H * Dq, dq.begin() + (g + 1) * H * Dq);
    }
  expect_close(dql, dq_ref, "dq", bf ? 3e-4 : 0);
  expect_close(dkc, dk, "dk", bf ? 3e-4 : 0);
  expect_close(dvc, dv, "dv", bf ? 3e-4 : 0);
}

}  // namespace

TEST(AttentionCp, MatchesReferenceOnTheLocalRows) {
  for (bool packed : {false, true}) {
    check({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, packed);  // every row: the square case
    check({0, 1, 2, 9, 10, 11}, packed);                     // cp 2, rank 0: chunks 0 and 3
    check({3, 4, 5, 6, 7, 8}, packed);                       // cp 2, rank 1: chunks 1 and 2
    check({4, 5, 6, 7}, packed);                             // cp 3, rank 2: chunks 2 and 3
    check({11, 0, 5}, packed);                               // any order
  }
}

std::vector<int32_t> range(int a, int b) {
  std::vector<int32_t> r;
  for (int i = a; i < b; ++i) r.push_back(i);
  return r;
}
std::vector<int32_t> cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Rows of several 64-query tiles: zigzag chunks of 53 (cp 2, T 212) and 35 (cp 3, T 210) whose
// first query is off the tile grid, a chunk pair in reverse order, a single row, MLA-like Dqk 40 >
// Dv 24 and Dqk < Dv, documents on and off, f32 and bf16.
TEST(AttentionCp, MatchesReferenceAtOddChunks) {
  for (kern::Prec prec : {kern::Prec::F32, kern::Prec::BF16})
    for (bool packed : {false, true}) {
      SCOPED_TRACE(std::string(prec == kern::Prec::BF16 ? "bf16" : "f32") + (packed ? " packed" : ""));
      const Dims d212{212, 3, 40, 24, prec}, d210{210, 2, 17, 33, prec};
      check(cat(range(0, 53), range(159, 212)), packed, d212);   // cp 2, rank 0
      check(range(53, 159), packed, d212);                       // cp 2, rank 1: one run
      check(cat(range(159, 212), range(0, 53)), packed, d212);   // the chunks in reverse order
      check(cat(range(0, 35), range(175, 210)), packed, d210);   // cp 3, rank 0
      check(cat(range(35, 70), range(140, 175)), packed, d210);  // cp 3, rank 1
      check({130}, packed, d210);                                // one row
    }
}
