#!/usr/bin/env bash
# A rank that hangs in a data-parallel run (issue 5): `mpirun -np 2 trex train` with
# parallel.watchdog_s = 4, rank 1 stopped with SIGSTOP after a few steps (alive but making no
# progress, as a hung process or a lost node). The other rank waits in a collective; its watchdog
# (train/loop.cpp) must end the whole job: every process gone within 60 s, the error naming the
# rank that reports it and the watchdog setting.
#
#   tests/faults/rank_hang.sh TREX_BINARY MPIEXEC
set -euo pipefail
TREX=$(realpath "$1")
MPIEXEC=${2:-mpirun}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/trex_rank_hang.XXXXXX")
cd "$WORK"
cat "$ROOT/README.md" "$ROOT"/docs/*.md > data.txt
cat > run.toml <<TOML
[model]
model_type = "deepseek_v3"
vocab_size = 3001
hidden_size = 40
num_hidden_layers = 2
first_k_dense_replace = 1
intermediate_size = 56
moe_intermediate_size = 16
n_routed_experts = 4
n_shared_experts = 1
num_experts_per_tok = 2
num_attention_heads = 2
q_lora_rank = 16
kv_lora_rank = 12
qk_nope_head_dim = 8
qk_rope_head_dim = 4
v_head_dim = 8

[data]
train = ["data.txt"]
tokenizer = "$ROOT/tests/data/tokenizer/trex_trained.json"
mode = "cpt"
seq_len = 64
cache_dir = "none"

[train]
batch_size = 2
steps = 100000
threads = 1

[log]
progress = "lines"
TOML

"$MPIEXEC" --allow-run-as-root --oversubscribe -np 2 "$TREX" train --config run.toml \
  --set checkpoint.run_dir=\"run\" --set parallel.watchdog_s=4 > mpi.log 2>&1 &
launcher=$!
for _ in $(seq 600); do  # up to 60 s for the ranks to start and log step 3
  grep -q '^step 3/' mpi.log 2>/dev/null && break
  sleep 0.1
done
grep -q '^step 3/' mpi.log || { echo "FAIL: the run did not reach step 3"; cat mpi.log; kill -9 $launcher; exit 1; }
ranks=$(pgrep -P "$launcher" -f "trex train" | sort -n)
victim=$(echo "$ranks" | tail -1)
echo "ranks: $(echo $ranks); stopping pid $victim"
t0=$(date +%s%N)
kill -STOP "$victim"
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
  echo "FAIL: processes still running 60 s after one rank stopped"
  tail -5 mpi.log
  pkill -9 -P "$launcher" || true
  kill -9 "$launcher" || true
  exit 1
fi
wait "$launcher" || rc=$?
if [ "$rc" -eq 0 ]; then echo "FAIL: the launcher exited 0"; tail -5 mpi.log; exit 1; fi
if ! grep -Eq 'rank [0-9]+: no training step finished in [0-9]+ s \(parallel.watchdog_s = 4' mpi.log; then
  echo "FAIL: no watchdog error in the output:"
  tail -20 mpi.log
  exit 1
fi
echo "OK: all processes gone ${ms} ms after one rank stopped (launcher exit $rc): $(grep -Eo 'rank [0-9]+: no training step finished in [0-9]+ s' mpi.log | head -1)"
rm -rf "$WORK"
