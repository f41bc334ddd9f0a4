"""The calibration table from scripts/calibrate.sh's runs: python3 table.py OUT_DIR.

Per scenario and advice: predicted × (median over the repeats), measured × (median, min–max;
against the unchanged baseline re-run of the same repeat), error = predicted / median measured − 1
("in range" instead of MISS where most repeats gave a range and the median measured lies within
its median ends), and the verdict with the number of repeats that agree with the most common one.
"""

import json
import os
import re
import statistics
import sys

# advice, predicted images/s, predicted × (against the baseline re-run), measured images/s,
# measured × (against the same baseline).
ROW = re.compile(r"^(\S.*?)\s{2,}(-|[\d.]+(?:–[\d.]+)?)\s+(-|[\d.]+(?:–[\d.]+)?×)\s+(-|[\d.]+)\s+(-|[\d.]+×)(.*)$")
GOAL = 0.25


def verdict(summary):
    v = summary.get("verdict") or {}
    lim = v.get("limiter")
    if isinstance(lim, dict):
        lim = next(iter(lim))
    word = {
        "Io": "I/O",
        "Preprocess": "preprocess",
        "Contention": "contention",
        "Compute": "compute",
        "Overhead": "overhead",
        "Balanced": "balanced",
        "Transfer": "transfer",
    }.get(lim, str(lim))
    sev = {"High": "HIGH", "Moderate": "moderate", "Low": "low"}.get(v.get("severity"), "?")
    return f"{word}·{sev}" + (" (provisional)" if v.get("provisional") else "")


def steady(s):
    """The rate as pipeprof's check-advice measures it (diagnose::measured_now): the whole run
    less a one-off first compute, or after the last change of workers, that pipeline's."""
    sp = s.get("split") or {}
    if sp.get("from_step") is not None and sp.get("mean_step_ms"):
        return s["images"] / s["steps"] * 1000.0 / sp["mean_step_ms"]
    run_ms = s["images"] / s["images_per_s"] * 1000.0
    one_off = max(0.0, (sp.get("startup_compute_ms") or 0.0) - sp.get("compute_ms", 0.0))
    return s["images"] * 1000.0 / (run_ms - one_off if run_ms > one_off else run_ms)


def kind(label):
    """The advice without its number: --workers 8 and --workers 6 are the same advice."""
    return re.sub(r"\d+", "N", label)


def check_rows(text):
    """(label, predicted, measured images/s, note) of the check-advice table."""
    rows, on = [], False
    for line in text.splitlines():
        if line.startswith("advice ") and "predicted ×" in line:
            on = True
            continue
        if not on:
            continue
        m = ROW.match(line)
        if not m:
            if line.strip():
                on = False
            continue
        label, _, pred, meas, _, rest = m.groups()
        p = None if pred == "-" or "–" in pred else float(pred.rstrip("×"))
        x = None if meas == "-" else float(meas)
        rows.append((label.strip(), p, x, rest.strip()))
    return rows


def main(out):
    names = [n for n in sorted(os.listdir(out)) if n != "data" and os.path.isdir(os.path.join(out, n))]
    order = [
        "decode-1w",
        "throttled-reads",
        "slow-opens",
        "tiny-model",
        "compute-bound",
        "contention",
        "packed-cache",
    ]
    names.sort(key=lambda n: order.index(n) if n in order else len(order))
    table = []
    for name in names:
        reps = sorted(os.listdir(os.path.join(out, name)), key=int)
        verdicts, per_kind = [], {}
        for r in reps:
            d = os.path.join(out, name, r)
            try:
                main_s = json.load(open(os.path.join(d, "main.json")))
            except (OSError, ValueError):
                verdicts.append("failed")
                continue
            verdicts.append(verdict(main_s))
            rows = check_rows(open(os.path.join(d, "out.txt")).read())
            # The point prediction (the table shows a range where the model was off today).
            points = {}
            for a in main_s.get("verdict", {}).get("advice", []):
                c = a.get("command") or ""
                key = "pipeprof cache, then --data it" if c.startswith("pipeprof cache") else c
                if a["action"].startswith("copy the data set"):
                    key = "copy to a local temporary folder, then --data it"
                points[key] = (a.get("predicted_speedup"), (a.get("basis") or {}).get("range"), (a.get("basis") or {}).get("now"))
            base = next((x for (l, _, x, _) in rows if l.startswith("as run")), None)

            def on_base(g, now):
                # A gain over the main run's rate, read against the baseline re-run as the
                # measured × is (one base, as the check-advice table shows it).
                return g * now / base if g is not None and now and base else g
            for label, pred, x, note in rows:
                if label.startswith("as run"):
                    continue
                k = per_kind.setdefault(kind(label), {"labels": [], "pred": [], "meas": [], "fail": []})
                k["labels"].append(label)
                point, rng, now = points.get(label, (pred, None, None))
                point = on_base(point, now)
                if rng and now and base:
                    rng = [on_base(rng[0], now), on_base(rng[1], now)]
                if point is not None:
                    k["pred"].append(point)
                if rng:
                    k.setdefault("ranges", []).append(rng)
                if x is not None and base:
                    k["meas"].append(x / base)
                elif note:
                    k["fail"].append(note)
            # Freeing the cores: measured by the script, without the busy loops.
            quiet = os.path.join(d, "quiet.json")
            free = [a for a in main_s.get("verdict", {}).get("advice", []) if a["action"].startswith("stop or lower")]
            if free and os.path.exists(quiet) and base:
                k = per_kind.setdefault("free the cores", {"labels": [], "pred": [], "meas": [], "fail": []})
                k["labels"].append("free the cores (busy loops stopped)")
                if free[0].get("predicted_speedup"):
                    k["pred"].append(free[0]["predicted_speedup"])
                k["meas"].append(steady(json.load(open(quiet))) / base)
        top = max(set(verdicts), key=verdicts.count) if verdicts else "-"
        agree = f"{verdicts.count(top)}/{len(verdicts)}"
        if not per_kind:
            table.append((name, top, agree, "(no advice to check)", "-", "-", "-"))
        for k, v in per_kind.items():
            label = max(set(v["labels"]), key=v["labels"].count)
            if len(set(v["labels"])) > 1:
                label += f" ({len(v['labels'])}×: " + ", ".join(sorted(set(v["labels"]))) + ")"
            pred = statistics.median(v["pred"]) if v["pred"] else None
            meas = statistics.median(v["meas"]) if v["meas"] else None
            p = f"{pred:.2f}×" if pred else "-"
            rng = None
            if v.get("ranges"):
                # The range as its median ends, over the repeats that gave one.
                rng = (statistics.median(r[0] for r in v["ranges"]), statistics.median(r[1] for r in v["ranges"]))
                p += f" (range {rng[0]:.2f}–{rng[1]:.2f} in {len(v['ranges'])})"
            if v["meas"]:
                m = f"{meas:.2f}× ({min(v['meas']):.2f}–{max(v['meas']):.2f}, n={len(v['meas'])})"
            else:
                m = "failed: " + (v["fail"][0] if v["fail"] else "-")
            if pred and meas:
                e = pred / meas - 1
                # A range given in most repeats is met when the median measured falls inside it;
                # the point's error is shown either way.
                inside = rng and 2 * len(v["ranges"]) > len(v["pred"]) and rng[0] <= meas <= rng[1]
                err = f"{e * 100:+.0f}%" + ("" if abs(e) <= GOAL else " in range" if inside else " MISS")
            else:
                err = "-"
            table.append((name, top, agree, label, p, m, err))
    head = ("scenario", "verdict", "same", "advice", "predicted ×", "measured × (median, min–max)", "error")
    w = [max(len(str(r[i])) for r in table + [head]) for i in range(len(head))]
    fmt = "  ".join(f"{{:<{x}}}" for x in w)
    print(fmt.format(*head))
    for r in table:
        print(fmt.format(*r))


if __name__ == "__main__":
    main(sys.argv[1])
