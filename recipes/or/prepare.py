#!/usr/bin/env python3
"""Data plumbing for recipes/or/run.sh (standard library only).

  prepare.py base  --out base.jsonl [--fortunes DIR]
      General English text for the base model: every fortune of the Debian package `fortunes`
      (/usr/share/games/fortunes; ASCII-art files skipped), one {"text": ...} per fortune.
  prepare.py select --or-dir DIR --cpt-docs N --sft-samples M --eval-n K --out-dir DIR
      or_cpt.jsonl: the first N CPT documents of `trex or gen`;
      sft_lp.jsonl: the first M SFT chats of the task `statement_to_lp_answer` (statement ->
                    LP file + answer: what `trex or eval` asks for);
      test_eval.jsonl: the first K test problems (categories take turns, so a prefix is balanced).
  prepare.py tokcorpus --out FILE JSONL...
      Plain text for `trex tokenizer train`, one line per text line: the "text" of CPT files and
      the message contents of chat files.
  prepare.py table --eval-dir DIR --out FILE.md
      The Pass@1 table of base / CPT / CPT+SFT from the `trex or eval` summaries (last JSON line of
      DIR/{base,cpt,sft}.summary.txt), with the lift of the final model over the base in points.
"""
import argparse
import json
import os
import sys

SKIP_FORTUNES = {"art", "ascii-art"}  # pictures, not prose


def cmd_base(a):
    docs, seen = [], set()
    for name in sorted(os.listdir(a.fortunes)):
        path = os.path.join(a.fortunes, name)
        if name.endswith((".dat", ".u8")) or os.path.islink(path) or not os.path.isfile(path):
            continue
        if name in SKIP_FORTUNES:
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for part in text.split("\n%\n"):
            p = part.strip("\n%")
            if len(p.strip()) >= 20 and p not in seen:
                seen.add(p)
                docs.append(p)
    if not docs:
        sys.exit(f"prepare.py base: no fortunes under {a.fortunes} (apt-get install fortunes)")
    with open(a.out, "w", encoding="utf-8") as o:
        for d in docs:
            o.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
    print(f"base corpus: {len(docs)} fortunes, {sum(len(d) for d in docs) / 1e6:.2f} MB of text -> {a.out}")


def head_lines(path, n, keep=lambda row: True):
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if len(out) >= n:
                break
            if line.strip() and keep(json.loads(line)):
                out.append(line if line.endswith("\n") else line + "\n")
    return out


def write_lines(path, lines):
    with open(path, "w", encoding="utf-8") as o:
        o.writelines(lines)


def cmd_select(a):
    os.makedirs(a.out_dir, exist_ok=True)
    cpt = head_lines(os.path.join(a.or_dir, "cpt.jsonl"), a.cpt_docs)
    sft = head_lines(os.path.join(a.or_dir, "sft.jsonl"), a.sft_samples,
                     lambda r: r.get("task") == "statement_to_lp_answer")
    test = head_lines(os.path.join(a.or_dir, "test.jsonl"), a.eval_n)
    for name, lines, want in (("or_cpt.jsonl", cpt, a.cpt_docs), ("sft_lp.jsonl", sft, a.sft_samples),
                              ("test_eval.jsonl", test, a.eval_n)):
        write_lines(os.path.join(a.out_dir, name), lines)
        note = "" if len(lines) == want else f" (asked for {want}; raise or gen --n)"
        print(f"{name}: {len(lines)} lines{note}")


def cmd_tokcorpus(a):
    n = 0
    with open(a.out, "w", encoding="utf-8") as o:
        def put(s):
            nonlocal n
            for line in s.split("\n"):
                if line:
                    o.write(line + "\n")
                    n += 1
        for path in a.files:
            with open(path, encoding="utf-8") as f:
                for line in f:
                    if not line.strip():
                        continue
                    r = json.loads(line)
                    if "text" in r:
                        put(r["text"])
                    for m in r.get("messages", []):
                        put(m["content"])
    print(f"tokenizer corpus: {n} lines -> {a.out}")


def summary(path):
    with open(path, encoding="utf-8") as f:
        lines = [l for l in f if l.startswith("{")]
    if not lines:
        sys.exit(f"prepare.py table: no JSON summary line in {path}")
    return json.loads(lines[-1])


def cmd_table(a):
    rows = [("base", "base"), ("CPT", "cpt"), ("CPT+SFT", "sft")]
    s = {key: summary(os.path.join(a.eval_dir, key + ".summary.txt")) for _, key in rows}
    pct = lambda x: f"{x:.2f}"  # the summaries hold percentages
    out = ["| model | n | Pass@1 strict % | Pass@1 lenient % | LP found % | parsed % | parsed and solved % |"
           " strict lift over base (points) |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for label, key in rows:
        r = s[key]
        lift = r["pass1_strict"] - s["base"]["pass1_strict"]
        out.append(f"| {label} | {r['n']} | {pct(r['pass1_strict'])} | {pct(r['pass1_lenient'])} | {pct(r['lp_found'])} | "
                   f"{pct(r['parsed'])} | {pct(r['solved'])} | {'' if key == 'base' else f'{lift:+.2f}'} |")
    out.append("")
    out.append("Per category, Pass@1 strict % (lenient %):")
    out.append("")
    cats = sorted(set().union(*(s[k].get("per_category", {}).keys() for _, k in rows)))
    out.append("| category | n | " + " | ".join(label for label, _ in rows) + " |")
    out.append("|---|---:|" + "---:|" * len(rows))
    for c in cats:
        n = s["sft"].get("per_category", {}).get(c, {}).get("n", "")
        cells = []
        for _, k in rows:
            pc = s[k].get("per_category", {}).get(c)
            cells.append(f"{pct(pc['pass1_strict'])} ({pct(pc['pass1_lenient'])})" if pc else "")
        out.append(f"| {c} | {n} | " + " | ".join(cells) + " |")
    lift = s["sft"]["pass1_strict"] - s["base"]["pass1_strict"]
    out.append("")
    out.append(f"Lift of CPT+SFT over base, Pass@1 strict: {lift:+.2f} points.")
    text = "\n".join(out) + "\n"
    with open(a.out, "w", encoding="utf-8") as o:
        o.write(text)
    sys.stdout.write(text)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("base")
    b.add_argument("--out", required=True)
    b.add_argument("--fortunes", default="/usr/share/games/fortunes")
    s = sub.add_parser("select")
    s.add_argument("--or-dir", required=True)
    s.add_argument("--cpt-docs", type=int, required=True)
    s.add_argument("--sft-samples", type=int, required=True)
    s.add_argument("--eval-n", type=int, required=True)
    s.add_argument("--out-dir", required=True)
    t = sub.add_parser("tokcorpus")
    t.add_argument("--out", required=True)
    t.add_argument("files", nargs="+")
    tb = sub.add_parser("table")
    tb.add_argument("--eval-dir", required=True)
    tb.add_argument("--out", required=True)
    a = p.parse_args()
    {"base": cmd_base, "select": cmd_select, "tokcorpus": cmd_tokcorpus, "table": cmd_table}[a.cmd](a)


if __name__ == "__main__":
    main()
