#!/usr/bin/env python3
"""The serving measurement beside the Roofline prediction: a Markdown table, a JSON summary and an
SVG chart (concurrent sequences and decode tokens/s per KV budget, measured against predicted).

    python3 bench/serve/summarize.py --prediction OUT/prediction.json --out OUT OUT/loadgen-*.json

prediction.json is `ekva roofline serve --json`; each loadgen file is `ekva loadgen --json` run
against a server started for one budget (its kv_policy and kv_budget name the budget; full KV has
no kv_budget). Python's standard library only.
"""
import argparse
import html
import json
import os
import sys


def size(nbytes):
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} bytes"


def model_name(path):
    path = path.rstrip("/")
    if path.endswith(".json"):
        path = os.path.dirname(path)
    return os.path.basename(path) or path


def nice_step(top):
    """A round tick step that splits [0, top] into about four parts."""
    raw = top / 4
    magnitude = 10 ** len(str(int(raw))) / 10 if raw >= 1 else 1
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * magnitude:
            return m * magnitude
    return 10 * magnitude


def budget_of(run):
    if run.get("kv_policy") == "full" or run.get("kv_budget") is None:
        return 1.0
    return float(run["kv_budget"])


def rows_of(prediction, runs):
    points = {round(p["budget"], 9): p for p in prediction["points"]}
    rows = []
    for run in runs:
        b = budget_of(run)
        p = points.get(round(b, 9), {})
        s = run.get("server") or {}
        batch = s.get("peak_decode_batch", 0)
        steps = s.get("peak_batch_steps", 0)
        rows.append({
            "budget": b,
            "policy": run.get("kv_policy", ""),
            "requests": run["requests"],
            "completed": run["completed"],
            "failed": run["failed"],
            "kv_bytes": s.get("kv_bytes", 0),
            "sequences": s.get("peak_running", 0),
            "decode_batch": batch,
            "peak_batch_steps": steps,
            "step_ms": 1e3 * s["peak_batch_seconds"] / steps if steps else None,
            "forward_ms": 1e3 * s.get("peak_batch_forward_seconds", 0.0) / steps if steps else None,
            "evict_ms": 1e3 * s.get("peak_batch_evict_seconds", 0.0) / steps if steps else None,
            "tokens_per_s": s.get("peak_batch_tokens_per_s", 0.0),
            "decode_tokens_per_s_all": s.get("decode_tokens_per_s", 0.0),
            "output_tokens_per_s": run["output_tokens_per_s"],
            "ttft_p50_s": run["ttft_s"]["p50"],
            "itl_p50_s": run["itl_s"]["p50"],
            "seconds": run["seconds"],
            "predicted_sequences": p.get("sequences"),
            "predicted_step_ms": p.get("step_ms"),
            "predicted_tokens_per_s": p.get("tokens_per_s"),
            "predicted_kv_bytes_per_sequence": p.get("kv_bytes_per_sequence"),
            "predicted_bound": p.get("bound"),
            "predicted_step_ms_at_batch": (p["step_ms_by_batch"][batch - 1]
                                           if 0 < batch <= len(p.get("step_ms_by_batch", []))
                                           else None),
        })
    rows.sort(key=lambda r: -r["budget"])
    full = next((r for r in rows if r["budget"] >= 1.0), None)
    for r in rows:
        pred = r["predicted_tokens_per_s"]
        # Against the prediction at the predicted batch (concurrency and step together), and the
        # step time against the prediction at the batch measured (the step alone).
        r["error"] = (r["tokens_per_s"] / pred - 1) if pred else None
        at = r["predicted_step_ms_at_batch"]
        r["step_error"] = (r["step_ms"] / at - 1) if at and r["step_ms"] else None
        r["gain_over_full"] = (r["tokens_per_s"] / full["tokens_per_s"]
                               if full and full["tokens_per_s"] else None)
        r["predicted_gain_over_full"] = (
            pred / full["predicted_tokens_per_s"]
            if full and pred and full["predicted_tokens_per_s"] else None)
    return rows


def fmt(value, spec, missing="-"):
    return missing if value is None else format(value, spec)


def pct(value):
    return "-" if value is None else f"{100 * value:+.0f}%"


def table(prediction, rows):
    lines = [
        f"{model_name(prediction['model'])} on {prediction['hardware']} ({prediction['profile']} "
        f"profile): {size(prediction['kv_memory_bytes'])} of KV pages ({prediction['kv_dtype']}), "
        "prompts of "
        f"{prediction['prompt_tokens']} random token ids, {prediction['max_tokens']} tokens "
        "generated each.",
        "",
        "| budget | sequences (predicted) | decode batch | ms / step (predicted at this batch) | "
        "forward + eviction ms | error | decode tokens/s (predicted) | error | vs full (predicted) | output tokens/s end "
        "to end | TTFT p50 | inter-token p50 | requests |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {'full' if r['budget'] >= 1 else format(r['budget'], 'g')} "
            f"| {r['sequences']} ({fmt(r['predicted_sequences'], 'd')}) "
            f"| {r['decode_batch']} "
            f"| {fmt(r['step_ms'], '.1f')} ({fmt(r['predicted_step_ms_at_batch'], '.1f')}) "
            f"| {fmt(r['forward_ms'], '.1f')} + {fmt(r['evict_ms'], '.1f')} "
            f"| {pct(r['step_error'])} "
            f"| {r['tokens_per_s']:.0f} ({fmt(r['predicted_tokens_per_s'], '.0f')}) "
            f"| {pct(r['error'])} "
            f"| {fmt(r['gain_over_full'], '.2f')}x ({fmt(r['predicted_gain_over_full'], '.2f')}x) "
            f"| {r['output_tokens_per_s']:.0f} "
            f"| {r['ttft_p50_s']:.1f} s | {1e3 * r['itl_p50_s']:.0f} ms "
            f"| {r['completed']}/{r['requests']}{' (' + str(r['failed']) + ' failed)' if r['failed'] else ''} |")
    lines += [
        "",
        "sequences: the most requests the server held at once (ekva_running_sequences_peak); "
        "decode batch: the most it decoded in one step; ms / step: its decode steps at that batch "
        "(evictions included) beside the Roofline's step at the same batch; decode tokens/s: "
        "that batch over that step time, beside the prediction at the predicted batch (the "
        "sequences the memory holds); errors are measured over predicted, minus one.",
    ]
    return "\n".join(lines) + "\n"


def bar_panel(x0, y0, w, h, title, labels, measured, predicted, unit):
    """One grouped bar chart: measured (filled) and predicted (hollow) per budget."""
    out = [f'<text x="{x0 + w / 2}" y="{y0 - 12}" text-anchor="middle" font-size="14" '
           f'font-weight="bold">{html.escape(title)}</text>']
    step = nice_step(max([v for v in measured + predicted if v] + [1]) * 1.1)
    ticks = 1
    while step * ticks < max([v for v in measured + predicted if v] + [1]) * 1.1:
        ticks += 1
    top = step * ticks
    for i in range(ticks + 1):
        v = step * i
        y = y0 + h - h * i / ticks
        out.append(f'<line x1="{x0 - 4}" y1="{y:.1f}" x2="{x0 + w}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">'
                   f'{v:g}</text>')
    out.append(f'<line x1="{x0}" y1="{y0 + h}" x2="{x0 + w}" y2="{y0 + h}" stroke="#333"/>')
    out.append(f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y0 + h}" stroke="#333"/>')
    out.append(f'<text x="{x0 - 44}" y="{y0 + h / 2}" font-size="11" text-anchor="middle" '
               f'transform="rotate(-90 {x0 - 44} {y0 + h / 2})">{html.escape(unit)}</text>')
    slot = w / max(len(labels), 1)
    bar = slot * 0.32
    for i, label in enumerate(labels):
        cx = x0 + slot * (i + 0.5)
        for j, (value, style) in enumerate(
                [(measured[i], 'fill="#2b6cb0"'),
                 (predicted[i], 'fill="none" stroke="#c05621" stroke-width="2"')]):
            if value is None:
                continue
            bh = h * value / top
            x = cx - bar + j * bar
            out.append(f'<rect x="{x:.1f}" y="{y0 + h - bh:.1f}" width="{bar:.1f}" '
                       f'height="{bh:.1f}" {style}/>')
            out.append(f'<text x="{x + bar / 2:.1f}" y="{y0 + h - bh - 4:.1f}" font-size="10" '
                       f'text-anchor="middle">{value:.0f}</text>')
        out.append(f'<text x="{cx:.1f}" y="{y0 + h + 16}" font-size="12" '
                   f'text-anchor="middle">{html.escape(label)}</text>')
    out.append(f'<text x="{x0 + w / 2}" y="{y0 + h + 34}" font-size="11" '
               f'text-anchor="middle">KV budget</text>')
    return out


def svg(prediction, rows):
    labels = ["full" if r["budget"] >= 1 else f"{100 * r['budget']:g}%" for r in rows]
    width, height = 900, 380
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif">',
             f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<text x="{width / 2}" y="22" text-anchor="middle" font-size="15">'
             f'{html.escape(model_name(prediction["model"]))} on '
             f'{html.escape(prediction["hardware"])}: {size(prediction["kv_memory_bytes"])} of KV '
             f'pages, prompts of {prediction["prompt_tokens"]} tokens, '
             f'{prediction["max_tokens"]} generated</text>']
    parts += bar_panel(80, 70, 330, 230, "Concurrent sequences", labels,
                       [r["sequences"] for r in rows],
                       [r["predicted_sequences"] for r in rows], "sequences")
    parts += bar_panel(540, 70, 330, 230, "Decode throughput", labels,
                       [r["tokens_per_s"] for r in rows],
                       [r["predicted_tokens_per_s"] for r in rows], "tokens/s")
    parts += ['<rect x="330" y="352" width="14" height="10" fill="#2b6cb0"/>',
              '<text x="350" y="361" font-size="12">measured (ekva serve + loadgen)</text>',
              '<rect x="560" y="352" width="14" height="10" fill="none" stroke="#c05621" '
              'stroke-width="2"/>',
              '<text x="580" y="361" font-size="12">Roofline prediction</text>', '</svg>']
    return "\n".join(parts) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prediction", required=True, help="ekva roofline serve --json output")
    parser.add_argument("--out", required=True, help="directory for summary.md/json, serve.svg")
    parser.add_argument("runs", nargs="*", help="ekva loadgen --json outputs, one per budget")
    a = parser.parse_args()
    with open(a.prediction) as f:
        prediction = json.load(f)
    runs = []
    for path in a.runs:
        with open(path) as f:
            runs.append(json.load(f))
    rows = rows_of(prediction, runs)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write(table(prediction, rows))
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump({"prediction": prediction, "rows": rows}, f, indent=2)
    with open(os.path.join(a.out, "serve.svg"), "w") as f:
        f.write(svg(prediction, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
