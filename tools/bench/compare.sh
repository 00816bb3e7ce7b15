#!/usr/bin/env bash
# Runs trex and the PyTorch peers (eager + bf16 autocast, and torch.compile) on one config in the
# same run, same threads, batch, sequence and precision, and prints a markdown table with the
# ratios. Usage: tools/bench/compare.sh [CONFIG] (env: STEPS=5 measured steps, PEER_STEPS=STEPS
# measured steps of the peers (on a 2-core machine an eager step takes minutes), THREADS,
# OUT=out/bench, PEERS="eager compile").
set -euo pipefail
cd "$(dirname "$0")/../.."
CONFIG=${1:-configs/bench-v3.toml}
STEPS=${STEPS:-5}
PEER_STEPS=${PEER_STEPS:-$STEPS}
THREADS=${THREADS:-$(nproc)}
OUT=${OUT:-out/bench}
PEERS=${PEERS:-"eager compile"}
mkdir -p "$OUT"
export TREX_THREADS=$THREADS
echo "[compare] $(date -u +%FT%TZ) config=$CONFIG steps=$STEPS peer_steps=$PEER_STEPS threads=$THREADS" >&2
build/trex bench peak --threads "$THREADS" | tee "$OUT/peak.json" >&2
build/trex bench step --config "$CONFIG" --steps "$STEPS" --warmup 1 \
  --peak-gflops "$(python3 -c "import json;p=json.load(open('$OUT/peak.json'));print(p['best_gflops'])")" \
  | tee "$OUT/trex.json" >&2
for mode in $PEERS; do
  warm=1; [ "$mode" = compile ] && warm=2
  .venv/bin/python tools/peer/peer_bench.py "$CONFIG" --steps $((PEER_STEPS + warm)) --warmup $warm \
    --threads "$THREADS" --mode "$mode" | tee "$OUT/peer_$mode.json" >&2
done
python3 - "$OUT" "$PEERS" <<'PY'
import json, sys
out, peers = sys.argv[1], sys.argv[2].split()
peak = json.load(open(f"{out}/peak.json"))
t = json.load(open(f"{out}/trex.json"))
fpt, pk = t["model_flops_per_token"], t["peak_gflops"]
rows = [("trex", t)] + [(f"pytorch {m}", json.load(open(f"{out}/peer_{m}.json"))) for m in peers]
print(f"peak: fp32 FMA {peak['fp32_gflops']:.1f} GFLOP/s, bf16 dot {peak['bf16_gflops']:.1f} GFLOP/s, "
      f"AMX bf16 {peak.get('amx_bf16_gflops', 0):.1f} GFLOP/s, best {peak['best_gflops']:.1f} ({peak['threads']} threads)")
print(f"model FLOPs/token {fpt:.4g} (6 x {t['active_params']} active params + causal attention), "
      f"batch {t['batch']} x seq {t['seq']}, {t['precision']}, {t['threads']} threads")
print("| impl | step ms (median) | step ms (min) | tokens/s | MFU (vs best peak) | trex speedup | peak RSS MB |")
print("|---|---|---|---|---|---|---|")
for name, r in rows:
    tps = r["tokens_per_s"]
    print(f"| {name} | {r['step_ms_median']:.0f} | {r['step_ms_min']:.0f} | {tps:.0f} | "
          f"{100 * fpt * tps / (pk * 1e9):.1f}% | {t['tokens_per_s'] / tps:.2f}x | {r['peak_rss_mb']:.0f} |")
PY
