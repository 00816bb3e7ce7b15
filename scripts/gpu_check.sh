#!/usr/bin/env bash
# The GPU check of the CUDA backend, one run on one NVIDIA GPU from a fresh machine (under 8
# minutes on an H200). The binaries come from .gpu/bundle.tar.xz when it is there (made on the
# build machine by scripts/gpu_bundle.sh: trex and trex_cuda_ops with their libraries and loader,
# so nothing is built on the GPU machine); else kernels/cuda and its op harness are built there
# (TREX_CUDA_ONLY: no oneDNN, CBC or MPI) and the parts that need trex are skipped. Then
#   1. trex_cuda_ops test: every CUDA kernel against the CPU reference, trex_ops's cases and bounds
#      (compute-sanitizer memcheck on small cases);
#   2. trex_cuda_ops perf: the cuBLASLt bf16 rate (the MFU peak), the expert grouped GEMM against one
#      dense GEMM of the same FLOPs, attention, RMSNorm, SwiGLU, LM head + CE;
#   3. trex grad --device cuda against --device cpu on the committed DeepSeek-V3 parity checkpoints
#      (tests/reference/data/v3_*) and two DeepSeek-V4 ones (v4_mtp, v4_rates_odd): fp32 loss 1e-5
#      and every gradient 1e-5 relative, bf16 reported;
#   4. trex bench step --device cuda on configs/bench-v3.toml, bench-v4.toml and bench-gpu-v3.toml
#      (hidden 2048, 64 experts, sequence 4096), MFU against the peak measured in 2;
#   5. the PyTorch + transformers peer on configs/bench-gpu-v3.toml, eager and torch.compile.
# usage: scripts/gpu_check.sh OUT_DIR        (results: OUT_DIR/summary.md and one file per part)
# A shorter run (each default in brackets): SANITIZER=0 [1], PERF_FILTER=TEXT (perf cases whose
# name contains it) [all], GRAD_PRECS="fp32" [fp32 bf16], BENCH_CONFIGS="bench-gpu-v3"
# [bench-v3 bench-v4 bench-gpu-v3], PEERS="eager" [eager compile], PROFILE=0 (no step profile) [1],
# PROFILE_ENV="VAR=value" (the profile again under that environment) [none], NCU=1 (kernel
# durations of a window of one step, NCU_SKIP / NCU_COUNT launches) [0]. An empty list runs
# none of its part (GRAD_PRECS="" skips the gradient check).
# Needs python3 with torch, transformers and safetensors; nvcc, CMake and ninja without a bundle.
# Exit 0 when every part passed.
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
  echo "checkout: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (+ uncommitted changes)')"
  [ -f .gpu/bundle.tar.xz ] && echo "bundle built from: $(tar -xJOf .gpu/bundle.tar.xz bundle/commit 2>/dev/null)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
  nvcc --version | tail -1 | sed 's/^/nvcc: /'
  python3 -c 'import torch, transformers; print("torch:", torch.__version__, "transformers:", transformers.__version__)' 2>&1
  echo "cpu: $(nproc) cores"
} > "$OUT/machine.txt"
cat "$OUT/machine.txt"

# The bundle's binaries run through its own loader and libraries, with CUDA's runtime and
# cuBLASLt from this machine.
TREX=()
OPS=()
if [ -f .gpu/bundle.tar.xz ]; then
  note "bundle .gpu/bundle.tar.xz (commit $(tar -xJOf .gpu/bundle.tar.xz bundle/commit 2>/dev/null))"
  BDIR=$(mktemp -d)
  tar -C "$BDIR" -xJf .gpu/bundle.tar.xz
  CUDA_LIBS=""
  for lib in libcudart.so.13 libcublasLt.so.13 libcuda.so.1; do
    p=$(ldconfig -p 2>/dev/null | awk -v l="$lib" '$1 == l {print $NF; exit}')
    [ -n "$p" ] || p=$(find /usr/local/cuda*/lib64 /usr/local/nvidia /usr/lib/x86_64-linux-gnu \
                         "$(python3 -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null)/nvidia" \
                         -name "$lib" 2>/dev/null | head -1)
    [ -n "$p" ] && CUDA_LIBS="$CUDA_LIBS:$(dirname "$p")"
  done
  LIBPATH="$BDIR/bundle/lib$CUDA_LIBS"
  echo "library path: $LIBPATH" >> "$OUT/machine.txt"
  TREX=("$BDIR/bundle/lib/ld.so" --library-path "$LIBPATH" "$BDIR/bundle/trex")
  OPS=("$BDIR/bundle/lib/ld.so" --library-path "$LIBPATH" "$BDIR/bundle/trex_cuda_ops")
  if ! "${TREX[@]}" --help > "$OUT/bundle_check.txt" 2>&1; then
    echo "the bundle's trex does not start here:"; tail -5 "$OUT/bundle_check.txt"
    TREX=()
    OPS=()
  fi
fi
if [ ${#OPS[@]} -eq 0 ]; then
  note "build ($BUILD, TREX_CUDA_ONLY=ON)"
  if ! { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTREX_CUDA_ONLY=ON \
           -DCMAKE_CUDA_ARCHITECTURES=90 && cmake --build "$BUILD" -j "$JOBS"; } > "$OUT/build.log" 2>&1; then
    tail -40 "$OUT/build.log"
    echo "FAIL: build (see $OUT/build.log)"
    exit 1
  fi
  OPS=("$BUILD/trex_cuda_ops")
fi

note "trex_cuda_ops test"
"${OPS[@]}" test > "$OUT/ops_test.txt" 2>&1
rc=$?
grep -E "^FAIL|^error" "$OUT/ops_test.txt" | head -30
tail -1 "$OUT/ops_test.txt"
[ $rc -eq 0 ] || status=1
# Attention has two CUDA paths (kernels/cuda/attention.cu); the cases above take the GEMM one.
TREX_CUDA_ATTENTION=flash "${OPS[@]}" test "cuda attn" > "$OUT/ops_test_flash.txt" 2>&1 || status=1
grep -E "^FAIL|^error" "$OUT/ops_test_flash.txt" | head -10
echo "flash attention path: $(tail -1 "$OUT/ops_test_flash.txt")"

# Memory and race checkers on a few small cases (where compute-sanitizer works: not under gVisor).
if [ "${SANITIZER:-1}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  note "compute-sanitizer memcheck + racecheck (small cases)"
  for filt in "T=7 " "cuda moe combine" "cuda gather" "cuda moe_sort" "cuda router" "cuda sattn N=7 " \
              "cuda indexer B=1 T=37 " "cuda hc_pre nulls" "cuda hc_post" "cuda hc_head" \
              "cuda compress_pool B=2 T=9 " "cuda v4 keys"; do
    f="$OUT/sanitizer_memcheck_${filt// /_}.txt"
    timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 "${OPS[@]}" test "$filt" > "$f" 2>&1
    rc=$?
    echo "compute-sanitizer memcheck '$filt': exit $rc ($(grep -c '^ok' "$f") checks)"
    [ $rc -eq 0 ] || { tail -20 "$f"; [ $rc -eq 9 ] && status=1; }
  done
fi

note "trex_cuda_ops perf"
"${OPS[@]}" perf "${PERF_FILTER:-}" > "$OUT/ops_perf.txt" 2>&1 || status=1
TREX_CUDA_ATTENTION=flash "${OPS[@]}" perf "cuda attn" 2>&1 | sed -n 's/^perf cuda attn/perf cuda attn (flash path)/p' \
  >> "$OUT/ops_perf.txt"
[ -n "${PERF_FILTER:-}" ] && "${OPS[@]}" perf "cuda gemm perf" 2>&1 | grep "^perf" >> "$OUT/ops_perf.txt"
cat "$OUT/ops_perf.txt"
PEAK=$(awk '/perf cuda gemm bf16->f32 M=8192 N=8192 K=8192/ {print $(NF-1)}' "$OUT/ops_perf.txt" | tail -1)
PEAK=${PEAK:-0}

if [ ${#TREX[@]} -gt 0 ]; then
  note "trex grad --device cuda against --device cpu (V3 and V4 parity checkpoints)"
  : > "$OUT/grad_parity.txt"
  for dir in tests/reference/data/v3_* tests/reference/data/v4_mtp tests/reference/data/v4_rates_odd; do
    c=$(basename "$dir")
    for prec in ${GRAD_PRECS-fp32 bf16}; do
      tol=1e-5; ltol=1e-5
      [ $prec = bf16 ] && tol=5e-2 && ltol=1e-2
      for d in cpu cuda; do
        timeout 60 "${TREX[@]}" grad --model "$dir/model" --batch "$dir/batch.json" --precision $prec --device $d \
          --out "$OUT/grad_${c}_${prec}_$d.safetensors" > "$OUT/grad_${c}_${prec}_$d.json" 2> "$OUT/grad_${c}_${prec}_$d.log"
      done
      python3 tools/gpu/compare_grads.py "$OUT/grad_${c}_${prec}_cuda.safetensors" "$OUT/grad_${c}_${prec}_cpu.safetensors" \
        --loss-a "$OUT/grad_${c}_${prec}_cuda.json" --loss-b "$OUT/grad_${c}_${prec}_cpu.json" --tol $tol \
        --loss-tol $ltol --label "$c $prec cuda vs cpu" >> "$OUT/grad_parity.txt" 2>&1 ||
        { [ $prec = fp32 ] && status=1; tail -3 "$OUT/grad_${c}_${prec}_cuda.log"; }
      if [ $prec = bf16 ]; then  # the same with the attention's GEMMs in f32: what the bf16 attention adds
        TREX_CUDA_ATTENTION=gemm timeout 60 "${TREX[@]}" grad --model "$dir/model" --batch "$dir/batch.json" \
          --precision bf16 --device cuda --out "$OUT/grad_${c}_bf16_cuda32.safetensors" \
          > "$OUT/grad_${c}_bf16_cuda32.json" 2> "$OUT/grad_${c}_bf16_cuda32.log"
        python3 tools/gpu/compare_grads.py "$OUT/grad_${c}_bf16_cuda32.safetensors" "$OUT/grad_${c}_bf16_cpu.safetensors" \
          --loss-a "$OUT/grad_${c}_bf16_cuda32.json" --loss-b "$OUT/grad_${c}_bf16_cpu.json" --tol $tol \
          --loss-tol $ltol --label "$c bf16 cuda (f32 attention) vs cpu" >> "$OUT/grad_parity.txt" 2>&1
      fi
      rm -f "$OUT"/grad_${c}_${prec}_*.safetensors  # compared: keep the folder small
    done
  done
  grep -E "^ok|^FAIL" "$OUT/grad_parity.txt"

  for cfg in ${BENCH_CONFIGS-bench-v3 bench-v4 bench-gpu-v3}; do
    note "trex bench step --device cuda on configs/$cfg.toml"
    timeout 150 "${TREX[@]}" bench step --config "configs/$cfg.toml" --device cuda --steps 4 --warmup 1 \
      --peak-gflops "$(python3 -c "print(float('$PEAK') * 1000)")" > "$OUT/trex_step_$cfg.json" 2> "$OUT/trex_step_$cfg.log" ||
      { echo "trex bench step $cfg failed:"; tail -5 "$OUT/trex_step_$cfg.log"; status=1; }
    tail -1 "$OUT/trex_step_$cfg.json"
  done
  # Where the step's time goes: --profile synchronizes the device at each region's edges.
  if [ "${PROFILE:-1}" = 1 ]; then
    note "trex bench step --profile --device cuda on configs/bench-gpu-v3.toml"
    timeout 120 "${TREX[@]}" bench step --config configs/bench-gpu-v3.toml --device cuda --steps 3 --warmup 1 \
      --profile > "$OUT/trex_profile_bench-gpu-v3.json" 2> "$OUT/trex_profile_bench-gpu-v3.txt" || status=1
    grep -v "^\[" "$OUT/trex_profile_bench-gpu-v3.txt" | head -60
    # NCU=1: every kernel's duration over a window of one step's launches (Nsight Compute, where
    # the machine lets it read the GPU: not under gVisor), to see which kernels a region's time is.
    if [ "${NCU:-0}" = 1 ] && command -v ncu > /dev/null; then
      note "ncu: kernel durations, launches ${NCU_SKIP:-3000}.. of one bench-gpu-v3 step"
      timeout 240 ncu --clock-control none --csv --metrics gpu__time_duration.sum --launch-skip "${NCU_SKIP:-3000}" \
        --launch-count "${NCU_COUNT:-600}" "${TREX[@]}" bench step --config configs/bench-gpu-v3.toml --device cuda \
        --steps 1 --warmup 1 > "$OUT/ncu_bench-gpu-v3.csv" 2> "$OUT/ncu_bench-gpu-v3.log" ||
        echo "ncu failed (exit $?): $(tail -2 "$OUT/ncu_bench-gpu-v3.log")"
      python3 - "$OUT/ncu_bench-gpu-v3.csv" <<'PY' || true
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if rows:
    h = rows[0]; k, v, u = h.index("Kernel Name"), h.index("Metric Value"), h.index("Metric Unit")
    scale = {"nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9}
    tot = collections.Counter(); cnt = collections.Counter()
    for r in rows[1:]:
        try: tot[r[k][:90]] += float(r[v].replace(",", "")) * scale.get(r[u], 1); cnt[r[k][:90]] += 1
        except ValueError: pass
    for name, ns in tot.most_common(15): print(f"{ns / 1e6:9.3f} ms {cnt[name]:6d} calls  {name}")
PY
    fi
    # PROFILE_ENV="VAR=value ...": the same profile again under those settings (an A/B in one run).
    if [ -n "${PROFILE_ENV:-}" ]; then
      env $PROFILE_ENV timeout 120 "${TREX[@]}" bench step --config configs/bench-gpu-v3.toml --device cuda --steps 3 \
        --warmup 1 --profile > "$OUT/trex_profile_b_bench-gpu-v3.json" 2> "$OUT/trex_profile_b_bench-gpu-v3.txt" || status=1
    fi
  fi
else
  echo "trex grad / bench step on cuda: skipped (no bundle: run scripts/gpu_bundle.sh on the build machine)" |
    tee "$OUT/grad_parity.txt"
fi

# PEERS: the PyTorch modes to run (default both).
for mode in ${PEERS-eager compile}; do
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
  echo "## trex grad, cuda against cpu (tools/gpu/compare_grads.py)"
  echo
  sed 's/^/    /' "$OUT/grad_parity.txt"
  echo
  echo "## Training step, configs/bench-gpu-v3.toml (bf16, AdamW, batch 1 x 4096), bench-v3 and bench-v4"
  echo
  echo "| who | step ms (median) | tokens/s | MFU vs measured peak | peak GPU memory GB |"
  echo "| --- | --- | --- | --- | --- |"
  for cfg in ${BENCH_CONFIGS-bench-v3 bench-v4 bench-gpu-v3}; do
    python3 - "$OUT/trex_step_$cfg.json" "$cfg" <<'PY' || echo "| trex $2 | failed | | | |"
import json, sys
try:
    r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
    print(f"| trex cuda, {sys.argv[2]} | {r.get('step_ms_median', r.get('ms_median'))} | {r.get('tokens_per_s')} | {r.get('mfu')} | |")
except Exception as e:
    print(f"| trex cuda, {sys.argv[2]} | failed ({type(e).__name__}) | | | |")
PY
  done
  for mode in ${PEERS-eager compile}; do
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
} > "$OUT/summary.md"
note "done, status $status"
cat "$OUT/summary.md" | tail -12
exit $status
