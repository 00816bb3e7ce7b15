#!/usr/bin/env bash
# `trex bench kernels` (issue 8) on a tiny DeepSeek-V3 and a tiny DeepSeek-V4 config (odd sizes, MTP
# on for V4; the V3 config again with its MTP layer trained): every kernel a step runs has its row with finite positive figures, calls/step match
# the layer structure, the shares add up to 100%, --json lines parse, and a bad config is a user
# error naming the file and the key.
# usage: bench_kernels.sh TREX
set -euo pipefail
TREX=$1
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cat > "$W/v3.toml" <<'T'
[model]
model_type = "deepseek_v3"
vocab_size = 517
hidden_size = 70
intermediate_size = 135
moe_intermediate_size = 41
num_hidden_layers = 3
first_k_dense_replace = 1
num_attention_heads = 3
q_lora_rank = 39
kv_lora_rank = 23
qk_nope_head_dim = 15
qk_rope_head_dim = 6
v_head_dim = 17
n_routed_experts = 5
num_experts_per_tok = 3
n_shared_experts = 1
[data]
seq_len = 47
[train]
batch_size = 3
threads = 1
T
cat > "$W/v4.toml" <<'T'
[model]
model_type = "deepseek_v4"
vocab_size = 61
hidden_size = 22
num_hidden_layers = 3
num_attention_heads = 3
num_key_value_heads = 1
head_dim = 10
partial_rotary_factor = 0.6
q_lora_rank = 9
o_groups = 3
o_lora_rank = 5
moe_intermediate_size = 7
n_routed_experts = 5
num_experts_per_tok = 3
n_shared_experts = 1
scoring_func = "sqrtsoftplus"
swiglu_limit = 0.9
sliding_window = 5
compress_rates = { compressed_sparse_attention = 3, heavily_compressed_attention = 7 }
layer_types = ["compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"]
mlp_layer_types = ["hash_moe", "moe", "moe"]
index_n_heads = 5
index_head_dim = 10
index_topk = 3
hc_mult = 3
hc_sinkhorn_iters = 5
compress_rope_theta = 5000.0
rope_parameters = { rope_type = "yarn", factor = 3.0, original_max_position_embeddings = 8 }
max_position_embeddings = 64
num_nextn_predict_layers = 1
[data]
seq_len = 45
[train]
batch_size = 3
mtp_loss_weight = 0.3
T
"$TREX" bench kernels --config "$W/v3.toml" --seconds 0.02 > "$W/v3.md" 2> "$W/v3.err"
"$TREX" bench kernels --config "$W/v3.toml" --seconds 0.02 --passes 2 --json > "$W/v3.jsonl" 2> /dev/null
"$TREX" bench kernels --config "$W/v3.toml" --seconds 0.02 --filter grouped_gemm --set data.seq_len=31 --json \
  > "$W/v3f.jsonl" 2> /dev/null
# The V3 config with one MTP layer, trained: its decoder layer, norms, eh_proj and head are rows.
sed 's/^n_shared_experts = 1/n_shared_experts = 1\nnum_nextn_predict_layers = 1/; s/^threads = 1/threads = 1\nmtp_loss_weight = 0.3/' \
  "$W/v3.toml" > "$W/v3mtp.toml"
"$TREX" bench kernels --config "$W/v3mtp.toml" --seconds 0.02 --json > "$W/v3mtp.jsonl" 2> /dev/null
"$TREX" bench kernels --config "$W/v4.toml" --seconds 0.02 --threads 2 > "$W/v4.md" 2> "$W/v4.err"
"$TREX" bench kernels --config "$W/v4.toml" --seconds 0.02 --threads 2 --json > "$W/v4.jsonl" 2> /dev/null

# Bad configs are user errors (exit 2) naming the file and the field: an unknown key, a bad value.
sed 's/^batch_size = 3/batch_sise = 3/' "$W/v3.toml" > "$W/bad_key.toml"
sed 's/^hidden_size = 70/hidden_size = -70/' "$W/v3.toml" > "$W/bad_value.toml"
for bad in bad_key:batch_sise bad_value:hidden_size; do
  f=${bad%%:*} field=${bad##*:}
  set +e
  "$TREX" bench kernels --config "$W/$f.toml" --seconds 0.02 > /dev/null 2> "$W/$f.err"
  rc=$?
  set -e
  [ "$rc" = 2 ] || { echo "$f: exit $rc, want 2"; cat "$W/$f.err"; exit 1; }
  grep -q "$f.toml" "$W/$f.err" && grep -q "$field" "$W/$f.err" || { echo "$f message:"; cat "$W/$f.err"; exit 1; }
done

python3 - "$W" <<'P'
import json, math, sys
w = sys.argv[1]
common = ["gemm_bf16 fwd", "gemm_bf16 dx", "gemm_bf16 dW", "gemm_f32 fwd", "gemm_f32 dx", "gemm_f32 dW",
          "to_bf16", "grouped_gemm fwd", "grouped_gemm dx", "grouped_gemm dW", "rmsnorm_fwd", "rmsnorm_bwd",
          "rope_apply", "rope_apply inverse", "swiglu_fwd", "swiglu_bwd", "router_select", "router bwd",
          "moe dispatch", "moe combine", "moe combine bwd", "moe dispatch bwd", "lm_head_ce", "adamw_step",
          "sum_squares"]
expect = {"v3": common + ["attention_fwd", "attention_bwd"],
          "v4": common + ["sparse_attn_fwd", "sparse_attn_bwd", "indexer_topk", "compress_pool_fwd",
                          "compress_pool_bwd", "hc_pre_fwd", "hc_pre_bwd", "hc_post_fwd", "hc_post_bwd",
                          "hc_pre_bwd_then_post", "hc_head_fwd", "hc_head_bwd"]}
d = {"v3": 70, "v4": 22}
N = {"v3": 3 * 47, "v4": 3 * 45}

def num(s):
    return float(s.split()[0].rstrip("%"))

for cfg in ("v3", "v4"):
    # Markdown: a row per kernel, finite positive figures (AI may be 0 for pure copies).
    rows = [l for l in open(f"{w}/{cfg}.md") if l.startswith("| ") and not l.startswith("| kernel")]
    body = [[c.strip() for c in l.strip().strip("|").split("|")] for l in rows]
    kern = [r for r in body if r[0] != "**total**"]
    total = [r for r in body if r[0] == "**total**"]
    assert len(total) == 1, cfg
    names = {r[0] for r in kern}
    missing = [k for k in expect[cfg] if k not in names]
    assert not missing, (cfg, missing)
    if cfg == "v4":
        assert "attention_fwd" not in names, names
    for r in kern:
        calls = int(r[3])
        ms, rate, ai, roof, ms_step, share = (num(r[i]) for i in range(4, 10))
        for v in (ms, rate, roof, ms_step):
            assert math.isfinite(v) and v > 0, (cfg, r)
        assert calls > 0 and math.isfinite(ai) and ai >= 0 and 0 <= share <= 100, (cfg, r)
        assert r[5].endswith("GFLOP/s") or r[5].endswith("GB/s"), r
    # JSON: one object per line, machine first, total last.
    recs = [json.loads(l) for l in open(f"{w}/{cfg}.jsonl") if l.strip()]
    assert recs[0]["record"] == "machine" and recs[-1]["record"] == "total", cfg
    assert recs[0]["passes"] == (2 if cfg == "v3" else 1), recs[0]
    m = recs[0]
    assert m["fp32_gflops"] > 0 and m["mem_bw_gbs"] > 0 and m["tokens"] == N[cfg], m
    # bf16 GEMMs are rated against the fastest units, the AMX tiles included where oneDNN uses them
    assert m["amx_bf16_gflops"] >= 0 and m["best_gflops"] == max(m["fp32_gflops"], m["bf16_gflops"],
                                                                  m["amx_bf16_gflops"]), m
    ks = [r for r in recs if r["record"] == "kernel"]
    assert {r["kernel"] for r in ks} == names, (cfg, {r["kernel"] for r in ks} ^ names)
    for r in ks:
        for k in ("ms_call", "gbs", "roofline_pct", "ms_step", "bytes"):
            assert math.isfinite(r[k]) and r[k] > 0, (cfg, k, r)
        assert math.isfinite(r["gflops"]) and r["gflops"] >= 0 and r["ai"] >= 0, r  # 0 for pure copies
        assert abs(r["ms_step"] - r["calls"] * r["ms_call"]) <= 1e-6 * r["ms_step"] + 1e-9, r
        assert r["bound"] in ("compute", "memory"), r
    assert abs(sum(r["share_pct"] for r in ks) - 100) < 0.01, cfg
    assert abs(sum(r["ms_step"] for r in ks) - recs[-1]["ms_step"]) < 1e-6 * recs[-1]["ms_step"], cfg

    def calls(kernel, shape=None):
        return sum(r["calls"] for r in ks if r["kernel"] == kernel and (shape is None or r["shape"] == shape))
    nd = f"{N[cfg]}x{d[cfg]}"
    assert calls("lm_head_ce") == (1 if cfg == "v3" else 2), cfg  # V4: the MTP head too
    assert calls("adamw_step") == 1 and calls("sum_squares") == 1, cfg
    if cfg == "v3":  # 3 layers (1 dense + 2 MoE): two norms each + the final one, fwd and bwd
        assert calls("attention_fwd") == 3 and calls("attention_bwd") == 3
        assert calls("rmsnorm_fwd", nd) == 7 and calls("rmsnorm_bwd", nd) == 7, calls("rmsnorm_fwd", nd)
        assert calls("router_select") == 2 and calls("grouped_gemm fwd") == 4 and calls("grouped_gemm dW") == 4
        assert calls("moe dispatch") == 4  # forward, and the gather again in backward
        assert calls("rope_apply") == 6 and calls("rope_apply inverse") == 6  # q, k_pe / dq, dk_pe
    else:  # 3 layers + 1 MTP block (sliding attention), every one MoE
        assert calls("sparse_attn_fwd") == 4 and calls("sparse_attn_bwd") == 4
        assert len([r for r in ks if r["kernel"] == "sparse_attn_fwd"]) == 3  # sliding, csa, hca
        assert calls("indexer_topk") == 1 and calls("compress_pool_bwd") == 2 and calls("compress_pool_fwd") == 3
        assert calls("hc_pre_fwd") == 8 and calls("hc_head_bwd") == 2
        # each block's backward: the attention's pre step, the MoE's post step, and the MoE's pre
        # step with the attention's post step in one pass
        assert calls("hc_pre_bwd") == 4 and calls("hc_post_bwd") == 4 and calls("hc_pre_bwd_then_post") == 4
        assert calls("router_select") == 4
        # q and dO rotated, o and dq rotated back, in each of the 4 blocks
        nh = [r for r in ks if r["shape"].startswith(f"N={N[cfg]} H=3 D=6 ")]
        assert sum(r["calls"] for r in nh if r["kernel"] == "rope_apply") == 8, nh
        assert sum(r["calls"] for r in nh if r["kernel"] == "rope_apply inverse") == 8, nh
        # input and post-attention norms of 4 blocks, 2 heads, the MTP embedding norm
        assert calls("rmsnorm_fwd", nd) == 11 and calls("rmsnorm_bwd", nd) == 11, calls("rmsnorm_fwd", nd)
    if cfg == "v3":  # --filter keeps the matching rows only, with their calls per step; --set overrides
        f = [json.loads(l) for l in open(f"{w}/v3f.jsonl") if l.strip()]
        assert f[0]["tokens"] == 3 * 31, f[0]
        fk = [r for r in f if r["record"] == "kernel"]
        assert fk and all(r["kernel"].startswith("grouped_gemm") for r in fk), fk
        full = {(r["kernel"], r["calls"]) for r in ks if r["kernel"].startswith("grouped_gemm")}
        assert {(r["kernel"], r["calls"]) for r in fk} == full and all("R=279 " in r["shape"] for r in fk), fk
        assert abs(sum(r["share_pct"] for r in fk) - 100) < 0.01
    if cfg == "v3":  # with the MTP layer: one more decoder layer (MoE), enorm, hnorm, eh_proj, its head
        m = [json.loads(l) for l in open(f"{w}/v3mtp.jsonl") if l.strip()]
        mk = [r for r in m if r["record"] == "kernel"]

        def mcalls(kernel, shape=None):
            return sum(r["calls"] for r in mk if r["kernel"] == kernel and (shape is None or r["shape"] == shape))
        assert mcalls("lm_head_ce") == 2 and mcalls("attention_fwd") == 4 and mcalls("attention_bwd") == 4, mk
        assert mcalls("router_select") == 3 and mcalls("grouped_gemm fwd") == 6, mk
        assert mcalls("rmsnorm_fwd", nd) == 12 and mcalls("rmsnorm_bwd", nd) == 12, mcalls("rmsnorm_fwd", nd)
        eh = {r["kernel"]: r["shape"] for r in mk if "mtp.eh_proj" in r["where"]}  # [N, 2d] -> [N, d]
        fwd = [s for k, s in eh.items() if k.startswith("gemm_") and k.endswith(" fwd")]
        assert fwd == [f"{N[cfg]}x{d[cfg]}x{2 * d[cfg]}"] and len([k for k in eh if k.startswith("gemm_")]) == 3, eh
    print("OK %s: %d kernel rows, %.2f ms of kernels per step, %.1f%% of the roofline"
          % (cfg, len(ks), recs[-1]["ms_step"], recs[-1]["roofline_pct"]))
P
