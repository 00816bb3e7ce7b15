#!/usr/bin/env bash
# The longest context `trex plan` answers for this machine, then trained at: calibrates this
# machine (`trex bench calibrate`, a temporary file), asks `trex plan --cluster cpu-this
# --longest-context` for one rank, runs one step at that seq (tools/bench/long_context.sh: peak RSS
# against the estimate), and shows that the start-up memory check refuses the next multiple.
#
#   tools/bench/longest_context.sh [TREX=build/trex] [CONFIG=configs/bench-v4.toml]
#                                  [RECOMPUTE=full] [STEP=1024]
# MTP is planned as the config trains it (train.mtp_loss_weight > 0). Drop the page cache first
# (the check compares with MemAvailable).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TREX=$(realpath "${1:-$ROOT/build/trex}")
CONFIG=$(realpath "${2:-$ROOT/configs/bench-v4.toml}")
RECOMPUTE=${3:-full}
STEP=${4:-1024}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
TREX_THREADS=2 "$TREX" bench calibrate --out "$OUT/cal.json" --threads 2 > "$OUT/cal.log" 2>&1 \
  || { tail -5 "$OUT/cal.log"; exit 1; }
MTP=$(python3 - "$CONFIG" <<'PY'
import sys, tomllib
c = tomllib.load(open(sys.argv[1], "rb"))
print(1 if c.get("model", {}).get("num_nextn_predict_layers", 0) > 0 and c.get("train", {}).get("mtp_loss_weight", 0) > 0 else 0)
PY
)
"$TREX" plan --model "$CONFIG" --cluster cpu-this --calibration "$OUT/cal.json" --devices 1 --longest-context \
  --context-step "$STEP" --layout "recompute=$RECOMPUTE,mtp=$MTP" > "$OUT/plan.txt"
"$TREX" plan --model "$CONFIG" --cluster cpu-this --calibration "$OUT/cal.json" --devices 1 --longest-context \
  --context-step "$STEP" --layout "recompute=$RECOMPUTE,mtp=$MTP" --json > "$OUT/plan.json"
cat "$OUT/plan.txt"
python3 -c "import json; print('device memory (memory.available_gb when calibrated):', json.load(open('$OUT/cal.json'))['memory'])"
SEQ=$(python3 -c "import json; print(json.load(open('$OUT/plan.json'))['longest'])")
[ "$SEQ" -gt 0 ] || { echo "trex plan: no seq fits"; exit 1; }
echo "planned longest context: $SEQ tokens (recompute $RECOMPUTE)"
"$ROOT/tools/bench/long_context.sh" "$TREX" "$CONFIG" "$SEQ" 1 "$RECOMPUTE" "" 0
NEXT=$((SEQ + STEP))
if TREX_THREADS=2 timeout 30 "$TREX" bench step --config "$CONFIG" --steps 1 --warmup 0 --set "data.seq_len=$NEXT" \
     --set "train.recompute=$RECOMPUTE" --set train.threads=2 > "$OUT/next.log" 2>&1; then
  echo "seq $NEXT: the start-up check let it start (and it finished)"
elif grep -q "the run needs about" "$OUT/next.log"; then
  echo "seq $NEXT: refused by the start-up check: $(grep -o 'the run needs about [^(]*' "$OUT/next.log")"
else
  echo "seq $NEXT: the start-up check let it start (stopped after 30 s)"
fi
