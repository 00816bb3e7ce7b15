#!/usr/bin/env bash
# Python for judging solver-code outputs (trex or eval, docs/OR.md "Solver-code outputs"): PuLP
# (with its bundled CBC) and Pyomo in .venv/ (the same folder as make pyref's; TREX_VENV to change).
# Pyomo's CBC / GLPK executables come from Debian (scripts/deps.sh: coinor-cbc glpk-utils).
# gurobipy and coptpy come from PyPI too, each with the size-limited licence its wheel carries
# (no licence file needed for small models); where pip cannot install them, the script says so and
# goes on: their programs are then reported "solver_unavailable" and their tests are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TREX_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import pulp, pyomo.environ" >/dev/null 2>&1; then
  "$VENV/bin/pip" install -q pulp pyomo
fi
for m in gurobipy coptpy; do
  if ! "$VENV/bin/python" -c "import $m" >/dev/null 2>&1; then
    "$VENV/bin/pip" install -q "$m" || echo "[orpy] pip could not install $m: its programs will be solver_unavailable"
  fi
done
"$VENV/bin/python" - <<'PY'
import importlib
for m in ("pulp", "pyomo", "gurobipy", "coptpy"):
    try:
        print(m, getattr(importlib.import_module(m), "__version__", "installed"))
    except Exception as e:
        print(m, "not available:", type(e).__name__)
PY
