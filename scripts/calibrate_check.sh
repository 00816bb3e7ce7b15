#!/usr/bin/env bash
# Issue 7's calibration check: calibrate the planner on this machine (1 rank x all threads, and
# R ranks x 1 thread under mpirun), measure `trex bench step` of each config the same two ways,
# and print the planner's step time and memory against the measured ones (docs/PLAN.md).
# usage: scripts/calibrate_check.sh [--trex PATH] [--ranks R] [--steps N] [--out DIR] [CONFIG ...]
# default configs: configs/bench-v3.toml configs/bench-v4.toml. Run on an otherwise idle machine.
set -euo pipefail
TREX=build/trex; R=2; STEPS=5; OUT=runs/calibrate
CONFIGS=()
while [ $# -gt 0 ]; do
  case $1 in
    --trex) TREX=$2; shift 2 ;;
    --ranks) R=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n 2,6p "$0"; exit 0 ;;
    *) CONFIGS+=("$1"); shift ;;
  esac
done
[ ${#CONFIGS[@]} -gt 0 ] || CONFIGS=(configs/bench-v3.toml configs/bench-v4.toml)
mkdir -p "$OUT"
ROOT=(); [ "$(id -u)" = 0 ] && ROOT=(--allow-run-as-root)
MPI=(mpirun "${ROOT[@]}" --oversubscribe -np "$R" -x TREX_THREADS=1 -x TREX_CALIBRATION="$OUT/calib$R.json")
# Each run is calibrated right before it: on a shared machine whose rates drift over minutes, a
# calibration predicts the steps measured next to it (docs/PLAN.md, "Calibration against trex").
for c in "${CONFIGS[@]}"; do
  n=$(basename "$c" .toml)
  "$TREX" bench calibrate --out "$OUT/calib1.json" > /dev/null 2>&1
  cp "$OUT/calib1.json" "$OUT/$n.calib1.json"
  TREX_CALIBRATION="$OUT/calib1.json" "$TREX" bench step --config "$c" --steps "$STEPS" --warmup 1 \
    > "$OUT/$n.r1.json" 2> "$OUT/$n.r1.err"
  "${MPI[@]}" "$TREX" bench calibrate --out "$OUT/calib$R.json" > /dev/null 2>&1
  cp "$OUT/calib$R.json" "$OUT/$n.calib$R.json"
  "${MPI[@]}" "$TREX" bench step --config "$c" --steps "$STEPS" --warmup 1 > "$OUT/$n.r$R.json" 2> "$OUT/$n.r$R.err"
done
python3 - "$OUT" "$R" "${CONFIGS[@]}" <<'P'
import json, os, sys
out, R, configs = sys.argv[1], sys.argv[2], sys.argv[3:]
print("| run | measured step | planner | error | peak RSS / rank | planner memory | error | exposed comm | MFU |")
print("|---|---|---|---|---|---|---|---|---|")
for c in configs:
    n = os.path.basename(c)[:-5]
    for r in ("1", R):
        j = json.loads(open(f"{out}/{n}.r{r}.json").read().strip().splitlines()[-1])
        m, p = j["step_ms_median"], j["plan_step_ms"]
        rss, pm = j["peak_rss_mb"], j["plan_memory_mb"]
        who = f"{j['ranks']} rank(s) x {j['threads']} thread(s)"
        err = lambda a, b: "n/a" if a is None else f"{100 * (a / b - 1):+.1f}%"
        print(f"| {n}, {who} | {m / 1000:.2f} s | {'n/a' if p is None else f'{p / 1000:.2f} s'} | {err(p, m)} "
              f"| {rss:.0f} MiB | {'n/a' if pm is None else f'{pm:.0f} MiB'} | {err(pm, rss)} "
              f"| {j['comm_ms'] / 1000:.2f} s | {100 * j['mfu']:.1f}% |")
P
