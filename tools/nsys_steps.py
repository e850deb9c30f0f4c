#!/usr/bin/env python3
"""Where a decode step's time goes inside its CUDA graph, from an Nsight Systems kernel trace.

    nsys profile --cuda-graph-trace=node -o run ekva bench ... --batch 1
    nsys stats --report cuda_gpu_trace --format csv --output run run.nsys-rep
    tools/nsys_steps.py run_cuda_gpu_trace.csv --steps 5 --layers 48

A step is the kernels from one embed_rows_kernel to the next; the last --steps steps are read. Per
kernel name (template arguments cut), the mean duration per layer and the mean gap before it (from
the end of the kernel before to its start; negative where its launch overlapped that kernel), then
the step's span, the kernels' busy time and the gaps' total. Unlike Nsight Compute's replays, this
is the graph as it runs: launches overlapping, caches as the step leaves them.
"""
import argparse
import collections
import csv
import re


def short(name):
    name = name.replace("(anonymous namespace)", "").removeprefix("void ")
    name = re.sub(r"\([A-Za-z_:]+\)(?=[-0-9])", "", name)  # enum casts in template arguments
    name = re.sub(r"\(.*$", "", name)
    name = re.sub(r"<.*>", lambda m: "<" + re.sub(r"[^0-9,]", "", m.group(0)) + ">", name)
    return name.split("::")[-1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", help="nsys stats cuda_gpu_trace CSV")
    parser.add_argument("--steps", type=int, default=5, help="the last this many steps")
    parser.add_argument("--layers", type=int, default=1, help="divide per-step figures by this")
    args = parser.parse_args()
    with open(args.csv) as f:
        rows = list(csv.DictReader(f))
    start_key = next(k for k in rows[0] if k.startswith("Start"))
    duration_key = next(k for k in rows[0] if k.startswith("Duration"))
    kernels = [(int(r[start_key]), int(r[duration_key]), r["Name"]) for r in rows
               if r.get("Name") and not r["Name"].startswith("[")]
    kernels.sort()
    starts = [i for i, k in enumerate(kernels) if "embed_rows_kernel" in k[2]]
    if len(starts) < args.steps + 1:
        raise SystemExit(f"{len(starts)} steps in the trace, {args.steps + 1} needed")
    busy = collections.defaultdict(float)
    gap = collections.defaultdict(float)
    count = collections.Counter()
    span = idle = work = 0.0
    for a, b in zip(starts[-args.steps - 1:-1], starts[-args.steps:]):
        step = kernels[a:b]
        span += (step[-1][0] + step[-1][1] - step[0][0]) / 1e3
        end = step[0][0]
        for s, d, name in step:
            n = short(name)
            busy[n] += d / 1e3
            gap[n] += (s - end) / 1e3
            count[n] += 1
            idle += max(0, s - end) / 1e3
            work += d / 1e3
            end = max(end, s + d)
    per = args.steps * args.layers
    print(f"step span {span / args.steps:.1f} us, kernels {work / args.steps:.1f} us, "
          f"idle gaps {idle / args.steps:.1f} us; per layer ({args.layers}): "
          f"{span / per:.2f} / {work / per:.2f} / {idle / per:.2f} us")
    print(f"{'kernel':44s} {'per step':>8s} {'us/layer':>9s} {'gap/layer':>9s} {'us/call':>8s} {'gap/call':>8s}")
    for n in sorted(busy, key=lambda n: -busy[n]):
        calls = count[n]
        print(f"{n[:44]:44s} {calls / args.steps:8.1f} {busy[n] / per:9.2f} {gap[n] / per:9.2f} "
              f"{busy[n] / calls:8.2f} {gap[n] / calls:8.2f}")


if __name__ == "__main__":
    main()
