#!/usr/bin/env bash
# The long stable run of issue 9: configs/reliability-v4.toml (a small DeepSeek-V4 in bf16, 2,000
# steps) on the repository's prose, then its loss plot and a summary: skipped steps, loss spikes,
# non-finite values, first / last losses. Extra arguments go to `trex train` (e.g. --set
# train.steps=200 for a short check).
#   scripts/long_run.sh [BUILD_DIR=build] [trex train options...]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
shift || true
mkdir -p runs/reliability-v4-data
# One document per paragraph of the repository's prose (README, docs/), as CPT JSONL.
python3 - README.md docs/*.md > runs/reliability-v4-data/prose.jsonl <<'PY'
import json, sys
for path in sys.argv[1:]:
    for para in open(path, encoding="utf-8").read().split("\n\n"):
        if len(para.strip()) > 40:
            print(json.dumps({"text": para.strip()}))
PY
rm -rf runs/reliability-v4
start=$(date +%s)
"$BUILD/trex" train --config configs/reliability-v4.toml "$@" 2>&1 | tee runs/reliability-v4.log
secs=$(( $(date +%s) - start ))
"$BUILD/trex" plot runs/reliability-v4 --out runs/reliability-v4/loss.png
python3 - "$secs" <<'PY'
import json, math, sys
rows = [json.loads(l) for l in open("runs/reliability-v4/metrics.jsonl")]
loss = [r["loss"] for r in rows]
bad = [r["step"] for r in rows if r["loss"] is None or not math.isfinite(r["loss"]) or r.get("skipped")]
spikes = [r["step"] for r in rows if r.get("spike")]
ev = [(r["step"], r["eval_loss"]) for r in rows if "eval_loss" in r]
first = sum(loss[:20]) / 20
last = sum(loss[-20:]) / 20
print(f"steps {len(rows)} in {sys.argv[1]} s; non-finite or skipped: {len(bad)} {bad[:5]}; spikes: {len(spikes)} {spikes[:10]}")
print(f"mean loss of steps 1-20 {first:.4f}, of the last 20 {last:.4f}; eval loss {ev[0][1]:.4f} (step {ev[0][0]}) -> {ev[-1][1]:.4f} (step {ev[-1][0]})")
PY
