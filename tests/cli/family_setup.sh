# Sourced by the command tests of tests/cli (v2_commands.sh, v32_commands.sh, v4_generate.sh,
# v4_indexer_loss.sh) with TREX (the binary) and NAME (the work directory's prefix) set: makes and
# enters the work directory WORK, defines fail MESSAGE (prints it and where the work files are kept, exits 1) and run CMD...
# (runs it with its output in out.txt / err.txt, failing on a non-zero exit), and writes
# corpus.txt (the repository's prose), tok/ (a 300-id BPE with DeepSeek's chat tokens) and
# chats.jsonl (40 one-turn SFT chats). write_v4_cpt_toml LAYER_TYPES TOPK writes cpt.toml: one
# fp32 CPT step of a tiny DeepSeek-V4 model (3 layers of LAYER_TYPES, a TOML list; index_topk TOPK)
# on corpus.txt into cpt/.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/trex_${NAME}.XXXXXX")
cd "$WORK"
export TREX_THREADS=2

fail() {
  echo "FAIL: $*" >&2
  echo "work files kept in $WORK" >&2
  exit 1
}
run() {
  "$@" > out.txt 2> err.txt || fail "$*: exit $?; stderr: $(tail -5 err.txt)"
  echo "ok: $*"
}

cat "$ROOT/README.md" "$ROOT"/docs/*.md > corpus.txt
"$TREX" tokenizer train --files corpus.txt --vocab-size 300 --out tok \
  --special-tokens "<｜begin▁of▁sentence｜>" "<｜end▁of▁sentence｜>" "<｜User｜>" "<｜Assistant｜>" \
  --bos "<｜begin▁of▁sentence｜>" > /dev/null
for i in $(seq 1 40); do
  echo "{\"messages\": [{\"role\": \"user\", \"content\": \"What is $i + $i?\"}, {\"role\": \"assistant\", \"content\": \"$((i + i))\"}]}"
done > chats.jsonl

write_v4_cpt_toml() {
  cat > cpt.toml <<TOML
[model]
model_type = "deepseek_v4"
vocab_size = 300
hidden_size = 26
num_hidden_layers = 3
num_attention_heads = 3
head_dim = 10
partial_rotary_factor = 0.4
q_lora_rank = 9
o_groups = 3
o_lora_rank = 5
moe_intermediate_size = 7
n_routed_experts = 5
n_shared_experts = 1
num_experts_per_tok = 2
layer_types = $1
mlp_layer_types = ["hash_moe", "moe", "moe"]
compress_rates = { compressed_sparse_attention = 3, heavily_compressed_attention = 5 }
sliding_window = 7
index_n_heads = 5
index_head_dim = 6
index_topk = $2
hc_mult = 3
hc_sinkhorn_iters = 5
max_position_embeddings = 512
num_nextn_predict_layers = 0
initializer_range = 0.3

[data]
train = ["corpus.txt"]
tokenizer = "tok/tokenizer.json"
seq_len = 32
cache_dir = "none"

[train]
steps = 1
batch_size = 1
precision = "fp32"

[checkpoint]
run_dir = "cpt"

[log]
progress = "lines"
TOML
}
