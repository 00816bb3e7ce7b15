# Sourced by the fault tests (ROOT: the repository root; WORK: the test's work directory).
#   tiny_run STEPS EVERY KEEP  writes data.txt (the repository's prose as plain-text CPT) and
#       run.toml (a tiny DeepSeek-V3-shaped MoE, the committed 3,000-id BPE, bf16, one thread) into
#       the current directory; checkpoints every EVERY steps, the newest KEEP kept.
#   losses FILE [cut-ok]  the loss of each step of a metrics.jsonl, "step loss" lines in step
#       order; the last entry of a step wins (a resume cuts the file back to its checkpoint). cut-ok: skip a line that is
#       not JSON (one cut by SIGKILL); without it such a line fails.
#   fail MESSAGE  prints it and where the work files are kept, exits 1.

fail() {
  echo "FAIL: $*"
  echo "work files kept in $WORK"
  exit 1
}

losses() { python3 -c '
import json, sys
d = {}
for line in open(sys.argv[1]):
    try: j = json.loads(line)
    except ValueError:
        if sys.argv[2] == "cut-ok": continue
        raise
    d[j["step"]] = repr(j["loss"])
for s in sorted(d): print(s, d[s])' "$1" "${2:-}"; }

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
