#!/usr/bin/env python3
"""Fits the decode parameters of a Roofline hardware profile to whole `ekva bench` decode steps.

    tools/fit_decode_profile.py --ekva build/src/cli/ekva --hw data/hardware/h200.json \\
        --archive docs/results/batch1-prologue-h200/call5-lead-and-prefetch-jsons.tgz \\
        --fit full-mixtral-8x7b.json full-qwen3-30b-a3b.json --held-out full-olmoe-1b-7b.json

Each bench file is `ekva bench --json` output (its decode rows: batch, context, budget, step_ms;
its prompt row, when present, is reported but never fitted). With --archive the file names are
members of that .tgz, otherwise paths. The model's config is the path the file records (relative
to the current directory, normally the repository root).

Every prediction is ekva's own: a candidate profile (the base profile --hw with the fitted
entries replaced) is written to a temporary file and `ekva roofline --hw-file CANDIDATE
--measured ROWS.json --json` predicts each row, with `kv_fraction` = budget for budget < 1, which
is the workload `ekva bench` predicts (KvRetention::fraction), so a row's prediction is the one
bench would print with that profile. The base profile's predictions are printed beside the
fitted ones.

Fitted parameters (default; --param TABLE.KEY=LO:HI:STEP, repeatable, replaces them), each
held to a physically sensible range:

  operator_efficiency.routed_experts     0.70-1.00  fraction of the measured 4.5 TB/s read ceiling
                                                    the expert products reach: the batch-1 GEMVs
                                                    read ~4.4 TB/s (0.98), the grouped products of
                                                    batch 64 ~3.4 TB/s (0.75); one value serves all
  operator_latency_us.routed_experts     2-15 us    fixed cost of a layer's expert kernels (gate and
                                                    up, down: a few us each)

Held at values read off the batch-1 kernel timelines (default; --set TABLE.KEY=VALUE, repeatable,
replaces them; a key given to --param is fitted instead): each is a kernel's exposed time per
layer less its bytes at the 4.5 TB/s read ceiling (in docs/results/batch1-prologue-h200/:
call1-traces-62ba2d3.txt, and trace-3a86424-qwen3-b1.csv.gz through tools/kernel_trace_summary.py).

  operator_latency_us.gemm               2.0 us     Qwen3-30B-A3B at 3a86424: Q/K/V 1.0, O -0.8 (its
                                                    weights load before its wait), router 6.0: 6.2
                                                    us over the layer's three GEMM calls
  operator_latency_us.attention_scores   12.0 us    the fused decode attention at context 4k: 13.0
                                                    (Qwen3), 12.0 (Mixtral), 8.0 (OLMoE); median
  operator_latency_us.elementwise        3.3 us     each residual norm 3.3 (Qwen3 at 3a86424), the
                                                    KV append 3.4, OLMoE's QK-norm 3.4 (62ba2d3)

Whole decode steps cannot tell these latencies apart: every one is a constant per layer at every
batch, and the models differ only in how many rows of each class a layer has. Fitted freely (all
five with --param: routed experts 2-15, gemm 1-10, attention_scores 2-20, elementwise 1-10 us) on
the session-15 rows they end at gemm 3.5, attention 9.0, elementwise 4.7 and routed experts 2.0
(the end of its range): the same 40 us per Qwen3 layer in all, the same errors (mean 5.3% on the
fit rows against 5.4%), but a split the timelines contradict. So the timelines fix the split and
the steps fit the rest.

The search (--search descent) is coordinate descent from the base profile's values (clipped to
the ranges): each fitted parameter in turn is set to the grid value that minimises the objective
over the FIT rows with the others held, until a full pass changes nothing. --search grid tries
every point of the grids instead (the default two parameters: 837 points, two minutes on two
cores; on the session-15 rows it finds the same point). The objective is the mean |relative
error| (--objective mean, ties broken by the median) or the median (--objective median, ties
broken by the mean; it tends to fit half the rows closely and leave the rest far off).

Prints the fitted operator_efficiency / operator_latency_us tables as JSON, the median, mean and
largest |error| on the fit, held-out and all decode rows (and with the prompts) for the base and
the fitted profile, and a markdown table of every row. --write FILE writes the fitted profile (the
base with those tables' entries replaced; its method string is the base's).

Python 3 standard library only.
"""
import argparse
import concurrent.futures
import copy
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading

DEFAULT_PARAMS = [
    "operator_efficiency.routed_experts=0.70:1.00:0.01",
    "operator_latency_us.routed_experts=2:15:0.5",
]
DEFAULT_SET = [
    "operator_latency_us.gemm=2.0",
    "operator_latency_us.attention_scores=12.0",
    "operator_latency_us.elementwise=3.3",
]
TABLES = ("operator_efficiency", "operator_latency_us")


def die(msg):
    sys.exit(f"fit_decode_profile: {msg}")


def check_value(option, spec, table, lo, hi):
    if table == "operator_efficiency" and not (0 < lo and hi <= 2):
        die(f"{option} '{spec}': efficiencies must lie in (0, 2] (the profile's schema)")
    if table == "operator_latency_us" and lo < 0:
        die(f"{option} '{spec}': latencies must be >= 0")


def table_key(option, spec, name):
    table, dot, key = name.partition(".")
    if table not in TABLES or not dot or not key:
        die(f"{option} '{spec}': expected TABLE.KEY with TABLE one of {', '.join(TABLES)}")
    return table, key


class Param:
    def __init__(self, spec):
        name, _, rng = spec.partition("=")
        self.table, self.key = table_key("--param", spec, name)
        try:
            lo, hi, step = (float(x) for x in rng.split(":"))
        except ValueError:
            die(f"--param '{spec}': expected TABLE.KEY=LO:HI:STEP")
        if not (step > 0 and lo <= hi):
            die(f"--param '{spec}': need LO <= HI and STEP > 0")
        check_value("--param", spec, self.table, lo, hi)
        n = int(round((hi - lo) / step))
        self.grid = [round(lo + i * step, 6) for i in range(n + 1)]
        self.name = name

    def nearest(self, value):
        return min(self.grid, key=lambda g: abs(g - value))


def parse_set(spec):
    name, _, value = spec.partition("=")
    table, key = table_key("--set", spec, name)
    try:
        v = float(value)
    except ValueError:
        die(f"--set '{spec}': expected TABLE.KEY=VALUE")
    check_value("--set", spec, table, v, v)
    return (table, key), v


def load_bench(name, archive):
    try:
        if archive is not None:
            member = archive.extractfile(name)
            if member is None:
                die(f"{name}: not a file in the archive")
            bench = json.load(io.TextIOWrapper(member, encoding="utf-8"))
        else:
            with open(name, encoding="utf-8") as f:
                bench = json.load(f)
    except KeyError:
        die(f"{name}: no such member in the archive")
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        die(f"cannot read {name}: {e}")
    if not isinstance(bench, dict) or not isinstance(bench.get("decode"), list) \
            or not bench["decode"] or "model" not in bench:
        die(f"{name}: not ekva bench --json output with decode rows")
    for r in bench["decode"]:
        for key in ("batch", "context", "budget", "step_ms"):
            if not isinstance(r.get(key), (int, float)):
                die(f"{name}: a decode row lacks a numeric '{key}'")
        if not (r["batch"] >= 1 and r["context"] >= 1 and r["budget"] > 0 and r["step_ms"] > 0):
            die(f"{name}: decode row {r} has a non-positive batch, context, budget or time")
    if not os.path.isfile(bench["model"]):
        die(f"{name}: its model config {bench['model']} is not a file (run from the repository "
            "root)")
    return bench


class Rows:
    """The rows of one bench file, as an `ekva roofline --measured` input."""

    def __init__(self, label, bench, held_out, tmpdir, index):
        self.model = bench["model"]
        self.name = os.path.basename(os.path.dirname(self.model)) or self.model
        self.hardware = bench.get("hardware")
        self.held_out = held_out
        self.rows = []  # dicts: kind, batch, context, budget, measured_ms, recorded_ms
        entries = []
        for r in bench["decode"]:
            e = {"operator": "step", "batch": int(r["batch"]), "context": int(r["context"]),
                 "time_s": r["step_ms"] / 1e3}
            if r["budget"] < 1:
                e["kv_fraction"] = r["budget"]
            entries.append(e)
            self.rows.append({"kind": "decode", "batch": int(r["batch"]),
                              "context": int(r["context"]), "budget": r["budget"],
                              "measured_ms": r["step_ms"], "recorded_ms": r.get("predicted_ms")})
        p = bench.get("prefill")
        if isinstance(p, dict) and isinstance(p.get("prompt"), int) and p.get("ms", 0) > 0:
            entries.append({"operator": "step", "phase": "prefill", "batch": 1,
                            "context": p["prompt"], "time_s": p["ms"] / 1e3})
            self.rows.append({"kind": "prompt", "batch": 1, "context": p["prompt"], "budget": 1,
                              "measured_ms": p["ms"], "recorded_ms": p.get("predicted_ms")})
        self.context = self.rows[0]["context"]
        self.path = os.path.join(tmpdir, f"rows-{index}.json")
        with open(self.path, "w", encoding="utf-8") as f:
            json.dump({"description": f"ekva bench rows of {label}", "measurements": entries}, f)


class Evaluator:
    def __init__(self, ekva, base, files, tmpdir):
        self.ekva, self.base, self.files, self.tmpdir = ekva, base, files, tmpdir
        self.cache = {}
        self.serial = 0
        self.lock = threading.Lock()

    def profile(self, values):
        hw = copy.deepcopy(self.base)
        for (table, key), v in values.items():
            hw["measured"].setdefault(table, {})[key] = v
        return hw

    def predict_file(self, hw_path, rows):
        cmd = [self.ekva, "roofline", "--model", rows.model, "--hw-file", hw_path, "--batch", "1",
               "--context", str(rows.context), "--measured", rows.path, "--json"]
        try:
            run = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as e:
            die(f"cannot run {self.ekva}: {e}")
        if run.returncode != 0:
            die(f"{' '.join(cmd)} failed:\n{run.stderr.strip()}")
        measured = json.loads(run.stdout)["measured"]
        if len(measured) != len(rows.rows):
            die(f"{rows.model}: ekva returned {len(measured)} predictions for {len(rows.rows)} "
                "rows")
        return [1e3 * m["predicted_s"] for m in measured]

    def predict(self, values, files=None):
        """Predicted ms of every row of `files` (default all) with the candidate `values`."""
        files = self.files if files is None else files
        key = (tuple(sorted(values.items())), tuple(id(f) for f in files))
        with self.lock:
            if key in self.cache:
                return self.cache[key]
            self.serial += 1
            serial = self.serial
        path = os.path.join(self.tmpdir, f"candidate-{serial}", f"{self.base['name']}.json")
        os.makedirs(os.path.dirname(path))
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.profile(values), f)
        out = {id(rows): self.predict_file(path, rows) for rows in files}
        with self.lock:
            self.cache[key] = out
        return out


def decode_errors(pred, files):
    return [p / r["measured_ms"] - 1 for rows in files
            for r, p in zip(rows.rows, pred[id(rows)]) if r["kind"] == "decode"]


def objective(errors, kind):
    """(the objective, the tie-breaker) over `errors`."""
    a = [abs(e) for e in errors]
    return (statistics.median(a), statistics.fmean(a)) if kind == "median" else \
        (statistics.fmean(a), statistics.median(a))


def progress(score, kind):
    other = "median" if kind == "mean" else "mean"
    return f"{kind} |error| {score[0]:.2%} ({other} {score[1]:.2%}) over the fit rows"


def fit(ev, params, fixed, fit_files, kind, search, jobs):
    values = dict(fixed)
    for p in params:
        start = ev.base["measured"].get(p.table, {}).get(p.key)
        if start is None:  # not in the base: the model's default (efficiency 1, latency 0)
            start = 1.0 if p.table == "operator_efficiency" else 0.0
        values[(p.table, p.key)] = p.nearest(start)

    def score(v):
        return objective(decode_errors(ev.predict(v, fit_files), fit_files), kind)

    if search == "grid":
        points = 1
        for p in params:
            points *= len(p.grid)
        if points > 20000:
            die(f"--search grid: {points} points; coarsen the grids or use --search descent")
        candidates = [dict(values)]
        for p in params:
            candidates = [c | {(p.table, p.key): g} for c in candidates for g in p.grid]
        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            scores = list(pool.map(score, candidates))
        i = min(range(len(candidates)), key=lambda j: scores[j])
        values = candidates[i]
        print(f"grid of {len(candidates)}: {progress(scores[i], kind)}", file=sys.stderr)
    best = score(values)
    for sweep in range(1, 21 if search == "descent" else 1):
        changed = False
        for p in params:
            candidates = [dict(values) for _ in p.grid]
            for c, g in zip(candidates, p.grid):
                c[(p.table, p.key)] = g
            with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
                scores = list(pool.map(score, candidates))
            i = min(range(len(p.grid)), key=lambda j: (scores[j], p.grid[j]))
            if scores[i] < best:
                best, values, changed = scores[i], candidates[i], True
        print(f"sweep {sweep}: {progress(best, kind)}", file=sys.stderr)
        if not changed:
            break
    for p in params:
        v = values[(p.table, p.key)]
        if len(p.grid) > 1 and v in (p.grid[0], p.grid[-1]):
            print(f"note: {p.name} = {v:g} is at the end of its range "
                  f"[{p.grid[0]:g}, {p.grid[-1]:g}]", file=sys.stderr)
    return values


def summary(label, errors):
    if not errors:
        return f"{label}: no rows"
    a = [abs(e) for e in errors]
    return (f"{label}: median |error| {statistics.median(a):.1%}, mean {statistics.fmean(a):.1%}, "
            f"largest {max(errors, key=abs):+.1%} over {len(errors)} rows")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[2:]))
    ap.add_argument("--ekva", required=True, help="the ekva binary (build/src/cli/ekva)")
    ap.add_argument("--hw", required=True, help="base hardware profile JSON (data/hardware/*.json)")
    ap.add_argument("--archive", help="a .tgz whose members the --fit / --held-out names are")
    ap.add_argument("--fit", nargs="+", required=True, help="bench JSONs whose rows are fitted")
    ap.add_argument("--held-out", nargs="*", default=[], help="bench JSONs only checked")
    ap.add_argument("--param", action="append", default=None,
                    help="TABLE.KEY=LO:HI:STEP to fit (repeatable; replaces the defaults)")
    ap.add_argument("--set", action="append", default=None,
                    help="TABLE.KEY=VALUE held during the fit (repeatable; replaces the defaults)")
    ap.add_argument("--objective", choices=("mean", "median"), default="mean")
    ap.add_argument("--search", choices=("descent", "grid"), default="descent",
                    help="coordinate descent, or every point of the parameters' grids")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                    help="parallel ekva calls")
    ap.add_argument("--write", help="write the fitted profile to this file")
    a = ap.parse_args()

    if a.jobs < 1:
        die("--jobs must be at least 1")
    if not (os.path.isfile(a.ekva) and os.access(a.ekva, os.X_OK)):
        die(f"--ekva {a.ekva} is not an executable file")
    try:
        with open(a.hw, encoding="utf-8") as f:
            base = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        die(f"cannot read --hw {a.hw}: {e}")
    if not isinstance(base, dict) or not isinstance(base.get("measured"), dict) \
            or "name" not in base:
        die(f"--hw {a.hw}: not a hardware profile with a 'measured' section")
    params = [Param(s) for s in (a.param or DEFAULT_PARAMS)]
    if len({p.name for p in params}) != len(params):
        die("a parameter is given twice")
    fixed = dict(parse_set(s) for s in (a.set or DEFAULT_SET))
    fitted_keys = {(p.table, p.key) for p in params}
    if a.set and fitted_keys & fixed.keys():
        die("a key is given to both --param and --set")
    fixed = {k: v for k, v in fixed.items() if k not in fitted_keys}
    archive = None
    if a.archive:
        try:
            archive = tarfile.open(a.archive, "r:*")
        except (OSError, tarfile.TarError) as e:
            die(f"cannot open --archive {a.archive}: {e}")
    names = a.fit + a.held_out
    if len(set(names)) != len(names):
        die("a bench file is listed twice")

    with tempfile.TemporaryDirectory(prefix="fit_decode_profile-") as tmpdir:
        files = []
        for i, name in enumerate(names):
            bench = load_bench(name, archive)
            rows = Rows(name, bench, name in a.held_out, tmpdir, i)
            if rows.hardware and rows.hardware != base["name"]:
                die(f"{name} was predicted for '{rows.hardware}', --hw is '{base['name']}'")
            files.append(rows)
        fit_files = [f for f in files if not f.held_out]
        held_files = [f for f in files if f.held_out]
        ev = Evaluator(a.ekva, base, files, tmpdir)

        before = ev.predict({})
        # A row whose recorded prediction (ekva bench's, with the profile of its day) differs from
        # the base profile's: the profile changed since, or the reproduction is wrong.
        stale = []
        for f in files:
            recorded = [(r, p) for r, p in zip(f.rows, before[id(f)])
                        if r["recorded_ms"] is not None]
            differ = [r["kind"] for r, p in recorded if abs(p / r["recorded_ms"] - 1) > 1e-9]
            if differ:
                stale.append(f"{f.name} ({len(differ)} of {len(recorded)} rows: "
                             f"{', '.join(sorted(set(differ)))})")
        if stale:
            print("note: the base profile does not give the predictions ekva bench recorded for "
                  f"{'; '.join(stale)} (the profile changed after the run?)", file=sys.stderr)

        values = fit(ev, params, fixed, fit_files, a.objective, a.search, a.jobs)
        after = ev.predict(values)

        fitted = ev.profile(values)["measured"]
        print(json.dumps({t: fitted.get(t, {}) for t in TABLES}))
        print("fitted: " + ", ".join(f"{p.name} {values[(p.table, p.key)]:g} "
                                     f"(range {p.grid[0]:g}-{p.grid[-1]:g})" for p in params))
        if fixed:
            print("held: " + ", ".join(f"{t}.{k} {v:g}" for (t, k), v in fixed.items()))
        print(f"objective: {a.objective} |error| over the decode rows of "
              f"{', '.join(f.name for f in fit_files)}")
        for label, preds in (("base profile", before), ("fitted profile", after)):
            print(f"\n{label}")
            for set_label, fs in (("  fit", fit_files), ("  held out", held_files),
                                  ("  all", files)):
                print(summary(set_label + " decode", decode_errors(preds, fs)))
            every = [p / r["measured_ms"] - 1 for f in files
                     for r, p in zip(f.rows, preds[id(f)])]
            if len(every) > len(decode_errors(preds, files)):
                print(summary("  all with prompts", every))
        print("\n| model | set | batch | context | budget | measured ms | base ms (error) "
              "| fitted ms (error) |")
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for f in files:
            for r, p0, p1 in zip(f.rows, before[id(f)], after[id(f)]):
                budget = "prompt" if r["kind"] == "prompt" else f"{r['budget']:g}"
                m = r["measured_ms"]
                print(f"| {f.name} | {'held out' if f.held_out else 'fit'} | {r['batch']} | "
                      f"{r['context']} | {budget} | {m:.2f} | {p0:.2f} ({p0 / m - 1:+.1%}) | "
                      f"{p1:.2f} ({p1 / m - 1:+.1%}) |")
        if a.write:
            with open(a.write, "w", encoding="utf-8") as f:
                json.dump(ev.profile(values), f, indent=2)
                f.write("\n")
            print(f"\nwrote {a.write}", file=sys.stderr)


if __name__ == "__main__":
    main()
