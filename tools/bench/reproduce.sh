#!/usr/bin/env bash
# Re-measures the headline table of BENCHMARKS.md on the machine at hand, in one run:
#   - the machine's peak (`trex bench peak`, best of 3 tries), against which every MFU of the run is computed;
#   - bench-v3 and bench-v4 training steps, trex against the PyTorch peers (eager + bf16 autocast,
#     torch.compile; tools/peer/peer_bench.py) on the same threads, batch, sequence and precision;
#   - activation recompute none / full (bench-v3, bench-v4);
#   - scaling: bench-v3 at seq 1024-8192, and cut to 3 layers with 16-128 experts (same active size);
#   - data and expert parallel overlap: bench-v3 on 1 rank x T threads, dp R, dp R + ep R
#     (R ranks x T/R threads under mpirun).
# It prints the machine (CPU model, cores, ISA flags), date and commit, keeps every raw JSON line
# under the raw folder, and writes benchmarks/results/<date>-<time>-<host kind>[-quick].md (the
# markdown table) and .json (machine, command, every measured row).
#
# usage: tools/bench/reproduce.sh [--quick] [--peers "eager compile"|none] [--trex PATH]
#          [--threads T] [--ranks R] [--note TEXT] [--results DIR] [--raw DIR] [--dry-run]
#   --quick    fewer steps (trex: 2 measured on bench-v3/v4 and 1 on the other rows, after 1
#              warm-up; peers: 1 measured), the same rows as the full run
#   --peers    PyTorch modes to run (default "eager compile" when .venv has torch + transformers;
#              without them the peer rows say "peer not installed (make pyref)")
#   --note     a sentence printed with the results (e.g. what else ran on the machine)
#   --update-benchmarks  also replace the headline block of BENCHMARKS.md (between its
#              "headline: begin/end" markers) with this run's table
#   --dry-run  print the commands and write nothing
# Full run: 5 measured steps (bench-v3/v4), 3 on the other rows and for the peers. On a 2-core
# AVX2 machine a PyTorch eager step of bench-v3 takes minutes: use --peers none to skip them.
set -euo pipefail
cd "$(dirname "$0")/../.."
QUICK=0; TREX=build/trex; THREADS=$(nproc); RANKS=2; NOTE=""; RESULTS=benchmarks/results; RAW=""; DRY=0; UPDATE=0
PEERS=default
while [ $# -gt 0 ]; do
  case $1 in
    --quick) QUICK=1; shift ;;
    --peers) PEERS=$2; shift 2 ;;
    --trex) TREX=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --ranks) RANKS=$2; shift 2 ;;
    --note) NOTE=$2; shift 2 ;;
    --results) RESULTS=$2; shift 2 ;;
    --raw) RAW=$2; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    --update-benchmarks) UPDATE=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "reproduce.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
COMMAND="tools/bench/reproduce.sh"
[ "$QUICK" = 1 ] && COMMAND="$COMMAND --quick"
[ "$PEERS" != default ] && COMMAND="$COMMAND --peers \"$PEERS\""
[ "$THREADS" != "$(nproc)" ] && COMMAND="$COMMAND --threads $THREADS"
[ "$TREX" != build/trex ] && COMMAND="$COMMAND --trex $TREX"
[ "$RANKS" != 2 ] && COMMAND="$COMMAND --ranks $RANKS"
[ -n "$NOTE" ] && COMMAND="$COMMAND --note \"$NOTE\""

if [ "$QUICK" = 1 ]; then MAIN_STEPS=2; ROW_STEPS=1; PEER_STEPS=1; else MAIN_STEPS=5; ROW_STEPS=3; PEER_STEPS=3; fi
PEER_STATUS=""
if [ "$PEERS" = default ]; then
  if .venv/bin/python -c 'import torch, transformers' >/dev/null 2>&1; then PEERS="eager compile"
  else PEERS=none; PEER_STATUS="peer not installed (make pyref)"; fi
elif [ "$PEERS" = none ]; then PEER_STATUS="peer not run (--peers none)"
elif ! .venv/bin/python -c 'import torch, transformers' >/dev/null 2>&1; then
  PEERS=none; PEER_STATUS="peer not installed (make pyref)"
fi
[ "$PEERS" = none ] && PEERS=""

# ---- the machine ----
cpuinfo() { grep -m1 "^$1" /proc/cpuinfo | sed 's/^[^:]*: *//'; }
CPU_MODEL=$(cpuinfo 'model name')
CPU_VENDOR=$(cpuinfo 'vendor_id')
CPU_FAMILY=$(cpuinfo 'cpu family'); CPU_MODEL_NO=$(cpuinfo 'model[[:space:]]*:')
FLAGS=" $(cpuinfo flags) "
ISA_FLAGS=""
for f in fma f16c avx2 avx512f avx512bw avx512vl avx512dq avx512_vnni avx512_bf16 avx512_fp16 amx_tile amx_bf16; do
  case "$FLAGS" in *" $f "*) ISA_FLAGS="$ISA_FLAGS $f" ;; esac
done
ISA_FLAGS=${ISA_FLAGS# }
CORES=$(nproc)
MEM_GIB=$(awk '/MemTotal/ {printf "%.0f", $2 / 1048576}' /proc/meminfo)
HYPERVISOR=$(grep -qw hypervisor /proc/cpuinfo && echo "virtual machine" || echo "bare metal")
case " $ISA_FLAGS " in
  *" avx512_bf16 "*) ISA_KIND=avx512bf16 ;; *" avx512f "*) ISA_KIND=avx512 ;; *" avx2 "*) ISA_KIND=avx2 ;; *) ISA_KIND=x86 ;;
esac
SLUG=$(echo "$CPU_MODEL" | sed -E 's/\((R|TM|tm|r)\)//g; s/ CPU.*//; s/@.*//; s/[0-9]+-Core Processor//; s/Processor//' |
       tr 'A-Z' 'a-z' | tr -cs 'a-z0-9' '-' | sed 's/^-//; s/-$//' | cut -d- -f1-3)
HOST_KIND="${SLUG:-cpu}-$ISA_KIND-${CORES}c"
DATE=$(date -u +%F); TIME=$(date -u +%H%M); START_ISO=$(date -u +%FT%TZ)
COMMIT=$(git rev-parse --short=7 HEAD 2>/dev/null || echo unknown)
DIRTY=""; [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] && DIRTY=" (with uncommitted changes)"
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
STEM="$DATE-$TIME-$HOST_KIND"; [ "$QUICK" = 1 ] && STEM="$STEM-quick"
RAW=${RAW:-runs/bench/$STEM}

echo "[reproduce] machine: $CPU_MODEL ($CPU_VENDOR family $CPU_FAMILY model $CPU_MODEL_NO), $CORES cores, $MEM_GIB GiB, $HYPERVISOR"
echo "[reproduce] ISA flags: $ISA_FLAGS"
echo "[reproduce] date $START_ISO, commit $COMMIT$DIRTY, load average $LOAD_START"
echo "[reproduce] command: $COMMAND; peers: ${PEERS:-$PEER_STATUS}; raw output: $RAW"

ROOT=(); [ "$(id -u)" = 0 ] && ROOT=(--allow-run-as-root)
MPI=(mpirun "${ROOT[@]}" --oversubscribe -np "$RANKS" -x TREX_THREADS=$((THREADS / RANKS > 0 ? THREADS / RANKS : 1)))
STEP=("$TREX" bench step)

if [ "$DRY" = 1 ]; then
  run() { shift; echo "$*"; }
else
  [ -x "$TREX" ] || { echo "reproduce.sh: $TREX not found: build it first (make build) or pass --trex PATH" >&2; exit 1; }
  mkdir -p "$RAW"
  : > "$RAW/runs.tsv"
  # run NAME CMD...: stdout's last JSON line -> RAW/NAME.json, stderr -> RAW/NAME.err; a failure is recorded, not fatal.
  run() {
    local name=$1; shift
    local t0=$SECONDS rc=0 load
    load=$(cut -d' ' -f1 /proc/loadavg)
    echo "[reproduce] $name (load average $load): $*" >&2
    "$@" > "$RAW/$name.out" 2> "$RAW/$name.err" || rc=$?
    grep '^{' "$RAW/$name.out" | tail -1 > "$RAW/$name.json" || true
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" "$load" "$*" >> "$RAW/runs.tsv"
    [ "$rc" = 0 ] || echo "[reproduce] $name failed (exit $rc): see $RAW/$name.err" >&2
  }
fi

export TREX_THREADS=$THREADS
# The peak: best of 3 tries (a busy machine reads low on a single one), as `trex bench step` does;
# 3 more at the end, and the table's MFU is against the best of all 6.
for i in 1 2 3; do run peak-$i "$TREX" bench peak --threads "$THREADS"; done
if [ "$DRY" = 1 ]; then PEAK=PEAK; else
  PEAK=$(python3 - "$RAW" <<'PY'
import json, sys
tries = []
for i in (1, 2, 3):
    try:
        tries.append(json.load(open(f"{sys.argv[1]}/peak-{i}.json")))
    except (OSError, ValueError):
        pass
if not tries:
    sys.exit("reproduce.sh: trex bench peak failed")
best = max(tries, key=lambda t: t["best_gflops"])
json.dump(best, open(f"{sys.argv[1]}/peak.json", "w"))
print(best["best_gflops"])
PY
)
fi
S=(--warmup 1 --peak-gflops "$PEAK")
for c in v3 v4; do
  run "$c" "${STEP[@]}" --config configs/bench-$c.toml --steps $MAIN_STEPS "${S[@]}"
  for m in $PEERS; do
    warm=1; [ "$m" = compile ] && warm=2
    run "$c.peer-$m" .venv/bin/python tools/peer/peer_bench.py configs/bench-$c.toml --mode "$m" \
      --steps $((PEER_STEPS + warm)) --warmup $warm --threads "$THREADS"
  done
  run "$c.recompute-full" "${STEP[@]}" --config configs/bench-$c.toml --steps $ROW_STEPS "${S[@]}" --set train.recompute=full
done
for s in 1024 4096 8192; do
  run "v3.seq-$s" "${STEP[@]}" --config configs/bench-v3.toml --steps $ROW_STEPS "${S[@]}" --set data.seq_len=$s
done
for e in 16 32 64 128; do
  run "v3.experts-$e" "${STEP[@]}" --config configs/bench-v3.toml --steps $ROW_STEPS "${S[@]}" \
    --set model.num_hidden_layers=3 --set model.n_routed_experts=$e
done
run "v3.dp$RANKS" "${MPI[@]}" "${STEP[@]}" --config configs/bench-v3.toml --steps $ROW_STEPS "${S[@]}"
run "v3.dp$RANKS-ep$RANKS" "${MPI[@]}" "${STEP[@]}" --config configs/bench-v3.toml --steps $ROW_STEPS "${S[@]}" \
  --set parallel.ep=$RANKS
for i in 4 5 6; do run peak-$i "$TREX" bench peak --threads "$THREADS"; done
[ "$DRY" = 1 ] && exit 0

LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)
mkdir -p "$RESULTS"
RUNTIME=$SECONDS
export CPU_MODEL CPU_VENDOR CPU_FAMILY CPU_MODEL_NO CORES MEM_GIB HYPERVISOR ISA_FLAGS HOST_KIND DATE START_ISO \
  RUNTIME COMMIT DIRTY COMMAND QUICK THREADS RANKS PEERS PEER_STATUS LOAD_START LOAD_END NOTE MAIN_STEPS ROW_STEPS PEER_STEPS
python3 - "$RAW/meta.json" <<'PY'
import json, os, sys, time
e = os.environ
json.dump({
  "cpu_model": e["CPU_MODEL"], "cpu_vendor": e["CPU_VENDOR"], "cpu_family": e["CPU_FAMILY"],
  "cpu_model_number": e["CPU_MODEL_NO"], "cores": int(e["CORES"]), "memory_gib": int(e["MEM_GIB"]),
  "virtualization": e["HYPERVISOR"], "isa_flags": e["ISA_FLAGS"], "host_kind": e["HOST_KIND"],
  "date": e["DATE"], "start": e["START_ISO"], "end": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
  "runtime_s": int(e["RUNTIME"]), "commit": e["COMMIT"], "commit_note": e["DIRTY"].strip(),
  "command": e["COMMAND"], "quick": e["QUICK"] == "1", "threads": int(e["THREADS"]), "ranks": int(e["RANKS"]),
  "peers": e["PEERS"].split(), "peer_status": e["PEER_STATUS"], "load_start": e["LOAD_START"],
  "load_end": e["LOAD_END"], "note": e["NOTE"],
  "steps": {"main": int(e["MAIN_STEPS"]), "rows": int(e["ROW_STEPS"]), "peers": int(e["PEER_STEPS"])},
}, open(sys.argv[1], "w"), indent=1)
PY
python3 tools/bench/report.py "$RAW" --md "$RESULTS/$STEM.md" --json "$RESULTS/$STEM.json"
cat "$RESULTS/$STEM.md"
if [ "$UPDATE" = 1 ]; then
  python3 - BENCHMARKS.md "$RESULTS/$STEM.md" "$RESULTS/$STEM" <<'PY'
import re, sys
path, md, stem = sys.argv[1:]
text, table = open(path).read(), open(md).read().rstrip("\n")
block = (f"<!-- headline: begin (written by tools/bench/reproduce.sh --update-benchmarks) -->\n{table}\n\n"
         f"Files: `{stem}.md` (this table), `{stem}.json` (machine, command, every run's JSON line).\n"
         "<!-- headline: end -->")
new, n = re.subn(r"<!-- headline: begin.*?<!-- headline: end -->", lambda m: block, text, flags=re.S)
if n != 1:
    sys.exit("reproduce.sh: BENCHMARKS.md has no headline: begin/end markers")
open(path, "w").write(new)
PY
  echo "[reproduce] BENCHMARKS.md: headline replaced" >&2
fi
echo "[reproduce] wrote $RESULTS/$STEM.md and $RESULTS/$STEM.json in $SECONDS s" >&2
if awk -F'\t' '$2 != 0 {bad = 1} END {exit !bad}' "$RAW/runs.tsv"; then
  echo "[reproduce] some runs failed (see the table and $RAW/*.err)" >&2; exit 1
fi
