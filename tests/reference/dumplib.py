"""What the reference-dump scripts (make_dumps*.py) share; see tests/reference/README.md.

A script describes its model family as a subclass of `Family` (config, model construction, router
and other patches of transformers, checkpoint layout, random configs, quirks) and hands it to
`main`, which regenerates the dumps or runs `--check`. The base class is a family whose dumps are
in the V3 format (make_dumps.py): `Family.write_case` searches the seed, trains, writes the case
folder; `Family.check_case` compares live PyTorch with `trex grad`. A family whose format differs
(make_dumps_v4.py) overrides those two and still uses the pieces below: the batch, the AdamW
loop, the bf16 linears, the checkpoint writer, the trex runner, the comparison table, the CLI.
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
from torch.overrides import TorchFunctionMode
from transformers import logging as hf_logging

torch.set_num_threads(1)        # the dumps' bytes depend on the order of the fp32 reductions
hf_logging.set_verbosity_error()
hf_logging.disable_progress_bar()
HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
MARGIN_MIN = 1e-4    # smallest accepted top-k / group-selection gap over the 10 training steps
CHECK_MARGIN = 1e-5  # --check: random configs are re-seeded until their first forward's margin is this
TRAIN_DEFAULT = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1,
                     clip_grad_norm=1.0, bias_update_gamma=0.0, aux_loss_alpha=0.0, steps=10)
YARDSTICKS = ("bf16_autocast", "bf16_weights")


# --------------------------------------------------------------------------------------------
# Batch, random draws.
# --------------------------------------------------------------------------------------------
def make_batch(vocab, B, T, seed):
    """ids [B, T] and labels (= ids with 2 + b positions of row b set to -100, never position 0)."""
    g = torch.Generator().manual_seed(seed + 7)
    ids = torch.randint(0, vocab, (B, T), generator=g)
    labels = ids.clone()
    for b in range(B):
        pos = torch.randperm(T - 1, generator=g)[:2 + b] + 1    # never position 0 (unused anyway)
        labels[b, pos] = -100
    return dict(ids=ids, labels=labels)


def write_batch(batch, path):
    with open(path, "w") as f:
        json.dump({"input_ids": batch["ids"].tolist(), "labels": batch["labels"].tolist()}, f)


def read_batch(path):
    with open(path) as f:
        bj = json.load(f)
    return dict(ids=torch.tensor(bj["input_ids"]), labels=torch.tensor(bj["labels"]))


def drawers(rng):
    """(ri, rc) for random configs: ri(lo, hi) an integer in [lo, hi], rc(xs) an element of xs."""
    ri = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=rng))
    rc = lambda xs: xs[ri(0, len(xs) - 1)]
    return ri, rc


# --------------------------------------------------------------------------------------------
# Loss pieces: HF's CE checked independently, the sequence-wise aux loss, the MTP shift.
# --------------------------------------------------------------------------------------------
def check_ce(ce, logits, labels):
    """HF's loss: position t predicts labels[t+1], mean over the non-ignored targets."""
    ce2 = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                          labels[:, 1:].reshape(-1), ignore_index=-100)
    assert torch.allclose(ce, ce2, rtol=1e-6, atol=0), (ce, ce2)


def seq_aux_loss(gates, B, T, alpha):
    """DeepSeek-V3 eqs. 17-20 over the routers `gates` [(name, gate)] of the last forward (each
    holds `trex_record` = dict(scores [B*T, E], idx [B*T, K], margin, ...)). Returns (aux, routes
    {name: record})."""
    aux = torch.zeros((), dtype=torch.float32)
    routes = {}
    for name, gate in gates:
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
    return aux, routes


@contextlib.contextmanager
def capture_inputs(model, final, enabled=True):
    """Yields a dict that a forward of model fills with "kw" (the keyword arguments of the first
    decoder layer: rope tables, positions, mask, ...) and "x" (the input of module `final`, e.g.
    model.model.norm: the last layer's output); nothing when not enabled. For MTP depths."""
    cap, hooks = {}, []
    if enabled:
        hooks.append(model.model.layers[0].register_forward_pre_hook(
            lambda mod, a, kw: cap.__setitem__("kw", kw), with_kwargs=True))
        hooks.append(final.register_forward_pre_hook(lambda mod, a: cap.__setitem__("x", a[0])))
    try:
        yield cap
    finally:
        for h in hooks:
            h.remove()


def mtp_shift(ids, labels, k):
    """ids_k [B, T] (ids[t+k], ids[t] where t+k >= T) and targets_k [B, T] (labels[t+k+1], -100 past T)."""
    T = ids.shape[1]
    j = torch.arange(T) + k
    ids_k = torch.where(j < T, ids[:, j.clamp(max=T - 1)], ids)
    tg = torch.where(j + 1 < T, labels[:, (j + 1).clamp(max=T - 1)], torch.full_like(labels, -100))
    return ids_k, tg


def group_mask(gscore, topk_group, E):
    """Group-limited routing: gscore [N, G] -> ([N, E] bool, True for the experts of each token's
    topk_group best groups; the smallest gap between the last kept and the first dropped group
    score, inf when every group is kept)."""
    G, margin = gscore.shape[1], math.inf
    if G > topk_group:
        gs = gscore.sort(dim=-1, descending=True)[0]
        margin = (gs[:, topk_group - 1] - gs[:, topk_group]).min().item()
    gidx = torch.topk(gscore, k=topk_group, dim=-1, sorted=False)[1]
    gmask = torch.zeros_like(gscore).scatter_(1, gidx, 1)
    return gmask.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E).bool(), margin


# --------------------------------------------------------------------------------------------
# bf16 yardsticks (expected.json losses_bf16_*; not what trex is tested against, see README).
# "bf16_autocast": forward + loss under torch.autocast("cpu", bfloat16), routers kept fp32.
# "bf16_weights": trex's bf16 semantics: every linear but the routers (and what a family keeps
# fp32) reads bf16-rounded x and W (f32 accumulation); backward dx = r(dy) r(W), dW = r(dy)^T r(x),
# r = round to bf16; the LM heads do not round dy (kernels/lm_head_ce.h).
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
    """Routes every F.linear through Bf16Linear except those whose weight is in `fp32` (counted in
    calls["fp32"], e.g. the routers) or in `fp32_uncounted`; weights in `heads` keep dy unrounded."""

    def __init__(self, fp32, heads, fp32_uncounted=()):
        super().__init__()
        self.fp32, self.uncounted, self.heads = set(fp32), set(fp32_uncounted), set(heads)
        self.calls = {"bf16": 0, "fp32": 0}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (F.linear, torch._C._nn.linear):
            x, w = args[0], args[1] if len(args) > 1 else kwargs["weight"]
            if id(w) in self.uncounted:
                pass
            elif id(w) in self.fp32:
                self.calls["fp32"] += 1
            else:
                assert (args[2] if len(args) > 2 else kwargs.get("bias")) is None and w.dtype == torch.float32
                self.calls["bf16"] += 1
                return Bf16Linear.apply(x, w, id(w) not in self.heads)
        return func(*args, **kwargs)


def route_flips(a, b):
    """(token, slot) selections of idx a [N, K] not in the same row of b (per row K - |a & b|)."""
    K = a.shape[1]
    same = (a.unsqueeze(-1) == b.unsqueeze(-2)).any(-1).sum(-1)
    return int((K - same).sum().item())


# --------------------------------------------------------------------------------------------
# Checkpoints.
# --------------------------------------------------------------------------------------------
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


def write_checkpoint(d, config, tensors):
    """d/config.json (sorted keys) and d/model.safetensors."""
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    save_file(tensors, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})


def from_pretrained(cls, d):
    return cls.from_pretrained(d, attn_implementation="eager", experts_implementation="eager",
                               dtype=torch.float32)


def rope_params(cfg):
    return {k: v for k, v in cfg.rope_parameters.items() if k != "type"}


# --------------------------------------------------------------------------------------------
# Training: AdamW (torch, foreach=False), weight decay on tensors with ndim >= 2, global-norm clip.
# --------------------------------------------------------------------------------------------
def adamw_steps(params, tr, forward, after_step=lambda: None):
    """tr["steps"] steps on `params`: loss = forward(); backward; clip (pre-clip norm recorded);
    AdamW step; after_step(). Returns (losses, grad_norms)."""
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    opt = torch.optim.AdamW([dict(params=decay, weight_decay=tr["weight_decay"]),
                             dict(params=no_decay, weight_decay=0.0)],
                            lr=tr["lr"], betas=(tr["beta1"], tr["beta2"]), eps=tr["eps"], foreach=False)
    losses, norms = [], []
    for _ in range(tr["steps"]):
        opt.zero_grad(set_to_none=True)
        loss = forward()
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(params, tr["clip_grad_norm"]).item())
        losses.append(loss.item())
        opt.step()
        after_step()
    return losses, norms


def update_bias(gate, load, gamma):
    """The aux-loss-free bias update: bias_i += gamma * sign(mean(load) - load_i)."""
    with torch.no_grad():
        gate.e_score_correction_bias += gamma * torch.sign(load.mean() - load)


# --------------------------------------------------------------------------------------------
# Writing a case folder.
# --------------------------------------------------------------------------------------------
def versions():
    return {"torch": torch.__version__, "transformers": __import__("transformers").__version__}


def write_expected(d, tensors, exp):
    """d/expected.safetensors and d/expected.json (keys in the order of `exp`); returns the size
    of the whole folder in bytes."""
    save_file(tensors, os.path.join(d, "expected.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump(exp, f, indent=1)
    return sum(os.path.getsize(os.path.join(r, x)) for r, _, fs in os.walk(d) for x in fs)


def print_yardsticks(yard, losses, flips=None):
    for p, y in yard.items():
        dl = max(abs(a - b) for a, b in zip(y["losses"], losses))
        print(f"  {p}: max |loss - fp32| over {len(losses)} steps {dl:.4f}"
              + (f", step-0 route flips {list(flips[p].values())}" if flips else ""))


# --------------------------------------------------------------------------------------------
# --check: trex runner and comparison.
# --------------------------------------------------------------------------------------------
def trex_flags(tr):
    """The `trex grad` flags of a case's training settings."""
    flags = []
    if tr.get("aux_loss_alpha", 0.0) > 0:
        flags += ["--aux-loss-alpha", repr(tr["aux_loss_alpha"])]
    if tr.get("mtp_loss_weight", 0.0) > 0:
        flags += ["--mtp-loss-weight", repr(tr["mtp_loss_weight"])]
    return flags


def run_trex(trex, d, flags, out):
    """trex grad on case folder d (model/, batch.json) in fp32. Returns (stdout's JSON line with
    "loss" (a dict: loss, ce, mtp, ...), gradients by checkpoint name, error message or None)."""
    cmd = [trex, "grad", "--model", os.path.join(d, "model"), "--batch", os.path.join(d, "batch.json"),
           "--precision", "fp32", "--out", out] + flags
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, None, f"cannot run {' '.join(cmd)}: {e}"
    if p.returncode != 0:
        return None, None, f"exit {p.returncode}: {(p.stderr or p.stdout).strip()[-300:]}"
    res = None
    for line in p.stdout.splitlines():
        try:
            j = json.loads(line)
            res = j if isinstance(j, dict) and "loss" in j else res
        except ValueError:
            pass
    if res is None:
        return None, None, "no JSON line with \"loss\" on stdout"
    return res, load_file(out), None


def compare(name, ref_loss, ref_grads, trex_loss, trex_grads, rows, tol=lambda k, den: 1e-4):
    """Appends rows (case, tensor, ref, trex, rel err, tolerance, ok); True when all pass. Loss: rel
    err <= 1e-5. Gradient k: ||trex - ref|| / max(||ref||, 1e-4 x ||all ref grads||) <= tol(k, den)
    (den = that denominator). The floor covers gradients that are analytically zero (e.g. the
    router with top-1 and norm_topk_prob), which autograd leaves as float rounding residue."""
    ok = True
    total = math.sqrt(sum(float(g.double().norm()) ** 2 for g in ref_grads.values()))
    floor = 1e-4 * total
    lerr = abs(trex_loss - ref_loss) / max(abs(ref_loss), 1e-30)
    ok &= lerr <= 1e-5
    rows.append((name, "loss", f"{ref_loss:.7g}", f"{trex_loss:.7g}", lerr, 1e-5, lerr <= 1e-5))
    for k in sorted(set(ref_grads) | set(trex_grads)):
        if k not in trex_grads or k not in ref_grads:
            rows.append((name, k, "-" if k not in ref_grads else "present",
                         "missing" if k not in trex_grads else "extra", math.inf, 0.0, False))
            ok = False
            continue
        r, t = ref_grads[k].double(), trex_grads[k].double()
        if r.shape != t.shape:
            rows.append((name, k, str(tuple(r.shape)), str(tuple(t.shape)), math.inf, 0.0, False))
            ok = False
            continue
        den = max(r.norm().item(), floor, 1e-30)
        err = (t - r).norm().item() / den
        e_tol = tol(k, den)
        good = err <= e_tol and bool(torch.isfinite(t).all())
        ok &= good
        rows.append((name, k, f"{r.norm().item():.4g}", f"{t.norm().item():.4g}", err, e_tol, good))
    return ok


SUMMARY_ROWS = ("loss", "ce", "mtp", "trex")   # rows printed without --verbose (besides failures)


def print_rows(rows, verbose):
    w = max([len(r[1]) for r in rows] + [10])
    print(f"{'case':<20} {'tensor':<{w}} {'ref':>12} {'trex':>12} {'rel err':>10} {'tol':>9}  ok")
    for c, k, a, b, e, tol, good in rows:
        if verbose or not good or k in SUMMARY_ROWS or tol > 1e-4:
            print(f"{c:<20} {k:<{w}} {a:>12} {b:>12} {e:>10.2e} {tol:>9.1e}  {'ok' if good else 'FAIL'}")
    for name in dict.fromkeys(r[0] for r in rows):
        rs = [r for r in rows if r[0] == name and r[1] not in SUMMARY_ROWS]
        if rs:
            print(f"{name}: {len(rs)} gradients, max rel err {max(r[4] for r in rs):.2e}")


# --------------------------------------------------------------------------------------------
# A model family. The defaults are those of the V3-format families (make_dumps.py and the
# scripts built on transformers' DeepseekV2 / V32 classes).
# --------------------------------------------------------------------------------------------
class Family:
    tag = "v3"                          # --check: temporary folder trex_check_<tag>_*, random case names
    random_prefix = "random"
    cases = {}                          # name -> spec (seed, style, B, T, model, train, ...)
    train_default = TRAIN_DEFAULT
    seed_tries = 200                    # seeds tried from spec["seed"] for a case without near-ties
    model_class = None                  # transformers' ForCausalLM class
    config_class = None
    moe_class = None                    # the MoE block class of a decoder layer (its .gate is the router)
    router_bias = True                  # the routers hold e_score_correction_bias (updated in training)
    config_defaults = {}                # make_config: keys added when a spec lacks them
    # config.json of the release style: architectures / model_type, the config attributes
    # release_keys (MLA and MoE sizes; a family adds its own), release_extra(cfg), the rope keys.
    architecture = model_type = None
    release_keys = ["vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
                    "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "n_shared_experts",
                    "n_routed_experts", "routed_scaling_factor", "kv_lora_rank", "q_lora_rank",
                    "qk_rope_head_dim", "v_head_dim", "qk_nope_head_dim", "num_experts_per_tok",
                    "first_k_dense_replace", "norm_topk_prob", "hidden_act", "max_position_embeddings",
                    "initializer_range", "rms_norm_eps", "use_cache", "bos_token_id", "eos_token_id",
                    "tie_word_embeddings", "attention_bias", "attention_dropout"]
    dump_logits_and_routes = True       # expected.safetensors holds logits and route.*.topk_indices
    expected_keys = ["case", "seed", "loss", "ce_loss", "aux_loss", "train", "losses", "grad_norms",
                     "final_bias", "loads", "routing_min_margin", "zero_mask_would_differ",
                     "losses_bf16_autocast", "losses_bf16_weights", "route_flips_bf16",
                     "versions"]        # expected.json, in this order

    # ---- model ----
    def make_config(self, m):
        kw = dict(m)
        kw.setdefault("num_key_value_heads", kw["num_attention_heads"])
        for k, v in self.config_defaults.items():
            kw.setdefault(k, v)
        kw.setdefault("rope_theta", 10000.0)
        rs = kw.pop("rope_scaling", None)
        kw["rope_parameters"] = dict(rs, rope_theta=kw.pop("rope_theta")) if rs else \
            dict(rope_type="default", rope_theta=kw.pop("rope_theta"))
        cfg = self.config_class(**kw)
        cfg._attn_implementation = "eager"
        cfg._experts_implementation = "eager"
        return cfg

    def init_model(self, cfg, seed, router_gain=2.0):
        """Non-trivial init (not HF's): matrices N(0, 1/fan_in) (router x router_gain), embedding
        N(0, 1) (tied: N(0, 2.25/d)), norms 1+0.1N, LayerNorm biases 0.1N, router bias 0.05N."""
        torch.manual_seed(seed)
        model = self.model_class(cfg).float()
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                self.init_param(name, p, g, cfg, router_gain)
            if self.router_bias:
                for _, gate in self.gates(model):
                    gate.e_score_correction_bias.normal_(generator=g).mul_(0.05)
        self.configure(model)
        return model

    @staticmethod
    def init_param(name, p, g, cfg, router_gain):
        """Draws parameter `name` from generator g (init_model's rules)."""
        if p.ndim == 1:
            if name.endswith("k_norm.bias"):        # V3.2's indexer LayerNorm
                p.normal_(generator=g).mul_(0.1)
            else:
                assert name.endswith("norm.weight"), name
                p.normal_(generator=g).mul_(0.1).add_(1.0)
        elif "embed_tokens" in name:
            p.normal_(generator=g).mul_(1.5 / math.sqrt(cfg.hidden_size) if cfg.tie_word_embeddings else 1.0)
        else:
            gain = router_gain if name.endswith("mlp.gate.weight") else 1.0
            p.normal_(generator=g).mul_(gain / math.sqrt(max(p.shape[-1], 1)))  # [d, 0]: no shared experts

    def configure(self, model):
        """Called on every built or loaded model (e.g. to set router attributes)."""

    def build_case(self, spec, seed):
        cfg = self.make_config(spec["model"])
        model = self.init_model(cfg, seed, spec.get("router_gain", 2.0))
        return model, make_batch(cfg.vocab_size, spec["B"], spec["T"], seed)

    def gates(self, model):
        """[(name, router)] of the model's MoE layers."""
        return [(f"model.layers.{i}.mlp.gate", l.mlp.gate) for i, l in enumerate(model.model.layers)
                if isinstance(l.mlp, self.moe_class)]

    def forward(self, model, batch, tr):
        """One forward + loss: dict(loss, ce, aux, logits, routes {gate name: record})."""
        out = model(input_ids=batch["ids"], labels=batch["labels"], use_cache=False)
        check_ce(out.loss, out.logits, batch["labels"])
        B, T = batch["ids"].shape
        aux, routes = seq_aux_loss(self.gates(model), B, T, tr["aux_loss_alpha"])
        return dict(loss=out.loss + aux, ce=out.loss, aux=aux, logits=out.logits, routes=routes)

    def margin(self, model, routes):
        """Smallest selection margin of the last forward (routes: its router records)."""
        return min([r["margin"] for r in routes.values()] + [math.inf])

    def first_margin(self, model, batch, tr):
        with torch.no_grad():
            return self.margin(model, self.forward(model, batch, tr)["routes"])

    def grads(self, model):
        """Gradients by checkpoint name (zeros where autograd left none)."""
        g = {n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().clone()
             for n, p in model.named_parameters()}
        g = to_checkpoint_names(g, model.config)
        return {k: v for k, v in g.items() if v.numel() > 0}   # n_shared_experts 0: trex has no such tensors

    def reference_grads(self, model, batch, tr):
        """One forward + backward from the current weights: (forward dict, detached; gradients)."""
        model.train()
        model.zero_grad(set_to_none=True)
        res = self.forward(model, batch, tr)
        res["loss"].backward()
        res = {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in res.items()}
        return res, self.grads(model)

    # ---- precision ----
    def bf16_heads(self, model):
        return {id(model.lm_head.weight)}

    def bf16_fp32_uncounted(self, model):
        return ()

    def precision_context(self, model, prec):
        """A factory of context managers for one forward + loss in precision `prec`."""
        if prec == "fp32":
            return contextlib.nullcontext
        if prec == "bf16_autocast":
            return lambda: torch.autocast("cpu", dtype=torch.bfloat16)
        if prec == "bf16_weights":
            return lambda: Bf16Linears({id(g.weight) for _, g in self.gates(model)}, self.bf16_heads(model),
                                       self.bf16_fp32_uncounted(model))
        raise ValueError(prec)

    # ---- training ----
    def train(self, model, batch, tr, prec="fp32"):
        """tr["steps"] AdamW steps on one batch with the router bias update. Returns dict(losses,
        grad_norms, loads, final_bias, margin, zero_mask_diff, routes0 (first forward's selections))."""
        ctx = self.precision_context(model, prec)
        st = dict(loads=[], margin=math.inf, zdiff=0, routes0=None, routes=None)

        def forward():
            with ctx() as mode:
                res = self.forward(model, batch, tr)
            if isinstance(mode, Bf16Linears):   # each router once, everything else rounded
                assert mode.calls["fp32"] == len(res["routes"]) and mode.calls["bf16"] > 0, mode.calls
            st["routes"] = res["routes"]
            st["routes0"] = st["routes0"] or {n: r["idx"].clone() for n, r in res["routes"].items()}
            return res["loss"]

        def after_step():
            routes, step_loads = st["routes"], {}
            st["margin"] = min(st["margin"], self.margin(model, routes))
            for name, gate in self.gates(model):
                rec = routes[name]
                st["zdiff"] += rec.get("zero_mask_diff", 0)
                load = torch.bincount(rec["idx"].flatten(), minlength=gate.num_experts).float()
                step_loads[name] = [int(x) for x in load.tolist()]
                if self.router_bias:
                    update_bias(gate, load, tr["bias_update_gamma"])
            st["loads"].append(step_loads)

        losses, norms = adamw_steps(list(model.parameters()), tr, forward, after_step)
        final_bias = {f"{n}.e_score_correction_bias": g.e_score_correction_bias.tolist()
                      for n, g in self.gates(model)} if self.router_bias else {}
        return dict(losses=losses, grad_norms=norms, loads=st["loads"], final_bias=final_bias,
                    margin=st["margin"], zero_mask_diff=st["zdiff"], routes0=st["routes0"])

    # ---- checkpoints ----
    def checkpoint_state(self, model):
        sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if model.config.tie_word_embeddings:
            sd.pop("lm_head.weight", None)
        return to_checkpoint_names(sd, model.config)

    def release_extra(self, cfg):
        """Keys the release's config.json holds besides release_keys and the rope ones."""
        return {}

    def config_json(self, cfg, style):
        """Style "hf5": what transformers 5 save_pretrained writes (rope_parameters{rope_type, ...});
        otherwise like the release (rope_theta + rope_scaling{type: yarn} or null)."""
        if style == "hf5":
            j = json.loads(cfg.to_json_string())         # the diff-to-defaults form save_pretrained writes
            j.update(architectures=[self.architecture], dtype="float32")
            return j
        j = {"architectures": [self.architecture], "model_type": self.model_type}
        for k in self.release_keys:
            j[k] = getattr(cfg, k)
        j.update(self.release_extra(cfg))
        rp = dict(cfg.rope_parameters)
        j["rope_theta"] = rp.pop("rope_theta")
        j["rope_scaling"] = None if rp["rope_type"] == "default" else dict({"type": rp.pop("rope_type")}, **rp)
        j["torch_dtype"] = "float32"
        return j

    def write_model(self, model, style, d):
        write_checkpoint(d, self.config_json(model.config, style), self.checkpoint_state(model))

    def load_model(self, d):
        model = from_pretrained(self.model_class, d)
        self.configure(model)
        return model

    def verify_fields(self, cfg):
        """Config attributes that must read back unchanged."""
        return ()

    def verify_checkpoint(self, model, style, d, batch, tr):
        """Our per-expert names == what save_pretrained writes; the reload has the same routing
        fields and rope and gives bit-identical logits."""
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp)
            theirs, ours = load_file(os.path.join(tmp, "model.safetensors")), self.checkpoint_state(model)
            assert set(theirs) == set(ours), (set(theirs) ^ set(ours))
            for k in ours:
                assert torch.equal(theirs[k], ours[k]), k
        re = self.load_model(d)
        for k in self.verify_fields(model.config):
            a, b = getattr(re.config, k), getattr(model.config, k)
            assert a == b, (k, a, b)
        assert rope_params(re.config) == rope_params(model.config), \
            (re.config.rope_parameters, model.config.rope_parameters)
        model.eval(), re.eval()
        with torch.no_grad():
            a = model(input_ids=batch["ids"]).logits
            b = re(input_ids=batch["ids"]).logits
        assert torch.equal(a, b), (a - b).abs().max()
        model.train()

    # ---- dumps ----
    def write_case(self, name, spec, out_root):
        """The first seed from spec["seed"] whose selections keep a margin >= MARGIN_MIN over the
        training steps (and, with spec["bf16_same_routes"], whose bf16-weights run selects the same
        experts at step 0); writes out_root/name/{model/, batch.json, expected.*}."""
        tr = dict(self.train_default, **spec.get("train", {}))
        margin_min = spec.get("margin_min", MARGIN_MIN)
        for seed in range(spec["seed"], spec["seed"] + self.seed_tries):
            model, batch = self.build_case(spec, seed)
            if self.first_margin(model, batch, tr) < margin_min:     # prescreen: one forward
                continue
            ref, grads = self.reference_grads(model, batch, tr)
            trained = self.train(self.build_case(spec, seed)[0], batch, tr)
            if trained["margin"] < margin_min:
                print(f"  {name}: seed {seed} has routing margin {trained['margin']:.2e}, trying next")
                continue
            yard = {p: self.train(self.build_case(spec, seed)[0], batch, tr, p) for p in YARDSTICKS}
            flips = {p: {n: route_flips(ref["routes"][n]["idx"], y["routes0"][n]) for n in ref["routes"]}
                     for p, y in yard.items()}
            if spec.get("bf16_same_routes") and any(flips["bf16_weights"].values()):
                print(f"  {name}: seed {seed}: bf16 weights flip step-0 selections {flips['bf16_weights']}, trying next")
                continue
            break
        else:
            raise RuntimeError(f"{name}: no seed with routing margin >= {margin_min}")
        d = os.path.join(out_root, name)
        shutil.rmtree(d, ignore_errors=True)
        self.write_model(model, spec.get("style"), os.path.join(d, "model"))
        self.verify_checkpoint(model, spec.get("style"), os.path.join(d, "model"), batch, tr)
        write_batch(batch, os.path.join(d, "batch.json"))
        t = {"loss": ref["loss"].double().reshape(1), "ce_loss": ref["ce"].double().reshape(1),
             "aux_loss": ref["aux"].double().reshape(1)}
        if "mtp" in ref:
            t["mtp_loss"] = ref["mtp"].double().reshape(1)
        if self.dump_logits_and_routes:
            t["logits"] = ref["logits"].float().contiguous()
            for rname, rec in ref["routes"].items():
                t[f"route.{rname}.topk_indices"] = rec["idx"].sort(dim=-1)[0].to(torch.int32).contiguous()
        t.update({f"grad.{k}": v.float().contiguous() for k, v in grads.items()})
        values = {"case": name, "seed": seed, "loss": ref["loss"].item(), "ce_loss": ref["ce"].item(),
                  "aux_loss": ref["aux"].item(), "mtp_loss": ref["mtp"].item() if "mtp" in ref else None,
                  "train": tr, "losses": trained["losses"], "grad_norms": trained["grad_norms"],
                  "final_bias": trained["final_bias"], "loads": trained["loads"],
                  "routing_min_margin": trained["margin"], "zero_mask_would_differ": trained["zero_mask_diff"],
                  "losses_bf16_autocast": yard["bf16_autocast"]["losses"],
                  "losses_bf16_weights": yard["bf16_weights"]["losses"],
                  "route_flips_bf16": flips["bf16_weights"], "versions": versions()}
        size = write_expected(d, t, {k: values[k] for k in self.expected_keys})
        parts = f"ce {ref['ce'].item():.6f} aux {ref['aux'].item():.6f}" + \
            (f" mtp {ref['mtp'].item():.6f}" if "mtp" in ref else "")
        print(f"{name}: seed {seed} params {sum(p.numel() for p in model.parameters())} "
              f"loss {ref['loss'].item():.6f} ({parts}) "
              f"losses {trained['losses'][0]:.4f}->{trained['losses'][-1]:.4f} "
              f"margin {trained['margin']:.2e}"
              + (f" zero-mask-diff {trained['zero_mask_diff']}" if "zero_mask_would_differ" in self.expected_keys else "")
              + f" size {size / 1e3:.0f} kB")
        print_yardsticks(yard, trained["losses"], flips)

    # ---- --check ----
    random_spec = None   # (self, rng) -> spec of a random configuration; None: no --random

    def write_random_case(self, spec, d, tr):
        """Re-seeds spec until its first forward has no near-tie, writes the case folder d."""
        while True:
            model, batch = self.build_case(spec, spec["seed"])
            if self.first_margin(model, batch, tr) >= CHECK_MARGIN:
                break
            spec["seed"] += 1
        self.write_model(model, spec.get("style"), os.path.join(d, "model"))
        write_batch(batch, os.path.join(d, "batch.json"))
        with open(os.path.join(d, "spec.json"), "w") as f:
            json.dump(spec, f, indent=1)
        self.verify_checkpoint(model, spec.get("style"), os.path.join(d, "model"), batch, tr)

    def check_case(self, name, d, exp, tr, args, work, rows):
        """Live reference (from_pretrained of d/model) vs `trex grad`: loss 1e-5, gradients 1e-4."""
        batch = read_batch(os.path.join(d, "batch.json"))
        model = self.load_model(os.path.join(d, "model"))
        ref, grads = self.reference_grads(model, batch, tr)
        loss = ref["loss"].item()
        if exp is not None and abs(loss - exp["loss"]) > 1e-5 * abs(exp["loss"]):
            print(f"warning: {name}: live loss {loss} != committed {exp['loss']}")
        tj, tg, err = run_trex(args.trex, d, trex_flags(tr), os.path.join(work, name + ".grads.safetensors"))
        if err is not None:
            rows.append((name, "trex", "-", "-", math.inf, 0.0, False))
            print(f"{name}: trex failed: {err}")
            return False
        return compare(name, loss, grads, float(tj["loss"]), tg, rows)


def check(fam, args):
    """--check: the committed cases (args.cases) and args.random random configurations."""
    rows, failed, jobs = [], [], []
    work = tempfile.mkdtemp(prefix=f"trex_check_{fam.tag}_")
    for name in args.cases:
        d = os.path.join(DATA, name)
        with open(os.path.join(d, "expected.json")) as f:
            exp = json.load(f)
        jobs.append((name, d, None, exp, exp["train"]))
    rng = torch.Generator().manual_seed(args.seed)
    for i in range(args.random):
        spec = fam.random_spec(rng)
        jobs.append((f"{fam.random_prefix}{i}", None, spec, None, dict(fam.train_default, **spec["train"])))
    for name, d, spec, exp, tr in jobs:
        if spec is not None:                       # random config: write a fresh case folder
            d = os.path.join(work, name)
            fam.write_random_case(spec, d, tr)
        if not fam.check_case(name, d, exp, tr, args, work, rows):
            failed.append(name)
    print_rows(rows, args.verbose)
    print(f"{len(jobs) - len(failed)}/{len(jobs)} cases passed" + (f"; failed: {failed}" if failed else ""))
    if failed:
        print(f"(inputs kept in {work})")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


def main(fam, doc):
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DATA, help="dump folder (default tests/reference/data)")
    ap.add_argument("--cases", nargs="+", default=list(fam.cases), choices=list(fam.cases))
    ap.add_argument("--check", action="store_true", help="compare live PyTorch with `trex grad`")
    ap.add_argument("--trex", default="build/trex", help="trex binary for --check")
    if fam.random_spec is not None:
        ap.add_argument("--random", type=int, default=0, help="--check: number of extra random configs")
        ap.add_argument("--seed", type=int, default=12345, help="--check: seed of the random configs")
    ap.add_argument("--verbose", action="store_true", help="--check: print every gradient row")
    args = ap.parse_args()
    if args.check:
        args.random = getattr(args, "random", 0)
        args.seed = getattr(args, "seed", 0)
        sys.exit(check(fam, args))
    for name in args.cases:
        fam.write_case(name, fam.cases[name], args.out)
