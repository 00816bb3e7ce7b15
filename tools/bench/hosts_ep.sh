#!/usr/bin/env bash
# bench-v3 with expert parallel 2 across two hosts (issue 34): two network namespaces on a bridge
# (tests/hosts/netns_bed.sh: OpenMPI over TCP only, one rank a host, launched by
# scripts/trex-mpirun), `trex bench step` three ways, one after the other:
#   full   the veth link at full speed
#   1gbit  host 1's link limited to 1 Gbit/s both ways (tc tbf, 1 MB bucket)
#   burst  full speed, and once the first measured step has started a BURST_S-second loss burst on
#          host 1's link (tbf 64 kbit/s with a queue of a few packets: most packets dropped;
#          netem is not available here)
# Prints a Markdown row per mode: step time (median / min / max over the measured steps), the
# exposed communication (the median over the measured steps, the slower rank's) and tokens/s.
# Needs root and `ip netns`.
#
#   tools/bench/hosts_ep.sh [TREX=build/trex] [STEPS=2] [BURST_S=20]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TREX=$(realpath "${1:-$ROOT/build/trex}")
STEPS=${2:-2}
BURST_S=${3:-20}
source "$ROOT/tests/hosts/netns_bed.sh"
bed_require
bed_up 2
cd "$BED_DIR"
for mode in full 1gbit burst; do
  [ "$mode" = 1gbit ] && bed_throttle 1 1gbit 1mb
  bed_mpirun -np 2 -x TREX_THREADS=1 "$TREX" bench step --config "$ROOT/configs/bench-v3.toml" --steps "$STEPS" \
    --warmup 1 --set parallel.ep=2 > "$mode.json" 2> "$mode.log" &
  run=$!
  if [ "$mode" = burst ]; then
    while kill -0 $run 2> /dev/null && ! grep -q '^\[bench step\] step 0 ' "$mode.log"; do sleep 0.2; done
    bed_throttle 1 64kbit 3kb
    sleep "$BURST_S"
    bed_unthrottle 1
  fi
  wait $run || { tail -20 "$mode.log"; exit 1; }
  bed_unthrottle 1
  python3 - "$mode" "$mode.json" "$mode.log" "$BURST_S" <<'PY'
import json, re, sys
mode, js, log, burst = sys.argv[1:]
j = json.loads(open(js).read().strip().splitlines()[-1])
steps = [float(m.group(2)) for m in re.finditer(r"\[bench step\] step (\d+) loss \S+ ([\d.]+) ms", open(log).read())
         if int(m.group(1)) >= 1]
what = {"full": "full speed", "1gbit": "host 1 link at 1 Gbit/s (tbf)", "burst": f"{burst} s loss burst from the start of measured step 1"}[mode]
print(f"| {what} | {j['step_ms_median'] / 1000:.1f} / {j['step_ms_min'] / 1000:.1f} / {max(steps) / 1000:.1f} s "
      f"| {j['comm_ms'] / 1000:.2f} s | {j['tokens_per_s']:.0f} |", flush=True)
PY
done
