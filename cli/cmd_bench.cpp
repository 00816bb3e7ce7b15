// trex bench peak: measured fp32 FMA and bf16 dot-product peak of this machine (all threads).
// trex bench step --config FILE [--steps N]: trains N steps of the config's model (random init,
// random tokens, routing as the model chooses) and prints one JSON line.
#include <algorithm>
#include <cstdio>
#include "cli/commands.h"
#include "core/cpu.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "kernels/peak.h"
#include "model/checkpoint.h"
#include "plan/measure.h"
#include "train/run_config.h"
#include "train/preflight.h"
#include "train/trainer.h"

namespace trex::cli {

namespace {

double peak_rss_mb() { return train::peak_rss_bytes() / 1048576.0; }

}  // namespace

void add_bench(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "measure the machine and the engine");
  bench->require_subcommand(1);

  auto* peak = bench->add_subcommand("peak", "fp32 FMA and bf16 dot-product peak, all threads");
  auto pthreads = std::make_shared<int>(0);
  peak->add_option("--threads", *pthreads, "threads (default TREX_THREADS or all cores)");
  peak->callback([pthreads] {
    init_threads(*pthreads);
    kern::Peak p = kern::measure_peak(0.5);
    std::printf("{\"fp32_gflops\": %.1f, \"bf16_gflops\": %.1f, \"best_gflops\": %.1f, \"bf16_native\": %s, "
                "\"threads\": %d, \"isa\": \"%s\"}\n",
                p.fp32_gflops, p.bf16_gflops, p.best_gflops(), p.bf16_native ? "true" : "false", p.threads,
                isa_name(cpu_isa()));
  });

  auto* cal = bench->add_subcommand("calibrate", "measure this machine for the planner (trex plan --cluster cpu-this)");
  auto copts = std::make_shared<std::pair<std::string, int>>("", 0);
  cal->add_option("--out", copts->first, "calibration JSON (default: $TREX_CALIBRATION or ~/.cache/trex/calibration.json)");
  cal->add_option("--threads", copts->second, "threads");
  cal->callback([copts] {
    init_threads(copts->second);
    plan::Calibration c = plan::measure_calibration(0.5);
    const std::string path = copts->first.empty() ? plan::default_calibration_path() : copts->first;
    plan::save_calibration(c, path);
    std::printf("%s\n", plan::calibration_to_json(c).dump().c_str());
    std::fprintf(stderr, "[bench calibrate] wrote %s\n", path.c_str());
  });

  auto* step = bench->add_subcommand("step", "train N steps of a config's model and report speed and MFU");
  struct Opts {
    std::string config;
    int steps = 0, warmup = 1;
    double peak_gflops = 0;
    bool profile = false;
  };
  auto o = std::make_shared<Opts>();
  step->add_option("--config", o->config, "trex TOML run config ([model] + [train])")->required();
  step->add_option("--steps", o->steps, "measured steps (default train.steps)");
  step->add_option("--warmup", o->warmup, "steps run before measuring (default 1)");
  step->add_option("--peak-gflops", o->peak_gflops, "peak to compute MFU against (default: measured now)");
  step->add_flag("--profile", o->profile, "print time per region of the step (stderr)");
  step->callback([o] {
    train::RunConfig rc = train::load_run_config(o->config);
    int threads = init_threads((int)rc.train.threads);
    const int steps = o->steps > 0 ? o->steps : (int)rc.train.steps;
    model::Model m(rc.model, rc.train.precision, {rc.train.aux_loss_alpha, rc.train.mtp_loss_weight});
    if (!rc.model_path.empty()) model::load_hf_weights(m, rc.model_path);
    else m.init_random(rc.train.seed);
    const float lr = (float)rc.optim.schedule.lr;
    train::AdamW opt(m, {lr, rc.optim.beta1, rc.optim.beta2, rc.optim.eps, rc.optim.weight_decay, rc.optim.clip_grad_norm});
    Profiler prof;
    const int64_t B = rc.train.batch_size, T = rc.data.seq_len, N = B * T;
    std::vector<int32_t> ids(N), labels(N);
    Rng rng(rc.train.seed + 1);
    std::vector<double> times;
    double last_loss = 0;
    for (int s = 0; s < o->warmup + steps; ++s) {
      if (o->profile && s == o->warmup) m.prof = &prof;
      for (auto& v : labels) v = (int32_t)(rng.next_u64() % rc.model.vocab_size);
      ids = labels;
      std::vector<int32_t> targets = model::shift_labels(labels, B, T);
      model::Batch b{B, T, ids.data(), targets.data(), nullptr, nullptr};
      train::StepStats st = train::trainer_step(m, opt, {b}, lr, rc.train.bias_update_gamma, m.prof);
      last_loss = st.loss;
      if (s >= o->warmup) times.push_back(st.ms);
      std::fprintf(stderr, "[bench step] step %d loss %.4f %.1f ms\n", s, st.loss, st.ms);
    }
    std::sort(times.begin(), times.end());
    const double med = times[times.size() / 2], mn = times.front();
    if (o->profile) {
      double sum = 0;
      for (double t : times) sum += t;
      prof.print(stderr, (int)times.size(), sum / times.size());
    }
    const double fpt = m.cfg.train_flops_per_token(T);  // m.cfg: with the MTP blocks the run trains
    // MFU denominator: the fastest arithmetic the machine offers for this precision's GEMMs.
    // bf16 GEMMs may run on the fp32 FMA units (kernels/gemm.h) where vdpbf16ps is slower, so
    // the peak is max(fp32, bf16) for bf16 runs and the fp32 peak for fp32 runs.
    double peak = o->peak_gflops;
    bool measured = false;
    double bf16_dot = 0;
    if (peak <= 0) {
      kern::Peak p = kern::measure_peak(0.3);
      peak = rc.train.precision == kern::Prec::BF16 ? p.best_gflops() : p.fp32_gflops;
      bf16_dot = p.bf16_gflops;
      measured = true;
    }
    const double tps = N / (med / 1000.0);
    const train::MemoryEstimate est = train::estimate_train_memory(rc, 1);  // the start-up check's figure
    const double mfu = fpt * tps / (peak * 1e9);
    std::printf(
        "{\"impl\": \"trex\", \"config\": \"%s\", \"precision\": \"%s\", \"threads\": %d, \"batch\": %lld, \"seq\": %lld, "
        "\"steps\": %d, \"step_ms\": %.1f, \"step_ms_median\": %.1f, \"step_ms_min\": %.1f, \"tokens_per_s\": %.1f, "
        "\"model_flops_per_token\": %.4g, \"active_params\": %lld, \"peak_gflops\": %.1f, \"peak_measured\": %s, "
        "\"mfu\": %.4f, \"mfu_vs_bf16_dot_peak\": %.4f, \"peak_rss_mb\": %.0f, \"last_loss\": %.4f, "
        "\"activation_mb\": %.0f, \"memory_estimate_mb\": %.0f, \"activation_estimate_mb\": %.0f}\n",
        o->config.c_str(), rc.train.precision == kern::Prec::BF16 ? "bf16" : "fp32", threads, (long long)B, (long long)T,
        steps, med, med, mn, tps, fpt, (long long)m.cfg.num_active_params(), peak, measured ? "true" : "false", mfu, bf16_dot > 0 ? fpt * tps / (bf16_dot * 1e9) : 0.0,
        peak_rss_mb(), last_loss, m.peak_activation_bytes() / 1048576.0, est.total() / 1048576.0,
        est.activations / 1048576.0);
  });
}

}  // namespace trex::cli
