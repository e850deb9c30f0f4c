#!/usr/bin/env python3
"""Checks that docs/ARCHITECTURE.md's layer table is true to the includes: a file in src/<folder>
includes only headers of its own folder or of folders listed above it in the table (the CPU and
CUDA backends do not include each other). Exits 1 listing every violation."""
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
table = open(os.path.join(root, "docs", "ARCHITECTURE.md"), encoding="utf-8").read()
layers = re.findall(r"^\| `src/([a-z/]+)` \|", table, flags=re.M)
if not layers:
    sys.exit("check_layers: no layer table in docs/ARCHITECTURE.md")
rank = {name: i for i, name in enumerate(layers)}
siblings = {("backend/cpu", "backend/cuda"), ("backend/cuda", "backend/cpu")}


def layer_of(relative_dir):
    best = None
    for name in layers:
        if relative_dir == name or relative_dir.startswith(name + "/"):
            if best is None or len(name) > len(best):
                best = name
    return best


violations = []
src = os.path.join(root, "src")
for directory, _, files in os.walk(src):
    here = layer_of(os.path.relpath(directory, src))
    for name in files:
        if not name.endswith((".h", ".cpp", ".cu", ".cuh")):
            continue
        path = os.path.join(directory, name)
        if here is None:
            violations.append(f"{path}: its folder is not in the layer table")
            continue
        for include in re.findall(r'^#include "([^"]+)"', open(path, encoding="utf-8").read(),
                                  flags=re.M):
            there = layer_of(os.path.dirname(include))
            if there is None:
                violations.append(f"{path}: includes {include}, outside every layer")
            elif rank[there] > rank[here] or (here, there) in siblings:
                violations.append(f"{path}: includes {include} ({there} is above {here})")
for v in violations:
    print(v)
sys.exit(1 if violations else 0)
