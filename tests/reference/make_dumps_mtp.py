#!/usr/bin/env python3
"""PyTorch reference for trex's DeepSeek-V3 MTP layers (see tests/reference/README.md, "DeepSeek-V3
MTP cases").

transformers' DeepseekV3ForCausalLM has no MTP module (it ignores model.layers.<L>.* on load). This
script ports DeepSeek-V3's MTP module on top of it: MTP depth k = 1..D is one more
DeepseekV3DecoderLayer with layer_idx L+k-1 (MoE or dense by first_k_dense_replace, as a main layer
of that index) plus enorm, hnorm, eh_proj and shared_head (norm, head), under the release's names
model.layers.<L+k-1>.*. With h_0 = the main model's last decoder-layer output (the input of
model.norm) and ids_k[t] = ids[t+k] (ids[t] past the row end):
    x_k = eh_proj(cat([enorm(embed(ids_k)), hnorm(h_{k-1})], -1))
    h_k = DecoderLayer_{L+k-1}(x_k)            (same positions, causal mask and RoPE as the main layers)
    logits_k = shared_head.head(shared_head.norm(h_k)), target of t = labels[t+k+1] (-100 past the end)
    loss = CE + aux (every MoE layer, MTP layers included) + mtp_loss_weight * mean_k CE_k
The checkpoint also holds model.layers.<L+k-1>.embed_tokens.weight, a copy of the embedding, as the
release does. Writes tests/reference/data/<case>/ like make_dumps.py; --check compares live with
`trex grad --mtp-loss-weight W`.

  .venv/bin/python tests/reference/make_dumps_mtp.py                  # regenerate the v3_mtp_* dumps
  .venv/bin/python tests/reference/make_dumps_mtp.py --check --trex build/trex
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_dumps as md  # noqa: E402  (also patches transformers' router with trex's semantics)
from make_dumps import hf_ds3  # noqa: E402

DATA = md.DATA
transformers.logging.set_verbosity_error()  # the load report lists the MTP tensors transformers ignores

CASES = {
    # One MTP layer (as the V3 / R1 releases), MoE (layer 2 >= first_k_dense_replace 1), softmax
    # routing with groups, no q_lora, sequence aux loss on every MoE layer.
    "v3_mtp_softmax": dict(
        seed=4004, style="deepseek", B=2, T=11,
        model=dict(vocab_size=83, hidden_size=45, num_hidden_layers=2, first_k_dense_replace=1,
                   num_attention_heads=5, q_lora_rank=None, kv_lora_rank=14, qk_nope_head_dim=10,
                   qk_rope_head_dim=6, v_head_dim=9, intermediate_size=50,
                   moe_intermediate_size=14, n_routed_experts=10, n_shared_experts=2,
                   num_experts_per_tok=3, n_group=2, topk_group=1, scoring_func="softmax",
                   topk_method="noaux_tc", norm_topk_prob=False, routed_scaling_factor=1.0,
                   max_position_embeddings=32, tie_word_embeddings=False, num_nextn_predict_layers=1,
                   rope_scaling=dict(rope_type="yarn", factor=2.0,
                                     original_max_position_embeddings=16, beta_fast=32,
                                     beta_slow=1, mscale=0.8, mscale_all_dim=0.6)),
        train=dict(bias_update_gamma=0.0, aux_loss_alpha=0.01, mtp_loss_weight=0.3)),
    # Two MTP depths: layer 2 dense, layer 3 MoE (first_k_dense_replace 3: the main layers are
    # dense too); q_lora, sigmoid greedy routing, router-bias updates, plain RoPE.
    "v3_mtp_two_depths": dict(
        seed=5005, style="deepseek", B=2, T=13,
        model=dict(vocab_size=79, hidden_size=39, num_hidden_layers=2, first_k_dense_replace=3,
                   num_attention_heads=3, q_lora_rank=21, kv_lora_rank=15, qk_nope_head_dim=7,
                   qk_rope_head_dim=4, v_head_dim=11, intermediate_size=43,
                   moe_intermediate_size=17, n_routed_experts=7, n_shared_experts=1,
                   num_experts_per_tok=2, n_group=1, topk_group=1, scoring_func="sigmoid",
                   topk_method="greedy", norm_topk_prob=True, routed_scaling_factor=1.3,
                   max_position_embeddings=64, tie_word_embeddings=False, num_nextn_predict_layers=2,
                   rope_scaling=None),
        train=dict(bias_update_gamma=0.01, aux_loss_alpha=0.0, mtp_loss_weight=0.5)),
}


# --------------------------------------------------------------------------------------------
# The MTP module.
# --------------------------------------------------------------------------------------------
class SharedHead(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.norm = hf_ds3.DeepseekV3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)


class MTPLayer(hf_ds3.DeepseekV3DecoderLayer):
    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        d, eps = config.hidden_size, config.rms_norm_eps
        self.enorm = hf_ds3.DeepseekV3RMSNorm(d, eps=eps)
        self.hnorm = hf_ds3.DeepseekV3RMSNorm(d, eps=eps)
        self.eh_proj = nn.Linear(2 * d, d, bias=False)
        self.shared_head = SharedHead(config)

    def forward(self, h_prev, emb, **layer_kwargs):
        """h_prev: [B, T, d] h_{k-1}; emb: [B, T, d] embedding of ids_k. Returns (h_k, logits_k)."""
        x = self.eh_proj(torch.cat([self.enorm(emb), self.hnorm(h_prev)], dim=-1))
        h = hf_ds3.DeepseekV3DecoderLayer.forward(self, x, **layer_kwargs)
        return h, self.shared_head.head(self.shared_head.norm(h))


def attach_mtp(model):
    """model.mtp_layers = num_nextn_predict_layers MTPLayers, layer_idx L + k (MoE or dense by
    first_k_dense_replace, as a main layer of that index)."""
    c = model.config
    D, L = c.num_nextn_predict_layers, c.num_hidden_layers
    model.mtp_layers = nn.ModuleList([MTPLayer(c, L + k) for k in range(D)]).float()


def mtp_layers(model):
    return list(model.mtp_layers) if hasattr(model, "mtp_layers") else []


def all_gates(model):
    L = model.config.num_hidden_layers
    g = md.moe_gates(model)
    g += [(f"model.layers.{L + k}.mlp.gate", m.mlp.gate) for k, m in enumerate(mtp_layers(model))
          if isinstance(m.mlp, hf_ds3.DeepseekV3MoE)]
    return g


def configure_all_routers(model):
    c = model.config
    for _, gate in all_gates(model):
        gate.scoring_func = getattr(c, "scoring_func", "sigmoid")
        gate.topk_method = getattr(c, "topk_method", "noaux_tc")


def init_case(cfg, seed):
    """make_dumps' init for the main model, the same rules for the MTP layers (drawn after it)."""
    model = md.init_model(cfg, seed)
    attach_mtp(model)
    g = torch.Generator().manual_seed(seed + 99)
    d = cfg.hidden_size
    with torch.no_grad():
        for name, p in model.mtp_layers.named_parameters():
            if p.ndim == 1:
                p.normal_(generator=g).mul_(0.1).add_(1.0)
            elif name.endswith("shared_head.head.weight"):
                p.copy_(model.lm_head.weight + 0.3 / math.sqrt(d) * torch.randn(p.shape, generator=g))
            else:
                gain = 2.0 if name.endswith("mlp.gate.weight") else 1.0
                p.normal_(generator=g).mul_(gain / math.sqrt(p.shape[-1]))
        for _, gate in all_gates(model)[len(md.moe_gates(model)):]:
            gate.e_score_correction_bias.normal_(generator=g).mul_(0.05)
    configure_all_routers(model)
    return model


def mtp_names(tensors, cfg):
    """mtp_layers.{k}.X -> model.layers.{L+k}.X (experts per expert, as the release)."""
    L = cfg.num_hidden_layers
    out = {}
    for name, t in tensors.items():
        k, rest = name.split(".", 2)[1:]
        out[f"model.layers.{L + int(k)}.{rest}"] = t
    return md.to_checkpoint_names(out, cfg)


def checkpoint_state(model):
    sd = md.checkpoint_state(model)                       # main model (drops mtp_layers.*)
    sd = {k: v for k, v in sd.items() if not k.startswith("mtp_layers.")}
    mtp = {k: v.detach().clone() for k, v in model.state_dict().items() if k.startswith("mtp_layers.")}
    sd.update(mtp_names(mtp, model.config))
    for k in range(model.config.num_nextn_predict_layers):   # the release's copy of the embedding
        sd[f"model.layers.{model.config.num_hidden_layers + k}.embed_tokens.weight"] = \
            model.model.embed_tokens.weight.detach().clone()
    return {k: v.contiguous() for k, v in sd.items()}


def grads_by_checkpoint_name(model):
    g = {n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().clone()
         for n, p in model.named_parameters()}
    main = md.to_checkpoint_names({k: v for k, v in g.items() if not k.startswith("mtp_layers.")}, model.config)
    main.update(mtp_names({k: v for k, v in g.items() if k.startswith("mtp_layers.")}, model.config))
    return main


def write_model(model, style, d):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(md.config_json(model.config, style), f, indent=2, sort_keys=True)
    save_file(checkpoint_state(model), os.path.join(d, "model.safetensors"), metadata={"format": "pt"})


def load_model(d):
    m = md.load_model(d)                     # transformers ignores model.layers.<L+k>.*
    attach_mtp(m)
    sd = load_file(os.path.join(d, "model.safetensors"))
    L, Fm = m.config.num_hidden_layers, m.config.moe_intermediate_size
    own = {}
    for k, layer in enumerate(mtp_layers(m)):
        pre = f"model.layers.{L + k}."
        for name, p in layer.named_parameters():
            if name.endswith("mlp.experts.gate_up_proj"):
                E = p.shape[0]
                t = torch.stack([torch.cat([sd[f"{pre}mlp.experts.{e}.gate_proj.weight"],
                                            sd[f"{pre}mlp.experts.{e}.up_proj.weight"]]) for e in range(E)])
            elif name.endswith("mlp.experts.down_proj"):
                t = torch.stack([sd[f"{pre}mlp.experts.{e}.down_proj.weight"] for e in range(p.shape[0])])
            else:
                t = sd[pre + name]
            own[id(p)] = t
            assert t.shape == p.shape, (name, t.shape, p.shape)
            with torch.no_grad():
                p.copy_(t)
        for name, b in layer.named_buffers():
            if name.endswith("e_score_correction_bias"):
                with torch.no_grad():
                    b.copy_(sd[pre + name])
    configure_all_routers(m)
    return m


# --------------------------------------------------------------------------------------------
# Loss, gradients, training.
# --------------------------------------------------------------------------------------------
def mtp_shift(ids, labels, k):
    """ids_k [B, T] (ids[t+k], ids[t] where t+k >= T) and targets_k (labels[t+k+1], -100 past T)."""
    T = ids.shape[1]
    j = torch.arange(T) + k
    ids_k = torch.where(j < T, ids[:, j.clamp(max=T - 1)], ids)
    tg = torch.where(j + 1 < T, labels[:, (j + 1).clamp(max=T - 1)], torch.full_like(labels, -100))
    return ids_k, tg


def forward_loss(model, batch, alpha, w):
    ids, labels = batch["ids"], batch["labels"]
    cap, hooks = {}, []
    hooks.append(model.model.layers[0].register_forward_pre_hook(
        lambda mod, a, kw: cap.__setitem__("kw", kw), with_kwargs=True))
    hooks.append(model.model.norm.register_forward_pre_hook(lambda mod, a: cap.__setitem__("h", a[0])))
    try:
        out = model(input_ids=ids, labels=labels, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    V = out.logits.shape[-1]
    ce = out.loss
    ce2 = F.cross_entropy(out.logits[:, :-1].reshape(-1, V).float(), labels[:, 1:].reshape(-1), ignore_index=-100)
    assert torch.allclose(ce, ce2, rtol=1e-6, atol=0), (ce, ce2)
    h, mtp_losses = cap["h"], []
    for k, layer in enumerate(mtp_layers(model) if w > 0 else [], 1):
        ids_k, tg = mtp_shift(ids, labels, k)
        assert bool((tg != -100).any()), "an MTP depth without a valid target"
        h, lg = layer(h, model.model.embed_tokens(ids_k), **cap["kw"])
        mtp_losses.append(F.cross_entropy(lg.reshape(-1, V).float(), tg.reshape(-1), ignore_index=-100))
    mtp = torch.stack(mtp_losses).mean() if mtp_losses else torch.zeros(())
    B, T = ids.shape
    aux = torch.zeros((), dtype=torch.float32)
    routes = {}
    for name, gate in all_gates(model):
        if not hasattr(gate, "trex_record"):       # an MTP layer not run (w == 0)
            continue
        rec = gate.trex_record
        routes[name] = rec
        if alpha > 0:
            E, K = gate.num_experts, gate.top_k
            s = rec["scores"].view(B, T, E)
            s = s / s.sum(dim=-1, keepdim=True)
            P = s.mean(dim=1)                                                  # [B, E]
            cnt = torch.zeros(B, E).scatter_add_(1, rec["idx"].view(B, T * K), torch.ones(B, T * K))
            f = cnt * (E / (K * T))
            aux = aux + alpha * (f * P).sum(dim=-1).mean()
    for _, gate in all_gates(model):          # a stale record must not count in the next call
        if hasattr(gate, "trex_record"):
            del gate.trex_record
    return ce + aux + w * mtp, ce, aux, mtp, out.logits, routes


def reference_grads(model, batch, alpha, w):
    model.train()
    model.zero_grad(set_to_none=True)
    loss, ce, aux, mtp, logits, routes = forward_loss(model, batch, alpha, w)
    loss.backward()
    return loss.detach(), ce.detach(), aux.detach(), mtp.detach(), logits.detach(), routes, grads_by_checkpoint_name(model)


class Bf16LinearsMtp(md.Bf16Linears):
    """make_dumps' bf16 semantics with the MTP routers kept f32 and the MTP heads' dy not rounded."""

    def __init__(self, model):
        super().__init__(model)
        self.router = {id(g.weight) for _, g in all_gates(model)}
        self.heads = {id(model.lm_head.weight)} | {id(m.shared_head.head.weight) for m in mtp_layers(model)}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (F.linear, torch._C._nn.linear):
            x, wt = args[0], args[1] if len(args) > 1 else kwargs["weight"]
            if id(wt) in self.router:
                self.calls["router"] += 1
            else:
                self.calls["bf16"] += 1
                return md.Bf16Linear.apply(x, wt, id(wt) not in self.heads)
        return func(*args, **kwargs)


def precision_context(model, prec):
    if prec == "bf16_weights":
        return lambda: Bf16LinearsMtp(model)
    return md.precision_context(model, prec)


def train(model, batch, tr, prec="fp32"):
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([dict(params=decay, weight_decay=tr["weight_decay"]),
                             dict(params=no_decay, weight_decay=0.0)],
                            lr=tr["lr"], betas=(tr["beta1"], tr["beta2"]), eps=tr["eps"], foreach=False)
    losses, norms, loads, margin = [], [], [], math.inf
    ctx = precision_context(model, prec)
    for _ in range(tr["steps"]):
        opt.zero_grad(set_to_none=True)
        with ctx():
            loss, _, _, _, _, routes = forward_loss(model, batch, tr["aux_loss_alpha"], tr["mtp_loss_weight"])
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), tr["clip_grad_norm"]).item())
        losses.append(loss.item())
        opt.step()
        step_loads = {}
        for name, gate in all_gates(model):
            rec = routes[name]
            margin = min(margin, rec["margin"])
            load = torch.bincount(rec["idx"].flatten(), minlength=gate.num_experts).float()
            step_loads[name] = [int(x) for x in load.tolist()]
            with torch.no_grad():
                gate.e_score_correction_bias += tr["bias_update_gamma"] * torch.sign(load.mean() - load)
        loads.append(step_loads)
    final_bias = {f"{n}.e_score_correction_bias": g.e_score_correction_bias.tolist() for n, g in all_gates(model)}
    return dict(losses=losses, grad_norms=norms, loads=loads, final_bias=final_bias, margin=margin)


# --------------------------------------------------------------------------------------------
# Dumps.
# --------------------------------------------------------------------------------------------
def build_case(spec, seed):
    cfg = md.make_config(spec["model"])
    return init_case(cfg, seed), md.make_batch(cfg.vocab_size, spec["B"], spec["T"], seed)


def write_case(name, spec, out_root):
    tr = dict(md.TRAIN_DEFAULT, **spec.get("train", {}))
    for seed in range(spec["seed"], spec["seed"] + 50):   # first seed whose routing has no near-ties
        model, batch = build_case(spec, seed)
        trained = train(build_case(spec, seed)[0], batch, tr)
        if trained["margin"] >= md.MARGIN_MIN:
            break
        print(f"  {name}: seed {seed} has routing margin {trained['margin']:.2e}, trying next")
    else:
        raise RuntimeError(f"{name}: no seed with routing margin >= {md.MARGIN_MIN}")
    loss, ce, aux, mtp, logits, routes, grads = reference_grads(model, batch, tr["aux_loss_alpha"], tr["mtp_loss_weight"])
    yard = {p: train(build_case(spec, seed)[0], batch, tr, p) for p in ("bf16_autocast", "bf16_weights")}
    d = os.path.join(out_root, name)
    shutil.rmtree(d, ignore_errors=True)
    write_model(model, spec["style"], os.path.join(d, "model"))
    # The written checkpoint reads back (transformers for the main model, this port for the MTP
    # layers) to the same loss.
    re = load_model(os.path.join(d, "model"))
    l2 = forward_loss(re, batch, tr["aux_loss_alpha"], tr["mtp_loss_weight"])[0]
    assert torch.equal(l2.detach(), loss), (l2, loss)
    with open(os.path.join(d, "batch.json"), "w") as f:
        json.dump({"input_ids": batch["ids"].tolist(), "labels": batch["labels"].tolist()}, f)
    t = {"loss": loss.double().reshape(1), "ce_loss": ce.double().reshape(1),
         "aux_loss": aux.double().reshape(1), "mtp_loss": mtp.double().reshape(1)}
    t.update({f"grad.{k}": v.float().contiguous() for k, v in grads.items()})
    save_file(t, os.path.join(d, "expected.safetensors"), metadata={"format": "pt"})
    exp = {"case": name, "seed": seed, "loss": loss.item(), "ce_loss": ce.item(), "aux_loss": aux.item(),
           "mtp_loss": mtp.item(), "train": tr, "losses": trained["losses"],
           "grad_norms": trained["grad_norms"], "final_bias": trained["final_bias"],
           "loads": trained["loads"], "routing_min_margin": trained["margin"],
           "losses_bf16_autocast": yard["bf16_autocast"]["losses"],
           "losses_bf16_weights": yard["bf16_weights"]["losses"],
           "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__}}
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump(exp, f, indent=1)
    size = sum(os.path.getsize(os.path.join(r, x)) for r, _, fs in os.walk(d) for x in fs)
    print(f"{name}: seed {seed} params {sum(p.numel() for p in model.parameters())} loss {loss.item():.6f} "
          f"(ce {ce.item():.6f} aux {aux.item():.6f} mtp {mtp.item():.6f}) "
          f"losses {trained['losses'][0]:.4f}->{trained['losses'][-1]:.4f} margin {trained['margin']:.2e} "
          f"size {size / 1e3:.0f} kB")


def check(args):
    rows, failed = [], []
    work = tempfile.mkdtemp(prefix="trex_check_mtp_")
    for name in args.cases:
        d = os.path.join(DATA, name)
        exp = json.load(open(os.path.join(d, "expected.json")))
        tr = exp["train"]
        bj = json.load(open(os.path.join(d, "batch.json")))
        batch = dict(ids=torch.tensor(bj["input_ids"]), labels=torch.tensor(bj["labels"]))
        model = load_model(os.path.join(d, "model"))
        loss, _, _, _, _, _, grads = reference_grads(model, batch, tr["aux_loss_alpha"], tr["mtp_loss_weight"])
        out = os.path.join(work, name + ".grads.safetensors")
        cmd = [args.trex, "grad", "--model", os.path.join(d, "model"), "--batch", os.path.join(d, "batch.json"),
               "--precision", "fp32", "--out", out, "--mtp-loss-weight", repr(tr["mtp_loss_weight"])]
        if tr["aux_loss_alpha"] > 0:
            cmd += ["--aux-loss-alpha", repr(tr["aux_loss_alpha"])]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            print(f"{name}: trex failed: {(p.stderr or p.stdout).strip()[-300:]}")
            failed.append(name)
            continue
        tl = [json.loads(x)["loss"] for x in p.stdout.splitlines() if x.startswith("{")][-1]
        if not md.compare(name, loss.item(), grads, float(tl), load_file(out), rows):
            failed.append(name)
    for c, k, a, b, e, good in rows:
        if args.verbose or not good or k == "loss":
            print(f"{c:<20} {k:<60} {a:>12} {b:>12} {e:>10.2e}  {'ok' if good else 'FAIL'}")
    for name in args.cases:
        rs = [r for r in rows if r[0] == name and r[1] != "loss"]
        if rs:
            print(f"{name}: {len(rs)} gradients, max rel err {max(r[4] for r in rs):.2e}")
    print(f"{len(args.cases) - len(failed)}/{len(args.cases)} cases passed" + (f"; failed: {failed}" if failed else ""))
    shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DATA, help="dump folder (default tests/reference/data)")
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--check", action="store_true", help="compare live PyTorch with `trex grad`")
    ap.add_argument("--trex", default="build/trex", help="trex binary for --check")
    ap.add_argument("--verbose", action="store_true", help="--check: print every gradient row")
    args = ap.parse_args()
    if args.check:
        sys.exit(check(args))
    for name in args.cases:
        write_case(name, CASES[name], args.out)


if __name__ == "__main__":
    main()
