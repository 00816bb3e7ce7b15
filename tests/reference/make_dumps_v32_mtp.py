#!/usr/bin/env python3
"""Live PyTorch check of trex's DeepSeek-V3.2 MTP layers (docs/MTP.md, "DeepSeek-V3.2").

DeepSeek-V3.2-Exp's config.json has num_nextn_predict_layers 1 and its checkpoint holds
model.layers.<L>.*: the MTP layer of DeepSeek-V3 (enorm, hnorm, eh_proj, shared_head) around a
V3.2 decoder layer, which has its own lightning indexer. transformers' DeepseekV32ForCausalLM has
no MTP module, so this script builds one as make_dumps_mtp.py does for V3, on transformers' own
DeepseekV32DecoderLayer (layer index L + k - 1, MoE when >= first_k_dense_replace; its indexer
runs under no_grad as in the main layers):
    x_k = eh_proj(cat([enorm(embed(ids_k)), hnorm(h_{k-1})], -1))     ids_k[t] = ids[t+k] (ids[t] past the end)
    h_k = DecoderLayer_{L+k-1}(x_k)         (the main layers' positions, causal mask and RoPE)
    logits_k = shared_head.head(shared_head.norm(h_k)), target of t = labels[t+k+1] (-100 past the end)
    loss = CE + mtp_loss_weight * mean_k CE_k
It writes each case (save_pretrained for the main model, the MTP tensors added under the release's
names, num_nextn_predict_layers in config.json), runs `trex grad --mtp-loss-weight W` on it and
compares the loss (1e-5 relative) and every gradient (1e-4 relative, the MTP layers' included; the
indexers' are zero in both), after checking that no indexer top-k of the forward rests on a tie.

  .venv/bin/python tests/reference/make_dumps_v32_mtp.py --trex build/trex [--out out/v32_mtp]
"""
import argparse
import copy
import json
import math
import os
import shutil
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import DeepseekV32Config, DeepseekV32ForCausalLM
from transformers.models.deepseek_v32 import modeling_deepseek_v32 as hf32

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dumplib  # noqa: E402  (to_checkpoint_names, capture_inputs, mtp_shift, compare; one thread)
import live_roundtrip as lr  # noqa: E402  (records the indexer's top-k gaps: lr.V32_GAP)

# Odd sizes; index_topk below T so the indexers' selections (the MTP layer's included) matter.
CASES = {
    # One MTP layer (as the V3.2-Exp release), MoE, YaRN, 2 groups.
    "v32_mtp_one": dict(
        seed=11, B=2, T=13, D=1, w=0.3,
        model=dict(vocab_size=71, hidden_size=45, num_hidden_layers=2, num_attention_heads=5, num_key_value_heads=5,
                   q_lora_rank=19, kv_lora_rank=13, qk_nope_head_dim=7, qk_rope_head_dim=6, v_head_dim=9,
                   intermediate_size=47, moe_intermediate_size=11, n_routed_experts=10, n_shared_experts=1,
                   num_experts_per_tok=3, n_group=2, topk_group=1, first_k_dense_replace=1, norm_topk_prob=True,
                   routed_scaling_factor=2.5, index_n_heads=7, index_head_dim=10, index_topk=5,
                   max_position_embeddings=64,
                   rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=2.0,
                                        original_max_position_embeddings=16, beta_fast=32, beta_slow=1,
                                        mscale=0.8, mscale_all_dim=0.6))),
    # Two depths: a dense MTP layer (index 2 < first_k_dense_replace 3) then a MoE one; tied
    # embeddings, plain RoPE.
    "v32_mtp_two_depths": dict(
        seed=23, B=2, T=11, D=2, w=0.7,
        model=dict(vocab_size=67, hidden_size=33, num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=3,
                   q_lora_rank=13, kv_lora_rank=9, qk_nope_head_dim=5, qk_rope_head_dim=4, v_head_dim=7,
                   intermediate_size=29, moe_intermediate_size=7, n_routed_experts=7, n_shared_experts=2,
                   num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=3, norm_topk_prob=False,
                   routed_scaling_factor=1.3, index_n_heads=7, index_head_dim=9, index_topk=4,
                   tie_word_embeddings=True, max_position_embeddings=64)),
}


class SharedHead(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.norm = hf32.DeepseekV32RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)


class MTPLayer(hf32.DeepseekV32DecoderLayer):
    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        d, eps = config.hidden_size, config.rms_norm_eps
        self.enorm = hf32.DeepseekV32RMSNorm(d, eps=eps)
        self.hnorm = hf32.DeepseekV32RMSNorm(d, eps=eps)
        self.eh_proj = nn.Linear(2 * d, d, bias=False)
        self.shared_head = SharedHead(config)

    def forward(self, h_prev, emb, **layer_kwargs):
        x = self.eh_proj(torch.cat([self.enorm(emb), self.hnorm(h_prev)], dim=-1))
        h = hf32.DeepseekV32DecoderLayer.forward(self, x, **layer_kwargs)
        return h, self.shared_head.head(self.shared_head.norm(h))


def build(spec):
    torch.manual_seed(spec["seed"])
    cfg = DeepseekV32Config(**spec["model"])
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    m = DeepseekV32ForCausalLM(cfg).float()
    with torch.no_grad():  # off the constant initial values (norms 1), routers spread out
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    # The MTP layers: a config whose per-layer lists cover index L + k (trex: MoE iff >= first_k_dense_replace).
    L, D = cfg.num_hidden_layers, spec["D"]
    c2 = copy.deepcopy(cfg)
    c2.mlp_layer_types = [("sparse" if l >= cfg.first_k_dense_replace else "dense") for l in range(L + D)]
    c2.layer_types = ["indexed_attention"] * (L + D)
    m.mtp_layers = nn.ModuleList([MTPLayer(c2, L + k) for k in range(D)]).float()
    d = cfg.hidden_size
    with torch.no_grad():
        for name, p in m.mtp_layers.named_parameters():
            if name.endswith("shared_head.head.weight"):
                p.copy_(m.lm_head.weight + 0.3 / math.sqrt(d) * torch.randn_like(p))
            elif p.ndim == 1:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * (2.0 if name.endswith("mlp.gate.weight") else 1.0) / math.sqrt(p.shape[-1]))
        for name, b in m.mtp_layers.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.05 * torch.randn_like(b))
    return m


def mtp_names(tensors, cfg):
    L = cfg.num_hidden_layers
    out = {}
    for name, t in tensors.items():
        k, rest = name.split(".", 2)[1:]
        out[f"model.layers.{L + int(k)}.{rest}"] = t
    return dumplib.to_checkpoint_names(out, cfg)


def write(m, d):
    """save_pretrained, then the MTP tensors added to its safetensors and num_nextn_predict_layers
    to its config.json (as the release's files hold them)."""
    m.save_pretrained(d)
    files = [f for f in os.listdir(d) if f.endswith(".safetensors")]
    assert files == ["model.safetensors"], files
    sd = load_file(os.path.join(d, "model.safetensors"))
    mtp = {k: v.detach().clone() for k, v in m.state_dict().items() if k.startswith("mtp_layers.")}
    sd = {k: v for k, v in sd.items() if not k.startswith("mtp_layers.")}
    sd.update(mtp_names(mtp, m.config))
    save_file({k: v.contiguous() for k, v in sd.items()}, os.path.join(d, "model.safetensors"),
              metadata={"format": "pt"})
    with open(os.path.join(d, "config.json")) as f:
        j = json.load(f)
    j["num_nextn_predict_layers"] = len(m.mtp_layers)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(j, f, indent=2)


def loss_and_grads(m, ids, w):
    m.train()
    m.zero_grad(set_to_none=True)
    lr.V32_GAP.clear()
    with dumplib.capture_inputs(m, m.model.norm) as cap:   # the first layer's kwargs, the last layer's output
        out = m(input_ids=ids, labels=ids, use_cache=False)
        h, V, losses = cap["x"], m.config.vocab_size, []
        for k, layer in enumerate(m.mtp_layers, 1):
            ids_k, tg = dumplib.mtp_shift(ids, ids, k)
            h, lg = layer(h, m.model.embed_tokens(ids_k), **cap["kw"])
            losses.append(F.cross_entropy(lg.reshape(-1, V).float(), tg.reshape(-1), ignore_index=-100))
    loss = out.loss + w * torch.stack(losses).mean()
    loss.backward()
    g = {n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().clone() for n, p in m.named_parameters()}
    main = dumplib.to_checkpoint_names({k: v for k, v in g.items() if not k.startswith("mtp_layers.")}, m.config)
    if m.config.tie_word_embeddings:
        main.pop("lm_head.weight", None)
    main.update(mtp_names({k: v for k, v in g.items() if k.startswith("mtp_layers.")}, m.config))
    return float(loss.detach()), {k: v for k, v in main.items() if v.numel() > 0}, min(lr.V32_GAP)


def one(name, spec, trex, out):
    m = build(spec)
    d = os.path.join(out, name)
    shutil.rmtree(d, ignore_errors=True)
    write(m, os.path.join(d, "model"))
    g = torch.Generator().manual_seed(spec["seed"])
    ids = torch.randint(0, spec["model"]["vocab_size"], (spec["B"], spec["T"]), generator=g)
    loss, grads, gap = loss_and_grads(m, ids, spec["w"])
    if gap <= 1e-6:
        print(f"FAIL {name}: an indexer top-k rests on a tie (gap {gap:.1e}); change the seed")
        return False
    dumplib.write_batch(dict(ids=ids, labels=ids), os.path.join(d, "batch.json"))
    tj, tg, err = dumplib.run_trex(trex, d, ["--mtp-loss-weight", repr(spec["w"])],
                                   os.path.join(d, "grads.safetensors"))
    if err is not None:
        print(f"FAIL {name}: trex grad: {err}")
        return False
    tl = float(tj["loss"])
    rows = []
    ok = dumplib.compare(name, loss, grads, tl, tg, rows)
    bad = [x for x in rows if not x[6]]
    for c, k, a, b, e, _, good in bad[:10]:
        print(f"  {k:<60} {a:>12} {b:>12} {e:>10.2e}  FAIL")
    mtp = [x for x in rows if x[1].startswith(f"model.layers.{spec['model']['num_hidden_layers']}")]
    worst = max(x[4] for x in rows if x[1] != "loss")
    print(f"{'ok  ' if ok else 'FAIL'} {name}: loss {tl:.7f} vs {loss:.7f} (rel {rows[0][4]:.1e}); {len(rows) - 1} "
          f"gradients ({len(mtp)} of the first MTP layer), worst rel {worst:.1e}; smallest indexer gap {gap:.1e}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trex", default="build/trex")
    ap.add_argument("--out", default="out/v32_mtp")
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    a = ap.parse_args()
    ok = True
    for name in a.cases:
        ok &= one(name, CASES[name], a.trex, a.out)
    print("transformers", __import__("transformers").__version__, "torch", torch.__version__)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
