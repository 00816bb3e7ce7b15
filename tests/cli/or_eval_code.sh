#!/usr/bin/env bash
# trex or eval end to end on the public-layout fixtures (tests/data/or/public/) and on Python
# solver-code predictions: per-set rows and rules, the failure counts in the summary, the failure
# and objective_source fields of the results lines, and --format refusing an unknown name.
# The Python part is skipped (saying so) without .venv/bin/python with PuLP (scripts/setup_orpy.sh).
# usage: tests/cli/or_eval_code.sh TREX
set -euo pipefail
TREX=$(realpath "$1")
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fail() { echo "or_eval_code: FAIL: $*" >&2; exit 1; }
P=tests/data/or/public

"$TREX" or eval --data "$P/mixed_sets.jsonl" --predictions "$P/predictions_lp.jsonl" --out "$W/mixed.jsonl" > "$W/mixed.txt"
tail -1 "$W/mixed.txt" | python3 -c '
import json, sys
s = json.loads(sys.stdin.read())
assert s["pass1_strict"] == 100.0, s
assert set(s["per_category"]) == {"nl4opt", "optmath", "industryor"}, s["per_category"].keys()
assert s["rules"] == {"nl4opt": "orlm", "optmath": "optmath", "industryor": "orlm"}, s["rules"]
' || fail "mixed sets: $(tail -1 "$W/mixed.txt")"
grep -q "answer rules:" "$W/mixed.txt" || fail "no answer rules line under the table"

if "$TREX" or eval --data "$P/NL4OPT_sample.jsonl" --predictions "$P/predictions_lp.jsonl" --format nosuch > "$W/bad.txt" 2>&1; then
  fail "--format nosuch was accepted"
fi
grep -q "nl4opt" "$W/bad.txt" || fail "--format nosuch: the message does not list the names: $(cat "$W/bad.txt")"

if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c "import pulp" 2>/dev/null; then
  echo "or_eval_code: SKIP the Python part: .venv/bin/python with PuLP not found (make orpy)"
  echo "or_eval_code: OK"
  exit 0
fi
python3 - "$W/preds.jsonl" <<'PY'
import json, sys
right = """```python
import pulp
m = pulp.LpProblem("bakery", pulp.LpMaximize)
loaves = pulp.LpVariable("loaves", 0)
cakes = pulp.LpVariable("cakes", 0, 12)
m += 3 * loaves + 5 * cakes
m += loaves + 2 * cakes <= 40
m.solve(pulp.PULP_CBC_CMD(msg=0))
```"""
garbage = "```python\nimport pulp\nm = pulp.LpProblem('x', \n```"
loop = "```python\nwhile True:\n    pass\n```"
with open(sys.argv[1], "w") as f:
    for o in (right, garbage, loop):
        f.write(json.dumps({"output": o}) + "\n")
PY
"$TREX" or eval --data "$P/IndustryOR_sample.json" --predictions "$W/preds.jsonl" --code-cpu 2 --code-wall 60 \
  --out "$W/code.jsonl" > "$W/code.txt"
tail -1 "$W/code.txt" | python3 -c '
import json, sys
s = json.loads(sys.stdin.read())
assert s["n"] == 3 and abs(s["pass1_strict"] - 100 / 3) < 1e-9, s
assert s["failures"] == {"parse_error": 1, "timeout": 1}, s["failures"]
assert s["kinds"] == {"python": 3}, s["kinds"]
' || fail "python predictions: $(tail -1 "$W/code.txt")"
python3 - "$W/code.jsonl" <<'PY' || fail "python results lines: $(cut -c1-300 "$W/code.jsonl")"
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
assert r[0]["failure"] is None and r[0]["objective_source"] == "pulp" and r[0]["objective"] == 120, r[0]
assert r[1]["failure"] == "parse_error", r[1]
assert r[2]["failure"] == "timeout" and r[2]["limit"] == "cpu", r[2]
assert "limit" not in r[0] and "limit" not in r[1], r[:2]
PY
grep -q "failures (judged outputs): parse_error 1 timeout 1" "$W/code.txt" || fail "no failures line: $(cat "$W/code.txt")"
echo "or_eval_code: OK"
