#include "train/trainer.h"

#include <algorithm>
#include <cmath>
#include "core/timer.h"
#include "train/dist.h"
#include "train/pipeline.h"

namespace trex::train {

namespace {

// The step on one rank (dp == nullptr: opt is the whole-slab AdamW) or on one rank of a
// data-parallel group (dp: opt is dp->opt(), the ZeRO-1 shard). Every collective below is called
// by every rank in the same order; every branch taken after one depends only on global values.
StepStats step(model::Model& m, AdamW& opt, DataParallel* dp, const std::vector<model::Batch>& micro, float lr,
               float gamma, Profiler* prof, bool inject_nan) {
  const double t0 = now_ms();
  const double comm0 = dp ? dp->exposed_wait_s() : 0, cp0 = dp ? dp->cp_wait_s() : 0;
  StepStats st;
  std::vector<int64_t> valid(micro.size(), 0);
  // [0] valid targets, [1] micro-batches: of the global batch (summed over ranks)
  int64_t count[2] = {0, (int64_t)micro.size()};
  for (size_t k = 0; k < micro.size(); ++k) {
    for (int64_t i = 0; i < micro[k].B * micro[k].T; ++i) valid[k] += micro[k].targets[i] != -100;
    count[0] += valid[k];
  }
  if (dp) dp->sum(count, 2);
  const int64_t total_valid = count[0], n_micro = count[1];
  {
    ProfScope ps(prof, "step.zero_grads");
    if (dp) dp->begin_step();
    else m.zero_grads();
  }
  m.reset_load();
  // The model scales its CE gradient by 1/nv; weight each micro-batch by nv/total_valid.
  // The aux loss is averaged over micro-batches.
  std::vector<float> w(micro.size());
  for (size_t k = 0; k < micro.size(); ++k)
    w[k] = total_valid ? (float)valid[k] / (float)total_valid : 1.f / (float)n_micro;
  std::vector<model::LossParts> lps;
  if (dp && dp->pipeline()) {  // pipeline parallel: the 1F1B schedule over the stages
    ProfScope ps(prof, "step.forward_backward");
    lps = pipeline_step(m, *dp->pipeline(), micro, w, [&](bool last) { dp->begin_micro(last); },
                        [&](bool last) { dp->end_micro(last); }, &dp->pipeline_wait_ms());
  } else {
    for (size_t k = 0; k < micro.size(); ++k) {
      const bool last = k + 1 == micro.size();
      ProfScope ps(prof, "step.forward_backward");
      // The bucket reduce-scatters start from the backward: the last one's (ZeRO-1), every one's
      // (ZeRO-2).
      if (dp) dp->begin_micro(last);
      lps.push_back(m.forward_backward(micro[k], w[k]));
      if (dp) dp->end_micro(last);
    }
  }
  for (size_t k = 0; k < micro.size(); ++k) {
    const model::Batch& b = micro[k];
    const int64_t nv = valid[k];
    const model::LossParts& lp = lps[k];
    st.ce += lp.ce * w[k];
    st.aux += lp.aux / (double)n_micro;
    st.mtp += lp.mtp * w[k];
    st.indexer += lp.indexer * w[k];
    st.indexer_recall += lp.indexer_recall * w[k];
    st.tokens += b.B * b.T;
    st.n_valid += nv;
  }
  if (dp) {  // loss parts and token counts of the global batch
    double parts[5] = {st.ce, st.aux, st.mtp, st.indexer, st.indexer_recall};
    int64_t toks[2] = {st.tokens, st.n_valid};
    dp->sum(parts, 5, Count::PerStage);  // ce and mtp from the last stage, aux and indexer from every stage
    dp->sum(toks, 2);
    st.ce = parts[0], st.aux = parts[1], st.mtp = parts[2], st.tokens = toks[0], st.n_valid = toks[1];
    st.indexer = parts[3], st.indexer_recall = parts[4];
  }
  st.loss = st.ce + st.aux + m.opt.mtp_loss_weight * st.mtp + m.opt.indexer_loss_weight * st.indexer;
  // Recall: the layers' sum -> their mean over the layers with an indexer (V3.2: every decoder
  // layer, MTP layers too; V4: the CSA layers).
  if (m.opt.indexer_metrics()) st.indexer_recall /= (double)std::max<int64_t>(m.cfg.indexer_layers(), 1);
  // The dense warm-up trains only the indexer: the router biases stay too.
  if (m.opt.dense_warmup()) gamma = 0.f;
  if (dp) {
    ProfScope ps(prof, "step.optimizer");
    st.grad_norm = dp->finish_grads(inject_nan);  // global; the same on every rank
    st.skipped = !std::isfinite(st.loss) || !std::isfinite(st.grad_norm);
    if (!st.skipped) {
      opt.apply(m, lr, st.grad_norm);
      dp->gather_params();
    }
  } else {
    if (inject_nan && m.layout.total > 0) {
      const float nan = std::nanf("");
      m.backend().to_device(m.dev_G() + m.layout.entries.front().offset, &nan, sizeof nan);
    }
    if (!std::isfinite(st.loss)) {  // no update (AdamW::step also refuses a non-finite norm)
      st.grad_norm = grad_norm(m);
      st.skipped = true;
    } else {
      ProfScope ps(prof, "step.optimizer");
      st.grad_norm = opt.step(m, lr);
      st.skipped = !std::isfinite(st.grad_norm);
    }
  }
  if (st.skipped) {
    m.reset_load();
    st.comm_ms = dp ? (dp->exposed_wait_s() - comm0) * 1e3 : 0;
  st.cp_comm_ms = dp ? (dp->cp_wait_s() - cp0) * 1e3 : 0;
    m.backend().synchronize();  // a device's queued work belongs to this step
    st.ms = now_ms() - t0;
    return st;
  }
  // Router-bias update from the loads of the global batch (every rank makes the same update).
  const model::ExpertLoad load = dp ? dp->sum_loads(m.expert_load()) : m.expert_load();
  for (int64_t l = 0; l < load.L; ++l) {
    if (!m.cfg.is_moe_layer(l)) continue;
    const int64_t* ld = load.layer(l);
    double sum = 0, mx = 0;
    for (int64_t e = 0; e < load.E; ++e) sum += (double)ld[e], mx = std::max(mx, (double)ld[e]);
    st.load_max_over_mean.push_back(sum > 0 ? mx / (sum / (double)load.E) : 0.0);
    st.expert_loads.push_back(load[l]);
  }
  m.update_router_bias(load, gamma);
  st.comm_ms = dp ? (dp->exposed_wait_s() - comm0) * 1e3 : 0;
  st.cp_comm_ms = dp ? (dp->cp_wait_s() - cp0) * 1e3 : 0;
  m.backend().synchronize();
  st.ms = now_ms() - t0;
  return st;
}

}  // namespace

StepStats trainer_step(model::Model& m, AdamW& opt, const std::vector<model::Batch>& micro, float lr, float gamma,
                       Profiler* prof, bool inject_nan) {
  return step(m, opt, nullptr, micro, lr, gamma, prof, inject_nan);
}

StepStats trainer_step(DataParallel& dp, const std::vector<model::Batch>& micro, float lr, float gamma, Profiler* prof,
                       bool inject_nan) {
  return step(dp.model(), dp.opt(), &dp, micro, lr, gamma, prof, inject_nan);
}

}  // namespace trex::train
