#!/usr/bin/env bash
# The repository's docs and benchmark results name no path of a particular machine: no /tmp/...,
# /root/..., /home/<user>/... or /work/... in BENCHMARKS.md, README.md, RELIABILITY.md, docs/,
# recipes/ and benchmarks/ (every figure's command must run from a fresh clone; scratch output
# goes to runs/ or out/, which git ignores). Prints each offending line and fails on any.
# usage: tests/cli/no_machine_paths.sh [REPO_ROOT]   (default: the repository holding this script)
set -euo pipefail
ROOT=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$ROOT"
TARGETS=()
for t in BENCHMARKS.md README.md RELIABILITY.md docs recipes benchmarks; do
  [ -e "$t" ] && TARGETS+=("$t")
done
[ ${#TARGETS[@]} -gt 0 ] || { echo "no_machine_paths: nothing to check under $ROOT" >&2; exit 1; }
# A path starts the word (line start, space, quote, backtick, =, (, [, :, ...), so URLs such as
# https://host/work/x do not match. -I skips binary files (images).
PATTERN='(^|[^A-Za-z0-9_.~/-])(/tmp/|/root/|/work/|/home/[A-Za-z0-9_.-]+)'
if hits=$(grep -rInE "$PATTERN" "${TARGETS[@]}"); then
  echo "machine paths found (use a path inside the repository, e.g. runs/ or out/, or a placeholder):" >&2
  echo "$hits" >&2
  exit 1
fi
echo "no_machine_paths: ${TARGETS[*]}: clean"
