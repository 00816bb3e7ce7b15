// Online log-sum-exp: the running (max, sum of exp(x - max)) of a stream of values, merged in
// any grouping (flash attention's rows, cross-entropy's vocabulary chunks, a GPU warp's lanes).
#pragma once
#include "kernels/hd/hd.h"

namespace trex::kern::hd {

template <class T>
struct Lse {
  T m;  // max so far (-inf: nothing yet)
  T s;  // sum of exp(x - m)
};

template <class T>
TREX_HD Lse<T> lse_empty() {
  return {-INFINITY, T(0)};
}

// Adds one value.
template <class T>
TREX_HD Lse<T> lse_push(Lse<T> a, T x) {
  if (x == -INFINITY) return a;  // exp(-inf) adds nothing (and -inf - -inf would be NaN)
  if (x > a.m) return {x, a.s * std::exp(a.m - x) + T(1)};
  return {a.m, a.s + std::exp(x - a.m)};
}

// Merges two partial states.
template <class T>
TREX_HD Lse<T> lse_merge(Lse<T> a, Lse<T> b) {
  if (b.m == -INFINITY && b.s == T(0)) return a;  // b is empty (a NaN pushed first leaves m = -inf, s NaN)
  if (a.m == -INFINITY && a.s == T(0)) return b;
  if (a.m >= b.m) return {a.m, a.s + b.s * std::exp(b.m - a.m)};
  return {b.m, b.s + a.s * std::exp(a.m - b.m)};
}

// log sum exp (-inf when empty; NaN when a NaN was pushed, also as the first value).
template <class T>
TREX_HD T lse_value(Lse<T> a) {
  if (a.s != a.s) return a.s;
  return a.m == -INFINITY ? a.m : a.m + std::log(a.s);
}

}  // namespace trex::kern::hd
