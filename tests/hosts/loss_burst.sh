#!/usr/bin/env bash
# A loss burst (issue 34): `trex train` with ep 2 over two namespace hosts
# (tests/hosts/netns_bed.sh), host 1's link squeezed to 64 kbit/s with a queue of a few packets
# for BURST_S seconds after step 5 (most packets dropped: netem is absent here, so tc tbf makes the
# loss), shorter than parallel.peer_timeout_s. The job must survive it: exit 0, every step's loss
# equal to an undisturbed run's; the stalled step is reported.
#
#   tests/hosts/loss_burst.sh TREX_BINARY MPIEXEC [BURST_S=8]
# Skipped (exit 77) where network namespaces are not permitted or not root.
set -euo pipefail
TREX=$(realpath "$1")
MPIEXEC=${2:-mpirun}
BURST_S=${3:-8}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
source "$ROOT/tests/hosts/netns_bed.sh"
source "$ROOT/tests/faults/tiny_run.sh"
bed_require
bed_up 2
WORK=$BED_DIR
cd "$WORK"
fail() { echo "FAIL: $*"; exit 1; }
STEPS=30
tiny_run $STEPS 10 1
# The watchdog well above the burst plus TCP's retransmission backoff after it (the timer doubles on
# every lost retry, so the first retry after the burst can come tens of seconds later).
RUN=(train --config run.toml --set parallel.ep=2 --set parallel.peer_timeout_s=20 --set parallel.watchdog_s=150)

"$MPIEXEC" --allow-run-as-root --oversubscribe -np 2 "$TREX" "${RUN[@]}" --set 'checkpoint.run_dir="calm"' \
  > calm.log 2>&1 || { tail -20 calm.log; fail "the undisturbed run"; }

bed_mpirun -np 2 "$TREX" "${RUN[@]}" --set 'checkpoint.run_dir="burst"' > burst.log 2>&1 &
launcher=$!
for _ in $(seq 600); do grep -q '^step 5/' burst.log && break; sleep 0.1; done
grep -q '^step 5/' burst.log || { tail -20 burst.log; fail "the run did not reach step 5"; }
bed_throttle 1 64kbit 3kb
sleep "$BURST_S"
bed_unthrottle 1 || { kill $launcher 2> /dev/null; fail "could not restore host 1's link"; }
rc=0
wait $launcher || rc=$?
((rc == 0)) || { tail -20 burst.log; fail "the job did not survive a ${BURST_S} s loss burst (exit $rc)"; }
diff <(losses calm/metrics.jsonl) <(losses burst/metrics.jsonl) > losses.diff || { head losses.diff; fail "losses differ"; }
python3 - burst/metrics.jsonl calm/metrics.jsonl "$BURST_S" <<'PY'
import json, sys
b = [json.loads(l)["step_ms"] for l in open(sys.argv[1])]
c = [json.loads(l)["step_ms"] for l in open(sys.argv[2])]
print(f"OK: survived a {sys.argv[3]} s loss burst, losses unchanged; slowest step {max(b) / 1000:.1f} s "
      f"(undisturbed: {max(c) / 1000:.2f} s)")
PY
