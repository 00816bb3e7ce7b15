#!/usr/bin/env python3
"""Independent PyTorch reference for trex DeepSeek-V2 parity (see tests/reference/README.md,
"DeepSeek-V2 cases").

Builds tiny DeepseekV2ForCausalLM models with Hugging Face transformers (random init, fixed seed,
fp32, eager attention, eager expert loop; the router is transformers' own code, only wrapped to
record its selection) and writes per case tests/reference/data/v2_<name>/{model/, batch.json,
expected.safetensors, expected.json} in the format of the V3 cases (make_dumps.py; what the
dump scripts share is in dumplib.py).

  .venv/bin/python tests/reference/make_dumps_v2.py                      # regenerate the V2 dumps
  .venv/bin/python tests/reference/make_dumps_v2.py --check --trex build/trex --random 5
"""
import math
import os
import sys

import torch
from transformers import DeepseekV2Config, DeepseekV2ForCausalLM
from transformers.models.deepseek_v2 import modeling_deepseek_v2 as hf2

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dumplib  # noqa: E402

# --------------------------------------------------------------------------------------------
# Cases. "style": how config.json is written ("release" = like DeepSeek's V2 / V2-Lite / V2.5
# releases: rope_theta + rope_scaling{type: yarn}, scoring_func, aux_loss_alpha, seq_aux,
# moe_layer_freq; "hf5" = the diff-to-defaults form of transformers 5, rope_parameters{...}).
# kv_lora_rank and qk_nope_head_dim are even: transformers' fp32 V2 RoPE views q_pe / k_pe, slices
# at those offsets, as complex numbers (torch.view_as_complex needs even strides and offsets; in
# bf16 .float() copies first). trex has no such constraint.
# norm_topk_prob is false in both: transformers ignores it and DeepSeek's release code normalizes
# instead of scaling when it is true, so trex refuses true (model/config_v2.cpp).
# --------------------------------------------------------------------------------------------
CASES = {
    "v2_lite_greedy": dict(   # V2-Lite-like: plain q_proj, greedy softmax, 3 shared experts
        seed=5005, style="release", B=2, T=13,
        model=dict(vocab_size=89, hidden_size=45, num_hidden_layers=3, first_k_dense_replace=1,
                   num_attention_heads=5, q_lora_rank=None, kv_lora_rank=14, qk_nope_head_dim=10,
                   qk_rope_head_dim=6, v_head_dim=9, intermediate_size=50,
                   moe_intermediate_size=14, n_routed_experts=10, n_shared_experts=3,
                   num_experts_per_tok=3, topk_method="greedy", norm_topk_prob=False,
                   routed_scaling_factor=1.0, max_position_embeddings=64, tie_word_embeddings=False,
                   rope_scaling=None),
        train=dict(aux_loss_alpha=0.01)),
    "v2_5_group_yarn": dict(  # V2 / V2.5-like: q_lora, group_limited_greedy, scaled weights, YaRN
        seed=6006, style="hf5", B=2, T=13, bf16_same_routes=True,
        model=dict(vocab_size=101, hidden_size=39, num_hidden_layers=3, first_k_dense_replace=1,
                   num_attention_heads=3, q_lora_rank=21, kv_lora_rank=16, qk_nope_head_dim=8,
                   qk_rope_head_dim=4, v_head_dim=11, intermediate_size=43,
                   moe_intermediate_size=17, n_routed_experts=9, n_shared_experts=2,
                   num_experts_per_tok=3, n_group=3, topk_group=2,
                   topk_method="group_limited_greedy", norm_topk_prob=False,
                   routed_scaling_factor=2.5, max_position_embeddings=64, tie_word_embeddings=True,
                   rope_scaling=dict(rope_type="yarn", factor=4.0,
                                     original_max_position_embeddings=16, beta_fast=32,
                                     beta_slow=1, mscale=0.8, mscale_all_dim=0.6)),
        train=dict(aux_loss_alpha=0.0)),
}

# --------------------------------------------------------------------------------------------
# Router: transformers' DeepseekV2TopkRouter.forward as is (in fp32 also under autocast, as trex
# keeps the router in fp32), wrapped to record the scores (for the aux loss), the selection and
# its margin (the smallest gap a selection depends on).
# --------------------------------------------------------------------------------------------
HF_ROUTER_FORWARD = hf2.DeepseekV2TopkRouter.forward


def route(self, hidden_states):
    with torch.autocast("cpu", enabled=False):
        logits, weights, idx = HF_ROUTER_FORWARD(self, hidden_states.float())
    scores = logits.softmax(dim=-1, dtype=torch.float32)                      # [N, E], HF's scores
    E, K, margin = self.num_experts, self.top_k, math.inf
    with torch.no_grad():
        sel = scores
        if self.topk_method == "group_limited_greedy":
            G = self.num_group
            gscore = scores.view(-1, G, E // G).max(dim=-1).values                  # [N, G]
            smask, margin = dumplib.group_mask(gscore, self.topk_group, E)
            sel = scores.masked_fill(~smask, 0.0)
        if K < E:
            ss = sel.sort(dim=-1, descending=True)[0]
            margin = min(margin, (ss[:, K - 1] - ss[:, K]).min().item())
        # The combine weights are the selected scores x routed_scaling_factor (never normalized).
        assert torch.allclose(weights, scores.gather(1, idx) * self.routed_scaling_factor, rtol=0, atol=0)
    self.trex_record = dict(scores=scores, idx=idx, margin=margin, zero_mask_diff=0)
    return logits, weights, idx


hf2.DeepseekV2TopkRouter.forward = route


# --------------------------------------------------------------------------------------------
# --check: random configurations.
# --------------------------------------------------------------------------------------------
def random_spec(rng):
    ri, rc = dumplib.drawers(rng)
    L = ri(1, 4)
    method = rc(["greedy", "group_limited_greedy"])
    G = rc([1, 2, 3]) if method == "group_limited_greedy" else 1
    per = ri(2, 5)
    E = G * per
    tg = ri(1, G)
    K = ri(1, min(tg * per, E - 1))
    yarn = rc([True, False])
    factor = rc([2.0, 3.0, 4.0])
    model = dict(vocab_size=ri(31, 131), hidden_size=ri(17, 71), num_hidden_layers=L,
                 first_k_dense_replace=ri(0, L - 1), num_attention_heads=ri(1, 5),
                 q_lora_rank=rc([None, ri(9, 33)]), kv_lora_rank=2 * ri(4, 14),
                 qk_nope_head_dim=2 * ri(1, 7), qk_rope_head_dim=2 * ri(1, 5), v_head_dim=ri(3, 15),
                 intermediate_size=ri(19, 61), moe_intermediate_size=ri(7, 23), n_routed_experts=E,
                 n_shared_experts=ri(0, 3), num_experts_per_tok=K, topk_method=method,
                 norm_topk_prob=False, routed_scaling_factor=rc([1.0, 1.7, 16.0]),
                 max_position_embeddings=int(16 * factor) if yarn else 64,
                 tie_word_embeddings=rc([True, False]),
                 rope_scaling=dict(rope_type="yarn", factor=factor, original_max_position_embeddings=16,
                                   beta_fast=32, beta_slow=1, mscale=rc([1.0, 0.707, 0.8]),
                                   mscale_all_dim=rc([0.707, 0.6, 0.0])) if yarn else None)
    if method == "group_limited_greedy":
        model.update(n_group=G, topk_group=tg)
    # The hidden size must be a multiple of the heads (DeepseekV2Config.validate_architecture).
    model["hidden_size"] -= model["hidden_size"] % model["num_attention_heads"]
    return dict(seed=ri(1, 10 ** 6), style=rc(["release", "hf5"]), B=ri(1, 3), T=2 * ri(2, 9) + 1,
                model=model, train=dict(aux_loss_alpha=rc([0.0, 0.01])))


# --------------------------------------------------------------------------------------------
# The family: what differs from dumplib.Family's defaults. The aux loss is DeepSeek-V2's seq_aux
# (the V3 formula on the softmax scores); the routers have no bias ("bf16_same_routes": also the
# first seed whose bf16-weights run picks the same experts at step 0: v2_5_group_yarn's first seed
# flipped 3 + 1 of them, and trex's bf16 run, flipping others, left the reference's bf16 losses by
# 3e-2 at step 2).
# --------------------------------------------------------------------------------------------
class V2(dumplib.Family):
    tag = "v2"
    cases = CASES
    train_default = dict(dumplib.TRAIN_DEFAULT, bias_update_gamma=0.0)  # V2 routers have no bias
    model_class, config_class, moe_class = DeepseekV2ForCausalLM, DeepseekV2Config, hf2.DeepseekV2Moe
    router_bias = False
    architecture, model_type = "DeepseekV2ForCausalLM", "deepseek_v2"
    release_keys = dumplib.Family.release_keys + ["topk_method", "pretraining_tp"]
    expected_keys = ["case", "seed", "loss", "ce_loss", "aux_loss", "train", "losses", "grad_norms", "loads",
                     "routing_min_margin", "losses_bf16_autocast", "losses_bf16_weights", "route_flips_bf16",
                     "versions"]

    def release_extra(self, cfg):
        """The release's own keys (DeepSeek's modeling code reads them; transformers keeps them as is)."""
        return dict(scoring_func="softmax", moe_layer_freq=1, aux_loss_alpha=0.001, seq_aux=True,
                    n_group=cfg.n_group or 1, topk_group=cfg.topk_group or 1)

    def verify_fields(self, cfg):
        fields = ("topk_method", "n_group", "topk_group", "routed_scaling_factor", "q_lora_rank",
                  "n_shared_experts", "first_k_dense_replace", "tie_word_embeddings")
        return [k for k in fields if cfg.topk_method != "greedy" or k not in ("n_group", "topk_group")]

    random_spec = staticmethod(random_spec)


if __name__ == "__main__":
    dumplib.main(V2(), __doc__)
