#!/usr/bin/env python3
"""Turns the CUDA decode-attention benchmark's results (bench/results/cuda_decode_attention_h200.json,
written by bench/cuda/run_attention_bench.sh) into a measured-times file for
`ekva roofline --measured` (schema in docs/ROOFLINE.md): one "attention" entry per (batch, context)
with EKVA's uniform-length kernel time.

The benchmark's context counts the KV tokens a query reads; the roofline's decode context counts the
tokens before the one being decoded (it reads context + 1), so entries carry context - 1.

  python3 tools/measured_from_attention_bench.py bench/results/cuda_decode_attention_h200.json OUT.json
"""
import json
import sys


def main():
    source, out = sys.argv[1], sys.argv[2]
    results = json.load(open(source))
    rows = [{"operator": "attention", "batch": a["batch"], "context": a["context"] - 1,
             "time_s": a["uniform_us"] * 1e-6,
             "note": f"EKVA paged decode attention, uniform lengths, {a['context']} KV tokens"}
            for a in results["ekva"]["attention"]]
    measured = {
        "hardware": "h200",
        "description": (f"{results['what']}; commit {results['commit']}, {results['date']}; "
                        f"converted from {source} by tools/measured_from_attention_bench.py"),
        "measurements": rows,
    }
    with open(out, "w") as f:
        json.dump(measured, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
