#!/usr/bin/env bash
# A/B of two trex binaries on one config, interleaved in one run (A B A B ...) so that the noise of
# a shared machine falls on both alike: for refactors that must not change the speed.
# Usage: tools/bench/ab_binaries.sh OLD_TREX NEW_TREX [CONFIG ...]
# env: ROUNDS=3 (pairs of runs per config), STEPS=3 (measured steps per run), THREADS=$(nproc).
# Prints the machine, date and both binaries' commits (from `git describe` of their trees when
# given as TREE/build/trex), then one markdown row per config and binary: the minimum over its runs
# of each run's fastest step, the median of the runs' median steps, and B / A of those medians.
set -euo pipefail
[ $# -ge 2 ] || { sed -n 2,8p "$0"; exit 2; }
OLD=$1 NEW=$2
shift 2
CONFIGS=("$@")
[ ${#CONFIGS[@]} -gt 0 ] || CONFIGS=(configs/bench-v3.toml configs/bench-v4.toml)
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-3}
THREADS=${THREADS:-$(nproc)}
export TREX_THREADS=$THREADS
commit_of() { git -C "$(dirname "$1")/.." rev-parse --short HEAD 2>/dev/null || echo "?"; }
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, threads $THREADS"
echo "date: $(date -u +%FT%TZ)  A = $OLD ($(commit_of "$OLD"))  B = $NEW ($(commit_of "$NEW"))"
PEAK=$("$NEW" bench peak --threads "$THREADS" | python3 -c 'import json,sys; print(json.load(sys.stdin)["best_gflops"])')
echo "peak (best, GFLOP/s): $PEAK"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
for cfg in "${CONFIGS[@]}"; do
  for r in $(seq "$ROUNDS"); do
    for side in A B; do
      bin=$OLD; [ $side = B ] && bin=$NEW
      "$bin" bench step --config "$cfg" --steps "$STEPS" --warmup 1 --peak-gflops "$PEAK" 2>/dev/null \
        >> "$TMP/$(basename "$cfg").$side.jsonl"
    done
  done
done
python3 - "$TMP" "${CONFIGS[@]}" <<'PY'
import json, os, statistics, sys
tmp, cfgs = sys.argv[1], sys.argv[2:]
print("| config | binary | runs x steps | step ms (min) | step ms (median) | MFU (median) | B / A (median) |")
print("|---|---|---|---|---|---|---|")
for cfg in cfgs:
    med = {}
    for side in "AB":
        rows = [json.loads(l) for l in open(os.path.join(tmp, f"{os.path.basename(cfg)}.{side}.jsonl")) if l.startswith("{")]
        med[side] = statistics.median(r["step_ms_median"] for r in rows)
        mfu = statistics.median(r["mfu"] for r in rows)
        ratio = f"{med['B'] / med['A']:.3f}" if side == "B" else ""
        print(f"| {cfg} | {side} | {len(rows)} x {rows[0]['steps']} | {min(r['step_ms_min'] for r in rows):.0f} | "
              f"{med[side]:.0f} | {100 * mfu:.1f}% | {ratio} |")
PY
