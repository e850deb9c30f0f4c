#!/usr/bin/env python3
"""Where a CUDA graph's time goes, from the kernel timeline of tools/kernel_trace.

    CUDA_INJECTION64_PATH=BUILD/tools/kernel_trace/libekva_kernel_trace.so \\
        EKVA_KERNEL_TRACE=trace.csv ekva bench ... --batch 1 ...
    tools/kernel_trace_summary.py trace.csv --layers 48

Each graph (one per step shape that `ekva bench` captured) is replayed several times; a replay is
found by its first node coming round again. Per replay, the time from the first kernel's start to
the last one's end is split, walking the kernels in start order, into each kernel's exposed time
(how far its end moved the latest end so far: the time the step waited on it) and the idle gaps
before kernels that started after everything before them had ended. Printed per graph: the median
replay span, then per kernel and grid (so that products of different shapes stay apart) its median
duration from start to end (with programmatic dependent launch, a kernel starts before the one
before it has finished, so this includes its wait), its exposed time and the gaps before it, in microseconds per layer, largest exposed first.
The medians are over replays, so warm-up replays count for little.
"""
import argparse
import collections
import csv
import re
import statistics


def short_name(name):
    name = re.sub(r"\(anonymous namespace\)::|ekva::cuda::|^void ", "", name)
    depth = 0  # cut the parameters: the last parenthesised group at the top level
    for i in range(len(name) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(name[i], 0)
        if depth == 0 and name[i] == "(":
            return name[:i]
    return name


def replays(kernels):
    """Splits one graph's kernels (sorted by start) into replays."""
    first_node = kernels[0]["node"]
    runs = []
    for k in kernels:
        if k["node"] == first_node or not runs:
            runs.append([])
        runs[-1].append(k)
    size = collections.Counter(len(r) for r in runs).most_common(1)[0][0]
    return [r for r in runs if len(r) == size]


def attribute(run):
    """Per kernel of one replay: (name, duration, exposed, gap before it), and the span."""
    run = sorted(run, key=lambda k: k["start"])
    frontier = run[0]["start"]
    rows = []
    for k in run:
        gap = max(0, k["start"] - frontier)
        exposed = max(0, k["end"] - max(frontier, k["start"]))
        frontier = max(frontier, k["end"])
        rows.append((k["name"], k["end"] - k["start"], exposed, gap))
    return rows, frontier - run[0]["start"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", help="what libekva_kernel_trace.so wrote")
    parser.add_argument("--layers", type=int, default=1, help="divide per-replay times by this")
    parser.add_argument("--min-kernels", type=int, default=20,
                        help="graphs with fewer kernels per replay are left out")
    args = parser.parse_args()
    graphs = collections.defaultdict(list)
    with open(args.csv) as f:
        for row in csv.DictReader(f):
            if row["graph_id"] == "0":
                continue
            graphs[int(row["graph_id"])].append({
                "start": int(row["start_ns"]), "end": int(row["end_ns"]),
                "node": int(row["graph_node_id"]),
                "name": f'{short_name(row["name"])} grid {row["grid"]}'})
    for graph_id in sorted(graphs):
        kernels = sorted(graphs[graph_id], key=lambda k: k["start"])
        runs = replays(kernels)
        if not runs or len(runs[0]) < args.min_kernels:
            continue
        per_name = collections.defaultdict(lambda: [[], [], []])
        spans = []
        for run in runs:
            rows, span = attribute(run)
            spans.append(span)
            totals = collections.defaultdict(lambda: [0, 0, 0])
            for name, duration, exposed, gap in rows:
                t = totals[name]
                t[0] += duration
                t[1] += exposed
                t[2] += gap
            for name, t in totals.items():
                for i in range(3):
                    per_name[name][i].append(t[i])
        layers = args.layers
        span = statistics.median(spans) / 1e3
        print(f"graph {graph_id}: {len(runs[0])} kernels, {len(runs)} replays, "
              f"median span {span:.1f} us ({span / layers:.2f} us per layer)")
        print(f"  {'alone':>8} {'exposed':>8} {'gaps':>7}  us per layer  kernel")
        ordered = sorted(per_name.items(), key=lambda kv: -statistics.median(kv[1][1]))
        for name, (durations, exposed, gaps) in ordered:
            med = [statistics.median(v) / 1e3 / layers for v in (durations, exposed, gaps)]
            print(f"  {med[0]:8.2f} {med[1]:8.2f} {med[2]:7.2f}  {name}")
        exposed_sum = sum(statistics.median(v[1]) for v in per_name.values()) / 1e3 / layers
        gap_sum = sum(statistics.median(v[2]) for v in per_name.values()) / 1e3 / layers
        print(f"  sum of medians: exposed {exposed_sum:.2f}, gaps {gap_sum:.2f} us per layer")


if __name__ == "__main__":
    main()
