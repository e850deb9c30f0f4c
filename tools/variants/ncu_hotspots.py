#!/usr/bin/env python3
"""Where a kernel's warps wait, from an Nsight Compute report that `tools/variants/job.sh ncu`,
`ncu-step` or `ncu-attention` exported (`ncu --import R --page source --csv`, and `--page raw`):

  tools/variants/ncu_hotspots.py SOURCE.csv[.gz] [RAW.txt] [--share=FRACTION]

Prints the warp states per issued instruction of the raw page (largest first), then every
instruction holding at least FRACTION (default 0.012) of the PC samples, with its count of
executions and its two largest stall reasons.
"""
import csv
import gzip
import re
import sys


def read_lines(path):
    """The file's lines (gzip-compressed where it ends in .gz), or exit naming it."""
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rt", errors="replace") as f:
                return f.read().splitlines()
        with open(path, errors="replace") as f:
            return f.read().splitlines()
    except (OSError, EOFError) as e:
        sys.exit(f"{path}: cannot be read: {e}")


def stall_ratios(path):
    """[(ratio, state)] of the raw page's smsp__average_warps_issue_stalled_*_per_issue_active."""
    pattern = re.compile(
        r"smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio\s+\S+\s+([\d.,]+)")
    ratios = []
    for line in read_lines(path):
        match = pattern.search(line)
        if match:
            ratios.append((float(match.group(2).replace(",", "")), match.group(1)))
    if not ratios:
        sys.exit(f"{path}: no smsp__average_warps_issue_stalled_* metrics (not `ncu --page raw`?)")
    return sorted(ratios, reverse=True)


def hotspots(path, share):
    """Total PC samples and [(index, samples, executions, source, [(count, reason)])]."""
    rows = list(csv.reader(read_lines(path)))
    header_at = next((i for i, row in enumerate(rows) if "Source" in row), None)
    if header_at is None:
        sys.exit(f"{path}: no header row with a 'Source' column (not `ncu --page source --csv`?)")
    header, body = rows[header_at], rows[header_at + 1:]
    try:
        source = header.index("Source")
        samples = header.index("Warp Stall Sampling (All Samples)")
        executed = header.index("Instructions Executed")
    except ValueError as missing:
        sys.exit(f"{path}: {missing}")
    reasons = [(i, name[len("stall_"):]) for i, name in enumerate(header)
               if name.startswith("stall_") and "Not Issued" not in name]

    def count(row, i):
        try:
            return int(float(row[i].replace(",", ""))) if i < len(row) and row[i] else 0
        except ValueError:
            return 0

    total = sum(count(row, samples) for row in body)
    hot = []
    for index, row in enumerate(body):
        n = count(row, samples)
        if total and n >= share * total:
            top = sorted(((count(row, i), name) for i, name in reasons), reverse=True)[:2]
            hot.append((index, n, count(row, executed), row[source].strip(), top))
    return total, hot


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--share")]
    share = 0.012
    for a in sys.argv[1:]:
        if a.startswith("--share"):
            try:
                share = float(a.split("=", 1)[1])
            except (IndexError, ValueError):
                sys.exit("--share=FRACTION, e.g. --share=0.02")
    if not 1 <= len(args) <= 2:
        sys.exit(__doc__)
    if len(args) == 2:
        print("warps stalled per issued instruction:")
        for ratio, state in stall_ratios(args[1]):
            if ratio > 0:
                print(f"  {state:24s} {ratio:6.2f}")
    total, hot = hotspots(args[0], share)
    print(f"{total} PC samples; instructions with at least {share:.1%} of them:")
    for index, n, executed, text, top in hot:
        why = ", ".join(f"{name} {c}" for c, name in top if c)
        print(f"  {index:6d} {n:6d} ({n / total:5.1%}) x{executed:<9d} {text[:60]:60s} {why}")


if __name__ == "__main__":
    main()
