#!/usr/bin/env python3
"""Independent PyTorch reference for trex's DeepSeek-V4 CSA indexer loss (see
tests/reference/README.md, "DeepSeek-V4 indexer loss cases"; docs/V4.md, "Indexer loss").

The model is transformers' DeepseekV4ForCausalLM (make_dumps_v4.py: config, init, checkpoint
writing, the router / indexer recorder; the AdamW loop and writers of dumplib.py). The loss is
built here on its modules, per CSA layer: the main attention's probabilities (transformers' eager
attention, recorded, detached) on the compressed entries S_t the query attends (the indexer's top-k
in the "sparse" stage; every visible entry in "dense_warmup", where the indexer returns every valid
entry so the CSA attention is dense over them), summed over heads and L1-normalized over S_t (the
sliding keys and the sink are left out); the indexer's scores recomputed with gradient from its
detached inputs (hidden states and q_residual) through its own compressor (kv_proj, gate_proj,
position_bias, kv_norm, RoPE), q_b_proj, RoPE and scorer.weights_proj; loss_t = KL(p_t || softmax
over S_t of the scores), mean over the B T queries, summed over the CSA layers; total = CE + weight
x indexer loss. Sparse: every tensor trains (the LM loss reaches the model, the indexer loss only
the indexer); dense_warmup: only the indexer trains (no router-bias update). Recall: the main
attention's mass on the visible compressed entries V_t inside the indexer's top-k (dense: sum of p
over it; sparse: exp(lse_h(S_t) - lse_h(V_t)) of the attention scores, mean over heads; 1 where V_t
is empty), mean over queries and CSA layers.

Writes per case tests/reference/data/v4idx_<name>/{model/, batch.json, expected.safetensors,
expected.json} in the format of the other cases, expected.json's "train" holding
indexer_loss_weight and indexer_stage.

  .venv/bin/python tests/reference/make_dumps_v4idx.py                    # regenerate the dumps
  .venv/bin/python tests/reference/make_dumps_v4idx.py --check --trex build/trex
"""
import argparse
import json
import math
import os
import shutil
import sys
import tempfile

import torch
import torch.nn.functional as F
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as hf4

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dumplib  # noqa: E402
import make_dumps_v4 as v4  # noqa: E402

CSA, HCA, SWA = v4.CSA, v4.HCA, v4.SWA

CASES = {
    "v4idx_sparse_odd": dict(     # sparse stage: CSA rate 3, top-3, 3 hc streams, two CSA layers
        stage="sparse", weight=0.7, seed=9101, B=2, T=47, router_gain=4.0,
        model=dict(vocab_size=89, hidden_size=30, num_hidden_layers=3, num_attention_heads=5,
                   head_dim=14, partial_rotary_factor=0.3, q_lora_rank=17, o_groups=5, o_lora_rank=7,
                   layer_types=[CSA, HCA, CSA], mlp_layer_types=["hash_moe", "moe", "moe"],
                   compress_rates={CSA: 3, HCA: 11}, index_n_heads=7, index_head_dim=10, index_topk=3,
                   sliding_window=5, hc_mult=3, hc_sinkhorn_iters=5, hc_eps=1e-3, rms_norm_eps=1e-5,
                   n_routed_experts=7, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=13,
                   scoring_func="sqrtsoftplus", routed_scaling_factor=1.5, swiglu_limit=1.9,
                   rope_theta=20000.0, compress_rope_theta=4000.0, max_position_embeddings=200,
                   rope_parameters=dict(rope_type="yarn", factor=2.5, original_max_position_embeddings=47,
                                        beta_fast=11, beta_slow=1)),
        train=dict(bias_update_gamma=0.008, eps=1e-6)),
    "v4idx_dense_rate5": dict(    # dense warm-up: CSA rate 5, top-5, 2 hc streams
        stage="dense_warmup", weight=1.3, seed=9201, B=2, T=53, router_gain=4.0,
        model=dict(vocab_size=83, hidden_size=26, num_hidden_layers=2, num_attention_heads=3,
                   head_dim=12, partial_rotary_factor=0.34, q_lora_rank=11, o_groups=3, o_lora_rank=5,
                   layer_types=[SWA, CSA], mlp_layer_types=["hash_moe", "moe"],
                   compress_rates={CSA: 5, HCA: 13}, index_n_heads=9, index_head_dim=8, index_topk=5,
                   sliding_window=7, hc_mult=2, hc_sinkhorn_iters=7, hc_eps=1e-3, rms_norm_eps=1e-6,
                   n_routed_experts=5, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=11,
                   scoring_func="sigmoid", routed_scaling_factor=2.0, swiglu_limit=1.7,
                   rope_theta=10000.0, compress_rope_theta=3000.0, max_position_embeddings=200,
                   rope_parameters=dict(rope_type="yarn", factor=3.0, original_max_position_embeddings=53,
                                        beta_fast=13, beta_slow=1)),
        train=dict(bias_update_gamma=0.01, eps=1e-8)),
}
SEED_TRIES = 60

STATE = dict(dense=False)

# The indexer: in the dense warm-up it returns every valid entry (index_topk = the entry count,
# invalid ones -1 as transformers marks them); its inputs are recorded for the loss.
V4_INDEX = hf4.DeepseekV4Indexer.forward


def index(self, hidden_states, q_residual, position_ids, cache, layer_idx):
    k0 = self.index_topk
    if STATE["dense"]:
        self.index_topk = hidden_states.shape[1]
    try:
        out = V4_INDEX(self, hidden_states, q_residual, position_ids, cache, layer_idx)
    finally:
        self.index_topk = k0
    self.trex_in = dict(x=hidden_states.detach(), q=q_residual.detach(), pos=position_ids)
    return out


hf4.DeepseekV4Indexer.forward = index

# transformers' eager attention, recording its queries, keys, mask and probabilities (detached).
HF_EAGER = hf4.eager_attention_forward


def eager(module, query, key, value, attention_mask, scaling, dropout=0.0, **kw):
    out, w = HF_EAGER(module, query, key, value, attention_mask, scaling, dropout, **kw)
    module.trex_att = dict(q=query.detach(), k=key.detach(), w=w.detach(), scaling=scaling,
                           mask=attention_mask.detach())
    return out, w


hf4.eager_attention_forward = eager


def index_scores(ix, x, qr, pos):
    """The indexer's scores [B, S, n] with gradient (transformers' DeepseekV4Indexer math, no cache)
    and the top-k selection it makes (index_topk of the valid entries)."""
    B, S, _ = x.shape
    m, dI = ix.compress_rate, ix.head_dim
    kv, gate = ix.kv_proj(x), ix.gate_proj(x)
    n = S // m
    kv = kv[:, :n * m].view(B, n, m, -1)
    gate = gate[:, :n * m].view(B, n, m, -1) + ix.position_bias
    nk = kv.new_zeros((B, n, 2 * m, dI))
    ng = gate.new_full((B, n, 2 * m, dI), float("-inf"))
    nk[:, :, m:] = kv[..., dI:]
    ng[:, :, m:] = gate[..., dI:]
    if n > 1:
        nk[:, 1:, :m] = kv[:, :-1, :, :dI]
        ng[:, 1:, :m] = gate[:, :-1, :, :dI]
    c = ix.kv_norm((nk * ng.softmax(dim=2)).sum(dim=2))
    cpos = (torch.arange(n) * m).unsqueeze(0).expand(B, -1)
    cos, sin = ix.rotary_emb(c, position_ids=cpos, layer_type="compress")
    c = hf4.apply_rotary_pos_emb(c.unsqueeze(1), cos, sin).squeeze(1)
    cq, sq = ix.rotary_emb(x, position_ids=pos, layer_type="compress")
    q = ix.q_b_proj(qr).view(B, S, -1, dI).transpose(1, 2)
    q = hf4.apply_rotary_pos_emb(q, cq, sq).transpose(1, 2)
    return ix.scorer(q, c, x)                                              # [B, S, n]


def layer_loss(attn, dense):
    """(KL loss: mean over queries, recall: mean over queries) of one CSA layer."""
    ix, att = attn.compressor.indexer, attn.trex_att
    rec = ix.trex_in
    I = index_scores(ix, rec["x"], rec["q"], rec["pos"])                   # [B, S, n]
    B, S, n = I.shape
    m = ix.compress_rate
    thr = ((rec["pos"] + 1) // m).clamp(max=n)                             # [B, S] valid entries
    valid = (torch.arange(n).view(1, 1, -1) < thr.unsqueeze(-1)).expand(B, S, n)  # [B, S, n]
    assert n > 0 and att["mask"].shape[-1] == S + n, att["mask"].shape
    A = (att["mask"][:, 0, :, S:] == 0) & valid                           # [B, S, n] attended entries
    p = att["w"][..., S:].sum(1).double() * A                             # heads summed, detached
    psum = p.sum(-1, keepdim=True)
    p = torch.where(psum > 0, p / psum.clamp_min(1e-300), p)
    logq = torch.log_softmax(I.double().masked_fill(~A, -math.inf), dim=-1)
    use = A & (p > 0)
    kl = torch.where(use, p * (torch.log(p.clamp_min(1e-300)) - logq.masked_fill(~use, 0.0)), 0.0).sum(-1)
    with torch.no_grad():
        k = min(ix.index_topk, n)
        top = I.masked_fill(~valid, -math.inf).topk(k, dim=-1).indices if k else None
        sel = torch.zeros_like(valid).scatter(-1, top, True) & valid if k else valid
        if dense:
            r = (p * sel).sum(-1)
        else:
            s = torch.matmul(att["q"].double(), att["k"][:, :, S:].double().transpose(2, 3)) * att["scaling"]
            lse_v = s.masked_fill(~valid.unsqueeze(1), -math.inf).logsumexp(-1)
            lse_s = s.masked_fill(~(sel & A).unsqueeze(1), -math.inf).logsumexp(-1)
            r = torch.exp(lse_s - lse_v).mean(1)
        r = torch.where(valid.any(-1), r, torch.ones_like(r))
    return kl.mean(), r.mean().item()


def csa_layers(model):
    return [l.self_attn for l in model.model.layers if isinstance(l.self_attn.compressor, hf4.DeepseekV4CSACompressor)]


def forward_loss(model, batch, weight, dense):
    """(total, ce, indexer, recall, lm): lm = the V4 forward's loss (CE); total = lm + weight x indexer."""
    STATE["dense"] = dense
    try:
        res = v4.forward_all(model, batch, 0.0)
    finally:
        STATE["dense"] = False
    parts = [layer_loss(a, dense) for a in csa_layers(model)]
    idx = sum(p[0] for p in parts)
    recall = sum(p[1] for p in parts) / len(parts)
    return res["loss"] + weight * idx.float(), res["ce"], idx, recall, res["loss"]


def is_indexer(name):
    return ".compressor.indexer." in name


def reference(model, batch, weight, dense):
    model.train()
    model.zero_grad(set_to_none=True)
    rec = recorder(model, dense)
    total, ce, idx, recall, _ = forward_loss(model, batch, weight, dense)
    ((weight * idx).float() if dense else total).backward()
    margin = margins(rec)
    rec.remove()
    grads = {nm: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().clone()
             for nm, p in v4.trained_params(model, 0.0)}
    return total.detach(), ce.detach(), idx.detach(), recall, grads, margin


def recorder(model, dense):
    """make_dumps_v4's Recorder; in the dense warm-up without its indexer hooks (the indexer returns
    every valid entry there, the selection feeds only the recall)."""
    rec = v4.Recorder(model)
    if dense:
        ng = len(v4.moe_gates(model))
        for h in rec.handles[ng:]:
            h.remove()
        rec.handles = rec.handles[:ng]
    return rec


def margins(rec):
    snap = v4.snapshot(rec)
    return min([r["margin"] for r in snap["gates"].values()] + [r["margin"] for r in snap["index"].values()] +
               [math.inf])


def train(model, batch, tr, weight, dense, prec="fp32"):
    """tr["steps"] AdamW steps (dense warm-up: the indexer's tensors only, no router-bias update)."""
    params = [p for nm, p in v4.trained_params(model, 0.0) if not dense or is_indexer(nm)]
    rec = recorder(model, dense)
    ctx = v4.precision_context(model, prec)
    st = dict(losses=[], indexer_losses=[], recalls=[], margins=[])

    def forward():
        with ctx():
            total, _, idx, recall, _ = forward_loss(model, batch, weight, dense)
        st["losses"].append(total.item())
        st["indexer_losses"].append(idx.item())
        st["recalls"].append(recall)
        return (weight * idx).float() if dense else total

    def after_step():
        st["margins"].append(margins(rec))
        if dense:
            return
        snap = v4.snapshot(rec)
        for name, gate, is_hash in v4.run_gates(model, 0.0):
            if not is_hash:
                load = torch.bincount(snap["gates"][name]["idx"].flatten(), minlength=gate.num_experts).float()
                dumplib.update_bias(gate, load, tr["bias_update_gamma"])

    dumplib.adamw_steps(params, tr, forward, after_step)
    rec.remove()
    final_bias = {f"{nm}.e_score_correction_bias": g.e_score_correction_bias.tolist()
                  for nm, g, is_hash in v4.run_gates(model, 0.0) if not is_hash}
    clean = next((i for i, x in enumerate(st["margins"]) if x < dumplib.MARGIN_MIN), len(st["margins"]))
    return dict(st, final_bias=final_bias, clean_steps=clean)


def build_case(spec, seed):
    return v4.build_case(spec, seed)


def write_case(name, spec, out_root):
    tr = dict(v4.TRAIN_DEFAULT, **spec.get("train", {}))
    dense, weight = spec["stage"] == "dense_warmup", spec["weight"]
    best = None
    for seed in range(spec["seed"], spec["seed"] + SEED_TRIES):   # the seed with the longest clean run
        model, batch = build_case(spec, seed)
        with torch.no_grad():
            rec = recorder(model, dense)
            forward_loss(model, batch, weight, dense)
            m0 = margins(rec)
            rec.remove()
        if m0 < dumplib.MARGIN_MIN:
            continue
        trained = train(build_case(spec, seed)[0], batch, tr, weight, dense)
        if best is None or trained["clean_steps"] > best[1]["clean_steps"]:
            best = (seed, trained)
        print(f"  {name}: seed {seed}: {trained['clean_steps']} clean steps", flush=True)
        if trained["clean_steps"] >= tr["steps"]:
            break
    if best is None:
        raise RuntimeError(f"{name}: no seed with first-forward margin >= {dumplib.MARGIN_MIN}")
    seed, trained = best
    model, batch = build_case(spec, seed)
    total, ce, idx, recall, grads, _ = reference(model, batch, weight, dense)
    yard = {p: train(build_case(spec, seed)[0], batch, tr, weight, dense, p) for p in dumplib.YARDSTICKS}
    d = os.path.join(out_root, name)
    shutil.rmtree(d, ignore_errors=True)
    v4.write_model(model, os.path.join(d, "model"))
    v4.verify_checkpoint(model, os.path.join(d, "model"), batch, 0.0)
    dumplib.write_batch(batch, os.path.join(d, "batch.json"))
    t = {"loss": total.double().reshape(1), "ce_loss": ce.double().reshape(1),
         "aux_loss": torch.zeros(1, dtype=torch.float64), "indexer_loss": idx.double().reshape(1)}
    t.update({f"grad.{k}": v.float().contiguous() for k, v in grads.items()})
    tr = dict(tr, aux_loss_alpha=0.0, indexer_loss_weight=weight, indexer_stage=spec["stage"])
    exp = {"case": name, "seed": seed, "loss": total.item(), "ce_loss": ce.item(), "aux_loss": 0.0,
           "indexer_loss": idx.item(), "indexer_recall": recall, "train": tr, "losses": trained["losses"],
           "indexer_losses": trained["indexer_losses"], "indexer_recalls": trained["recalls"],
           "final_bias": trained["final_bias"], "step_min_margins": trained["margins"],
           "margin_required": dumplib.MARGIN_MIN, "parity_steps": trained["clean_steps"],
           "losses_bf16_autocast": yard["bf16_autocast"]["losses"],
           "losses_bf16_weights": yard["bf16_weights"]["losses"],
           "versions": dumplib.versions()}
    size = dumplib.write_expected(d, t, exp)
    print(f"{name}: seed {seed} loss {total.item():.6f} (ce {ce.item():.6f} indexer {idx.item():.6f} recall "
          f"{recall:.4f}) losses {trained['losses'][0]:.4f}->{trained['losses'][-1]:.4f} indexer "
          f"{trained['indexer_losses'][0]:.4f}->{trained['indexer_losses'][-1]:.4f} clean steps "
          f"{trained['clean_steps']} size {size / 1e3:.0f} kB", flush=True)


# --------------------------------------------------------------------------------------------
# --check: live reference vs `trex grad --indexer-loss-weight W --indexer-stage S`.
# --------------------------------------------------------------------------------------------
def trex_flags(tr):
    return ["--indexer-loss-weight", repr(tr["indexer_loss_weight"]), "--indexer-stage", tr["indexer_stage"]] + \
        dumplib.trex_flags(tr)


def check(args):
    rows, failed = [], []
    work = tempfile.mkdtemp(prefix="trex_check_v4idx_")
    for name in args.cases:
        d = os.path.join(dumplib.DATA, name)
        with open(os.path.join(d, "expected.json")) as f:
            exp = json.load(f)
        tr = exp["train"]
        batch = dumplib.read_batch(os.path.join(d, "batch.json"))
        model = v4.load_model(os.path.join(d, "model"))
        weight, stage = tr["indexer_loss_weight"], tr["indexer_stage"]
        total, _, idx, _, grads, _ = reference(model, batch, weight, stage == "dense_warmup")
        if abs(total.item() - exp["loss"]) > 1e-5 * abs(exp["loss"]):
            print(f"warning: {name}: live loss {total.item()} != committed {exp['loss']}")
        tj, tg, err = dumplib.run_trex(args.trex, d, trex_flags(tr), os.path.join(work, name + ".grads.safetensors"))
        if err is not None:
            print(f"{name}: trex failed: {err}")
            failed.append(name)
            continue
        ok = dumplib.compare(name, total.item(), grads, float(tj["loss"]), tg, rows)
        ierr = abs(float(tj["indexer"]) - idx.item()) / max(abs(idx.item()), 1e-30)
        rows.append((name, "indexer_loss", f"{idx.item():.7g}", f"{float(tj['indexer']):.7g}", ierr, 1e-5,
                     ierr <= 1e-5))
        if not ok or ierr > 1e-5:
            failed.append(name)
    w = max([len(r[1]) for r in rows] + [12])
    for c, k, a, b, e, _, good in rows:
        if args.verbose or not good or k in ("loss", "indexer_loss") or is_indexer(k):
            print(f"{c:<20} {k:<{w}} {a:>12} {b:>12} {e:>10.2e}  {'ok' if good else 'FAIL'}")
    for name in args.cases:
        rs = [r for r in rows if r[0] == name and r[1] not in ("loss", "indexer_loss")]
        ix = [r for r in rs if is_indexer(r[1])]
        if rs:
            print(f"{name}: {len(rs)} gradients, max rel err {max(r[4] for r in rs):.2e} "
                  f"(indexer: {max([r[4] for r in ix] + [0]):.2e})")
    print(f"{len(args.cases) - len(failed)}/{len(args.cases)} cases passed" + (f"; failed: {failed}" if failed else ""))
    shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=dumplib.DATA, help="dump folder (default tests/reference/data)")
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--check", action="store_true", help="compare live transformers with `trex grad`")
    ap.add_argument("--trex", default="build/trex", help="trex binary for --check")
    ap.add_argument("--verbose", action="store_true", help="--check: print every gradient row")
    args = ap.parse_args()
    if args.check:
        sys.exit(check(args))
    for name in args.cases:
        write_case(name, CASES[name], args.out)


if __name__ == "__main__":
    main()
