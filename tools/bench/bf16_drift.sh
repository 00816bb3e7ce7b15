#!/usr/bin/env bash
# bf16 against fp32 over 100 training steps (issue 8, "No change to numerics"): the same run
# (data, seed, schedule) in fp32 and in bf16, for a small DeepSeek-V3 and for
# configs/reliability-v4.toml cut to 100 steps; prints the per-step loss gap and the eval losses.
#   [CORPUS_REV=6769d06] tools/bench/bf16_drift.sh [BUILD_DIR=build] [OUT_DIR=runs/bf16-drift] [LR=2e-3]
# The bf16 GEMM path is the machine's default (kernels/gemm_bf16_dnnl.h); set TREX_GEMM_BF16=widen
# to measure the widened one.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
OUT=${2:-runs/bf16-drift}
LR=${3:-2e-3}
mkdir -p "$OUT"
# One document per paragraph of the repository's prose (README.md and docs/*.md as of commit
# CORPUS_REV, so that runs at later commits train on the same text), as CPT JSONL.
REV=${CORPUS_REV:-6769d06}
FILES="README.md $(git ls-tree --name-only "$REV" docs/ | grep '\.md$' | tr '\n' ' ')"
for f in $FILES; do git show "$REV:$f"; printf '\n\n'; done | python3 -c '
import json, sys
for para in sys.stdin.read().split("\n\n"):
    if len(para.strip()) > 40:
        print(json.dumps({"text": para.strip()}))
' > "$OUT/prose.jsonl"
cat > "$OUT/v3.toml" <<TOML
[model]
model_type = "deepseek_v3"
vocab_size = 3001
hidden_size = 96
num_hidden_layers = 4
first_k_dense_replace = 1
intermediate_size = 160
moe_intermediate_size = 40
n_routed_experts = 6
n_shared_experts = 1
num_experts_per_tok = 2
n_group = 1
topk_group = 1
topk_method = "noaux_tc"
scoring_func = "sigmoid"
norm_topk_prob = true
routed_scaling_factor = 2.5
num_attention_heads = 3
num_key_value_heads = 3
q_lora_rank = 48
kv_lora_rank = 40
qk_nope_head_dim = 24
qk_rope_head_dim = 8
v_head_dim = 24
max_position_embeddings = 1024
rope_theta = 10000.0
rms_norm_eps = 1e-6
tie_word_embeddings = false
initializer_range = 0.02

[data]
train = ["$OUT/prose.jsonl"]
tokenizer = "tests/data/tokenizer/trex_trained.json"
mode = "cpt"
seq_len = 96
eval_fraction = 0.05

[train]
batch_size = 2
steps = 100
threads = 1
seed = 1234
eval_every = 25
eval_batches = 4

[optim]
lr = $LR
min_lr = 2e-4
schedule = "cosine"
warmup_steps = 10

[checkpoint]
every = 0

[log]
every = 10
progress = "lines"
TOML
run() {  # NAME CONFIG PRECISION [--set ...]
  local name=$1 cfg=$2 prec=$3; shift 3
  rm -rf "$OUT/$name-$prec"
  "$BUILD/trex" train --config "$cfg" --set train.precision="$prec" --set checkpoint.run_dir="$OUT/$name-$prec" \
    "$@" > "$OUT/$name-$prec.log" 2>&1
}
for prec in fp32 bf16; do
  run v3 "$OUT/v3.toml" $prec
  run v4 configs/reliability-v4.toml $prec --set "data.train=[\"$OUT/prose.jsonl\"]" --set train.steps=100 \
    --set optim.lr="$LR" --set checkpoint.every=0 --set train.eval_every=25
done
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
def rows(p):
    return [json.loads(l) for l in open(p)]
for name in ("v3", "v4"):
    a, b = rows(f"{out}/{name}-fp32/metrics.jsonl"), rows(f"{out}/{name}-bf16/metrics.jsonl")
    la = {r["step"]: r["loss"] for r in a if "loss" in r and r.get("loss") is not None}
    lb = {r["step"]: r["loss"] for r in b if "loss" in r and r.get("loss") is not None}
    ea = {r["step"]: r["eval_loss"] for r in a if r.get("eval_loss") is not None}
    eb = {r["step"]: r["eval_loss"] for r in b if r.get("eval_loss") is not None}
    steps = sorted(set(la) & set(lb))
    d = [abs(la[s] - lb[s]) for s in steps]
    worst = max(range(len(d)), key=lambda i: d[i])
    print(f"{name}: fp32 loss {la[steps[0]]:.4f} -> {la[steps[-1]]:.4f}, bf16 {lb[steps[0]]:.4f} -> "
          f"{lb[steps[-1]]:.4f}; per-step |diff| mean {sum(d)/len(d):.4f} max {d[worst]:.4f} (step {steps[worst]})")
    for s in sorted(set(ea) & set(eb)):
        print(f"  eval at {s}: fp32 {ea[s]:.4f} bf16 {eb[s]:.4f} diff {abs(ea[s]-eb[s]):.4f}")
PY
