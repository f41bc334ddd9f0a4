"""The corpus calibration table from scripts/calibrate-corpus.sh's runs: python3 corpus_table.py RUNS.

RUNS/<script>/<run>/ holds main.json (the run's --summary), out.txt (its output, with
check-advice's table), err.txt and rc. Per script and advice: predicted × (median over the runs,
on the same run's baseline re-run as the measured ×), measured × (median, min–max), error =
predicted / median measured − 1 (MISS outside ±25%, "in range" where most runs gave a range and
the median measured lies within its median ends), and the verdict with how many runs agree.
Advice the start-up hook cannot apply is listed with its prediction, "not re-run". A run that
failed is a row of its own and, after the table, the last lines of its errors: never a crash.
"""

import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from table import GOAL, check_rows, kind, verdict  # noqa: E402

LR_NOTE = " (learning rate as it was)"
TAIL = 6
WIDE = 72


def short(label):
    """The advice as the table shows it: code without its trailing comment, words cut at WIDE."""
    label = label.split("  # ")[0]
    return label if len(label) <= WIDE else label[: WIDE - 1] + "…"


def read_run(d):
    """(summary or None, out text, err text, exit code) of one run's folder."""

    def text(name):
        try:
            with open(os.path.join(d, name), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    try:
        rc = int(text("rc").strip() or "1")
    except ValueError:
        rc = 1
    try:
        with open(os.path.join(d, "main.json")) as f:
            summary = json.load(f)
    except (OSError, ValueError):
        summary = None
    return summary, text("out.txt"), text("err.txt"), rc


def advice_points(summary):
    """command (or action) → (predicted ×, range, the rate it was made on) of the run's advice."""
    out = {}
    for a in (summary.get("verdict") or {}).get("advice") or []:
        basis = a.get("basis") or {}
        out[a.get("command") or a.get("action", "?")] = (a.get("predicted_speedup"), basis.get("range"), basis.get("now"))
    return out


def add_run(per_kind, summary, out):
    """Adds one run's predictions and measurements to ``per_kind`` (advice kind → lists)."""
    points = advice_points(summary)
    rows = check_rows(out)
    base = next((x for (label, _, x, _) in rows if label.startswith("as run")), None)

    def on_base(g, now):
        # The gain over the main run's rate, read against the baseline re-run as measured × is.
        return g * now / base if g is not None and now and base else g

    seen = set()
    for label, pred, x, note in rows:
        if label.startswith("as run"):
            continue
        key = label[: -len(LR_NOTE)] if label.endswith(LR_NOTE) else label
        seen.add(key)
        k = per_kind.setdefault(kind(label), new_kind())
        k["labels"].append(label)
        point, rng, now = points.get(key, (pred, None, None))
        if now and base:
            point = on_base(point, now)
            rng = [on_base(rng[0], now), on_base(rng[1], now)] if rng else None
        if point is not None:
            k["pred"].append(point)
        if rng:
            k["ranges"].append(rng)
        if x is not None and base:
            k["meas"].append(x / base)
        else:
            k["fail"].append(note or "no measurement")
    for key, (point, _, _) in points.items():
        if key in seen:
            continue
        k = per_kind.setdefault(kind(key), new_kind())
        k["labels"].append(key)
        if point is not None:
            k["pred"].append(point)
        k["not_run"] += 1


def new_kind():
    return {"labels": [], "pred": [], "meas": [], "fail": [], "ranges": [], "not_run": 0}


def row_cells(v, runs):
    """(advice, predicted ×, measured ×, error, miss) of one advice kind over ``runs`` runs."""
    label = short(max(set(v["labels"]), key=v["labels"].count))
    if len(set(v["labels"])) > 1:
        label += f" ({len(v['labels'])}×: " + ", ".join(sorted(set(map(short, v["labels"])))) + ")"
    if len(v["labels"]) < runs:
        label += f" (given in {len(v['labels'])} of {runs} runs)"
    pred = statistics.median(v["pred"]) if v["pred"] else None
    meas = statistics.median(v["meas"]) if v["meas"] else None
    p = f"{pred:.2f}×" if pred else "-"
    rng = None
    if v["ranges"]:
        rng = (statistics.median(r[0] for r in v["ranges"]), statistics.median(r[1] for r in v["ranges"]))
        p += f" (range {rng[0]:.2f}–{rng[1]:.2f} in {len(v['ranges'])})"
    if v["meas"]:
        m = f"{meas:.2f}× ({min(v['meas']):.2f}–{max(v['meas']):.2f}, n={len(v['meas'])})"
    elif v["fail"]:
        m = "failed: " + v["fail"][0]
    else:
        m = "not re-run (the hook cannot apply it)" if v["not_run"] else "-"
    err, miss = "-", False
    if pred and meas:
        e = pred / meas - 1
        inside = rng and 2 * len(v["ranges"]) > len(v["pred"]) and rng[0] <= meas <= rng[1]
        miss = abs(e) > GOAL and not inside
        err = f"{e * 100:+.0f}%" + ("" if abs(e) <= GOAL else " in range" if inside else " MISS")
    return label, p, m, err, miss


def script_rows(name, folder):
    """The table rows of one script, its misses and its failed runs (run, rc, stderr tail)."""
    verdicts, per_kind, failures = [], {}, []
    for r in sorted(os.listdir(folder), key=lambda s: (len(s), s)):
        summary, out, err, rc = read_run(os.path.join(folder, r))
        if rc != 0 or summary is None:
            verdicts.append("failed")
            why = f"exit {rc}" if rc != 0 else "no summary"
            failures.append((name, r, why, err.strip().splitlines()[-TAIL:]))
            continue
        verdicts.append(verdict(summary))
        add_run(per_kind, summary, out)
    top = max(set(verdicts), key=verdicts.count) if verdicts else "-"
    agree = f"{verdicts.count(top)}/{len(verdicts)}"
    rows, misses = [], []
    if not per_kind:
        rows.append((name, top, agree, "(no advice)" if top != "failed" else "(every run failed)", "-", "-", "-"))
    ok = len(verdicts) - verdicts.count("failed")
    for v in per_kind.values():
        label, p, m, err, miss = row_cells(v, ok)
        rows.append((name, top, agree, label, p, m, err))
        if miss:
            misses.append(rows[-1])
    return rows, misses, failures


def render(rows):
    head = ("script", "verdict", "same", "advice", "predicted ×", "measured × (median, min–max)", "error")
    w = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    fmt = "  ".join(f"{{:<{x}}}" for x in w)
    return "\n".join(fmt.format(*r).rstrip() for r in [head] + rows)


def main(runs):
    table, misses, failures = [], [], []
    for name in sorted(n for n in os.listdir(runs) if os.path.isdir(os.path.join(runs, n))):
        rows, m, f = script_rows(name, os.path.join(runs, name))
        table += rows
        misses += m
        failures += f
    print(render(table))
    print()
    if misses:
        print(f"outside ±{GOAL * 100:.0f}% of the median measured:")
        print(render(misses))
    else:
        print(f"every prediction with a measurement is within ±{GOAL * 100:.0f}% of the median measured")
    for name, r, why, tail in failures:
        print(f"\n{name} run {r} failed ({why}); its errors end:")
        print("\n".join("    " + line for line in tail) or "    (nothing)")


if __name__ == "__main__":
    main(sys.argv[1])
