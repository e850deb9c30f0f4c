#!/usr/bin/env python3
"""Where a CUDA graph's time goes, from the kernel timeline of tools/kernel_trace.

    CUDA_INJECTION64_PATH=BUILD/tools/kernel_trace/libekva_kernel_trace.so \\
        EKVA_KERNEL_TRACE=trace.csv ekva bench ... --batch 1 ...
    tools/kernel_trace_summary.py trace.csv --layers 48    (or trace.csv.gz)

Each graph (one per step shape that `ekva bench` captured) is replayed several times; a replay is
found by its first node coming round again. Per replay, the time from the first kernel's start to
the last one's end is split, walking the kernels in start order, into each kernel's exposed time
(how far its end moved the latest end so far: the time the step waited on it) and the idle gaps
before kernels that started after everything before them had ended. Printed per graph: the median
replay span, then per kernel and grid (so that products of different shapes stay apart) its median
duration from start to end (with programmatic dependent launch, a kernel starts before the one
before it has finished, so this includes its wait), its exposed time and the gaps before it, in microseconds per layer, largest exposed first.
The medians are over replays, so warm-up replays count for little. With --timeline FIRST:COUNT it
also prints kernels FIRST to FIRST + COUNT - 1 (in start order) of each graph's middle replay, each
with its start and end from the first one's start and how far its end lies past the end before it
(a decode step's chain of dependent kernels, one layer at a time).

Kernels launched one by one (a prompt's step, which is not captured) are split into runs wherever
the GPU idles for more than --run-gap-ms; for each run of at least --min-kernels kernels it prints
the span from its first kernel's start to its last one's end, the idle time inside that span and
the largest idle gap. A step's wall time less its span is host work before and after its kernels.
Between a graph's replays it prints the kernels launched one by one (a step's token draw) and how
long after a replay's end the next one starts (under the trace, which adds host time of its own).
"""
import argparse
import collections
import csv
import gzip
import re
import statistics
import sys


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
                        help="graphs with fewer kernels per replay, and runs of kernels launched one "
                        "by one with fewer kernels, are left out")
    parser.add_argument("--run-gap-ms", type=float, default=2.0,
                        help="an idle gap this long ends a run of kernels launched one by one")
    parser.add_argument("--timeline", metavar="FIRST:COUNT",
                        help="print these kernels of each graph's middle replay one by one")
    args = parser.parse_args()
    timeline = None
    if args.timeline:
        try:
            timeline = tuple(int(v) for v in args.timeline.split(":"))
            if len(timeline) != 2 or min(timeline) < 0:
                raise ValueError
        except ValueError:
            sys.exit(f"kernel_trace_summary: --timeline takes FIRST:COUNT, not {args.timeline}")
    graphs = collections.defaultdict(list)
    eager = []
    columns = {"start_ns", "end_ns", "graph_id", "graph_node_id", "grid", "name"}
    try:
        # job.sh brings traces back gzip-compressed (trace-*.csv.gz).
        with gzip.open(args.csv, "rt") if args.csv.endswith(".gz") else open(args.csv) as f:
            reader = csv.DictReader(f)
            missing = columns - set(reader.fieldnames or [])
            if missing:
                sys.exit(f"kernel_trace_summary: {args.csv} is not a kernel_trace CSV "
                         f"(no column {', '.join(sorted(missing))})")
            for line, row in enumerate(reader, start=2):
                try:
                    kernel = {"start": int(row["start_ns"]), "end": int(row["end_ns"]),
                              "node": int(row["graph_node_id"]),
                              "name": f'{short_name(row["name"])} grid {row["grid"]}'}
                    graph = int(row["graph_id"])
                except (TypeError, ValueError):
                    sys.exit(f"kernel_trace_summary: {args.csv}: line {line} is not a kernel "
                             "(integer start_ns, end_ns, graph_id and graph_node_id)")
                if graph == 0:
                    eager.append(kernel)
                else:
                    graphs[graph].append(kernel)
    except (OSError, UnicodeDecodeError) as e:
        sys.exit(f"kernel_trace_summary: cannot read {args.csv}: {e}")
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
        between_replays(runs, eager)
        if timeline:
            print_timeline(sorted(runs[len(runs) // 2], key=lambda k: k["start"]), *timeline)
    eager_runs(sorted(eager, key=lambda k: k["start"]), args.run_gap_ms * 1e6, args.min_kernels)


def print_timeline(run, first, count):
    """Kernels first .. first + count - 1 of one replay in start order: start, end, duration and
    the end's distance past the previous kernel's end, in microseconds."""
    kernels = run[first:first + count]
    if not kernels:
        return
    t0 = kernels[0]["start"]
    print(f"  kernels {first} to {first + len(kernels) - 1} of replay {len(run)} kernels long:")
    print(f"  {'start':>8} {'end':>8} {'us':>7} {'end after the last':>18}  kernel")
    previous = None
    for k in kernels:
        start, end = (k["start"] - t0) / 1e3, (k["end"] - t0) / 1e3
        after = end - previous if previous is not None else 0.0
        print(f"  {start:8.2f} {end:8.2f} {end - start:7.2f} {after:18.2f}  {k['name']}")
        previous = end


def between_replays(runs, eager):
    """What ran between consecutive replays: each kernel launched one by one after a replay and
    before the next (a step's token draw), median duration per kernel, and the median time from a
    replay's last end to the next replay's first start (the host's part of a step, and the
    kernels and copies outside the graph)."""
    bounds = [(min(k["start"] for k in r), max(k["end"] for k in r)) for r in runs]
    durations = collections.defaultdict(list)
    waits = []
    for (_, end), (next_start, _) in zip(bounds, bounds[1:]):
        waits.append(next_start - end)
        for k in eager:
            if end <= k["start"] < next_start:
                durations[k["name"]].append(k["end"] - k["start"])
    if not waits:
        return
    kernels = "; ".join(f"{statistics.median(d) / 1e3:.2f} us {name} (x{len(d)})"
                        for name, d in sorted(durations.items()))
    wait = statistics.median(waits) / 1e3
    print(f"  between {len(waits)} pairs of replays: the next starts {wait:.1f} us (median) after "
          f"a replay ends; launched one by one in between: {kernels or 'nothing'}")


def eager_runs(kernels, run_gap_ns, min_kernels):
    """Runs of kernels launched one by one: span, idle time inside it, largest idle gap."""
    runs = []
    latest_end = None
    for k in kernels:
        if latest_end is None or k["start"] - latest_end > run_gap_ns:
            runs.append([])
            latest_end = k["end"]
        runs[-1].append(k)
        latest_end = max(latest_end, k["end"])
    for run in runs:
        if len(run) < min_kernels:
            continue
        rows, span = attribute(run)
        gaps = [(gap, name) for name, _, _, gap in rows]
        largest = max(gaps)
        print(f"launched one by one: {len(run)} kernels, span {span / 1e6:.2f} ms, idle inside "
              f"{sum(g for g, _ in gaps) / 1e6:.2f} ms (largest {largest[0] / 1e3:.1f} us, before "
              f"{largest[1]})")


if __name__ == "__main__":
    main()
