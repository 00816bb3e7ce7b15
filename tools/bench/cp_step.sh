#!/usr/bin/env bash
# Context parallel against threads on one rank: `trex bench step` on bench-v3 (or CONFIG, e.g.
# configs/bench-v4.toml) at a long sequence (default 8192 tokens) as cp 2 (2 ranks x 1 thread, each holding two of the four chunks of the
# sequence; OpenMPI binds each of the 2 ranks to its own core) and as 1 rank x 2 threads, one
# after the other on the same machine, with the load average before each (a shared machine is
# noisy). Prints one Markdown row per run and the ratio of the tokens/s (the same tokens: one
# sequence a step). A third run, cp 2 with parallel.overlap = false, shows what cp 2 pays apart:
# its gradient buckets are reduced after the backward instead of during it, so the time in the cp
# collectives is theirs alone (with overlap on, OpenMPI moves the buckets' bytes inside any MPI
# call, the cp collectives' waits included) and the rest of the exposed communication is the
# gradient reduce-scatter and parameter all-gather over the 2 ranks, which 1 rank does not have.
#
#   tools/bench/cp_step.sh [TREX=build/trex] [STEPS=2] [SEQ=8192] [CONFIG=configs/bench-v3.toml]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TREX=$(realpath "${1:-$ROOT/build/trex}")
STEPS=${2:-2}
SEQ=${3:-8192}
CONFIG=$(realpath "${4:-$ROOT/configs/bench-v3.toml}")
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
load() { cut -d' ' -f1-3 /proc/loadavg; }
common=(bench step --config "$CONFIG" --steps "$STEPS" --warmup 1 --set "data.seq_len=$SEQ")
L1=$(load)
TREX_THREADS=2 "$TREX" "${common[@]}" --set train.threads=2 > "$OUT/one.json" 2> "$OUT/one.log" \
  || { tail -20 "$OUT/one.log"; exit 1; }
L2=$(load)
mpirun --allow-run-as-root --oversubscribe -np 2 -x TREX_THREADS=1 \
  "$TREX" "${common[@]}" --set train.threads=1 --set parallel.cp=2 > "$OUT/cp.json" 2> "$OUT/cp.log" \
  || { tail -20 "$OUT/cp.log"; exit 1; }
L3=$(load)
mpirun --allow-run-as-root --oversubscribe -np 2 -x TREX_THREADS=1 \
  "$TREX" "${common[@]}" --set train.threads=1 --set parallel.cp=2 --set parallel.overlap=false \
  > "$OUT/cpx.json" 2> "$OUT/cpx.log" || { tail -20 "$OUT/cpx.log"; exit 1; }
python3 - "$OUT/one.json" "$OUT/cp.json" "$OUT/cpx.json" "$L1" "$L2" "$L3" "$SEQ" "$(basename "$CONFIG" .toml)" <<'PY'
import json, sys
one, cp, cpx = (json.loads(open(p).read().strip().splitlines()[-1]) for p in sys.argv[1:4])
l1, l2, l3, seq, name = sys.argv[4:]
print(f"{name}, seq_len {seq}, one sequence a step")
print("| run | load average before | step ms (median / min) | exposed comm ms | of which cp collectives | tokens/s |")
print("|---|---|---|---|---|---|")
for name, j, l in (("1 rank x 2 threads", one, l1), ("cp 2: 2 ranks x 1 thread", cp, l2),
                   ("cp 2, parallel.overlap = false", cpx, l3)):
    print(f"| {name} | {l} | {j['step_ms_median']:.0f} / {j['step_ms_min']:.0f} | {j.get('comm_ms', 0):.0f} "
          f"| {j.get('cp_comm_ms', 0):.0f} | {j['tokens_per_s']:.0f} |")
print(f"cp 2 / 1 rank: {cp['tokens_per_s'] / one['tokens_per_s']:.2f}x tokens/s")
print(f"without overlap: cp collectives {cpx['cp_comm_ms']:.0f} ms a step, the rest of the exposed communication "
      f"(gradient reduce-scatter, parameter all-gather, the step's small all-reduces) "
      f"{cpx['comm_ms'] - cpx['cp_comm_ms']:.0f} ms")
PY
