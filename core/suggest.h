// "Did you mean" for misspelled names: the known name nearest to a given one by edit distance.
#pragma once
#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

namespace trex {

// Levenshtein distance (insert, delete, substitute: 1 each) between a and b.
inline size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// The name in `known` nearest to `name`, or "" when none is within max(2, |name| / 3) edits
// (a different word rather than a typo).
inline std::string nearest_name(const std::string& name, const std::vector<std::string>& known) {
  std::string best;
  size_t best_d = std::max<size_t>(2, name.size() / 3) + 1;
  for (const std::string& k : known) {
    const size_t d = edit_distance(name, k);
    if (d < best_d) best_d = d, best = k;
  }
  return best;
}

}  // namespace trex
