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

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="runs/indexer-loss-demo"; TREX=""; THREADS=1; MD=""; SEED=7; CMD="tools/bench/indexer_loss_demo.sh $*"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --trex) TREX="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --md) MD="$2"; shift 2 ;;
    --seed) SEED="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo pipefail/{/^#/p}' "$0"; exit 0 ;;
    *) echo "indexer_loss_demo.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -z "$TREX" ] && TREX="$REPO/build/trex"
[ -x "$TREX" ] || { echo "indexer_loss_demo.sh: no trex binary at $TREX (build it, or pass --trex PATH)" >&2; exit 2; }
TREX="$(cd "$(dirname "$TREX")" && pwd)/$(basename "$TREX")"
STAMP=$(date -u +%F-%H%M)
COMMIT=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$REPO" diff --quiet HEAD -- . 2>/dev/null || echo "+dirty")
CPU=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
LOAD0=$(cut -d' ' -f1 /proc/loadavg)
[ -z "$MD" ] && MD="$REPO/benchmarks/results/$STAMP-indexer-loss.md"
MD="$(mkdir -p "$(dirname "$MD")" && cd "$(dirname "$MD")" && pwd)/$(basename "$MD")"
FORTUNES=/usr/share/games/fortunes
[ -d "$FORTUNES" ] || { echo "indexer_loss_demo.sh: needs the Debian package fortunes (apt-get install fortunes)" >&2; exit 2; }
command -v python3 >/dev/null || { echo "indexer_loss_demo.sh: needs python3" >&2; exit 2; }

# ---- sizes ---------------------------------------------------------------------------------------
VOCAB=640; TOPK=24; BATCH=4; W=1.0
SHORT=64; BASE_STEPS=${BASE_STEPS:-1500}     # short context: past token 24 a query attends 24 of its keys
LONG=448; CPT_STEPS=${CPT_STEPS:-400}        # longer context: 24 of up to 448 keys
WARM=${WARM:-40}; PROBE_STEPS=${PROBE_STEPS:-8}
DOCS=${DOCS:-960}; DOC_CHARS=2400; EVAL_DOCS=24

if [ -d "$OUT" ] && [ -n "$(ls -A "$OUT")" ] && [ ! -e "$OUT/.indexer_loss_demo" ]; then
  echo "indexer_loss_demo.sh: $OUT is not empty and not this script's work directory; pass another --out" >&2; exit 2
fi
rm -rf "$OUT"; mkdir -p "$OUT/logs"; touch "$OUT/.indexer_loss_demo"
OUT="$(cd "$OUT" && pwd)"
cd "$OUT"
T0=$(date +%s)
echo "indexer-loss demo -> $OUT (trex $TREX, $THREADS thread(s))"

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
train cpt.toml a_weight0 "${CPT[@]}"
train cpt.toml b_sparse "${CPT[@]}" --set "train.indexer_loss_weight=$W" --set train.indexer_stage=sparse
train cpt.toml c_warmup "${CPT[@]}" --set "train.indexer_loss_weight=$W" --set train.indexer_stage=dense_warmup \
  --set "train.steps=$WARM" --set "train.eval_every=$WARM" --set "optim.warmup_steps=0" --set "optim.lr=3e-3" \
  --set "optim.min_lr=3e-3"
CPT[1]="model.path=$(last c_warmup)"
train cpt.toml c_then_sparse "${CPT[@]}" --set "train.indexer_loss_weight=$W" --set train.indexer_stage=sparse

# 3. probes: every checkpoint on the held-out documents, indexer loss on, lr 0 (weights unchanged)
for name in base a_weight0 b_sparse c_warmup c_then_sparse; do
  ck="$(last "$name")"
  train cpt.toml "probe_$name" --set "model.path=$ck" --set "data.seq_len=$LONG" --set 'data.train=["eval.jsonl"]' \
    --set "train.steps=$PROBE_STEPS" --set "train.eval_every=0" --set "train.indexer_loss_weight=$W" \
    --set train.indexer_stage=sparse --set optim.lr=0 --set optim.min_lr=0 --set optim.warmup_steps=0 \
    --set train.bias_update_gamma=0 --set log.every=1
  cmp -s "$ck/model.safetensors" "$(last "probe_$name")/model.safetensors" ||
    { echo "probe of $name changed the weights ($ck)" >&2; exit 1; }
done

SECS=$(( $(date +%s) - T0 ))
LOAD1=$(cut -d' ' -f1 /proc/loadavg)
python3 - "$MD" "$STAMP" "$COMMIT" "$CPU" "$CMD" "$LOAD0 / $LOAD1" "$SECS" "$SEED" "$THREADS" "$BASE_STEPS" "$CPT_STEPS" "$WARM" "$SHORT" "$LONG" "$TOPK" "$BATCH" "$PROBE_STEPS" "$W" <<'PY'
import json, sys
md, stamp, commit, cpu, cmd, load, secs, seed, threads, base_steps, cpt_steps, warm, short, long_, topk, batch, probe_steps, w = sys.argv[1:]
def rows(run):
    return [json.loads(l) for l in open(f"{run}/metrics.jsonl") if '"step"' in l]
def mean(xs):
    return sum(xs) / len(xs)
def probe(run):  # held-out CE and recall of the run's last checkpoint (weights unchanged)
    r = rows(f"probe_{run}")
    return mean([x["ce"] for x in r]), mean([x["indexer_recall"] for x in r])
def f(x):
    return f"{x:.4f}"
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
head = ["# DeepSeek-V3.2 indexer loss: CPT at a longer context with the loss off, sparse, dense warm-up then sparse", "",
        f"- machine: {cpu}, {threads} thread(s); load average {load} (start / end)",
        f"- date: {stamp} UTC, commit {commit}; {secs} s in all", f"- command: `{cmd.strip()}`", ""]
text = "\n".join(head + lines + ["", settings]) + "\n"
print("\n" + text)
open(md, "w").write(text)
print(f"written to {md}")
PY
