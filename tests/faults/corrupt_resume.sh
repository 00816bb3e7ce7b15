#!/usr/bin/env bash
# Fault injection (issue 27, integrity): one byte of the newest checkpoint's weights is flipped,
# then the run continues with `--resume auto`. The damaged file must be named, the previous
# checkpoint used, and the final losses and checkpoint must equal those of a run resumed from that
# previous checkpoint directly (the same run directory without the damaged checkpoint).
# First, the old behaviour is reproduced: without the manifest (checkpoints before checksums) the
# damaged checkpoint is loaded without a word.
#
#   tests/faults/corrupt_resume.sh TREX_BINARY
#
# Run by CTest as faults_corrupt_resume. Work files go to a temporary directory (removed on
# success, kept and named on failure).
set -euo pipefail
TREX=$(realpath "$1")
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/trex_corrupt.XXXXXX")
cd "$WORK"
MORE=14

# Data and run config: tests/faults/tiny_run.sh.
source "$ROOT/tests/faults/tiny_run.sh"
tiny_run 10 2 3


"$TREX" train --config run.toml --set checkpoint.run_dir=\"damaged\" > first.log 2>&1 || fail "the first run failed"
ck10=damaged/checkpoints/step-00000010
ck8=damaged/checkpoints/step-00000008
[ -f "$ck10/manifest.json" ] && [ -f "$ck8/manifest.json" ] || fail "no manifest in the checkpoints"
[ -f "$ck10/tokenizer.json" ] || fail "the checkpoint does not carry tokenizer.json"
cp -r damaged reference
rm -rf reference/checkpoints/step-00000010
# Flip one bit of the last byte of the weights (the sign / exponent byte of the last f32 value).
python3 - "$ck10/model.safetensors" <<'PY'
import os, sys
p = sys.argv[1]
with open(p, "r+b") as f:
    f.seek(os.path.getsize(p) - 1)
    b = f.read(1)[0]
    f.seek(-1, 1)
    f.write(bytes([b ^ 0x10]))
PY
cp -r damaged old

# 1. The old behaviour: without checksums the damaged checkpoint is the one resumed from.
rm "old/checkpoints/step-00000010/manifest.json"
"$TREX" train --config run.toml --set checkpoint.run_dir=\"old\" --set train.steps=$MORE --resume auto > old.log 2>&1 ||
  fail "the run without a manifest failed (old.log)"
grep -q "resumed from old/checkpoints/step-00000010" old.log || fail "without a manifest the run did not load the damaged checkpoint"
echo "without a manifest: resumed from the damaged step-00000010 without a word (the old behaviour)"

# 2. With checksums: named, skipped, the previous checkpoint used.
"$TREX" train --config run.toml --set checkpoint.run_dir=\"damaged\" --set train.steps=$MORE --resume auto > damaged.log 2>&1 ||
  fail "the resumed run failed (damaged.log)"
grep -q "skipping damaged checkpoint $ck10: $ck10/model.safetensors: checksum crc32" damaged.log ||
  fail "the damaged file is not named (damaged.log)"
grep -q "resumed from $ck8" damaged.log || fail "the run did not resume from the previous checkpoint (damaged.log)"

"$TREX" train --config run.toml --set checkpoint.run_dir=\"reference\" --set train.steps=$MORE --resume auto > reference.log 2>&1 ||
  fail "the reference run failed"
grep -q "resumed from reference/checkpoints/step-00000008" reference.log || fail "the reference did not resume from step 8"

final=$(printf 'step-%08d' "$MORE")
for f in model.safetensors optimizer.safetensors; do
  cmp -s "reference/checkpoints/$final/$f" "damaged/checkpoints/$final/$f" || fail "$final/$f differs from the reference"
done
if ! diff <(losses reference/metrics.jsonl) <(losses damaged/metrics.jsonl) > losses.diff; then
  head -20 losses.diff
  fail "per-step losses differ from the run resumed from step 8"
fi
echo "OK: the flipped byte in $ck10/model.safetensors was named, step 8 was used, and the losses of steps 9-$MORE and the final checkpoint equal the reference bit for bit"
rm -rf "$WORK"
