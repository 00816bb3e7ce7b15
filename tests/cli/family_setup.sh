# Sourced by the command tests of tests/cli (v2_commands.sh, v32_commands.sh, v4_generate.sh) with
# TREX (the binary) and NAME (the work directory's prefix) set: makes and enters the work directory
# WORK, defines fail MESSAGE (prints it and where the work files are kept, exits 1) and run CMD...
# (runs it with its output in out.txt / err.txt, failing on a non-zero exit), and writes
# corpus.txt (the repository's prose), tok/ (a 300-id BPE with DeepSeek's chat tokens) and
# chats.jsonl (40 one-turn SFT chats).
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
