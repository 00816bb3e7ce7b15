"""The small DeepSeek-V4 model of the decoding benchmark (tools/bench/decode_v4.sh), and the
transformers peer: DeepseekV4ForCausalLM.generate, greedy, on the same checkpoint.

  .venv/bin/python tools/bench/decode_v4_hf.py --make DIR
      writes a random-init model (CONFIG below, fp32, fixed seed) with save_pretrained
  .venv/bin/python tools/bench/decode_v4_hf.py --model DIR --context C --new N [--threads 1]
      prints one JSON line: prefill seconds (until the first token's logits), decode seconds (the
      N one-token steps after it) and decode tokens/s, as `trex bench decode` prints them
"""
import argparse
import json
import time

import torch
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM, LogitsProcessor, LogitsProcessorList

# A small V4: every attention kind (sliding, CSA at rate 4, HCA at rate 128, as the release),
# a 128-token window, 4 hyper-connection streams, hash and top-k MoE layers.
CONFIG = dict(vocab_size=2048, hidden_size=256, num_hidden_layers=4, num_attention_heads=8, head_dim=64,
              partial_rotary_factor=0.25, q_lora_rank=128, o_groups=4, o_lora_rank=64, moe_intermediate_size=128,
              n_routed_experts=16, num_experts_per_tok=2, n_shared_experts=1, sliding_window=128,
              compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
              layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                           "compressed_sparse_attention"],
              mlp_layer_types=["hash_moe", "moe", "moe", "moe"], index_n_heads=4, index_head_dim=32, index_topk=64,
              hc_mult=4, hc_sinkhorn_iters=20, num_nextn_predict_layers=0, max_position_embeddings=8192,
              initializer_range=0.02)


def make(out):
    torch.manual_seed(0)
    cfg = DeepseekV4Config(**CONFIG)
    m = DeepseekV4ForCausalLM(cfg).float().eval()
    with torch.no_grad():  # a random hash table (transformers leaves it zero)
        for mod in m.modules():
            if hasattr(mod, "tid2eid"):
                k = CONFIG["num_experts_per_tok"]
                mod.tid2eid.copy_(torch.rand(CONFIG["vocab_size"], CONFIG["n_routed_experts"]).argsort(-1)[:, :k])
    m.save_pretrained(out)


def bench(a):
    torch.set_num_threads(a.threads)
    m = DeepseekV4ForCausalLM.from_pretrained(a.model, torch_dtype=torch.float32,
                                              attn_implementation="eager").eval()
    m.config._experts_implementation = "eager"
    g = torch.Generator().manual_seed(a.seed)
    ids = torch.randint(0, m.config.vocab_size, (1, a.context), generator=g)

    # One generate of N + 1 tokens; a logits processor stamps the time of each step's logits: the
    # first stamp ends the prefill, the N steps after it are the decoding.
    stamps = []

    class Stamp(LogitsProcessor):
        def __call__(self, input_ids, scores):
            stamps.append(time.perf_counter())
            return scores

    t0 = time.perf_counter()
    with torch.no_grad():
        out = m.generate(ids, max_new_tokens=a.new + 1, min_new_tokens=a.new + 1, do_sample=False, use_cache=True,
                         pad_token_id=0, logits_processor=LogitsProcessorList([Stamp()]))
    assert out.shape[1] == a.context + a.new + 1 and len(stamps) == a.new + 1
    dec = stamps[-1] - stamps[0]
    print(json.dumps({"impl": "transformers generate", "transformers": __import__("transformers").__version__,
                      "torch": torch.__version__, "context": a.context, "new": a.new, "threads": a.threads,
                      "prefill_s": round(stamps[0] - t0, 4), "decode_s": round(dec, 4),
                      "decode_tokens_per_s": round(a.new / dec, 3)}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--make")
    ap.add_argument("--model")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.make:
        make(a.make)
    else:
        bench(a)


if __name__ == "__main__":
    main()
