#!/usr/bin/env python3
"""Checks the layer order of every #include in trex's source folders, and that no header
include cycle exists.

Layers, lowest first (DESIGN.md): a file may include its own folder and any lower layer.
    core < kernels < io < parallel < model < plan, or < train < cli
parallel/ is topology and communication only; model/ receives communicators explicitly, so of
parallel/ it may include the communicator interface (parallel/comm.h) and nothing else.
Exit status 1 with one line per violation, 0 when clean. Usage: check_layers.py [REPO_ROOT]
"""
import os
import re
import sys

RANK = {"core": 0, "kernels": 1, "io": 2, "parallel": 3, "model": 4, "plan": 5, "or": 5, "train": 6, "cli": 7}
# (from folder, included file) pairs allowed although they point up.
ALLOWED_UP = {("model", "parallel/comm.h")}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
EXTS = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")


def sources(root):
    for layer in RANK:
        base = os.path.join(root, layer)
        for d, _, files in os.walk(base):
            for f in sorted(files):
                if f.endswith(EXTS):
                    yield os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/")


def includes(root, rel):
    out = []
    with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as fh:
        for n, line in enumerate(fh, 1):
            m = INCLUDE.match(line)
            if m:
                out.append((n, m.group(1)))
    return out


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
    errors = []
    graph = {}
    for rel in sources(root):
        layer = rel.split("/")[0]
        graph[rel] = []
        for n, inc in includes(root, rel):
            top = inc.split("/")[0]
            if top not in RANK:
                continue  # system-style or tests/ includes are not layers
            if os.path.exists(os.path.join(root, inc)):
                graph[rel].append(inc)
            if RANK[top] > RANK[layer] or (RANK[top] == RANK[layer] and top != layer):
                if (layer, inc) not in ALLOWED_UP:
                    errors.append(f"{rel}:{n}: {layer}/ includes \"{inc}\" ({top}/ is not below {layer}/)")
    # Header cycles: depth-first search over the include graph.
    state, stack = {}, []

    def visit(f):
        state[f] = 1
        stack.append(f)
        for g in graph.get(f, []):
            if state.get(g) == 1:
                cyc = stack[stack.index(g):] + [g]
                errors.append("include cycle: " + " -> ".join(cyc))
            elif g in graph and not state.get(g):
                visit(g)
        stack.pop()
        state[f] = 2

    for f in sorted(graph):
        if not state.get(f):
            visit(f)
    for e in errors:
        print(e)
    print(f"check_layers: {len(graph)} files, {len(errors)} problem(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
