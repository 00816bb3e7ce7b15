#!/usr/bin/env python3
"""PyTorch peer for `trex bench step`: trains DeepseekV3ForCausalLM or DeepseekV4ForCausalLM
(transformers, by [model].model_type) on a random batch
with the shapes of a trex TOML run config and prints one JSON line with the step time.

  .venv/bin/python tools/peer/peer_bench.py configs/bench-v3.toml --steps 6 --threads 16 --mode eager
  python3 tools/peer/peer_bench.py configs/bench-gpu-v3.toml --device cuda --peak-tflops 700 --mode compile

With --device cuda the model, batch and optimizer live on the GPU (autocast to bf16 there), the step
time is read after a device synchronize, and --peak-tflops gives the MFU against that peak (model
FLOPs per token as trex counts them: model::ModelConfig::train_flops_per_token, DeepSeek-V3 only).
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time
import tomllib


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", help="trex TOML run config ([model] = HF DeepseekV3 fields, [train])")
    ap.add_argument("--steps", type=int, default=6, help="training steps in all (default 6)")
    ap.add_argument("--warmup", type=int, default=None,
                    help="leading steps left out of the statistics (default 1 eager, 2 compile)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch.set_num_threads (default [train].threads; 0 = TREX_THREADS or all cores)")
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--precision", choices=["bf16", "fp32"], default=None, help="override [train].precision")
    ap.add_argument("--batch-size", type=int, default=None, help="override [train].batch_size")
    ap.add_argument("--seq-len", type=int, default=None, help="override [data].seq_len")
    ap.add_argument("--clip", type=float, default=1.0, help="global grad-norm clip (0: none)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the model trains (default cpu)")
    ap.add_argument("--peak-tflops", type=float, default=0.0,
                    help="measured bf16 peak of the device in TFLOP/s; adds model FLOPs and MFU to the output")
    ap.add_argument("--experts-impl", default=None,
                    help="transformers experts implementation (default: transformers' own, grouped_mm)")
    return ap.parse_args()


def resolve_threads(n):
    if n is None or n <= 0:
        env = os.environ.get("TREX_THREADS")
        n = int(env) if env and int(env) > 0 else len(os.sched_getaffinity(0))
    return n


def build_config(model_tbl):
    if model_tbl.get("model_type") == "deepseek_v4":
        from transformers import DeepseekV4Config
        kw = {k: v for k, v in model_tbl.items() if k != "model_type"}
        return DeepseekV4Config(**kw)
    from transformers import DeepseekV3Config
    kw = {k: v for k, v in model_tbl.items() if k != "model_type"}
    kw.setdefault("num_nextn_predict_layers", 0)
    kw.setdefault("num_key_value_heads", kw.get("num_attention_heads"))
    theta = kw.pop("rope_theta", 10000.0)
    rs = kw.pop("rope_scaling", None)
    if "rope_parameters" not in kw:
        if rs:
            rs = dict(rs)
            rs.setdefault("rope_type", rs.pop("type", "yarn"))
            kw["rope_parameters"] = dict(rs, rope_theta=theta)
        else:
            kw["rope_parameters"] = dict(rope_type="default", rope_theta=theta)
    return DeepseekV3Config(**kw)


def v3_flops_per_token(m, seq):
    """model::ModelConfig::train_flops_per_token for DeepSeek-V3 fields: 6 x active matmul
    parameters (LM head, attention, dense or top-k + shared experts, router) + causal attention."""
    d, H = m["hidden_size"], m["num_attention_heads"]
    nope, rope, dv = m["qk_nope_head_dim"], m["qk_rope_head_dim"], m["v_head_dim"]
    dqk, rq, r = nope + rope, m.get("q_lora_rank") or 0, m["kv_lora_rank"]
    attn = (d * rq + rq * H * dqk if rq else d * H * dqk) + d * (r + rope) + r * H * (nope + dv) + H * dv * d
    shared = m.get("n_shared_experts", 0) * m["moe_intermediate_size"]
    total = m["vocab_size"] * d
    L, k_dense = m["num_hidden_layers"], m.get("first_k_dense_replace", 0)
    for layer in range(L):
        total += attn
        if m.get("n_routed_experts") and layer >= k_dense:
            total += m["num_experts_per_tok"] * 3 * d * m["moe_intermediate_size"] + 3 * d * shared + m["n_routed_experts"] * d
        else:
            total += 3 * d * m["intermediate_size"]
    return 6.0 * total + 6.0 * H * (dqk + dv) * ((seq + 1) / 2.0) * L


def main():
    args = parse_args()
    with open(args.config, "rb") as f:
        cfg_toml = tomllib.load(f)
    tr = cfg_toml.get("train", {})
    da = cfg_toml.get("data", {})
    op = cfg_toml.get("optim", {})
    threads = resolve_threads(args.threads if args.threads is not None else tr.get("threads", 0))
    import torch
    torch.set_num_threads(threads)
    from transformers import DeepseekV3ForCausalLM, DeepseekV4ForCausalLM

    batch = args.batch_size or tr.get("batch_size", 1)
    seq = args.seq_len or da.get("seq_len", 2048)
    precision = args.precision or tr.get("precision", "bf16")
    if precision not in ("bf16", "fp32"):
        sys.exit(f"precision {precision!r}: bf16 or fp32")
    seed = tr.get("seed", 1234)
    lr = op.get("lr", 1e-4)
    warmup = args.warmup if args.warmup is not None else (2 if args.mode == "compile" else 1)
    if args.steps <= warmup:
        sys.exit(f"--steps {args.steps} must exceed the {warmup} warm-up steps")

    config = build_config(cfg_toml["model"])
    if config.model_type == "deepseek_v3" and (getattr(config, "scoring_func", "sigmoid") != "sigmoid" or
                                               getattr(config, "topk_method", "noaux_tc") != "noaux_tc"):
        print("warning: transformers' DeepseekV3 router is always sigmoid + noaux_tc; "
              f"config asks {config.scoring_func} + {config.topk_method}", file=sys.stderr)
    if args.experts_impl:
        config._experts_implementation = args.experts_impl
    torch.manual_seed(seed)
    v4 = config.model_type == "deepseek_v4"
    dev = torch.device(args.device)
    with dev:  # parameters are created (and initialized) on the device
        model = (DeepseekV4ForCausalLM if v4 else DeepseekV3ForCausalLM)(config).float()
    if v4:  # HF initializes tid2eid to zeros (all tokens -> expert 0); give hash layers K random experts as trex does
        with torch.no_grad():
            for mod in model.modules():
                if hasattr(mod, "tid2eid"):
                    perm = torch.rand(config.vocab_size, config.n_routed_experts).argsort(dim=-1)
                    mod.tid2eid.copy_(perm[:, : config.num_experts_per_tok])
    model.train()
    attn_impl = model.config._attn_implementation
    experts_impl = model.config._experts_implementation
    nparams = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    fwd = torch.compile(model) if args.mode == "compile" else model

    g = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=g).to(dev)
    autocast = torch.autocast(args.device, dtype=torch.bfloat16, enabled=(precision == "bf16"))
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)

    times, losses = [], []
    for step in range(args.steps):
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = fwd(input_ids=ids, labels=ids).loss
        loss.backward()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        losses.append(loss.item())               # syncs; part of the step, as in a real loop
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
        print(f"step {step}: {times[-1]:.1f} ms loss {losses[-1]:.4f}", file=sys.stderr)

    timed = times[warmup:]
    med = statistics.median(timed)
    extra = {}
    if not v4:
        fpt = v3_flops_per_token(cfg_toml["model"], seq)
        extra["model_tflop_per_step"] = round(fpt * batch * seq / 1e12, 4)
        if args.peak_tflops > 0:
            extra["peak_tflops"] = args.peak_tflops
            extra["mfu"] = round(fpt * batch * seq / (med / 1e3) / (args.peak_tflops * 1e12), 4)
    if args.device == "cuda":
        extra["gpu"] = torch.cuda.get_device_name()
        extra["peak_gpu_mem_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    print(json.dumps({
        "device": args.device, **extra,
        "impl": f"pytorch-{args.mode}", "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "threads": threads, "batch": batch, "seq": seq, "precision": precision,
        "attn_impl": attn_impl, "experts_impl": experts_impl, "params": nparams,
        "step_ms_median": round(med, 3), "step_ms_min": round(min(timed), 3),
        "tokens_per_s": round(batch * seq / (med / 1e3), 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "steps": args.steps, "warmup": warmup, "step_ms": [round(t, 3) for t in times],
        "losses": [round(x, 5) for x in losses], "config": args.config,
    }))


if __name__ == "__main__":
    main()
