#!/usr/bin/env bash
# Fault injection (issue 9): a training run is killed with SIGKILL at random moments (during
# steps, data loading, checkpoint writes) KILLS times, each time restarted with --resume auto,
# then run to the end. Its final checkpoint (weights, AdamW moments, trainer state) and the loss
# of every step must equal an uninterrupted run's bit for bit.
#
#   tests/faults/sigkill_resume.sh TREX_BINARY [KILLS=20] [SEED=1]
#
# Run by CTest as faults_sigkill_resume. Work files go to a temporary directory (removed on
# success, kept and named on failure).
set -euo pipefail
TREX=$(realpath "$1")
KILLS=${2:-20}
SEED=${3:-1}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/trex_sigkill.XXXXXX")
cd "$WORK"
RANDOM=$SEED
STEPS=120

# Data and run config: tests/faults/tiny_run.sh.
source "$ROOT/tests/faults/tiny_run.sh"
tiny_run $STEPS 2 2

"$TREX" train --config run.toml --set checkpoint.run_dir=\"straight\" > straight.log 2>&1

# The killed runs. Each kill picks a target step past the newest checkpoint, spreading the steps
# left over the kills left (0 steps past: kill during start-up), waits until the run has logged
# it, then waits a random part of two step times and kills, so kills land in data loading, forward / backward, the optimizer and
# checkpoint writes (the metrics line of a step is written just before its checkpoint). The first
# start has no checkpoint; --resume auto then continues from the newest one.
step_ms=$(python3 -c '
import json
ms = [json.loads(l)["step_ms"] for l in open("straight/metrics.jsonl")]
print(max(1, int(sum(ms) / len(ms))))')
newest_step() { ls killed/checkpoints 2>/dev/null | sed -n 's/^step-0*\([0-9][0-9]*\)$/\1/p' | sort -n | tail -1 || true; }
logged_step() { tail -n 1 killed/metrics.jsonl 2>/dev/null | sed -n 's/^{.*"step":\([0-9]*\).*/\1/p' || true; }
sleep_ms() { sleep "$(printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000)))"; }
kills=0 cut_writes=0 in_startup=0
while ((kills < KILLS)); do
  done_steps=$(newest_step); done_steps=${done_steps:-0}
  per=$(( (STEPS - done_steps) / (KILLS - kills + 1) )); ((per < 1)) && per=1
  target=$((done_steps + RANDOM % (2 * per)))
  ((target > STEPS - 3)) && target=$((STEPS - 3))
  "$TREX" train --config run.toml --set checkpoint.run_dir=\"killed\" --resume auto >> killed.log 2>&1 &
  pid=$!
  where="during start-up"
  if ((target <= done_steps)); then
    sleep_ms $((20 + RANDOM % 400))
  else
    while kill -0 "$pid" 2>/dev/null; do
      s=$(logged_step)
      [ -n "$s" ] && ((s >= target)) && break
      sleep 0.005
    done
    sleep_ms $((RANDOM % (2 * step_ms + 1)))
    where="after step $(logged_step)"
  fi
  if kill -9 "$pid" 2>/dev/null; then
    wait "$pid" 2>/dev/null || true
    kills=$((kills + 1))
    [ "$where" = "during start-up" ] && in_startup=$((in_startup + 1))
    if ls -a killed/checkpoints 2>/dev/null | grep -q "^\.tmp-.*-$pid$"; then
      where="$where, cutting a checkpoint write"
      cut_writes=$((cut_writes + 1))
    fi
    n=$(newest_step)
    echo "kill $kills $where: newest checkpoint step ${n:-none}"
  else
    wait "$pid" || true
    echo "FAIL: the run finished before kill $((kills + 1)) (raise STEPS)"
    exit 1
  fi
done
"$TREX" train --config run.toml --set checkpoint.run_dir=\"killed\" --resume auto >> killed.log 2>&1

fail=0
final=$(printf 'step-%08d' "$STEPS")
for f in model.safetensors optimizer.safetensors; do
  if ! cmp -s "straight/checkpoints/$final/$f" "killed/checkpoints/$final/$f"; then
    echo "FAIL: $final/$f differs from the uninterrupted run"
    fail=1
  fi
done
if ! diff <(losses straight/metrics.jsonl cut-ok) <(losses killed/metrics.jsonl cut-ok) > losses.diff; then
  echo "FAIL: per-step losses differ:"
  head -20 losses.diff
  fail=1
fi
n=$(losses killed/metrics.jsonl cut-ok | wc -l)
[ "$n" -eq "$STEPS" ] || { echo "FAIL: $n steps logged, expected $STEPS"; fail=1; }
if [ "$fail" -ne 0 ]; then
  echo "work files kept in $WORK"
  exit 1
fi
echo "OK: $KILLS SIGKILLs ($in_startup during start-up, $cut_writes cutting a checkpoint write); final checkpoint and all $STEPS losses equal the uninterrupted run bit for bit"
rm -rf "$WORK"
