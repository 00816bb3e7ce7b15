#!/usr/bin/env bash
# DeepSeek-V4 generation speed: trex's cached decoding (the KV cache of model/v4_decode.h) against
# recomputing the whole row per token (the path before the cache) and against transformers'
# generate, on one small random-init V4 (tools/bench/decode_v4_hf.py: CONFIG), greedy, one thread
# each, at 512 and 4096 tokens of context. Each figure: decode tokens/s after the prefill. Writes
# the JSON lines under OUT and a markdown table (machine, date, commit, command, rows) to
# benchmarks/results/<date>-<HHMM>-decode-v4.md.
#
# usage: tools/bench/decode_v4.sh [--trex PATH] [--python PATH] [--out DIR] [--new N]
#   --new N: tokens generated per cached / transformers run (default 128); the recompute runs
#   generate N / 8 (512) and N / 32 (4096) tokens, they are slow by design. One more cached run
#   decodes 4 prompts at once (--batch 4: tokens/s of all four).
set -euo pipefail
cd "$(dirname "$0")/../.."
TREX=build/trex; PY=.venv/bin/python; OUT=runs/bench-decode/$(date -u +%F-%H%M); NEW=128
while [ $# -gt 0 ]; do
  case $1 in
    --trex) TREX=$2; shift 2 ;;
    --python) PY=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --new) NEW=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "decode_v4.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
export OMP_NUM_THREADS=1 TREX_THREADS=1
mkdir -p "$OUT"
MODEL=$OUT/model
[ -f "$MODEL/config.json" ] || "$PY" tools/bench/decode_v4_hf.py --make "$MODEL" >"$OUT/make.log" 2>&1
STAMP=$(date -u +%F-%H%M)
COMMIT=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . || echo "+dirty")
CPU=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
row() {  # name, command...
  local name=$1; shift
  echo "+ $*" >&2
  "$@" 2>"$OUT/$name.err" | tail -n 1 >"$OUT/$name.json"
  cat "$OUT/$name.json"
}
ROWS=()
for C in 512 4096; do
  RN=$(( C == 512 ? NEW / 8 : NEW / 32 )); [ "$RN" -ge 1 ] || RN=1
  cache=$(row "trex-cache-$C" "$TREX" bench decode --model "$MODEL" --context "$C" --new "$NEW" -t 1)
  batch=$(row "trex-cache-batch4-$C" "$TREX" bench decode --model "$MODEL" --context "$C" --new "$NEW" --batch 4 -t 1)
  reco=$(row "trex-recompute-$C" "$TREX" bench decode --model "$MODEL" --context "$C" --new "$RN" --recompute -t 1)
  hf=$(row "hf-generate-$C" "$PY" tools/bench/decode_v4_hf.py --model "$MODEL" --context "$C" --new "$NEW" --threads 1)
  ROWS+=("$C|$cache|$batch|$reco|$hf")
done
MD=benchmarks/results/$STAMP-decode-v4.md
"$PY" - "$MD" "$STAMP" "$COMMIT" "$CPU" "$0 $*" "${ROWS[@]}" <<'EOF'
import json, sys
md, stamp, commit, cpu, cmd, *rows = sys.argv[1:]
out = [f"# DeepSeek-V4 decoding: trex cache vs recompute vs transformers generate", "",
       f"- machine: {cpu}, 1 thread each (OMP_NUM_THREADS=1, -t 1)", f"- date: {stamp} UTC, commit {commit}",
       f"- command: `{cmd.strip()}`", "- model: tools/bench/decode_v4_hf.py CONFIG (random init, fp32), greedy", "",
       "| context | trex cached tok/s | trex cached, 4 prompts at once, tok/s | trex recompute tok/s | transformers generate tok/s | cached / recompute | cached / transformers | trex prefill s | transformers prefill s |",
       "|---|---|---|---|---|---|---|---|---|"]
for r in rows:
    c, a, a4, b, h = r.split("|")
    a, a4, b, h = json.loads(a), json.loads(a4), json.loads(b), json.loads(h)
    ta, t4, tb, th = a["decode_tokens_per_s"], a4["decode_tokens_per_s"], b["decode_tokens_per_s"], h["decode_tokens_per_s"]
    out.append(f"| {c} | {ta:.1f} ({a['new']} tokens) | {t4:.1f} | {tb:.2f} ({b['new']} tokens) | {th:.1f} ({h['new']} tokens) | "
               f"{ta / tb:.0f}x | {ta / th:.2f}x | {a['prefill_s']:.2f} | {h['prefill_s']:.2f} |")
open(md, "w").write("\n".join(out) + "\n")
print("\n".join(out))
EOF
