#!/usr/bin/env bash
# A new user's mistakes and damaged inputs end in a named error (exit 2), never in silent output,
# a missing file or "internal error":
#   - grad / generate on a checkpoint with a NaN weight: the tensor is named;
#   - grad whose loss is not a number (finite but overflowing weights): no gradients written;
#   - generate with a tokenizer larger than the model's vocabulary: both sizes named;
#   - generate --output with --prompt writes the file; --max-tokens past max_position_embeddings
#     is capped with a warning naming --max-tokens and the limit;
#   - --device: an unknown name, and cuda where it cannot run, refused with the reason;
#   - tokenizer train on an empty file;
#   - convert / demo --out under /proc: the path and the operation named;
#   - demo --out on a folder it did not write (e.g. `--out .`): refused, the folder left as it was.
#
#   tests/cli/user_errors.sh TREX_BINARY
#
# Run by CTest as cli_user_errors. Work files go to a temporary directory (removed on success,
# kept and named on failure).
set -euo pipefail
TREX=$(realpath "$1")
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/trex_user_errors.XXXXXX")
cd "$WORK"
export TREX_THREADS=2

fail() {
  echo "FAIL: $*" >&2
  echo "work files kept in $WORK" >&2
  exit 1
}
# expect CODE TEXT CMD...: CMD exits with CODE and its stderr holds TEXT (fixed string).
expect() {
  local code=$1 text=$2
  shift 2
  set +e
  "$@" > out.txt 2> err.txt
  local rc=$?
  set -e
  [ "$rc" -eq "$code" ] || fail "$*: exit $rc, expected $code; stderr: $(cat err.txt)"
  [ -z "$text" ] || grep -qF -- "$text" err.txt || fail "$*: stderr lacks '$text': $(cat err.txt)"
  if grep -q "internal error" err.txt; then fail "$*: internal error: $(cat err.txt)"; fi
  echo "ok: $* -> exit $rc, '$text'"
}

# A tiny model and its own 300-id tokenizer, trained for one step.
cat "$ROOT/README.md" "$ROOT"/docs/*.md > corpus.txt
"$TREX" tokenizer train --files corpus.txt --vocab-size 300 --out tok \
  --special-tokens "<｜begin▁of▁sentence｜>" "<｜end▁of▁sentence｜>" --bos "<｜begin▁of▁sentence｜>" > /dev/null
cat > run.toml <<TOML
[model]
vocab_size = 300
hidden_size = 32
num_hidden_layers = 2
first_k_dense_replace = 1
intermediate_size = 48
moe_intermediate_size = 16
n_routed_experts = 4
n_shared_experts = 1
num_experts_per_tok = 2
num_attention_heads = 2
q_lora_rank = 16
kv_lora_rank = 12
qk_nope_head_dim = 8
qk_rope_head_dim = 4
v_head_dim = 8
max_position_embeddings = 64

[data]
train = ["corpus.txt"]
tokenizer = "tok/tokenizer.json"
seq_len = 32
cache_dir = "none"

[train]
steps = 1
precision = "fp32"

[checkpoint]
dir = "run"

[log]
progress = "lines"
TOML
"$TREX" train --config run.toml > train.log 2>&1 || fail "train: $(cat train.log)"
CK=run/checkpoints/step-00000001
[ -f "$CK/model.safetensors" ] || fail "no checkpoint at $CK"
cp tok/tokenizer.json "$CK/"
echo '{"input_ids": [[5, 6, 7, 8, 9, 10]]}' > batch.json

# Healthy checkpoint: grad and generate work.
expect 0 "" "$TREX" grad --model "$CK" --batch batch.json --out grads.safetensors
[ -s grads.safetensors ] || fail "grad wrote no gradients"

# generate --prompt --output writes the file (before: nothing was written).
expect 0 "finish" "$TREX" generate --model "$CK" --prompt "the model" --max-tokens 5 --output gen.jsonl
[ -s gen.jsonl ] || fail "generate --output wrote no file"
grep -q '"output"' gen.jsonl || fail "gen.jsonl holds no result: $(cat gen.jsonl)"

# --max-tokens far past max_position_embeddings (64): capped with a warning, finishes.
expect 0 "--max-tokens 100000" timeout 120 "$TREX" generate --model "$CK" --prompt "the model" --max-tokens 100000
grep -qF "max_position_embeddings (64)" err.txt || fail "the warning does not name the limit: $(cat err.txt)"

# A tokenizer with more ids than the model's vocabulary.
expect 2 "the tokenizer has 3000 ids but the model's vocab_size is 300" \
  "$TREX" generate --model "$CK" --prompt hi --tokenizer "$ROOT/tests/data/tokenizer/trex_trained.json"

# Patch the f32 data of model.safetensors: poke OFFSET_IN_DATA HEX_BYTES_REPEATED COUNT.
poke() {
  python3 - "$1" "$2" "$3" "$4" <<'PY'
import struct, sys
path, off, pattern, count = sys.argv[1], int(sys.argv[2]), bytes.fromhex(sys.argv[3]), sys.argv[4]
with open(path, "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    f.seek(0, 2)
    size = f.tell()
    start = 8 + n + off
    count = (size - start) // len(pattern) if count == "all" else int(count)
    f.seek(start)
    f.write(pattern * count)
PY
}

# A NaN weight: grad and generate refuse the checkpoint and name the tensor (before: grad printed
# {"loss": nan} and exited 0; generate printed nothing and exited 0).
# The checkpoint's manifest goes (a checkpoint from elsewhere has none; with it the checksum would
# name the damaged file first, tests/faults/corrupt_resume.sh).
cp -r "$CK" nan
rm -f nan/manifest.json
poke nan/model.safetensors 64 0000c07f 1
expect 2 "NaN / Inf values" "$TREX" grad --model nan --batch batch.json --out nan_grads.safetensors
grep -qF "tensor '" err.txt || fail "no tensor named: $(cat err.txt)"
[ ! -e nan_grads.safetensors ] || fail "grad wrote gradients of a NaN checkpoint"
expect 2 "NaN / Inf values" "$TREX" generate --model nan --prompt hi
# The same damage with the manifest in place: the checksum names the file before any weight is read.
cp -r "$CK" nan_manifest
poke nan_manifest/model.safetensors 64 0000c07f 1
expect 2 "the file is damaged" "$TREX" generate --model nan_manifest --prompt hi

# Finite weights so large that the bf16 forward overflows to a NaN loss: grad says so, writes
# nothing (before: {"loss": nan} and exit 0).
cp -r "$CK" huge
rm -f huge/manifest.json
poke huge/model.safetensors 0 ffff7f7f all
expect 2 "not a number" "$TREX" grad --model huge --batch batch.json --precision bf16 --out huge_grads.safetensors
[ ! -e huge_grads.safetensors ] || fail "grad wrote gradients for a NaN loss"

# A benchmark step larger than the machine's memory is refused with the estimate, as training is
# (not killed by the OS partway).
expect 2 "the run needs about" "$TREX" bench step --config "$ROOT/configs/bench-v3.toml" --steps 1 --warmup 0 \
  --set train.batch_size=100000

# Devices: an unknown name is refused by every command that takes --device; cuda without a usable
# CUDA device (no GPU here, or a build without the CUDA backend) names train.device / --device and
# why. (On a GPU machine the step runs there, except for what docs/BACKENDS.md lists as refused.)
expect 2 'unknown device "tpu"' "$TREX" train --config run.toml --device tpu
expect 2 'unknown device "cuda:x"' "$TREX" grad --model "$CK" --batch batch.json --out g.safetensors --device cuda:x
expect 2 'train.device = "cuda"' "$TREX" train --config run.toml --device cuda
expect 2 '--device = "cuda"' "$TREX" generate --model "$CK" --prompt hi --device cuda
expect 2 'train.device = "cuda:1"' "$TREX" bench step --config run.toml --device cuda:1
expect 0 "" "$TREX" grad --model "$CK" --batch batch.json --out grads_cpu.safetensors --device cpu
cmp grads.safetensors grads_cpu.safetensors || fail "grad --device cpu differs from the default"

# tokenizer train on an empty file.
: > empty.txt
expect 2 "no text to train on" "$TREX" tokenizer train --files empty.txt --vocab-size 300 --out tok_empty

# Filesystem errors name the path and the operation (before: "internal error: filesystem error").
expect 2 "/proc/trex_nowhere" "$TREX" convert --model "$CK" --out /proc/trex_nowhere
expect 2 "/proc/trex_nowhere/demo" "$TREX" demo --out /proc/trex_nowhere/demo
grep -qF "cannot create directories" err.txt || fail "the operation is not named: $(cat err.txt)"

# demo starts from scratch, but never by deleting a folder it did not write.
mkdir -p mine && echo keep > mine/notes.txt
expect 2 "was not written by trex demo" "$TREX" demo --out mine
[ "$(cat mine/notes.txt)" = keep ] || fail "demo --out removed a user's file"

cd /
rm -rf "$WORK"
echo "cli_user_errors: all passed"
