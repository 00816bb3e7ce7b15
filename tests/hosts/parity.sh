#!/usr/bin/env bash
# Multi-host parity (issue 34): `trex train` over two namespace hosts (tests/hosts/netns_bed.sh:
# OpenMPI over TCP only, one rank a host) with dp 2, ep 2, pp 2 and tp 2 (heads 2 instead of 3) equals the same run on one
# host over shared memory bit for bit (every step's loss, the final checkpoint's weights and
# AdamW moments), and one process on the same global batch to 1e-5 relative (fp32).
#
#   tests/hosts/parity.sh TREX_BINARY MPIEXEC
# Skipped (exit 77) where network namespaces are not permitted or not root.
set -euo pipefail
TREX=$(realpath "$1")
MPIEXEC=${2:-mpirun}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
source "$ROOT/tests/hosts/netns_bed.sh"
source "$ROOT/tests/faults/tiny_run.sh"
bed_require
bed_up 2
WORK=$BED_DIR
cd "$WORK"
fail() { echo "FAIL: $*"; exit 1; }  # the bed (and its files) go with the trap
tiny_run 6 3 1
FP32=(--set 'train.precision="fp32"')

# One process, batch 2 x 2 (the dp 2 global batch); tp 2 needs an even head count.
"$TREX" train --config run.toml --set 'checkpoint.run_dir="one"' --set train.batch_size=4 "${FP32[@]}" > one.log 2>&1 ||
  { cat one.log; fail "one process"; }
losses one/metrics.jsonl > one.losses
HEADS2=(--set model.num_attention_heads=2)
"$TREX" train --config run.toml --set 'checkpoint.run_dir="one-h2"' --set train.batch_size=4 "${FP32[@]}" "${HEADS2[@]}" \
  > one-h2.log 2>&1 || { cat one-h2.log; fail "one process, 2 heads"; }
losses one-h2/metrics.jsonl > one-h2.losses
for layout in "dp 2" "ep 2" "pp 2" "tp 2"; do
  set -- $layout
  name="$1$2"
  sets=(--set "parallel.$1=$2" "${FP32[@]}")
  bs=(--set train.batch_size=2)
  ref=one.losses
  [ "$1" = pp ] || [ "$1" = tp ] && bs=(--set train.batch_size=4)  # dp 1: the whole batch on each rank
  [ "$1" = tp ] && sets+=("${HEADS2[@]}") && ref=one-h2.losses
  t0=$SECONDS
  bed_mpirun -np 2 "$TREX" train --config run.toml --set "checkpoint.run_dir=\"$name-tcp\"" "${sets[@]}" "${bs[@]}" \
    > "$name-tcp.log" 2>&1 || { tail -20 "$name-tcp.log"; fail "$layout over TCP"; }
  t1=$SECONDS
  "$MPIEXEC" --allow-run-as-root --oversubscribe -np 2 "$TREX" train --config run.toml \
    --set "checkpoint.run_dir=\"$name-shm\"" "${sets[@]}" "${bs[@]}" > "$name-shm.log" 2>&1 ||
    { tail -20 "$name-shm.log"; fail "$layout on one host"; }
  losses "$name-tcp/metrics.jsonl" > "$name-tcp.losses"
  losses "$name-shm/metrics.jsonl" > "$name-shm.losses"
  [ "$(wc -l < "$name-tcp.losses")" -eq 6 ] || fail "$layout: not 6 steps logged"
  diff "$name-tcp.losses" "$name-shm.losses" > /dev/null || fail "$layout: TCP losses differ from shared memory's"
  for f in model.safetensors optimizer.safetensors; do
    cmp -s "$name-tcp/checkpoints/step-00000006/$f" "$name-shm/checkpoints/step-00000006/$f" ||
      fail "$layout: $f differs between TCP and shared memory"
  done
  python3 - "$name-tcp.losses" "$ref" "$layout" <<'PY'
import sys
a = [float(l.split()[1]) for l in open(sys.argv[1])]
b = [float(l.split()[1]) for l in open(sys.argv[2])]
worst = max(abs(x - y) / abs(y) for x, y in zip(a, b))
assert len(a) == len(b) and worst <= 1e-5, f"{sys.argv[3]}: losses vs one process: worst relative {worst:.2e}"
print(f"OK: {sys.argv[3]} over TCP across 2 hosts == shared memory bit for bit; vs one process worst {worst:.1e}")
PY
  echo "   ($layout over TCP: $((t1 - t0)) s)"
done
