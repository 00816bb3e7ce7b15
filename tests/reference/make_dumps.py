#!/usr/bin/env python3
"""Independent PyTorch reference for trex model parity (see tests/reference/README.md).

Builds tiny DeepseekV3ForCausalLM models with Hugging Face transformers (random init, fixed
seed, fp32), and writes per case tests/reference/data/<case>/{model/, batch.json,
expected.safetensors, expected.json}. With --check it recomputes the reference live and
compares it with `trex grad` on the committed cases and on N random configurations.

  .venv/bin/python tests/reference/make_dumps.py                      # regenerate all dumps
  .venv/bin/python tests/reference/make_dumps.py --check --trex build/trex --random 5
"""
import argparse
import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf_ds3
from torch.overrides import TorchFunctionMode

torch.set_num_threads(1)
HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
MARGIN_MIN = 1e-4  # smallest accepted top-k / group-selection gap over the 10 training steps

# --------------------------------------------------------------------------------------------
# Cases. "model": DeepseekV3 config fields; "train": optimizer / router-balancing settings;
# "style": how config.json is written ("deepseek" = like the real DeepSeek-V3 release,
# rope_theta + rope_scaling{type: yarn}; "hf5" = what transformers 5 save_pretrained writes,
# rope_parameters{rope_type, rope_theta, ...}).
# --------------------------------------------------------------------------------------------
TRAIN_DEFAULT = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1,
                     clip_grad_norm=1.0, bias_update_gamma=0.0, aux_loss_alpha=0.0, steps=10)

CASES = {
    "v3_qlora_sigmoid": dict(
        seed=1001, style="deepseek", B=2, T=13,
        model=dict(vocab_size=97, hidden_size=48, num_hidden_layers=3, first_k_dense_replace=1,
                   num_attention_heads=3, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=12,
                   qk_rope_head_dim=8, v_head_dim=10, intermediate_size=56,
                   moe_intermediate_size=20, n_routed_experts=8, n_shared_experts=1,
                   num_experts_per_tok=2, n_group=2, topk_group=1, scoring_func="sigmoid",
                   topk_method="noaux_tc", norm_topk_prob=True, routed_scaling_factor=2.5,
                   max_position_embeddings=64, tie_word_embeddings=False,
                   rope_scaling=dict(rope_type="yarn", factor=4.0,
                                     original_max_position_embeddings=16, beta_fast=32,
                                     beta_slow=1, mscale=1.0, mscale_all_dim=1.0)),
        train=dict(bias_update_gamma=0.01, aux_loss_alpha=0.0)),
    "v3_noqlora_softmax": dict(
        seed=2002, style="hf5", B=2, T=13,
        model=dict(vocab_size=89, hidden_size=45, num_hidden_layers=3, first_k_dense_replace=1,
                   num_attention_heads=5, q_lora_rank=None, kv_lora_rank=14, qk_nope_head_dim=10,
                   qk_rope_head_dim=6, v_head_dim=9, intermediate_size=50,
                   moe_intermediate_size=14, n_routed_experts=10, n_shared_experts=2,
                   num_experts_per_tok=3, n_group=2, topk_group=1, scoring_func="softmax",
                   topk_method="noaux_tc", norm_topk_prob=False, routed_scaling_factor=1.0,
                   max_position_embeddings=32, tie_word_embeddings=False,
                   rope_scaling=dict(rope_type="yarn", factor=2.0,
                                     original_max_position_embeddings=16, beta_fast=32,
                                     beta_slow=1, mscale=0.8, mscale_all_dim=0.6)),
        train=dict(bias_update_gamma=0.0, aux_loss_alpha=0.01)),
    "v3_tied_greedy": dict(
        seed=3003, style="deepseek", B=2, T=13,
        model=dict(vocab_size=101, hidden_size=39, num_hidden_layers=4, first_k_dense_replace=2,
                   num_attention_heads=3, q_lora_rank=21, kv_lora_rank=15, qk_nope_head_dim=7,
                   qk_rope_head_dim=4, v_head_dim=11, intermediate_size=43,
                   moe_intermediate_size=17, n_routed_experts=7, n_shared_experts=1,
                   num_experts_per_tok=2, n_group=1, topk_group=1, scoring_func="sigmoid",
                   topk_method="greedy", norm_topk_prob=False, routed_scaling_factor=1.3,
                   max_position_embeddings=64, tie_word_embeddings=True, rope_scaling=None),
        train=dict(bias_update_gamma=0.01, aux_loss_alpha=0.005)),
}


# --------------------------------------------------------------------------------------------
# Router: trex semantics, patched into HF's DeepseekV3TopkRouter (HF only has sigmoid+noaux_tc).
# --------------------------------------------------------------------------------------------
HF_ROUTER_FORWARD = hf_ds3.DeepseekV3TopkRouter.forward


def route(self, hidden_states):
    h = hidden_states.view(-1, self.hidden_dim)                       # [N, d]
    with torch.autocast("cpu", enabled=False):   # fp32 even under autocast (HF's would be bf16)
        logits = F.linear(h.type(torch.float32), self.weight.type(torch.float32))  # [N, E]
    if self.scoring_func == "sigmoid":
        scores = logits.sigmoid()
    elif self.scoring_func == "softmax":
        scores = logits.softmax(dim=-1, dtype=torch.float32)
    else:
        raise ValueError(f"scoring_func {self.scoring_func}")
    E, K = self.num_experts, self.top_k
    margin, zero_mask_diff = math.inf, 0
    with torch.no_grad():
        if self.topk_method == "noaux_tc":
            # Exactly HF 5.24 DeepseekV3TopkRouter.forward (note: masked with -inf).
            sel = scores + self.e_score_correction_bias
            G = self.num_group
            gscore = sel.view(-1, G, E // G).topk(2, dim=-1)[0].sum(dim=-1)            # [N, G]
            gidx = torch.topk(gscore, k=self.topk_group, dim=-1, sorted=False)[1]
            gmask = torch.zeros_like(gscore).scatter_(1, gidx, 1)
            smask = gmask.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E)
            masked = sel.masked_fill(~smask.bool(), float("-inf"))
            idx = torch.topk(masked, k=K, dim=-1, sorted=False)[1]                   # [N, K]
            if G > self.topk_group:
                gs = gscore.sort(dim=-1, descending=True)[0]
                margin = min(margin, (gs[:, self.topk_group - 1] - gs[:, self.topk_group]).min().item())
            ms = masked.sort(dim=-1, descending=True)[0]
            if K < E:
                gap = ms[:, K - 1] - ms[:, K]
                margin = min(margin, gap[torch.isfinite(gap)].min().item() if torch.isfinite(gap).any() else math.inf)
            # Would the older "masked_fill(..., 0.0)" convention pick different experts?
            idx0 = torch.topk(sel.masked_fill(~smask.bool(), 0.0), k=K, dim=-1)[1]
            zero_mask_diff = int((idx0.sort(-1)[0] != idx.sort(-1)[0]).any(-1).sum().item())
        elif self.topk_method == "greedy":
            idx = torch.topk(scores, k=K, dim=-1, sorted=False)[1]
            if K < E:
                ss = scores.sort(dim=-1, descending=True)[0]
                margin = (ss[:, K - 1] - ss[:, K]).min().item()
        else:
            raise ValueError(f"topk_method {self.topk_method}")
    weights = scores.gather(1, idx)                                                   # [N, K]
    if self.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    weights = weights * self.routed_scaling_factor
    self.trex_record = dict(scores=scores, idx=idx, margin=margin, zero_mask_diff=zero_mask_diff)
    return logits, weights, idx


def configure_routers(model):
    c = model.config
    for layer in model.model.layers:
        if isinstance(layer.mlp, hf_ds3.DeepseekV3MoE):
            layer.mlp.gate.scoring_func = getattr(c, "scoring_func", "sigmoid")
            layer.mlp.gate.topk_method = getattr(c, "topk_method", "noaux_tc")


def moe_gates(model):
    return [(f"model.layers.{i}.mlp.gate", l.mlp.gate) for i, l in enumerate(model.model.layers)
            if isinstance(l.mlp, hf_ds3.DeepseekV3MoE)]


hf_ds3.DeepseekV3TopkRouter.forward = route


# --------------------------------------------------------------------------------------------
# bf16 yardsticks (expected.json losses_bf16_*; not what trex is tested against, see README).
# "bf16_autocast": forward + loss under torch.autocast("cpu", bfloat16), router kept fp32.
# "bf16_weights": trex's bf16 semantics: every linear but the router reads bf16-rounded x and W
# (f32 accumulation); backward dx = r(dy) r(W), dW = r(dy)^T r(x), r = round to bf16; the LM head
# does not round dy (kernels/lm_head_ce.h). Attention scores / p.v, norms, RoPE stay fp32.
# --------------------------------------------------------------------------------------------
def rb(t):
    return t.to(torch.bfloat16).to(torch.float32)


class Bf16Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, round_dy):                     # x: [..., in]  w: [out, in]
        xb, wb = rb(x), rb(w)
        ctx.save_for_backward(xb, wb)
        ctx.round_dy = round_dy
        return F.linear(xb, wb)

    @staticmethod
    def backward(ctx, dy):                                # dy: [..., out]
        xb, wb = ctx.saved_tensors
        g = rb(dy) if ctx.round_dy else dy
        dw = g.reshape(-1, g.shape[-1]).t() @ xb.reshape(-1, xb.shape[-1])
        return g @ wb, dw, None


class Bf16Linears(TorchFunctionMode):
    """Routes every F.linear (nn.Linear, experts, LM head) through Bf16Linear, except the router."""

    def __init__(self, model):
        super().__init__()
        self.router = {id(g.weight) for _, g in moe_gates(model)}
        self.head = id(model.lm_head.weight)
        self.calls = {"bf16": 0, "router": 0}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (F.linear, torch._C._nn.linear):
            x, w = args[0], args[1] if len(args) > 1 else kwargs["weight"]
            b = args[2] if len(args) > 2 else kwargs.get("bias")
            if id(w) in self.router:
                self.calls["router"] += 1
            else:
                assert b is None and w.dtype == torch.float32, (b, w.dtype)
                self.calls["bf16"] += 1
                return Bf16Linear.apply(x, w, id(w) != self.head)
        return func(*args, **kwargs)


def precision_context(model, prec):
    """A factory of context managers for one forward + loss in precision `prec`."""
    if prec == "fp32":
        return contextlib.nullcontext
    if prec == "bf16_autocast":
        return lambda: torch.autocast("cpu", dtype=torch.bfloat16)
    if prec == "bf16_weights":
        return lambda: Bf16Linears(model)
    raise ValueError(prec)


def route_flips(a, b):
    """(token, slot) selections of idx a [N, K] not in the same row of b (per row K - |a & b|)."""
    K = a.shape[1]
    same = (a.unsqueeze(-1) == b.unsqueeze(-2)).any(-1).sum(-1)
    return int((K - same).sum().item())


# --------------------------------------------------------------------------------------------
# Model construction, init, checkpoint I/O.
# --------------------------------------------------------------------------------------------
def make_config(m):
    kw = dict(m)
    kw.setdefault("num_key_value_heads", kw["num_attention_heads"])
    kw.setdefault("num_nextn_predict_layers", 0)
    kw.setdefault("rope_theta", 10000.0)
    rs = kw.pop("rope_scaling", None)
    kw["rope_parameters"] = dict(rs, rope_theta=kw.pop("rope_theta")) if rs else \
        dict(rope_type="default", rope_theta=kw.pop("rope_theta"))
    cfg = DeepseekV3Config(**kw)
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    return cfg


def init_model(cfg, seed):
    """Non-trivial init: matrices N(0, 1/fan_in) (router x2), norms 1+0.1N, bias 0.05N."""
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(cfg).float()
    g = torch.Generator().manual_seed(seed)
    d = cfg.hidden_size
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                assert name.endswith("norm.weight"), name
                p.normal_(generator=g).mul_(0.1).add_(1.0)
            elif "embed_tokens" in name:
                p.normal_(generator=g).mul_(1.5 / math.sqrt(d) if cfg.tie_word_embeddings else 1.0)
            else:
                gain = 2.0 if name.endswith("mlp.gate.weight") else 1.0
                p.normal_(generator=g).mul_(gain / math.sqrt(p.shape[-1]))
        for _, gate in moe_gates(model):
            gate.e_score_correction_bias.normal_(generator=g).mul_(0.05)
    configure_routers(model)
    return model


def to_checkpoint_names(tensors, cfg):
    """HF 5 in-memory names -> real DeepSeek-V3 checkpoint names (per-expert, unfused).
    experts.gate_up_proj [E, 2F, d] -> experts.{e}.gate_proj = [e, :F], up_proj = [e, F:];
    experts.down_proj [E, d, F] -> experts.{e}.down_proj = [e]."""
    out, F_ = {}, cfg.moe_intermediate_size
    for name, t in tensors.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            pre = name[: -len("gate_up_proj")]
            for e in range(t.shape[0]):
                out[f"{pre}{e}.gate_proj.weight"] = t[e, :F_].contiguous()
                out[f"{pre}{e}.up_proj.weight"] = t[e, F_:].contiguous()
        elif name.endswith("mlp.experts.down_proj"):
            pre = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{pre}{e}.down_proj.weight"] = t[e].contiguous()
        else:
            out[name] = t.contiguous()
    return out


def checkpoint_state(model):
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    return to_checkpoint_names(sd, model.config)


def config_json(cfg, style):
    if style == "hf5":
        j = json.loads(cfg.to_json_string())         # the diff-to-defaults form save_pretrained writes
        j.update(architectures=["DeepseekV3ForCausalLM"], dtype="float32")
        return j
    keys = ["vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
            "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "n_shared_experts",
            "n_routed_experts", "routed_scaling_factor", "kv_lora_rank", "q_lora_rank",
            "qk_rope_head_dim", "v_head_dim", "qk_nope_head_dim", "topk_method", "n_group",
            "topk_group", "num_experts_per_tok", "first_k_dense_replace", "norm_topk_prob",
            "scoring_func", "hidden_act", "max_position_embeddings", "initializer_range",
            "rms_norm_eps", "use_cache", "bos_token_id", "eos_token_id", "tie_word_embeddings",
            "attention_bias", "attention_dropout", "num_nextn_predict_layers"]
    j = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3"}
    for k in keys:
        j[k] = getattr(cfg, k)
    rp = dict(cfg.rope_parameters)
    j["rope_theta"] = rp.pop("rope_theta")
    j["rope_scaling"] = None if rp["rope_type"] == "default" else \
        dict({"type": rp.pop("rope_type")}, **rp)
    if not cfg.rope_interleave:          # absent in real checkpoints (HF default: true)
        j["rope_interleave"] = False
    j["torch_dtype"] = "float32"
    return j


def write_model(model, style, d):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config_json(model.config, style), f, indent=2, sort_keys=True)
    save_file(checkpoint_state(model), os.path.join(d, "model.safetensors"), metadata={"format": "pt"})


def load_model(d):
    m = DeepseekV3ForCausalLM.from_pretrained(d, attn_implementation="eager",
                                              experts_implementation="eager", dtype=torch.float32)
    configure_routers(m)
    return m


def verify_checkpoint(model, style, d, batch):
    """Our per-expert names == what save_pretrained writes; reload gives bit-identical logits."""
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        theirs, ours = load_file(os.path.join(tmp, "model.safetensors")), checkpoint_state(model)
        assert set(theirs) == set(ours), (set(theirs) ^ set(ours))
        for k in ours:
            assert torch.equal(theirs[k], ours[k]), k
    re = load_model(d)
    rp = lambda c: {k: v for k, v in c.rope_parameters.items() if k != "type"}
    assert rp(re.config) == rp(model.config), (re.config.rope_parameters, model.config.rope_parameters)
    model.eval(), re.eval()
    with torch.no_grad():
        a = model(input_ids=batch["ids"]).logits
        b = re(input_ids=batch["ids"]).logits
    assert torch.equal(a, b), (a - b).abs().max()
    model.train()


# --------------------------------------------------------------------------------------------
# Loss = CE (HF label shift) + sequence-wise aux loss; gradients; training.
# --------------------------------------------------------------------------------------------
def make_batch(vocab, B, T, seed):
    g = torch.Generator().manual_seed(seed + 7)
    ids = torch.randint(0, vocab, (B, T), generator=g)
    labels = ids.clone()
    for b in range(B):
        pos = torch.randperm(T - 1, generator=g)[:2 + b] + 1    # never position 0 (unused anyway)
        labels[b, pos] = -100
    return dict(ids=ids, labels=labels)


def forward_loss(model, batch, alpha):
    out = model(input_ids=batch["ids"], labels=batch["labels"])
    ce = out.loss
    B, T = batch["ids"].shape
    # Independent check of HF's loss: position t predicts labels[t+1], mean over non-ignored.
    ce2 = F.cross_entropy(out.logits[:, :-1].reshape(-1, out.logits.shape[-1]).float(),
                          batch["labels"][:, 1:].reshape(-1), ignore_index=-100)
    assert torch.allclose(ce, ce2, rtol=1e-6, atol=0), (ce, ce2)
    aux = torch.zeros((), dtype=torch.float32)
    routes = {}
    for name, gate in moe_gates(model):
        rec = gate.trex_record
        routes[name] = rec
        if alpha > 0:
            E, K = gate.num_experts, gate.top_k
            s = rec["scores"].view(B, T, E)
            s = s / s.sum(dim=-1, keepdim=True)
            P = s.mean(dim=1)                                                  # [B, E]
            cnt = torch.zeros(B, E).scatter_add_(
                1, rec["idx"].view(B, T * K), torch.ones(B, T * K))            # [B, E]
            f = cnt * (E / (K * T))
            aux = aux + alpha * (f * P).sum(dim=-1).mean()
    return ce + aux, ce, aux, out.logits, routes


def grads_by_checkpoint_name(model):
    g = {n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().clone()
         for n, p in model.named_parameters()}
    return to_checkpoint_names(g, model.config)


def reference_grads(model, batch, alpha):
    model.train()
    model.zero_grad(set_to_none=True)
    loss, ce, aux, logits, routes = forward_loss(model, batch, alpha)
    loss.backward()
    return loss.detach(), ce.detach(), aux.detach(), logits.detach(), routes, grads_by_checkpoint_name(model)


def train(model, batch, tr, prec="fp32"):
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([dict(params=decay, weight_decay=tr["weight_decay"]),
                             dict(params=no_decay, weight_decay=0.0)],
                            lr=tr["lr"], betas=(tr["beta1"], tr["beta2"]), eps=tr["eps"],
                            foreach=False)
    losses, norms, loads, margin, zdiff, routes0 = [], [], [], math.inf, 0, None
    ctx = precision_context(model, prec)
    for _ in range(tr["steps"]):
        opt.zero_grad(set_to_none=True)
        with ctx() as mode:
            loss, _, _, _, routes = forward_loss(model, batch, tr["aux_loss_alpha"])
        if isinstance(mode, Bf16Linears):   # each MoE router once, everything else rounded
            assert mode.calls["router"] == len(moe_gates(model)) and mode.calls["bf16"] > 0, mode.calls
        routes0 = routes0 or {n: r["idx"].clone() for n, r in routes.items()}
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), tr["clip_grad_norm"]).item())
        losses.append(loss.item())
        opt.step()
        step_loads = {}
        for name, gate in moe_gates(model):
            rec = routes[name]
            margin, zdiff = min(margin, rec["margin"]), zdiff + rec["zero_mask_diff"]
            load = torch.bincount(rec["idx"].flatten(), minlength=gate.num_experts).float()
            step_loads[name] = [int(x) for x in load.tolist()]
            with torch.no_grad():
                gate.e_score_correction_bias += tr["bias_update_gamma"] * torch.sign(load.mean() - load)
        loads.append(step_loads)
    final_bias = {f"{n}.e_score_correction_bias": g.e_score_correction_bias.tolist()
                  for n, g in moe_gates(model)}
    return dict(losses=losses, grad_norms=norms, loads=loads, final_bias=final_bias,
                margin=margin, zero_mask_diff=zdiff, routes0=routes0)


# --------------------------------------------------------------------------------------------
# Dump generation.
# --------------------------------------------------------------------------------------------
def build_case(spec, seed):
    cfg = make_config(spec["model"])
    model = init_model(cfg, seed)
    batch = make_batch(cfg.vocab_size, spec["B"], spec["T"], seed)
    return model, batch


def write_case(name, spec, out_root):
    tr = dict(TRAIN_DEFAULT, **spec.get("train", {}))
    for seed in range(spec["seed"], spec["seed"] + 50):   # first seed whose routing has no near-ties
        model, batch = build_case(spec, seed)
        loss, ce, aux, logits, routes, grads = reference_grads(model, batch, tr["aux_loss_alpha"])
        trained = train(build_case(spec, seed)[0], batch, tr)
        if trained["margin"] >= MARGIN_MIN:
            break
        print(f"  {name}: seed {seed} has routing margin {trained['margin']:.2e}, trying next")
    else:
        raise RuntimeError(f"{name}: no seed with routing margin >= {MARGIN_MIN}")
    yard = {p: train(build_case(spec, seed)[0], batch, tr, p) for p in ("bf16_autocast", "bf16_weights")}
    flips = {p: {n: route_flips(routes[n]["idx"], y["routes0"][n]) for n in routes} for p, y in yard.items()}
    d = os.path.join(out_root, name)
    shutil.rmtree(d, ignore_errors=True)
    write_model(model, spec["style"], os.path.join(d, "model"))
    verify_checkpoint(model, spec["style"], os.path.join(d, "model"), batch)
    if model.config.scoring_func == "sigmoid" and model.config.topk_method == "noaux_tc":
        check_router_matches_hf(model, batch)
    with open(os.path.join(d, "batch.json"), "w") as f:
        json.dump({"input_ids": batch["ids"].tolist(), "labels": batch["labels"].tolist()}, f)
    t = {"loss": loss.double().reshape(1), "ce_loss": ce.double().reshape(1),
         "aux_loss": aux.double().reshape(1), "logits": logits.float().contiguous()}
    for rname, rec in routes.items():
        t[f"route.{rname}.topk_indices"] = rec["idx"].sort(dim=-1)[0].to(torch.int32).contiguous()
    t.update({f"grad.{k}": v.float() for k, v in grads.items()})
    save_file(t, os.path.join(d, "expected.safetensors"), metadata={"format": "pt"})
    exp = {"case": name, "seed": seed, "loss": loss.item(), "ce_loss": ce.item(),
           "aux_loss": aux.item(), "train": tr, "losses": trained["losses"],
           "grad_norms": trained["grad_norms"], "final_bias": trained["final_bias"],
           "loads": trained["loads"], "routing_min_margin": trained["margin"],
           "zero_mask_would_differ": trained["zero_mask_diff"],
           "losses_bf16_autocast": yard["bf16_autocast"]["losses"],
           "losses_bf16_weights": yard["bf16_weights"]["losses"],
           "route_flips_bf16": flips["bf16_weights"],
           "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__}}
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump(exp, f, indent=1)
    size = sum(os.path.getsize(os.path.join(r, x)) for r, _, fs in os.walk(d) for x in fs)
    print(f"{name}: seed {seed} params {sum(p.numel() for p in model.parameters())} "
          f"loss {loss.item():.6f} (ce {ce.item():.6f} aux {aux.item():.6f}) "
          f"losses {trained['losses'][0]:.4f}->{trained['losses'][-1]:.4f} "
          f"margin {trained['margin']:.2e} zero-mask-diff {trained['zero_mask_diff']} size {size / 1e3:.0f} kB")
    for p, y in yard.items():
        dl = max(abs(a - b) for a, b in zip(y["losses"], trained["losses"]))
        print(f"  {p}: max |loss - fp32| over {tr['steps']} steps {dl:.4f}, "
              f"step-0 route flips {list(flips[p].values())}")


def check_router_matches_hf(model, batch):
    """For sigmoid + noaux_tc our router must be HF's own code: logits bit-identical."""
    with torch.no_grad():
        a = model(input_ids=batch["ids"]).logits
        hf_ds3.DeepseekV3TopkRouter.forward = HF_ROUTER_FORWARD
        try:
            b = model(input_ids=batch["ids"]).logits
        finally:
            hf_ds3.DeepseekV3TopkRouter.forward = route
    assert torch.equal(a, b), (a - b).abs().max()


# --------------------------------------------------------------------------------------------
# --check: live reference vs `trex grad`.
# --------------------------------------------------------------------------------------------
def random_spec(rng):
    ri = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=rng))
    rc = lambda xs: xs[ri(0, len(xs) - 1)]
    L = ri(1, 4)
    method = rc(["noaux_tc", "noaux_tc", "greedy"])
    G = rc([1, 2, 3]) if method == "noaux_tc" else 1
    per = ri(2, 5)
    E = G * per
    tg = ri(1, G)
    K = ri(1, min(tg * per, E - 1))
    rope = 2 * ri(1, 5)
    yarn = rc([True, False])
    factor = rc([2.0, 3.0, 4.0])
    model = dict(vocab_size=ri(31, 131), hidden_size=ri(17, 71), num_hidden_layers=L,
                 first_k_dense_replace=ri(0, L - 1), num_attention_heads=ri(1, 5),
                 q_lora_rank=rc([None, ri(9, 33)]), kv_lora_rank=ri(7, 29),
                 qk_nope_head_dim=ri(3, 15), qk_rope_head_dim=rope, v_head_dim=ri(3, 15),
                 intermediate_size=ri(19, 61), moe_intermediate_size=ri(7, 23), n_routed_experts=E,
                 n_shared_experts=ri(1, 2), num_experts_per_tok=K, n_group=G, topk_group=tg,
                 scoring_func=rc(["sigmoid", "softmax"]), topk_method=method,
                 norm_topk_prob=rc([True, False]), routed_scaling_factor=rc([1.0, 1.7, 2.5]),
                 max_position_embeddings=int(16 * factor) if yarn else 64,
                 tie_word_embeddings=rc([True, False]),
                 rope_interleave=rc([True, True, True, False]),
                 rope_scaling=dict(rope_type="yarn", factor=factor, original_max_position_embeddings=16,
                                   beta_fast=32, beta_slow=1, mscale=rc([1.0, 0.8]),
                                   mscale_all_dim=rc([1.0, 0.6, 0.0])) if yarn else None)
    return dict(seed=ri(1, 10 ** 6), style=rc(["deepseek", "hf5"]), B=ri(1, 3), T=2 * ri(2, 9) + 1,
                model=model, train=dict(aux_loss_alpha=rc([0.0, 0.01])))


def run_trex(trex, model_dir, batch_file, alpha, out):
    cmd = [trex, "grad", "--model", model_dir, "--batch", batch_file, "--precision", "fp32",
           "--out", out]
    if alpha > 0:
        cmd += ["--aux-loss-alpha", repr(alpha)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, None, f"cannot run {' '.join(cmd)}: {e}"
    if p.returncode != 0:
        return None, None, f"exit {p.returncode}: {(p.stderr or p.stdout).strip()[-300:]}"
    loss = None
    for line in p.stdout.splitlines():
        try:
            j = json.loads(line)
            loss = j["loss"] if isinstance(j, dict) and "loss" in j else loss
        except ValueError:
            pass
    if loss is None:
        return None, None, "no JSON line with \"loss\" on stdout"
    return float(loss), load_file(out), None


def compare(name, ref_loss, ref_grads, trex_loss, trex_grads, rows):
    ok = True
    # A gradient that is analytically zero (e.g. the router with top-1 and norm_topk_prob, whose
    # weight is constant) comes out of autograd as float rounding residue; such tensors are
    # compared against a floor of 1e-4 x the norm of all reference gradients instead of their own.
    total = math.sqrt(sum(float(g.double().norm()) ** 2 for g in ref_grads.values()))
    floor = 1e-4 * total
    lerr = abs(trex_loss - ref_loss) / max(abs(ref_loss), 1e-30)
    ok &= lerr <= 1e-5
    rows.append((name, "loss", f"{ref_loss:.7g}", f"{trex_loss:.7g}", lerr, lerr <= 1e-5))
    for k in sorted(set(ref_grads) | set(trex_grads)):
        if k not in trex_grads or k not in ref_grads:
            rows.append((name, k, "-" if k not in ref_grads else "present",
                         "missing" if k not in trex_grads else "extra", math.inf, False))
            ok = False
            continue
        r, t = ref_grads[k].double(), trex_grads[k].double()
        if r.shape != t.shape:
            rows.append((name, k, str(tuple(r.shape)), str(tuple(t.shape)), math.inf, False))
            ok = False
            continue
        err = (t - r).norm().item() / max(r.norm().item(), floor, 1e-12)
        good = err <= 1e-4 and bool(torch.isfinite(t).all())
        ok &= good
        rows.append((name, k, f"{r.norm().item():.4g}", f"{t.norm().item():.4g}", err, good))
    return ok


def check(args):
    rows, failed = [], []
    work = tempfile.mkdtemp(prefix="trex_check_")
    jobs = []
    for name in args.cases:
        d = os.path.join(DATA, name)
        exp = json.load(open(os.path.join(d, "expected.json")))
        jobs.append((name, d, None, exp["train"]["aux_loss_alpha"], exp))
    rng = torch.Generator().manual_seed(args.seed)
    for i in range(args.random):
        spec = random_spec(rng)
        jobs.append((f"random{i}", None, spec, spec["train"]["aux_loss_alpha"], None))
    for name, d, spec, alpha, exp in jobs:
        if spec is not None:                       # random config: write a fresh case folder
            d = os.path.join(work, name)
            while True:                            # re-seed until no near-tie in the routing
                model, batch = build_case(spec, spec["seed"])
                with torch.no_grad():
                    model(input_ids=batch["ids"])
                if min([g.trex_record["margin"] for _, g in moe_gates(model)] + [math.inf]) >= 1e-5:
                    break
                spec["seed"] += 1
            write_model(model, spec["style"], os.path.join(d, "model"))
            with open(os.path.join(d, "batch.json"), "w") as f:
                json.dump({"input_ids": batch["ids"].tolist(), "labels": batch["labels"].tolist()}, f)
            with open(os.path.join(d, "spec.json"), "w") as f:
                json.dump(spec, f, indent=1)
            verify_checkpoint(model, spec["style"], os.path.join(d, "model"), batch)
        bj = json.load(open(os.path.join(d, "batch.json")))
        batch = dict(ids=torch.tensor(bj["input_ids"]), labels=torch.tensor(bj["labels"]))
        model = load_model(os.path.join(d, "model"))
        loss, _, _, _, _, grads = reference_grads(model, batch, alpha)
        if exp is not None and abs(loss.item() - exp["loss"]) > 1e-5 * abs(exp["loss"]):
            print(f"warning: {name}: live loss {loss.item()} != committed {exp['loss']}")
        out = os.path.join(work, name + ".grads.safetensors")
        tl, tg, err = run_trex(args.trex, os.path.join(d, "model"), os.path.join(d, "batch.json"), alpha, out)
        if err is not None:
            rows.append((name, "trex", "-", "-", math.inf, False))
            print(f"{name}: trex failed: {err}")
            failed.append(name)
            continue
        if not compare(name, loss.item(), grads, tl, tg, rows):
            failed.append(name)
    w = max([len(r[1]) for r in rows] + [10])
    print(f"{'case':<20} {'tensor':<{w}} {'ref':>12} {'trex':>12} {'rel err':>10}  ok")
    for c, k, a, b, e, good in rows:
        if args.verbose or not good or k in ("loss", "trex"):
            print(f"{c:<20} {k:<{w}} {a:>12} {b:>12} {e:>10.2e}  {'ok' if good else 'FAIL'}")
    for name in sorted({r[0] for r in rows}):
        rs = [r for r in rows if r[0] == name and r[1] not in ("loss", "trex")]
        if rs:
            print(f"{name}: {len(rs)} gradients, max rel err {max(r[4] for r in rs):.2e}")
    print(f"{len(jobs) - len(failed)}/{len(jobs)} cases passed" + (f"; failed: {failed}" if failed else ""))
    if failed:
        print(f"(inputs kept in {work})")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DATA, help="dump folder (default tests/reference/data)")
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--check", action="store_true", help="compare live transformers with `trex grad`")
    ap.add_argument("--trex", default="build/trex", help="trex binary for --check")
    ap.add_argument("--random", type=int, default=0, help="--check: number of extra random configs")
    ap.add_argument("--seed", type=int, default=12345, help="--check: seed of the random configs")
    ap.add_argument("--verbose", action="store_true", help="--check: print every gradient row")
    args = ap.parse_args()
    if args.check:
        sys.exit(check(args))
    for name in args.cases:
        write_case(name, CASES[name], args.out)


if __name__ == "__main__":
    main()
