#!/usr/bin/env python3
"""Tables from what `tools/variants/job.sh time MODEL` wrote to $OUT, for docs/BENCHMARKS.md.

  tools/variants/summarize.py OUT_DIR
  tools/variants/summarize.py OUT_DIR --faster MODEL   # the variants whose median prompt is
                                                       # under 99% of base's, space-separated

For each model: the prompt's milliseconds of every round per variant, their median, its ratio to
base's median and the TFLOP/s at the median; then each variant's batch-1 step per round, median, ratio to base and
share of the datasheet floor. A variant whose JSON is missing or unreadable is listed with the reason.
"""
import glob
import json
import os
import re
import statistics
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f), None
    except (OSError, ValueError) as e:
        return None, str(e).splitlines()[0] if str(e) else type(e).__name__


def main():
    if len(sys.argv) not in (2, 4) or (len(sys.argv) == 4 and sys.argv[2] != "--faster"):
        sys.exit("usage: summarize.py OUT_DIR [--faster MODEL]")
    out = sys.argv[1]
    if not os.path.isdir(out):
        sys.exit(f"summarize.py: {out} is not a directory")
    if not glob.glob(os.path.join(out, "prompt-*.json")) + glob.glob(os.path.join(out, "decode-*.json")):
        sys.exit(f"summarize.py: {out} holds no prompt-*.json or decode-*.json")
    prompts = {}  # model -> variant -> [(round, json or None, error)]
    for path in sorted(glob.glob(os.path.join(out, "prompt-*-*.json"))):
        m = re.match(r"prompt-(.+)-([a-z][a-z0-9]*)-(\d+)\.json$", os.path.basename(path))
        if not m:
            continue
        data, error = load(path)
        prompts.setdefault(m.group(1), {}).setdefault(m.group(2), []).append(
            (int(m.group(3)), data, error))
    if len(sys.argv) == 4:
        medians = {v: statistics.median(d["prefill"]["ms"] for _, d, _ in runs if d and d.get("prefill"))
                   for v, runs in prompts.get(sys.argv[3], {}).items()
                   if any(d and d.get("prefill") for _, d, _ in runs)}
        base = medians.get("base")
        print(" ".join(v for v, ms in medians.items() if base and v != "base" and ms < 0.99 * base))
        return
    for model, variants in sorted(prompts.items()):
        print(f"\n{model}, prompt:\n")
        print("| variant | ms per round | median ms | vs base | TFLOP/s |")
        print("| --- | --- | ---: | ---: | ---: |")
        # Each variant's readable prefills, in round order.
        done = {v: [d["prefill"] for _, d, _ in sorted(runs, key=lambda r: r[0])
                    if d and d.get("prefill")] for v, runs in variants.items()}
        base = statistics.median(p["ms"] for p in done["base"]) if done.get("base") else None
        for variant, runs in variants.items():
            ok = done[variant]
            if not ok:
                errors = [e for _, d, e in runs if d is None]
                print(f"| {variant} | failed: {errors[0] if errors else 'no prefill'} | | | |")
                continue
            median = statistics.median(p["ms"] for p in ok)
            ratio = f"{median / base:.3f}" if base else ""
            rounds = " / ".join(f"{p['ms']:.2f}" for p in ok)
            print(f"| {variant} | {rounds} | {median:.2f} | {ratio} | "
                  f"{ok[0]['flops'] / median / 1e9:.1f} |")
    decodes = {}  # (model, variant) -> [(round, json or None, error)]
    for path in sorted(glob.glob(os.path.join(out, "decode-*-*.json"))):
        m = re.match(r"decode-(.+)-([a-z][a-z0-9]*)(?:-(\d+))?\.json$", os.path.basename(path))
        if not m:
            continue
        data, error = load(path)
        decodes.setdefault((m.group(1), m.group(2)), []).append((int(m.group(3) or 1), data, error))
    if decodes:
        print("\nbatch-1 decode:\n")
        print("| model | variant | ms / step per round | median ms | vs base | Roofline ms | % of floor |")
        print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    medians = {}
    for (model, variant), runs in sorted(decodes.items(), key=lambda kv: kv[0][1] != "base"):
        ok = [d["decode"][0] for _, d, _ in sorted(runs, key=lambda r: r[0]) if d and d.get("decode")]
        if not ok:
            errors = [e for _, d, e in runs if d is None]
            print(f"| {model} | {variant} | failed: {errors[0] if errors else 'no decode'} | | | | |")
            continue
        median = statistics.median(r["step_ms"] for r in ok)
        medians[(model, variant)] = median
        base = medians.get((model, "base"))
        ratio = f"{median / base:.3f}" if base else ""
        rounds = " / ".join(f"{r['step_ms']:.3f}" for r in ok)
        floor_ms = ok[0]["step_ms"] * ok[0]["fraction_of_floor"]
        print(f"| {model} | {variant} | {rounds} | {median:.3f} | {ratio} | "
              f"{ok[0]['predicted_ms']:.3f} | {100 * floor_ms / median:.0f}% |")

if __name__ == "__main__":
    main()
