#!/usr/bin/env python3
"""Tables of `ekva` against Ada-KV per reserve cap, from the dev-seed results under docs/results.

Reads every results.json of the cap sweep (docs/results/capCAP-dev-2048-MODEL-MODE/*/) and of the
cap-0.25 runs made before it (the default; the directories are listed below), pairs `ekva` with
`adakv` sample by sample and prints one markdown table per model: rows mode x task x budget, columns
Ada-KV and `ekva` at each cap, each `ekva` cell with its discordant counts (ekva better : Ada-KV
better) and the exact two-sided binomial p (McNemar on answers, the sign test on per-window
NLL-per-token for ppl), as `ekva eval` computes them (src/eval/metrics.cpp).

It checks that every run used the dev seed, context 2048 and 24 samples, and that Ada-KV's per-sample
outcomes are the same in every run that holds them (they do not depend on the cap).

Usage: tools/cap_table.py [--caps 0.25,0.1,0.05] [--budgets 0.06] [--sources] [docs/results]
"""
import argparse
import glob
import json
import math
import os
import re
import sys

# The runs at the default cap 0.25 (same seed, context and samples; prose filler for the needle tasks).
LEGACY = {
    "prose-dev-2048-aware": 0.25,
    "prose-dev-2048-agnostic": 0.25,
    "prose-dev-2048-12m-aware": 0.25,
    "prose-dev-2048-12m-agnostic": 0.25,
    "kvppl-dev-2048-ekva-moe-8m": 0.25,
    "kvppl-dev-2048-ekva-qwen3moe-12m": 0.25,
    "kv-agnostic-dev-2048-ekva-moe-8m": 0.25,
    "kv-agnostic-dev-2048-ekva-qwen3moe-12m": 0.25,
}
TASKS = ["passkey", "multikey-needle", "kv-retrieval", "ppl"]


def exact_binomial_p(a, b):
    n, m = a + b, min(a, b)
    if 2 * m == n:
        return 1.0
    return min(1.0, 2.0 * sum(math.comb(n, i) for i in range(m + 1)) / 2.0**n)


def per_sample(row):
    if row["task"] == "ppl":
        return [nll / tok for nll, tok in zip(row["nll"], row["tokens"])], False
    return [float(c) for c in row["correct"]], True


def ppl_of(row):
    return math.exp(sum(row["nll"]) / sum(row["tokens"]))


def load(root):
    runs = []
    for path in sorted(glob.glob(os.path.join(root, "*", "results.json")) +
                       glob.glob(os.path.join(root, "*", "*", "results.json"))):
        top = os.path.relpath(path, root).split(os.sep)[0]
        m = re.fullmatch(r"cap([0-9.]+)-dev-2048-(.+)-(aware|agnostic)", top)
        if m:
            cap = float(m.group(1))
        elif top in LEGACY:
            cap = LEGACY[top]
        else:
            continue
        d = json.load(open(path))
        assert d["seed"] == 5150001 and d["context"] == 2048 and d["samples"] == 24, path
        runs.append((cap, os.path.basename(d["model"].rstrip("/")), d["mode"], path, d))
    return runs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", nargs="?", default="docs/results")
    ap.add_argument("--caps", help="comma-separated caps to show (default: every cap found)")
    ap.add_argument("--budgets", default="0.06,0.12,0.25", help="comma-separated budgets to show")
    ap.add_argument("--sources", action="store_true", help="list the result directories")
    args = ap.parse_args()
    root = args.root
    cells = {}  # (model, mode, task, budget, policy, cap) -> row
    adakv = {}  # (model, mode, task, budget) -> per-sample values, to check they agree
    sources = {}
    for cap, model, mode, path, d in load(root):
        for row in d["results"]:
            if row["task"] not in TASKS or row["policy"] not in ("ekva", "adakv"):
                continue
            # ppl does not depend on the mode (no question is streamed): file it under aware.
            m = "aware" if row["task"] == "ppl" else mode
            key = (model, m, row["task"], round(row["budget"], 4))
            if row["policy"] == "adakv":
                vals = per_sample(row)[0]
                if key in adakv and adakv[key][0] != vals:
                    sys.exit(f"Ada-KV differs between {adakv[key][1]} and {path} at {key}")
                adakv.setdefault(key, (vals, path))
                cells[key + ("adakv", None)] = row
            else:
                cells[key + ("ekva", cap)] = row
            sources.setdefault((model, m, cap), set()).add(os.path.relpath(os.path.dirname(path), root))
    caps = sorted({k[5] for k in cells if k[4] == "ekva"}, reverse=True)
    if args.caps:
        caps = [float(c) for c in args.caps.split(",")]
    budgets = [float(b) for b in args.budgets.split(",")]
    for model in sorted({k[0] for k in cells}):
        rows = []
        for mode in ("aware", "agnostic"):
            for task in TASKS:
                for b in budgets:
                    key = (model, mode, task, b)
                    base = cells.get(key + ("adakv", None))
                    if base is None:
                        continue
                    bv, higher = per_sample(base)
                    fmt = (lambda r: f"{ppl_of(r):.2f}") if task == "ppl" else (lambda r: f"{r['score']:.3f}")
                    line = [mode if task != "ppl" else "either", task, f"{b * 100:.0f}%", fmt(base)]
                    for cap in caps:
                        row = cells.get(key + ("ekva", cap))
                        if row is None:
                            line.append("not run")
                            continue
                        ev = per_sample(row)[0]
                        win = sum(1 for x, y in zip(ev, bv) if x != y and (x > y) == higher)
                        lose = sum(1 for x, y in zip(ev, bv) if x != y and (x > y) != higher)
                        p = exact_binomial_p(win, lose)
                        extra = ""
                        if task == "ppl":
                            extra = f" ({(ppl_of(row) / ppl_of(base) - 1) * 100:+.2f}%)"
                        line.append(f"{fmt(row)}{extra}; {win} : {lose}, p = {p:.2g}")
                    rows.append(line)
        if not rows:
            continue
        print(f"\n`{model}`\n")
        print("| mode | task | budget | Ada-KV | " + " | ".join(f"ekva, cap {c:g}" for c in caps) + " |")
        print("| --- | --- | ---: | ---: | " + " | ".join("---" for _ in caps) + " |")
        for line in rows:
            print("| " + " | ".join(line) + " |")
        if args.sources:
            for mode in ("aware", "agnostic"):
                for cap in caps:
                    src = sorted(sources.get((model, mode, cap), []))
                    print(f"- {mode}, cap {cap:g}: {', '.join(src)}")

if __name__ == "__main__":
    main()
