#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ (clang, ASan + UBSan) and runs each for a set time.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]      (default 60 s; all targets)
#
# TARGET is a name without the fuzz_ prefix: safetensors safetensors_index config tokenizer_json
# bpe_encode jsonl_data run_config lp mps. Targets run one after another, one process each.
# Environment:
#   FUZZ_BUILD    build directory (default build-fuzz, git-ignored by /build*/)
#   FUZZ_JOBS     build parallelism (default 2)
#   FUZZ_TIMEOUT  seconds one input may take before it counts as a hang (default 10)
#   FUZZ_RSS_MB   memory limit of a run in MB (default 2048; an allocation above it is a finding)
#   FUZZ_ARGS     extra libFuzzer flags
# Inputs that grow coverage go to $FUZZ_BUILD/corpus/<target> (the committed seeds under
# fuzz/corpus/<target> are read, never written). Crashes, hangs and out-of-memory inputs go to
# fuzz/findings/<target>/ (git-ignored); logs to $FUZZ_BUILD/logs/<target>.log. Exits non-zero
# if any target found something. Reproduce one finding with: $FUZZ_BUILD/fuzz_<target> FILE
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_TARGET=${1:-60}
shift || true
ALL=(safetensors safetensors_index config tokenizer_json bpe_encode jsonl_data run_config lp mps)
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=("${ALL[@]}")
BUILD=${FUZZ_BUILD:-build-fuzz}
JOBS=${FUZZ_JOBS:-2}
TIMEOUT=${FUZZ_TIMEOUT:-10}
RSS_MB=${FUZZ_RSS_MB:-2048}

command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ not found (apt-get install clang)" >&2; exit 2; }
if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S fuzz -B "$BUILD" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
cmake --build "$BUILD" -j "$JOBS"

mkdir -p "$BUILD/logs" fuzz/findings
# Third-party leaks (COIN-OR) are suppressed; see fuzz/lsan.supp.
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/fuzz/lsan.supp:print_suppressions=0}
failed=()
printf '%-18s %8s %12s %8s %10s  %s\n' target seconds execs corpus cov result
for t in "${TARGETS[@]}"; do
  bin="$BUILD/fuzz_$t"
  [ -x "$bin" ] || { echo "fuzz.sh: unknown target '$t' (known: ${ALL[*]})" >&2; exit 2; }
  work="$BUILD/corpus/$t"
  out="fuzz/findings/$t"
  log="$BUILD/logs/$t.log"
  mkdir -p "$work" "$out"
  dict=()
  [ -f "fuzz/dict/$t.dict" ] && dict=(-dict="fuzz/dict/$t.dict")
  # Replay the committed inputs of earlier findings first (fuzz/regressions/<target>_*).
  regs=(fuzz/regressions/"$t"_*)
  if [ -e "${regs[0]}" ] && ! "$bin" -timeout="$TIMEOUT" -rss_limit_mb="$RSS_MB" "${regs[@]}" >"$log.regressions" 2>&1; then
    printf '%-18s %8s %12s %8s %10s  %s\n' "$t" 0 - - - "REGRESSION (log $log.regressions)"
    failed+=("$t")
    continue
  fi
  start=$(date +%s)
  rc=0
  # shellcheck disable=SC2086
  "$bin" -max_total_time="$SECONDS_PER_TARGET" -timeout="$TIMEOUT" -rss_limit_mb="$RSS_MB" \
    -print_final_stats=1 -artifact_prefix="$out/" "${dict[@]}" ${FUZZ_ARGS:-} \
    "$work" "fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
  secs=$(( $(date +%s) - start ))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)
  ncorp=$(find "$work" -type f | wc -l)
  nfind=$(find "$out" -type f \( -name 'crash-*' -o -name 'timeout-*' -o -name 'oom-*' -o -name 'leak-*' \) | wc -l)
  result=ok
  if [ "$rc" -ne 0 ] || [ "$nfind" -gt 0 ]; then
    result="FOUND (rc=$rc, $nfind file(s) in $out, log $log)"
    failed+=("$t")
  fi
  printf '%-18s %8s %12s %8s %10s  %s\n' "$t" "$secs" "${execs:-?}" "$ncorp" "${cov:-?}" "$result"
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: findings in: ${failed[*]}" >&2
  exit 1
fi
