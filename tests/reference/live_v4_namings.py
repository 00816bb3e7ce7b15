#!/usr/bin/env python3
"""Live round trip of DeepSeek-V4 checkpoint namings through the installed transformers:

  DeepseekV4ForCausalLM.save_pretrained -> trex grad (loss) -> trex convert (hf, original and
  transformers layouts) -> DeepseekV4ForCausalLM.from_pretrained of each -> the same logits; the
  transformers layout holds exactly the names save_pretrained wrote.

save_pretrained writes transformers' third naming (model.layers.N.attn.wq_a.weight, per-expert
ffn.experts.E.w1, head.weight, model.embed_tokens.weight, model.hc_head.hc_fn). Passes when trex's
loss equals transformers' to 1e-5 relative and every reloaded model's logits equal the saved
model's to 1e-5 relative. Needs the reference environment (make pyref) and a built trex.

  .venv/bin/python tests/reference/live_v4_namings.py --trex build/trex [--out out/v4_namings]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import torch
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

# Odd sizes: hidden 22, 3 heads of 10, CSA (rate 3) / HCA (rate 7) / sliding (window 5), hash routing
# in the first layer, 5 experts top-2, hc_mult 3 (the unit tests' tiny_v4 without its MTP block,
# which transformers does not have).
CONFIG = dict(vocab_size=61, hidden_size=22, num_hidden_layers=3, num_attention_heads=3, head_dim=10,
              partial_rotary_factor=0.4, q_lora_rank=9, o_groups=3, o_lora_rank=5, moe_intermediate_size=7,
              n_routed_experts=5, num_experts_per_tok=2, n_shared_experts=1, sliding_window=5,
              compress_rates={"compressed_sparse_attention": 3, "heavily_compressed_attention": 7},
              layer_types=["compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"],
              mlp_layer_types=["hash_moe", "moe", "moe"], index_n_heads=5, index_head_dim=6, index_topk=2,
              hc_mult=3, hc_sinkhorn_iters=5, swiglu_limit=0.9, compress_rope_theta=5000.0,
              initializer_range=0.3, num_nextn_predict_layers=0, max_position_embeddings=64)
IDS = [[1, 5, 9, 13, 2, 40, 33, 7, 8, 21, 3, 17, 60, 0, 44]]


def rel(a, b):
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trex", default="build/trex")
    ap.add_argument("--out", default="out/v4_namings")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    shutil.rmtree(a.out, ignore_errors=True)
    os.makedirs(a.out)
    torch.manual_seed(a.seed)
    cfg = DeepseekV4Config(**CONFIG)
    cfg._attn_implementation = "eager"  # transformers' grouped_mm wants 16-byte strides on CPU
    cfg._experts_implementation = "eager"
    m = DeepseekV4ForCausalLM(cfg).float().eval()
    with torch.no_grad():  # off the constant initial values (norms 1, biases 0), hash table random
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
        for mod in m.modules():
            if hasattr(mod, "tid2eid"):
                mod.tid2eid.copy_(torch.rand(CONFIG["vocab_size"], CONFIG["n_routed_experts"]).argsort(-1)[:, :2])
    saved = os.path.join(a.out, "saved")
    m.save_pretrained(saved)
    ids = torch.tensor(IDS)
    with torch.no_grad():
        out = m(ids, labels=ids)
    ref_logits, ref_loss = out.logits, float(out.loss)
    batch = os.path.join(a.out, "batch.json")
    with open(batch, "w") as f:
        json.dump({"input_ids": IDS, "labels": IDS}, f)

    ok = True
    r = subprocess.run([a.trex, "grad", "--model", saved, "--batch", batch, "--out", os.path.join(a.out, "g.safetensors")],
                       capture_output=True, text=True)
    if r.returncode:
        print(f"FAIL trex grad on the save_pretrained checkpoint: {r.stderr.strip()}")
        return 1
    loss = json.loads(r.stdout.strip().splitlines()[-1])["loss"]
    e = abs(loss - ref_loss) / abs(ref_loss)
    ok &= e <= 1e-5
    print(f"{'ok  ' if e <= 1e-5 else 'FAIL'} trex loss on the save_pretrained naming: {loss:.7f} vs transformers "
          f"{ref_loss:.7f} (rel {e:.1e})")
    for layout in ("hf", "original", "transformers"):
        dst = os.path.join(a.out, layout)
        r = subprocess.run([a.trex, "convert", "--model", saved, "--out", dst, "--layout", layout, "--dtype", "f32"],
                           capture_output=True, text=True)
        if r.returncode:
            print(f"FAIL trex convert --layout {layout}: {r.stderr.strip()}")
            ok = False
            continue
        if layout == "transformers":  # the very names save_pretrained wrote
            from safetensors import safe_open
            names = lambda d: sorted(k for f in os.listdir(d) if f.endswith(".safetensors")
                                     for k in safe_open(os.path.join(d, f), "pt").keys())
            same = names(dst) == names(saved)
            ok &= same
            print(f"{'ok  ' if same else 'FAIL'} trex convert --layout transformers writes save_pretrained's names")
        back = DeepseekV4ForCausalLM.from_pretrained(dst, attn_implementation="eager", experts_implementation="eager",
                                                     dtype=torch.float32).eval()
        with torch.no_grad():
            e = rel(back(ids).logits, ref_logits)
        ok &= e <= 1e-5
        print(f"{'ok  ' if e <= 1e-5 else 'FAIL'} save_pretrained -> trex convert --layout {layout} -> from_pretrained: "
              f"logits rel {e:.1e}")
    print("transformers", __import__("transformers").__version__, "torch", torch.__version__)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
