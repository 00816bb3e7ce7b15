#!/usr/bin/env python3
"""Independent PyTorch reference for trex DeepSeek-V3.2 parity (see tests/reference/README.md,
"DeepSeek-V3.2 cases").

Builds tiny DeepseekV32ForCausalLM models with Hugging Face transformers (random init, fixed seed,
fp32, eager attention, eager expert loop; the router and the lightning indexer are transformers'
own code, only wrapped to record their selections and margins) and writes per case
tests/reference/data/v32_<name>/{model/, batch.json, expected.safetensors, expected.json} in the
format of the V3 cases (make_dumps.py).

  .venv/bin/python tests/reference/make_dumps_v32.py                      # regenerate the V3.2 dumps
  .venv/bin/python tests/reference/make_dumps_v32.py --check --trex build/trex --random 5
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
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import DeepseekV32Config, DeepseekV32ForCausalLM
from transformers import logging as hf_logging
from transformers.models.deepseek_v32 import modeling_deepseek_v32 as hf32

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_dumps as v3  # noqa: E402  (make_batch, Bf16Linears, compare, run_trex; its V3 patch is inert here)

torch.set_num_threads(1)
hf_logging.set_verbosity_error()
hf_logging.disable_progress_bar()
HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
MARGIN_MIN = 1e-4  # smallest accepted router / indexer top-k gap over the 10 training steps
TRAIN_DEFAULT = dict(v3.TRAIN_DEFAULT)

# --------------------------------------------------------------------------------------------
# Cases. "style": how config.json is written ("release" = like DeepSeek's V3.2-Exp release:
# rope_theta + rope_scaling{type: yarn}, scoring_func, topk_method; "hf5" = the diff-to-defaults
# form of transformers 5, rope_parameters{...}, mlp_layer_types, layer_types). index_topk is below
# T in both, so the indexer's selection decides what later queries attend.
# --------------------------------------------------------------------------------------------
CASES = {
    "v32_topk_yarn": dict(    # q_lora, 10 experts in 2 groups (1 kept), YaRN with attention factor != 1
        seed=7007, style="hf5", B=2, T=13,
        model=dict(vocab_size=89, hidden_size=45, num_hidden_layers=3, first_k_dense_replace=1,
                   num_attention_heads=5, q_lora_rank=21, kv_lora_rank=14, qk_nope_head_dim=10,
                   qk_rope_head_dim=6, v_head_dim=9, intermediate_size=50,
                   moe_intermediate_size=14, n_routed_experts=10, n_shared_experts=1,
                   num_experts_per_tok=3, n_group=2, topk_group=1, norm_topk_prob=True,
                   routed_scaling_factor=2.5, max_position_embeddings=32, tie_word_embeddings=False,
                   index_n_heads=7, index_head_dim=16, index_topk=5,
                   rope_scaling=dict(rope_type="yarn", factor=2.0,
                                     original_max_position_embeddings=16, beta_fast=32,
                                     beta_slow=1, mscale=0.8, mscale_all_dim=0.6)),
        train=dict(bias_update_gamma=0.01, aux_loss_alpha=0.0)),
    "v32_release_tied": dict(  # every layer MoE, 7 experts, tied embeddings, plain RoPE, aux loss
        seed=8008, style="release", B=2, T=11,
        model=dict(vocab_size=101, hidden_size=39, num_hidden_layers=2, first_k_dense_replace=0,
                   num_attention_heads=3, q_lora_rank=17, kv_lora_rank=15, qk_nope_head_dim=7,
                   qk_rope_head_dim=4, v_head_dim=11, intermediate_size=43,
                   moe_intermediate_size=17, n_routed_experts=7, n_shared_experts=2,
                   num_experts_per_tok=2, n_group=1, topk_group=1, norm_topk_prob=False,
                   routed_scaling_factor=1.3, max_position_embeddings=64, tie_word_embeddings=True,
                   index_n_heads=5, index_head_dim=9, index_topk=4, rope_scaling=None),
        train=dict(bias_update_gamma=0.0, aux_loss_alpha=0.01)),
}

# --------------------------------------------------------------------------------------------
# Router: transformers' DeepseekV32TopkRouter.forward as is (in fp32 also under autocast, as trex
# keeps the router in fp32), wrapped to record the scores (aux loss), the selection and its
# margin (the smallest gap a selection depends on; the -inf masking of HF's noaux_tc).
# --------------------------------------------------------------------------------------------
HF_ROUTER_FORWARD = hf32.DeepseekV32TopkRouter.forward


def route(self, hidden_states):
    with torch.autocast("cpu", enabled=False):
        logits, weights, idx = HF_ROUTER_FORWARD(self, hidden_states.float())
    scores = logits.sigmoid()
    E, K, G, TG, margin = self.num_experts, self.top_k, self.num_group, self.topk_group, math.inf
    with torch.no_grad():
        sel = scores + self.e_score_correction_bias
        gscore = sel.view(-1, G, E // G).topk(2, dim=-1)[0].sum(dim=-1)
        if G > TG:
            gs = gscore.sort(dim=-1, descending=True)[0]
            margin = min(margin, (gs[:, TG - 1] - gs[:, TG]).min().item())
        gidx = torch.topk(gscore, k=TG, dim=-1, sorted=False)[1]
        gmask = torch.zeros_like(gscore).scatter_(1, gidx, 1)
        smask = gmask.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E)
        ms = sel.masked_fill(~smask.bool(), float("-inf")).sort(dim=-1, descending=True)[0]
        if K < E:
            gap = ms[:, K - 1] - ms[:, K]
            fin = torch.isfinite(gap)
            margin = min(margin, gap[fin].min().item() if fin.any() else math.inf)
    self.trex_record = dict(scores=scores, idx=idx, margin=margin, zero_mask_diff=0)
    return logits, weights, idx


hf32.DeepseekV32TopkRouter.forward = route


def moe_gates(model):
    return [(f"model.layers.{i}.mlp.gate", l.mlp.gate) for i, l in enumerate(model.model.layers)
            if isinstance(l.mlp, hf32.DeepseekV32MoE)]


v3.moe_gates = moe_gates  # make_dumps' Bf16Linears keeps these routers in fp32

# --------------------------------------------------------------------------------------------
# Indexer: transformers' DeepseekV32Indexer.forward as is, wrapped to record the margin of its
# top-k (the gap between the k-th and the (k+1)-th score among a query's causal keys; queries
# with at most k keys select them all). The scores are recomputed here the way HF computes them.
# --------------------------------------------------------------------------------------------
HF_INDEXER_FORWARD = hf32.DeepseekV32Indexer.forward


@torch.no_grad()
def index(self, hidden_states, q_resid, position_embeddings, attention_mask, position_ids, cache=None, **kw):
    out = HF_INDEXER_FORWARD(self, hidden_states, q_resid, position_embeddings, attention_mask, position_ids,
                             cache=cache, **kw)
    B, S, _ = hidden_states.shape
    cos, sin = position_embeddings
    dr = self.qk_rope_head_dim
    q = self.wq_b(q_resid).view(B, S, self.n_heads, self.head_dim)
    k = self.k_norm(self.wk(hidden_states)).unsqueeze(2)
    q_rot, k_rot = hf32.apply_rotary_pos_emb(q[..., :dr], k[..., :dr], cos, sin, unsqueeze_dim=2)
    q = torch.cat([q_rot, q[..., dr:]], dim=-1)
    k = torch.cat([k_rot, k[..., dr:]], dim=-1).squeeze(2)
    scores = F.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * self.softmax_scale)
    w = self.weights_proj(hidden_states.to(self.weights_proj.weight.dtype)).float() * (self.n_heads ** -0.5)
    s = torch.matmul(w.unsqueeze(-2), scores).squeeze(-2)                         # [B, S, T]
    valid = attention_mask == 0 if attention_mask.dtype != torch.bool else attention_mask
    K, margin = self.index_topk, math.inf
    for b in range(B):
        for t in range(S):
            v = s[b, t][valid[b, t]]
            if v.numel() > K:
                vs = v.sort(descending=True)[0]
                margin = min(margin, (vs[K - 1] - vs[K]).item())
                mine = set(torch.nonzero(valid[b, t]).flatten()[v.topk(K).indices].tolist())
                assert vs[K - 1] == vs[K] or mine == set(out[b, t].tolist()), (b, t, mine, out[b, t].tolist())
    self.trex_record = dict(margin=margin)
    return out


hf32.DeepseekV32Indexer.forward = index


def indexers(model):
    return [l.self_attn.indexer for l in model.model.layers]


class Bf16Linears(v3.Bf16Linears):
    """make_dumps' bf16_weights yardstick, with the indexer's projections (wq_b, wk, weights_proj)
    kept in fp32 like the router, as trex's bf16 runs compute them."""

    def __init__(self, model):
        super().__init__(model)
        self.fp32 = {id(m.weight) for ix in indexers(model) for m in (ix.wq_b, ix.wk, ix.weights_proj)}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (F.linear, torch._C._nn.linear) and id(args[1]) in self.fp32:
            return func(*args, **(kwargs or {}))
        return super().__torch_function__(func, types, args, kwargs)


def precision_context(model, prec):
    return (lambda: Bf16Linears(model)) if prec == "bf16_weights" else v3.precision_context(model, prec)


def selection_margin(model):
    return min([g.trex_record["margin"] for _, g in moe_gates(model)] +
               [ix.trex_record["margin"] for ix in indexers(model)] + [math.inf])


# --------------------------------------------------------------------------------------------
# Model construction, init, checkpoint I/O.
# --------------------------------------------------------------------------------------------
def make_config(m):
    kw = dict(m)
    kw.setdefault("num_key_value_heads", kw["num_attention_heads"])
    kw.setdefault("rope_theta", 10000.0)
    rs = kw.pop("rope_scaling", None)
    kw["rope_parameters"] = dict(rs, rope_theta=kw.pop("rope_theta")) if rs else \
        dict(rope_type="default", rope_theta=kw.pop("rope_theta"))
    cfg = DeepseekV32Config(**kw)
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    return cfg


def init_model(cfg, seed, router_gain=2.0):
    """Non-trivial init: matrices N(0, 1/fan_in) (router x router_gain), norms 1+0.1N, the
    indexer's LayerNorm bias and the router biases 0.1N / 0.05N."""
    torch.manual_seed(seed)
    model = DeepseekV32ForCausalLM(cfg).float()
    g = torch.Generator().manual_seed(seed)
    d = cfg.hidden_size
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                if name.endswith("k_norm.bias"):
                    p.normal_(generator=g).mul_(0.1)
                else:
                    assert name.endswith("norm.weight"), name
                    p.normal_(generator=g).mul_(0.1).add_(1.0)
            elif "embed_tokens" in name:
                p.normal_(generator=g).mul_(1.5 / math.sqrt(d) if cfg.tie_word_embeddings else 1.0)
            else:
                gain = router_gain if name.endswith("mlp.gate.weight") else 1.0
                p.normal_(generator=g).mul_(gain / math.sqrt(max(p.shape[-1], 1)))
        for _, gate in moe_gates(model):
            gate.e_score_correction_bias.normal_(generator=g).mul_(0.05)
    return model


def checkpoint_state(model):
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    return v3.to_checkpoint_names(sd, model.config)


def config_json(cfg, style):
    if style == "hf5":
        j = json.loads(cfg.to_json_string())         # the diff-to-defaults form
        j.update(architectures=["DeepseekV32ForCausalLM"], dtype="float32")
        return j
    keys = ["vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
            "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "n_shared_experts",
            "n_routed_experts", "routed_scaling_factor", "kv_lora_rank", "q_lora_rank",
            "qk_rope_head_dim", "v_head_dim", "qk_nope_head_dim", "n_group", "topk_group",
            "num_experts_per_tok", "first_k_dense_replace", "norm_topk_prob", "hidden_act",
            "max_position_embeddings", "initializer_range", "rms_norm_eps", "use_cache",
            "bos_token_id", "eos_token_id", "tie_word_embeddings", "attention_bias",
            "attention_dropout", "index_topk", "index_head_dim", "index_n_heads"]
    j = {"architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32"}
    for k in keys:
        j[k] = getattr(cfg, k)
    # The release's own keys (DeepSeek's inference code reads them; transformers keeps them as is).
    j.update(scoring_func="sigmoid", topk_method="noaux_tc", moe_layer_freq=1, ep_size=1,
             num_nextn_predict_layers=0)
    rp = dict(cfg.rope_parameters)
    j["rope_theta"] = rp.pop("rope_theta")
    j["rope_scaling"] = None if rp["rope_type"] == "default" else dict({"type": rp.pop("rope_type")}, **rp)
    j["torch_dtype"] = "float32"
    return j


def write_model(model, style, d):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config_json(model.config, style), f, indent=2, sort_keys=True)
    save_file(checkpoint_state(model), os.path.join(d, "model.safetensors"), metadata={"format": "pt"})


def load_model(d):
    return DeepseekV32ForCausalLM.from_pretrained(d, attn_implementation="eager",
                                                  experts_implementation="eager", dtype=torch.float32)


def verify_checkpoint(model, d, batch):
    """Our per-expert names == what save_pretrained writes; reload gives bit-identical logits."""
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        theirs, ours = load_file(os.path.join(tmp, "model.safetensors")), checkpoint_state(model)
        assert set(theirs) == set(ours), (set(theirs) ^ set(ours))
        for k in ours:
            assert torch.equal(theirs[k], ours[k]), k
    re = load_model(d)
    for k in ("n_group", "topk_group", "routed_scaling_factor", "q_lora_rank", "n_shared_experts",
              "first_k_dense_replace", "tie_word_embeddings", "index_topk", "index_head_dim",
              "index_n_heads", "mlp_layer_types"):
        a, b = getattr(re.config, k), getattr(model.config, k)
        assert a == b, (k, a, b)
    rp = lambda c: {k: v for k, v in c.rope_parameters.items() if k != "type"}
    assert rp(re.config) == rp(model.config), (re.config.rope_parameters, model.config.rope_parameters)
    model.eval(), re.eval()
    with torch.no_grad():
        a = model(input_ids=batch["ids"]).logits
        b = re(input_ids=batch["ids"]).logits
    assert torch.equal(a, b), (a - b).abs().max()
    model.train()


# --------------------------------------------------------------------------------------------
# Loss = CE (HF label shift) + sequence-wise aux loss (the V3 formula on the sigmoid scores);
# gradients; training (with the aux-loss-free router bias update, as make_dumps.py).
# --------------------------------------------------------------------------------------------
def forward_loss(model, batch, alpha):
    out = model(input_ids=batch["ids"], labels=batch["labels"], use_cache=False)
    ce = out.loss
    B, T = batch["ids"].shape
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
            cnt = torch.zeros(B, E).scatter_add_(1, rec["idx"].view(B, T * K), torch.ones(B, T * K))
            f = cnt * (E / (K * T))
            aux = aux + alpha * (f * P).sum(dim=-1).mean()
    return ce + aux, ce, aux, out.logits, routes


def grads_by_checkpoint_name(model):
    g = {n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().clone()
         for n, p in model.named_parameters()}
    g = v3.to_checkpoint_names(g, model.config)
    return {k: v for k, v in g.items() if v.numel() > 0}   # n_shared_experts 0: trex has no such tensors


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
                            lr=tr["lr"], betas=(tr["beta1"], tr["beta2"]), eps=tr["eps"], foreach=False)
    losses, norms, loads, margin, routes0 = [], [], [], math.inf, None
    ctx = precision_context(model, prec)
    for _ in range(tr["steps"]):
        opt.zero_grad(set_to_none=True)
        with ctx() as mode:
            loss, _, _, _, routes = forward_loss(model, batch, tr["aux_loss_alpha"])
        if isinstance(mode, Bf16Linears):
            assert mode.calls["router"] == len(moe_gates(model)) and mode.calls["bf16"] > 0, mode.calls
        routes0 = routes0 or {n: r["idx"].clone() for n, r in routes.items()}
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), tr["clip_grad_norm"]).item())
        losses.append(loss.item())
        opt.step()
        margin = min(margin, selection_margin(model))
        step_loads = {}
        for name, gate in moe_gates(model):
            load = torch.bincount(routes[name]["idx"].flatten(), minlength=gate.num_experts).float()
            step_loads[name] = [int(x) for x in load.tolist()]
            with torch.no_grad():
                gate.e_score_correction_bias += tr["bias_update_gamma"] * torch.sign(load.mean() - load)
        loads.append(step_loads)
    final_bias = {f"{n}.e_score_correction_bias": g.e_score_correction_bias.tolist() for n, g in moe_gates(model)}
    return dict(losses=losses, grad_norms=norms, loads=loads, margin=margin, routes0=routes0,
                final_bias=final_bias)


def build_case(spec, seed):
    cfg = make_config(spec["model"])
    model = init_model(cfg, seed, spec.get("router_gain", 2.0))
    batch = v3.make_batch(cfg.vocab_size, spec["B"], spec["T"], seed)
    return model, batch


def write_case(name, spec, out_root):
    tr = dict(TRAIN_DEFAULT, **spec.get("train", {}))
    margin_min = spec.get("margin_min", MARGIN_MIN)
    for seed in range(spec["seed"], spec["seed"] + 200):   # first seed whose routing has no near-ties
        model, batch = build_case(spec, seed)
        with torch.no_grad():      # prescreen: the first forward's margin
            model(input_ids=batch["ids"], use_cache=False)
        if selection_margin(model) < margin_min:
            continue
        loss, ce, aux, logits, routes, grads = reference_grads(model, batch, tr["aux_loss_alpha"])
        trained = train(build_case(spec, seed)[0], batch, tr)
        if trained["margin"] < margin_min:
            print(f"  {name}: seed {seed} has routing margin {trained['margin']:.2e}, trying next")
            continue
        yard = {p: train(build_case(spec, seed)[0], batch, tr, p) for p in ("bf16_autocast", "bf16_weights")}
        flips = {p: {n: v3.route_flips(routes[n]["idx"], y["routes0"][n]) for n in routes} for p, y in yard.items()}
        if spec.get("bf16_same_routes") and any(flips["bf16_weights"].values()):
            print(f"  {name}: seed {seed}: bf16 weights flip step-0 selections {flips['bf16_weights']}, trying next")
            continue
        break
    else:
        raise RuntimeError(f"{name}: no seed with routing margin >= {margin_min}")
    d = os.path.join(out_root, name)
    shutil.rmtree(d, ignore_errors=True)
    write_model(model, spec["style"], os.path.join(d, "model"))
    verify_checkpoint(model, os.path.join(d, "model"), batch)
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
           "grad_norms": trained["grad_norms"], "loads": trained["loads"],
           "final_bias": trained["final_bias"],
           "routing_min_margin": trained["margin"],
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
          f"margin {trained['margin']:.2e} size {size / 1e3:.0f} kB")
    for p, y in yard.items():
        dl = max(abs(a - b) for a, b in zip(y["losses"], trained["losses"]))
        print(f"  {p}: max |loss - fp32| over {tr['steps']} steps {dl:.4f}, "
              f"step-0 route flips {list(flips[p].values())}")


# --------------------------------------------------------------------------------------------
# --check: live reference vs `trex grad`.
# --------------------------------------------------------------------------------------------
def random_spec(rng):
    # index_topk >= 2: with one key per query the attention is constant, q's gradient is zero
    # analytically, and the float residue of trex's softmax (p = 1 - 1e-7) fails the relative check.
    ri = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=rng))
    rc = lambda xs: xs[ri(0, len(xs) - 1)]
    L = ri(1, 3)
    G = rc([1, 2, 3])
    per = ri(2, 4)
    E = G * per
    tg = ri(1, G)
    K = ri(1, min(tg * per, E - 1))
    yarn = rc([True, False])
    factor = rc([2.0, 3.0, 4.0])
    T = 2 * ri(2, 9) + 1
    dr = 2 * ri(1, 4)
    model = dict(vocab_size=ri(31, 131), hidden_size=ri(17, 71), num_hidden_layers=L,
                 first_k_dense_replace=ri(0, L - 1), num_attention_heads=ri(1, 5),
                 q_lora_rank=ri(9, 33), kv_lora_rank=ri(5, 17), qk_nope_head_dim=ri(1, 11),
                 qk_rope_head_dim=dr, v_head_dim=ri(3, 15), intermediate_size=ri(19, 61),
                 moe_intermediate_size=ri(7, 23), n_routed_experts=E, n_shared_experts=ri(0, 2),
                 num_experts_per_tok=K, n_group=G, topk_group=tg, norm_topk_prob=rc([True, False]),
                 routed_scaling_factor=rc([1.0, 2.5]), index_n_heads=ri(2, 8),
                 index_head_dim=dr + ri(0, 12), index_topk=ri(2, T + 2),
                 max_position_embeddings=int(16 * factor) if yarn else 64,
                 tie_word_embeddings=rc([True, False]),
                 rope_scaling=dict(rope_type="yarn", factor=factor, original_max_position_embeddings=16,
                                   beta_fast=32, beta_slow=1, mscale=rc([1.0, 0.707, 0.8]),
                                   mscale_all_dim=rc([0.707, 0.6, 0.0])) if yarn else None)
    return dict(seed=ri(1, 10 ** 6), style=rc(["release", "hf5"]), B=ri(1, 3), T=T,
                model=model, train=dict(aux_loss_alpha=rc([0.0, 0.01])))


def convert_round_trip(trex, d, batch, work, name):
    """trex convert --dtype f32 of a committed case loads in transformers with identical logits."""
    out = os.path.join(work, name + ".converted")
    p = subprocess.run([trex, "convert", "--model", os.path.join(d, "model"), "--out", out, "--dtype", "f32"],
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        print(f"{name}: trex convert failed: {(p.stderr or p.stdout).strip()[-300:]}")
        return False
    a, b = load_model(os.path.join(d, "model")), load_model(out)
    a.eval(), b.eval()
    with torch.no_grad():
        same = torch.equal(a(input_ids=batch["ids"]).logits, b(input_ids=batch["ids"]).logits)
    print(f"{name}: trex convert -> from_pretrained: logits {'identical' if same else 'DIFFER'}")
    return same


def check(args):
    rows, failed = [], []
    work = tempfile.mkdtemp(prefix="trex_check_v32_")
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
                    model(input_ids=batch["ids"], use_cache=False)
                if selection_margin(model) >= 1e-5:
                    break
                spec["seed"] += 1
            write_model(model, spec["style"], os.path.join(d, "model"))
            with open(os.path.join(d, "batch.json"), "w") as f:
                json.dump({"input_ids": batch["ids"].tolist(), "labels": batch["labels"].tolist()}, f)
            with open(os.path.join(d, "spec.json"), "w") as f:
                json.dump(spec, f, indent=1)
            verify_checkpoint(model, os.path.join(d, "model"), batch)
        bj = json.load(open(os.path.join(d, "batch.json")))
        batch = dict(ids=torch.tensor(bj["input_ids"]), labels=torch.tensor(bj["labels"]))
        model = load_model(os.path.join(d, "model"))
        loss, _, _, _, _, grads = reference_grads(model, batch, alpha)
        if exp is not None and abs(loss.item() - exp["loss"]) > 1e-5 * abs(exp["loss"]):
            print(f"warning: {name}: live loss {loss.item()} != committed {exp['loss']}")
        out = os.path.join(work, name + ".grads.safetensors")
        tl, tg, err = v3.run_trex(args.trex, os.path.join(d, "model"), os.path.join(d, "batch.json"), alpha, out)
        if err is not None:
            rows.append((name, "trex", "-", "-", math.inf, False))
            print(f"{name}: trex failed: {err}")
            failed.append(name)
            continue
        if not v3.compare(name, loss.item(), grads, tl, tg, rows):
            failed.append(name)
        if exp is not None and not convert_round_trip(args.trex, d, batch, work, name):
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
