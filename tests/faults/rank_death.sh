#!/usr/bin/env bash
# A rank that dies in a data-parallel run (issue 5): `mpirun -np 2 trex train`, rank 1 killed with
# SIGKILL after a few steps; every process must be gone within 60 s and the launcher's output must
# name the dead rank. (OpenMPI's mpirun aborts the job when a process exits abnormally; a rank that
# fails with an error calls MPI_Abort itself, cli/cmd_train.cpp.)
#
#   tests/faults/rank_death.sh TREX_BINARY MPIEXEC
set -euo pipefail
TREX=$(realpath "$1")
MPIEXEC=${2:-mpirun}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/trex_rank_death.XXXXXX")
cd "$WORK"
# Data and run config (a tiny bf16 MoE, one thread): tests/faults/tiny_run.sh.
source "$ROOT/tests/faults/tiny_run.sh"
tiny_run 100000 0 1

"$MPIEXEC" --allow-run-as-root --oversubscribe -np 2 "$TREX" train --config run.toml \
  --set checkpoint.run_dir=\"run\" > mpi.log 2>&1 &
launcher=$!
for _ in $(seq 600); do  # up to 60 s for the ranks to start and log step 3
  grep -q '^step 3/' mpi.log 2>/dev/null && break
  sleep 0.1
done
grep -q '^step 3/' mpi.log || { echo "FAIL: the run did not reach step 3"; cat mpi.log; kill -9 $launcher; exit 1; }
ranks=$(pgrep -P "$launcher" -f "trex train" | sort -n)
victim=$(echo "$ranks" | tail -1)
echo "ranks: $(echo $ranks); killing pid $victim"
t0=$(date +%s%N)
kill -9 "$victim"
rc=0
for _ in $(seq 600); do
  alive=0
  for p in $ranks; do kill -0 "$p" 2>/dev/null && alive=1; done
  kill -0 "$launcher" 2>/dev/null && alive=1
  [ "$alive" -eq 0 ] && break
  sleep 0.1
done
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
wait "$launcher" || rc=$?
if [ "$alive" -ne 0 ]; then
  echo "FAIL: processes still running 60 s after the kill"
  pkill -9 -P "$launcher" || true
  kill -9 "$launcher" || true
  exit 1
fi
if ! grep -Eq 'rank [0-9]+ .*(signal 9|Killed)' mpi.log; then
  echo "FAIL: the launcher's output does not name the dead rank:"
  tail -20 mpi.log
  exit 1
fi
echo "OK: all processes gone ${ms} ms after SIGKILL of one rank (launcher exit $rc): $(grep -Eo 'process rank [0-9]+ [^.]*' mpi.log | head -1)"
rm -rf "$WORK"
