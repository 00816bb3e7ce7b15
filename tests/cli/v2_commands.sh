#!/usr/bin/env bash
# The commands on a DeepSeek-V2 checkpoint (model_type deepseek_v2, V2-Lite's plain q_proj, written
# q_lora_rank = 0 as TOML has no null, and V2's group-limited softmax router):
#   - trex train, CPT from a [model] table (random init), then SFT from its checkpoint;
#   - the checkpoint is V2's: config.json model_type deepseek_v2, no e_score_correction_bias;
#   - trex grad on it, and on its `trex convert --dtype bf16` copy (which keeps the V2 names);
#   - trex generate;
#   - trex plan --model on its config.json, and with --routing on the run's metrics.jsonl (and
#     --routing together with expert_load= in --layout refused);
#   - what trex cannot compute identically is refused naming the field (norm_topk_prob = true).
#
#   tests/cli/v2_commands.sh TREX_BINARY
#
# Run by CTest as cli_v2_commands. Work files go to a temporary directory (removed on success,
# kept and named on failure).
set -euo pipefail
TREX=$(realpath "$1")
NAME=v2_commands
source "$(dirname "$0")/family_setup.sh"

cat > cpt.toml <<TOML
[model]
model_type = "deepseek_v2"
vocab_size = 300
hidden_size = 33
num_hidden_layers = 3
first_k_dense_replace = 1
intermediate_size = 47
moe_intermediate_size = 13
n_routed_experts = 9
n_shared_experts = 2
num_experts_per_tok = 2
topk_method = "group_limited_greedy"
n_group = 3
topk_group = 2
routed_scaling_factor = 1.5
num_attention_heads = 3
q_lora_rank = 0
kv_lora_rank = 11
qk_nope_head_dim = 7
qk_rope_head_dim = 4
v_head_dim = 9
max_position_embeddings = 64
rope_parameters = { rope_type = "yarn", rope_theta = 10000.0, factor = 2.0, original_max_position_embeddings = 32, mscale = 0.707, mscale_all_dim = 0.707 }

[data]
train = ["corpus.txt"]
tokenizer = "tok/tokenizer.json"
seq_len = 32
cache_dir = "none"

[train]
steps = 2
batch_size = 2
precision = "bf16"

[checkpoint]
run_dir = "cpt"

[log]
progress = "lines"
expert_loads = true
TOML
run "$TREX" train --config cpt.toml
CK=cpt/checkpoints/step-00000002
python3 - "$CK" <<'PY' || fail "the CPT checkpoint is not DeepSeek-V2's"
import json, struct, sys
d = sys.argv[1]
c = json.load(open(d + "/config.json"))
assert c["model_type"] == "deepseek_v2" and c["architectures"] == ["DeepseekV2ForCausalLM"], c
assert c["q_lora_rank"] is None and c["topk_method"] == "group_limited_greedy" and c["n_group"] == 3, c
with open(d + "/model.safetensors", "rb") as f:
    names = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
assert not [n for n in names if "e_score_correction_bias" in n], "a router bias was written"
assert "model.layers.0.self_attn.q_proj.weight" in names and "model.layers.2.mlp.experts.8.up_proj.weight" in names
PY

cat > sft.toml <<TOML
[model]
path = "$CK"

[data]
mode = "sft"
train = ["chats.jsonl"]
tokenizer = "tok/tokenizer.json"
seq_len = 32
cache_dir = "none"
chat_template = "deepseek"

[train]
steps = 2
batch_size = 2
precision = "fp32"

[checkpoint]
run_dir = "sft"

[log]
progress = "lines"
TOML
run "$TREX" train --config sft.toml
SK=sft/checkpoints/step-00000002
[ -f "$SK/model.safetensors" ] || fail "no SFT checkpoint at $SK"
grep -q '"deepseek_v2"' "$SK/config.json" || fail "the SFT checkpoint is not deepseek_v2: $(cat "$SK/config.json")"

echo '{"input_ids": [[5, 6, 7, 8, 9, 10, 11]], "labels": [[5, 6, 7, -100, 9, 10, 11]]}' > batch.json
run "$TREX" grad --model "$SK" --batch batch.json --out grads.safetensors
loss=$(grep -o '"loss": *[0-9.e+-]*' out.txt | head -1 | sed 's/.*: *//')
[ -n "$loss" ] || fail "grad printed no loss: $(cat out.txt)"

run "$TREX" convert --model "$SK" --out conv --dtype bf16
grep -q '"deepseek_v2"' conv/config.json || fail "convert did not keep model_type deepseek_v2"
run "$TREX" grad --model conv --batch batch.json --out grads_bf16.safetensors
loss2=$(grep -o '"loss": *[0-9.e+-]*' out.txt | head -1 | sed 's/.*: *//')
python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if abs(a - b) <= 2e-2 * abs(a) else 1)" \
  "$loss" "$loss2" || fail "bf16 copy: loss $loss2 vs $loss"

cp tok/tokenizer.json "$SK/"
run "$TREX" generate --model "$SK" --prompt "the model" --max-tokens 5 --output gen.jsonl
grep -q '"output"' gen.jsonl || fail "generate wrote no result: $(cat gen.jsonl)"

run "$TREX" plan --model "$SK/config.json" --cluster cpu-this --devices 1 --json
python3 - "$SK" out.txt <<'PY' || fail "plan counts other parameters than the checkpoint holds"
import json, math, struct, sys
with open(sys.argv[1] + "/model.safetensors", "rb") as f:
    hdr = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
n = sum(math.prod(v["shape"]) for k, v in hdr.items() if k != "__metadata__")
plan = json.load(open(sys.argv[2]))
assert plan["total_params"] == n, (plan["total_params"], n)
PY

# The run's measured routing ([log] expert_loads = true) as the planner's input, 9 experts over 3
# ep ranks: the busiest rank's share from the per-expert counts, forced balance beside it.
run "$TREX" plan --model "$SK/config.json" --cluster cpu-this --devices 3 --layout ep=3 --routing cpt/metrics.jsonl --json
python3 - cpt/metrics.jsonl out.txt <<'PY' || fail "plan --routing does not follow the run's expert loads"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
shares = []
for r in recs:
    assert len(r["expert_loads"]) == 2 and all(len(x) == 9 for x in r["expert_loads"]), r["expert_loads"]
    for x in r["expert_loads"]:
        ranks = [sum(x[3 * k:3 * k + 3]) for k in range(3)]
        shares.append(max(1.0, max(ranks) / (sum(ranks) / 3)))
out = json.load(open(sys.argv[2]))
assert out["forced_balance"]["expert_load"] == 1.0
assert abs(out["measured"]["expert_load"] - sum(shares) / len(shares)) < 1e-9, (out["measured"], shares)
assert out["measured"]["step_s"] >= out["forced_balance"]["step_s"]
PY
# Both --routing and expert_load= in --layout: refused, naming both.
set +e
"$TREX" plan --model "$SK/config.json" --cluster cpu-this --devices 3 --layout ep=3,expert_load=2 \
  --routing cpt/metrics.jsonl > out.txt 2> err.txt
rc=$?
set -e
[ "$rc" -eq 2 ] || fail "plan --routing with expert_load=: exit $rc, expected 2: $(cat err.txt)"
grep -q "routing" err.txt && grep -q "expert_load" err.txt || fail "the error does not name both: $(cat err.txt)"
echo "ok: --routing with expert_load= refused"

# norm_topk_prob = true: transformers and DeepSeek's release code disagree; refused, field named.
set +e
"$TREX" train --config cpt.toml --set model.norm_topk_prob=true > out.txt 2> err.txt
rc=$?
set -e
[ "$rc" -eq 2 ] || fail "norm_topk_prob = true: exit $rc, expected 2: $(cat err.txt)"
grep -qF "norm_topk_prob" err.txt || fail "the error does not name norm_topk_prob: $(cat err.txt)"
echo "ok: norm_topk_prob = true refused"

cd /
rm -rf "$WORK"
echo "v2_commands: all ok"
