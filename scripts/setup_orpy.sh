#!/usr/bin/env bash
# Python for judging solver-code outputs (trex or eval, docs/OR.md "Solver-code outputs"): PuLP
# (with its bundled CBC) and Pyomo in .venv/ (the same folder as make pyref's; TREX_VENV to change).
# Pyomo's CBC / GLPK executables come from Debian (scripts/deps.sh: coinor-cbc glpk-utils).
# gurobipy / coptpy are not installed: programs that need them are reported "solver_unavailable".
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TREX_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import pulp, pyomo.environ" >/dev/null 2>&1; then
  "$VENV/bin/pip" install -q pulp pyomo
fi
"$VENV/bin/python" -c "import pulp, pyomo; print('pulp', pulp.__version__, 'pyomo', pyomo.__version__)"
