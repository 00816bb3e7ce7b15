#!/usr/bin/env bash
# The DeepSeek-V4 CSA indexer loss, demonstrated (docs/V4.md, "Indexer loss: a demonstration"):
# a small V4 model (two CSA layers around an HCA layer) trained briefly from random weights at a
# short context, then CPT at a longer context on the same text, same steps and same batches, two
# ways:
#   (a) indexer_loss_weight = 0 (the default: the indexer stays as initialized, frozen), with
#       train.indexer_recall = true so that it reports its recall
#   (b) sparse stage, weight W (the indexer learns from its KL loss over the selected entries)
# and prints a table: steps, final train loss, eval loss and the top-k recall of the attention's
# mass on the compressed entries, in the run (training batches, first and last step) and on the
# held-out documents (a probe of the last checkpoint), and writes it with the machine, date,
# commit and command to benchmarks/results/<date>-<HHMM>-indexer-loss-v4.md. One thread by default.
#
#   tools/bench/indexer_loss_demo_v4.sh [--out DIR] [--trex PATH] [--threads N] [--md FILE] [--seed N]
#
#   --out DIR   work directory (default runs/indexer-loss-demo-v4; removed and rebuilt)
#   --trex P    the trex binary (default build/trex)
#   --threads N train.threads of every run (default 1)
#   --md FILE   where the markdown goes (default benchmarks/results/<date>-<HHMM>-indexer-loss-v4.md)
#   --seed N    train.seed of every run: the initialization and the data order (default 7)
#
# BASE_STEPS, CPT_STEPS and PROBE_STEPS (steps) and DOCS (documents) in the environment override
# the sizes below, e.g. for a quick try of the script itself.
#
# Recall (docs/V4.md): per CSA layer and query, the share of the attention's mass on the visible
# compressed entries that the indexer's top-k holds (per head, averaged over heads, queries and
# CSA layers). The probe: `trex train` on the held-out documents with indexer_loss_weight = 0,
# indexer_recall = true, optim.lr = 0 and train.bias_update_gamma = 0, which leave every weight and
# router bias as it was (the script checks the probe's checkpoint byte for byte); its mean CE and
# recall over PROBE_STEPS batches.
#
# Data: the Debian package `fortunes` (as recipes/or), consecutive fortunes joined into documents
# of at least DOC_CHARS characters, so that a CPT row is one document and attention spans it.
set -euo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/indexer_loss_lib.sh"
ild_setup indexer_loss_demo_v4.sh indexer-loss-demo-v4 "${BASH_SOURCE[0]}" "$@"

# ---- sizes ---------------------------------------------------------------------------------------
VOCAB=640; RATE=4; TOPK=6; BATCH=4; W=1.0
SHORT=64; BASE_STEPS=${BASE_STEPS:-2000}   # short context: at most 16 compressed entries, 6 selected
LONG=512; CPT_STEPS=${CPT_STEPS:-500}      # longer context: 6 of up to 128 entries
PROBE_STEPS=${PROBE_STEPS:-8}; COST_STEPS=${COST_STEPS:-40}
DOCS=${DOCS:-960}; DOC_CHARS=2400; EVAL_DOCS=24

echo "V4 indexer-loss demo -> $OUT (trex $TREX, $THREADS thread(s))"

# ---- data: train.jsonl / eval.jsonl (held out) / tokenizer corpus -----------------------------
ild_data $VOCAB $DOCS $DOC_CHARS $EVAL_DOCS

cat > arch.toml <<TOML
[model]
model_type = "deepseek_v4"
vocab_size = $VOCAB
hidden_size = 64
num_hidden_layers = 3
num_attention_heads = 4
head_dim = 24
partial_rotary_factor = 0.25
q_lora_rank = 32
o_groups = 2
o_lora_rank = 16
moe_intermediate_size = 32
n_routed_experts = 6
n_shared_experts = 1
num_experts_per_tok = 2
layer_types = ["compressed_sparse_attention", "heavily_compressed_attention", "compressed_sparse_attention"]
mlp_layer_types = ["hash_moe", "moe", "moe"]
compress_rates = { compressed_sparse_attention = $RATE, heavily_compressed_attention = 16 }
sliding_window = 16
index_n_heads = 4
index_head_dim = 16
index_topk = $TOPK
hc_mult = 2
hc_sinkhorn_iters = 5
max_position_embeddings = 512
num_nextn_predict_layers = 0
TOML
ild_configs

# 1. the short-context model, from random weights (weight 0: the indexer stays as initialized)
train base.toml base
BASE="$(last base)"
# 2. CPT at the longer context, same seed (same batches), same steps
CPT=(--set "model.path=$BASE" --set "data.seq_len=$LONG" --set "train.steps=$CPT_STEPS" --set "train.eval_every=$CPT_STEPS"
     --set "optim.lr=1e-3" --set "optim.min_lr=1e-4" --set "optim.warmup_steps=5")
train cpt.toml a_weight0 "${CPT[@]}" --set train.indexer_recall=true
train cpt.toml b_sparse "${CPT[@]}" --set "train.indexer_loss_weight=$W" --set train.indexer_stage=sparse

# 3. what the recall costs: COST_STEPS steps of run (a) without and with train.indexer_recall
train cpt.toml cost_plain "${CPT[@]}" --set "train.steps=$COST_STEPS" --set "train.eval_every=0"
train cpt.toml cost_recall "${CPT[@]}" --set "train.steps=$COST_STEPS" --set "train.eval_every=0" --set train.indexer_recall=true

# 4. probes: every checkpoint on the held-out documents, recall on, lr 0 (weights unchanged)
for name in base a_weight0 b_sparse; do probe "$name" --set train.indexer_recall=true; done

SECS=$(( $(date +%s) - T0 ))
LOAD1=$(cut -d' ' -f1 /proc/loadavg)
PYTHONPATH="$REPO/tools/bench" python3 - "$MD" "$STAMP" "$COMMIT" "$CPU" "$CMD" "$LOAD0 / $LOAD1" "$SECS" "$SEED" "$THREADS" "$BASE_STEPS" "$CPT_STEPS" "$SHORT" "$LONG" "$TOPK" "$RATE" "$BATCH" "$PROBE_STEPS" "$W" "$COST_STEPS" <<'PY'
import sys
from indexer_loss_report import f, mean, probe, rows, tps, write
md, stamp, commit, cpu, cmd, load, secs, seed, threads, base_steps, cpt_steps, short, long_, topk, rate, batch, probe_steps, w, cost_steps = sys.argv[1:]
runs = [("base", "short-context model (where both CPT runs start)", f"{base_steps} at seq_len {short}"),
        ("a_weight0", "(a) weight 0: indexer frozen (indexer_recall = true)", cpt_steps),
        ("b_sparse", f"(b) sparse stage, weight {w}", cpt_steps)]
lines = ["| run | steps | train CE, mean of the last 10 steps | eval loss (run's last) | held-out CE (probe) "
         "| recall at start (probe) | recall at end (probe) | recall in the run, first / mean of last 10 steps "
         "| indexer loss in the run, first / mean of last 10 | tokens/s |",
         "|" + "---|" * 10]
rec0 = probe("base")[1]
for run, label, steps in runs:
    ce_p, rec_p = probe(run)
    if run == "base":
        lines.append(f"| {label} | {steps} | | | {f(ce_p)} | | {f(rec_p)} | | | |")
        continue
    r = rows(run)
    ev = [x["eval_loss"] for x in r if "eval_loss" in x]
    tr = mean([x["ce"] for x in r[-10:]])
    inrun = f"{f(r[0]['indexer_recall'])} / {f(mean([x['indexer_recall'] for x in r[-10:]]))}"
    ixl = f"{f(r[0]['indexer_loss'])} / {f(mean([x['indexer_loss'] for x in r[-10:]]))}"
    lines.append(f"| {label} | {steps} | {f(tr)} | {f(ev[-1]) if ev else ''} | {f(ce_p)} | {f(rec0)} | {f(rec_p)} "
                 f"| {inrun} | {ixl} | {tps(run):.0f} |")
settings = (f"A DeepSeek-V4 model (hidden 64, 3 layers: CSA / HCA / CSA, CSA rate {rate}, index_topk {topk}, "
            f"hc_mult 2, 6 experts top-2) from random weights (seed {seed}, fp32, {threads} thread(s)), {base_steps} "
            f"steps at seq_len {short}, then CPT at seq_len {long_}, batch {batch}, the same seed (same batches, "
            f"same order) in both runs. Recall: the attention's share of mass on the visible compressed entries "
            f"that the indexer's top-{topk} holds (per head; averaged over heads, queries and CSA layers). Probe: "
            f"{probe_steps} batches of the held-out documents at seq_len {long_}, lr 0, weights unchanged. tokens/s: "
            f"the run's mean after its first step (run (a) computes the recall, run (b) the loss and its backward).")
def ms(run):
    r = rows(run)[1:]
    return sorted(x["step_ms"] for x in r)[len(r) // 2]
cost = (f"What `train.indexer_recall = true` costs at weight 0: median step {ms('cost_plain'):.1f} ms without, "
        f"{ms('cost_recall'):.1f} ms with ({cost_steps} steps each of run (a)'s settings; the sparse stage's recall "
        f"scores every visible compressed entry once more per head).")
write(md, "DeepSeek-V4 CSA indexer loss: CPT at a longer context with the loss off and on (sparse stage)",
      cpu, threads, load, stamp, commit, secs, cmd, lines + ["", settings, "", cost])
PY
