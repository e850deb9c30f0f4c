#!/usr/bin/env python3
"""The figures-of-record tables of docs/BENCHMARKS.md from `tools/variants/job.sh record` runs.

  tools/variants/record_table.py [--peers RUN_DIR] RUN_DIR [RUN_DIR ...]

Each RUN_DIR holds one run's record-MODEL-VARIANT.json files (Mixtral-8x7B, Qwen3-30B-A3B and
OLMoE-1B-7B; variant base). Prints the decode table (each run's step, their median, tokens/s, the
Roofline prediction and its error against the median, the datasheet floor and its share of the
median) and the prompt table (TFLOP/s and share of the H200's 790 at the median), then the
Roofline model's median |error| over the decode rows and over all rows. With --peers, the run
whose `tools/variants/job.sh peers` files (hf-MODEL.json, graphed-mixtral-8x7b.json) sit beside its
records: a table of each peer's full-KV step against EKVA's in that same run.
"""
import json
import os
import statistics
import sys

MODELS = (("mixtral-8x7b", "Mixtral-8x7B"), ("qwen3-30b-a3b", "Qwen3-30B-A3B"),
          ("olmoe-1b-7b", "OLMoE-1B-7B"))
DENSE_TFLOPS = 790.0  # the bf16 rate of the H200


DECODE_FIELDS = ("batch", "budget", "step_ms", "predicted_ms", "datasheet_floor_ms")
PREFILL_FIELDS = ("prompt", "ms", "flops", "predicted_ms")


def load(run, model):
    """One run's `ekva bench --json` record of a model, its fields checked; exits naming the file."""
    path = os.path.join(run, f"record-{model}-base.json")
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"record_table.py: {path}: {e}")
    decode = record.get("decode") if isinstance(record, dict) else None
    prefill = record.get("prefill") if isinstance(record, dict) else None
    if (not isinstance(decode, list) or not decode or not isinstance(prefill, dict)
            or any(not isinstance(row, dict) or any(k not in row for k in DECODE_FIELDS)
                   for row in decode)
            or any(k not in prefill for k in PREFILL_FIELDS)):
        sys.exit(f"record_table.py: {path}: not an `ekva bench --json` record with decode rows "
                 f"({', '.join(DECODE_FIELDS)}) and a prefill ({', '.join(PREFILL_FIELDS)})")
    return record


def peer_steps(path, ms_of):
    """{batch: ms} of a peer's JSON rows (rows without a time, as out of memory, left out); {} when
    the file is absent, since a peer runs only where memory allows."""
    if not os.path.exists(path):
        return {}
    try:
        with open(path) as f:
            data = json.load(f)
        rows = data["decode"] if isinstance(data, dict) else data
        return {row["batch"]: ms_of(row) for row in rows if "error" not in row}
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"record_table.py: {path}: not a peer's rows ({e})")


def peers_table(run):
    """EKVA's full-KV steps of `run` beside the peers' steps measured in the same run."""
    print("| model | batch | EKVA ms | transformers eager ms (x EKVA) | graphed PyTorch step ms "
          "(x EKVA) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for model, name in MODELS:
        hf = peer_steps(os.path.join(run, f"hf-{model}.json"), lambda r: r["step_ms"])
        graphed = peer_steps(os.path.join(run, f"graphed-{model}.json"), lambda r: 1e3 * r["time_s"])
        for row in load(run, model)["decode"]:
            if row["budget"] != 1:
                continue
            ms = row["step_ms"]
            cells = [f"{peer[row['batch']]:.2f} ({peer[row['batch']] / ms:.2f}x)"
                     if row["batch"] in peer else "–" for peer in (hf, graphed)]
            print(f"| {name} | {row['batch']} | {ms:.2f} | {cells[0]} | {cells[1]} |")


def main():
    args = sys.argv[1:]
    peers_run = None
    if args[:1] == ["--peers"]:
        if len(args) < 2:
            sys.exit("record_table.py: --peers needs a run directory")
        peers_run, args = args[1], args[2:]
    runs = args
    if not runs:
        sys.exit("usage: record_table.py [--peers RUN_DIR] RUN_DIR [RUN_DIR ...]")
    records = {m: [load(run, m) for run in runs] for m, _ in MODELS}
    for model, _ in MODELS:
        shapes = {len(r["decode"]) for r in records[model]}
        if len(shapes) != 1:
            sys.exit(f"record_table.py: the runs hold different numbers of {model}'s decode rows "
                     f"({sorted(shapes)})")
    decode_errors, prompt_errors = [], []
    print("| model | batch | budget | ms / step (runs) | median | tokens/s | Roofline ms (error) "
          "| floor ms | % of floor |")
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for model, name in MODELS:
        first = records[model][0]["decode"]
        for i, row in enumerate(first):
            ms = [r["decode"][i]["step_ms"] for r in records[model]]
            median = statistics.median(ms)
            error = (row["predicted_ms"] - median) / median
            decode_errors.append(abs(error))
            floor = row["datasheet_floor_ms"]
            print(f"| {name} | {row['batch']} | {row['budget']:g} | "
                  f"{', '.join(f'{x:.3f}' for x in ms)} | {median:.2f} | "
                  f"{row['batch'] * 1000 / median:.0f} | {row['predicted_ms']:.2f} "
                  f"({100 * error:+.0f}%) | {floor:.2f} | {100 * floor / median:.0f}% |")
    print()
    print("| model | prompt | ms (runs) | median | TFLOP/s | of 790 | Roofline ms (error) |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for model, name in MODELS:
        prefill = records[model][0]["prefill"]
        ms = [r["prefill"]["ms"] for r in records[model]]
        median = statistics.median(ms)
        tflops = prefill["flops"] / median / 1e9
        error = (prefill["predicted_ms"] - median) / median
        prompt_errors.append(abs(error))
        print(f"| {name} | {prefill['prompt']} | {', '.join(f'{x:.1f}' for x in ms)} | "
              f"{median:.1f} | {tflops:.0f} | {100 * tflops / DENSE_TFLOPS:.0f}% | "
              f"{prefill['predicted_ms']:.1f} ({100 * error:+.0f}%) |")
    print()
    print(f"Roofline median |error|: {100 * statistics.median(decode_errors):.1f}% over the "
          f"{len(decode_errors)} decode rows, "
          f"{100 * statistics.median(decode_errors + prompt_errors):.1f}% over all "
          f"{len(decode_errors) + len(prompt_errors)}")
    if peers_run is not None:
        print()
        peers_table(peers_run)


if __name__ == "__main__":
    main()
