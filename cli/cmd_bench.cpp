// trex bench peak: measured fp32 FMA and bf16 dot-product peak of this machine (all threads).
// trex bench calibrate: the planner's calibration file for `--cluster cpu-this`; under
// `mpirun -np R` every rank measures at once and rank 0 adds the MPI link figures.
// trex bench step --config FILE [--steps N]: trains N steps of the config's model (random init,
// random tokens, routing as the model chooses) and prints one JSON line, with the planner's
// prediction of the same run when a calibration exists. Under `mpirun -np R` the ranks train data
// parallel (ZeRO-1, train/dist.h), each on batch_size sequences of its own. MFU is against the
// best of the peak measurements taken between measured steps (at least 10 s of steps apart) and 3
// after the last (a shared machine's speed moves within minutes: the best over the run's own
// window), or the calibration's peak when that best is below 80% of it (a busy machine;
// cli/peak_choice.h), or --peak-gflops: "peak_source" says which, "peak_tries_gflops" lists
// every measurement of the run.
// With --profile: the step's breakdown (core/profile.h), with the threading overhead of trex's
// parallel regions (core/par_stats.h), the heap allocations (core/heap_count.h, counted by
// cli/heap_hooks.cpp) and the activation arena's growth over the measured steps, also in the JSON.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <vector>
#include "cli/bench_kernels.h"
#include "cli/commands.h"
#include "cli/peak_choice.h"
#include "core/cpu.h"
#include "core/heap_count.h"
#include "core/par_stats.h"
#include "core/parallel.h"
#include "core/profile.h"
#include "core/rng.h"
#include "core/timer.h"
#include "core/trace.h"
#include "kernels/gemm.h"
#include "kernels/peak.h"
#include "model/checkpoint.h"
#include "parallel/comm_mpi.h"
#include "plan/calibration.h"
#include "plan/measure.h"
#include "plan/planner.h"
#include "train/device.h"
#include "train/job_guard.h"
#include "train/layout.h"
#include "train/run_config.h"
#include "train/preflight.h"
#include "train/trainer.h"

namespace trex::cli {

namespace {

double peak_rss_mb() { return peak_rss_bytes() / 1048576.0; }

// MPI when a launcher started this process (the context outlives the communicator).
struct MaybeMpi {
  std::unique_ptr<parallel::MpiContext> ctx;
  std::unique_ptr<parallel::Communicator> world;
  MaybeMpi() {
    if (!parallel::MpiContext::launched()) return;
    ctx = std::make_unique<parallel::MpiContext>(nullptr, nullptr, parallel::ThreadLevel::Serialized);
    world = ctx->world();
  }
  ~MaybeMpi() { world.reset(); }
  int rank() const { return world ? world->rank() : 0; }
  int size() const { return world ? world->size() : 1; }
  double sum(double v) const { return reduce(v, parallel::ReduceOp::Sum); }
  double max(double v) const { return reduce(v, parallel::ReduceOp::Max); }
  double reduce(double v, parallel::ReduceOp op) const {
    if (world && world->size() > 1) world->iall_reduce(&v, &v, 1, DType::F64, op).wait();
    return v;
  }
};

// Seconds of `reps` runs of fn (after one warm-up run), sorted; every rank runs each one
// together, after a barrier.
template <class F>
std::vector<double> times_s(parallel::Communicator& w, int reps, F&& fn) {
  fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    w.barrier();
    auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t;
}
template <class F>
double best_s(parallel::Communicator& w, int reps, F&& fn) {
  return times_s(w, reps, fn).front();
}
template <class F>
double median_s(parallel::Communicator& w, int reps, F&& fn) {
  const std::vector<double> t = times_s(w, reps, fn);
  return t[t.size() / 2];
}

// The MPI link between the ranks of this node, in the planner's ring model (plan/timing.h):
// latency from an 8-byte all-reduce (2 hops), bandwidth from an f32 reduce-scatter of one
// default gradient bucket (parallel.bucket_size, 16 MB: the collective the data-parallel run
// issues), the median of 7 (a best-of reads the rare quiet moment of a shared machine), each on
// a bucket not in the cache, as a step's gradients are not (the ranks' buckets together span
// 512 MB, past the L3; one bucket reduce-scattered over and over ran 1.6x faster on the 2-core
// Xeon than cold ones): t = (R-1)/R bytes / bw + (R-1) lat. And how much of that reduce-scatter
// hides behind compute (efficiency.overlap): posted, then bf16 GEMMs run for about as long with
// test() between them, as the backward drives the gradient buckets (train/dist.h); on CPUs the
// copies and sums of the exchange run on the cores that compute, inside the MPI calls, so little
// of it hides.
void measure_link(parallel::Communicator& w, plan::Calibration& c) {
  const double R = (double)w.size();
  double one = 1;
  const double t_small = best_s(w, 200, [&] { w.iall_reduce(&one, &one, 1, DType::F64, parallel::ReduceOp::Max).wait(); });
  const double lat = t_small / (2 * (R - 1));
  const size_t count = (size_t)train::ParallelConfig{}.bucket_size / w.size();  // elements each rank keeps
  const size_t bucket = count * w.size();
  const size_t nb = std::max<size_t>(4, ((size_t{512} << 20) / w.size() / 4 + bucket - 1) / bucket);
  std::vector<float> buf(bucket * nb, 1.f);
  size_t next = 0;  // the bucket the next reduce-scatter sums: each in turn
  auto rs = [&] {
    float* b = buf.data() + (next++ % nb) * bucket;
    return w.ireduce_scatter(b, b + w.rank() * count, count, DType::F32, parallel::ReduceOp::Sum);
  };
  const double t_rs = median_s(w, 7, [&] { rs().wait(); });
  const double bytes = 4.0 * count * w.size();
  c.intra_node_latency_us = lat * 1e6;
  c.intra_node_gbs = (R - 1) / R * bytes / std::max(t_rs - (R - 1) * lat, 1e-9) / 1e9;
  c.efficiency["net_intra"] = 1.0;  // the bandwidth above is what the collective achieves

  const int64_t M = 512, N = 1024, K = 1024;  // one GEMM: about 1 GFLOP
  std::vector<bf16> a((size_t)(M * K), f32_to_bf16(0.5f)), b((size_t)(N * K), f32_to_bf16(0.25f));
  std::vector<float> y((size_t)(M * N));
  auto gemm = [&] { kern::gemm_bf16(false, true, M, N, K, 1.f, a.data(), K, b.data(), K, 0.f, y.data(), N); };
  const double t_gemm = median_s(w, 7, gemm);
  const int n = std::max(1, (int)std::lround(t_rs / std::max(t_gemm, 1e-9)));
  const double t_compute = median_s(w, 5, [&] { for (int i = 0; i < n; ++i) gemm(); });
  const double t_both = median_s(w, 5, [&] {
    parallel::Handle h = rs();
    for (int i = 0; i < n; ++i) {
      gemm();
      h.test();
    }
    h.wait();
  });
  const double hidden = (t_compute + t_rs - t_both) / t_rs;
  c.efficiency["overlap"] = std::clamp(hidden, 0.0, 1.0);
}

// The planner's view of `bench step`'s run: dp = ranks (ZeRO-1), batch_size sequences of seq_len
// per rank, MTP as the run trains it, on cpu-this with one device per rank.
struct Prediction {
  bool ok = false;
  double step_s = 0, memory_bytes = 0;
  std::string note;
};
Prediction predict(const train::RunConfig& rc, int ranks, const std::string& calibration) {
  Prediction p;
  if (rc.train.precision != kern::Prec::BF16) {
    p.note = "the planner models bf16 runs only";
    return p;
  }
  plan::Calibration cal = plan::find_calibration(calibration);
  if (!cal.measured) {
    p.note = "no calibration file: run `trex bench calibrate` (under mpirun -np R for R ranks)";
    return p;
  }
  if (cal.ranks_per_node != ranks)
    p.note = "calibration measured with " + std::to_string(cal.ranks_per_node) + " rank(s) per node, this run has " +
             std::to_string(ranks) + ": run `mpirun -np " + std::to_string(ranks) + " trex bench calibrate`";
  cal.ranks_per_node = ranks;
  const plan::ClusterSpec s = plan::cpu_spec_from_calibration(cal);
  const plan::ArchModel a = plan::arch_from_config(rc.model, "run");
  plan::Layout l;
  l.dp = ranks;
  l.mbs = rc.train.batch_size;
  l.gbs = rc.train.batch_size * ranks;
  l.seq = rc.data.seq_len;
  l.zero = 1;
  l.overlap_dp = rc.parallel.overlap;
  l.overlap_param_gather = false;  // train/dist.h waits for the all-gather after the update
  l.mtp = rc.model.is_v4() && rc.model.num_nextn_predict_layers > 0 && rc.train.mtp_loss_weight > 0;
  const plan::Plan pl = plan::evaluate(a, s, ranks, l);
  p.ok = true;
  if (rc.parallel.ep > 1)  // the planner's ep shards the expert weights; trex's keeps them all (model/model.h)
    p.note += std::string(p.note.empty() ? "" : "; ") + "prediction for the data-parallel layout (ep = 1)";
  p.step_s = pl.time.step;
  p.memory_bytes = pl.memory.peak().total();
  return p;
}

}  // namespace

void add_bench(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "measure the machine and the engine");
  bench->require_subcommand(1);
  add_bench_kernels(*bench);
  add_bench_decode(*bench);

  auto* peak = bench->add_subcommand("peak", "fp32 FMA and bf16 dot-product peak, all threads");
  auto pthreads = std::make_shared<int>(0);
  peak->add_option("--threads", *pthreads, "threads (default TREX_THREADS or all cores)");
  peak->callback([pthreads] {
    init_threads(*pthreads);
    kern::Peak p = kern::measure_peak(0.5);
    std::printf("{\"fp32_gflops\": %.1f, \"bf16_gflops\": %.1f, \"amx_bf16_gflops\": %.1f, \"best_gflops\": %.1f, "
                "\"bf16_native\": %s, \"bf16_dot_fast\": %s, \"threads\": %d, \"isa\": \"%s\"}\n",
                p.fp32_gflops, p.bf16_gflops, p.amx_bf16_gflops, p.best_gflops(), p.bf16_native ? "true" : "false",
                kern::bf16_dot_fast() ? "true" : "false", p.threads, isa_name(cpu_isa()));
  });

  auto* cal = bench->add_subcommand("calibrate", "measure this machine for the planner (trex plan --cluster cpu-this)");
  struct CalOpts {
    std::string out;
    int threads = 0;
    double seconds = 1.5;
  };
  auto copts = std::make_shared<CalOpts>();
  cal->add_option("--out", copts->out, "calibration JSON (default: $TREX_CALIBRATION or ~/.cache/trex/calibration.json)");
  cal->add_option("--threads", copts->threads, "threads");
  cal->add_option("--seconds", copts->seconds, "time per measured op (the median of its runs is kept; default 1.5)");
  cal->callback([copts] {
    MaybeMpi mpi;
    init_threads(copts->threads);
    if (mpi.world) mpi.world->barrier();
    plan::Calibration c = plan::measure_calibration(copts->seconds);  // every rank at once, as in a run
    if (mpi.size() > 1) {
      // The machine is the sum of its ranks (peaks, bandwidth); efficiencies are their mean.
      const double R = mpi.size();
      c.bf16_gflops = mpi.sum(c.bf16_gflops);
      c.fp32_gflops = mpi.sum(c.fp32_gflops);
      c.mem_bw_gbs = mpi.sum(c.mem_bw_gbs);
      for (auto& [k, v] : c.efficiency) v = mpi.sum(v) / R;
      measure_link(*mpi.world, c);
      c.ranks_per_node = parallel::MpiContext::local_size(mpi.size());
      c.machine += ", " + std::to_string(mpi.size()) + " MPI ranks";
    }
    if (mpi.rank() != 0) return;
    const std::string path = copts->out.empty() ? plan::default_calibration_path() : copts->out;
    plan::save_calibration(c, path);
    std::printf("%s\n", plan::calibration_to_json(c).dump().c_str());
    std::fprintf(stderr, "[bench calibrate] wrote %s\n", path.c_str());
  });

  auto* step = bench->add_subcommand("step", "train N steps of a config's model and report speed and MFU");
  struct Opts {
    std::string config, calibration, trace, device;
    std::vector<std::string> sets;
    int steps = 0, warmup = 1;
    double peak_gflops = 0;
    bool profile = false;
  };
  auto o = std::make_shared<Opts>();
  step->add_option("--config", o->config, "trex TOML run config ([model] + [train])")->required();
  step->add_option("--set", o->sets, "override a config value, KEY=VALUE (repeatable), e.g. parallel.ep=2");
  step->add_option("--device", o->device, "cpu | cuda | cuda:N (overrides train.device)");
  step->add_option("--steps", o->steps, "measured steps (default train.steps)");
  step->add_option("--warmup", o->warmup, "steps run before measuring (default 1)");
  step->add_option("--peak-gflops", o->peak_gflops,
                   "peak of the whole machine to compute MFU against (default: the best of measurements between "
                   "measured steps, at least 10 s of steps apart, and 3 after the last, or the calibration's "
                   "peak when that is below 80% of it)");
  step->add_option("--calibration", o->calibration,
                   "calibration for the planner's prediction and the peak check (default: "
                   "$TREX_CALIBRATION or ~/.cache/trex/calibration.json)");
  step->add_flag("--profile", o->profile, "print time per region of the step (stderr; rank 0)");
  step->add_option("--trace", o->trace, "write a Chrome trace (Perfetto) of the measured steps: compute and "
                                        "communication tracks per rank");
  step->callback([o] {
    MaybeMpi mpi;
    const int R = mpi.size(), rank = mpi.rank();
    std::vector<std::string> sets = o->sets;
    if (!o->device.empty()) sets.push_back("train.device=" + o->device);
    train::RunConfig rc = train::load_run_config(o->config, sets);
    const std::unique_ptr<kern::Backend> device = train::open_device(rc.train.device, "train.device");
    const parallel::ParallelDims dims = train::resolve_parallel(rc, R);  // dp = the ranks / tp; ep, tp as set
    // As trex train: refused, not killed by the OS (the ranks on this machine share its memory).
    const train::MemoryEstimate mem = train::check_memory(rc, R, parallel::MpiContext::local_size(1));
    int threads = init_threads((int)rc.train.threads);
    const int steps = o->steps > 0 ? o->steps : (int)rc.train.steps;
    const model::TrainOptions topt = train::train_options(rc);  // as trex train (and its memory estimate)
    model::Model m(rc.model, rc.train.precision, topt,
                   train::expert_shard_of(dims, rank, rc.model),  // ep > 1: this rank's experts only
                   train::stage_shard_of(dims, rank, rc.model),   // pp > 1: this rank's stage only
                   train::tp_shard_of(dims, rank));                // tp > 1: this rank's slice only
    if (device) m.use_backend(*device);
    m.acts.reserve((size_t)mem.activations);  // a device's arena: the step in one block
    if (!rc.model_path.empty()) model::load_hf_weights(m, rc.model_path);
    else m.init_random(rc.train.seed);
    const float lr = (float)rc.optim.schedule.lr;
    const train::AdamWConfig ocfg{lr, rc.optim.beta1, rc.optim.beta2, rc.optim.eps, rc.optim.weight_decay,
                                  rc.optim.clip_grad_norm};
    std::unique_ptr<train::AdamW> opt;
    train::ParallelRun par;
    if (R > 1) {
      train::DpOptions dpo{rc.parallel.bucket_size, rc.parallel.overlap};
      dpo.overlap_params = rc.parallel.overlap && rc.parallel.overlap_params;
      dpo.sequence_parallel = rc.parallel.sequence_parallel;
      dpo.zero_stage = (int)rc.parallel.zero_stage;
      par = train::make_parallel_run(*mpi.world, dims, m, ocfg, dpo);
    }
    std::unique_ptr<train::DataParallel>& dp = par.dp;
    if (!dp) opt = std::make_unique<train::AdamW>(m, ocfg);
    Profiler prof;
    TraceLog tlog;
    const bool tracing = !o->trace.empty();
    // train.grad_accum micro-batches of B rows a step (the pipeline's 1F1B needs several).
    const int64_t B = rc.train.batch_size, T = rc.data.seq_len, GA = rc.train.grad_accum, N = GA * B * T;
    std::vector<int32_t> ids(N), labels(N);
    // Each data rank its own tokens (the tp and cp ranks of one data rank share them).
    Rng rng(rc.train.seed + 1 + 7919 * (uint64_t)dims.coord(rank).dp);
    std::vector<double> times, comm, cp_comm;
    double last_loss = 0, own_ms = 0;  // own_ms: this rank's measured steps (the profile's total)
    // --profile: the measured steps' threading overhead, heap calls and arena growth (rank 0).
    const bool profiling = o->profile && rank == 0;
    ParStats par_stats;
    HeapCounter& heap = heap_counter();
    size_t arena_grows0 = 0, arena_bytes0 = 0;
    // MFU denominator: the fastest arithmetic the machine offers for this precision's GEMMs.
    // bf16 GEMMs may run on the fp32 FMA units (kernels/gemm.h) where vdpbf16ps is slower, so
    // the peak is max(fp32, bf16) for bf16 runs and the fp32 peak for fp32 runs. Under MPI every
    // rank measures its share at once and the machine's peak is their sum. A busy shared machine
    // measures low and inflates MFU: short measurements between measured steps at least
    // kPeakEveryMs apart (outside their time) and kPeakTries after the last, the best of them
    // checked against the calibration file's peak (cli/peak_choice.h).
    std::vector<double> tries;
    double bf16_dot = 0;
    constexpr double kPeakEveryMs = 10000;  // a try costs about 0.5 s: not after every short step
    double since_try_ms = 0;
    auto measure_peak_try = [&] {
      if (o->peak_gflops > 0) return;
      if (mpi.world) mpi.world->barrier();
      kern::Peak p = kern::measure_peak(0.15);
      tries.push_back(mpi.sum(rc.train.precision == kern::Prec::BF16 ? p.best_gflops() : p.fp32_gflops));
      bf16_dot = std::max(bf16_dot, mpi.sum(p.bf16_gflops));
    };
    // Under mpirun: a stuck rank or a lost peer ends the job, as in training (train/job_guard.h).
    train::JobGuard guard(mpi.world.get(), rc.parallel, "benchmark step", ".", 0);
    for (int s = 0; s < o->warmup + steps; ++s) {
      if (s == o->warmup && ((o->profile && rank == 0) || tracing)) {
        m.prof = &prof;
        // On a device the regions end when its work does: a synchronize at each edge.
        if (m.on_device()) prof.fence = [&m] { m.backend().synchronize(); };
      }
      if (s == o->warmup && profiling) {
        heap.clear();
        arena_grows0 = m.acts.grows();
        arena_bytes0 = m.acts.reserved();
      }
      if (s == o->warmup && tracing) {
        prof.trace = &tlog;
        if (dp) dp->set_trace(&tlog);
      }
      for (auto& v : labels) v = (int32_t)(rng.next_u64() % rc.model.vocab_size);
      ids = labels;
      std::vector<int32_t> targets = model::shift_labels(labels, GA * B, T);
      std::vector<model::Batch> micro;
      for (int64_t a = 0; a < GA; ++a)
        micro.push_back({B, T, ids.data() + a * B * T, targets.data() + a * B * T, nullptr, nullptr});
      const double t0 = now_ms();
      train::StepStats st;
      {
        const bool counted = profiling && s >= o->warmup;
        ParStatsScope par_scope(counted ? &par_stats : nullptr);
        std::optional<HeapCountScope> heap_scope;
        if (counted) heap_scope.emplace(heap);
        st = dp ? train::trainer_step(*dp, micro, lr, rc.train.bias_update_gamma, m.prof)
                : train::trainer_step(m, *opt, micro, lr, rc.train.bias_update_gamma, m.prof);
      }
      last_loss = st.loss;
      if (prof.trace) prof.trace->add("step " + std::to_string(s - o->warmup), TraceTrack::Compute, t0, now_ms());
      const double ms = mpi.max(st.ms);  // the step ends when the slowest rank's does
      if (s >= o->warmup) {
        times.push_back(ms);
        comm.push_back(st.comm_ms);
        cp_comm.push_back(st.cp_comm_ms);
        own_ms += st.ms;
      }
      if (rank == 0) std::fprintf(stderr, "[bench step] step %d loss %.4f %.1f ms\n", s, st.loss, ms);
      guard.done(s + 1);
      // A try once at least kPeakEveryMs of measured steps have passed since the last (ms is the
      // same on every rank, so all of them measure, and meet at its barrier, after the same steps).
      if (s >= o->warmup && s + 1 < o->warmup + steps && (since_try_ms += ms) >= kPeakEveryMs) {
        measure_peak_try();
        since_try_ms = 0;
      }
    }
    guard.finish();
    std::sort(times.begin(), times.end());
    std::sort(comm.begin(), comm.end());
    std::sort(cp_comm.begin(), cp_comm.end());
    const double med = times[times.size() / 2], mn = times.front(), comm_med = mpi.max(comm[comm.size() / 2]);
    const double cp_comm_med = mpi.max(cp_comm[cp_comm.size() / 2]);
    if (profiling) {
      StepOverheads& ov = prof.overheads;
      ov.threads = ov.heap = ov.arena = true;
      ov.regions = (double)par_stats.regions.load();
      ov.region_ms = par_stats.wall_ns.load() / 1e6;
      ov.thread_overhead_ms = par_stats.overhead_ns.load() / 1e6;
      ov.heap_allocs = (double)heap.allocs.load();
      ov.heap_frees = (double)heap.frees.load();
      ov.heap_mb = heap.bytes.load() / 1048576.0;
      ov.heap_ms = heap.ns.load() / 1e6;
      ov.arena_grows = (double)(m.acts.grows() - arena_grows0);
      ov.arena_mb = (m.acts.reserved() - arena_bytes0) / 1048576.0;
      double sum = 0;
      for (double t : times) sum += t;
      if (prof.fence) std::fprintf(stderr, "(on %s: the device synchronized at each region's edges)\n", m.backend().name());
      prof.print(stderr, (int)times.size(), sum / times.size());
      prof.print_breakdown(stderr, (int)times.size(), own_ms / times.size());
    }
    const double fpt = m.cfg.train_flops_per_token(T);  // m.cfg: with the MTP blocks the run trains
    constexpr int kPeakTries = 3;
    for (int t = 0; t < kPeakTries; ++t) measure_peak_try();
    CalibrationPeak calp;
    if (o->peak_gflops <= 0) {
      const plan::Calibration cal = plan::find_calibration(o->calibration);
      if (cal.measured) {
        calp.gflops = rc.train.precision == kern::Prec::BF16 ? std::max(cal.bf16_gflops, cal.fp32_gflops)
                                                             : cal.fp32_gflops;
        calp.threads = cal.threads * cal.ranks_per_node;
        calp.path = cal.path;
      }
    }
    const PeakChoice pc = choose_peak(tries, calp, o->peak_gflops, threads * R);
    const double peak = pc.gflops;
    const bool measured = !tries.empty();
    if (rank == 0 && !pc.warning.empty()) std::fprintf(stderr, "[bench step] warning: %s\n", pc.warning.c_str());
    if (rank == 0 && !pc.note.empty()) std::fprintf(stderr, "[bench step] peak: %s\n", pc.note.c_str());
    const double tps = dims.dp * N / (med / 1000.0);  // tp ranks and pp stages share their data rank's tokens
    const train::MemoryEstimate est = train::estimate_train_memory(rc, R);  // the start-up check's figure
    const double rss = mpi.max(peak_rss_mb()), act = mpi.max(m.peak_activation_bytes() / 1048576.0);
    const double mfu = fpt * tps / (peak * 1e9);
    if (const std::string w = implausible_mfu(mfu, pc); rank == 0 && !w.empty())
      std::fprintf(stderr, "[bench step] warning: %s\n", w.c_str());
    const Prediction pr = predict(rc, R, o->calibration);
    if (tracing) {  // every rank writes its part, rank 0 joins them
      write_trace_part(tlog, rank, o->trace + ".rank" + std::to_string(rank) + ".part");
      if (mpi.world) mpi.world->barrier();
      if (rank == 0) {
        std::vector<std::string> parts;
        for (int r = 0; r < R; ++r) parts.push_back(o->trace + ".rank" + std::to_string(r) + ".part");
        const size_t n = merge_trace_parts(parts, o->trace);
        for (const std::string& p : parts) std::remove(p.c_str());
        std::fprintf(stderr, "[bench step] trace: %s (%zu events, %d rank(s))\n", o->trace.c_str(), n, R);
      }
    }
    if (rank != 0) return;
    if (!pr.note.empty()) std::fprintf(stderr, "[bench step] planner: %s\n", pr.note.c_str());
    auto num_or_null = [](bool ok, double v, const char* fmt = "%.1f") {
      char b[32];
      std::snprintf(b, sizeof b, fmt, v);
      return ok ? std::string(b) : std::string("null");
    };
    // --profile's overheads per measured step (null without --profile).
    const StepOverheads& ov = prof.overheads;
    const double nst = (double)times.size();
    const std::string prof_json =
        "\"parallel_regions\": " + num_or_null(profiling, ov.regions / nst) +
        ", \"thread_overhead_ms\": " + num_or_null(profiling, ov.thread_overhead_ms / nst, "%.3f") +
        ", \"heap_allocs\": " + num_or_null(profiling, ov.heap_allocs / nst) +
        ", \"heap_ms\": " + num_or_null(profiling, ov.heap_ms / nst, "%.3f") +
        ", \"heap_mb\": " + num_or_null(profiling, ov.heap_mb / nst, "%.3f") +
        ", \"arena_growth_mb\": " + num_or_null(profiling, ov.arena_mb / nst, "%.3f");
    // Every peak measurement of the run, in order: on a machine whose clock moves, their spread
    // says how far MFU moves with the denominator.
    std::string tries_json;
    for (double t : tries) tries_json += (tries_json.empty() ? "" : ", ") + num_or_null(true, t);
    std::printf(
        "{\"impl\": \"trex\", \"config\": \"%s\", \"precision\": \"%s\", \"ranks\": %d, \"ep\": %d, \"tp\": %d, \"pp\": %d, \"threads\": %d, "
        "\"batch\": %lld, \"grad_accum\": %lld, \"seq\": %lld, "
        "\"steps\": %d, \"step_ms\": %.1f, \"step_ms_median\": %.1f, \"step_ms_min\": %.1f, \"comm_ms\": %.1f, "
        "\"cp_comm_ms\": %.3f, \"tokens_per_s\": %.1f, "
        "\"model_flops_per_token\": %.4g, \"active_params\": %lld, \"peak_gflops\": %.1f, \"peak_measured\": %s, "
        "\"peak_source\": \"%s\", \"peak_measured_gflops\": %s, \"peak_tries_gflops\": [%s], "
        "\"mfu\": %.4f, \"mfu_vs_bf16_dot_peak\": %.4f, \"peak_rss_mb\": %.0f, \"last_loss\": %.4f, "
        "\"activation_mb\": %.0f, \"memory_estimate_mb\": %.0f, \"activation_estimate_mb\": %.0f, "
        "\"plan_step_ms\": %s, \"plan_memory_mb\": %s, %s}\n",
        o->config.c_str(), rc.train.precision == kern::Prec::BF16 ? "bf16" : "fp32", R, dims.ep, dims.tp, dims.pp, threads,
        (long long)B, (long long)GA, (long long)T, steps, med, med, mn, comm_med, cp_comm_med, tps, fpt, (long long)m.cfg.num_active_params(), peak,
        measured ? "true" : "false", pc.source.c_str(), num_or_null(measured, pc.measured).c_str(), tries_json.c_str(), mfu,
        bf16_dot > 0 ? fpt * tps / (bf16_dot * 1e9) : 0.0, rss, last_loss, act,
        est.total() / 1048576.0, est.activations / 1048576.0, num_or_null(pr.ok, pr.step_s * 1000).c_str(),
        num_or_null(pr.ok, pr.memory_bytes / 1048576.0).c_str(), prof_json.c_str());
  });
}

}  // namespace trex::cli
