#!/usr/bin/env bash
# A host cut off mid-run (issue 34): `trex train` with ep 2 over two namespace hosts
# (tests/hosts/netns_bed.sh, launched by scripts/trex-mpirun), every packet to and from host 1
# dropped after step 5. The whole job must end within 60 s with a non-zero exit and the heartbeat's
# error naming peer rank 1 and parallel.peer_timeout_s, the rank on the cut host gone too; then, the link restored, --resume auto
# continues from the newest checkpoint to the end, and every step's loss equals an uncut run's
# (the checkpoint was intact, metrics.jsonl was cut back to it).
#
#   tests/hosts/link_cut.sh TREX_BINARY MPIEXEC
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
fail() { echo "FAIL: $*"; exit 1; }
STEPS=40
tiny_run $STEPS 3 2
RUN=(train --config run.toml --set parallel.ep=2 --set parallel.peer_timeout_s=6 --set parallel.watchdog_s=60)

"$MPIEXEC" --allow-run-as-root --oversubscribe -np 2 "$TREX" "${RUN[@]}" --set 'checkpoint.run_dir="straight"' \
  > straight.log 2>&1 || { tail -20 straight.log; fail "the uncut run"; }

bed_mpirun -np 2 "$TREX" "${RUN[@]}" --set 'checkpoint.run_dir="cut"' > cut.log 2>&1 &
launcher=$!
for _ in $(seq 600); do grep -q '^step 5/' cut.log && break; sleep 0.1; done
grep -q '^step 5/' cut.log || { tail -20 cut.log; fail "the run did not reach step 5"; }
bed_cut 1
t0=$SECONDS
while kill -0 $launcher 2> /dev/null && ((SECONDS - t0 < 60)); do sleep 0.2; done
kill -0 $launcher 2> /dev/null && { tail -20 cut.log; fail "the job still runs 60 s after the cut"; }
rc=0
wait $launcher || rc=$?
secs=$((SECONDS - t0))
((rc != 0)) || fail "the launcher exited 0 after the cut"
grep -Eq 'peer rank 1 \(host [^)]*\) has not answered for [0-9]+ s \(parallel.peer_timeout_s = 6' cut.log ||
  { tail -20 cut.log; fail "no heartbeat error naming peer rank 1"; }
# The rank on the far side (its output cannot reach mpirun) must have ended by itself.
for p in $(ip netns pids "$(bed_ns 1)"); do
  if grep -q "trex" "/proc/$p/cmdline" 2> /dev/null && ! grep -q orted "/proc/$p/cmdline" 2> /dev/null; then
    fail "the rank on the cut host still runs $secs s after the cut: $(tr '\0' ' ' < /proc/$p/cmdline)"
  fi
done
newest=$(ls cut/checkpoints | sort | tail -1)
echo "OK: the job ended ${secs} s after the cut (exit $rc); newest checkpoint $newest"

bed_heal 1
bed_mpirun -np 2 "$TREX" "${RUN[@]}" --set 'checkpoint.run_dir="cut"' --resume auto > resumed.log 2>&1 ||
  { tail -20 resumed.log; fail "the resumed run"; }
grep -q "resumed from .*$newest" resumed.log || { grep resumed resumed.log; fail "did not resume from $newest"; }
diff <(losses straight/metrics.jsonl) <(losses cut/metrics.jsonl) > losses.diff || { head losses.diff; fail "losses differ"; }
[ "$(wc -l < cut/metrics.jsonl)" -eq $STEPS ] || fail "metrics.jsonl holds $(wc -l < cut/metrics.jsonl) lines, not $STEPS"
echo "OK: resumed from $newest to step $STEPS, every loss equal to the uncut run's, one metrics line per step"
