#!/usr/bin/env bash
# Generation on a DeepSeek-V4 checkpoint (the KV cache of model/v4_decode.h: sliding window,
# compressors' running windows and entries, indexer keys), from the command line:
#   - trex train writes a small V4 checkpoint (one step from random init, fp32);
#   - trex generate on it; --input with --batch 3 writes the same lines as --batch 1;
#   - trex or eval --model with --batch 3 writes the same outputs as --batch 1 (generate_batch
#     equals one prompt at a time), also with --samples 3 --temperature 1 (sample j of every
#     problem from seed + j: three samples each, not all equal), and --samples without a
#     temperature is refused;
#   - trex bench decode, cached and --recompute, prints its JSON line.
#
#   tests/cli/v4_generate.sh TREX_BINARY
#
# Run by CTest as cli_v4_generate. Work files go to a temporary directory (removed on success,
# kept and named on failure).
set -euo pipefail
TREX=$(realpath "$1")
NAME=v4_generate
source "$(dirname "$0")/family_setup.sh"

write_v4_cpt_toml '["compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"]' 2
run "$TREX" train --config cpt.toml
CK=cpt/checkpoints/step-00000001
cp tok/tokenizer.json "$CK/"

run "$TREX" generate --model "$CK" --prompt "the model" --max-tokens 9 --output gen.jsonl
grep -q '"output"' gen.jsonl || fail "generate wrote no result: $(cat gen.jsonl)"

for w in "the model" "a" "trex trains DeepSeek models on" "x y z" "generation"; do echo "{\"prompt\": \"$w\"}"; done > prompts.jsonl
run "$TREX" generate --model "$CK" --input prompts.jsonl --max-tokens 9 --output gen1.jsonl
run "$TREX" generate --model "$CK" --input prompts.jsonl --max-tokens 9 --output gen3.jsonl --batch 3
cmp -s gen1.jsonl gen3.jsonl || fail "generate --batch 3 wrote other lines than --batch 1: $(diff gen1.jsonl gen3.jsonl)"

for i in 1 2 3 4 5; do
  echo "{\"id\": \"p$i\", \"question\": \"Maximize $i x subject to x <= $((i + 2)).\", \"answer\": $((i * (i + 2)))}"
done > test.jsonl
run "$TREX" or eval --model "$CK" --data test.jsonl --max-tokens 11 --batch 1 --out one.jsonl
run "$TREX" or eval --model "$CK" --data test.jsonl --max-tokens 11 --batch 3 --out three.jsonl
python3 - one.jsonl three.jsonl <<'PY' || fail "or eval --batch 3 wrote other outputs than --batch 1"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 5, (len(a), len(b))
for x, y in zip(a, b):
    assert x["id"] == y["id"] and x["output"] == y["output"], (x, y)
PY

run "$TREX" or eval --model "$CK" --data test.jsonl --max-tokens 11 --batch 1 --samples 3 --k 2 --temperature 1 --out s1.jsonl
run "$TREX" or eval --model "$CK" --data test.jsonl --max-tokens 11 --batch 3 --samples 3 --k 2 --temperature 1 --out s3.jsonl
grep -q '"pass_at_k"' out.txt || fail "or eval --samples: no pass_at_k in the summary: $(cat out.txt)"
python3 - s1.jsonl s3.jsonl <<'PY' || fail "or eval --samples: batch 3 differs from batch 1, or the samples are all equal"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 5, (len(a), len(b))
distinct = 0
for x, y in zip(a, b):
    assert len(x["samples"]) == 3, x
    assert [s["output"] for s in x["samples"]] == [s["output"] for s in y["samples"]], (x, y)
    distinct += len({s["output"] for s in x["samples"]}) > 1
assert distinct > 0, "temperature 1 gave three equal samples for every problem"
PY
if "$TREX" or eval --model "$CK" --data test.jsonl --max-tokens 3 --samples 2 > greedy.txt 2>&1; then
  fail "or eval --model --samples 2 without --temperature was accepted"
fi
grep -q "temperature" greedy.txt || fail "or eval --samples without temperature: $(cat greedy.txt)"

run "$TREX" bench decode --model "$CK" --context 23 --new 6 --batch 2
grep -q '"mode": "cache"' out.txt || fail "bench decode: $(cat out.txt)"
run "$TREX" bench decode --model "$CK" --context 23 --new 3 --recompute
grep -q '"mode": "recompute"' out.txt || fail "bench decode --recompute: $(cat out.txt)"

cd /
rm -rf "$WORK"
echo "v4_generate: all ok"
