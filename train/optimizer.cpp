#include "train/optimizer.h"

#include <cmath>
#include "kernels/adamw.h"

namespace trex::train {

AdamW::AdamW(const model::Model& m, AdamWConfig c) : cfg(c) {
  m1.reserve("adam_m", m.layout.total * sizeof(float));
  m2.reserve("adam_v", m.layout.total * sizeof(float));
  m1.zero();
  m2.zero();
}

double grad_norm(const model::Model& m) {
  double ss = 0;
  for (const model::ParamEntry& e : m.layout.entries) ss += kern::sum_squares(m.G() + e.offset, e.shape.numel());
  return std::sqrt(ss);
}

double AdamW::step(model::Model& m, float lr) {
  const double norm = grad_norm(m);
  if (!std::isfinite(norm)) return norm;
  float scale = 1.f;
  if (cfg.clip_grad_norm > 0) {
    double coef = cfg.clip_grad_norm / (norm + 1e-6);
    if (coef < 1.0) scale = (float)coef;
  }
  ++t_;
  float* M = reinterpret_cast<float*>(m1.base());
  float* Vv = reinterpret_cast<float*>(m2.base());
  bf16* Pb = m.params_bf16.empty() ? nullptr : m.params_bf16.data();
  for (const model::ParamEntry& e : m.layout.entries) {
    if (e.frozen) continue;
    kern::AdamWParams p{lr, cfg.beta1, cfg.beta2, cfg.eps, e.decay ? cfg.weight_decay : 0.f, t_, scale};
    kern::adamw_step(p, m.P() + e.offset, m.G() + e.offset, M + e.offset, Vv + e.offset, e.shape.numel(),
                     Pb ? Pb + e.offset : nullptr);
  }
  return norm;
}

}  // namespace trex::train
