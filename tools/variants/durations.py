#!/usr/bin/env python3
"""A table of what `tools/variants/job.sh durations MODEL` wrote to $OUT, for docs/BENCHMARKS.md.

  tools/variants/durations.py OUT_DIR

For each model, each variant's microseconds per layer of every kernel name (template arguments
dropped), summed over the profiled launches and divided by the layers profiled: the launches of
prefill_attention_kernel, one a layer of a prompt (a fixed count of launches a layer held other
layer counts: OLMoE's layer launches more of the grouped products than Qwen3's), with their total;
base first. A kernel launched n > 1 times in every layer gets a column per launch of a layer
("name #1" .. "name #n", in launch order: a layer's gate-and-up and down grouped products). A file with no kernel rows, or none of prefill attention, is listed with the reason; a
variant's name is lower-case letters and digits.
"""
import csv
import glob
import os
import re
import sys


def kernel(name):
    """The kernel's name without namespaces, template arguments and parameters."""
    name = re.sub(r"\(.*$", "", name)
    name = re.sub(r"<.*>", "", name)
    return name.split("::")[-1].replace("void ", "").strip()


def durations(path):
    """({kernel: microseconds per layer}, layers) of one Nsight Compute CSV, or (None, reason)."""
    with open(path, errors="replace") as f:
        rows = [line for line in f if line.startswith('"')]
    if not rows:
        err = os.path.splitext(path)[0] + ".err"
        reason = "no kernel rows"
        if os.path.exists(err):
            with open(err, errors="replace") as f:
                lines = [line.strip() for line in f if "ERROR" in line or "rror" in line]
            if lines:
                reason = lines[0]
        return None, reason
    table = list(csv.reader(rows))
    head = table[0]
    try:
        name_at, value_at, unit_at = (head.index(c) for c in ("Kernel Name", "Metric Value", "Metric Unit"))
    except ValueError:
        return None, "not a --csv metrics listing"
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
    timed, launches = [], {}
    for line, row in enumerate(table[1:], start=2):
        try:
            k = kernel(row[name_at])
            value = float(row[value_at].replace(",", "")) * scale.get(row[unit_at], 1.0)
        except (IndexError, ValueError):
            return None, f"kernel row {line} is not a kernel name and a duration"
        timed.append((k, value))
        launches[k] = launches.get(k, 0) + 1
    layers = launches.get("prefill_attention_kernel", 0)
    if layers == 0:
        return None, "no prefill_attention_kernel launch to count the layers by"
    sums, seen = {}, {}
    for k, value in timed:
        per_layer = launches[k] // layers if launches[k] % layers == 0 else 1
        column = f"{k} #{seen.get(k, 0) % per_layer + 1}" if per_layer > 1 else k
        seen[k] = seen.get(k, 0) + 1
        sums[column] = sums.get(column, 0.0) + value
    return {k: v / layers for k, v in sums.items()}, layers


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: durations.py OUT_DIR")
    out = sys.argv[1]
    paths = sorted(glob.glob(os.path.join(out, "durations-*-*.csv")))
    if not paths:
        sys.exit(f"durations.py: {out} holds no durations-*.csv")
    models = {}
    for path in paths:
        m = re.match(r"durations-(.+)-([a-z][a-z0-9]*)\.csv$", os.path.basename(path))
        if m:
            models.setdefault(m.group(1), {})[m.group(2)] = durations(path)
    for model, variants in sorted(models.items()):
        names = sorted({k for sums, _ in variants.values() if sums for k in sums})
        print(f"\n{model}, us per layer:\n")
        print("| variant | layers | " + " | ".join(names) + " | total |")
        print("| --- |" + " ---: |" * (len(names) + 2))
        for variant in sorted(variants, key=lambda v: (v != "base", v)):
            per_layer, detail = variants[variant]
            if per_layer is None:
                print(f"| {variant} | {detail} |")
                continue
            cells = [f"{per_layer.get(k, 0.0):.1f}" for k in names]
            print(f"| {variant} | {detail} | " + " | ".join(cells) + f" | {sum(per_layer.values()):.1f} |")


if __name__ == "__main__":
    main()
