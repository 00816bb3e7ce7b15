#!/usr/bin/env python3
"""Live round trip of DeepSeek-V3, DeepSeek-V2 and DeepSeek-V3.2 checkpoints through the installed
transformers:

  Deepseek{V3,V2,V32}ForCausalLM.save_pretrained -> trex grad (loss) -> trex convert (f32 and bf16) ->
  from_pretrained -> the same logits; the converted checkpoint holds exactly the names
  save_pretrained wrote (per-expert experts.E.gate_proj / up_proj / down_proj; V3's router bias,
  none for V2) and its config.json loads back with the same routing fields.
(DeepSeek-V4's three namings: live_v4_namings.py.)

V3, two configs with odd sizes: groups, q_lora, YaRN; one group, no q_lora, tied embeddings (both
sigmoid noaux_tc: transformers' V3 router computes nothing else).
V2, three: V2-Lite-like (q_lora_rank null, greedy, 3 shared experts, tied embeddings), V2 /
V2.5-like (q_lora, group_limited_greedy, routed_scaling_factor 16, YaRN), and no shared experts
(transformers saves an empty shared-expert MLP; trex loads it as nothing and does not write it).
V3.2, two: a small q_lora (5), YaRN, 5 indexer heads selecting 4 of the 15 tokens; every layer
MoE, tied embeddings, 7 indexer heads of odd width selecting 7 (index_topk < T in both, so the
indexer's selection decides what later queries attend; the converted checkpoint keeps the
indexer's tensors and the config its index_* keys, and the script checks that no query's top-k
rests on a tie).
Passes when trex's loss equals transformers' to 1e-5 relative, the f32 round trip's logits equal
the saved model's to 1e-5 relative and the bf16 round trip's equal those of the saved model with
its weights rounded to bf16 by torch (1e-5; rounding the weights moves routers' and the indexer's
selections, so the unrounded model is no reference for it). Needs the reference environment
(make pyref) and a built trex.

  .venv/bin/python tests/reference/live_roundtrip.py --trex build/trex [--family v3|v2|v32] [--out out/roundtrip]
"""
import argparse
import copy
import json
import os
import shutil
import subprocess
import sys

import warnings

import torch
from safetensors import safe_open
from transformers import DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM
from transformers import DeepseekV32Config, DeepseekV32ForCausalLM
from transformers import logging as hf_logging
from transformers.models.deepseek_v32 import modeling_deepseek_v32 as hf32

hf_logging.set_verbosity_error()
warnings.filterwarnings("ignore", message="Initializing zero-element tensors is a no-op")
hf_logging.disable_progress_bar()

V3_CONFIGS = {
    "v3_sigmoid_groups": dict(vocab_size=79, hidden_size=45, num_hidden_layers=3, num_attention_heads=5,
                              num_key_value_heads=5,
                              q_lora_rank=19, kv_lora_rank=13, qk_nope_head_dim=7, qk_rope_head_dim=6, v_head_dim=9,
                              intermediate_size=47, moe_intermediate_size=11, n_routed_experts=9, n_shared_experts=1,
                              num_experts_per_tok=3, n_group=3, topk_group=2, first_k_dense_replace=1,
                              topk_method="noaux_tc", scoring_func="sigmoid", norm_topk_prob=True,
                              routed_scaling_factor=2.5, max_position_embeddings=64,
                              rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=3.0,
                                                   original_max_position_embeddings=16, beta_fast=32, beta_slow=1,
                                                   mscale=1.0, mscale_all_dim=1.0)),
    "v3_noqlora_tied": dict(vocab_size=73, hidden_size=33, num_hidden_layers=2, num_attention_heads=3,
                            num_key_value_heads=3,
                            q_lora_rank=None, kv_lora_rank=9, qk_nope_head_dim=5, qk_rope_head_dim=4, v_head_dim=7,
                            intermediate_size=29, moe_intermediate_size=7, n_routed_experts=5, n_shared_experts=2,
                            num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1,
                            topk_method="noaux_tc", scoring_func="sigmoid", norm_topk_prob=False,
                            routed_scaling_factor=1.0, tie_word_embeddings=True, max_position_embeddings=64),
}
# (transformers' DeepseekV3 router is always sigmoid + noaux_tc, whatever scoring_func and
# topk_method say; trex computes them as DeepSeek's release code does, and make_dumps.py patches
# transformers' gate to match. A round trip through transformers' own forward takes the case
# transformers computes the same way.)
# kv_lora_rank and qk_nope_head_dim even: transformers' fp32 V2 RoPE views them as complex pairs
# (tests/reference/make_dumps_v2.py).
V2_CONFIGS = {
    "v2_lite": dict(vocab_size=71, hidden_size=35, num_hidden_layers=3, num_attention_heads=5, q_lora_rank=None,
                    kv_lora_rank=12, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=7, intermediate_size=41,
                    moe_intermediate_size=9, n_routed_experts=7, n_shared_experts=3, num_experts_per_tok=2,
                    first_k_dense_replace=1, topk_method="greedy", routed_scaling_factor=1.0,
                    tie_word_embeddings=True, max_position_embeddings=64),
    "v2_5": dict(vocab_size=83, hidden_size=39, num_hidden_layers=3, num_attention_heads=3, q_lora_rank=17,
                 kv_lora_rank=10, qk_nope_head_dim=8, qk_rope_head_dim=6, v_head_dim=5, intermediate_size=43,
                 moe_intermediate_size=11, n_routed_experts=10, n_shared_experts=2, num_experts_per_tok=3,
                 n_group=5, topk_group=2, first_k_dense_replace=1, topk_method="group_limited_greedy",
                 routed_scaling_factor=16.0, max_position_embeddings=64,
                 rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                      original_max_position_embeddings=16, beta_fast=32, beta_slow=1,
                                      mscale=0.707, mscale_all_dim=0.707)),
    # n_shared_experts 0: transformers still builds (and saves) an empty shared-expert MLP.
    "v2_noshared": dict(vocab_size=67, hidden_size=27, num_hidden_layers=2, num_attention_heads=3, q_lora_rank=None,
                        kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=5, intermediate_size=31,
                        moe_intermediate_size=7, n_routed_experts=5, n_shared_experts=0, num_experts_per_tok=2,
                        first_k_dense_replace=1, routed_scaling_factor=1.0, max_position_embeddings=64),
}
# V3.2: q_lora_rank is required (transformers' V3.2 has no plain q_proj); num_key_value_heads must
# equal num_attention_heads (its default is 128).
V32_CONFIGS = {
    "v32_small_qlora_yarn": dict(vocab_size=77, hidden_size=45, num_hidden_layers=3, num_attention_heads=5,
                                 num_key_value_heads=5, q_lora_rank=5, kv_lora_rank=11, qk_nope_head_dim=7,
                                 qk_rope_head_dim=6, v_head_dim=9, intermediate_size=47, moe_intermediate_size=11,
                                 n_routed_experts=10, n_shared_experts=1, num_experts_per_tok=3, n_group=2,
                                 topk_group=1, first_k_dense_replace=1, norm_topk_prob=True,
                                 routed_scaling_factor=2.5, index_n_heads=5, index_head_dim=10, index_topk=4,
                                 max_position_embeddings=64,
                                 rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=3.0,
                                                      original_max_position_embeddings=16, beta_fast=32, beta_slow=1,
                                                      mscale=0.8, mscale_all_dim=0.6)),
    "v32_allmoe_tied": dict(vocab_size=69, hidden_size=33, num_hidden_layers=2, num_attention_heads=3,
                            num_key_value_heads=3, q_lora_rank=13, kv_lora_rank=9, qk_nope_head_dim=5,
                            qk_rope_head_dim=4, v_head_dim=7, intermediate_size=29, moe_intermediate_size=7,
                            n_routed_experts=7, n_shared_experts=2, num_experts_per_tok=2, n_group=1, topk_group=1,
                            first_k_dense_replace=0, norm_topk_prob=False, routed_scaling_factor=1.3,
                            index_n_heads=7, index_head_dim=7, index_topk=7, tie_word_embeddings=True,
                            max_position_embeddings=64),
}
IDS = [[1, 5, 9, 13, 2, 40, 33, 7, 8, 21, 3, 17, 60, 0, 44], [4, 4, 19, 23, 1, 0, 66, 12, 30, 2, 9, 9, 50, 6, 11]]
ROUTING = ("topk_method", "scoring_func", "n_group", "topk_group", "routed_scaling_factor", "norm_topk_prob", "q_lora_rank",
           "n_shared_experts", "first_k_dense_replace", "tie_word_embeddings", "rope_parameters",
           "index_topk", "index_n_heads", "index_head_dim", "mlp_layer_types")


# The V3.2 indexer's smallest top-k gap over a forward (the k-th minus the (k+1)-th score of a query
# with more than index_topk causal keys), recomputed as transformers computes the scores. ReLU makes
# exact ties (gap 0) likely with few indexer heads: torch.topk's choice among them is unspecified
# (trex takes the lower index), so a case whose gap is not above fp32 round-off is reported, not
# compared.
V32_GAP = []
HF_INDEXER_FORWARD = hf32.DeepseekV32Indexer.forward


@torch.no_grad()
def indexer_gap(self, hidden_states, q_resid, position_embeddings, attention_mask, position_ids, cache=None, **kw):
    B, S, _ = hidden_states.shape
    cos, sin = position_embeddings
    dr = self.qk_rope_head_dim
    q = self.wq_b(q_resid).view(B, S, self.n_heads, self.head_dim)
    k = self.k_norm(self.wk(hidden_states)).unsqueeze(2)
    q_rot, k_rot = hf32.apply_rotary_pos_emb(q[..., :dr], k[..., :dr], cos, sin, unsqueeze_dim=2)
    q = torch.cat([q_rot, q[..., dr:]], dim=-1)
    k = torch.cat([k_rot, k[..., dr:]], dim=-1).squeeze(2)
    scores = torch.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * self.softmax_scale)
    w = self.weights_proj(hidden_states).float() * (self.n_heads ** -0.5)
    s = torch.matmul(w.unsqueeze(-2), scores).squeeze(-2)  # [B, S, S]
    K = self.index_topk
    for t in range(K, S):  # query t has t + 1 causal keys
        top = s[:, t, :t + 1].sort(dim=-1, descending=True)[0]
        V32_GAP.append(float((top[:, K - 1] - top[:, K]).min()))
    return HF_INDEXER_FORWARD(self, hidden_states, q_resid, position_embeddings, attention_mask, position_ids,
                              cache=cache, **kw)


hf32.DeepseekV32Indexer.forward = indexer_gap


def rel(a, b):
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def names(d):  # leaving out empty tensors (n_shared_experts 0), which trex does not write
    out = []
    for f in os.listdir(d):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(d, f), "pt") as st:
                out += [k for k in st.keys() if st.get_slice(k).get_shape().count(0) == 0]
    return sorted(out)


FAMILIES = {"v3": (DeepseekV3Config, DeepseekV3ForCausalLM, V3_CONFIGS),
            "v2": (DeepseekV2Config, DeepseekV2ForCausalLM, V2_CONFIGS),
            "v32": (DeepseekV32Config, DeepseekV32ForCausalLM, V32_CONFIGS)}


def one(family, name, kw, trex, out, seed):
    ok = True
    torch.manual_seed(seed)
    Config, Model, _ = FAMILIES[family]
    cfg = Config(**kw)
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    m = Model(cfg).float().eval()
    with torch.no_grad():  # off the constant initial values (norms 1), routers spread out
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    saved = os.path.join(out, name, "saved")
    m.save_pretrained(saved)
    ids = torch.tensor(IDS)
    V32_GAP.clear()
    with torch.no_grad():
        o = m(ids, labels=ids)
    ref_logits, ref_loss = o.logits, float(o.loss)
    if family == "v32":
        gap = min(V32_GAP)
        print(f"{'ok  ' if gap > 1e-6 else 'FAIL'} {name}: the indexer selects {kw['index_topk']} of up to "
              f"{len(IDS[0])} keys per query, smallest top-k gap {gap:.1e}"
              + ("" if gap > 1e-6 else " (a tie: the reference's choice is unspecified; change the config)"))
        if gap <= 1e-6:
            return False
    batch = os.path.join(out, name, "batch.json")
    with open(batch, "w") as f:
        json.dump({"input_ids": IDS, "labels": IDS}, f)
    r = subprocess.run([trex, "grad", "--model", saved, "--batch", batch, "--out", os.path.join(out, name, "g.safetensors")],
                       capture_output=True, text=True)
    if r.returncode:
        print(f"FAIL {name}: trex grad on the save_pretrained checkpoint: {r.stderr.strip()}")
        return False
    loss = json.loads(r.stdout.strip().splitlines()[-1])["loss"]
    e = abs(loss - ref_loss) / abs(ref_loss)
    ok &= e <= 1e-5
    print(f"{'ok  ' if e <= 1e-5 else 'FAIL'} {name}: trex loss on the save_pretrained checkpoint {loss:.7f} vs "
          f"transformers {ref_loss:.7f} (rel {e:.1e})")
    # The bf16 copy is compared with the saved model's weights rounded to bf16 by torch (round to
    # nearest even), so the check does not depend on how far rounding moves a router's or the
    # indexer's selection.
    rounded = copy.deepcopy(m)
    with torch.no_grad():
        for p in rounded.parameters():
            p.copy_(p.to(torch.bfloat16).float())
        bf16_logits = rounded(ids).logits
    for dtype, tol, want in (("f32", 1e-5, ref_logits), ("bf16", 1e-5, bf16_logits)):
        dst = os.path.join(out, name, dtype)
        r = subprocess.run([trex, "convert", "--model", saved, "--out", dst, "--dtype", dtype], capture_output=True,
                           text=True)
        if r.returncode:
            print(f"FAIL {name}: trex convert --dtype {dtype}: {r.stderr.strip()}")
            ok = False
            continue
        same = names(dst) == names(saved)
        ok &= same
        print(f"{'ok  ' if same else 'FAIL'} {name}: trex convert --dtype {dtype} writes save_pretrained's names")
        back = Model.from_pretrained(dst, attn_implementation="eager", experts_implementation="eager",
                                                     dtype=torch.float32).eval()
        # (A key the original config does not have, such as V2's scoring_func, is not compared; trex
        # writes V3's RoPE as the releases do, rope_scaling with the legacy "type" beside "rope_type".)
        def norm(k, v):
            return {x: y for x, y in v.items() if x != "type"} if k == "rope_parameters" and v else v
        diff = [k for k in ROUTING if getattr(m.config, k, None) is not None
                and norm(k, getattr(back.config, k, None)) != norm(k, getattr(m.config, k, None))
                and not (k in ("n_group", "topk_group") and getattr(cfg, "topk_method", None) == "greedy")]
        ok &= not diff
        print(f"{'ok  ' if not diff else 'FAIL'} {name}: the converted config.json reads back the same "
              f"{', '.join(ROUTING)}" + (f" (differs: {diff})" if diff else ""))
        with torch.no_grad():
            e = rel(back(ids).logits, want)
        ok &= e <= tol
        print(f"{'ok  ' if e <= tol else 'FAIL'} {name}: save_pretrained -> trex convert --dtype {dtype} -> "
              f"from_pretrained: logits rel {e:.1e}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trex", default="build/trex")
    ap.add_argument("--out", default="out/roundtrip")
    ap.add_argument("--family", choices=["all", *FAMILIES], default="all")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    shutil.rmtree(a.out, ignore_errors=True)
    ok = True
    for family, (_, _, configs) in FAMILIES.items():
        if a.family not in ("all", family):
            continue
        for name, kw in configs.items():
            ok &= one(family, name, kw, a.trex, a.out, a.seed)
    print("transformers", __import__("transformers").__version__, "torch", torch.__version__)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
