#include "or/pass_at_k.h"

#include "core/error.h"
#include "or/judge.h"

namespace trex::orx {

double pass_at_k(int64_t n, int64_t c, int64_t k) {
  TREX_CHECK(n >= 1 && c >= 0 && c <= n && k >= 1 && k <= n, "pass_at_k: n = ", n, ", c = ", c, ", k = ", k,
             " (need 0 <= c <= n, 1 <= k <= n)");
  if (n - c < k) return 1.0;  // every k-subset holds a passing sample
  double miss = 1.0;          // C(n - c, k) / C(n, k)
  for (int64_t i = n - c + 1; i <= n; ++i) miss *= 1.0 - (double)k / (double)i;
  return 1.0 - miss;
}

namespace {
bool votes(const SampleAnswer& a) {
  return a.status == SolveResult::Optimal || a.status == SolveResult::Infeasible ||
         a.status == SolveResult::Unbounded;
}
bool same_answer(const SampleAnswer& a, const SampleAnswer& b) {
  if (a.status != b.status) return false;
  return a.status != SolveResult::Optimal || strict_match(a.objective, b.objective);
}
}  // namespace

int64_t majority_sample(const std::vector<SampleAnswer>& a) {
  std::vector<int64_t> first, count;  // per group: its first sample, its size
  for (int64_t i = 0; i < (int64_t)a.size(); ++i) {
    if (!votes(a[i])) continue;
    size_t g = 0;
    while (g < first.size() && !same_answer(a[first[g]], a[i])) ++g;
    if (g == first.size()) first.push_back(i), count.push_back(0);
    ++count[g];
  }
  int64_t best = -1;
  for (size_t g = 0; g < first.size(); ++g)
    if (best < 0 || count[g] > count[best]) best = (int64_t)g;
  return best < 0 ? -1 : first[best];
}

}  // namespace trex::orx
