#!/usr/bin/env python3
"""Fits the routed experts' per-layer latency of a hardware profile to `ekva bench` decode rows.

Each row's prediction is the one `ekva bench` recorded with the profile as it was; a latency L
instead of the profile's adds (L - old) per MoE layer (one routed-experts operator per layer). The
fit picks L (0-60 us, 1 us steps) with the smallest median |error| over the fitted models' rows and
reports the held-out models' rows beside them.

  tools/fit_expert_latency.py --ekva build/src/cli/ekva --hw PROFILE --bench-dir DIR \
      --fit mixtral-8x7b,qwen3-30b-a3b --held-out olmoe-1b-7b

PROFILE must be the hardware profile the rows were predicted with (a name or a JSON file).

DIR holds bench-MODEL.json (ekva bench --json) for each model; the models' configs are read from
tests/fixtures/configs/MODEL/config.json.
"""
import argparse
import json
import statistics
import subprocess


def routed_rows(ekva, hw, model, batch, context):
    out = subprocess.check_output([
        ekva, "roofline", "--model", f"tests/fixtures/configs/{model}/config.json", "--hw", hw,
        "--batch", str(batch), "--context", str(context), "--json"])
    return [o for o in json.loads(out)["operators"] if o["operator"] == "routed_experts"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ekva", required=True)
    ap.add_argument("--hw", required=True, help="the profile the bench rows were predicted with")
    ap.add_argument("--bench-dir", required=True)
    ap.add_argument("--fit", required=True, help="comma-separated models whose rows choose L")
    ap.add_argument("--held-out", default="", help="comma-separated models only checked")
    a = ap.parse_args()
    fit_models = a.fit.split(",")
    held_models = [m for m in a.held_out.split(",") if m]
    rows = []  # (model, batch, budget, measured ms, recorded prediction ms, [(rows, latency s)])
    for model in fit_models + held_models:
        path = f"{a.bench_dir}/bench-{model}.json"
        try:
            bench = json.load(open(path))
        except (OSError, json.JSONDecodeError) as e:
            raise SystemExit(f"fit_expert_latency: cannot read {path}: {e}")
        if not bench.get("decode"):
            raise SystemExit(f"fit_expert_latency: {path} has no decode rows (ekva bench --json)")
        cache = {}
        for r in bench["decode"]:
            key = (r["batch"], r["context"])
            if key not in cache:
                cache[key] = [(o["rows"], o["latency_s"])
                              for o in routed_rows(a.ekva, a.hw, model, *key)]
            rows.append((model, r["batch"], r["budget"], r["step_ms"], r["predicted_ms"],
                         cache[key]))

    def predict(row, latency_s):
        return row[4] + 1e3 * sum(n * (latency_s - old) for n, old in row[5])

    def errors(latency_s, models):
        return [predict(r, latency_s) / r[3] - 1 for r in rows if r[0] in models]

    best = min((statistics.median(abs(e) for e in errors(us * 1e-6, fit_models)), us)
               for us in range(0, 61))
    latency_s = best[1] * 1e-6
    print(f"routed_experts latency {best[1]} us")
    for name, models in (("fitted", fit_models), ("held out", held_models),
                         ("all", fit_models + held_models)):
        if not models:
            continue
        e = errors(latency_s, models)
        print(f"{name}: median |error| {statistics.median(abs(x) for x in e):.1%}, "
              f"largest {max(e, key=abs):+.1%} over {len(e)} rows")
    for r in rows:
        p = predict(r, latency_s)
        print(f"{r[0]:16s} batch {r[1]:3d} budget {r[2]:4g}  measured {r[3]:7.2f} ms  "
              f"predicted {p:7.2f} ms ({p / r[3] - 1:+.0%})")


if __name__ == "__main__":
    main()
