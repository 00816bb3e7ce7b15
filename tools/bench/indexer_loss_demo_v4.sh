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

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="runs/indexer-loss-demo-v4"; TREX=""; THREADS=1; MD=""; SEED=7; CMD="tools/bench/indexer_loss_demo_v4.sh $*"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --trex) TREX="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --md) MD="$2"; shift 2 ;;
    --seed) SEED="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo pipefail/{/^#/p}' "$0"; exit 0 ;;
    *) echo "indexer_loss_demo_v4.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -z "$TREX" ] && TREX="$REPO/build/trex"
[ -x "$TREX" ] || { echo "indexer_loss_demo_v4.sh: no trex binary at $TREX (build it, or pass --trex PATH)" >&2; exit 2; }
TREX="$(cd "$(dirname "$TREX")" && pwd)/$(basename "$TREX")"
STAMP=$(date -u +%F-%H%M)
COMMIT=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$REPO" diff --quiet HEAD -- . 2>/dev/null || echo "+dirty")
CPU=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
LOAD0=$(cut -d' ' -f1 /proc/loadavg)
[ -z "$MD" ] && MD="$REPO/benchmarks/results/$STAMP-indexer-loss-v4.md"
MD="$(mkdir -p "$(dirname "$MD")" && cd "$(dirname "$MD")" && pwd)/$(basename "$MD")"
FORTUNES=/usr/share/games/fortunes
[ -d "$FORTUNES" ] || { echo "indexer_loss_demo_v4.sh: needs the Debian package fortunes (apt-get install fortunes)" >&2; exit 2; }
command -v python3 >/dev/null || { echo "indexer_loss_demo_v4.sh: needs python3" >&2; exit 2; }

# ---- sizes ---------------------------------------------------------------------------------------
VOCAB=640; RATE=4; TOPK=6; BATCH=4; W=1.0
SHORT=64; BASE_STEPS=${BASE_STEPS:-2000}   # short context: at most 16 compressed entries, 6 selected
LONG=512; CPT_STEPS=${CPT_STEPS:-500}      # longer context: 6 of up to 128 entries
PROBE_STEPS=${PROBE_STEPS:-8}; COST_STEPS=${COST_STEPS:-40}
DOCS=${DOCS:-960}; DOC_CHARS=2400; EVAL_DOCS=24

if [ -d "$OUT" ] && [ -n "$(ls -A "$OUT")" ] && [ ! -e "$OUT/.indexer_loss_demo_v4" ]; then
  echo "indexer_loss_demo_v4.sh: $OUT is not empty and not this script's work directory; pass another --out" >&2; exit 2
fi
rm -rf "$OUT"; mkdir -p "$OUT/logs"; touch "$OUT/.indexer_loss_demo_v4"
OUT="$(cd "$OUT" && pwd)"
cd "$OUT"
T0=$(date +%s)
echo "V4 indexer-loss demo -> $OUT (trex $TREX, $THREADS thread(s))"

# ---- data: train.jsonl / eval.jsonl (held out) / tokenizer corpus -----------------------------
python3 - "$FORTUNES" "$DOCS" "$DOC_CHARS" "$EVAL_DOCS" <<'PY'
import json, os, sys
root, n_docs, doc_chars, n_eval = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
fortunes, seen = [], set()
for name in sorted(os.listdir(root)):  # as recipes/or/prepare.py base
    path = os.path.join(root, name)
    if name.endswith((".dat", ".u8")) or os.path.islink(path) or not os.path.isfile(path) or name in ("art", "ascii-art"):
        continue
    for part in open(path, encoding="utf-8", errors="replace").read().split("\n%\n"):
        p = part.strip("\n%")
        if len(p.strip()) >= 20 and p not in seen:
            seen.add(p); fortunes.append(p)
docs, cur = [], []
for f in fortunes:
    cur.append(f)
    if sum(len(c) + 2 for c in cur) >= doc_chars:
        docs.append("\n\n".join(cur)); cur = []
    if len(docs) == n_docs:
        break
ev = docs[::max(1, len(docs) // n_eval)][:n_eval]
tr = [d for d in docs if d not in ev]
for name, ds in (("train.jsonl", tr), ("eval.jsonl", ev)):
    with open(name, "w", encoding="utf-8") as o:
        for d in ds:
            o.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
open("tok_corpus.txt", "w", encoding="utf-8").write("\n\n".join(tr))
print(f"data: {len(tr)} train + {len(ev)} held-out documents of >= {doc_chars} characters "
      f"({sum(map(len, tr)) / 1e3:.0f} + {sum(map(len, ev)) / 1e3:.0f} kB)")
PY
"$TREX" tokenizer train --files tok_corpus.txt --vocab-size $VOCAB --out tok --threads "$THREADS" \
  --special-tokens "<｜begin▁of▁sentence｜>" "<｜end▁of▁sentence｜>" --bos "<｜begin▁of▁sentence｜>" >logs/tokenizer.log 2>&1 ||
  { tail -5 logs/tokenizer.log >&2; exit 1; }

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
cat > run.toml <<TOML
[data]
mode = "cpt"
train = ["train.jsonl"]
eval = ["eval.jsonl"]
tokenizer = "tok/tokenizer.json"
seq_len = $SHORT
cache_dir = "none"

[train]
steps = $BASE_STEPS
batch_size = $BATCH
precision = "fp32"
threads = $THREADS
seed = $SEED
eval_every = $BASE_STEPS
eval_batches = $PROBE_STEPS

[optim]
lr = 3e-3
min_lr = 3e-4
warmup_steps = 10
schedule = "cosine"
weight_decay = 0.05

[checkpoint]
run_dir = "base"
every = 0
keep = 1

[log]
every = 10
progress = "lines"
TOML
cat arch.toml run.toml > base.toml                                    # random init from [model]
{ printf '[model]\npath = "base"  # set with --set\n\n'; cat run.toml; } > cpt.toml   # from a checkpoint

# train TOML NAME ARGS...: trex train --config TOML ARGS (run_dir NAME), log in logs/NAME.log
train() {
  local toml=$1 name=$2; shift 2
  local t=$(date +%s)
  "$TREX" train --config "$toml" --set "checkpoint.run_dir=$name" "$@" >"logs/$name.log" 2>&1 ||
    { echo "[$name] failed; the end of logs/$name.log:" >&2; tail -20 "logs/$name.log" >&2; exit 1; }
  echo "[$name] ok in $(( $(date +%s) - t ))s"
}
last() { ls -d "$1"/checkpoints/step-* | sort | tail -1; }

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
for name in base a_weight0 b_sparse; do
  ck="$(last "$name")"
  train cpt.toml "probe_$name" --set "model.path=$ck" --set "data.seq_len=$LONG" --set 'data.train=["eval.jsonl"]' \
    --set "train.steps=$PROBE_STEPS" --set "train.eval_every=0" --set train.indexer_recall=true \
    --set optim.lr=0 --set optim.min_lr=0 --set optim.warmup_steps=0 --set train.bias_update_gamma=0 --set log.every=1
  cmp -s "$ck/model.safetensors" "$(last "probe_$name")/model.safetensors" ||
    { echo "probe of $name changed the weights ($ck)" >&2; exit 1; }
done

SECS=$(( $(date +%s) - T0 ))
LOAD1=$(cut -d' ' -f1 /proc/loadavg)
python3 - "$MD" "$STAMP" "$COMMIT" "$CPU" "$CMD" "$LOAD0 / $LOAD1" "$SECS" "$SEED" "$THREADS" "$BASE_STEPS" "$CPT_STEPS" "$SHORT" "$LONG" "$TOPK" "$RATE" "$BATCH" "$PROBE_STEPS" "$W" "$COST_STEPS" <<'PY'
import json, sys
md, stamp, commit, cpu, cmd, load, secs, seed, threads, base_steps, cpt_steps, short, long_, topk, rate, batch, probe_steps, w, cost_steps = sys.argv[1:]
def rows(run):
    return [json.loads(l) for l in open(f"{run}/metrics.jsonl") if '"step"' in l]
def mean(xs):
    return sum(xs) / len(xs)
def probe(run):  # held-out CE and recall of the run's last checkpoint (weights unchanged)
    r = rows(f"probe_{run}")
    return mean([x["ce"] for x in r]), mean([x["indexer_recall"] for x in r])
def f(x):
    return f"{x:.4f}"
def tps(run):
    r = rows(run)[1:]
    return mean([x["tokens_per_s"] for x in r])
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
head = ["# DeepSeek-V4 CSA indexer loss: CPT at a longer context with the loss off and on (sparse stage)", "",
        f"- machine: {cpu}, {threads} thread(s); load average {load} (start / end)",
        f"- date: {stamp} UTC, commit {commit}; {secs} s in all", f"- command: `{cmd.strip()}`", ""]
def ms(run):
    r = rows(run)[1:]
    return sorted(x["step_ms"] for x in r)[len(r) // 2]
cost = (f"What `train.indexer_recall = true` costs at weight 0: median step {ms('cost_plain'):.1f} ms without, "
        f"{ms('cost_recall'):.1f} ms with ({cost_steps} steps each of run (a)'s settings; the sparse stage's recall "
        f"scores every visible compressed entry once more per head).")
text = "\n".join(head + lines + ["", settings, "", cost]) + "\n"
print("\n" + text)
open(md, "w").write(text)
print(f"written to {md}")
PY
