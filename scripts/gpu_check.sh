#!/usr/bin/env bash
# The GPU check of the CUDA backend, one run on one NVIDIA GPU from a fresh machine (about 5 of
# its 8 minutes on an H200). Builds kernels/cuda and its op harness there (TREX_CUDA_ONLY: no
# oneDNN, CBC or MPI needed), then
#   1. trex_cuda_ops test: every CUDA kernel against the CPU reference, trex_ops's cases and bounds;
#   2. trex_cuda_ops perf: the cuBLASLt bf16 rate (the MFU peak), the expert grouped GEMM against one
#      dense GEMM of the same FLOPs, attention, RMSNorm, SwiGLU, LM head + CE;
#   3. the PyTorch + transformers peer on configs/bench-gpu-v3.toml (hidden 2048, 64 experts,
#      sequence 4096), eager and torch.compile, MFU against the peak measured in 2.
# usage: scripts/gpu_check.sh OUT_DIR        (results: OUT_DIR/summary.md and one file per part)
# Needs nvcc, CMake, ninja, python3 with torch + transformers. Exit 0 when every part passed.
set -uo pipefail
OUT=${1:?usage: scripts/gpu_check.sh OUT_DIR}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-gpu}
JOBS=${JOBS:-$(nproc)}
status=0
t_start=$(date +%s)
note() { echo "[gpu_check $(( $(date +%s) - t_start ))s] $*"; }

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (+ uncommitted changes)')"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
  nvcc --version | tail -1 | sed 's/^/nvcc: /'
  python3 -c 'import torch, transformers; print("torch:", torch.__version__, "transformers:", transformers.__version__)' 2>&1
  echo "cpu: $(nproc) cores"
} > "$OUT/machine.txt"
cat "$OUT/machine.txt"

note "build ($BUILD, TREX_CUDA_ONLY=ON)"
if ! { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTREX_CUDA_ONLY=ON \
         -DCMAKE_CUDA_ARCHITECTURES=90 && cmake --build "$BUILD" -j "$JOBS"; } > "$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"
  echo "FAIL: build (see $OUT/build.log)"
  exit 1
fi

note "trex_cuda_ops test"
"$BUILD/trex_cuda_ops" test > "$OUT/ops_test.txt" 2>&1
rc=$?
grep -E "^FAIL|^error" "$OUT/ops_test.txt" | head -30
tail -1 "$OUT/ops_test.txt"
[ $rc -eq 0 ] || status=1

# Memory and race checkers on a few small cases (where compute-sanitizer works: not under gVisor).
if command -v compute-sanitizer >/dev/null; then
  note "compute-sanitizer memcheck + racecheck (small cases)"
  for tool in memcheck racecheck; do
    timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 "$BUILD/trex_cuda_ops" test "T=7 " \
      > "$OUT/sanitizer_$tool.txt" 2>&1
    rc=$?
    echo "compute-sanitizer $tool: exit $rc ($(grep -c '^ok' "$OUT/sanitizer_$tool.txt") checks)"
    [ $rc -eq 0 ] || { tail -20 "$OUT/sanitizer_$tool.txt"; [ $rc -eq 9 ] && status=1; }
  done
fi

note "trex_cuda_ops perf"
"$BUILD/trex_cuda_ops" perf > "$OUT/ops_perf.txt" 2>&1 || status=1
cat "$OUT/ops_perf.txt"
PEAK=$(awk '/perf cuda gemm bf16->f32 M=8192 N=8192 K=8192/ {print $(NF-1)}' "$OUT/ops_perf.txt")
PEAK=${PEAK:-0}

for mode in eager compile; do
  note "PyTorch peer ($mode) on configs/bench-gpu-v3.toml, peak $PEAK TFLOP/s"
  PYTHONUNBUFFERED=1 timeout 300 python3 tools/peer/peer_bench.py configs/bench-gpu-v3.toml --device cuda \
    --mode "$mode" --steps 8 --peak-tflops "$PEAK" > "$OUT/peer_$mode.json" 2> "$OUT/peer_$mode.log" || {
      echo "peer $mode failed (exit $?):"; tail -5 "$OUT/peer_$mode.log"; status=1; }
  cat "$OUT/peer_$mode.json"
done

{
  echo "# GPU check, $(sed -n 's/^gpu: //p' "$OUT/machine.txt" | head -1)"
  echo
  cat "$OUT/machine.txt" | sed 's/^/    /'
  echo
  echo "## CUDA op harness (trex_cuda_ops test)"
  echo
  echo "    $(tail -1 "$OUT/ops_test.txt")"
  echo
  echo "## Kernel rates (trex_cuda_ops perf)"
  echo
  sed 's/^/    /' "$OUT/ops_perf.txt"
  echo
  echo "## PyTorch peer, configs/bench-gpu-v3.toml (bf16 autocast, AdamW, batch 1 x 4096)"
  echo
  echo "| mode | step ms (median) | tokens/s | MFU vs measured peak | peak GPU memory GB |"
  echo "| --- | --- | --- | --- | --- |"
  for mode in eager compile; do
    python3 - "$OUT/peer_$mode.json" "$mode" <<'PY' || echo "| $2 | failed | | | |"
import json, sys
try:
    r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
    print(f"| {sys.argv[2]} | {r['step_ms_median']} | {r['tokens_per_s']} | {r.get('mfu', 'n/a')} | {r.get('peak_gpu_mem_gb')} |")
except Exception as e:
    print(f"| {sys.argv[2]} | failed ({type(e).__name__}) | | | |")
PY
  done
  echo
  echo "Not in this check yet: trex's own training step on the GPU (the model and trainer do not run on"
  echo "the backend seam yet), parity dumps and trex grad with --device cuda."
} > "$OUT/summary.md"
note "done, status $status"
cat "$OUT/summary.md" | tail -12
exit $status
