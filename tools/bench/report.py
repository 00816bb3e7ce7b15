#!/usr/bin/env python3
"""Renders the raw folder of tools/bench/reproduce.sh (meta.json, runs.tsv, one NAME.json per run)
as the headline markdown table and a machine-readable JSON file. Standard library only.

  python3 tools/bench/report.py RAW_DIR --md OUT.md --json OUT.json
"""
import argparse
import json
import os
import sys


def load_runs(raw):
    runs = {}
    with open(os.path.join(raw, "runs.tsv")) as f:
        for line in f:
            name, rc, secs, load, cmd = line.rstrip("\n").split("\t", 4)
            row = {"name": name, "rc": int(rc), "seconds": int(secs), "load_average": float(load), "command": cmd,
                   "result": None}
            try:
                with open(os.path.join(raw, name + ".json")) as j:
                    text = j.read().strip()
                row["result"] = json.loads(text) if text else None
            except (OSError, json.JSONDecodeError):
                pass
            runs[name] = row
    return runs


class Table:
    def __init__(self, meta, runs):
        self.meta, self.runs = meta, runs
        self.tries = [r["result"] for n, r in runs.items() if n.startswith("peak") and r["rc"] == 0 and r["result"]]
        self.peak = max(self.tries, key=lambda t: t["best_gflops"]) if self.tries else {}
        self.best = self.peak.get("best_gflops")

    def r(self, name):
        row = self.runs.get(name)
        return row["result"] if row and row["rc"] == 0 and row["result"] else None

    def why(self, name):
        row = self.runs.get(name)
        if row is None:
            return "not run"
        return f"failed (exit {row['rc']})"

    def mfu(self, fpt, tps):
        if not self.best or not fpt or not tps:
            return "-"
        return f"{100 * fpt * tps / (self.best * 1e9):.1f}%"

    def lines(self):
        m, out = self.meta, []
        kind = "quick run" if m["quick"] else "full run"
        out.append(f"## Headline: {m['host_kind']}, {m['date']} ({kind})")
        out.append("")
        out.append(f"- Machine: {m['cpu_model']} ({m['cpu_vendor']} family {m['cpu_family']} model "
                   f"{m['cpu_model_number']}), {m['cores']} cores, {m['memory_gib']} GiB, {m['virtualization']}; "
                   f"ISA flags: {m['isa_flags']}.")
        out.append(f"- Date: {m['start']} to {m['end']} ({m['runtime_s'] // 60} min {m['runtime_s'] % 60} s); "
                   f"commit {m['commit']}{' ' + m['commit_note'] if m['commit_note'] else ''}.")
        out.append(f"- Command: `{m['command']}`")
        st = m["steps"]
        out.append(f"- Steps: trex median of {st['main']} measured steps after 1 warm-up on the bench-v3 / "
                   f"bench-v4 rows, {st['rows']} on the other rows; peers {st['peers']} after 1 warm-up "
                   f"(eager) or 2 (torch.compile: its first step compiles); {m['threads']} threads for "
                   f"every implementation; bf16, batch 1, routing as the model chooses.")
        cores = m["cores"]
        loads = [float(x) for x in (m["load_start"].split() + m["load_end"].split())]
        note = m.get("note", "").strip()
        auto = ""
        if loads and max(loads[0], loads[3] if len(loads) > 3 else 0) > 0.5 * cores:
            auto = (f"Load average {m['load_start'].split()[0]} at the start and {m['load_end'].split()[0]} at the "
                    f"end on {cores} cores: other work shared the machine, so the times are noisy; compare ratios "
                    f"within this table only.")
        if note or auto:
            note = note.rstrip(".") + "." if note else ""
            out.append(f"- Note: {' '.join(x for x in (note, auto) if x)}")
        if self.peak:
            tries = ", ".join(f"{t['best_gflops']:.1f}" for t in self.tries)
            out.append(f"- Peak (`trex bench peak`): fp32 FMA {self.peak['fp32_gflops']:.1f} GFLOP/s, bf16 dot "
                       f"{self.peak['bf16_gflops']:.1f} ({'native' if self.peak.get('bf16_native') else 'not native'}), "
                       + (f"AMX bf16 {self.peak['amx_bf16_gflops']:.1f}, " if self.peak.get('amx_bf16_gflops') else "")
                       + f"best {self.best:.1f} GFLOP/s ({self.peak['threads']} threads, {self.peak['isa']}; best of "
                       f"{len(self.tries)} tries at the start and the end of the run: {tries}); every MFU below is "
                       f"against it (a try on a busy machine reads low), model FLOPs as `trex bench step` counts them.")
        else:
            out.append(f"- Peak: {self.why('peak-1')}.")
        out += self.peers() + self.recompute() + self.seq() + self.experts() + self.parallel()
        return out

    def peers(self):
        out = ["", "### Training step against the PyTorch peers", "",
               "| config | impl | step ms (median / min) | tokens/s | MFU | trex speedup | peak RSS MiB |",
               "|---|---|---|---|---|---|---|"]
        status = self.meta.get("peer_status") or ""
        for c in ("v3", "v4"):
            t = self.r(c)
            label = "trex (MTP on)" if c == "v4" else "trex"
            if t:
                out.append(f"| bench-{c} | {label} | {t['step_ms_median']:.0f} / {t['step_ms_min']:.0f} | "
                           f"{t['tokens_per_s']:.1f} | **{self.mfu(t['model_flops_per_token'], t['tokens_per_s'])}** | "
                           f"1.00x | {t['peak_rss_mb']:.0f} |")
            else:
                out.append(f"| bench-{c} | {label} | {self.why(c)} | | | | |")
            for mode, name in (("eager", "PyTorch eager + bf16 autocast"), ("compile", "torch.compile + bf16 autocast")):
                if c == "v4":
                    name += " (no MTP)"
                if status:
                    out.append(f"| bench-{c} | {name} | {status} | | | | |")
                    continue
                p = self.r(f"{c}.peer-{mode}")
                if not p and mode not in self.meta.get("peers", []):
                    out.append(f"| bench-{c} | {name} | peer not run (--peers {' '.join(self.meta['peers'])}) | | | | |")
                    continue
                if not p:
                    out.append(f"| bench-{c} | {name} | {self.why(f'{c}.peer-{mode}')} | | | | |")
                    continue
                mfu = self.mfu(t["model_flops_per_token"], p["tokens_per_s"]) if t else "-"
                if c == "v4" and mfu != "-":
                    mfu = f"({mfu})"
                sp = f"**{t['tokens_per_s'] / p['tokens_per_s']:.2f}x**" if t else "-"
                out.append(f"| bench-{c} | {name} | {p['step_ms_median']:.0f} / {p['step_ms_min']:.0f} | "
                           f"{p['tokens_per_s']:.1f} | {mfu} | {sp} | {p['peak_rss_mb']:.0f} |")
        out += ["", "bench-v4: transformers has no MTP block, so the peer does less work a step (no MTP layer, "
                "one LM head pass); its speedups are lower bounds and its MFU, in parentheses, credits it with "
                "trex's MTP FLOPs."]
        return out

    def recompute(self):
        out = ["", "### Activation recompute (`--set train.recompute=none|full`)", "",
               "| config | recompute | step ms (median) | tokens/s | MFU | activation peak MiB | "
               "activation estimate MiB | peak RSS MiB |", "|---|---|---|---|---|---|---|---|"]
        for c in ("v3", "v4"):
            for rec, name in (("none", c), ("full", f"{c}.recompute-full")):
                t = self.r(name)
                if not t:
                    out.append(f"| bench-{c} | {rec} | {self.why(name)} | | | | | |")
                    continue
                out.append(f"| bench-{c} | {rec} | {t['step_ms_median']:.0f} | {t['tokens_per_s']:.1f} | "
                           f"{self.mfu(t['model_flops_per_token'], t['tokens_per_s'])} | {t['activation_mb']:.0f} | "
                           f"{t['activation_estimate_mb']:.0f} | {t['peak_rss_mb']:.0f} |")
        return out

    def seq(self):
        out = ["", "### Sequence length (bench-v3, `--set data.seq_len=S`)", "",
               "| seq | step ms (median) | tokens/s | ms / token | model GFLOP / token | MFU | activation peak MiB |",
               "|---|---|---|---|---|---|---|"]
        for s in (1024, 2048, 4096, 8192):
            name = "v3" if s == 2048 else f"v3.seq-{s}"
            t = self.r(name)
            if not t:
                out.append(f"| {s} | {self.why(name)} | | | | | |")
                continue
            out.append(f"| {s} | {t['step_ms_median']:.0f} | {t['tokens_per_s']:.1f} | "
                       f"{1000 / t['tokens_per_s']:.2f} | {t['model_flops_per_token'] / 1e9:.3f} | "
                       f"{self.mfu(t['model_flops_per_token'], t['tokens_per_s'])} | {t['activation_mb']:.0f} |")
        return out

    def experts(self):
        out = ["", "### Expert count at fixed active parameters (bench-v3 cut to 3 layers, top-4 of E experts)", "",
               "| experts | step ms (median) | tokens/s | ms / token | active params | MFU | peak RSS MiB |",
               "|---|---|---|---|---|---|---|"]
        for e in (16, 32, 64, 128):
            name = f"v3.experts-{e}"
            t = self.r(name)
            if not t:
                out.append(f"| {e} | {self.why(name)} | | | | | |")
                continue
            out.append(f"| {e} | {t['step_ms_median']:.0f} | {t['tokens_per_s']:.1f} | {1000 / t['tokens_per_s']:.2f} | "
                       f"{t['active_params'] / 1e6:.1f} M | {self.mfu(t['model_flops_per_token'], t['tokens_per_s'])} | "
                       f"{t['peak_rss_mb']:.0f} |")
        return out

    def parallel(self):
        R, T = self.meta["ranks"], self.meta["threads"]
        per = max(T // R, 1)
        out = ["", f"### Data and expert parallel (bench-v3, {R} ranks x {per} thread(s) under mpirun)", "",
               "| layout | step ms (median / min) | tokens/s | vs 1 rank | exposed comm | MFU | peak RSS / rank MiB |",
               "|---|---|---|---|---|---|---|"]
        base = self.r("v3")
        for name, label in (("v3", f"1 rank x {T} threads"), (f"v3.dp{R}", f"dp {R}"),
                            (f"v3.dp{R}-ep{R}", f"dp {R}, ep {R}")):
            t = self.r(name)
            if not t:
                out.append(f"| {label} | {self.why(name)} | | | | | |")
                continue
            vs = f"{t['tokens_per_s'] / base['tokens_per_s']:.2f}x" if base else "-"
            comm = t.get("comm_ms") or 0.0
            comm_s = "0" if t["ranks"] == 1 else f"{comm:.0f} ms ({100 * comm / t['step_ms_median']:.1f}%)"
            out.append(f"| {label} | {t['step_ms_median']:.0f} / {t['step_ms_min']:.0f} | {t['tokens_per_s']:.1f} | "
                       f"{vs} | {comm_s} | {self.mfu(t['model_flops_per_token'], t['tokens_per_s'])} | "
                       f"{t['peak_rss_mb']:.0f} |")
        out += ["", "Exposed comm: the time a rank's compute thread waited in a collective (the slower rank)."]
        return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("raw", help="the raw folder reproduce.sh wrote")
    ap.add_argument("--md", required=True, help="markdown output")
    ap.add_argument("--json", required=True, help="machine-readable output")
    a = ap.parse_args()
    with open(os.path.join(a.raw, "meta.json")) as f:
        meta = json.load(f)
    runs = load_runs(a.raw)
    md = "\n".join(Table(meta, runs).lines()) + "\n"
    with open(a.md, "w") as f:
        f.write(md)
    with open(a.json, "w") as f:
        json.dump({"meta": meta, "runs": list(runs.values()), "markdown": md}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
