#!/usr/bin/env bash
# Creates the Python reference environment (torch + transformers + safetensors) under .venv/.
# Only the parity-dump script and the PyTorch peer benchmark use it; the build and CI never do.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TREX_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q torch transformers safetensors numpy
"$VENV/bin/python" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
