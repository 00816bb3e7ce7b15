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
`trex grad --mtp-loss-weight W`. The port is the mixin `Mtp` (over a V3-format family of dumplib.py;
here make_dumps.py's V3, whose router patch it uses).

  .venv/bin/python tests/reference/make_dumps_mtp.py                  # regenerate the v3_mtp_* dumps
  .venv/bin/python tests/reference/make_dumps_mtp.py --check --trex build/trex
"""
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dumplib  # noqa: E402
import make_dumps  # noqa: E402  (the V3 family; patches transformers' router with trex's semantics)
from make_dumps import hf_ds3  # noqa: E402

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
def mtp_layer_class(decoder_layer, rmsnorm):
    """An MTP depth on transformers' decoder layer class `decoder_layer` (RMSNorm class `rmsnorm`)."""

    class SharedHead(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.norm = rmsnorm(config.hidden_size, eps=config.rms_norm_eps)
            self.head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    class MTPLayer(decoder_layer):
        def __init__(self, config, layer_idx):
            super().__init__(config, layer_idx)
            d, eps = config.hidden_size, config.rms_norm_eps
            self.enorm = rmsnorm(d, eps=eps)
            self.hnorm = rmsnorm(d, eps=eps)
            self.eh_proj = nn.Linear(2 * d, d, bias=False)
            self.shared_head = SharedHead(config)

        def forward(self, h_prev, emb, **layer_kwargs):
            """h_prev: [B, T, d] h_{k-1}; emb: [B, T, d] embedding of ids_k. Returns (h_k, logits_k)."""
            x = self.eh_proj(torch.cat([self.enorm(emb), self.hnorm(h_prev)], dim=-1))
            h = decoder_layer.forward(self, x, **layer_kwargs)
            return h, self.shared_head.head(self.shared_head.norm(h))

    return MTPLayer


def mtp_layers(model):
    return list(model.mtp_layers) if hasattr(model, "mtp_layers") else []


class Mtp:
    """Mixin over a V3-format dumplib.Family: model.mtp_layers = num_nextn_predict_layers MTP
    layers (layer_idx L + k: MoE or dense by first_k_dense_replace, as a main layer of that index),
    their routers after the main ones, loss + mtp_loss_weight x mean_k CE_k, checkpoints under the
    release's names model.layers.<L+k>.*."""
    mtp_layer = mtp_layer_class(hf_ds3.DeepseekV3DecoderLayer, hf_ds3.DeepseekV3RMSNorm)
    tag = "mtp"
    seed_tries = 50
    dump_logits_and_routes = False
    random_spec = None
    expected_keys = ["case", "seed", "loss", "ce_loss", "aux_loss", "mtp_loss", "train", "losses", "grad_norms",
                     "final_bias", "loads", "routing_min_margin", "losses_bf16_autocast", "losses_bf16_weights",
                     "versions"]

    def mtp_config(self, cfg):
        """The config the MTP layers are built with (V3: the model's; a family whose decoder layers
        look up per-layer lists by layer_idx extends them to L + D here)."""
        return cfg

    def attach_mtp(self, model):
        c = model.config
        D, L = c.num_nextn_predict_layers, c.num_hidden_layers
        model.mtp_layers = nn.ModuleList([self.mtp_layer(self.mtp_config(c), L + k) for k in range(D)]).float()

    def gates(self, model):
        L = model.config.num_hidden_layers
        return super().gates(model) + [(f"model.layers.{L + k}.mlp.gate", m.mlp.gate)
                                       for k, m in enumerate(mtp_layers(model)) if isinstance(m.mlp, self.moe_class)]

    def init_model(self, cfg, seed, router_gain=2.0):
        """The family's init for the main model, the same rules for the MTP layers (drawn after it)."""
        model = super().init_model(cfg, seed, router_gain)
        main_gates = len(self.gates(model))
        self.attach_mtp(model)
        g = torch.Generator().manual_seed(seed + 99)
        d = cfg.hidden_size
        with torch.no_grad():
            for name, p in model.mtp_layers.named_parameters():
                if name.endswith("shared_head.head.weight"):      # near the main head
                    p.copy_(model.lm_head.weight + 0.3 / math.sqrt(d) * torch.randn(p.shape, generator=g))
                else:
                    self.init_param(name, p, g, cfg, router_gain)
            for _, gate in self.gates(model)[main_gates:]:
                gate.e_score_correction_bias.normal_(generator=g).mul_(0.05)
        self.configure(model)
        return model

    def mtp_names(self, tensors, cfg):
        """mtp_layers.{k}.X -> model.layers.{L+k}.X (experts per expert, as the release)."""
        L = cfg.num_hidden_layers
        out = {}
        for name, t in tensors.items():
            k, rest = name.split(".", 2)[1:]
            out[f"model.layers.{L + int(k)}.{rest}"] = t
        return dumplib.to_checkpoint_names(out, cfg)

    def checkpoint_state(self, model):
        sd = super().checkpoint_state(model)
        sd = {k: v for k, v in sd.items() if not k.startswith("mtp_layers.")}
        mtp = {k: v.detach().clone() for k, v in model.state_dict().items() if k.startswith("mtp_layers.")}
        sd.update(self.mtp_names(mtp, model.config))
        for k in range(model.config.num_nextn_predict_layers):   # the release's copy of the embedding
            sd[f"model.layers.{model.config.num_hidden_layers + k}.embed_tokens.weight"] = \
                model.model.embed_tokens.weight.detach().clone()
        return {k: v.contiguous() for k, v in sd.items()}

    def grads(self, model):
        g = {n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().clone()
             for n, p in model.named_parameters()}
        main = dumplib.to_checkpoint_names({k: v for k, v in g.items() if not k.startswith("mtp_layers.")},
                                           model.config)
        main.update(self.mtp_names({k: v for k, v in g.items() if k.startswith("mtp_layers.")}, model.config))
        return main

    def load_model(self, d):
        """from_pretrained (which ignores model.layers.<L+k>.*), then the MTP layers from those tensors."""
        m = super().load_model(d)
        self.attach_mtp(m)
        sd = load_file(os.path.join(d, "model.safetensors"))
        L = m.config.num_hidden_layers
        for k, layer in enumerate(mtp_layers(m)):
            pre = f"model.layers.{L + k}."
            for name, p in layer.named_parameters():
                if name.endswith("mlp.experts.gate_up_proj"):
                    t = torch.stack([torch.cat([sd[f"{pre}mlp.experts.{e}.gate_proj.weight"],
                                                sd[f"{pre}mlp.experts.{e}.up_proj.weight"]]) for e in range(p.shape[0])])
                elif name.endswith("mlp.experts.down_proj"):
                    t = torch.stack([sd[f"{pre}mlp.experts.{e}.down_proj.weight"] for e in range(p.shape[0])])
                else:
                    t = sd[pre + name]
                assert t.shape == p.shape, (name, t.shape, p.shape)
                with torch.no_grad():
                    p.copy_(t)
            for name, b in layer.named_buffers():
                if name.endswith("e_score_correction_bias"):
                    with torch.no_grad():
                        b.copy_(sd[pre + name])
        self.configure(m)
        return m

    def verify_checkpoint(self, model, style, d, batch, tr):
        """The written checkpoint reads back (transformers for the main model, this port for the
        MTP layers) to the same loss."""
        re = self.load_model(d)
        with torch.no_grad():
            a, b = self.forward(model, batch, tr)["loss"], self.forward(re, batch, tr)["loss"]
        assert torch.equal(a, b), (a, b)

    def forward(self, model, batch, tr):
        """Main forward (HF) + the MTP depths when mtp_loss_weight > 0; aux loss over every router run."""
        ids, labels, w = batch["ids"], batch["labels"], tr["mtp_loss_weight"]
        with dumplib.capture_inputs(model, model.model.norm) as cap:      # h_0 = the input of model.norm
            out = model(input_ids=ids, labels=labels, use_cache=False)
        V = out.logits.shape[-1]
        dumplib.check_ce(out.loss, out.logits, labels)
        h, mtp_losses = cap["x"], []
        for k, layer in enumerate(mtp_layers(model) if w > 0 else [], 1):
            ids_k, tg = dumplib.mtp_shift(ids, labels, k)
            assert bool((tg != -100).any()), "an MTP depth without a valid target"
            h, lg = layer(h, model.model.embed_tokens(ids_k), **cap["kw"])
            mtp_losses.append(F.cross_entropy(lg.reshape(-1, V).float(), tg.reshape(-1), ignore_index=-100))
        mtp = torch.stack(mtp_losses).mean() if mtp_losses else torch.zeros(())
        B, T = ids.shape
        ran = [(n, g) for n, g in self.gates(model) if hasattr(g, "trex_record")]   # not: MTP layers with w == 0
        aux, routes = dumplib.seq_aux_loss(ran, B, T, tr["aux_loss_alpha"])
        for _, gate in ran:                       # a stale record must not count in the next call
            del gate.trex_record
        return dict(loss=out.loss + aux + w * mtp, ce=out.loss, aux=aux, mtp=mtp, logits=out.logits, routes=routes)

    def bf16_heads(self, model):
        """The MTP heads keep dy unrounded, as the main head."""
        return super().bf16_heads(model) | {id(m.shared_head.head.weight) for m in mtp_layers(model)}


class V3Mtp(Mtp, make_dumps.V3):
    cases = CASES


if __name__ == "__main__":
    dumplib.main(V3Mtp(), __doc__)
