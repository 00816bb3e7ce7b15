#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention (causal) on the CPU, forward and backward, at the
attention-core shapes of trex_ops perf (B=1, H=8, Dqk=96, Dv=64: bench-v3's MLA heads), in bf16
and fp32, so its GFLOP/s read against `trex_ops perf attn` (same causal FLOP count: forward
2 (Dqk + Dv) per attended pair and head, backward 2.5x that).

With Dqk != Dv PyTorch's CPU SDPA takes its math path (the T x T scores materialized); --pad-v
pads v with zeros to Dqk so that its flash kernel runs (the FLOPs are still counted at Dv).

usage: .venv/bin/python tools/bench/sdpa_attention.py [--threads 2] [--T 2048 8192] [--reps 3] [--pad-v]
"""
import argparse
import time

import torch
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--T", type=int, nargs="+", default=[2048])
    ap.add_argument("--H", type=int, default=8)
    ap.add_argument("--dqk", type=int, default=96)
    ap.add_argument("--dv", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--pad-v", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    print(f"# torch {torch.__version__}, {a.threads} threads, backend {torch.backends.cpu.get_cpu_capability()}")
    for T in a.T:
        for dt in (torch.bfloat16, torch.float32):
            q = torch.randn(1, a.H, T, a.dqk, dtype=dt, requires_grad=True)
            k = torch.randn(1, a.H, T, a.dqk, dtype=dt, requires_grad=True)
            dv = a.dqk if a.pad_v else a.dv
            v = torch.randn(1, a.H, T, dv, dtype=dt)
            dO = torch.randn(1, a.H, T, dv, dtype=dt)
            if a.pad_v:
                v[..., a.dv:] = 0
                dO[..., a.dv:] = 0
            v.requires_grad_(True)
            pairs = T * (T + 1) / 2 * a.H
            ffwd = 2.0 * (a.dqk + a.dv) * pairs
            tf, tb = [], []
            for _ in range(a.reps + 1):  # the first is a warm-up
                t0 = time.perf_counter()
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                t1 = time.perf_counter()
                o.backward(dO)
                t2 = time.perf_counter()
                tf.append(t1 - t0), tb.append(t2 - t1)
                q.grad = k.grad = v.grad = None
            mf, mb = sorted(tf[1:])[len(tf[1:]) // 2] * 1e3, sorted(tb[1:])[len(tb[1:]) // 2] * 1e3
            print(f"sdpa{'[pad-v]' if a.pad_v else ''} {str(dt).split('.')[-1]:8s} B=1 T={T} H={a.H} Dqk={a.dqk} Dv={a.dv}  fwd {mf:9.2f} ms "
                  f"{ffwd / mf * 1e-6:7.1f} GFLOP/s   bwd {mb:9.2f} ms {2.5 * ffwd / mb * 1e-6:7.1f} GFLOP/s")


if __name__ == "__main__":
    main()
