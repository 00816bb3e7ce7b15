# Shared by tools/bench/indexer_loss_demo.sh (DeepSeek-V3.2) and indexer_loss_demo_v4.sh
# (DeepSeek-V4): argument parsing, the work directory, the data (fortunes joined into documents),
# the tokenizer, the run settings and the `train` / `last` helpers. Sourced, not run.
#
# ild_setup NAME SLUG "$@": parses --out --trex --threads --md --seed (NAME is the script's file
# name, for messages and --help; SLUG names the default work directory runs/SLUG and the markdown
# benchmarks/results/<date>-<HHMM>-<SLUG without "-demo">.md), checks the tools, makes and enters
# the work directory. Sets REPO OUT TREX THREADS MD SEED CMD STAMP COMMIT CPU LOAD0 T0.

ild_die() { echo "$ILD_NAME: $*" >&2; exit 2; }

ild_setup() {
  ILD_NAME=$1; local slug=$2 script=$3; shift 3
  REPO="$(cd "$(dirname "$script")/../.." && pwd)"
  OUT="runs/$slug"; TREX=""; THREADS=1; MD=""; SEED=7; CMD="tools/bench/$ILD_NAME $*"
  while [ $# -gt 0 ]; do
    case "$1" in
      --out) OUT="$2"; shift 2 ;;
      --trex) TREX="$2"; shift 2 ;;
      --threads) THREADS="$2"; shift 2 ;;
      --md) MD="$2"; shift 2 ;;
      --seed) SEED="$2"; shift 2 ;;
      -h|--help) sed -n '2,/^set -euo pipefail/{/^#/p}' "$script"; exit 0 ;;
      *) ild_die "unknown argument $1 (see --help)" ;;
    esac
  done
  [ -z "$TREX" ] && TREX="$REPO/build/trex"
  [ -x "$TREX" ] || ild_die "no trex binary at $TREX (build it, or pass --trex PATH)"
  TREX="$(cd "$(dirname "$TREX")" && pwd)/$(basename "$TREX")"
  STAMP=$(date -u +%F-%H%M)
  COMMIT=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$REPO" diff --quiet HEAD -- . 2>/dev/null || echo "+dirty")
  CPU=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
  LOAD0=$(cut -d' ' -f1 /proc/loadavg)
  [ -z "$MD" ] && MD="$REPO/benchmarks/results/$STAMP-${slug/-demo/}.md"
  MD="$(mkdir -p "$(dirname "$MD")" && cd "$(dirname "$MD")" && pwd)/$(basename "$MD")"
  FORTUNES=/usr/share/games/fortunes
  [ -d "$FORTUNES" ] || ild_die "needs the Debian package fortunes (apt-get install fortunes)"
  command -v python3 >/dev/null || ild_die "needs python3"
  local mark=".${slug//-/_}"
  if [ -d "$OUT" ] && [ -n "$(ls -A "$OUT")" ] && [ ! -e "$OUT/$mark" ]; then
    ild_die "$OUT is not empty and not this script's work directory; pass another --out"
  fi
  rm -rf "$OUT"; mkdir -p "$OUT/logs"; touch "$OUT/$mark"
  OUT="$(cd "$OUT" && pwd)"
  cd "$OUT"
  T0=$(date +%s)
}

# ild_data VOCAB DOCS DOC_CHARS EVAL_DOCS: train.jsonl, eval.jsonl (held out) and tok/ (a BPE of
# VOCAB tokens trained on the training documents).
ild_data() {
  local vocab=$1
  python3 - "$FORTUNES" "$2" "$3" "$4" <<'PY'
import json, os, sys
root, n_docs, doc_chars, n_eval = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
fortunes, seen = [], set()
for name in sorted(os.listdir(root)):  # as recipes/or/prepare.py base
    path = os.path.join(root, name)
    if name.endswith((".dat", ".u8")) or os.path.islink(path) or not os.path.isfile(path) or name in ("art", "ascii-art"):
        continue
    for part in open(path, encoding="utf-8", errors="replace").read().split("\n%\n"):
        p = part.strip("\n%")
        if len(p.strip()) >= 20 and p not in seen:
            seen.add(p); fortunes.append(p)
docs, cur = [], []
for f in fortunes:
    cur.append(f)
    if sum(len(c) + 2 for c in cur) >= doc_chars:
        docs.append("\n\n".join(cur)); cur = []
    if len(docs) == n_docs:
        break
ev = docs[::max(1, len(docs) // n_eval)][:n_eval]
tr = [d for d in docs if d not in ev]
for name, ds in (("train.jsonl", tr), ("eval.jsonl", ev)):
    with open(name, "w", encoding="utf-8") as o:
        for d in ds:
            o.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
open("tok_corpus.txt", "w", encoding="utf-8").write("\n\n".join(tr))
print(f"data: {len(tr)} train + {len(ev)} held-out documents of >= {doc_chars} characters "
      f"({sum(map(len, tr)) / 1e3:.0f} + {sum(map(len, ev)) / 1e3:.0f} kB)")
PY
  "$TREX" tokenizer train --files tok_corpus.txt --vocab-size "$vocab" --out tok --threads "$THREADS" \
    --special-tokens "<｜begin▁of▁sentence｜>" "<｜end▁of▁sentence｜>" --bos "<｜begin▁of▁sentence｜>" >logs/tokenizer.log 2>&1 ||
    { tail -5 logs/tokenizer.log >&2; exit 1; }
}

# ild_configs: from arch.toml (the script's [model]) and SHORT BASE_STEPS BATCH PROBE_STEPS, writes
# base.toml (random init, the short-context run) and cpt.toml (from the checkpoint --set
# model.path names).
ild_configs() {
  cat > run.toml <<TOML
[data]
mode = "cpt"
train = ["train.jsonl"]
eval = ["eval.jsonl"]
tokenizer = "tok/tokenizer.json"
seq_len = $SHORT
cache_dir = "none"

[train]
steps = $BASE_STEPS
batch_size = $BATCH
precision = "fp32"
threads = $THREADS
seed = $SEED
eval_every = $BASE_STEPS
eval_batches = $PROBE_STEPS

[optim]
lr = 3e-3
min_lr = 3e-4
warmup_steps = 10
schedule = "cosine"
weight_decay = 0.05

[checkpoint]
run_dir = "base"
every = 0
keep = 1

[log]
every = 10
progress = "lines"
TOML
  cat arch.toml run.toml > base.toml                                    # random init from [model]
  { printf '[model]\npath = "base"  # set with --set\n\n'; cat run.toml; } > cpt.toml   # from a checkpoint
}

# train TOML NAME ARGS...: trex train --config TOML ARGS (run_dir NAME), log in logs/NAME.log
train() {
  local toml=$1 name=$2; shift 2
  local t=$(date +%s)
  "$TREX" train --config "$toml" --set "checkpoint.run_dir=$name" "$@" >"logs/$name.log" 2>&1 ||
    { echo "[$name] failed; the end of logs/$name.log:" >&2; tail -20 "logs/$name.log" >&2; exit 1; }
  echo "[$name] ok in $(( $(date +%s) - t ))s"
}
last() { ls -d "$1"/checkpoints/step-* | sort | tail -1; }

# probe NAME ARGS...: NAME's last checkpoint trained on the held-out documents at seq_len LONG for
# PROBE_STEPS steps with lr 0 and no bias update (ARGS: what the probe measures); fails if the
# probe changed the weights.
probe() {
  local name=$1; shift
  local ck; ck="$(last "$name")"
  train cpt.toml "probe_$name" --set "model.path=$ck" --set "data.seq_len=$LONG" --set 'data.train=["eval.jsonl"]' \
    --set "train.steps=$PROBE_STEPS" --set "train.eval_every=0" "$@" --set optim.lr=0 --set optim.min_lr=0 \
    --set optim.warmup_steps=0 --set train.bias_update_gamma=0 --set log.every=1
  cmp -s "$ck/model.safetensors" "$(last "probe_$name")/model.safetensors" ||
    { echo "probe of $name changed the weights ($ck)" >&2; exit 1; }
}
