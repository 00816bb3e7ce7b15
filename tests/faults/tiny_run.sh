# Sourced by the fault tests: tiny_run STEPS EVERY KEEP writes data.txt (the repository's prose as
# plain-text CPT) and run.toml (a tiny DeepSeek-V3-shaped MoE, the committed 3,000-id BPE, bf16, one
# thread) into the current directory; checkpoints every EVERY steps, the newest KEEP kept. ROOT: the
# repository root.
tiny_run() {
  local steps=$1 every=$2 keep=$3
  cat "$ROOT/README.md" "$ROOT"/docs/*.md > data.txt
  cat > run.toml <<TOML
[model]
model_type = "deepseek_v3"
vocab_size = 3001
hidden_size = 48
num_hidden_layers = 3
first_k_dense_replace = 1
intermediate_size = 80
moe_intermediate_size = 24
n_routed_experts = 6
n_shared_experts = 1
num_experts_per_tok = 2
num_attention_heads = 3
q_lora_rank = 24
kv_lora_rank = 20
qk_nope_head_dim = 10
qk_rope_head_dim = 6
v_head_dim = 10
initializer_range = 0.05

[data]
train = ["data.txt"]
tokenizer = "$ROOT/tests/data/tokenizer/trex_trained.json"
mode = "cpt"
seq_len = 96
cache_dir = "none"

[train]
batch_size = 2
steps = $steps
threads = 1
precision = "bf16"

[optim]
lr = 3e-3
warmup_steps = 4

[checkpoint]
every = $every
keep = $keep

[log]
progress = "lines"
TOML
}
