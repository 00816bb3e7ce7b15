#include "train/trainer.h"

#include <algorithm>
#include <cmath>
#include "core/timer.h"

namespace trex::train {

void update_router_bias(model::Model& m, float gamma) {
  const auto& load = m.expert_load();
  if (gamma != 0.f) {
    for (int64_t l = 0; l < (int64_t)m.layout.layers.size(); ++l) {
      if (!m.cfg.is_moe_layer(l) || m.layout.layers[l].bias < 0) continue;  // hash layers: no bias
      const auto& ld = load[l];
      double mean = 0;
      for (int64_t v : ld) mean += (double)v;
      mean /= (double)ld.size();
      float* bias = m.buffers.data() + m.layout.layers[l].bias;
      for (size_t e = 0; e < ld.size(); ++e) {
        double diff = mean - (double)ld[e];
        bias[e] += gamma * (float)((diff > 0) - (diff < 0));
      }
    }
  }
  m.reset_load();
}

StepStats trainer_step(model::Model& m, AdamW& opt, const std::vector<model::Batch>& micro, float lr, float gamma,
                       Profiler* prof, bool inject_nan) {
  const double t0 = now_ms();
  StepStats st;
  std::vector<int64_t> valid(micro.size(), 0);
  int64_t total_valid = 0;
  for (size_t k = 0; k < micro.size(); ++k) {
    for (int64_t i = 0; i < micro[k].B * micro[k].T; ++i) valid[k] += micro[k].targets[i] != -100;
    total_valid += valid[k];
  }
  {
    ProfScope ps(prof, "step.zero_grads");
    m.zero_grads();
  }
  m.reset_load();
  for (size_t k = 0; k < micro.size(); ++k) {
    const model::Batch& b = micro[k];
    const int64_t nv = valid[k];
    // The model scales its CE gradient by 1/nv; weight each micro-batch by nv/total_valid.
    // The aux loss is averaged over micro-batches.
    float w = total_valid ? (float)nv / (float)total_valid : 1.f / micro.size();
    model::LossParts lp;
    {
      ProfScope ps(prof, "step.forward_backward");
      lp = m.forward_backward(b, w);
    }
    st.ce += lp.ce * w;
    st.aux += lp.aux / micro.size();
    st.mtp += lp.mtp * w;
    st.tokens += b.B * b.T;
    st.n_valid += nv;
  }
  st.loss = st.ce + st.aux + m.opt.mtp_loss_weight * st.mtp;
  if (inject_nan && m.layout.total > 0) m.G()[m.layout.entries.front().offset] = std::nanf("");
  if (!std::isfinite(st.loss)) {  // no update (AdamW::step also refuses a non-finite norm)
    st.grad_norm = grad_norm(m);
    st.skipped = true;
  } else {
    ProfScope ps(prof, "step.optimizer");
    st.grad_norm = opt.step(m, lr);
    st.skipped = !std::isfinite(st.grad_norm);
  }
  if (st.skipped) {
    m.reset_load();
    st.ms = now_ms() - t0;
    return st;
  }
  for (int64_t l = 0; l < (int64_t)m.layout.layers.size(); ++l) {
    if (!m.cfg.is_moe_layer(l)) continue;
    const auto& ld = m.expert_load()[l];
    double sum = 0, mx = 0;
    for (int64_t v : ld) sum += (double)v, mx = std::max(mx, (double)v);
    st.load_max_over_mean.push_back(sum > 0 ? mx / (sum / ld.size()) : 0.0);
  }
  update_router_bias(m, gamma);
  st.ms = now_ms() - t0;
  return st;
}

}  // namespace trex::train
