#!/usr/bin/env python3
"""Independent PyTorch reference for trex DeepSeek-V4 parity (see tests/reference/README.md,
"DeepSeek-V4 cases").

Builds tiny DeepseekV4ForCausalLM models with Hugging Face transformers (random init, fixed seed,
fp32, eager attention, eager expert loop) and writes per case tests/reference/data/v4_<name>/
{model/, batch.json, expected.safetensors, expected.json} in the format of the V3 cases
(make_dumps.py), plus the CSA indexer selections. Every case is also checked against an
independent float64 re-implementation of the V4 forward written from the README's semantics.
What the dump scripts share (AdamW loop, bf16 linears, writers, --check driver, CLI) is in
dumplib.py; the V4 seed search, dump format and float64 check are here.
transformers has no multi-token prediction (MTP); cases with num_nextn_predict_layers > 0 use
MTPBlock below, a port of DeepSeek's reference inference/model.py MTPBlock onto HF's classes.

  .venv/bin/python tests/reference/make_dumps_v4.py                      # regenerate the V4 dumps
  .venv/bin/python tests/reference/make_dumps_v4.py --check --trex build/trex --random 5

--check runs `trex grad [--mtp-loss-weight W]` and compares it with a float64 autograd run of the
same weights (Float64Mode), random configs with 0-3 MTP blocks included.
"""
import contextlib
import copy
import json
import math
import os
import shutil
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn
from torch.overrides import TorchFunctionMode
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as hf4

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dumplib  # noqa: E402
from dumplib import MARGIN_MIN  # noqa: E402  (router top-k gap and (relative) indexer top-k gap, 10 steps)

PRESCREEN = 3.0      # seeds whose first forward has a margin < PRESCREEN * MARGIN_MIN are not trained
SEED_TRIES = 4000
CSA, HCA, SWA = "compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"
# AdamW eps 1e-6 (V3: 1e-8): Adam's first step moves every element by lr * g / (|g| + eps), i.e. by
# +-lr for any |g| >> eps. Layer 0's attn_hc gets gradients that are analytically ~0 (its N input
# streams are identical copies of the embedding, so the comb mixing barely matters): their signs
# are fp32 noise, and with eps 1e-8 a 1e-7 relative change of the weights flipped router / indexer
# selections from step 1 on (v4_rates_default). With 1e-6 such elements move by ~1e-5 instead.
# v4_rates_odd keeps V3's 1e-8: its selections survive the same perturbation for all 10 steps.
TRAIN_DEFAULT = dict(dumplib.TRAIN_DEFAULT, bias_update_gamma=0.01, eps=1e-6)
NOISE_FACTOR = 10.0  # --check: trex may be this many times further from float64 than torch fp32 is (min 1e-4)
PERTURB = 1e-7       # robustness check: relative weight noise standing in for another fp32 engine

# --------------------------------------------------------------------------------------------
# Cases: "model" = DeepseekV4Config fields (rope_parameters = the YaRN block of the compress rope).
# --------------------------------------------------------------------------------------------
CASES = {
    "v4_rates_default": dict(
        # Searched from seed 4001: 567 screened, 120 trained, best 4508 (4 clean steps, 9 robust).
        seed=4508, accept_steps=4, B=2, T=300, router_gain=3.0, max_candidates=120, prescreen=1.0,
        model=dict(vocab_size=103, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                   head_dim=16, partial_rotary_factor=0.5, q_lora_rank=20, o_groups=2, o_lora_rank=10,
                   layer_types=[HCA, SWA, HCA, CSA], mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe"],
                   compress_rates={CSA: 4, HCA: 128}, index_n_heads=16, index_head_dim=12, index_topk=3,
                   sliding_window=11, hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6,
                   n_routed_experts=6, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=16,
                   scoring_func="sigmoid", routed_scaling_factor=1.5, swiglu_limit=2.0,
                   rope_theta=10000.0, compress_rope_theta=5000.0, max_position_embeddings=320,
                   rope_parameters=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=80,
                                        beta_fast=32, beta_slow=1)),
        train=dict(bias_update_gamma=0.01)),
    "v4_rates_odd": dict(
        # Searched from seed 5001: 1369 screened, 344 trained, 6369 is the first fully clean one.
        seed=6369, B=2, T=101, router_gain=4.0, max_candidates=600,
        model=dict(vocab_size=101, hidden_size=42, num_hidden_layers=4, num_attention_heads=6,
                   head_dim=20, partial_rotary_factor=0.3, q_lora_rank=21, o_groups=3, o_lora_rank=11,
                   layer_types=[HCA, CSA, SWA, CSA], mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe"],
                   compress_rates={CSA: 3, HCA: 23}, index_n_heads=13, index_head_dim=10, index_topk=3,
                   sliding_window=7, hc_mult=3, hc_sinkhorn_iters=7, hc_eps=1e-3, rms_norm_eps=1e-5,
                   n_routed_experts=7, num_experts_per_tok=3, n_shared_experts=1, moe_intermediate_size=19,
                   scoring_func="sqrtsoftplus", routed_scaling_factor=2.5, swiglu_limit=1.7,
                   rope_theta=30000.0, compress_rope_theta=3000.0, max_position_embeddings=291,
                   rope_parameters=dict(rope_type="yarn", factor=3.0, original_max_position_embeddings=97,
                                        beta_fast=13, beta_slow=1)),
        train=dict(bias_update_gamma=0.007, eps=1e-8)),
    "v4_mtp": dict(
        # Two MTP blocks (mtp.0, mtp.1) trained with weight 0.3 on top of 3 main layers. Searched from
        # seed 7001: the first seed is clean (10 steps, perturbation-robust), MTP routers included.
        seed=7001, B=2, T=83, router_gain=4.0, max_candidates=600,
        model=dict(vocab_size=97, hidden_size=38, num_hidden_layers=3, num_attention_heads=5,
                   head_dim=18, partial_rotary_factor=0.35, q_lora_rank=19, o_groups=5, o_lora_rank=7,
                   layer_types=[CSA, HCA, SWA], mlp_layer_types=["hash_moe", "moe", "moe"],
                   compress_rates={CSA: 5, HCA: 13}, index_n_heads=11, index_head_dim=8, index_topk=3,
                   sliding_window=9, hc_mult=3, hc_sinkhorn_iters=5, hc_eps=1e-3, rms_norm_eps=1e-5,
                   n_routed_experts=6, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=17,
                   scoring_func="sqrtsoftplus", routed_scaling_factor=2.0, swiglu_limit=1.9,
                   rope_theta=20000.0, compress_rope_theta=4000.0, max_position_embeddings=251,
                   num_nextn_predict_layers=2,
                   rope_parameters=dict(rope_type="yarn", factor=2.5, original_max_position_embeddings=83,
                                        beta_fast=11, beta_slow=1)),
        train=dict(bias_update_gamma=0.008, eps=1e-8, mtp_loss_weight=0.3)),
}


# --------------------------------------------------------------------------------------------
# Model construction and init.
# --------------------------------------------------------------------------------------------
def make_config(m):
    kw = dict(m)
    kw.setdefault("num_nextn_predict_layers", 0)
    kw.setdefault("tie_word_embeddings", False)
    cfg = DeepseekV4Config(**kw)
    r = int(cfg.head_dim * cfg.partial_rotary_factor)
    assert r == cfg.qk_rope_head_dim and r % 2 == 0 and r <= cfg.index_head_dim, (r, cfg.qk_rope_head_dim)
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    return cfg


def moe_gates(model):
    """[(name, router module, is_hash)] for every layer (all V4 layers are MoE), MTP blocks last."""
    return [(f"model.layers.{i}.mlp.gate", l.mlp.gate, l.mlp.is_hash) for i, l in enumerate(model.model.layers)] + \
        [(f"mtp.{k}.mlp.gate", b.mlp.gate, b.mlp.is_hash) for k, b in enumerate(mtp_blocks(model))]


def run_gates(model, w):
    """moe_gates of a run: the MTP blocks' only with MTP loss (w > 0)."""
    return [g for g in moe_gates(model) if w > 0 or not g[0].startswith("mtp.")]


def indexers(model):
    return [(f"model.layers.{i}.self_attn.compressor.indexer", l.self_attn.compressor.indexer)
            for i, l in enumerate(model.model.layers)
            if isinstance(l.self_attn.compressor, hf4.DeepseekV4CSACompressor)]


def init_model(cfg, seed, router_gain=2.0):
    """Not HF's init (which zeroes sinks / position_bias / hc base and sets scales to 1): matrices
    N(0, 1/fan_in) (router and compressor gate_proj x2), embedding N(0, 1), every 1-D weight and
    bias-like parameter random, tid2eid random distinct experts per token."""
    torch.manual_seed(seed)
    model = DeepseekV4ForCausalLM(cfg).float()
    attach_mtp(model)                    # after HF's init; mtp.* come last in named_parameters
    g = torch.Generator().manual_seed(seed)
    rn = lambda p: p.normal_(generator=g)
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if name.endswith("norm.weight"):
                rn(p).mul_(0.1).add_(1.0)
            elif leaf == "sinks":
                rn(p)
            elif leaf == "position_bias":
                rn(p).mul_(0.5)
            elif leaf in ("base", "hc_base"):
                rn(p).mul_(0.5)
            elif leaf in ("scale", "hc_scale"):
                rn(p).mul_(0.2).add_(1.0)
            elif "embed_tokens" in name:
                rn(p)
            else:
                assert p.ndim >= 2, name
                gain = router_gain if name.endswith("mlp.gate.weight") else \
                    2.0 if name.endswith(("compressor.gate_proj.weight", "indexer.gate_proj.weight")) else 1.0
                rn(p).mul_(gain / math.sqrt(p.shape[-1]))
        for _, gate, is_hash in moe_gates(model):
            if is_hash:
                E, K = gate.num_experts, gate.top_k
                gate.tid2eid.copy_(torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(cfg.vocab_size)]))
            else:
                rn(gate.e_score_correction_bias).mul_(0.05)
    return model


# --------------------------------------------------------------------------------------------
# MTP (multi-token prediction). transformers' DeepseekV4ForCausalLM has none: it drops mtp.* on
# load (_keys_to_ignore_on_load_unexpected). Port of DeepSeek's reference inference/model.py
# MTPBlock (a Block plus e_proj / h_proj / enorm / hnorm / norm and its own hc_head; embedding and
# LM head shared) on top of HF's classes. Depth k = 1..D, X_0 = the main streams entering
# model.model.hc_head, ids_k[t] = ids[t+k] (ids[t] past the row end):
#   X_k = e_proj(enorm(embed[ids_k])) (broadcast over streams) + h_proj(hnorm(X_{k-1}))
#   X_k = DeepseekV4DecoderLayer(X_k)       (layer_idx L+k-1: sliding_attention, top-k "moe")
#   logits_k = lm_head(norm(hc_head(X_k))), target of t = labels[t+k+1] (-100 past the end)
#   loss = CE + mtp_loss_weight * mean_k CE_k
# The blocks live in model.mtp (a ModuleList), so their state_dict names are trex's checkpoint
# names: "mtp.{k-1}." + the HF names of a decoder layer, e_proj.weight, ..., hc_head.hc_fn.
# --------------------------------------------------------------------------------------------
class MTPBlock(hf4.DeepseekV4DecoderLayer):
    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        d, eps = config.hidden_size, config.rms_norm_eps
        self.e_proj = nn.Linear(d, d, bias=False)
        self.h_proj = nn.Linear(d, d, bias=False)
        self.enorm = hf4.DeepseekV4RMSNorm(d, eps=eps)
        self.hnorm = hf4.DeepseekV4RMSNorm(d, eps=eps)
        self.norm = hf4.DeepseekV4RMSNorm(d, eps=eps)
        self.hc_head = hf4.DeepseekV4HyperHead(config)         # hc_fn [N, N d], hc_base [N], hc_scale [1]

    def forward(self, x_prev, emb, lm_head, **layer_kwargs):
        """x_prev: [B, T, N, d] streams of the level below; emb: [B, T, d] embedding of ids_k.
        Returns (X_k [B, T, N, d], logits_k [B, T, V])."""
        x = self.e_proj(self.enorm(emb)).unsqueeze(2) + self.h_proj(self.hnorm(x_prev))
        x = hf4.DeepseekV4DecoderLayer.forward(self, x, **layer_kwargs)
        return x, lm_head(self.norm(self.hc_head(x)))


def attach_mtp(model):
    """model.mtp = config.num_nextn_predict_layers MTPBlocks (none: no attribute). Each is built
    with a copy of the config whose layer lists are extended to its index L+k-1."""
    c = model.config
    D, L = c.num_nextn_predict_layers, c.num_hidden_layers
    if D == 0:
        return
    ext = copy.deepcopy(c)
    ext.num_hidden_layers = L + D
    ext.layer_types = list(c.layer_types) + [SWA] * D
    ext.mlp_layer_types = list(c.mlp_layer_types) + ["moe"] * D
    model.mtp = nn.ModuleList([MTPBlock(ext, L + k) for k in range(D)]).float()


def mtp_blocks(model):
    return list(model.mtp) if hasattr(model, "mtp") else []


def forward_all(model, batch, w):
    """Main forward (HF) + the MTP depths when w > 0. Returns dict(loss, ce, mtp (mean over depths,
    unweighted; None without MTP), mtp_losses [D], logits [B, T, V], mtp_logits [D x [B, T, V]])."""
    ids, labels = batch["ids"], batch["labels"]
    blocks = mtp_blocks(model) if w > 0 else []
    assert w == 0 or blocks, "mtp_loss_weight > 0 needs num_nextn_predict_layers > 0"
    # the main layers' kwargs (rope tables, positions, sliding mask, ids) and X_0 (entering hc_head)
    with dumplib.capture_inputs(model, model.model.hc_head, enabled=bool(blocks)) as cap:
        out = model(input_ids=ids, labels=labels, use_cache=False)
    V = out.logits.shape[-1]
    dumplib.check_ce(out.loss, out.logits, labels)
    res = dict(ce=out.loss, logits=out.logits, mtp=None, mtp_losses=[], mtp_logits=[], loss=out.loss)
    x = cap.get("x")
    for k, blk in enumerate(blocks, 1):
        ids_k, tg = dumplib.mtp_shift(ids, labels, k)
        assert bool((tg != -100).any()), "an MTP depth without a valid target"
        x, lg = blk(x, model.model.embed_tokens(ids_k), model.lm_head, **cap["kw"])
        res["mtp_losses"].append(F.cross_entropy(lg.reshape(-1, V).float(), tg.reshape(-1), ignore_index=-100))
        res["mtp_logits"].append(lg)
    if blocks:
        res["mtp"] = torch.stack(res["mtp_losses"]).mean()
        res["loss"] = out.loss + w * res["mtp"]
    return res


# --------------------------------------------------------------------------------------------
# Recording (forward hooks; HF code untouched): router selections + margins, indexer selections
# + margins.
# --------------------------------------------------------------------------------------------
class Recorder:
    def __init__(self, model):
        self.gates, self.index, self.handles = {}, {}, []
        for name, gate, is_hash in moe_gates(model):
            self.handles.append(gate.register_forward_hook(
                lambda mod, inp, out, name=name, is_hash=is_hash: self._gate(name, mod, out, is_hash)))
        for name, ix in indexers(model):
            self.handles.append(ix.scorer.register_forward_hook(
                lambda mod, inp, out, name=name: self.index.setdefault(name, {}).update(scores=out.detach())))
            self.handles.append(ix.register_forward_hook(
                lambda mod, inp, out, name=name, ix=ix: self._index(name, ix, out)))

    def _gate(self, name, mod, out, is_hash):
        logits, _, idx = out
        rec = dict(idx=idx.detach().clone(), margin=math.inf)
        if not is_hash and mod.top_k < mod.num_experts:
            with torch.no_grad():
                s = (mod.score_fn(logits.float()) + mod.e_score_correction_bias).sort(-1, descending=True)[0]
                rec["margin"] = (s[:, mod.top_k - 1] - s[:, mod.top_k]).min().item()
        self.gates[name] = rec

    def _index(self, name, ix, out):
        rec = self.index[name]
        scores = rec["scores"].float()                                     # [B, S, n]
        B, S, n = scores.shape
        k, m = ix.index_topk, ix.compress_rate
        thr = ((torch.arange(S) + 1) // m).clamp(max=n)                    # valid entries per query
        valid = torch.arange(n).view(1, -1) < thr.view(-1, 1)             # [S, n]
        gap, rel = math.inf, math.inf
        rows = (thr > k).view(1, -1).expand(B, -1)                         # selections that can differ
        if rows.any() and k < n:
            srt = scores.masked_fill(~valid, -math.inf).sort(-1, descending=True)[0]
            g = srt[..., k - 1] - srt[..., k]                              # [B, S]
            scale = scores.masked_fill(~valid, 0).abs().amax(-1)           # per-query score scale
            gap = g[rows].min().item()
            rel = (g / scale.clamp_min(1e-30))[rows].min().item()
        top = out.detach().long()                                          # [B, S, min(k, n)], -1 = invalid
        # The selected set must be exactly the top-min(k, valid) valid entries.
        assert bool(((top < thr.view(1, -1, 1)) | (top == -1)).all())
        assert bool(((top >= 0).sum(-1) == thr.clamp(max=k).view(1, -1)).all()), name
        key = torch.where(top < 0, torch.full_like(top, 1 << 30), top).sort(-1)[0]
        key = torch.where(key == 1 << 30, torch.full_like(key, -1), key)
        padded = torch.full((B, S, k), -1, dtype=torch.long)
        padded[..., :key.shape[-1]] = key
        rec.update(topk=padded.view(B * S, k), gap=gap, margin=rel)

    def remove(self):
        for h in self.handles:
            h.remove()


def snapshot(rec):
    return dict(gates={k: dict(v) for k, v in rec.gates.items()},
                index={k: {a: b for a, b in v.items() if a != "scores"} for k, v in rec.index.items()})


# --------------------------------------------------------------------------------------------
# bf16 yardsticks (not parity targets; see README). "bf16_weights": every linear except the
# routers and the hyper-connection fns (attn_hc.fn, ffn_hc.fn, hc_head.hc_fn) reads bf16-rounded
# x and W with f32 accumulation (o_a_proj too, done per group); the LM head does not round dy.
# "bf16_autocast": torch.autocast(bfloat16) with the routers kept fp32.
# --------------------------------------------------------------------------------------------
def grouped_linear_per_group(self, x):                    # x: [..., G, in_g] -> [..., G, out_g]
    w = self.weight.view(self.n_groups, -1, x.shape[-1])
    return torch.stack([F.linear(x[..., g, :], w[g]) for g in range(self.n_groups)], dim=-2)


def bf16_linears(model):
    layers = list(model.model.layers) + mtp_blocks(model)
    fp32 = {id(g.weight) for _, g, _ in moe_gates(model)}
    fp32 |= {id(l.attn_hc.fn) for l in layers} | {id(l.ffn_hc.fn) for l in layers}
    fp32 |= {id(model.model.hc_head.hc_fn)} | {id(b.hc_head.hc_fn) for b in mtp_blocks(model)}
    return dumplib.Bf16Linears(fp32, heads={id(model.lm_head.weight)})


@contextlib.contextmanager
def bf16_weights(model):
    saved = hf4.DeepseekV4GroupedLinear.forward
    hf4.DeepseekV4GroupedLinear.forward = grouped_linear_per_group
    try:
        with bf16_linears(model) as mode:
            yield mode
    finally:
        hf4.DeepseekV4GroupedLinear.forward = saved


def fp32_router(forward):
    def wrapped(self, hidden_states, *a):
        with torch.autocast("cpu", enabled=False):
            return forward(self, hidden_states.float(), *a)
    return wrapped


@contextlib.contextmanager
def bf16_autocast(model):
    saved = hf4.DeepseekV4TopKRouter.forward, hf4.DeepseekV4HashRouter.forward
    hf4.DeepseekV4TopKRouter.forward, hf4.DeepseekV4HashRouter.forward = map(fp32_router, saved)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            yield None
    finally:
        hf4.DeepseekV4TopKRouter.forward, hf4.DeepseekV4HashRouter.forward = saved


def precision_context(model, prec):
    return {"fp32": contextlib.nullcontext, "bf16_weights": lambda: bf16_weights(model),
            "bf16_autocast": lambda: bf16_autocast(model)}[prec]


# --------------------------------------------------------------------------------------------
# Independent float64 forward, written from the README "Semantics" list (not from HF's classes).
# --------------------------------------------------------------------------------------------
def rope_tables(c):
    """inv_freq (fp32, as HF computes it) for "main" (default RoPE) and "compress" (YaRN or default)."""
    r = int(c.head_dim * c.partial_rotary_factor)
    out = {}
    for kind in ("main", "compress"):
        rp = c.rope_parameters[kind]
        theta = rp["rope_theta"]
        inv0 = 1.0 / theta ** (torch.arange(0, r, 2, dtype=torch.float32) / r)
        if rp["rope_type"] == "yarn":
            f, orig = rp["factor"], rp["original_max_position_embeddings"]
            cd = lambda rot: r * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(theta))
            low = max(math.floor(cd(rp.get("beta_fast") or 32)), 0)
            high = min(math.ceil(cd(rp.get("beta_slow") or 1)), r - 1)
            high = high + 0.001 if low == high else high
            ramp = ((torch.arange(r // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
            inv = inv0 / f * ramp + inv0 * (1 - ramp)
            out[kind] = (inv, rp.get("attention_factor", 1.0), ramp)
        else:
            out[kind] = (inv0, 1.0, None)
    return out


def rope64(x, pos, table, sign=1.0):
    """Rotate the LAST r channels of x [..., T, (H,) D] in adjacent pairs (2j, 2j+1) at positions pos [T]."""
    inv, att, _ = table
    r = 2 * inv.numel()
    ang = (pos.float()[:, None] * inv[None, :]).double()                  # fp32 angle like HF
    c, s = ang.cos() * att, ang.sin() * att * sign                        # [T, r/2]
    while c.ndim < x.ndim:
        c, s = c.unsqueeze(-2), s.unsqueeze(-2)
    a, b = x[..., -r:][..., 0::2], x[..., -r:][..., 1::2]
    rot = torch.stack([a * c - b * s, b * c + a * s], dim=-1).flatten(-2)
    return torch.cat([x[..., :-r], rot], dim=-1)


def independent_forward(model, ids, mtp_depth=0):
    """Returns logits [B, T, V] (float64), MTP logits [mtp_depth x [B, T, V]], routes {gate: [B*T, K]},
    index {indexer: [B*T, k]}, clamp fractions."""
    c = model.config
    P = {k: (v.detach().double() if v.is_floating_point() else v) for k, v in model.state_dict().items()}
    B, T = ids.shape
    eps, hce, N, H, hd = c.rms_norm_eps, c.hc_eps, c.hc_mult, c.num_attention_heads, c.head_dim
    tabs = rope_tables(c)
    pos = torch.arange(T)
    act = {"sigmoid": torch.sigmoid, "sqrtsoftplus": lambda z: F.softplus(z).sqrt()}[c.scoring_func]
    L = c.swiglu_limit
    clamp_stats = dict(routed=[0, 0], shared=[0, 0])

    def rms(x, w=None, e=eps):
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + e)
        return y if w is None else w * y

    def swiglu(x, wg, wu, wd, kind):
        g, u = x @ wg.T, x @ wu.T
        clamp_stats[kind][0] += int((g > L).sum() + (u.abs() > L).sum())
        clamp_stats[kind][1] += g.numel() + u.numel()
        return (F.silu(g.clamp(max=L)) * u.clamp(-L, L)) @ wd.T

    def hc_pre(h, p):                                                      # h: [T, N, d]
        fn, base, scale = (P[p + s] for s in ("fn", "base", "scale"))
        mix = rms(h.reshape(T, -1)) @ fn.T
        pre = torch.sigmoid(mix[:, :N] * scale[0] + base[:N]) + hce
        post = 2 * torch.sigmoid(mix[:, N:2 * N] * scale[1] + base[N:2 * N])
        comb = torch.softmax(mix[:, 2 * N:].view(T, N, N) * scale[2] + base[2 * N:].view(N, N), -1) + hce
        comb = comb / (comb.sum(-2, keepdim=True) + hce)
        for _ in range(c.hc_sinkhorn_iters - 1):
            comb = comb / (comb.sum(-1, keepdim=True) + hce)
            comb = comb / (comb.sum(-2, keepdim=True) + hce)
        return post, comb, (pre.unsqueeze(-1) * h).sum(1)

    def compress(x, p, dim, m, overlap):
        """Compressed entries [n, dim] (rope'd) of one sequence x [T, d]."""
        n = T // m
        kv = (x[:n * m] @ P[p + "kv_proj.weight"].T).view(n, m, -1)
        gt = (x[:n * m] @ P[p + "gate_proj.weight"].T).view(n, m, -1)
        gt = gt + P[p + "position_bias"]
        if overlap:    # entry w: [Ca (first dim ch.) of window w-1 | Cb (last dim ch.) of window w], 2m slots
            kv2 = torch.cat([torch.zeros(1, m, dim, dtype=kv.dtype), kv[:-1, :, :dim]], 0)
            gt2 = torch.cat([torch.full((1, m, dim), -math.inf, dtype=gt.dtype), gt[:-1, :, :dim]], 0)
            kv, gt = torch.cat([kv2, kv[..., dim:]], 1), torch.cat([gt2, gt[..., dim:]], 1)
        e = rms((kv * torch.softmax(gt, 1)).sum(1), P[p + "kv_norm.weight"])
        return rope64(e, torch.arange(n) * m, tabs["compress"])

    routes, index = {}, {}

    def layer(hb, b, p, lt, mt):                                           # hb: [T, N, d] -> [T, N, d]
        a = p + "self_attn."
        tab = tabs["main" if lt == SWA else "compress"]
        post, comb, x = hc_pre(hb, p + "attn_hc.")
        x = rms(x, P[p + "input_layernorm.weight"])
        qr = rms(x @ P[a + "q_a_proj.weight"].T, P[a + "q_a_norm.weight"])
        q = rope64(rms((qr @ P[a + "q_b_proj.weight"].T).view(T, H, hd)), pos, tab)      # [T, H, hd]
        kv = rope64(rms(x @ P[a + "kv_proj.weight"].T, P[a + "kv_norm.weight"]), pos, tab)  # [T, hd]
        t_, s_ = pos.view(-1, 1), pos.view(1, -1)
        allow = (s_ <= t_) & (s_ > t_ - c.sliding_window)                 # [T, T]
        keys = kv
        if lt != SWA:
            m = c.compress_rates[lt]
            ent = compress(x, a + "compressor.", hd, m, lt == CSA)         # [n, hd]
            n = ent.shape[0]
            vis = torch.arange(n).view(1, -1) < ((pos + 1) // m).view(-1, 1)   # [T, n]
            if lt == CSA:
                ip = a + "compressor.indexer."
                ik = compress(x, ip, c.index_head_dim, m, True)             # [n, ihd]
                iq = rope64((qr @ P[ip + "q_b_proj.weight"].T).view(T, -1, c.index_head_dim), pos, tabs["compress"])
                w = (x @ P[ip + "scorer.weights_proj.weight"].T) * c.index_n_heads ** -0.5     # [T, IH]
                sc = torch.relu(torch.einsum("thd,nd->thn", iq, ik)) * c.index_head_dim ** -0.5
                sc = (sc * w.unsqueeze(-1)).sum(1)                          # [T, n]
                sc = sc.masked_fill(~vis, -math.inf)
                k = min(c.index_topk, n)
                top = sc.topk(k, -1).indices
                sel = torch.zeros(T, n, dtype=torch.bool).scatter_(1, top, True) & vis
                srt = torch.where(sel, torch.arange(n).expand(T, n), torch.full((T, n), 1 << 30))
                srt = srt.sort(-1)[0][:, :c.index_topk]
                srt = torch.cat([srt, torch.full((T, max(0, c.index_topk - n)), 1 << 30)], 1)
                index.setdefault(ip[:-1], []).append(torch.where(srt == 1 << 30, -1, srt))
                vis = sel
            keys = torch.cat([kv, ent], 0)
            allow = torch.cat([allow, vis], 1)
        lg = torch.einsum("thd,sd->hts", q, keys) * hd ** -0.5
        lg = lg.masked_fill(~allow.unsqueeze(0), -math.inf)
        sink = P[a + "sinks"].view(H, 1, 1).expand(H, T, 1)
        pr = torch.softmax(torch.cat([lg, sink], -1), -1)[..., :-1]
        o = rope64(torch.einsum("hts,sd->thd", pr, keys), pos, tab, sign=-1.0)       # inverse rope
        G = c.o_groups
        wa = P[a + "o_a_proj.weight"].view(G, c.o_lora_rank, -1)
        o = torch.einsum("tgi,goi->tgo", o.reshape(T, G, -1), wa).reshape(T, -1) @ P[a + "o_b_proj.weight"].T
        hb = post.unsqueeze(-1) * o.unsqueeze(1) + torch.einsum("tjn,tjd->tnd", comb, hb)
        # MoE
        post, comb, x = hc_pre(hb, p + "ffn_hc.")
        x = rms(x, P[p + "post_attention_layernorm.weight"])
        gp = p + "mlp.gate."
        s = act(x @ P[gp + "weight"].T)                                     # [T, E]
        if mt == "hash_moe":
            idx = P[gp + "tid2eid"][ids[b]]
        else:
            idx = (s + P[gp + "e_score_correction_bias"]).topk(c.num_experts_per_tok, -1).indices
        routes.setdefault(gp[:-1], []).append(idx.sort(-1)[0])
        wt = s.gather(1, idx)
        wt = wt / (wt.sum(-1, keepdim=True) + 1e-20) * c.routed_scaling_factor
        F_ = c.moe_intermediate_size
        y = swiglu(x, *(P[p + f"mlp.shared_experts.{n}_proj.weight"] for n in ("gate", "up", "down")), "shared")
        for t in range(T):
            for j in range(idx.shape[1]):
                e = int(idx[t, j])
                gu = P[p + "mlp.experts.gate_up_proj"][e]
                down = P[p + "mlp.experts.down_proj"][e]
                y[t] += wt[t, j] * swiglu(x[t:t + 1], gu[:F_], gu[F_:], down, "routed")[0]
        hb = post.unsqueeze(-1) * y.unsqueeze(1) + torch.einsum("tjn,tjd->tnd", comb, hb)
        return hb

    def head(hb, hp, norm):                                                # HC head + final norm -> [T, d]
        mix = rms(hb.reshape(T, -1)) @ P[hp + "hc_fn"].T
        pre = torch.sigmoid(mix * P[hp + "hc_scale"] + P[hp + "hc_base"]) + hce
        return rms((pre.unsqueeze(-1) * hb).sum(1), P[norm])

    h = P["model.embed_tokens.weight"][ids]                                # [B, T, d]
    hs = h.unsqueeze(2).expand(-1, -1, N, -1)
    out_h, mtp_h = [], [[] for _ in range(mtp_depth)]
    for b in range(B):
        hb = hs[b]
        for i, lt in enumerate(c.layer_types):
            hb = layer(hb, b, f"model.layers.{i}.", lt, c.mlp_layer_types[i])
        out_h.append(head(hb, "model.hc_head.", "model.norm.weight"))
        for k in range(1, mtp_depth + 1):                                   # MTP (README, "MTP reference")
            p = f"mtp.{k - 1}."
            idk = torch.where(pos + k < T, ids[b][(pos + k).clamp(max=T - 1)], ids[b])
            e = rms(P["model.embed_tokens.weight"][idk], P[p + "enorm.weight"]) @ P[p + "e_proj.weight"].T
            hb = e.unsqueeze(1) + rms(hb, P[p + "hnorm.weight"]) @ P[p + "h_proj.weight"].T
            hb = layer(hb, b, p, SWA, "moe")
            mtp_h[k - 1].append(head(hb, p + "hc_head.", p + "norm.weight"))
    logits = torch.stack(out_h) @ P["lm_head.weight"].T
    mtp_logits = [torch.stack(m) @ P["lm_head.weight"].T for m in mtp_h]
    cat = lambda d: {k: torch.cat(v) for k, v in d.items()}
    return logits, mtp_logits, cat(routes), cat(index), {k: v[0] / v[1] for k, v in clamp_stats.items()}


def check_independent(model, batch, rec, w):
    """HF fp32 (+ MTPBlock) vs the float64 re-implementation: logits (main and every MTP depth),
    router and indexer selections. Returns the worst relative logits error and clamp fractions."""
    with torch.no_grad():
        res = forward_all(model, batch, w)
        mine, mine_mtp, routes, index, clamp = independent_forward(model, batch["ids"], len(res["mtp_logits"]))
    err = max(((a.double() - b).norm() / b.norm()).item()
              for a, b in zip([res["logits"]] + res["mtp_logits"], [mine] + mine_mtp))
    assert err < 1e-5, f"independent forward differs from HF: rel {err:.2e}"
    assert set(rec.gates) == set(routes), (set(rec.gates), set(routes))
    for name, r in rec.gates.items():
        assert torch.equal(r["idx"].sort(-1)[0], routes[name]), name
    for name, r in rec.index.items():
        assert torch.equal(r["topk"], index[name]), name
    return err, clamp


# --------------------------------------------------------------------------------------------
# Checkpoint I/O: config.json as save_pretrained writes it, model.safetensors with the in-memory
# state_dict names (buffers e_score_correction_bias f32 and tid2eid int64 included).
# --------------------------------------------------------------------------------------------
def write_model(model, d):
    mtp = model._modules.pop("mtp", None)          # save_pretrained only writes config.json here
    try:
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp)
            cj = json.load(open(os.path.join(tmp, "config.json")))
    finally:
        if mtp is not None:
            model.mtp = mtp
    assert cj["num_nextn_predict_layers"] == len(mtp_blocks(model)), cj["num_nextn_predict_layers"]
    dumplib.write_checkpoint(d, cj, {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()})


def load_model(d):
    """from_pretrained (which drops mtp.*), then the MTP blocks from the mtp.* tensors, if any."""
    model = dumplib.from_pretrained(DeepseekV4ForCausalLM, d)
    sd = {k[len("mtp."):]: v for k, v in load_file(os.path.join(d, "model.safetensors")).items()
          if k.startswith("mtp.")}
    if sd:
        attach_mtp(model)
        model.mtp.load_state_dict(sd, strict=True)
    return model


def verify_checkpoint(model, d, batch, w):
    """Reload (load_model): same state_dict, same config, bit-identical logits and loss."""
    re = load_model(d)
    a_sd, b_sd = model.state_dict(), re.state_dict()
    assert set(a_sd) == set(b_sd), set(a_sd) ^ set(b_sd)
    for k in a_sd:
        assert a_sd[k].dtype == b_sd[k].dtype and torch.equal(a_sd[k], b_sd[k]), k
    assert re.config.rope_parameters == model.config.rope_parameters
    assert re.config.layer_types == model.config.layer_types
    assert re.config.mlp_layer_types == model.config.mlp_layer_types
    with torch.no_grad():
        a, b = forward_all(model, batch, w), forward_all(re, batch, w)
    assert torch.equal(a["logits"], b["logits"]) and torch.equal(a["loss"], b["loss"]), (a["loss"], b["loss"])
    assert all(torch.equal(x, y) for x, y in zip(a["mtp_logits"], b["mtp_logits"]))
    return b["loss"].item()


# --------------------------------------------------------------------------------------------
# Loss, gradients, training.
# --------------------------------------------------------------------------------------------
def trained_params(model, w):
    """(name, parameter) of the run: without MTP loss (w = 0) the mtp.* blocks are not part of it."""
    return [(n, p) for n, p in model.named_parameters() if w > 0 or not n.startswith("mtp.")]


def reference_grads(model, batch, w):
    """One forward + backward: (forward_all dict (detached), router / indexer snapshot, grads, no-grad names)."""
    model.train()
    model.zero_grad(set_to_none=True)
    rec = Recorder(model)
    res = forward_all(model, batch, w)
    res["loss"].backward()
    snap = snapshot(rec)
    rec.remove()
    params = trained_params(model, w)
    grads = {n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().clone() for n, p in params}
    no_grad = sorted(n for n, p in params if p.grad is None)
    res = {k: ([x.detach() for x in v] if isinstance(v, list) else v if v is None else v.detach())
           for k, v in res.items()}
    return res, snap, grads, no_grad


def train(model, batch, tr, prec="fp32"):
    w = tr.get("mtp_loss_weight", 0.0)
    params = [p for _, p in trained_params(model, w)]
    rec = Recorder(model)
    ctx = precision_context(model, prec)
    loads, step_margins, routes0, sels, st = [], [], None, [], dict(igap=math.inf, snap=None)

    def forward():
        nonlocal routes0
        with ctx() as mode:
            loss = forward_all(model, batch, w)["loss"]
        if isinstance(mode, dumplib.Bf16Linears):
            D = len(mtp_blocks(model)) if w > 0 else 0
            assert mode.calls["fp32"] == 3 * (len(model.model.layers) + D) + 1 + D and mode.calls["bf16"] > 0, \
                mode.calls
        snap = st["snap"] = snapshot(rec)
        routes0 = routes0 or {n: r["idx"].clone() for n, r in snap["gates"].items()}
        sels.append([r["idx"].sort(-1)[0] for r in snap["gates"].values()] +
                    [r["topk"] for r in snap["index"].values()])
        return loss

    def after_step():
        snap, step_loads = st["snap"], {}
        step_margins.append([min([r["margin"] for r in snap[k].values()] + [math.inf]) for k in ("gates", "index")])
        for name, gate, is_hash in run_gates(model, w):
            r = snap["gates"][name]
            load = torch.bincount(r["idx"].flatten(), minlength=gate.num_experts).float()
            step_loads[name] = [int(x) for x in load.tolist()]
            if not is_hash:
                dumplib.update_bias(gate, load, tr["bias_update_gamma"])
        st["igap"] = min([st["igap"]] + [r["gap"] for r in snap["index"].values()])
        loads.append(step_loads)

    losses, norms = dumplib.adamw_steps(params, tr, forward, after_step)
    rec.remove()
    final_bias = {f"{n}.e_score_correction_bias": g.e_score_correction_bias.tolist()
                  for n, g, is_hash in run_gates(model, w) if not is_hash}
    clean = next((i for i, m in enumerate(step_margins) if min(m) < MARGIN_MIN), len(step_margins))
    return dict(losses=losses, grad_norms=norms, loads=loads, final_bias=final_bias, step_margins=step_margins,
                router_margin=min(m[0] for m in step_margins), indexer_margin=min(m[1] for m in step_margins),
                indexer_gap=st["igap"], clean_steps=clean, routes0=routes0, selections=sels)


def perturbed_robust_steps(spec, seed, batch, tr, base, draws=2):
    """Leading steps whose router and indexer selections stay identical when every initial weight is
    multiplied by (1 + PERTURB N(0, 1)) (a stand-in for a different fp32 implementation)."""
    robust = tr["steps"]
    for draw in range(1, draws + 1):
        model, _ = build_case(spec, seed)
        g = torch.Generator().manual_seed(draw)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1 + PERTURB * torch.randn(p.shape, generator=g))
        sel = train(model, batch, tr)["selections"]
        same = [all(torch.equal(a, b) for a, b in zip(x, y)) for x, y in zip(base["selections"], sel)]
        robust = min(robust, same.index(False) if False in same else len(same))
    return robust


# --------------------------------------------------------------------------------------------
# Dump generation.
# --------------------------------------------------------------------------------------------
def build_case(spec, seed):
    cfg = make_config(spec["model"])
    model = init_model(cfg, seed, spec.get("router_gain", 2.0))
    return model, dumplib.make_batch(cfg.vocab_size, spec["B"], spec["T"], seed)


def write_case(name, spec, out_root):
    t0 = time.time()
    tr = dict(TRAIN_DEFAULT, **spec.get("train", {}))
    w = tr.get("mtp_loss_weight", 0.0)
    # Seed search: the first forward (loss, gradients, dumped selections) must have every router and
    # indexer margin >= MARGIN_MIN; among those seeds take the first whose 10 training steps all do
    # and whose selections survive PERTURB (or accept_steps of them), else (after max_candidates
    # trained seeds) the one with the longest such leading run of steps ("parity_steps").
    best, screened, candidates = None, 0, 0
    for seed in range(spec["seed"], spec["seed"] + SEED_TRIES):
        model, batch = build_case(spec, seed)
        screened += 1
        if first_forward_margins(model, batch, w) < spec.get("prescreen", PRESCREEN) * MARGIN_MIN:  # one forward
            continue
        candidates += 1
        trained = train(model, batch, tr)
        if trained["clean_steps"] > (best[0][0] if best else 0):    # a new best: check it under perturbation
            trained["robust_steps"] = perturbed_robust_steps(spec, seed, batch, tr, trained)
            key = (min(trained["clean_steps"], trained["robust_steps"]),
                   min(trained["router_margin"], trained["indexer_margin"]))
            if best is None or key > best[0]:
                best = (key, seed, trained)
            if key[0] >= spec.get("accept_steps", tr["steps"]):
                break
        if candidates >= spec.get("max_candidates", 400):
            break
    if best is None:
        raise RuntimeError(f"{name}: no seed in {SEED_TRIES} with first-forward margins >= {MARGIN_MIN}")
    _, seed, trained = best
    print(f"  {name}: screened {screened} seeds, trained {candidates}; seed {seed}: {trained['clean_steps']} "
          f"clean steps, {trained['robust_steps']} perturbation-robust steps, step margins (router, indexer) "
          f"{[['%.1e' % x for x in m] for m in trained['step_margins']]}")
    model, batch = build_case(spec, seed)
    res, snap, grads, no_grad = reference_grads(model, batch, w)
    loss, ce = res["loss"], res["ce"]
    assert loss.item() == trained["losses"][0], (loss.item(), trained["losses"][0])
    rec = Recorder(model)
    ind_err, clamp = check_independent(model, batch, rec, w)
    rec.remove()
    yard = {p: train(build_case(spec, seed)[0], batch, tr, p) for p in dumplib.YARDSTICKS}
    flips = {p: {n: dumplib.route_flips(snap["gates"][n]["idx"], y["routes0"][n]) for n in snap["gates"]}
             for p, y in yard.items()}
    d = os.path.join(out_root, name)
    shutil.rmtree(d, ignore_errors=True)
    write_model(model, os.path.join(d, "model"))
    reload_loss = verify_checkpoint(model, os.path.join(d, "model"), batch, w)
    dumplib.write_batch(batch, os.path.join(d, "batch.json"))
    z = torch.zeros(1, dtype=torch.float64)
    t = {"loss": loss.double().reshape(1), "ce_loss": ce.double().reshape(1), "aux_loss": z,
         "logits": res["logits"].float().contiguous()}
    mtp = {}
    if res["mtp"] is not None:      # loss = ce_loss + mtp_loss_weight * mtp_loss (mean over depths)
        t["mtp_loss"] = res["mtp"].double().reshape(1)
        t["mtp_losses"] = torch.stack(res["mtp_losses"]).double()
        t["mtp_logits"] = torch.stack(res["mtp_logits"]).float().contiguous()
        mtp = {"mtp_loss": res["mtp"].item(), "mtp_losses": [x.item() for x in res["mtp_losses"]]}
    for rname, r in snap["gates"].items():
        t[f"route.{rname}.topk_indices"] = r["idx"].sort(dim=-1)[0].to(torch.int32).contiguous()
    for iname, r in snap["index"].items():
        t[f"index.{iname}.topk"] = r["topk"].to(torch.int32).contiguous()
    t.update({f"grad.{k}": v.float().contiguous() for k, v in grads.items()})
    c = model.config
    exp = {"case": name, "seed": seed, "loss": loss.item(), "ce_loss": ce.item(), "aux_loss": 0.0, **mtp,
           "train": dict(tr, aux_loss_alpha=0.0), "losses": trained["losses"], "grad_norms": trained["grad_norms"],
           "final_bias": trained["final_bias"], "loads": trained["loads"],
           "routing_min_margin": trained["router_margin"], "margin_required": MARGIN_MIN,
           "margin_clean_steps": trained["clean_steps"], "step_min_margins": trained["step_margins"],
           "perturbation_robust_steps": trained["robust_steps"], "parity_steps": best[0][0],
           "seeds_screened": screened, "seeds_trained": candidates,
           "indexer_min_margin": trained["indexer_margin"], "indexer_min_gap": trained["indexer_gap"],
           "indexer_step0": {n: dict(gap=r["gap"], margin=r["margin"]) for n, r in snap["index"].items()},
           "params_without_grad": no_grad,
           "clamp_fraction_step0": clamp, "independent_forward_rel_err": ind_err,
           "compress_yarn_ramp": rope_tables(c)["compress"][2].tolist(),
           "losses_bf16_autocast": yard["bf16_autocast"]["losses"],
           "losses_bf16_weights": yard["bf16_weights"]["losses"],
           "route_flips_bf16": flips["bf16_weights"],
           "versions": dumplib.versions()}
    size = dumplib.write_expected(d, t, exp)
    print(f"{name}: seed {seed} params {sum(p.numel() for p in model.parameters())} loss {loss.item():.6f} "
          f"(reload {reload_loss:.6f}) losses {trained['losses'][0]:.4f}->{trained['losses'][-1]:.4f} "
          f"router margin {trained['router_margin']:.2e} indexer margin {trained['indexer_margin']:.2e} "
          f"(gap {trained['indexer_gap']:.2e}) clamp {clamp} independent rel err {ind_err:.1e} "
          f"size {size / 1e3:.0f} kB time {time.time() - t0:.1f} s")
    dumplib.print_yardsticks(yard, trained["losses"], flips)


# --------------------------------------------------------------------------------------------
# --check: live reference vs `trex grad [--mtp-loss-weight W]`.
# --------------------------------------------------------------------------------------------
def random_spec(rng):
    ri, rc = dumplib.drawers(rng)
    L = ri(1, 4)
    m_csa, m_hca = ri(2, 5), ri(6, 19)
    T = ri(2 * m_hca + 1, 3 * m_hca + 7)
    H = rc([1, 2, 3, 4, 6])
    G = rc([g for g in (1, 2, 3) if H % g == 0])
    r = 2 * ri(1, 4)
    hd = r + 2 * ri(1, 6)
    E = ri(3, 8)
    nh = ri(0, min(2, L))
    prf = r / hd if int(hd * (r / hd)) == r else (r + 0.25) / hd        # HF: r = int(hd * factor)
    model = dict(vocab_size=ri(31, 131), hidden_size=ri(17, 47), num_hidden_layers=L, num_attention_heads=H,
                 head_dim=hd, partial_rotary_factor=prf, q_lora_rank=ri(9, 25), o_groups=G, o_lora_rank=ri(5, 13),
                 layer_types=[rc([CSA, HCA, SWA]) for _ in range(L)],
                 mlp_layer_types=["hash_moe"] * nh + ["moe"] * (L - nh),
                 compress_rates={CSA: m_csa, HCA: m_hca},
                 index_n_heads=ri(8, 16), index_head_dim=r + ri(0, 6),     # few heads: exact ReLU ties
                 index_topk=ri(2, 6), sliding_window=ri(2, 13), hc_mult=ri(1, 4), hc_sinkhorn_iters=ri(1, 20),
                 hc_eps=rc([1e-6, 1e-3]), rms_norm_eps=rc([1e-6, 1e-5]), n_routed_experts=E,
                 num_experts_per_tok=ri(1, E - 1), moe_intermediate_size=ri(7, 23),
                 scoring_func=rc(["sigmoid", "sqrtsoftplus"]), routed_scaling_factor=rc([1.0, 1.5, 2.5]),
                 swiglu_limit=rc([1.5, 2.0, 10.0]), rope_theta=rc([10000.0, 30000.0]),
                 compress_rope_theta=rc([5000.0, 160000.0]), max_position_embeddings=4 * T,
                 rope_parameters=rc([dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=T,
                                          beta_fast=32, beta_slow=1), dict(rope_type="default")]))
    seed, B = ri(1, 10 ** 6), ri(1, 3)
    # MTP: 0-3 blocks; with blocks mostly trained (W > 0), sometimes W = 0 (trex must skip the mtp.* tensors).
    model["num_nextn_predict_layers"] = D = rc([0, 0, 1, 1, 2, 3])
    return dict(seed=seed, B=B, T=T, model=model, train=dict(mtp_loss_weight=rc([0.3, 1.0, 0.05, 0.0]) if D else 0.0))


def first_forward_margins(model, batch, w):
    rec = Recorder(model)
    with torch.no_grad():
        forward_all(model, batch, w)
    snap = snapshot(rec)
    rec.remove()
    return min([r["margin"] for r in snap["gates"].values()] + [r["margin"] for r in snap["index"].values()] +
               [math.inf])


class Float64Mode(TorchFunctionMode):
    """Keeps a model.double() run in float64: HF's V4 casts RMSNorms, hyper-connections, the HC head,
    the compressor softmaxes and the CE logits to fp32 (.float(), .to(float32), dtype=float32)."""
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        f64 = isinstance(args[0], torch.Tensor) and args[0].dtype == torch.float64 if args else False
        if func is torch.Tensor.float and f64:
            return args[0]
        if func is torch.Tensor.to and f64:
            args = tuple(torch.float64 if a is torch.float32 else a for a in args)
        if kwargs.get("dtype") is torch.float32:
            kwargs = dict(kwargs, dtype=torch.float64)
        return func(*args, **kwargs)


def load_model64(d):
    """load_model in float64 for Float64Mode; the rope tables stay fp32 (HF and trex form the angle
    fp32(pos) * fp32 inv_freq: part of the semantics), cos / sin are then cast to float64."""
    model = load_model(d).double()
    rot = model.model.rotary_emb
    for name, buf in list(rot.named_buffers(recurse=False)):
        if buf.dtype == torch.float64:
            setattr(rot, name, buf.float())
    return model


def compare64(name, grads32, ref64, trex_loss, trex_grads, rows):
    """trex vs a float64 autograd run of the same weights (the exact answer up to float64 noise):
    dumplib.compare against the float64 loss and gradients, each gradient's tolerance widened to
    max(1e-4, NOISE_FACTOR x the same error of PyTorch's own fp32 gradient): a few gradients are
    ill-conditioned (e.g. hc_head with hc_mult = 1, where RMSNorm(pre h) makes them eps-sized; hc
    scales summing cancelling terms) and fp32 autograd itself is off by up to ~3e-3 there."""
    g64 = ref64["grads"]
    tol = lambda k, den: max(1e-4, NOISE_FACTOR * (grads32[k].double() - g64[k]).norm().item() / den)
    return dumplib.compare(name, ref64["loss"], g64, trex_loss, trex_grads, rows, tol)


# --------------------------------------------------------------------------------------------
# The family: V4 overrides what dumplib.Family does for the V3-format scripts (config, init,
# checkpoint I/O, seed search and dump format, float64 --check); dumplib keeps the --check driver
# and the CLI.
# --------------------------------------------------------------------------------------------
class V4(dumplib.Family):
    tag, random_prefix = "v4", "v4random"
    cases = CASES
    train_default = TRAIN_DEFAULT
    random_spec = staticmethod(random_spec)

    def build_case(self, spec, seed):
        return build_case(spec, seed)

    def first_margin(self, model, batch, tr):
        return first_forward_margins(model, batch, tr.get("mtp_loss_weight", 0.0))

    def write_model(self, model, style, d):
        write_model(model, d)

    def verify_checkpoint(self, model, style, d, batch, tr):
        verify_checkpoint(model, d, batch, tr.get("mtp_loss_weight", 0.0))

    def write_case(self, name, spec, out_root):
        write_case(name, spec, out_root)

    def check_case(self, name, d, exp, tr, args, work, rows):
        """trex vs float64 PyTorch (compare64), plus the loss parts trex prints (ce, mtp)."""
        w = tr.get("mtp_loss_weight", 0.0)
        batch = dumplib.read_batch(os.path.join(d, "batch.json"))
        model = load_model(os.path.join(d, "model"))
        res, snap, grads, _ = reference_grads(model, batch, w)
        loss = res["loss"].item()
        model64 = load_model64(os.path.join(d, "model"))
        with Float64Mode():
            res64, snap64, grads64, _ = reference_grads(model64, batch, w)
        for gname, r in snap64["gates"].items():      # a near-tie would make float64 route differently
            assert torch.equal(r["idx"].sort(-1)[0], snap["gates"][gname]["idx"].sort(-1)[0]), (name, gname)
        for iname, r in snap64["index"].items():
            assert torch.equal(r["topk"], snap["index"][iname]["topk"]), (name, iname)
        if exp is not None and abs(loss - exp["loss"]) > 1e-5 * abs(exp["loss"]):
            print(f"warning: {name}: live loss {loss} != committed {exp['loss']}")
        tj, tg, err = dumplib.run_trex(args.trex, d, dumplib.trex_flags(tr),
                                       os.path.join(work, name + ".grads.safetensors"))
        if err is not None:
            rows.append((name, "trex", "-", "-", math.inf, 0.0, False))
            print(f"{name}: trex failed: {err}")
            return False
        ok = compare64(name, grads, dict(loss=res64["loss"].item(), grads=grads64), float(tj["loss"]), tg, rows)
        parts = [("ce", res64["ce"].item())] + ([("mtp", res64["mtp"].item())] if res64["mtp"] is not None else [])
        for key, ref in parts:                     # the loss components trex prints
            got = tj.get(key)
            e = abs(got - ref) / max(abs(ref), 1e-30) if got is not None else math.inf
            rows.append((name, key, f"{ref:.7g}", "missing" if got is None else f"{got:.7g}", e, 1e-5, e <= 1e-5))
            ok &= e <= 1e-5
        print(f"{name}: D {len(mtp_blocks(model))} W {w} loss {loss:.7g} trex {float(tj['loss']):.7g}, "
              f"{len(grads)} gradients, worst rel err "
              f"{max(r[4] for r in rows if r[0] == name and r[1] not in dumplib.SUMMARY_ROWS):.2e}"
              + ("" if ok else " FAIL"), flush=True)
        return ok


if __name__ == "__main__":
    dumplib.main(V4(), __doc__)
