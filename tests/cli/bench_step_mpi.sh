#!/usr/bin/env bash
# `trex bench calibrate` and `trex bench step` on 1 and 2 MPI ranks (issues 5 and 7): the 2-rank
# step trains data parallel, reports its exposed communication and the planner's prediction from a
# 2-rank calibration, and --trace writes one Chrome trace with a compute and a communication track
# per rank (bucket reduce-scatters and all-gathers on the latter); under parallel.cp the time in the
# context-parallel collectives is reported apart (cp_comm_ms).
# usage: bench_step_mpi.sh TREX MPIEXEC
set -euo pipefail
TREX=$1
MPIEXEC=${2:-mpirun}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cat > "$W/tiny.toml" <<'T'
[model]
model_type = "deepseek_v3"
vocab_size = 517
hidden_size = 72
intermediate_size = 136
moe_intermediate_size = 40
num_hidden_layers = 3
first_k_dense_replace = 1
num_attention_heads = 3
q_lora_rank = 40
kv_lora_rank = 24
qk_nope_head_dim = 16
qk_rope_head_dim = 8
v_head_dim = 16
n_routed_experts = 5
num_experts_per_tok = 2
n_shared_experts = 1
[data]
seq_len = 96
[train]
batch_size = 2
threads = 1
[parallel]
bucket_size = 20000
T
MPI=("$MPIEXEC" --allow-run-as-root --oversubscribe -np 2 -x TREX_THREADS=1)
"${MPI[@]}" "$TREX" bench calibrate --seconds 0.05 --out "$W/cal2.json" > "$W/cal2.out"
TREX_THREADS=1 "$TREX" bench calibrate --seconds 0.05 --out "$W/cal1.json" > "$W/cal1.out"
"${MPI[@]}" "$TREX" bench step --config "$W/tiny.toml" --steps 2 --warmup 1 --calibration "$W/cal2.json" \
  --trace "$W/trace.json" > "$W/step2.json" 2> "$W/step2.err"
TREX_THREADS=1 "$TREX" bench step --config "$W/tiny.toml" --steps 2 --warmup 1 --calibration "$W/cal1.json" \
  > "$W/step1.json" 2> "$W/step1.err"
"${MPI[@]}" "$TREX" bench step --config "$W/tiny.toml" --steps 2 --warmup 1 --set parallel.cp=2 \
  > "$W/stepcp.json" 2> "$W/stepcp.err"
python3 - "$W" <<'P'
import json, sys, os
w = sys.argv[1]
cal2 = json.load(open(f"{w}/cal2.json")); cal1 = json.load(open(f"{w}/cal1.json"))
assert cal2["ranks_per_node"] == 2 and cal2["network"]["intra_node_gbs"] > 0, cal2
assert cal1["ranks_per_node"] == 1, cal1
# measured on 2 ranks: the share of a bucket's reduce-scatter that hides behind GEMMs
assert 0 <= cal2["efficiency"]["overlap"] <= 1, cal2["efficiency"]
for k in ("gemm", "grouped_gemm", "head", "attention", "sparse_attention", "indexer", "optimizer", "memory"):
    assert 0 < cal2["efficiency"][k] <= 1 and 0 < cal1["efficiency"][k] <= 1, k
s2 = json.loads(open(f"{w}/step2.json").read().strip().splitlines()[-1])
s1 = json.loads(open(f"{w}/step1.json").read().strip().splitlines()[-1])
assert s2["ranks"] == 2 and s1["ranks"] == 1, (s1, s2)
assert s2["comm_ms"] > 0 and s1["comm_ms"] == 0, (s1["comm_ms"], s2["comm_ms"])
# the context-parallel collectives' share of the exposed communication: none without cp
scp = json.loads(open(f"{w}/stepcp.json").read().strip().splitlines()[-1])
assert s1["cp_comm_ms"] == 0 and s2["cp_comm_ms"] == 0, (s1["cp_comm_ms"], s2["cp_comm_ms"])
assert 0 < scp["cp_comm_ms"] <= scp["comm_ms"], (scp["cp_comm_ms"], scp["comm_ms"])
assert abs(s2["tokens_per_s"] - 2 * 2 * 96 / (s2["step_ms_median"] / 1000)) < 0.01 * s2["tokens_per_s"], s2
for s in (s1, s2):
    assert s["plan_step_ms"] is not None and s["plan_step_ms"] > 0, s
    assert s["plan_memory_mb"] is not None and s["plan_memory_mb"] > 0, s
t = json.load(open(f"{w}/trace.json"))
ev = [e for e in t["traceEvents"] if e["ph"] == "X"]
for rank in (0, 1):
    mine = [e for e in ev if e["pid"] == rank]
    comp = [e for e in mine if e["tid"] == 0]
    comm = [e for e in mine if e["tid"] == 1]
    assert any(e["name"] == "step 0" for e in comp) and any(e["name"] == "step 1" for e in comp), rank
    assert any(e["name"].startswith("fwd.") for e in comp), rank
    assert any(e["name"].startswith("reduce-scatter bucket") for e in comm), rank
    assert any(e["name"].startswith("all-gather bucket") for e in comm), rank
    assert all(e["dur"] >= 0 for e in mine)
    # every collective lies inside one of the traced steps, except the parameter all-gathers: they
    # start at the end of a step's update and run on into the next step's forward
    # (parallel.overlap_params), so they end inside a step and some cross a step's start
    steps = [e for e in comp if e["name"].startswith("step ")]
    inside = lambda t, s: s["ts"] - 1 <= t <= s["ts"] + s["dur"] + 1
    for e in comm:
        if e["name"].startswith("all-gather"):
            assert any(inside(e["ts"] + e["dur"], s) for s in steps), e
        else:
            assert any(inside(e["ts"], s) and inside(e["ts"] + e["dur"], s) for s in steps), e
    ag = [e for e in comm if e["name"].startswith("all-gather")]
    assert any(e["ts"] < s["ts"] < e["ts"] + e["dur"] for e in ag for s in steps), "no all-gather ran into a step"
names = {e["args"]["name"] for e in t["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
assert names == {"compute", "communication"}, names
assert not [f for f in os.listdir(w) if f.endswith(".part")], os.listdir(w)
print("OK: calibrations (1 and 2 ranks), bench step 1 rank %.0f tok/s, 2 ranks %.0f tok/s (comm %.1f ms), "
      "plan %.1f / %.1f ms, trace %d events" % (s1["tokens_per_s"], s2["tokens_per_s"], s2["comm_ms"],
      s1["plan_step_ms"], s2["plan_step_ms"], len(ev)))
P
