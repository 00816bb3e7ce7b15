#!/usr/bin/env bash
# Fault injection (issue 27, graceful stop): a data-parallel run on 2 MPI ranks gets SIGTERM on one
# of its ranks (chosen at random) after a random step. Every rank must finish that step, agree to
# stop at the same step, write a checkpoint of it and exit with code 75; `--resume auto` then runs
# to the end. The per-step losses and the final checkpoint must equal an uninterrupted run bit for
# bit, and the checkpoint written on the signal must hold at least the step that was logged when
# the signal was sent (no more than the step in progress is lost).
# First, the old behaviour is reproduced with train.exit_signal_save = false: the same SIGTERM ends
# the job without a checkpoint and every step logged so far is lost (that run saves only at its end,
# so the demonstration does not depend on where between two periodic checkpoints the signal lands).
#
#   tests/faults/sigterm_resume.sh TREX_BINARY [SEED=1]
#
# Run by CTest as faults_sigterm_resume. Work files go to a temporary directory (removed on
# success, kept and named on failure).
set -euo pipefail
TREX=$(realpath "$1")
SEED=${2:-1}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/trex_sigterm.XXXXXX")
cd "$WORK"
RANDOM=$SEED
STEPS=40
EVERY=10
MPI=(mpirun --allow-run-as-root --oversubscribe -np 2)

# Data and run config: tests/faults/tiny_run.sh.
source "$ROOT/tests/faults/tiny_run.sh"
tiny_run $STEPS $EVERY 2

newest_step() { ls "$1/checkpoints" 2>/dev/null | sed -n 's/^step-0*\([0-9][0-9]*\)$/\1/p' | sort -n | tail -1 || true; }
logged_step() { tail -n 1 "$1/metrics.jsonl" 2>/dev/null | sed -n 's/^{.*"step":\([0-9]*\).*/\1/p' || true; }
# The pid of rank $2 among the children of mpirun $1.
rank_pid() {
  for p in $(pgrep -P "$1"); do
    if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
      echo "$p"
      return
    fi
  done
}
# Starts the run in directory $1 (extra --set in $3...), waits until it has logged step $2, sends
# SIGTERM to one rank and waits for mpirun; prints "<rank> <logged step at the signal> <exit code>".
run_and_signal() {
  local dir=$1 target=$2
  shift 2
  "${MPI[@]}" "$TREX" train --config run.toml --set checkpoint.run_dir=\""$dir"\" "$@" >> "$dir.log" 2>&1 &
  local mpid=$!
  while kill -0 "$mpid" 2>/dev/null; do
    s=$(logged_step "$dir")
    [ -n "$s" ] && ((s >= target)) && break
    sleep 0.01
  done
  local rank=$((RANDOM % 2)) pid=""
  pid=$(rank_pid "$mpid" "$rank")
  [ -n "$pid" ] || { wait "$mpid" || true; echo "none 0 0"; return; }
  local at
  at=$(logged_step "$dir")
  kill -TERM "$pid"
  local rc=0
  wait "$mpid" || rc=$?
  echo "$rank $at $rc"
}

"${MPI[@]}" "$TREX" train --config run.toml --set checkpoint.run_dir=\"straight\" > straight.log 2>&1 ||
  fail "the uninterrupted run failed (straight.log)"

# 1. The old behaviour: no handler, the signal ends the job and the steps logged so far are gone
#    (checkpoint.every = 0: the only checkpoint would be the last step's).
target=$((EVERY + 3))
read -r rank at rc < <(run_and_signal old "$target" --set train.exit_signal_save=false --set checkpoint.every=0)
[ "$rank" != none ] || fail "exit_signal_save=false: the run ended before the signal"
n=$(newest_step old)
echo "exit_signal_save = false: SIGTERM to rank $rank after step $at: exit code $rc, newest checkpoint step ${n:-none}"
((rc != 0 && rc != 75)) || fail "exit_signal_save=false: exit code $rc, expected death by the signal"
((${n:-0} < at)) || fail "exit_signal_save=false: checkpoint of step $n, the old behaviour loses steps since step $at"

# 2. The graceful stop, at a random step away from the periodic checkpoints, in the first half of
#    the run: on a busy machine several steps pass between the target and the signal.
target=$((2 + RANDOM % (STEPS / 2)))
((target % EVERY == 0)) && target=$((target + 1))
read -r rank at rc < <(run_and_signal stopped "$target")
[ "$rank" != none ] || fail "the run ended before the signal"
n=$(newest_step stopped)
echo "SIGTERM to rank $rank after step $at: exit code $rc, newest checkpoint step ${n:-none}"
((rc == 75)) || fail "exit code $rc after SIGTERM, expected 75 (stopped.log)"
((${n:-0} >= at)) || fail "the checkpoint holds step ${n:-none} but step $at had been logged: steps were lost"
((n < STEPS)) || fail "the run went on to the end instead of stopping"
grep -q "stopped by SIGTERM after step $n " stopped.log || fail "no 'stopped by SIGTERM after step $n' message"
[ "$(logged_step stopped)" = "$n" ] || fail "the last logged step $(logged_step stopped) is not the checkpoint's $n"

"${MPI[@]}" "$TREX" train --config run.toml --set checkpoint.run_dir=\"stopped\" --resume auto >> stopped.log 2>&1 ||
  fail "the resumed run failed (stopped.log)"
grep -q "resumed from .*step-$(printf '%08d' "$n")" stopped.log || fail "the resumed run did not start from step $n"

final=$(printf 'step-%08d' "$STEPS")
for f in model.safetensors optimizer.safetensors; do
  cmp -s "straight/checkpoints/$final/$f" "stopped/checkpoints/$final/$f" ||
    fail "$final/$f differs from the uninterrupted run"
done
if ! diff <(losses straight/metrics.jsonl cut-ok) <(losses stopped/metrics.jsonl cut-ok) > losses.diff; then
  head -20 losses.diff
  fail "per-step losses differ from the uninterrupted run"
fi
[ "$(losses stopped/metrics.jsonl cut-ok | wc -l)" -eq "$STEPS" ] || fail "not all $STEPS steps logged"
echo "OK: SIGTERM to rank $rank after step $at stopped both ranks at step $n with a checkpoint (exit 75); resumed, all $STEPS losses and the final checkpoint equal the uninterrupted run bit for bit"
rm -rf "$WORK"
