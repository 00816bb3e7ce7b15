#!/usr/bin/env bash
# The measurements behind BENCHMARKS.md's topic sections, one named topic a call, on the machine
# at hand: each `trex bench step` (or `bench kernels`, `trex_ops perf`) of the topic, its JSON line
# kept under OUT/TOPIC/NAME.json (stderr, with --profile tables, in NAME.err), then one summary
# line a run. MFU is against the peak measured at the start (`trex bench peak`).
#
# usage: tools/bench/topics.sh TOPIC... [--trex PATH] [--threads T] [--steps N] [--out DIR]
# topics:
#   overlap        bench-v3 and bench-v4 on 1 rank x T threads, dp 2, dp 2 + ep 2 (--profile), and
#                  a Chrome trace of bench-v3 at ep 2 rendered to OUT/overlap/trace-ep2.png
#   recompute      bench-v3 / bench-v4 with train.recompute none, full and selective, and the start-up
#                  estimate against the arena peak (--steps 1 --warmup 0)
#   seq            bench-v3 at seq 1024, 2048, 4096, 8192 (--profile: the attention core's share)
#   attn-bf16      bench-v3 (bf16) at seq 2048 and 8192 with the attention core on the bf16 dot
#                  product (TREX_BF16_DOT=fast: the default where vdpbf16ps outruns the FMAs) and on
#                  the f32 kernel (the same with TREX_ATTN=f32), alternating, --profile; then
#                  `trex_ops perf` of both kernels
#   experts        bench-v3 cut to 3 layers, 16 / 32 / 64 / 128 experts, 1 and 4 micro-batches (--profile)
#   tp             bench-v3 / bench-v4 on 2 ranks: dp 2, tp 2, tp 2 + sequence parallel
#   zero           bench-v3 dp 2, 2 micro-batches, ZeRO-1 against ZeRO-2
#   pp             bench-v3 dp 2 against pp 2 (4 micro-batches); pp 2 memory of bench-v3 / bench-v4
#                  (2 micro-batches); pp 2 with ZeRO 1 / 2 on 2 ranks and dp 2 x pp 2 on 4 ranks;
#                  the start-up estimate of each stage (--steps 1 --warmup 0)
#   tp-memory      peak RSS per rank at tp 2: bench-v3, bench-v4, bench-v3 with every layer dense
#   ep-memory      bench-v3 / bench-v4: 1 rank, dp 2, dp 2 + ep 2, peak RSS and the estimate
#   overlap-params bench-v3 dp 2 with parallel.overlap_params true and false
#   optimizer      `trex bench kernels --filter optimizer`: the reference fallback (TREX_ISA=ref)
#                  against the machine's AdamW / sum_squares kernels
#   kernels        `trex bench kernels` of bench-v3 and bench-v4 (every hot kernel against the roofline)
#   profile        `trex bench step --profile` of bench-v3 (threading overhead, heap allocations)
#   gemm           `trex_ops perf "gemm perf"` with TREX_GEMM_BF16=widen and dot (needs build/trex_ops)
# The PyTorch peers: tools/bench/compare.sh; bf16 against fp32 over 100 steps: tools/bench/bf16_drift.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
TREX=build/trex; THREADS=$(nproc); STEPS=3; OUT=runs/bench-topics/$(date -u +%F-%H%M); TOPICS=()
while [ $# -gt 0 ]; do
  case $1 in
    --trex) TREX=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "topics.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) TOPICS+=("$1"); shift ;;
  esac
done
[ ${#TOPICS[@]} -gt 0 ] || { echo "topics.sh: name at least one topic (see --help)" >&2; exit 2; }
[ -x "$TREX" ] || { echo "topics.sh: $TREX not found: build it first (make build) or pass --trex PATH" >&2; exit 1; }
ROOT=(); [ "$(id -u)" = 0 ] && ROOT=(--allow-run-as-root)
mpi() { local n=$1; shift; mpirun "${ROOT[@]}" --oversubscribe -np "$n" -x TREX_THREADS=$((THREADS / n > 0 ? THREADS / n : 1)) "$@"; }
export TREX_THREADS=$THREADS
mkdir -p "$OUT"
echo "[topics] $(date -u +%FT%TZ) commit $(git rev-parse --short=7 HEAD 2>/dev/null || echo unknown), $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(nproc) cores, threads $THREADS, out $OUT"
"$TREX" bench peak --threads "$THREADS" | tee "$OUT/peak.json"
PEAK=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['best_gflops'])" "$OUT/peak.json")

DIR=$OUT
# run NAME CMD...: the last JSON line of stdout -> DIR/NAME.json, then a summary line.
run() {
  local name=$1; shift
  local rc=0 t0=$SECONDS
  "$@" > "$DIR/$name.out" 2> "$DIR/$name.err" || rc=$?
  grep '^{' "$DIR/$name.out" | tail -1 > "$DIR/$name.json" || true
  python3 - "$DIR/$name.json" "$name" "$rc" "$((SECONDS - t0))" <<'PY'
import json, sys
path, name, rc, secs = sys.argv[1:]
try:
    r = json.loads(open(path).read())
except Exception:
    r = None
if rc != "0":
    print(f"{name:34s} failed, exit {rc} ({secs} s): see {path[:-5]}.err"); sys.exit(0)
if r is None:
    print(f"{name:34s} done ({secs} s): {path[:-5]}.out"); sys.exit(0)
if "step_ms_median" in r and "mfu" in r:
    print(f"{name:34s} step {r['step_ms_median']:.0f} / {r['step_ms_min']:.0f} ms, {r['tokens_per_s']:.1f} tokens/s, "
          f"MFU {100 * r['mfu']:.1f}%, exposed comm {r.get('comm_ms', 0):.0f} ms, peak RSS {r['peak_rss_mb']:.0f} MiB, "
          f"activation {r['activation_mb']:.0f} MiB (estimate {r['activation_estimate_mb']:.0f}), "
          f"memory estimate {r['memory_estimate_mb']:.0f} MiB, loss {r['last_loss']:.4f}")
else:
    print(f"{name:34s} {json.dumps(r)[:300]}")
PY
}
step() { "$TREX" bench step --warmup 1 --peak-gflops "$PEAK" "$@"; }
v() { echo "--config configs/bench-$1.toml"; }

for topic in "${TOPICS[@]}"; do
  DIR=$OUT/$topic; mkdir -p "$DIR"; echo "[topics] $topic"
  case $topic in
    overlap)
      for c in v3 v4; do
        run $c.1rank step $(v $c) --steps "$STEPS"
        run $c.dp2 mpi 2 "$TREX" bench step $(v $c) --steps "$STEPS" --warmup 1 --peak-gflops "$PEAK"
        run $c.dp2-ep2 mpi 2 "$TREX" bench step $(v $c) --steps "$STEPS" --warmup 1 --peak-gflops "$PEAK" \
          --set parallel.ep=2 --profile
      done
      run v3.dp2-ep2-trace mpi 2 "$TREX" bench step $(v v3) --steps "$STEPS" --warmup 1 --peak-gflops "$PEAK" \
        --set parallel.ep=2 --trace "$DIR/trace-ep2.json"
      python3 tools/trace/trace_png.py "$DIR/trace-ep2.json" "$DIR/trace-ep2.png" --from-step 1 || true ;;
    recompute)
      for c in v3 v4; do for r in none full selective; do
        run $c.$r step $(v $c) --steps "$STEPS" --set train.recompute=$r
        run $c.$r.estimate "$TREX" bench step $(v $c) --steps 1 --warmup 0 --peak-gflops "$PEAK" --set train.recompute=$r
      done; done ;;
    seq)
      for s in 1024 2048 4096 8192; do run v3.seq-$s step $(v v3) --steps "$STEPS" --set data.seq_len=$s --profile; done ;;
    attn-bf16)
      for s in 2048 8192; do for a in f32 bf16; do
        run v3.seq-$s.attn-$a env TREX_BF16_DOT=fast TREX_ATTN=$([ $a = f32 ] && echo f32 || echo default) \
          "$TREX" bench step $(v v3) --steps "$STEPS" --warmup 1 --peak-gflops "$PEAK" --set data.seq_len=$s --profile
      done; done
      OPS=$(dirname "$TREX")/trex_ops
      if [ -x "$OPS" ]; then "$OPS" perf "B=1 T=2048 H=16" > "$DIR/ops-perf.out" 2>&1 || true; cat "$DIR/ops-perf.out"; fi ;;
    experts)
      for ga in 1 4; do for e in 16 32 64 128; do
        run v3.experts-$e.ga$ga step $(v v3) --steps "$STEPS" --set model.num_hidden_layers=3 \
          --set model.n_routed_experts=$e --set train.grad_accum=$ga --profile
      done; done ;;
    tp)
      for c in v3 v4; do
        run $c.dp2 mpi 2 "$TREX" bench step $(v $c) --steps "$STEPS" --warmup 1 --peak-gflops "$PEAK"
        run $c.tp2 mpi 2 "$TREX" bench step $(v $c) --steps "$STEPS" --warmup 1 --peak-gflops "$PEAK" \
          --set parallel.tp=2 --set parallel.sequence_parallel=false
        run $c.tp2-sp mpi 2 "$TREX" bench step $(v $c) --steps "$STEPS" --warmup 1 --peak-gflops "$PEAK" \
          --set parallel.tp=2 --set parallel.sequence_parallel=true
      done ;;
    zero)
      for z in 1 2; do
        run v3.dp2-zero$z mpi 2 "$TREX" bench step $(v v3) --steps 2 --warmup 1 --peak-gflops "$PEAK" \
          --set parallel.zero_stage=$z --set train.grad_accum=2
      done ;;
    pp)
      run v3.dp2-ga4 mpi 2 "$TREX" bench step $(v v3) --steps 2 --warmup 1 --peak-gflops "$PEAK" --set train.grad_accum=4 --set parallel.dp=2
      run v3.pp2-ga4 mpi 2 "$TREX" bench step $(v v3) --steps 2 --warmup 1 --peak-gflops "$PEAK" --set train.grad_accum=4 --set parallel.pp=2
      for c in v3 v4; do
        run $c.pp2-ga2 mpi 2 "$TREX" bench step $(v $c) --steps 2 --warmup 1 --peak-gflops "$PEAK" \
          --set train.grad_accum=2 --set parallel.pp=2
        run $c.pp2-estimate mpi 2 "$TREX" bench step $(v $c) --steps 1 --warmup 0 --peak-gflops "$PEAK" \
          --set train.grad_accum=2 --set parallel.pp=2 --set train.threads=1
      done
      for z in 1 2; do
        run v3.pp2-zero$z mpi 2 "$TREX" bench step $(v v3) --steps 2 --warmup 1 --peak-gflops "$PEAK" \
          --set train.grad_accum=2 --set parallel.pp=2 --set parallel.zero_stage=$z
        run v3.dp2-pp2-zero$z mpi 4 "$TREX" bench step $(v v3) --steps 1 --warmup 1 --peak-gflops "$PEAK" \
          --set train.grad_accum=2 --set parallel.pp=2 --set parallel.zero_stage=$z
      done ;;
    tp-memory)
      for c in v3 v4; do
        run $c.tp2 mpi 2 "$TREX" bench step $(v $c) --steps 2 --warmup 1 --peak-gflops "$PEAK" --set parallel.tp=2 --set train.threads=1
      done
      run v3-dense.tp2 mpi 2 "$TREX" bench step $(v v3) --steps 2 --warmup 1 --peak-gflops "$PEAK" --set parallel.tp=2 \
        --set train.threads=1 --set model.first_k_dense_replace=6 ;;
    ep-memory)
      for c in v3 v4; do
        run $c.1rank step $(v $c) --steps "$STEPS"
        run $c.dp2 mpi 2 "$TREX" bench step $(v $c) --steps "$STEPS" --warmup 1 --peak-gflops "$PEAK"
        run $c.dp2-ep2 mpi 2 "$TREX" bench step $(v $c) --steps "$STEPS" --warmup 1 --peak-gflops "$PEAK" --set parallel.ep=2
      done ;;
    overlap-params)
      for o in true false; do
        run v3.dp2-overlap-$o mpi 2 "$TREX" bench step $(v v3) --steps "$STEPS" --warmup 1 --peak-gflops "$PEAK" \
          --set parallel.overlap_params=$o
      done ;;
    optimizer)
      run ref env TREX_ISA=ref "$TREX" bench kernels $(v v3) --filter optimizer --passes 3 --threads "$THREADS"
      run default "$TREX" bench kernels $(v v3) --filter optimizer --passes 3 --threads "$THREADS"
      cat "$DIR/ref.out" "$DIR/default.out" ;;
    kernels)
      for c in v3 v4; do
        run $c "$TREX" bench kernels $(v $c) --threads "$THREADS" --seconds 0.3 --passes 3
        cat "$DIR/$c.out"
      done ;;
    profile)
      run v3 step $(v v3) --steps 2 --profile
      cat "$DIR/v3.err" ;;
    gemm)
      OPS=$(dirname "$TREX")/trex_ops
      [ -x "$OPS" ] || { echo "topics.sh: $OPS not found (cmake --build build --target trex_ops)" >&2; exit 1; }
      for g in widen dot; do
        TREX_GEMM_BF16=$g "$OPS" perf "gemm perf" > "$DIR/$g.out" 2>&1 || true
        echo "TREX_GEMM_BF16=$g"; cat "$DIR/$g.out"
      done ;;
    *) echo "topics.sh: unknown topic '$topic' (see --help)" >&2; exit 2 ;;
  esac
done
echo "[topics] raw output under $OUT"
