#!/usr/bin/env python3
"""What the kernel boundary before decode attention costs in a step: the kernel trace of a run of
a build with docs/results/session28/candidates/decode-attention-timeline-marks.diff
(`VARIANT=tl PROMPT=0 tools/variants/job.sh trace MODEL` writes both: trace-MODEL-decode-tl.csv.gz
and, on stderr, trace-MODEL-decode-tl.err with the marks of the last attention launch).

    tools/variants/boundary.py trace-qwen3-30b-a3b-decode-tl.csv.gz trace-qwen3-30b-a3b-decode-tl.err

The trace's clock and the marks' global timer are put on one time line by the last attention
launch: its start in the trace against its first CTA's entry mark. The end of that launch in the
trace against its last CTA's exit mark checks the alignment. Printed in us from the end of the
kernel before attention (the KV append): when attention's CTAs return from their wait for it,
when attention ends, and when the kernel after it (the O product) starts and ends.
"""
import csv
import gzip
import statistics
import sys

from marks import read_marks


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    opener = gzip.open if sys.argv[1].endswith(".gz") else open
    with opener(sys.argv[1], "rt") as f:
        kernels = sorted(csv.DictReader(f), key=lambda k: int(k["start_ns"]))
    attention = [i for i, k in enumerate(kernels) if "decode_attention_kernel" in k["name"]]
    if not attention or attention[-1] == 0 or attention[-1] + 1 >= len(kernels):
        sys.exit("boundary.py: no decode attention launch between two kernels in the trace")
    last = attention[-1]
    before, att, after = kernels[last - 1], kernels[last], kernels[last + 1]
    working, idle = read_marks(sys.argv[2])
    everything = working + idle
    if not working:
        sys.exit("boundary.py: no CTA with pieces in the marks")
    offset = int(att["start_ns"]) - min(r[0] for r in everything)
    end_error = int(att["end_ns"]) - (max(r[7] for r in everything) + offset)
    zero = int(before["end_ns"])

    def us(t_trace):
        return (t_trace - zero) / 1000

    waits = [us(r[2] + offset) for r in working]
    print("before:", before["name"][:80])
    print("after: ", after["name"][:80])
    print("alignment check: attention's trace end - its last exit mark = {:.2f} us".format(
        end_error / 1000))
    print("attention starts         {:7.2f}".format(us(int(att["start_ns"]))))
    print("the kernel before ends   {:7.2f}".format(0.0))
    print("attention's waits return {:7.2f} first, {:.2f} median, {:.2f} last".format(
        min(waits), statistics.median(waits), max(waits)))
    print("attention ends           {:7.2f}".format(us(int(att["end_ns"]))))
    print("the kernel after starts  {:7.2f}, ends {:.2f}".format(
        us(int(after["start_ns"])), us(int(after["end_ns"]))))


if __name__ == "__main__":
    main()
