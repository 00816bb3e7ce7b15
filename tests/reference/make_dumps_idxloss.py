#!/usr/bin/env python3
"""Independent PyTorch reference for trex's DeepSeek-V3.2 lightning-indexer loss (see
tests/reference/README.md, "DeepSeek-V3.2 indexer loss cases"; docs/V32.md, "Indexer loss").

The model is transformers' DeepseekV32ForCausalLM (make_dumps_v32.py's family V32: build, init, the
CE + aux forward, checkpoint writing; the AdamW loop and writers of dumplib.py). The loss is built
here on its modules: per layer, the main attention's probabilities
(transformers' eager attention, recorded, detached) summed over heads and L1-normalized over the
attended keys A_t (the indexer's top-k in the "sparse" stage; every causal key in "dense_warmup",
where the indexer returns every key so the attention is dense); the indexer's scores recomputed
with gradient from its detached inputs (hidden states and q_resid) through its own wq_b, wk,
k_norm, weights_proj and RoPE; loss_t = KL(p_t || softmax over A_t of the scores), mean over the
queries, summed over layers; total = CE + aux + weight x indexer loss. Sparse: every tensor trains
(the LM loss reaches the model, the indexer loss only the indexer); dense_warmup: only the
indexer trains (no router-bias update). Recall: the main attention's mass inside the indexer's
top-k (dense: sum of p over it; sparse: the dense softmax's mass on the selection, mean over
heads), mean over queries and layers.

Writes per case tests/reference/data/v32idx_<name>/{model/, batch.json, expected.safetensors,
expected.json} in the format of the other cases, expected.json's "train" holding
indexer_loss_weight and indexer_stage.

  .venv/bin/python tests/reference/make_dumps_idxloss.py                    # regenerate the dumps
  .venv/bin/python tests/reference/make_dumps_idxloss.py --check --trex build/trex [--random 6]
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
from transformers.models.deepseek_v32 import modeling_deepseek_v32 as hf32

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dumplib  # noqa: E402
import make_dumps_v32 as v32  # noqa: E402  (patches transformers' router and indexer to record)

FAM = v32.V32()   # the V3.2 family: build, init, forward (CE + aux), gradients, checkpoints, bf16

CASES = {
    "v32idx_sparse_yarn": dict(   # sparse stage: top-5 of 13, YaRN, 10 experts in 2 groups
        stage="sparse", weight=0.7, seed=7107, style="hf5", B=2, T=13,
        model=dict(v32.CASES["v32_topk_yarn"]["model"]),
        train=dict(bias_update_gamma=0.01, aux_loss_alpha=0.0)),
    "v32idx_dense_tied": dict(    # dense warm-up: every layer MoE, tied embeddings, aux loss
        stage="dense_warmup", weight=1.3, seed=8108, style="release", B=2, T=11,
        model=dict(v32.CASES["v32_release_tied"]["model"]),
        train=dict(bias_update_gamma=0.01, aux_loss_alpha=0.01)),
}

STATE = dict(dense=False)

# The indexer (make_dumps_v32's recording wrapper of transformers' forward): in the dense warm-up
# it returns every key (index_topk = T: the attention keeps its causal mask only); its inputs are
# recorded for the loss.
V32_INDEX = hf32.DeepseekV32Indexer.forward


def index(self, hidden_states, q_resid, position_embeddings, attention_mask, position_ids, cache=None, **kw):
    k0 = self.index_topk
    if STATE["dense"]:
        self.index_topk = hidden_states.shape[1]
    try:
        out = V32_INDEX(self, hidden_states, q_resid, position_embeddings, attention_mask, position_ids,
                        cache=cache, **kw)
    finally:
        self.index_topk = k0
    self.trex_in = dict(x=hidden_states.detach(), q=q_resid.detach(),
                        cos=position_embeddings[0].detach(), sin=position_embeddings[1].detach(),
                        mask=attention_mask.detach(), sel=out)
    return out


hf32.DeepseekV32Indexer.forward = index

# transformers' eager attention, recording its queries, keys and probabilities (detached).
HF_EAGER = hf32.eager_attention_forward


def eager(module, query, key, value, attention_mask, scaling, dropout=0.0, **kw):
    out, w = HF_EAGER(module, query, key, value, attention_mask, scaling, dropout, **kw)
    module.trex_att = dict(q=query.detach(), k=key.detach(), w=w.detach(), scaling=scaling)
    return out, w


hf32.eager_attention_forward = eager


def index_scores(ix, x, qr, cos, sin):
    """The indexer's score [B, S, T] with gradient (transformers' DeepseekV32Indexer math)."""
    B, S, _ = x.shape
    dr, nI, dI = ix.qk_rope_head_dim, ix.n_heads, ix.head_dim
    q = ix.wq_b(qr).view(B, S, nI, dI)
    q_rot, q_pass = torch.split(q, [dr, dI - dr], dim=-1)
    k = ix.k_norm(ix.wk(x)).unsqueeze(2)
    k_rot, k_pass = torch.split(k, [dr, dI - dr], dim=-1)
    q_rot, k_rot = hf32.apply_rotary_pos_emb(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
    q = torch.cat([q_rot, q_pass], dim=-1)
    k = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
    sc = F.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * ix.softmax_scale)
    w = ix.weights_proj(x).float() * (nI ** -0.5)
    return torch.matmul(w.unsqueeze(-2), sc).squeeze(-2)


def layer_loss(layer, dense):
    """(KL loss: mean over queries, recall: mean over queries) of one decoder layer."""
    ix, att = layer.self_attn.indexer, layer.self_attn.trex_att
    rec = ix.trex_in
    m = rec["mask"]
    valid = m if m.dtype == torch.bool else (m == 0)                       # [B, S, T] causal
    B, S, T = valid.shape
    I = index_scores(ix, rec["x"], rec["q"], rec["cos"], rec["sin"])       # [B, S, T]
    if dense:
        A = valid
    else:
        A = torch.zeros_like(valid).scatter(-1, rec["sel"].long(), True) & valid
    p = (att["w"].sum(1) * A).double()                                     # heads summed, detached
    p = p / p.sum(-1, keepdim=True)
    logq = torch.log_softmax(I.double().masked_fill(~A, -math.inf), dim=-1)
    use = A & (p > 0)
    kl = torch.where(use, p * (torch.log(p.clamp_min(1e-300)) - logq.masked_fill(~use, 0.0)), 0.0).sum(-1)
    with torch.no_grad():
        if dense:
            k = min(ix.index_topk, T)
            top = I.masked_fill(~valid, -math.inf).topk(k, dim=-1).indices
            sel = torch.zeros_like(valid).scatter(-1, top, True) & valid
            recall = (p * sel).sum(-1).mean()
        else:
            s = torch.matmul(att["q"].double(), att["k"].double().transpose(2, 3)) * att["scaling"]  # [B, H, S, T]
            lse_all = s.masked_fill(~valid.unsqueeze(1), -math.inf).logsumexp(-1)
            lse_sel = s.masked_fill(~A.unsqueeze(1), -math.inf).logsumexp(-1)
            recall = torch.exp(lse_sel - lse_all).mean(1).mean()
    return kl.mean(), recall


def forward_loss(model, batch, alpha, weight, dense):
    """(total, ce, aux, indexer, recall, lm, routes): lm = ce + aux (the V3.2 family's forward);
    total = lm + weight x indexer."""
    STATE["dense"] = dense
    try:
        res = FAM.forward(model, batch, dict(aux_loss_alpha=alpha))
    finally:
        STATE["dense"] = False
    parts = [layer_loss(l, dense) for l in model.model.layers]
    idx = sum(p[0] for p in parts)
    recall = sum(float(p[1]) for p in parts) / len(parts)
    return res["loss"] + weight * idx.float(), res["ce"], res["aux"], idx, recall, res["loss"], res["routes"]


def selection_margin(model):
    """Smallest router / indexer top-k gap of the last forward."""
    return FAM.margin(model, {n: g.trex_record for n, g in FAM.gates(model)})


def is_indexer(name):
    return ".self_attn.indexer." in name


def reference(model, batch, alpha, weight, dense):
    model.train()
    model.zero_grad(set_to_none=True)
    total, ce, aux, idx, recall, lm, _ = forward_loss(model, batch, alpha, weight, dense)
    # Dense warm-up: only the indexer learns (from its loss); sparse: everything, from the total.
    ((weight * idx).float() if dense else total).backward()
    return total.detach(), ce.detach(), aux.detach(), idx.detach(), recall, FAM.grads(model)


def train(model, batch, tr, weight, dense, prec="fp32"):
    """tr["steps"] AdamW steps (dense warm-up: the indexer's tensors only, no router-bias update).
    Returns dict(losses (total), indexer_losses, recalls, margin, final_bias)."""
    params = [p for n, p in model.named_parameters() if not dense or is_indexer(n)]
    ctx = FAM.precision_context(model, prec)
    st = dict(losses=[], indexer_losses=[], recalls=[], margin=math.inf, routes=None)

    def forward():
        with ctx():
            total, _, _, idx, recall, _, st["routes"] = forward_loss(model, batch, tr["aux_loss_alpha"], weight, dense)
        st["losses"].append(total.item())
        st["indexer_losses"].append(idx.item())
        st["recalls"].append(recall)
        return (weight * idx).float() if dense else total

    def after_step():
        st["margin"] = min(st["margin"], selection_margin(model))
        if not dense:
            for name, gate in FAM.gates(model):
                load = torch.bincount(st["routes"][name]["idx"].flatten(), minlength=gate.num_experts).float()
                dumplib.update_bias(gate, load, tr["bias_update_gamma"])

    dumplib.adamw_steps(params, tr, forward, after_step)
    final_bias = {f"{n}.e_score_correction_bias": g.e_score_correction_bias.tolist() for n, g in FAM.gates(model)}
    return dict(losses=st["losses"], indexer_losses=st["indexer_losses"], recalls=st["recalls"],
                margin=st["margin"], final_bias=final_bias)


def write_case(name, spec, out_root):
    tr = dict(dumplib.TRAIN_DEFAULT, **spec.get("train", {}))
    dense, weight = spec["stage"] == "dense_warmup", spec["weight"]
    for seed in range(spec["seed"], spec["seed"] + FAM.seed_tries):   # first seed whose selections have no near-ties
        model, batch = FAM.build_case(spec, seed)
        with torch.no_grad():
            forward_loss(model, batch, tr["aux_loss_alpha"], weight, dense)
        if selection_margin(model) < dumplib.MARGIN_MIN:
            continue
        total, ce, aux, idx, recall, grads = reference(model, batch, tr["aux_loss_alpha"], weight, dense)
        trained = train(FAM.build_case(spec, seed)[0], batch, tr, weight, dense)
        if trained["margin"] < dumplib.MARGIN_MIN:
            print(f"  {name}: seed {seed} has selection margin {trained['margin']:.2e}, trying next")
            continue
        yard = {p: train(FAM.build_case(spec, seed)[0], batch, tr, weight, dense, p) for p in dumplib.YARDSTICKS}
        break
    else:
        raise RuntimeError(f"{name}: no seed with selection margin >= {dumplib.MARGIN_MIN}")
    d = os.path.join(out_root, name)
    shutil.rmtree(d, ignore_errors=True)
    FAM.write_model(model, spec["style"], os.path.join(d, "model"))
    FAM.verify_checkpoint(model, spec["style"], os.path.join(d, "model"), batch, tr)
    dumplib.write_batch(batch, os.path.join(d, "batch.json"))
    t = {"loss": total.double().reshape(1), "ce_loss": ce.double().reshape(1), "aux_loss": aux.double().reshape(1),
         "indexer_loss": idx.double().reshape(1)}
    t.update({f"grad.{k}": v.float() for k, v in grads.items()})
    tr = dict(tr, indexer_loss_weight=weight, indexer_stage=spec["stage"])
    exp = {"case": name, "seed": seed, "loss": total.item(), "ce_loss": ce.item(), "aux_loss": aux.item(),
           "indexer_loss": idx.item(), "indexer_recall": recall, "train": tr, "losses": trained["losses"],
           "indexer_losses": trained["indexer_losses"], "indexer_recalls": trained["recalls"],
           "final_bias": trained["final_bias"], "routing_min_margin": trained["margin"],
           "losses_bf16_autocast": yard["bf16_autocast"]["losses"],
           "losses_bf16_weights": yard["bf16_weights"]["losses"],
           "versions": dumplib.versions()}
    size = dumplib.write_expected(d, t, exp)
    print(f"{name}: seed {seed} loss {total.item():.6f} (ce {ce.item():.6f} aux {aux.item():.6f} indexer "
          f"{idx.item():.6f} recall {recall:.4f}) losses {trained['losses'][0]:.4f}->{trained['losses'][-1]:.4f} "
          f"indexer {trained['indexer_losses'][0]:.4f}->{trained['indexer_losses'][-1]:.4f} "
          f"margin {trained['margin']:.2e} size {size / 1e3:.0f} kB")


# --------------------------------------------------------------------------------------------
# --check: live reference vs `trex grad --indexer-loss-weight W --indexer-stage S`.
# --------------------------------------------------------------------------------------------
def trex_flags(tr):
    return ["--indexer-loss-weight", repr(tr["indexer_loss_weight"]), "--indexer-stage", tr["indexer_stage"]] + \
        dumplib.trex_flags(tr)


def write_random_case(spec, d, tr):
    """Re-seeds spec until its first forward (in its stage) has no near-tie, writes the case folder d."""
    while True:
        model, batch = FAM.build_case(spec, spec["seed"])
        with torch.no_grad():
            forward_loss(model, batch, tr["aux_loss_alpha"], spec["weight"], spec["stage"] == "dense_warmup")
        if selection_margin(model) >= dumplib.CHECK_MARGIN:
            break
        spec["seed"] += 1
    FAM.write_model(model, spec["style"], os.path.join(d, "model"))
    dumplib.write_batch(batch, os.path.join(d, "batch.json"))
    with open(os.path.join(d, "spec.json"), "w") as f:
        json.dump(spec, f, indent=1)


def print_rows(rows, verbose):
    """The comparison table (loss, indexer loss and the indexer's gradients always; the rest with
    --verbose or when failing) and per case the worst gradient error, the indexer's apart."""
    rest = ("loss", "indexer_loss", "trex")
    w = max([len(r[1]) for r in rows] + [12])
    print(f"{'case':<22} {'tensor':<{w}} {'ref':>12} {'trex':>12} {'rel err':>10}  ok")
    for c, k, a, b, e, _, good in rows:
        if verbose or not good or k in rest or is_indexer(k):
            print(f"{c:<22} {k:<{w}} {a:>12} {b:>12} {e:>10.2e}  {'ok' if good else 'FAIL'}")
    for name in sorted({r[0] for r in rows}):
        rs = [r for r in rows if r[0] == name and r[1] not in rest]
        ix = [r for r in rs if is_indexer(r[1])]
        if rs:
            print(f"{name}: {len(rs)} gradients, max rel err {max(r[4] for r in rs):.2e} "
                  f"(indexer: {max([r[4] for r in ix] + [0]):.2e})")


def check(args):
    rows, failed, jobs = [], [], []
    work = tempfile.mkdtemp(prefix="trex_check_idxloss_")
    for name in args.cases:
        d = os.path.join(dumplib.DATA, name)
        with open(os.path.join(d, "expected.json")) as f:
            exp = json.load(f)
        jobs.append((name, d, exp["train"], exp))
    rng = torch.Generator().manual_seed(args.seed)
    for i in range(args.random):
        spec = v32.random_spec(rng)
        spec["stage"] = ["sparse", "dense_warmup"][i % 2]
        spec["weight"] = [0.5, 1.0, 2.0][i % 3]
        d = os.path.join(work, f"random{i}")
        tr = dict(spec["train"], indexer_loss_weight=spec["weight"], indexer_stage=spec["stage"])
        write_random_case(spec, d, tr)
        jobs.append((f"random{i}", d, tr, None))
    for name, d, tr, exp in jobs:
        batch = dumplib.read_batch(os.path.join(d, "batch.json"))
        model = FAM.load_model(os.path.join(d, "model"))
        alpha, weight, stage = tr.get("aux_loss_alpha", 0.0), tr["indexer_loss_weight"], tr["indexer_stage"]
        total, _, _, idx, _, grads = reference(model, batch, alpha, weight, stage == "dense_warmup")
        if exp is not None and abs(total.item() - exp["loss"]) > 1e-5 * abs(exp["loss"]):
            print(f"warning: {name}: live loss {total.item()} != committed {exp['loss']}")
        tj, tg, err = dumplib.run_trex(args.trex, d, trex_flags(tr), os.path.join(work, name + ".grads.safetensors"))
        if err is not None:
            print(f"{name}: trex failed: {err}")
            rows.append((name, "trex", "-", "-", math.inf, 0.0, False))
            failed.append(name)
            continue
        ok = dumplib.compare(name, total.item(), grads, float(tj["loss"]), tg, rows)
        ierr = abs(float(tj["indexer"]) - idx.item()) / max(abs(idx.item()), 1e-30)
        rows.append((name, "indexer_loss", f"{idx.item():.7g}", f"{float(tj['indexer']):.7g}", ierr, 1e-5,
                     ierr <= 1e-5))
        if not ok or ierr > 1e-5:
            failed.append(name)
    print_rows(rows, args.verbose)
    print(f"{len(jobs) - len(failed)}/{len(jobs)} cases passed" + (f"; failed: {failed}" if failed else ""))
    if failed:
        print(f"(inputs kept in {work})")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=dumplib.DATA, help="dump folder (default tests/reference/data)")
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--check", action="store_true", help="compare live transformers with `trex grad`")
    ap.add_argument("--trex", default="build/trex", help="trex binary for --check")
    ap.add_argument("--random", type=int, default=0, help="--check: number of extra random configs")
    ap.add_argument("--seed", type=int, default=4242, help="--check: seed of the random configs")
    ap.add_argument("--verbose", action="store_true", help="--check: print every gradient row")
    args = ap.parse_args()
    if args.check:
        sys.exit(check(args))
    for name in args.cases:
        write_case(name, CASES[name], args.out)


if __name__ == "__main__":
    main()
