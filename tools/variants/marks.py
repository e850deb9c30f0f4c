#!/usr/bin/env python3
"""Summarises the decode-attention timeline that a build with
docs/results/session28/candidates/decode-attention-timeline-marks.diff prints on stderr ("mark CTA
t0 .. t7": the global timer in ns of each CTA at its entry, before and after its wait for the
kernel before, when its first tile has landed, at its last piece's end, after the segment's count,
after a segment's merge, and at its exit, in the last launch of the run; a build with
decode-attention-timeline-marks-16-on-sm.diff (or -16-on-sm2.diff) adds, for a segment's merging
CTA, when its first chunk of partials has landed in shared memory, when it has folded that chunk,
and when its outputs are written). Times are in us from the first CTA's return from the wait.

  tools/variants/marks.py decode-qwen3-30b-a3b-tl-1.err [...]
"""
import statistics
import sys

STAGES = ["entry", "pre-wait", "wait done", "1st tile", "end piece", "counted"]


def read_marks(path):
    """The CTAs of the last launch with pieces, and those without (which mark only their entry
    and exit; their other marks are an earlier launch's)."""
    rows = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.startswith("mark "):
                continue
            try:
                row = [int(field) for field in line.split()[2:]]
            except ValueError:
                sys.exit(f"{path}:{number}: a mark line holds a non-integer time")
            if len(row) < 8:
                sys.exit(f"{path}:{number}: a mark line has {len(row)} times, at least 8 expected")
            rows.append(row)
    working = [r for r in rows if r[2] >= r[0] and r[3] >= r[0]]
    idle = [r for r in rows if not (r[2] >= r[0] and r[3] >= r[0])]
    return working, idle


def summary(values):
    return "min {:6.2f} med {:6.2f} max {:6.2f}".format(
        min(values), statistics.median(values), max(values))


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for path in sys.argv[1:]:
        working, idle = read_marks(path)
        if not working:
            print(path, "no CTA with pieces")
            continue
        t0 = min(r[2] for r in working)

        def us(rs, i):
            return [(r[i] - t0) / 1000 for r in rs]

        print(path, len(working), "working CTAs")
        for i, name in enumerate(STAGES):
            print("  {:11s}".format(name), summary(us(working, i)))
        merging = [r for r in working if r[6] >= r[0]]
        if merging:
            print("  {:11s}".format("merged"), summary(us(merging, 6)), len(merging), "CTAs")
            if len(merging[0]) > 8:
                for i, name in [(8, "chunk in"), (9, "chunk done"), (10, "written")]:
                    print("  {:11s}".format(name), summary(us(merging, i)))
        print("  {:11s}".format("exit"), summary(us(working, 7)))
        if idle:
            print("  {:11s}".format("idle exit"), summary(us(idle, 7)), len(idle), "CTAs")


if __name__ == "__main__":
    main()
