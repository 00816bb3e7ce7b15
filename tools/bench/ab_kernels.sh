#!/usr/bin/env bash
# A/B of two trex binaries' `bench kernels` rows, interleaved in one run (A B A B ...) so that the
# noise of a shared machine falls on both alike: for a kernel change, the rows it touches.
# Usage: tools/bench/ab_kernels.sh OLD_TREX NEW_TREX CONFIG FILTER [--set KEY=VALUE ...]
# env: ROUNDS=3 (pairs of runs), THREADS=$(nproc), SECONDS_PER_ROW=0.3.
# Prints the machine, date and both binaries' commits, then one markdown row per kernel row:
# ms per call (the lowest over the rounds) for A and B, calls per step, ms per step, and B / A.
set -euo pipefail
[ $# -ge 4 ] || { sed -n 2,7p "$0"; exit 2; }
OLD=$1 NEW=$2 CONFIG=$3 FILTER=$4
shift 4
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-$(nproc)}
SECS=${SECONDS_PER_ROW:-0.3}
commit_of() { git -C "$(dirname "$1")/.." rev-parse --short HEAD 2>/dev/null || echo "?"; }
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, threads $THREADS"
echo "date: $(date -u +%FT%TZ)  A = $OLD ($(commit_of "$OLD"))  B = $NEW ($(commit_of "$NEW"))"
echo "rows: $CONFIG, --filter '$FILTER' $*, $ROUNDS rounds, load before: $(cut -d' ' -f1-3 /proc/loadavg)"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
for r in $(seq "$ROUNDS"); do
  for side in A B; do
    bin=$OLD; [ $side = B ] && bin=$NEW
    "$bin" bench kernels --config "$CONFIG" --threads "$THREADS" --seconds "$SECS" --filter "$FILTER" --json "$@" \
      2>/dev/null > "$TMP/$side.$r.jsonl"
  done
done
python3 - "$TMP" "$ROUNDS" <<'P'
import json, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
best, calls, order = {}, {}, []
for side in "AB":
    for r in range(1, rounds + 1):
        for line in open(f"{tmp}/{side}.{r}.jsonl"):
            j = json.loads(line)
            if j.get("record") != "kernel":
                continue
            key = (j["kernel"], j["shape"])
            if key not in order:
                order.append(key)
            calls[key] = j["calls"]
            best[(side, key)] = min(best.get((side, key), float("inf")), j["ms_call"])
print("| kernel | shape | calls/step | A ms/call | B ms/call | A ms/step | B ms/step | B / A |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
ta = tb = 0.0
for k in order:
    a, b, c = best[("A", k)], best[("B", k)], calls[k]
    ta += a * c
    tb += b * c
    print(f"| {k[0]} | {k[1]} | {c} | {a:.2f} | {b:.2f} | {a * c:.1f} | {b * c:.1f} | {b / a:.3f} |")
print(f"| **total** | | | | | {ta:.1f} | {tb:.1f} | {tb / ta:.3f} |")
P
