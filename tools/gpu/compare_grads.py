"""Compares two gradient files written by `trex grad` (safetensors), e.g. a run on the GPU against
the CPU's, with the parity tests' measure: per tensor ||a - b|| / max(||b||, floor x ||all of b||)
(floor 1e-4: tensors whose gradient is analytically zero are compared against the whole model's).
Also compares the two runs' losses (the JSON line trex grad prints, saved to a file).

  python3 tools/gpu/compare_grads.py GRADS_A GRADS_B --loss-a A.json --loss-b B.json --tol 1e-4
Prints the worst tensors and one summary line; exit 1 when a tensor or the loss exceeds its bound.
"""
import argparse
import json
import math
import sys

from safetensors.numpy import load_file


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b", help="the reference (the CPU's)")
    ap.add_argument("--loss-a")
    ap.add_argument("--loss-b")
    ap.add_argument("--tol", type=float, default=1e-4, help="bound of every gradient's relative error")
    ap.add_argument("--loss-tol", type=float, default=1e-5, help="bound of the loss's relative error")
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    a, b = load_file(args.a), load_file(args.b)
    ok = True
    if set(a) != set(b):
        print(f"tensor names differ: only in a {sorted(set(a) - set(b))[:5]}, only in b {sorted(set(b) - set(a))[:5]}")
        ok = False
    total = math.sqrt(sum(float((b[k].astype("float64") ** 2).sum()) for k in b))
    errs = []
    for k in sorted(set(a) & set(b)):
        x, y = a[k].astype("float64"), b[k].astype("float64")
        if x.shape != y.shape:
            print(f"{k}: shape {x.shape} vs {y.shape}")
            ok = False
            continue
        num = math.sqrt(float(((x - y) ** 2).sum()))
        den = max(math.sqrt(float((y ** 2).sum())), 1e-4 * total)
        errs.append((num / den if den > 0 else num, k))
    errs.sort(reverse=True)
    for e, k in errs[:5]:
        print(f"  {e:.3e}  {k}")
    worst = errs[0][0] if errs else float("nan")
    if not (worst <= args.tol):
        ok = False
    loss_msg = ""
    if args.loss_a and args.loss_b:
        la = json.loads(open(args.loss_a).read().strip().splitlines()[-1])["loss"]
        lb = json.loads(open(args.loss_b).read().strip().splitlines()[-1])["loss"]
        lrel = abs(la - lb) / max(abs(lb), 1e-30)
        loss_msg = f", loss {la:.9g} vs {lb:.9g} (rel {lrel:.2e}, bound {args.loss_tol:.0e})"
        ok &= lrel <= args.loss_tol
    print(f"{'ok' if ok else 'FAIL'} {args.label}: {len(errs)} tensors, worst gradient error {worst:.3e} "
          f"(bound {args.tol:.0e}){loss_msg}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
