#!/usr/bin/env python3
"""Prefill efficiencies of the Roofline profile from one prompt's per-kernel times.

    ekva roofline --model CONFIG --hw h200 --phase prefill --context N --json > r.json
    tools/fit_prefill_efficiency.py r.json ncu-summary.txt

Each row's efficiency in the report is divided out, so the profile's own prefill table does not
matter. ncu-summary.txt is tools/ncu_summary.py's listing of the same prompt (per-layer
microseconds by kernel name). Each group of Roofline rows below is matched with the kernels that
run it in EKVA's engine; its efficiency is the rows' roofline time at efficiency 1 (the larger of
compute and memory, per row) over the kernels' time less the rows' per-call latencies, so that
the profile reproduces the kernels' time. Prints each group's figures and the
prefill_operator_efficiency table.
"""
import argparse
import collections
import json
import re
import sys

# Roofline rows -> the kernels (name substrings) that run them in a fine-grained model's prompt.
GROUPS = {
    "attention": (["attention_scores", "attention_values"], ["prefill_attention_kernel"]),
    "routed_experts": (["routed_experts"],
                       ["grouped_gemm_kernel", "grouped_gemm_wide_kernel", "combine_kernel",
                        "sort_pairs_kernel", "sort_count_kernel"]),
    "elementwise": (["attn_norm", "mlp_norm", "qk_norm", "rope_kv_write"],
                    ["rms_norm_kernel", "append_kv_kernel"]),
    # The router's float32 product: on FMA pipes (sm80_xmma_gemm_f32f32) before 3a86424's TF32,
    # on the tensor cores (sm90_xmma_gemm_f32f32_tf32f32) since.
    "router": (["router"], ["xmma_gemm_f32f32"]),
}
LINE = re.compile(r"^\s*[\d.]+ us\s+\d+x\s+[\d.]+ us/launch\s+([\d.]+) us/layer\s+(.*)$")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("roofline", help="ekva roofline --phase prefill --json of the prompt")
    parser.add_argument("kernels", help="tools/ncu_summary.py output for the same prompt")
    args = parser.parse_args()
    report = json.load(open(args.roofline))
    if report.get("workload", {}).get("phase") != "prefill":
        sys.exit(f"{args.roofline}: not an ekva roofline --phase prefill --json report")
    layers = max(r["layer"] for r in report["operators"]) + 1
    per_layer = collections.defaultdict(lambda: [0.0, 0.0])  # roof at efficiency 1, latency
    for r in report["operators"]:
        if r["layer"] < 0:
            continue
        e = r["efficiency"]
        roof = max(r["compute_time_s"], r["memory_time_s"]) * e
        per_layer[r["operator"]][0] += roof * 1e6 / layers
        per_layer[r["operator"]][1] += r["latency_s"] * 1e6 / layers
    # A list, not a dict: the listing may hold one name on several lines (launches of different
    # grids), each of which counts.
    kernels = []
    for line in open(args.kernels):
        m = LINE.match(line)
        if m:
            kernels.append((m.group(2).strip(), float(m.group(1))))
    if not kernels:
        sys.exit(f"{args.kernels}: no per-layer kernel lines of tools/ncu_summary.py")
    table = {}
    for group, (rows, names) in GROUPS.items():
        roof = sum(per_layer[r][0] for r in rows)
        latency = sum(per_layer[r][1] for r in rows)
        measured = sum(us for name, us in kernels if any(n in name for n in names))
        if measured <= latency:
            print(f"{group}: no kernel time measured beyond the latencies; left out")
            continue
        table[group] = round(roof / (measured - latency), 3)
        print(f"{group}: rows {roof:.1f} us per layer at efficiency 1 (+{latency:.1f} us "
              f"latency), kernels {measured:.1f} us per layer -> {table[group]}")
    print(json.dumps({"prefill_operator_efficiency": table}))


if __name__ == "__main__":
    main()
