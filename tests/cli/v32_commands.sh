#!/usr/bin/env bash
# The commands on a DeepSeek-V3.2 checkpoint (model_type deepseek_v32: MLA over the lightning
# indexer's top-k tokens, index_topk 6 below seq_len 32, YaRN):
#   - trex train, CPT from a [model] table (random init), then SFT from its checkpoint;
#   - the checkpoint is V3.2's: config.json model_type deepseek_v32 with the indexer keys, the
#     indexer's tensors under transformers' names, unchanged by training (they get no gradient);
#   - with train.indexer_loss_weight > 0 the indexer trains: alone in the dense warm-up (every
#     other tensor byte for byte), with the rest in the sparse stage; metrics.jsonl reports it;
#   - trex grad on it (zero indexer gradients), and on its `trex convert --dtype bf16` copy, whose
#     own convert gives the same bytes (round trip);
#   - trex generate (KV cache with the indexer's keys);
#   - trex plan --model on its config.json;
#   - what trex cannot compute identically is refused naming the field (q_lora_rank = 0), and
#     trex bench kernels, which does not model the indexer, refuses the config.
#
#   tests/cli/v32_commands.sh TREX_BINARY
#
# Run by CTest as cli_v32_commands. Work files go to a temporary directory (removed on success,
# kept and named on failure).
set -euo pipefail
TREX=$(realpath "$1")
NAME=v32_commands
source "$(dirname "$0")/family_setup.sh"

cat > cpt.toml <<TOML
[model]
model_type = "deepseek_v32"
vocab_size = 300
hidden_size = 33
num_hidden_layers = 3
first_k_dense_replace = 1
intermediate_size = 47
moe_intermediate_size = 13
n_routed_experts = 9
n_shared_experts = 1
num_experts_per_tok = 2
n_group = 3
topk_group = 2
routed_scaling_factor = 2.5
num_attention_heads = 3
num_key_value_heads = 3
q_lora_rank = 15
kv_lora_rank = 11
qk_nope_head_dim = 7
qk_rope_head_dim = 4
v_head_dim = 9
index_n_heads = 5
index_head_dim = 10
index_topk = 6
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
TOML
run "$TREX" train --config cpt.toml
CK=cpt/checkpoints/step-00000002
python3 - "$CK" <<'PY' || fail "the CPT checkpoint is not DeepSeek-V3.2's"
import json, struct, sys
d = sys.argv[1]
c = json.load(open(d + "/config.json"))
assert c["model_type"] == "deepseek_v32" and c["architectures"] == ["DeepseekV32ForCausalLM"], c
assert (c["index_topk"], c["index_head_dim"], c["index_n_heads"]) == (6, 10, 5), c
assert c["mlp_layer_types"] == ["dense", "sparse", "sparse"], c
with open(d + "/model.safetensors", "rb") as f:
    names = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
ix = "model.layers.2.self_attn.indexer."
for t in ("wq_b.weight", "wk.weight", "k_norm.weight", "k_norm.bias", "weights_proj.weight"):
    assert ix + t in names, ix + t
assert "model.layers.2.mlp.gate.e_score_correction_bias" in names
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
grep -q '"deepseek_v32"' "$SK/config.json" || fail "the SFT checkpoint is not deepseek_v32: $(cat "$SK/config.json")"
# The indexer gets no gradient and no update (frozen, as torch skips parameters without .grad):
# its tensors are the CPT checkpoint's, byte for byte.
python3 - "$CK" "$SK" <<'PY' || fail "training changed the indexer's tensors"
import json, struct, sys
def tensors(d):
    with open(d + "/model.safetensors", "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    return {k: data[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in hdr.items() if ".indexer." in k}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
assert a.keys() == b.keys() and len(a) == 15, sorted(a)
for k in a:
    assert a[k] == b[k], k
PY

# The indexer loss (train.indexer_loss_weight > 0), from the CPT checkpoint as sft.toml. Dense
# warm-up: only the indexer trains, every
# other tensor and the router biases stay byte for byte; sparse stage: the indexer trains with the
# rest. metrics.jsonl reports indexer_loss and indexer_recall.
run "$TREX" train --config sft.toml --set train.indexer_loss_weight=1.0 --set train.indexer_stage=dense_warmup \
  --set checkpoint.run_dir=warm
run "$TREX" train --config sft.toml --set train.indexer_loss_weight=0.5 --set checkpoint.run_dir=sparse
python3 - "$CK" warm sparse <<'PY' || fail "the indexer loss runs trained the wrong tensors"
import json, struct, sys
def tensors(d):
    with open(d + "/model.safetensors", "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    return {k: data[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in hdr.items() if k != "__metadata__"}
base = tensors(sys.argv[1])
for run in sys.argv[2:]:
    t = tensors(run + "/checkpoints/step-00000002")
    assert t.keys() == base.keys(), run
    for k in t:
        if ".indexer." in k:
            assert t[k] != base[k], (run, k)
        elif run == "warm":
            assert t[k] == base[k], (run, k)
    m = [json.loads(l) for l in open(run + "/metrics.jsonl")]
    assert len(m) == 2 and all(x["indexer_loss"] > 0 and 0 < x["indexer_recall"] <= 1 + 1e-6 for x in m), m
PY
echo "ok: indexer loss, dense warm-up and sparse stage"

echo '{"input_ids": [[5, 6, 7, 8, 9, 10, 11]], "labels": [[5, 6, 7, -100, 9, 10, 11]]}' > batch.json
run "$TREX" grad --model "$SK" --batch batch.json --out grads.safetensors
loss=$(grep -o '"loss": *[0-9.e+-]*' out.txt | head -1 | sed 's/.*: *//')
[ -n "$loss" ] || fail "grad printed no loss: $(cat out.txt)"
python3 - <<'PY' || fail "trex grad gave the indexer a gradient"
import json, struct
with open("grads.safetensors", "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    hdr = json.loads(f.read(n))
    data = f.read()
ix = [k for k in hdr if ".indexer." in k]
assert len(ix) == 15, ix
for k in ix:
    a, b = hdr[k]["data_offsets"]
    assert data[a:b] == bytes(b - a), k
PY

run "$TREX" convert --model "$SK" --out conv --dtype bf16
grep -q '"deepseek_v32"' conv/config.json || fail "convert did not keep model_type deepseek_v32"
run "$TREX" convert --model conv --out conv2 --dtype bf16
cmp conv/model.safetensors conv2/model.safetensors || fail "convert of the bf16 copy changed its tensors"
cmp conv/config.json conv2/config.json || fail "convert of the bf16 copy changed its config.json"
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
n = sum(math.prod(v["shape"]) for k, v in hdr.items()
        if k != "__metadata__" and not k.endswith("e_score_correction_bias"))  # buffers, not parameters
plan = json.load(open(sys.argv[2]))
assert plan["total_params"] == n, (plan["total_params"], n)
PY

# q_lora_rank = 0 (null): transformers' V3.2 has no plain q_proj for the indexer to read; refused,
# field named.
set +e
"$TREX" train --config cpt.toml --set model.q_lora_rank=0 > out.txt 2> err.txt
rc=$?
set -e
[ "$rc" -eq 2 ] || fail "q_lora_rank = 0: exit $rc, expected 2: $(cat err.txt)"
grep -qF "q_lora_rank" err.txt || fail "the error does not name q_lora_rank: $(cat err.txt)"
echo "ok: q_lora_rank = 0 refused"

# trex bench kernels does not model the indexer and the sparse attention: refused, not dense rows.
set +e
"$TREX" bench kernels --config cpt.toml --seconds 0.01 > out.txt 2> err.txt
rc=$?
set -e
[ "$rc" -eq 2 ] || fail "bench kernels on V3.2: exit $rc, expected 2: $(cat err.txt)"
grep -qF "deepseek_v32" err.txt || fail "the error does not name deepseek_v32: $(cat err.txt)"
echo "ok: bench kernels refuses V3.2"

cd /
rm -rf "$WORK"
echo "v32_commands: all ok"
