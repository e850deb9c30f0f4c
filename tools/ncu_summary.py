#!/usr/bin/env python3
"""Per-kernel totals of an Nsight Compute run with one metric, gpu__time_duration.sum.

    ncu --graph-profiling node --clock-control none --cache-control none \\
        --metrics gpu__time_duration.sum --csv ekva bench ... > run.csv
    tools/ncu_summary.py run.csv --layers 48 [--skip fill_random]

Prints the kernels' total, then one line per kernel name (template arguments and parameters cut),
largest first: total microseconds, launches, microseconds per launch and per layer. One metric keeps
ncu to one pass per kernel: with more, it saves and restores device memory around every replay,
which for a full-size model's 90 GB runs past a device call's time limit. --skip drops kernels whose
names contain the given text (the random-weight initialisation of `ekva bench --random-weights`);
name it exactly, since any kernel containing the text goes.
"""
import argparse
import collections
import csv
import re
import sys

UNIT_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", help="ncu --csv output (ncu's own log lines are skipped)")
    parser.add_argument("--layers", type=int, default=1, help="divide totals by this many layers")
    parser.add_argument("--skip", action="append", default=[], help="drop kernels containing this")
    args = parser.parse_args()
    with open(args.csv) as f:
        lines = [line for line in f if line.startswith('"')]
    totals = collections.defaultdict(lambda: [0, 0.0])
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = re.sub(r"\(.*", "", row["Kernel Name"])
        if any(s in name for s in args.skip):
            continue
        unit = row.get("Metric Unit", "nsecond")
        if unit not in UNIT_US:
            sys.exit(f"{args.csv}: unknown unit {unit!r} for {name}")
        us = float(row["Metric Value"].replace(",", "")) * UNIT_US[unit]
        totals[name][0] += 1
        totals[name][1] += us
    if not totals:
        sys.exit(f"{args.csv}: no gpu__time_duration.sum rows")
    total = sum(us for _, us in totals.values())
    launches = sum(n for n, _ in totals.values())
    print(f"total {total:.1f} us over {launches} kernels; per layer ({args.layers}) "
          f"{total / args.layers:.1f} us")
    for name, (n, us) in sorted(totals.items(), key=lambda item: -item[1][1]):
        print(f"{us:10.1f} us {n:5d}x {us / n:8.2f} us/launch {us / args.layers:8.2f} us/layer  "
              f"{name[:80]}")


if __name__ == "__main__":
    main()
