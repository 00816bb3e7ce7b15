#!/usr/bin/env bash
# The DeepSeek-V4 CSA indexer's KL loss through `trex train` (docs/V4.md, "Indexer loss"):
#   - a small V4 checkpoint (one step from random init, fp32, two CSA layers around an HCA layer);
#   - from it, 2 steps of the dense warm-up (only the indexer's tensors change: every other tensor
#     and the router biases stay byte for byte), 2 of the sparse stage (the indexer trains with the
#     rest), and 2 with weight 0 and train.indexer_recall = true (the indexer stays byte for byte);
#     metrics.jsonl reports indexer_loss and indexer_recall in all three;
#   - trex grad --indexer-loss-weight gives the indexer's tensors a gradient;
#   - trex bench step trains the loss as trex train does (its step loss has the indexer's term).
#
#   tests/cli/v4_indexer_loss.sh TREX_BINARY
#
# Run by CTest as cli_v4_indexer_loss. Work files go to a temporary directory (removed on success,
# kept and named on failure).
set -euo pipefail
TREX=$(realpath "$1")
NAME=v4_indexer_loss
source "$(dirname "$0")/family_setup.sh"

write_v4_cpt_toml '["compressed_sparse_attention", "heavily_compressed_attention", "compressed_sparse_attention"]' 3
run "$TREX" train --config cpt.toml
CK=cpt/checkpoints/step-00000001
cat > from.toml <<TOML
[model]
path = "$CK"

[data]
train = ["corpus.txt"]
tokenizer = "tok/tokenizer.json"
seq_len = 32
cache_dir = "none"

[train]
steps = 2
batch_size = 1
precision = "fp32"

[log]
every = 1
progress = "lines"
TOML
run "$TREX" train --config from.toml --set train.indexer_loss_weight=1.0 --set train.indexer_stage=dense_warmup \
  --set checkpoint.run_dir=warm
run "$TREX" train --config from.toml --set train.indexer_loss_weight=0.5 --set checkpoint.run_dir=sparse
run "$TREX" train --config from.toml --set train.indexer_recall=true --set checkpoint.run_dir=recall
python3 - "$CK" warm sparse recall <<'PY' || fail "the indexer loss runs trained the wrong tensors or reported no recall"
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
    ix = [k for k in t if ".compressor.indexer." in k]
    assert len(ix) == 12, ix
    for k in t:
        if ".compressor.indexer." in k:
            assert (t[k] == base[k]) == (run == "recall"), (run, k)
        elif run == "warm":
            assert t[k] == base[k], (run, k)
    m = [json.loads(l) for l in open(run + "/metrics.jsonl") if '"step"' in l]
    assert len(m) == 2 and all(x["indexer_loss"] > 0 and 0 < x["indexer_recall"] <= 1 + 1e-6 for x in m), m
PY
echo "ok: indexer loss, dense warm-up, sparse stage, recall with weight 0"

echo '{"input_ids": [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]], "labels": [[5, 6, 7, -100, 9, 10, 11, 12, 13, 14, 15, 16]]}' > batch.json
run "$TREX" grad --model "$CK" --batch batch.json --out grads.safetensors --indexer-loss-weight 0.5
grep -q '"indexer": [0-9]' out.txt || fail "trex grad printed no indexer loss: $(cat out.txt)"
python3 - grads.safetensors <<'PY' || fail "trex grad --indexer-loss-weight: no indexer gradient"
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    hdr = json.loads(f.read(n))
    data = f.read()
ix = [k for k in hdr if ".compressor.indexer." in k]
assert len(ix) == 12, ix
for k in ix:
    a, b = hdr[k]["data_offsets"]
    assert any(data[a:b]), k  # not all zero bytes
PY

# trex bench step trains what trex train does: with the indexer loss its step's loss has the
# indexer's term (the same micro-batch, the same weights: only the weight differs).
bench_loss() {
  run "$TREX" bench step --config from.toml --steps 1 --warmup 0 --set train.indexer_loss_weight="$1" > /dev/null
  sed -n 's/.*\[bench step\] step 0 loss \([0-9.]*\).*/\1/p' err.txt
}
L0=$(bench_loss 0)
L1=$(bench_loss 1.0)
[ -n "$L0" ] && [ -n "$L1" ] || fail "trex bench step printed no loss"
python3 -c "import sys; sys.exit(0 if float('$L1') > float('$L0') else 1)" \
  || fail "trex bench step with train.indexer_loss_weight = 1: loss $L1, without: $L0 (the indexer loss is not trained)"
echo "ok: bench step trains the indexer loss ($L0 -> $L1)"

cd /
rm -rf "$WORK"
echo "v4_indexer_loss: all ok"
