#!/usr/bin/env bash
# docs/CONFIG.md must be exactly what `trex config reference` prints: the reference is generated
# from the table the run config parser reads, so a key added to the parser without a type, default
# and meaning in docs/CONFIG.md fails here.
#
#   tests/cli/config_reference.sh TREX_BINARY
#
# Run by CTest as config_reference. To update the doc: trex config reference > docs/CONFIG.md
set -euo pipefail
TREX=$(realpath "$1")
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
if ! diff -u "$ROOT/docs/CONFIG.md" <("$TREX" config reference); then
  echo "FAIL: docs/CONFIG.md differs from 'trex config reference' (lines above: - the doc, + the binary)." >&2
  echo "Regenerate it: trex config reference > docs/CONFIG.md" >&2
  exit 1
fi
echo "config_reference: docs/CONFIG.md matches the parser's table"
