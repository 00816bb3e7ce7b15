"""Helpers for the indexer-loss demonstrations' reports (tools/bench/indexer_loss_demo*.sh): the
runs' metrics.jsonl rows, the probes' held-out CE and recall, and the markdown file's head."""
import json


def rows(run):
    return [json.loads(l) for l in open(f"{run}/metrics.jsonl") if '"step"' in l]


def mean(xs):
    return sum(xs) / len(xs)


def probe(run):
    """Held-out CE and recall of the run's last checkpoint (the probe leaves the weights unchanged)."""
    r = rows(f"probe_{run}")
    return mean([x["ce"] for x in r]), mean([x["indexer_recall"] for x in r])


def tps(run):
    """The run's mean tokens/s after its first step."""
    return mean([x["tokens_per_s"] for x in rows(run)[1:]])


def f(x):
    return f"{x:.4f}"


def write(md, title, cpu, threads, load, stamp, commit, secs, cmd, body):
    """Writes (and prints) the report: a title, the machine, date, commit and command, then body (lines)."""
    head = [f"# {title}", "",
            f"- machine: {cpu}, {threads} thread(s); load average {load} (start / end)",
            f"- date: {stamp} UTC, commit {commit}; {secs} s in all", f"- command: `{cmd.strip()}`", ""]
    text = "\n".join(head + body) + "\n"
    print("\n" + text)
    open(md, "w").write(text)
    print(f"written to {md}")
