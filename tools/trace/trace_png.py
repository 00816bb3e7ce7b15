#!/usr/bin/env python3
"""Draw a trex Chrome trace (trex bench step --trace) as a PNG timeline with gnuplot.

usage: tools/trace/trace_png.py TRACE.json OUT.png [--from-step K] [--steps N] [--title T]

One row per (rank, track): the compute track shows the top-level profiler regions (fwd.*, bwd.*,
head_ce, step.optimizer, ...; nested regions are left out so the row stays readable) and the waits
on communication in red; the communication track shows each bucket's reduce-scatter and
all-gather from launch until seen complete. Standard library + gnuplot (Debian `gnuplot`) only.
"""
import argparse
import json
import subprocess
import sys

COLORS = {"fwd": "#4c72b0", "bwd": "#55a868", "head_ce": "#8172b2", "step.optimizer": "#ccb974",
          "wait": "#c44e52", "reduce-scatter": "#dd8452", "all-gather": "#64b5cd", "all-reduce": "#937860"}


def color(name):
    for k, c in COLORS.items():
        if name.startswith(k):
            return c
    return "#999999"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--from-step", type=int, default=0)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--title", default="")
    a = ap.parse_args()
    ev = [e for e in json.load(open(a.trace))["traceEvents"] if e.get("ph") == "X"]
    steps = sorted((e for e in ev if e["tid"] == 0 and e["name"].startswith("step ")), key=lambda e: e["ts"])
    want = [s for s in steps if a.from_step <= int(s["name"].split()[1]) < a.from_step + a.steps]
    if not want:
        sys.exit(f"{a.trace}: no 'step {a.from_step}' event")
    t0 = min(s["ts"] for s in want)
    t1 = max(s["ts"] + s["dur"] for s in want)
    ranks = sorted({e["pid"] for e in ev})
    rows = []  # (label, y)
    for r in ranks:
        rows.append((f"rank {r} compute", len(rows)))
        rows.append((f"rank {r} comm", len(rows)))
    objs = []
    for e in ev:
        s, d = e["ts"], e["dur"]
        if s + d < t0 or s > t1 or e["name"].startswith("step "):
            continue
        if e["tid"] == 0 and (e["name"].count(".") > 1 or e["name"] == "step.forward_backward"):
            continue  # nested regions (fwd.moe.experts) and the parent of fwd.* / bwd.* are not drawn
        y = ranks.index(e["pid"]) * 2 + e["tid"]
        h = 0.34 if e["name"].startswith("wait") else 0.4
        x0, x1 = (max(s, t0) - t0) / 1e6, (min(s + d, t1) - t0) / 1e6
        objs.append(f"set object rect from {x0:.6f},{y - h:.2f} to {max(x1, x0 + 1e-4):.6f},{y + h:.2f} "
                    f"fc rgb '{color(e['name'])}' fs solid 0.9 noborder")
    ytics = ", ".join(f"'{l}' {y}" for l, y in rows)
    keys = "".join(f"set label '{k}' at screen {0.08 + 0.11 * i:.2f},0.04 tc rgb '{c}' noenhanced\n"
                   for i, (k, c) in enumerate(COLORS.items()))
    script = f"""set terminal pngcairo size 1600,{160 + 70 * len(rows)} font ',10'
set output '{a.out}'
set title \"{a.title or a.trace}\" noenhanced
set xlabel 'seconds from the start of step {a.from_step}'
set xrange [0:{(t1 - t0) / 1e6:.6f}]
set yrange [-0.7:{len(rows) - 0.3}]
set ytics ({ytics}) noenhanced
set bmargin 5
set grid xtics
{keys}{chr(10).join(objs)}
plot NaN notitle
"""
    subprocess.run(["gnuplot"], input=script, text=True, check=True)


if __name__ == "__main__":
    main()
