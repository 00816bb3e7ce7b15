#!/usr/bin/env bash
# Long-context steps against the start-up memory estimate: `trex bench step` on a config at one
# sequence of SEQ tokens a step, on 1 rank x 2 threads and (CP=2) as cp 2 (2 ranks x 1 thread,
# each bound to its own core), one after the other, with the load average before each. Prints one
# Markdown row per run: step time, tokens/s, MFU, the attention core's share of the step (from
# --profile), and each rank's peak RSS against the estimate the start-up memory check computes
# (train/activation_estimate.h, train/preflight.h), and the activation arena's measured peak
# against its estimate.
#
#   tools/bench/long_context.sh [TREX=build/trex] [CONFIG=configs/bench-v3.toml] [SEQ=32768] [CP=1|2]
#                               [RECOMPUTE=none|full|selective] [MODULES='["moe"]' (selective's modules)]
#                               [WARMUP=0]
# SETS (environment, optional): more `key=value` settings for both runs, space-separated (e.g.
# SETS="parallel.zero_stage=2").
# WARMUP 0 measures the first step, which also pays the first touch of the activation arena's
# pages (at 32768 tokens on bench-v3: 190 s against 129 s for a later step); WARMUP 1 measures
# the steady state (twice the time).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TREX=$(realpath "${1:-$ROOT/build/trex}")
CONFIG=$(realpath "${2:-$ROOT/configs/bench-v3.toml}")
SEQ=${3:-32768}
CP=${4:-1}
RECOMPUTE=${5:-none}
MODULES=${6:-}
WARMUP=${7:-0}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
load() { cut -d' ' -f1-3 /proc/loadavg; }
common=(bench step --config "$CONFIG" --steps 1 --warmup "$WARMUP" --profile --set "data.seq_len=$SEQ" --set train.batch_size=1
        --set train.grad_accum=1 --set "train.recompute=$RECOMPUTE")
if [ -n "$MODULES" ]; then common+=(--set "train.recompute_modules=$MODULES"); fi
for kv in ${SETS:-}; do common+=(--set "$kv"); done
L1=$(load)
TREX_THREADS=2 "$TREX" "${common[@]}" --set train.threads=2 > "$OUT/one.json" 2> "$OUT/one.log" \
  || { tail -20 "$OUT/one.log"; exit 1; }
L2=-
if [ "$CP" = 2 ]; then
  L2=$(load)
  mpirun --allow-run-as-root --oversubscribe -np 2 -x TREX_THREADS=1 \
    "$TREX" "${common[@]}" --set train.threads=1 --set parallel.cp=2 > "$OUT/cp.json" 2> "$OUT/cp.log" \
    || { tail -20 "$OUT/cp.log"; exit 1; }
fi
python3 - "$OUT" "$CONFIG" "$SEQ" "$L1" "$L2" "$RECOMPUTE $MODULES" <<'PY'
import json, os, re, sys
out, config, seq, l1, l2, rec = sys.argv[1:]
def attn_share(log):
    # --profile table rows: "<region> <ms/step> <calls> <share>"; the attention core is
    # {fwd,bwd}.mla.attn_core (MLA) or {fwd,bwd}.attn.core (DeepSeek-V4).
    tot = 0.0
    for line in open(log):
        m = re.match(r"(fwd|bwd)\.(mla\.attn_core|attn\.core)\s+([0-9.]+)\s", line)
        if m: tot += float(m.group(3))
    return tot
sets = os.environ.get("SETS", "")
print(f"{os.path.basename(config)}, one sequence of {seq} tokens a step, recompute {rec}" + (f", {sets}" if sets else ""))
print("| run | load before | step ms | tokens/s | MFU (of peak GFLOP/s; its tries' range) | attention core ms (share) | peak RSS MiB / rank | "
      "estimate MiB | RSS / estimate | activations MiB (estimate) |")
print("|---|---|---|---|---|---|---|---|---|---|")
for name, f, l in (("1 rank x 2 threads", "one", l1), ("cp 2: 2 ranks x 1 thread", "cp", l2)):
    p = os.path.join(out, f + ".json")
    if not os.path.exists(p): continue
    j = json.loads(open(p).read().strip().splitlines()[-1])
    a = attn_share(os.path.join(out, f + ".log"))
    t = j.get("peak_tries_gflops") or []
    tries = f"{min(t):.0f}-{max(t):.0f}" if t else "-"
    print(f"| {name} | {l} | {j['step_ms_median']:.0f} | {j['tokens_per_s']:.0f} | {100 * j['mfu']:.1f}% ({j['peak_gflops']:.0f}; {tries}) | "
          f"{a:.0f} ({100 * a / j['step_ms_median']:.0f}%) | {j['peak_rss_mb']:.0f} | {j['memory_estimate_mb']:.0f} | "
          f"{j['peak_rss_mb'] / j['memory_estimate_mb']:.3f} | {j['activation_mb']:.0f} ({j['activation_estimate_mb']:.0f}) |")
PY
