#!/usr/bin/env bash
# A/B of two trex binaries on one config, interleaved in one run (A B A B ...) so that the noise of
# a shared machine falls on both alike: for refactors that must not change the speed.
# Usage: tools/bench/ab_binaries.sh OLD_TREX NEW_TREX [CONFIG ...]
# env: ROUNDS=3 (pairs of runs per config), STEPS=3 (measured steps per run), THREADS=$(nproc),
#      REGIONS="step.zero_grads step.optimizer" (optional: runs with --profile and adds each
#      region's median ms a step per binary, for changes smaller than the step's noise),
#      SETS="data.seq_len=8192 train.threads=2" (optional: --set KEY=VALUE for every run).
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
REGIONS=${REGIONS:-}
PROFILE=(); [ -n "$REGIONS" ] && PROFILE=(--profile)
SET_ARGS=(); for kv in ${SETS:-}; do SET_ARGS+=(--set "$kv"); done
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
      log=$TMP/$(basename "$cfg").$side.prof
      "$bin" bench step --config "$cfg" --steps "$STEPS" --warmup 1 --peak-gflops "$PEAK" "${PROFILE[@]}" "${SET_ARGS[@]}" \
        2>> "$log" >> "$TMP/$(basename "$cfg").$side.jsonl" \
        || { echo "$side ($bin) failed on $cfg, round $r; its last lines:" >&2; tail -5 "$log" >&2; exit 1; }
    done
  done
done
python3 - "$TMP" "$REGIONS" "${CONFIGS[@]}" <<'PY'
import json, os, statistics, sys
tmp, regions, cfgs = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
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
if regions:
    # --profile's first table, one per run: "region  ms/step  calls  share"
    print()
    print("| config | region | A ms/step (median of runs) | B ms/step | B / A |")
    print("|---|---|---|---|---|")
    for cfg in cfgs:
        for reg in regions:
            m = {}
            for side in "AB":
                vals, seen = [], False
                for line in open(os.path.join(tmp, f"{os.path.basename(cfg)}.{side}.prof")):
                    f = line.split()
                    if f and f[0] == "region":
                        seen = False
                    elif len(f) >= 4 and f[0] == reg and not seen:
                        vals.append(float(f[1]))
                        seen = True
                m[side] = statistics.median(vals) if vals else float("nan")
            print(f"| {cfg} | {reg} | {m['A']:.1f} | {m['B']:.1f} | {m['B'] / m['A']:.3f} |")
PY
