// Finite-difference checks of a model's gradients, shared by the model tests: a batch with random
// ids and targets (every fifth target ignored; packed: two documents per row), the loss along a
// direction, and the per-tensor check (a central difference along a random unit direction inside
// each tensor, against the gradient's projection on it).
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>
#include "core/rng.h"
#include "model/model.h"

namespace trex::testing {

struct FdData {
  int64_t B, T;
  std::vector<int32_t> ids, tg, seg;
  model::Batch batch(bool packed) const { return {B, T, ids.data(), tg.data(), nullptr, packed ? seg.data() : nullptr}; }
};

inline FdData fd_data(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  Rng r(seed);
  FdData d{B, T, {}, {}, {}};
  for (int64_t i = 0; i < B * T; ++i) {
    d.ids.push_back((int32_t)(r.next_u64() % V));
    d.tg.push_back(i % 5 == 3 ? -100 : (int32_t)(r.next_u64() % V));
    d.seg.push_back((int32_t)((i % T) < T / 2 + 1 ? 0 : 1));  // two documents per row
  }
  return d;
}

// Loss along p0 + t v (parameters only).
inline double loss_at(model::Model& m, const model::Batch& b, const std::vector<float>& p0, const std::vector<float>& v,
                      double t) {
  float* P = m.P();
  for (size_t i = 0; i < p0.size(); ++i) P[i] = p0[i] + (float)(t * v[i]);
  return m.forward(b).loss;
}

// Every tensor of m, whose G() holds the gradient of the loss on b at its P(): the central
// difference with step 3e-3 within 3e-2 |g.v| + 2e-3. Where a discrete choice (an expert or the
// indexer's top-k, a clamp) flips inside the step, the loss is not smooth: then a one-sided
// difference with an eighth of the step on either side must agree within 4x that (a "kink").
// Returns the entries checked by the central difference; *kinks counts the others.
inline std::vector<const model::ParamEntry*> fd_check_tensors(model::Model& m, const model::Batch& b, int* kinks) {
  const int64_t n = m.layout.total;
  std::vector<float> p0(m.P(), m.P() + n), g(m.G(), m.G() + n);
  Rng r(5);
  const double t = 3e-3;
  std::vector<const model::ParamEntry*> checked;
  *kinks = 0;
  for (const model::ParamEntry& e : m.layout.entries) {
    std::vector<float> v(n, 0.f);
    double gv = 0, vv = 0;
    for (int64_t i = e.offset; i < e.offset + e.shape.numel(); ++i) vv += (v[i] = (float)r.normal()) * v[i];
    for (int64_t i = e.offset; i < e.offset + e.shape.numel(); ++i) {
      v[i] = (float)(v[i] / std::sqrt(vv));
      gv += (double)g[i] * v[i];
    }
    const double fd = (loss_at(m, b, p0, v, t) - loss_at(m, b, p0, v, -t)) / (2 * t);
    const double tol = 3e-2 * std::abs(gv) + 2e-3;
    if (std::abs(fd - gv) > tol) {
      const double l0 = loss_at(m, b, p0, v, 0);
      const double fr = (loss_at(m, b, p0, v, t / 8) - l0) / (t / 8), fl = (l0 - loss_at(m, b, p0, v, -t / 8)) / (t / 8);
      if (std::abs(fr - gv) <= 4 * tol || std::abs(fl - gv) <= 4 * tol) {
        ++*kinks;
        continue;
      }
    }
    EXPECT_NEAR(fd, gv, tol) << e.name;
    checked.push_back(&e);
  }
  return checked;
}

// The indexer losses' check (DeepSeek-V3.2 and V4): each tensor against the part of the loss its
// gradient belongs to: the indexer's tensors (is_indexer) against w x the indexer loss (the LM loss
// moves with them only where a selection flips), every other tensor against ce + aux (the indexer
// loss reads the attention detached). Central difference with step 1e-3 within 3e-2 |g.v| + 1e-3,
// kinks as in fd_check_tensors. dense (the warm-up): only the indexer's tensors train, every other
// tensor is frozen with an exactly zero gradient. Each indexer tensor checked must have a gradient.
struct IndexerFd {
  int checked = 0, kinks = 0, indexer = 0;  // tensors by the central difference, at a kink, of the indexer
};
inline IndexerFd fd_check_indexer_split(model::Model& m, const model::Batch& b, double w, bool dense,
                                        const std::function<bool(const std::string&)>& is_indexer) {
  const int64_t n = m.layout.total;
  std::vector<float> p0(m.P(), m.P() + n), g(m.G(), m.G() + n);
  auto part = [&](const model::LossParts& x, bool ix) -> double { return ix ? w * x.indexer : x.ce + x.aux; };
  auto loss_at = [&](const std::vector<float>& v, double t, bool ix) {
    for (int64_t i = 0; i < n; ++i) m.P()[i] = p0[i] + (float)(t * v[i]);
    return part(m.forward(b), ix);
  };
  Rng r(5);
  const double t = 1e-3;
  IndexerFd out;
  for (const model::ParamEntry& e : m.layout.entries) {
    const bool ix = is_indexer(e.name);
    EXPECT_EQ(e.frozen, dense ? !ix : false) << e.name;
    if (dense && !ix) {
      double s = 0;
      for (int64_t i = e.offset; i < e.offset + e.shape.numel(); ++i) s += std::abs(g[i]);
      EXPECT_EQ(s, 0.0) << e.name;
      continue;
    }
    std::vector<float> v(n, 0.f);
    double gv = 0, vv = 0;
    for (int64_t i = e.offset; i < e.offset + e.shape.numel(); ++i) vv += (v[i] = (float)r.normal()) * v[i];
    for (int64_t i = e.offset; i < e.offset + e.shape.numel(); ++i) {
      v[i] = (float)(v[i] / std::sqrt(vv));
      gv += (double)g[i] * v[i];
    }
    const double fd = (loss_at(v, t, ix) - loss_at(v, -t, ix)) / (2 * t);
    const double tol = 3e-2 * std::abs(gv) + 1e-3;
    if (std::abs(fd - gv) > tol) {
      // A top-k selection (or a relu) flipped inside [-t, t]: then one side's smaller step agrees.
      const double l0 = loss_at(v, 0, ix);
      const double fr = (loss_at(v, t / 8, ix) - l0) / (t / 8), fl = (l0 - loss_at(v, -t / 8, ix)) / (t / 8);
      if (std::abs(fr - gv) <= 4 * tol || std::abs(fl - gv) <= 4 * tol) {
        ++out.kinks;
        continue;
      }
    }
    EXPECT_NEAR(fd, gv, tol) << e.name;
    ++out.checked, out.indexer += ix;
    if (ix) {
      EXPECT_GT(std::abs(gv), 1e-6) << e.name;  // the indexer does learn
    }
  }
  return out;
}

}  // namespace trex::testing
