#!/usr/bin/env bash
# Dead or slow (issues 5 and 34): `mpirun -np 2 trex train` with parallel.peer_timeout_s = 2 and
# parallel.watchdog_s = 8, two runs:
#  - stopped: rank 1 stopped with SIGSTOP after step 3 (its heartbeat silent too, as a hung
#    process or a lost node). Rank 0's heartbeat (parallel/heartbeat.h) must end the whole job
#    within 60 s, naming the silent peer rank and parallel.peer_timeout_s, and before the watchdog.
#  - stuck: rank 1 stops before step 4 with its heartbeat still answering (TREX_INJECT_HANG=1:4:
#    a deadlocked or very slow step). The heartbeat must not fire; the watchdog (train/loop.cpp)
#    ends the job after parallel.watchdog_s, naming it.
# In both, every process must be gone and the launcher must exit non-zero.
#
#   tests/faults/rank_hang.sh TREX_BINARY MPIEXEC
set -euo pipefail
TREX=$(realpath "$1")
MPIEXEC=${2:-mpirun}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/trex_rank_hang.XXXXXX")
cd "$WORK"
# Data and run config (a tiny bf16 MoE, one thread): tests/faults/tiny_run.sh.
source "$ROOT/tests/faults/tiny_run.sh"
tiny_run 100000 0 1

# run NAME STOP(yes/no) [mpirun args...]: starts the job, waits for step 3, stops rank 1 when asked,
# waits (60 s at most) for every process to end; sets ms (from step 3 to the end) and rc.
run() {
  local name=$1 stop=$2
  shift 2
  "$MPIEXEC" --allow-run-as-root --oversubscribe -np 2 "$@" "$TREX" train --config run.toml \
    --set checkpoint.run_dir=\"$name\" --set parallel.watchdog_s=8 --set parallel.peer_timeout_s=2 > $name.log 2>&1 &
  launcher=$!
  for _ in $(seq 600); do  # up to 60 s for the ranks to start and log step 3
    grep -q '^step 3/' $name.log 2>/dev/null && break
    sleep 0.1
  done
  grep -q '^step 3/' $name.log || { echo "FAIL: $name: the run did not reach step 3"; cat $name.log; kill -9 $launcher; exit 1; }
  ranks=$(pgrep -P "$launcher" -f "trex train" | sort -n)
  victim=$(echo "$ranks" | tail -1)
  t0=$(date +%s%N)
  if [ "$stop" = yes ]; then echo "$name: ranks: $(echo $ranks); stopping pid $victim"; kill -STOP "$victim"; fi
  rc=0
  for _ in $(seq 600); do
    alive=0
    for p in $ranks; do kill -0 "$p" 2>/dev/null && alive=1; done
    kill -0 "$launcher" 2>/dev/null && alive=1
    [ "$alive" -eq 0 ] && break
    sleep 0.1
  done
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  if [ "$alive" -ne 0 ]; then
    echo "FAIL: $name: processes still running 60 s after step 3"
    tail -5 $name.log
    pkill -9 -P "$launcher" || true
    kill -9 "$launcher" || true
    exit 1
  fi
  wait "$launcher" || rc=$?
  if [ "$rc" -eq 0 ]; then echo "FAIL: $name: the launcher exited 0"; tail -5 $name.log; exit 1; fi
}

run stopped yes
if ! grep -Eq 'rank 0: peer rank 1 \(host [^)]*\) has not answered for [0-9]+ s \(parallel.peer_timeout_s = 2' stopped.log; then
  echo "FAIL: stopped: no heartbeat error naming peer rank 1 in the output:"
  tail -20 stopped.log
  exit 1
fi
if grep -q 'no training step finished' stopped.log; then echo "FAIL: stopped: the watchdog fired first"; tail -20 stopped.log; exit 1; fi
echo "OK: stopped: all processes gone ${ms} ms after one rank stopped (launcher exit $rc): $(grep -Eo 'peer rank 1 .*has not answered for [0-9]+ s' stopped.log | head -1)"

TREX_INJECT_HANG=1:4 run stuck no -x TREX_INJECT_HANG=1:4
if ! grep -Eq 'rank [0-9]+: no training step finished in [0-9]+ s \(parallel.watchdog_s = 8' stuck.log; then
  echo "FAIL: stuck: no watchdog error in the output:"
  tail -20 stuck.log
  exit 1
fi
if grep -q 'peer rank' stuck.log; then echo "FAIL: stuck: the heartbeat fired on a live peer"; tail -20 stuck.log; exit 1; fi
((ms >= 6000)) || { echo "FAIL: stuck: ended ${ms} ms after step 3, before the watchdog's 8 s"; exit 1; }
echo "OK: stuck: the heartbeat kept quiet, the watchdog ended the job ${ms} ms after step 3 (launcher exit $rc)"
rm -rf "$WORK"
