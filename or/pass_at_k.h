// Several samples per problem: the unbiased pass@k estimator and self-consistency (majority vote
// over the samples' answers).
#pragma once
#include <cstdint>
#include <vector>
#include "or/solver.h"

namespace trex::orx {

// Probability that at least one of k samples drawn without replacement from n samples, c of
// which pass, passes: 1 - C(n - c, k) / C(n, k) (Chen et al. 2021, "Evaluating Large Language
// Models Trained on Code"), computed as 1 - prod_{i = n - c + 1}^{n} (1 - k / i). Needs
// 0 <= c <= n and 1 <= k <= n (else a trex::Error).
double pass_at_k(int64_t n, int64_t c, int64_t k);

// One sample's answer: the solver's verdict on its model (Optimal with its objective, Infeasible or
// Unbounded); anything else (no model, a parse error, a time limit) does not vote.
struct SampleAnswer {
  SolveResult::Status status = SolveResult::Error;
  double objective = 0;
};
// Self-consistency: the samples grouped by answer (equal status; Optimal objectives equal under the
// strict rule's 1e-6 relative tolerance, each sample joining the first group whose first member it
// matches), the largest group winning and the earliest of equal groups. Returns the index of the
// winning group's first sample, or -1 when no sample has a voting answer.
int64_t majority_sample(const std::vector<SampleAnswer>& a);

}  // namespace trex::orx
