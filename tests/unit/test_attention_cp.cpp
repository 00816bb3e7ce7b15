// kernels/attention_cp.h against the scalar reference of causal attention (kernels/ref/attention.h):
// a context-parallel rank's query rows (any subset of the positions, in any order) against the
// whole rows' keys give the reference's outputs and lse on those rows; with the output gradient
// of the other rows 0, the reference's dq on those rows and its dk, dv on every key.
#include <gtest/gtest.h>

#include <cmath>
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

void expect_close(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 2e-5f * (1.f + std::fabs(b[i]))) << what << " at " << i;
}

void check(const std::vector<int32_t>& qidx, bool packed) {
  const int B = 2, T = 12, H = 3, Dq = 7, Dv = 5, Tq = (int)qidx.size();
  const float scale = 0.4f;
  const auto q = randn((size_t)B * T * H * Dq, 1), k = randn((size_t)B * T * H * Dq, 2),
             v = randn((size_t)B * T * H * Dv, 3), dO_local = randn((size_t)B * Tq * H * Dv, 4);
  std::vector<int32_t> seg;
  if (packed)
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t) seg.push_back(t < 4 + b ? 0 : t < 9 ? 1 : 2);
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
  const kern::AttnCpShape cs{B, Tq, T, H, Dq, Dv, scale};
  std::vector<float> ol(ol_ref.size()), lsel(lse_ref.size());
  kern::attention_cp_fwd(cs, ql.data(), k.data(), v.data(), qidx.data(), sg, ol.data(), lsel.data());
  expect_close(ol, ol_ref, "o");
  expect_close(lsel, lse_ref, "lse");
  std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
  kern::ref::attention_bwd<float>(sh, q.data(), k.data(), v.data(), o.data(), lse.data(), dO.data(), dq.data(),
                                  dk.data(), dv.data(), sg);
  std::vector<float> dql(ql.size()), dkc(k.size()), dvc(v.size()), dq_ref;
  kern::attention_cp_bwd(cs, ql.data(), k.data(), v.data(), qidx.data(), sg, ol.data(), lsel.data(), dO_local.data(),
                         dql.data(), dkc.data(), dvc.data());
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < Tq; ++j) {
      const int64_t g = (int64_t)b * T + qidx[j];
      dq_ref.insert(dq_ref.end(), dq.begin() + g * H * Dq, dq.begin() + (g + 1) * H * Dq);
    }
  expect_close(dql, dq_ref, "dq");
  expect_close(dkc, dk, "dk");
  expect_close(dvc, dv, "dv");
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
