#!/usr/bin/env bash
# Cached DeepSeek-V4 decoding of two trex binaries side by side (`trex bench decode`), on two
# random-init fp32 models written by `trex train` (one step): hidden 256 (the shape of
# tools/bench/decode_v4_hf.py's CONFIG) and hidden 1024 (configs/bench-v4.toml's model without
# its MTP block). No Python needed. 1 and 2 threads, 1 and 4 prompts at once, 512 tokens of
# context; ROUNDS rounds, A then B within each. Prints a markdown table and writes it to
# benchmarks/results/<date>-<HHMM>-decode-ab.md.
#
# usage: tools/bench/decode_ab.sh TREX_A TREX_B   (env: ROUNDS=2, NEW=64, OUT=runs/bench-decode-ab)
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -eq 2 ] || { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2; }
A=$(realpath "$1"); B=$(realpath "$2")
ROUNDS=${ROUNDS:-2}; NEW=${NEW:-64}; OUT=${OUT:-runs/bench-decode-ab}
mkdir -p "$OUT"
OUT=$(realpath "$OUT")  # the run configs name their files from any directory
cat README.md docs/*.md > "$OUT/corpus.txt"
[ -f "$OUT/tok/tokenizer.json" ] || "$B" tokenizer train --files "$OUT/corpus.txt" --vocab-size 300 --out "$OUT/tok" \
  --special-tokens "<｜begin▁of▁sentence｜>" "<｜end▁of▁sentence｜>" --bos "<｜begin▁of▁sentence｜>" > /dev/null

small_model() {
  cat <<'TOML'
[model]
model_type = "deepseek_v4"
vocab_size = 2048
hidden_size = 256
num_hidden_layers = 4
num_attention_heads = 8
head_dim = 64
partial_rotary_factor = 0.25
q_lora_rank = 128
o_groups = 4
o_lora_rank = 64
moe_intermediate_size = 128
n_routed_experts = 16
n_shared_experts = 1
num_experts_per_tok = 2
layer_types = ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention", "compressed_sparse_attention"]
mlp_layer_types = ["hash_moe", "moe", "moe", "moe"]
compress_rates = { compressed_sparse_attention = 4, heavily_compressed_attention = 128 }
sliding_window = 128
index_n_heads = 4
index_head_dim = 32
index_topk = 64
hc_mult = 4
hc_sinkhorn_iters = 20
max_position_embeddings = 8192
num_nextn_predict_layers = 0
initializer_range = 0.02
TOML
}
big_model() {
  sed -n '/^\[model\]/,/^\[data\]/p' configs/bench-v4.toml | sed '$d' | sed 's/^num_nextn_predict_layers = .*/num_nextn_predict_layers = 0/'
}
make_model() {  # name, model section function
  local dir=$OUT/$1
  [ -f "$dir/run/checkpoints/step-00000001/config.json" ] && return
  mkdir -p "$dir"
  { $2; cat <<TOML

[data]
train = ["$OUT/corpus.txt"]
tokenizer = "$OUT/tok/tokenizer.json"
seq_len = 64
cache_dir = "none"

[train]
steps = 1
batch_size = 1
precision = "fp32"

[checkpoint]
run_dir = "$dir/run"

[log]
progress = "lines"
TOML
  } > "$dir/make.toml"
  TREX_THREADS=2 "$B" train --config "$dir/make.toml" > "$dir/train.log" 2>&1
}
make_model small small_model
make_model big big_model

STAMP=$(date -u +%F-%H%M)
COMMIT=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . || echo "+dirty")
CPU=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
declare -A TOK PRE
for r in $(seq 1 "$ROUNDS"); do
  for m in small big; do
    for t in 1 2; do
      for b in 1 4; do
        for side in A B; do
          bin=$A; [ $side = B ] && bin=$B
          line=$("$bin" bench decode --model "$OUT/$m/run/checkpoints/step-00000001" --context 512 --new "$NEW" \
                   --batch $b -t $t 2>/dev/null | tail -n 1)
          read -r tok pre < <(echo "$line" | python3 -c \
            'import json,sys; j=json.load(sys.stdin); print(round(j["decode_tokens_per_s"]), j["prefill_s"])')
          k="$m $t $b $side"
          TOK[$k]="${TOK[$k]:+${TOK[$k]} / }$tok"; PRE[$k]="${PRE[$k]:+${PRE[$k]} / }$pre"
        done
      done
    done
  done
done
FILE=benchmarks/results/$STAMP-decode-ab.md
{
  echo "# Cached V4 decoding, two binaries side by side ($STAMP UTC)"
  echo
  echo "Machine: $CPU, $(nproc) cores. Commit $COMMIT. A = \`$1\`, B = \`$2\`."
  echo "Command: \`ROUNDS=$ROUNDS NEW=$NEW tools/bench/decode_ab.sh $1 $2\` (context 512, $NEW new tokens, fp32; one"
  echo "figure per round, A then B within a round)."
  echo
  echo "| model | threads | prompts | A decode tok/s | B decode tok/s | A prefill s | B prefill s |"
  echo "|---|---|---|---|---|---|---|"
  for m in small big; do for t in 1 2; do for b in 1 4; do
    echo "| $m | $t | $b | ${TOK[$m $t $b A]} | ${TOK[$m $t $b B]} | ${PRE[$m $t $b A]} | ${PRE[$m $t $b B]} |"
  done; done; done
} | tee "$FILE"
echo "wrote $FILE" >&2
