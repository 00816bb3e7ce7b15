#!/usr/bin/env bash
# The OR recipe end to end (issue 6): base model on general English -> CPT on the OR corpus -> SFT
# on statement -> LP file chats -> zero-shot Pass@1 of all three on the same held-out test set.
#
#   recipes/or/run.sh [--small] [--out DIR] [--trex PATH] [--threads N]
#
#   --small     the few-minute variant (make demo): tiny model, few steps, 12 test problems
#   --out DIR   where everything goes (default runs/or, or runs/or-small with --small)
#   --trex P    the trex binary (default build/trex, else trex on PATH)
#   --threads N threads for every trex command (default: TREX_THREADS, else all cores)
#
# Stages (each skipped when its output exists; logs in OUT/logs/STAGE.log, times in OUT/times.tsv):
#   a. corpus     general English text from the Debian package `fortunes` -> OUT/data/base.jsonl
#   b. or-gen     trex or gen -> OUT/or (cpt.jsonl, sft.jsonl, test.jsonl); subsets in OUT/data
#   c. tokenizer  byte-level BPE on base + OR text with DeepSeek's chat tokens -> OUT/tokenizer
#   d. base       DeepSeek-V3-shaped MoE from random weights on the base corpus -> OUT/base
#   e. cpt        CPT of the base checkpoint on the OR corpus -> OUT/cpt
#   f. sft        SFT of the CPT checkpoint on statement -> LP chats -> OUT/sft
#   f2. sft2      more SFT rounds (SFT_ROUNDS, full run only), each from the last round's checkpoint
#                 with a fresh, lower cosine schedule and a new data order -> OUT/sft2, ...
#   g. eval       trex or eval --model for base, CPT, CPT+SFT -> OUT/eval, OUT/pass_at_1.md
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
SMALL=0
OUT=""
TREX=""
THREADS="${TREX_THREADS:-0}"
while [ $# -gt 0 ]; do
  case "$1" in
    --small) SMALL=1; shift ;;
    --out) OUT="$2"; shift 2 ;;
    --trex) TREX="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo pipefail/{/^#/p}' "$0"; exit 0 ;;  # the comment block above
    *) echo "run.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ -z "$TREX" ]; then
  if [ -x "$REPO/build/trex" ]; then TREX="$REPO/build/trex"; else TREX="$(command -v trex || true)"; fi
fi
[ -n "$TREX" ] && [ -x "$TREX" ] || { echo "run.sh: no trex binary (build it, or pass --trex PATH)" >&2; exit 2; }
TREX="$(cd "$(dirname "$TREX")" && pwd)/$(basename "$TREX")"
[ -z "$OUT" ] && OUT="runs/or$([ $SMALL = 1 ] && echo -small)"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

# ---- sizes: full vs --small (the .toml files hold the full run's values) ----------------------
if [ $SMALL = 1 ]; then
  OR_N=900; TEST_FRAC=0.1; EVAL_N=12; CPT_DOCS=300; SFT_SAMPLES=300; VOCAB=1536
  BASE_STEPS=30; CPT_STEPS=40; SFT_STEPS=80; BATCH=2; MAX_TOKENS=256
  SFT_ROUNDS=()
  MODEL_SET=(--set model.hidden_size=128 --set model.num_hidden_layers=3 --set model.intermediate_size=320
             --set model.moe_intermediate_size=64 --set model.num_attention_heads=4 --set model.q_lora_rank=64 --set model.kv_lora_rank=48
             --set model.qk_nope_head_dim=24 --set model.qk_rope_head_dim=8 --set model.v_head_dim=24)
else
  OR_N=96000; TEST_FRAC=0.004; EVAL_N=200; CPT_DOCS=6000; SFT_SAMPLES=30000; VOCAB=4096
  BASE_STEPS=250; CPT_STEPS=600; SFT_STEPS=6500; BATCH=4; MAX_TOKENS=512
  SFT_ROUNDS=("5000 8e-4 8e-5 1237")  # steps, peak lr, final lr, seed of each extra round
  MODEL_SET=()
fi
every() { local s=$1 d=$2; echo $(( s / d > 0 ? s / d : 1 )); }

# ---- dependencies: the base corpus ships in a Debian package (never downloaded by trex) -------
FORTUNES=/usr/share/games/fortunes
command -v python3 >/dev/null || { echo "run.sh: needs python3 (scripts/deps.sh installs it)" >&2; exit 2; }
if [ ! -d "$FORTUNES" ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "[deps] installing the Debian package fortunes (the base model's English corpus)"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq fortunes
fi

mkdir -p "$OUT/logs" "$OUT/data" "$OUT/eval"
DATA="$OUT/data"; TOK="$OUT/tokenizer/tokenizer.json"; CACHE="$OUT/token_cache"
T0=$(date +%s)
echo "OR recipe ($([ $SMALL = 1 ] && echo small || echo full)) -> $OUT, trex = $TREX, threads = $THREADS"

# stage NAME DONE_FILE CMD...: runs CMD (printed first) into OUT/logs/NAME.log unless DONE_FILE
# exists; touches DONE_FILE on success. (set -e does not apply inside CMD: functions check each step.)
stage() {
  local name=$1 done_file=$2; shift 2
  if [ -e "$done_file" ]; then echo "[$name] done already ($done_file), skipped"; return 0; fi
  local t=$(date +%s)
  echo "[$name] \$ $*" | sed "s#$TREX#trex#"
  { echo "\$ $*"; "$@"; } >"$OUT/logs/$name.log" 2>&1 || {
    echo "[$name] failed; the end of $OUT/logs/$name.log:" >&2; tail -20 "$OUT/logs/$name.log" >&2; exit 1; }
  touch "$done_file"
  local s=$(( $(date +%s) - t ))
  printf '%s\t%d\n' "$name" "$s" >>"$OUT/times.tsv"
  echo "[$name] ok in ${s}s"
}
latest_ckpt() { ls -d "$1"/checkpoints/step-* 2>/dev/null | sort | tail -1; }
train_run() {  # train_run NAME TOML RUN_DIR STEPS extra --set args...
  local name=$1 toml=$2 dir=$3 steps=$4; shift 4
  rm -rf "$dir"  # a half-finished run starts again
  "$TREX" train --config "$toml" --set "checkpoint.run_dir=$dir" --set "data.tokenizer=$TOK" \
    --set "data.cache_dir=$CACHE" --set "train.threads=$THREADS" --set "train.steps=$steps" \
    --set "train.batch_size=$BATCH" --set "train.eval_every=$(every "$steps" 4)" \
    --set "optim.warmup_steps=$(every "$steps" 10)" --set "log.every=$(every "$steps" 20)" "$@" || return 1
  [ -n "$(latest_ckpt "$dir")" ] || { echo "no checkpoint under $dir" >&2; return 1; }
  "$TREX" plot "$dir" --out "$dir/plot.png" || echo "(no plot: gnuplot missing?)"
}

# a. base corpus
stage corpus "$DATA/.corpus.done" python3 "$HERE/prepare.py" base --out "$DATA/base.jsonl" --fortunes "$FORTUNES"

# b. OR data: train/test split by phrasing template and seed; subsets used by the stages
stage or-gen "$OUT/or/.done" "$TREX" or gen --n "$OR_N" --out "$OUT/or" --seed 11 --test-frac "$TEST_FRAC"
stage select "$DATA/.select.done" python3 "$HERE/prepare.py" select --or-dir "$OUT/or" --cpt-docs "$CPT_DOCS" \
  --sft-samples "$SFT_SAMPLES" --eval-n "$EVAL_N" --out-dir "$DATA"

# c. tokenizer with the DeepSeek chat tokens (the test questions are not in its corpus)
stage tokcorpus "$DATA/.tokcorpus.done" python3 "$HERE/prepare.py" tokcorpus --out "$DATA/tokenizer_corpus.txt" \
  "$DATA/base.jsonl" "$DATA/or_cpt.jsonl" "$DATA/sft_lp.jsonl"
stage tokenizer "$OUT/tokenizer/.done" "$TREX" tokenizer train --files "$DATA/tokenizer_corpus.txt" \
  --vocab-size "$VOCAB" --out "$OUT/tokenizer" --threads "$THREADS" --special-tokens "<｜begin▁of▁sentence｜>" \
  "<｜end▁of▁sentence｜>" "<｜User｜>" "<｜Assistant｜>" --bos "<｜begin▁of▁sentence｜>"

# d. base model from random weights
stage base "$OUT/base/.done" train_run base "$HERE/base.toml" "$OUT/base" "$BASE_STEPS" \
  --set "model.vocab_size=$VOCAB" --set "data.train=[\"$DATA/base.jsonl\"]" "${MODEL_SET[@]}"
BASE_CKPT="$(latest_ckpt "$OUT/base")"

# e. CPT on the OR corpus
stage cpt "$OUT/cpt/.done" train_run cpt "$HERE/cpt.toml" "$OUT/cpt" "$CPT_STEPS" \
  --set "model.path=$BASE_CKPT" --set "data.train=[\"$DATA/or_cpt.jsonl\"]"
CPT_CKPT="$(latest_ckpt "$OUT/cpt")"

# f. SFT on statement -> LP file + answer
stage sft "$OUT/sft/.done" train_run sft "$HERE/sft.toml" "$OUT/sft" "$SFT_STEPS" \
  --set "model.path=$CPT_CKPT" --set "data.train=[\"$DATA/sft_lp.jsonl\"]"
SFT_CKPT="$(latest_ckpt "$OUT/sft")"

# f2. more SFT rounds: a warm restart of the cosine schedule at a lower peak, a 100-step warmup and
# a new seed (so a new order of the packed chats); eval measures the last round's checkpoint
r=1
for round in "${SFT_ROUNDS[@]}"; do
  read -r steps lr min_lr seed <<<"$round"
  r=$((r + 1))
  stage "sft$r" "$OUT/sft$r/.done" train_run "sft$r" "$HERE/sft.toml" "$OUT/sft$r" "$steps" \
    --set "model.path=$SFT_CKPT" --set "data.train=[\"$DATA/sft_lp.jsonl\"]" --set "optim.lr=$lr" \
    --set "optim.min_lr=$min_lr" --set "optim.warmup_steps=100" --set "train.seed=$seed"
  SFT_CKPT="$(latest_ckpt "$OUT/sft$r")"
done

# g. zero-shot greedy Pass@1 of the three models on the same held-out questions
eval_model() {  # eval_model KEY CKPT
  local th=(); [ "$THREADS" != 0 ] && th=(--threads "$THREADS")
  "$TREX" or eval --model "$2" --tokenizer "$TOK" --data "$DATA/test_eval.jsonl" --max-tokens "$MAX_TOKENS" \
    "${th[@]}" --out "$OUT/eval/$1.jsonl" | tee "$OUT/eval/$1.summary.tmp" || return 1
  mv "$OUT/eval/$1.summary.tmp" "$OUT/eval/$1.summary.txt"
}
stage eval-sft "$OUT/eval/sft.summary.txt" eval_model sft "$SFT_CKPT"
stage eval-cpt "$OUT/eval/cpt.summary.txt" eval_model cpt "$CPT_CKPT"
stage eval-base "$OUT/eval/base.summary.txt" eval_model base "$BASE_CKPT"

echo
python3 "$HERE/prepare.py" table --eval-dir "$OUT/eval" --out "$OUT/pass_at_1.md"
echo
echo "OR recipe done in $(( $(date +%s) - T0 ))s (this invocation); table: $OUT/pass_at_1.md; per-problem" \
     "outputs: $OUT/eval/{base,cpt,sft}.jsonl; stage times: $OUT/times.tsv"
