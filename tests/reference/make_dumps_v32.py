#!/usr/bin/env python3
"""Independent PyTorch reference for trex DeepSeek-V3.2 parity (see tests/reference/README.md,
"DeepSeek-V3.2 cases").

Builds tiny DeepseekV32ForCausalLM models with Hugging Face transformers (random init, fixed seed,
fp32, eager attention, eager expert loop; the router and the lightning indexer are transformers'
own code, only wrapped to record their selections and margins) and writes per case
tests/reference/data/v32_<name>/{model/, batch.json, expected.safetensors, expected.json} in the
format of the V3 cases (make_dumps.py; what the dump scripts share is in dumplib.py).

  .venv/bin/python tests/reference/make_dumps_v32.py                      # regenerate the V3.2 dumps
  .venv/bin/python tests/reference/make_dumps_v32.py --check --trex build/trex --random 5
"""
import math
import os
import subprocess
import sys

import torch
import torch.nn.functional as F
from transformers import DeepseekV32Config, DeepseekV32ForCausalLM
from transformers.models.deepseek_v32 import modeling_deepseek_v32 as hf32

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dumplib  # noqa: E402

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
    E, K, G = self.num_experts, self.top_k, self.num_group
    with torch.no_grad():
        sel = scores + self.e_score_correction_bias
        gscore = sel.view(-1, G, E // G).topk(2, dim=-1)[0].sum(dim=-1)
        smask, margin = dumplib.group_mask(gscore, self.topk_group, E)
        ms = sel.masked_fill(~smask, float("-inf")).sort(dim=-1, descending=True)[0]
        if K < E:
            gap = ms[:, K - 1] - ms[:, K]
            fin = torch.isfinite(gap)
            margin = min(margin, gap[fin].min().item() if fin.any() else math.inf)
    self.trex_record = dict(scores=scores, idx=idx, margin=margin, zero_mask_diff=0)
    return logits, weights, idx


hf32.DeepseekV32TopkRouter.forward = route


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


# --------------------------------------------------------------------------------------------
# --check: random configurations, trex convert round trip.
# --------------------------------------------------------------------------------------------
def random_spec(rng):
    # index_topk >= 2: with one key per query the attention is constant, q's gradient is zero
    # analytically, and the float residue of trex's softmax (p = 1 - 1e-7) fails the relative check.
    ri, rc = dumplib.drawers(rng)
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


def convert_round_trip(fam, trex, d, work, name):
    """trex convert --dtype f32 of a committed case loads in transformers with identical logits."""
    out = os.path.join(work, name + ".converted")
    p = subprocess.run([trex, "convert", "--model", os.path.join(d, "model"), "--out", out, "--dtype", "f32"],
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        print(f"{name}: trex convert failed: {(p.stderr or p.stdout).strip()[-300:]}")
        return False
    batch = dumplib.read_batch(os.path.join(d, "batch.json"))
    a, b = fam.load_model(os.path.join(d, "model")), fam.load_model(out)
    a.eval(), b.eval()
    with torch.no_grad():
        same = torch.equal(a(input_ids=batch["ids"]).logits, b(input_ids=batch["ids"]).logits)
    print(f"{name}: trex convert -> from_pretrained: logits {'identical' if same else 'DIFFER'}")
    return same


# --------------------------------------------------------------------------------------------
# The family: what differs from dumplib.Family's defaults. The aux loss is the V3 formula on the
# sigmoid scores; training has the aux-loss-free router bias update, as make_dumps.py. A seed is
# kept when every router and indexer margin over the 10 steps is >= MARGIN_MIN.
# --------------------------------------------------------------------------------------------
class V32(dumplib.Family):
    tag = "v32"
    cases = CASES
    model_class, config_class, moe_class = DeepseekV32ForCausalLM, DeepseekV32Config, hf32.DeepseekV32MoE
    architecture, model_type = "DeepseekV32ForCausalLM", "deepseek_v32"
    release_keys = dumplib.Family.release_keys + ["n_group", "topk_group", "index_topk", "index_head_dim",
                                                  "index_n_heads"]
    expected_keys = ["case", "seed", "loss", "ce_loss", "aux_loss", "train", "losses", "grad_norms", "loads",
                     "final_bias", "routing_min_margin", "losses_bf16_autocast", "losses_bf16_weights",
                     "route_flips_bf16", "versions"]

    def margin(self, model, routes):
        """Routers and indexers."""
        return min([r["margin"] for r in routes.values()] + [ix.trex_record["margin"] for ix in indexers(model)] +
                   [math.inf])

    def bf16_fp32_uncounted(self, model):
        """bf16_weights keeps the indexer's projections (wq_b, wk, weights_proj) in fp32 like the
        router, as trex's bf16 runs compute them."""
        return {id(m.weight) for ix in indexers(model) for m in (ix.wq_b, ix.wk, ix.weights_proj)}

    def release_extra(self, cfg):
        """The release's own keys (DeepSeek's inference code reads them; transformers keeps them as is)."""
        return dict(scoring_func="sigmoid", topk_method="noaux_tc", moe_layer_freq=1, ep_size=1,
                    num_nextn_predict_layers=0)

    def verify_fields(self, cfg):
        return ("n_group", "topk_group", "routed_scaling_factor", "q_lora_rank", "n_shared_experts",
                "first_k_dense_replace", "tie_word_embeddings", "index_topk", "index_head_dim",
                "index_n_heads", "mlp_layer_types")

    random_spec = staticmethod(random_spec)

    def check_case(self, name, d, exp, tr, args, work, rows):
        """Also: trex convert of each committed case loads with identical logits."""
        ok = super().check_case(name, d, exp, tr, args, work, rows)
        if exp is not None:
            ok = convert_round_trip(self, args.trex, d, work, name) and ok
        return ok


if __name__ == "__main__":
    dumplib.main(V32(), __doc__)
