#!/usr/bin/env python3
"""Markdown tables of issue 21's grid, from the output of tools/eval_grid.sh.

Reads ROOT/MODE/TASK-BUDGET/results.json (one `ekva eval` run each; a directory without one, a run
cut by a time limit, is reported as missing) and prints, per ROOT (one model):

- a check line: seed, context, samples per task, and whether the full-KV per-sample outcomes of a
  (mode, task) are the same at every budget (they are the same instances);
- A, scores: full KV and every policy per mode x task x budget (accuracy, or perplexity for ppl),
  the best expert-blind policy in bold;
- B, paired: `ekva` against the best expert-blind policy (the one `ekva eval` recorded), and `ekva`
  against the controls rarity-tokens and ekva-random-groups, as discordant counts with the exact
  two-sided binomial p (McNemar on answers, the sign test on per-window NLL per token for ppl), as
  `ekva eval` computes them (src/eval/metrics.cpp);
- C, iso-quality KV: the least budget from which on `ekva`, and the best expert-blind policy, keep
  95% of full-KV accuracy (ppl: perplexity <= 1.01 x full) at every larger budget, and the KV saved;
- whether issue 21's criterion holds per mode x task.

Usage: tools/grid_table.py ROOT [ROOT2 ...] [--model-name NAME ...]
  (the i-th --model-name labels the i-th ROOT; default: the model of its results.json)
"""
import argparse
import glob
import json
import os
import re

from cap_table import exact_binomial_p

MODES = ["aware", "agnostic"]
TASKS = ["passkey", "multikey-needle", "kv-retrieval", "ppl"]
# src/eval/report.h expert_blind_policies().
BLIND = ["streaming", "h2o", "snapkv", "pyramidkv", "adakv", "keydiff", "rarity-tokens"]
CONTROLS = ["rarity-tokens", "ekva-random-groups"]
# Tasks judged by "no worse than Ada-KV at every budget" instead of the iso-quality saving.
NO_WORSE_TASKS = {"kv-retrieval", "ppl"}
SHARE, PPL_SLACK, SAVING, ALPHA, POINT = 0.95, 1.01, 0.20, 0.01, 0.01
PPL_NOISE = 0.005


def per_sample(row):
    if row["task"] == "ppl":
        return [nll / max(tok, 1) for nll, tok in zip(row["nll"], row["tokens"])], False
    return [float(c) for c in row["correct"]], True


def paired(row, base):
    """(row better, base better, p) over the samples where they disagree."""
    a, higher = per_sample(row)
    b = per_sample(base)[0]
    win = sum(1 for x, y in zip(a, b) if x != y and (x > y) == higher)
    lose = sum(1 for x, y in zip(a, b) if x != y and (x > y) != higher)
    return win, lose, exact_binomial_p(win, lose)


def better(row, base):
    return row["score"] < base["score"] if row["task"] == "ppl" else row["score"] > base["score"]


def best_blind(rows):
    """ekva eval's rule: the best score, the first in the order of the results on a tie."""
    best = None
    for p in rows:
        if p in BLIND and (best is None or better(rows[p], rows[best])):
            best = p
    return best


def keeps(row, full):
    if row["task"] == "ppl":
        return row["score"] <= PPL_SLACK * full["score"]
    return row["score"] >= SHARE * full["score"]


def fmt(row):
    return f"{row['score']:.2f}" if row["task"] == "ppl" else f"{row['score']:.3f}"


def rank(value, known):
    """Sort key: the known names in their order, then the others by name."""
    return (known.index(value) if value in known else len(known), value)


def load(root):
    """{(mode, task, budget): {"rows": {policy: row}, "best": best expert-blind policy}, or None
    where the run left no results.json}, and the seeds, contexts and models seen."""
    runs, meta = {}, {}
    for d in glob.glob(os.path.join(root, "*", "*", "")):
        mode, cell = os.path.relpath(d, root).split(os.sep)[:2]
        m = re.fullmatch(r"(.+)-([0-9.]+)", cell)
        if not m:
            continue
        key = (mode, m.group(1), float(m.group(2)))
        path = os.path.join(d, "results.json")
        if not os.path.exists(path):
            runs[key] = None
            continue
        j = json.load(open(path))
        rows = {r["policy"]: r for r in j["results"] if r["task"] == key[1]}
        # The best expert-blind policy as `ekva eval` recorded it; recomputed only if it has none.
        recorded = [p["baseline"] for p in j["paired"] if p["task"] == key[1]]
        runs[key] = {"rows": rows, "best": recorded[0] if recorded else best_blind(rows)}
        for field in ("seed", "context", "model"):
            meta.setdefault(field, set()).add(j[field])
    return runs, meta


def check_line(runs, meta):
    samples, full, diffs, ppl_noise = {}, {}, [], [0.0]
    for (mode, task, budget), run in sorted(runs.items()):
        if run is None or "full" not in run["rows"]:
            continue
        f = run["rows"]["full"]
        samples.setdefault(task, set()).add(f["samples"])
        vals = per_sample(f)[0]
        first = full.setdefault((mode, task), (budget, vals))
        if len(first[1]) != len(vals):
            diffs.append(f"{mode} {task} at {budget:g} vs {first[0]:g}: "
                         f"{len(vals)} samples against {len(first[1])}")
        elif task == "ppl":
            # The GPU engine's sums are not bit-reproducible between processes (column splits
            # added with atomics), so perplexities are compared to a relative tolerance.
            worst = max((abs(x - y) / abs(y) for x, y in zip(first[1], vals)), default=0.0)
            ppl_noise[0] = max(ppl_noise[0], worst)
            if worst > PPL_NOISE:
                diffs.append(f"{mode} {task} at {budget:g} vs {first[0]:g}: NLL per token "
                             f"differs by up to {worst:.2%}")
        elif first[1] != vals:
            n = sum(1 for x, y in zip(first[1], vals) if x != y)
            diffs.append(f"{mode} {task} at {budget:g} vs {first[0]:g}: {n} of the samples differ")
    values = lambda s: "/".join(str(v) for v in sorted(s))
    line = (f"Checks: seed {values(meta['seed'])}, context {values(meta['context'])}, "
            "samples " + ", ".join(f"{t} {values(samples[t])}"
                                   for t in sorted(samples, key=lambda t: rank(t, TASKS))) + "; ")
    line += ("full-KV per-sample outcomes the same at every budget for every mode and task "
             f"(ppl: NLL per token within {ppl_noise[0]:.2%} of each other)."
             if not diffs else "full-KV per-sample outcomes differ: " + "; ".join(diffs) + ".")
    missing = [f"{m}/{t}-{b:g}" for (m, t, b), r in sorted(runs.items()) if r is None]
    if missing:
        line += " Missing (no results.json, excluded below): " + ", ".join(missing) + "."
    return line


def iso(runs, mode, task, budgets, policy):
    """(budget, row) of the least budget from which on `policy` keeps the target at every larger
    budget run (the rule of `ekva eval`'s iso-quality table), or None."""
    found = None
    for b in reversed(budgets):
        rows = runs[(mode, task, b)]["rows"]
        if policy not in rows or "full" not in rows or not keeps(rows[policy], rows["full"]):
            break
        found = (b, rows[policy])
    return found


def table(head, align, rows):
    print("| " + " | ".join(head) + " |")
    print("| " + " | ".join(align) + " |")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print()


def report(root, name):
    runs, meta = load(root)
    if not meta:
        print(f"\nNo MODE/TASK-BUDGET/results.json under {root} ({len(runs)} runs without one).\n")
        return
    name = name or "/".join(os.path.basename(m.rstrip("/")) for m in sorted(meta["model"]))
    print(f"\n### `{name}` ({root})\n")
    print(check_line(runs, meta) + "\n")
    cells = sorted(runs, key=lambda k: (rank(k[0], MODES), rank(k[1], TASKS), k[2]))
    seen = []
    for k in cells:
        for p in (runs[k]["rows"] if runs[k] else []):
            if p != "full" and p not in seen:
                seen.append(p)
    # ekva, then the other policies as they appear, then the controls.
    policies = sorted(seen, key=lambda p: 0 if p == "ekva" else 2 if p in CONTROLS else 1)
    controls = [p for p in policies if p in CONTROLS]

    rows = []
    for k in cells:
        line = [k[0], k[1], f"{k[2] * 100:g}%"]
        if runs[k] is None:
            rows.append(line + ["missing"] + [""] * len(policies))
            continue
        r, best = runs[k]["rows"], runs[k]["best"]
        line.append(fmt(r["full"]) if "full" in r else "–")
        for p in policies:
            cell = fmt(r[p]) if p in r else "–"
            line.append(f"**{cell}**" if p == best else cell)
        rows.append(line)
    print("A. Scores: accuracy (ppl: perplexity); the best expert-blind policy in bold.\n")
    table(["mode", "task", "budget", "full KV"] + policies,
          ["---"] * 2 + ["---:"] * (2 + len(policies)), rows)

    rows, wins = [], {}
    for k in cells:
        line = [k[0], k[1], f"{k[2] * 100:g}%"]
        if runs[k] is None:
            rows.append(line + ["missing"] + [""] * (1 + len(controls)))
            continue
        r, best = runs[k]["rows"], runs[k]["best"]
        if "ekva" not in r or best is None:
            rows.append(line + [best or "–"] + ["–"] * (1 + len(controls)))
            continue
        w, l, p = paired(r["ekva"], r[best])
        wins[k] = w > l and p < ALPHA
        line += [f"{best} ({fmt(r[best])})", f"{w} : {l}, p = {p:.2g}"]
        for c in controls:
            line.append("{} : {}, p = {:.2g}".format(*paired(r["ekva"], r[c])) if c in r else "–")
        rows.append(line)
    print("B. Paired, on the samples where the two disagree (exact two-sided p): `ekva` against "
          "the best expert-blind policy (ekva won : lost), and against each control (ekva better : "
          "control better).\n")
    table(["mode", "task", "budget", "best expert-blind", "ekva vs it"] +
          [f"ekva vs {c}" for c in controls],
          ["---"] * 2 + ["---:", "---"] + ["---:"] * (1 + len(controls)), rows)

    rows, verdicts = [], []
    for mode, task in dict.fromkeys((k[0], k[1]) for k in cells):
        budgets = sorted(b for m, t, b in runs if (m, t) == (mode, task) and runs[(m, t, b)])
        if not budgets:
            continue
        e = iso(runs, mode, task, budgets, "ekva")
        blind = [(p, x) for p in BLIND if (x := iso(runs, mode, task, budgets, p))]
        bp, bx = min(blind, key=lambda px: px[1][1]["kv_fraction"]) if blind else (None, None)
        at = lambda x: f"{x[0] * 100:g}% (kv {x[1]['kv_fraction']:.3f})" if x else "none reached"
        saving, top = None, runs[(mode, task, budgets[-1])]["rows"]
        if e and bx:
            saving = 1 - e[1]["kv_fraction"] / bx[1]["kv_fraction"]
            shown = f"{saving * 100:.0f}%"
        elif e and any(p in top for p in BLIND):
            # No expert-blind policy reaches it: each needs more than it kept at the top budget.
            most = min(top[p]["kv_fraction"] for p in BLIND if p in top)
            saving = max(0.0, 1 - e[1]["kv_fraction"] / most)
            shown = f"> {saving * 100:.0f}%"
        else:
            shown = "none reached"
        rows.append([mode, task, at(e), f"{bp}, {at(bx)}" if bx else "none reached", shown])

        if task in NO_WORSE_TASKS:
            gaps = []
            for b in budgets:
                r = runs[(mode, task, b)]["rows"]
                if "ekva" not in r or "adakv" not in r:
                    gaps.append(f"no ekva/adakv at {b * 100:g}%")
                elif task == "ppl" and r["ekva"]["score"] > PPL_SLACK * r["adakv"]["score"]:
                    gaps.append(f"{(r['ekva']['score'] / r['adakv']['score'] - 1) * 100:+.2f}% ppl "
                                f"at {b * 100:g}%")
                elif task != "ppl" and r["ekva"]["score"] < r["adakv"]["score"] - POINT:
                    gaps.append(f"{(r['ekva']['score'] - r['adakv']['score']) * 100:+.1f} points "
                                f"at {b * 100:g}%")
            limit = "1% perplexity" if task == "ppl" else "one accuracy point"
            verdicts.append(f"- {mode} {task}: " + (f"fails: {'; '.join(gaps)} against Ada-KV"
                                                    if gaps else "holds") +
                            f" (allowed: no worse than Ada-KV by {limit} at every budget run)")
        else:
            won = [f"{b * 100:g}%" for b in budgets if wins.get((mode, task, b))]
            ok = saving is not None and saving >= SAVING and bool(won)
            verdicts.append(f"- {mode} {task}: " + ("holds" if ok else "fails") +
                            f" (KV saving at iso-quality {shown}, needs >= {SAVING * 100:.0f}%; "
                            f"beats the best expert-blind at p < {ALPHA:g}: " +
                            (", ".join(won) if won else "at no budget") + ")")
    print(f"C. Iso-quality KV: the least budget from which on a policy keeps >= {SHARE * 100:.0f}% "
          f"of full-KV accuracy (ppl: perplexity <= {PPL_SLACK:g} x full) at every larger budget "
          "run, as `ekva eval` defines it; the best expert-blind is the expert-blind policy that "
          "reaches it with the least KV. KV is `kv_fraction` from results.json (KV bytes kept / "
          "full, the policy's own at that budget); KV saving = 1 - ekva kv / expert-blind kv.\n")
    table(["mode", "task", "ekva", "best expert-blind", "KV saving"],
          ["---"] * 2 + ["---:"] * 3, rows)
    print(f"Issue 21's criterion: ekva keeps >= {SHARE * 100:.0f}% of full quality with >= "
          f"{SAVING * 100:.0f}% less KV than the best expert-blind and wins a paired test at p < "
          f"{ALPHA:g} at some budget; for {' and '.join(sorted(NO_WORSE_TASKS))}: no worse than "
          "Ada-KV by more than one accuracy point / 1% perplexity at every budget.\n")
    print("\n".join(verdicts))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("roots", nargs="+", metavar="ROOT")
    ap.add_argument("--model-name", action="append", default=[],
                    help="label of the i-th ROOT (repeat for several)")
    args = ap.parse_args()
    for i, root in enumerate(args.roots):
        report(root, args.model_name[i] if i < len(args.model_name) else None)


if __name__ == "__main__":
    main()
