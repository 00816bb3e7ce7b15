#!/usr/bin/env bash
# The DeepSeek-V3.2 indexer loss, demonstrated (docs/V32.md, "Indexer loss: a demonstration"):
# a small V3.2 model trained briefly from random weights at a short context, then CPT at a longer
# context on the same text, same steps and same batches, three ways:
#   (a) indexer_loss_weight = 0   (the default: the indexer stays as initialized, frozen)
#   (b) sparse stage, weight W    (top-k attention; the indexer learns from its KL loss)
#   (c) dense warm-up for WARM steps (only the indexer trains, attention dense), then (b)'s run
#       from that checkpoint (so its sparse stage sees (a)'s and (b)'s batches, in the same order)
# and prints a table: steps, final train loss, eval loss and the top-k recall of the attention
# mass before and after, and writes it with the machine, date, commit and command to
# benchmarks/results/<date>-<HHMM>-indexer-loss.md. One thread by default, a few minutes.
#
#   tools/bench/indexer_loss_demo.sh [--out DIR] [--trex PATH] [--threads N] [--md FILE] [--seed N]
#
#   --out DIR   work directory (default runs/indexer-loss-demo; removed and rebuilt)
#   --trex P    the trex binary (default build/trex)
#   --threads N train.threads of every run (default 1)
#   --md FILE   where the markdown goes (default benchmarks/results/<date>-<HHMM>-indexer-loss.md)
#   --seed N    train.seed of every run: the initialization and the data order (default 7)
#
# BASE_STEPS, CPT_STEPS, WARM and PROBE_STEPS (steps) and DOCS (documents) in the environment
# override the sizes below, e.g. for a quick try of the script itself.
#
# Recall. trex reports indexer_recall only while the indexer loss is on (weight > 0), and run (a)
# must keep weight 0. So every checkpoint (the short-context model, the warm-up's and each run's
# last) is measured the same way by a probe: `trex train` on the held-out documents with the
# sparse stage's loss on (weight 1), optim.lr = 0 and train.bias_update_gamma = 0, which leave every
# weight and router bias as it was (the script checks the probe's checkpoint byte for byte); the
# probe's mean indexer_recall over its PROBE_STEPS batches is the share of the dense attention's
# mass (per head, averaged over heads, queries and layers) on the indexer's top-k, and its CE is
# the held-out loss. The runs' own eval loss (data.eval = the same held-out documents) and their
# own indexer_recall where reported (training batches; in the dense warm-up the heads' summed
# probabilities on the top-k, docs/V32.md) are printed as well.
#
# Data: the Debian package `fortunes` (as recipes/or), consecutive fortunes joined into documents
# of at least DOC_CHARS characters, so that a CPT row is one document and attention spans it.
set -euo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/indexer_loss_lib.sh"
ild_setup indexer_loss_demo.sh indexer-loss-demo "${BASH_SOURCE[0]}" "$@"

# ---- sizes ---------------------------------------------------------------------------------------
VOCAB=640; TOPK=24; BATCH=4; W=1.0
SHORT=64; BASE_STEPS=${BASE_STEPS:-1500}     # short context: past token 24 a query attends 24 of its keys
LONG=448; CPT_STEPS=${CPT_STEPS:-400}        # longer context: 24 of up to 448 keys
WARM=${WARM:-40}; PROBE_STEPS=${PROBE_STEPS:-8}
DOCS=${DOCS:-960}; DOC_CHARS=2400; EVAL_DOCS=24

echo "indexer-loss demo -> $OUT (trex $TREX, $THREADS thread(s))"

# ---- data: train.jsonl / eval.jsonl (held out) / tokenizer corpus -----------------------------
ild_data $VOCAB $DOCS $DOC_CHARS $EVAL_DOCS

cat > arch.toml <<TOML
[model]
model_type = "deepseek_v32"
vocab_size = $VOCAB
hidden_size = 87
num_hidden_layers = 3
first_k_dense_replace = 1
intermediate_size = 155
moe_intermediate_size = 35
n_routed_experts = 9
n_shared_experts = 1
num_experts_per_tok = 2
n_group = 3
topk_group = 2
routed_scaling_factor = 2.5
num_attention_heads = 3
num_key_value_heads = 3
q_lora_rank = 27
kv_lora_rank = 19
qk_nope_head_dim = 13
qk_rope_head_dim = 6
v_head_dim = 15
index_n_heads = 5
index_head_dim = 14
index_topk = $TOPK
max_position_embeddings = 512
TOML
ild_configs

# 1. the short-context model, from random weights (weight 0: the indexer stays as initialized)
train base.toml base
BASE="$(last base)"
# 2. CPT at the longer context, same seed (same batches), same steps
CPT=(--set "model.path=$BASE" --set "data.seq_len=$LONG" --set "train.steps=$CPT_STEPS" --set "train.eval_every=$CPT_STEPS"
     --set "optim.lr=1e-3" --set "optim.min_lr=1e-4" --set "optim.warmup_steps=5")
train cpt.toml a_weight0 "${CPT[@]}"
train cpt.toml b_sparse "${CPT[@]}" --set "train.indexer_loss_weight=$W" --set train.indexer_stage=sparse
train cpt.toml c_warmup "${CPT[@]}" --set "train.indexer_loss_weight=$W" --set train.indexer_stage=dense_warmup \
  --set "train.steps=$WARM" --set "train.eval_every=$WARM" --set "optim.warmup_steps=0" --set "optim.lr=3e-3" \
  --set "optim.min_lr=3e-3"
CPT[1]="model.path=$(last c_warmup)"
train cpt.toml c_then_sparse "${CPT[@]}" --set "train.indexer_loss_weight=$W" --set train.indexer_stage=sparse

# 3. probes: every checkpoint on the held-out documents, indexer loss on, lr 0 (weights unchanged)
for name in base a_weight0 b_sparse c_warmup c_then_sparse; do
  probe "$name" --set "train.indexer_loss_weight=$W" --set train.indexer_stage=sparse
done

SECS=$(( $(date +%s) - T0 ))
LOAD1=$(cut -d' ' -f1 /proc/loadavg)
PYTHONPATH="$REPO/tools/bench" python3 - "$MD" "$STAMP" "$COMMIT" "$CPU" "$CMD" "$LOAD0 / $LOAD1" "$SECS" "$SEED" "$THREADS" "$BASE_STEPS" "$CPT_STEPS" "$WARM" "$SHORT" "$LONG" "$TOPK" "$BATCH" "$PROBE_STEPS" "$W" <<'PY'
import sys
from indexer_loss_report import f, mean, probe, rows, write
md, stamp, commit, cpu, cmd, load, secs, seed, threads, base_steps, cpt_steps, warm, short, long_, topk, batch, probe_steps, w = sys.argv[1:]
runs = [("base", "short-context model (where every CPT run starts)", f"{base_steps} at seq_len {short}"),
        ("a_weight0", "(a) weight 0: indexer frozen", cpt_steps),
        ("b_sparse", f"(b) sparse stage, weight {w}", cpt_steps),
        ("c_warmup", "(c) the dense warm-up alone", f"{warm} warm-up"),
        ("c_then_sparse", f"(c) dense warm-up, then sparse, weight {w}", f"{warm} warm-up + {cpt_steps}")]
start = {"a_weight0": "base", "b_sparse": "base", "c_warmup": "base", "c_then_sparse": "base"}
lines = ["| run | steps | train CE, mean of the last 10 steps | eval loss (run's last) | held-out CE (probe) "
         "| recall at start (probe) | recall at end (probe) | recall in the run, first / last step |",
         "|" + "---|" * 8]
for run, label, steps in runs:
    ce_p, rec_p = probe(run)
    if run == "base":
        lines.append(f"| {label} | {steps} | | | {f(ce_p)} | | {f(rec_p)} | |")
        continue
    r = rows(run)
    ev = [x["eval_loss"] for x in r if "eval_loss" in x]
    tr = mean([x["ce"] for x in r[-10:]])
    rec0 = probe(start[run])[1]
    inrun = (f"{f(r[0]['indexer_recall'])} / {f(r[-1]['indexer_recall'])}" if "indexer_recall" in r[0]
             else "not reported (weight 0)")
    lines.append(f"| {label} | {steps} | {f(tr)} | {f(ev[-1]) if ev else ''} | {f(ce_p)} | {f(rec0)} | {f(rec_p)} | {inrun} |")
settings = (f"A DeepSeek-V3.2 model from random weights (seed {seed}, fp32, {threads} thread(s)), {base_steps} steps at seq_len {short}, "
            f"then CPT at seq_len {long_} with index_topk {topk}, batch {batch}, the same seed (same batches, same order) "
            f"in every run. Recall: the dense attention's share of mass on the indexer's top-{topk} (per head; averaged "
            f"over heads, queries and layers). Probe: {probe_steps} batches of the held-out documents at seq_len {long_}, "
            f"indexer loss on, lr 0, weights unchanged.")
write(md, "DeepSeek-V3.2 indexer loss: CPT at a longer context with the loss off, sparse, dense warm-up then sparse",
      cpu, threads, load, stamp, commit, secs, cmd, lines + ["", settings])
PY
