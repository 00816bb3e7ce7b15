#!/usr/bin/env python3
"""Independent PyTorch reference for trex model parity (see tests/reference/README.md).

Builds tiny DeepseekV3ForCausalLM models with Hugging Face transformers (random init, fixed
seed, fp32), and writes per case tests/reference/data/<case>/{model/, batch.json,
expected.safetensors, expected.json}. With --check it recomputes the reference live and
compares it with `trex grad` on the committed cases and on N random configurations.
What every dump script shares (training, dump writer, --check driver, CLI) is in dumplib.py.

  .venv/bin/python tests/reference/make_dumps.py                      # regenerate all dumps
  .venv/bin/python tests/reference/make_dumps.py --check --trex build/trex --random 5
"""
import math
import os
import sys

import torch
import torch.nn.functional as F
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf_ds3

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dumplib  # noqa: E402

# --------------------------------------------------------------------------------------------
# Cases. "model": DeepseekV3 config fields; "train": optimizer / router-balancing settings
# (over dumplib.TRAIN_DEFAULT); "style": how config.json is written ("deepseek" = like the real
# DeepSeek-V3 release, rope_theta + rope_scaling{type: yarn}; "hf5" = what transformers 5
# save_pretrained writes, rope_parameters{rope_type, rope_theta, ...}).
# --------------------------------------------------------------------------------------------
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
            smask, margin = dumplib.group_mask(gscore, self.topk_group, E)
            masked = sel.masked_fill(~smask, float("-inf"))
            idx = torch.topk(masked, k=K, dim=-1, sorted=False)[1]                   # [N, K]
            ms = masked.sort(dim=-1, descending=True)[0]
            if K < E:
                gap = ms[:, K - 1] - ms[:, K]
                margin = min(margin, gap[torch.isfinite(gap)].min().item() if torch.isfinite(gap).any() else math.inf)
            # Would the older "masked_fill(..., 0.0)" convention pick different experts?
            idx0 = torch.topk(sel.masked_fill(~smask, 0.0), k=K, dim=-1)[1]
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


hf_ds3.DeepseekV3TopkRouter.forward = route


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
# --check: random configurations.
# --------------------------------------------------------------------------------------------
def random_spec(rng):
    ri, rc = dumplib.drawers(rng)
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


# --------------------------------------------------------------------------------------------
# The family: what differs from dumplib.Family's defaults.
# --------------------------------------------------------------------------------------------
class V3(dumplib.Family):
    cases = CASES
    seed_tries = 50
    model_class, config_class, moe_class = DeepseekV3ForCausalLM, DeepseekV3Config, hf_ds3.DeepseekV3MoE
    config_defaults = dict(num_nextn_predict_layers=0)
    architecture, model_type = "DeepseekV3ForCausalLM", "deepseek_v3"
    release_keys = dumplib.Family.release_keys + ["topk_method", "n_group", "topk_group", "scoring_func",
                                                  "num_nextn_predict_layers"]

    def configure(self, model):
        """The routers compute the config's scoring_func / topk_method (see route)."""
        c = model.config
        for _, gate in self.gates(model):
            gate.scoring_func = getattr(c, "scoring_func", "sigmoid")
            gate.topk_method = getattr(c, "topk_method", "noaux_tc")

    def release_extra(self, cfg):
        return {} if cfg.rope_interleave else {"rope_interleave": False}   # absent in real checkpoints (HF default: true)

    def verify_checkpoint(self, model, style, d, batch, tr):
        super().verify_checkpoint(model, style, d, batch, tr)
        if model.config.scoring_func == "sigmoid" and model.config.topk_method == "noaux_tc":
            check_router_matches_hf(model, batch)

    random_spec = staticmethod(random_spec)


if __name__ == "__main__":
    dumplib.main(V3(), __doc__)
