"""The driver of scripts/gpu-truth.sh (read its header first): every case, one results file.

Each case runs the user's program plain (ground truth: the program's own images/s) and under
`pipeprof run --once` (pipeprof's images/s and verdict), or a piece of pipeprof's own CUDA loop,
each under its own time limit inside one budget. Rows are appended to the results file as each
case ends, so a run cut short still leaves what it measured. The results file is TSV: `#` lines
are the header and the human summary, then one line of COLUMNS and one row per case.
Standard library only: it runs under whichever python3 the GPU machine has.
"""

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "python" / "examples"
COLUMNS = ("case", "plain_ips", "pipeprof_ips", "verdict", "status", "detail")
RESULTS = "gpu-truth.tsv"
LOGS = "gpu-truth-logs"
# The smallest time limit a case is started with; with less left in the budget it is skipped.
MIN_CASE_S = 15
# --cpu-only runs on any CI machine, however loaded: each run's limit is then this many times
# the GPU machine's.
CPU_LIMIT_SCALE = 5
# The budget of the re-run the summary's last line offers: what the device time leaves after a
# machine's start and one full run (scripts/gpu-truth.sh's header).
RERUN_BUDGET_S = 200
RATE = re.compile(r"([0-9]+(?:\.[0-9]+)?) images/s")
# Where pipeprof's report starts in a run's output, and the lines pipeprof prints before it.
REPORT_MARK = "── pipeprof report"
OWN_LINES = ("pipeprof:", "check-advice:")
OWN_SKIP = "needs a GPU: pipeprof's own CUDA loop (scripts/gpu-check.sh --cpu-only runs it on the CPU)"

# Per mode: the generated data (name, demo-data arguments) and each case's size. The GPU
# mode's folders are gpu-check.sh's own (same names, arguments and seeds), so it reuses them.
SCALES = {
    "gpu": {
        "photos": ("photos", "--classes 4 --per-class 120 --size 1024x768 --format jpeg --seed 3"),
        "shapes": ("shapes150", "--classes 4 --per-class 300 --size 150x150 --format jpeg --seed 4"),
        "mlp": "--samples 8192 --epochs 2",
        "cnn": "--steps 40 --epochs 100 --batch-size 32 --size 64",
        "advice_steps": "15",
        "mlp_advice_steps": "100",
        "keras_mlp": "--steps 300",
        "keras_cnn": "--steps 30 --size 64",
        "step": {"width": 2048, "batch": 256, "steps": {2: 400, 40: 40}, "pairs": {2: 3, 40: 2}},
    },
    "cpu": {
        "photos": ("photos", "--classes 4 --per-class 8 --size 320x240 --format jpeg --seed 3"),
        "shapes": ("shapes", "--classes 4 --per-class 8 --size 64x64 --format jpeg --seed 4"),
        "mlp": "--samples 1024 --epochs 1",
        "cnn": "--steps 6 --epochs 100 --batch-size 8 --size 32",
        "advice_steps": "3",
        "mlp_advice_steps": "10",
        "keras_mlp": "--steps 20 --images 1024",
        "keras_cnn": "--steps 4 --batch-size 8 --size 32",
        "step": {"width": 256, "batch": 64, "steps": {2: 30, 40: 5}, "pairs": {2: 1, 40: 1}},
    },
}


class Usage(Exception):
    """A wrong argument or file: the message names it and why; exit 2."""


@dataclass
class Row:
    """One case's line of the results file."""

    case: str
    status: str
    plain_ips: float = None
    pipeprof_ips: float = None
    verdict: str = ""
    detail: dict = field(default_factory=dict)

    def cells(self):
        def num(x):
            return "-" if x is None else f"{x:.1f}"

        # "; " parts the detail's key=value pairs (read_details): a value keeps none of its own.
        detail = "; ".join(f"{k}={str(v).replace(';', ',')}" for k, v in self.detail.items())
        cells = [self.case, num(self.plain_ips), num(self.pipeprof_ips), self.verdict or "-", self.status, detail or "-"]
        return [clean(c) for c in cells]


def clean(text):
    """One TSV cell: no tabs, no line breaks."""
    return re.sub(r"[\t\r\n]+", " ", str(text)).strip() or "-"


def read_results(path):
    """The results file back: (its `#` lines, its rows as dicts keyed by COLUMNS)."""
    comments, rows, columns = [], [], None
    for line in Path(path).read_text().splitlines():
        if line.startswith("#"):
            comments.append(line)
        elif columns is None:
            columns = tuple(line.split("\t"))
            if columns != COLUMNS:
                raise ValueError(f"{path}: columns {columns}, expected {COLUMNS}")
        elif line:
            cells = line.split("\t")
            if len(cells) != len(COLUMNS):
                raise ValueError(f"{path}: {len(cells)} cells in {line!r}, expected {len(COLUMNS)}")
            rows.append(dict(zip(COLUMNS, cells)))
    if columns is None:
        raise ValueError(f"{path}: no line of column names")
    return comments, rows


def read_details(row):
    """A row's detail cell back as a dict (key=value; ...; "-" when empty)."""
    cell = row["detail"]
    return {} if cell == "-" else dict(part.split("=", 1) for part in cell.split("; "))


class Parser(argparse.ArgumentParser):
    """argparse, its errors in this script's words and exit code."""

    def error(self, message):
        raise Usage(message.replace("unrecognized arguments", "unknown option") + " (see --help)")


def parse_args(argv):
    p = Parser(prog="scripts/gpu-truth.sh", description="See the header of scripts/gpu-truth.sh.")
    p.add_argument("binary", help="pipeprof built with CUDA (gpu-bin/pipeprof, or carried as pipeprof.xz)")
    p.add_argument("wheel", help="the pipeprof wheel (target/wheels/pipeprof-*.whl)")
    p.add_argument("--cpu-only", action="store_true", help="every case on the CPU, tiny data; GPU cases skipped")
    p.add_argument("--out", help="folder for the results (default $OUT, else ./gpu-truth-out)")
    p.add_argument("--python", default="python3", help="the interpreter with torch (and JAX) that runs the cases")
    p.add_argument("--extra-wheels", help="a folder of wheels (keras, namex, optree…), each installed if missing")
    p.add_argument("--bench", help="a cuda_step bench binary built here (cargo bench --no-run --features cuda)")
    p.add_argument("--budget", type=int, default=420, help="seconds for everything (default 420)")
    p.add_argument("--only", help="comma-separated case names: run these, skip the others")
    p.add_argument("--data-dir", help="generated images (default: a folder under $TMPDIR)")
    args = p.parse_args(argv)
    if args.budget <= 0:
        raise Usage(f"--budget {args.budget}: give a number of seconds above 0")
    if args.only:
        unknown = sorted(set(args.only.split(",")) - {c[0] for c in CASES})
        if unknown:
            raise Usage(f"--only: unknown case(s) {', '.join(unknown)}; the cases: {', '.join(c[0] for c in CASES)}")
    return args


def check_file(what, path, executable=False):
    """The path, absolute, or a Usage error naming it and why."""
    p = Path(path)
    if not p.exists():
        raise Usage(f"{what} '{path}': no such file")
    if p.is_dir():
        raise Usage(f"{what} '{path}': is a folder, not a file")
    if not os.access(p, os.R_OK):
        raise Usage(f"{what} '{path}': not readable (permission denied)")
    if executable and p.suffix != ".xz" and not os.access(p, os.X_OK):
        raise Usage(f"{what} '{path}': not executable (chmod +x it, or carry it compressed as .xz)")
    return p.resolve()


def check_wheel(path):
    p = check_file("wheel", path)
    if not (p.name.startswith("pipeprof-") and p.name.endswith(".whl")):
        raise Usage(f"wheel '{path}': not a pipeprof wheel (expected target/wheels/pipeprof-*.whl)")
    try:
        with zipfile.ZipFile(p) as z:
            names = z.namelist()
    except (zipfile.BadZipFile, OSError) as e:
        raise Usage(f"wheel '{path}': not a wheel ({e})") from None
    if not any(n.endswith("/scripts/pipeprof") for n in names):
        raise Usage(f"wheel '{path}': has no pipeprof command in it (build it with scripts/build-wheel.sh)")
    return p


@dataclass
class Proc:
    """What one child process did."""

    rc: int
    timed_out: bool
    wall: float
    text: str
    limit: float

    def failure(self, what, log):
        """Why this run failed, in a row's words, or None."""
        if self.timed_out:
            return f"{what} timed out after {self.limit:.0f}s (see {log})"
        if self.rc != 0:
            return f"{what} exited {self.rc} (see {log})"
        return None


class Ctx:
    """One gpu-truth run: its paths, environment, budget and results file."""

    def __init__(self, args):
        self.args, self.cpu_only = args, args.cpu_only
        self.scale = SCALES["cpu" if args.cpu_only else "gpu"]
        self.device = "cpu" if args.cpu_only else "cuda"
        self.start, self.budget = time.monotonic(), args.budget
        self.only = set(args.only.split(",")) if args.only else None
        found = shutil.which(args.python)
        if not found:
            raise Usage(f"--python '{args.python}': not found on PATH, or not executable")
        # Absolute (the cases run in the work folder) but not resolved: a venv's python is a link.
        self.python = os.path.abspath(found)
        self.binary = check_file("binary", args.binary, executable=True)
        self.wheel = check_wheel(args.wheel)
        self.bench = check_file("--bench", args.bench, executable=True) if args.bench else None
        self.extra = Path(args.extra_wheels) if args.extra_wheels else None
        if self.extra and not self.extra.is_dir():
            raise Usage(f"--extra-wheels '{args.extra_wheels}': no such folder")
        self.out = Path(args.out or os.environ.get("OUT") or "gpu-truth-out").resolve()
        self.work = Path(tempfile.mkdtemp(prefix="pipeprof-gpu-truth-"))
        # Logs stay out of OUT (a device call brings back 8 files at most): they travel as one
        # tar, rewritten after each case so that a run cut short still brings them.
        self.logs = self.work / LOGS
        mode = "cpu" if args.cpu_only else "gpu"
        self.data = Path(args.data_dir or Path(tempfile.gettempdir()) / f"pipeprof-gpu-truth-data-{mode}").resolve()
        self.env = dict(os.environ)
        self.plain, self.notes, self.gpu_check, self.rows = {}, [], None, []

    def left(self):
        return self.budget - (time.monotonic() - self.start)

    def run(self, name, cmd, limit, env=None, stdin_text=None):
        """Runs cmd in its own process group, output to logs/NAME.log, killed past its limit (the
        GPU machine's, set to keep one stuck run from taking the budget; with --cpu-only, where
        the budget is the only clock that matters, only a hang guard)."""
        limit = max(1.0, min(limit * (CPU_LIMIT_SCALE if self.cpu_only else 1), self.left()))
        log = self.logs / f"{name}.log"
        full_env = dict(self.env, **(env or {}))
        t0 = time.monotonic()
        with open(log, "w") as f:
            f.write("$ " + " ".join(str(c) for c in cmd) + "\n")
            f.flush()
            stdin = subprocess.PIPE if stdin_text is not None else subprocess.DEVNULL
            p = subprocess.Popen([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT, stdin=stdin, env=full_env,
                                 cwd=self.work, start_new_session=True, text=True)
            timed_out = False
            try:
                p.communicate(stdin_text, timeout=limit)
            except subprocess.TimeoutExpired:
                timed_out = True
                stop_group(p)
        return Proc(p.returncode, timed_out, time.monotonic() - t0, log.read_text(errors="replace"), limit)

    def rel(self, name):
        return f"{LOGS}/{name}.log"


def stop_group(p):
    """SIGTERM to the child's own process group (its workers too), SIGKILL 10 s later."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass
        try:
            p.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def program_rate(text):
    """The last "N images/s" the program printed, or None: pipeprof's own lines (its report, which
    names rates of its own, and its "pipeprof:" / "check-advice:" lines) are not the program's."""
    text = text.split(REPORT_MARK, 1)[0]
    lines = [line for line in text.splitlines() if not line.startswith(OWN_LINES)]
    found = RATE.findall("\n".join(lines))
    return float(found[-1]) if found else None


def steady_rate(summary):
    """pipeprof's training rate, as its report shows it: the verdict's `now` (the one-off first
    step and validation left out), else the summary's whole-run images/s."""
    now = ((summary or {}).get("verdict") or {}).get("now") or {}
    return now.get("images_per_s") or (summary or {}).get("images_per_s")


def load_summary(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def name_of(v):
    """serde's enum encodings: "Io" or {"NotEnoughData": {...}}."""
    return next(iter(v), "?") if isinstance(v, dict) else str(v)


def verdict_of(summary):
    """(pipeprof's verdict line, detail fields) from a summary file's contents."""
    v = (summary or {}).get("verdict") or {}
    flags = [name_of(f) for f in v.get("flags", [])]
    detail = {"limiter": name_of(v.get("limiter", "-"))}
    if flags:
        detail["flags"] = ",".join(flags)
    return v.get("headline") or "", detail


def pipeprof_run(ctx, name, cmd, limit, env=None, extra=()):
    """`pipeprof run --once` over cmd: (Proc, summary or None)."""
    summary = ctx.logs / f"{name}.summary.json"
    wrapped = [ctx.pipeprof, "run", "--once", "--summary", summary, *extra, "--", *cmd]
    return ctx.run(name, wrapped, limit, env), load_summary(summary)


def pair(ctx, case, cmd, limit, env=None):
    """The program plain, then under `pipeprof run --once`: one user case's row."""
    plain = ctx.run(f"{case}.plain", cmd, limit, env)
    pp, summary = pipeprof_run(ctx, f"{case}.pipeprof", cmd, limit, env)
    plain_ips, under = program_rate(plain.text), program_rate(pp.text)
    pp_ips = steady_rate(summary)
    verdict, detail = verdict_of(summary)
    detail["program_ips_under_pipeprof"] = "-" if under is None else f"{under:.1f}"
    whole = (summary or {}).get("images_per_s")
    detail["pipeprof_whole_run_ips"] = "-" if whole is None else f"{whole:.1f}"
    detail["wall_s"] = f"{plain.wall:.1f}/{pp.wall:.1f}"
    why = plain.failure("the plain run", ctx.rel(f"{case}.plain")) or pp.failure(
        "the run under pipeprof", ctx.rel(f"{case}.pipeprof"))
    if not why and plain_ips is None:
        why = f"the plain run printed no images/s (see {ctx.rel(case + '.plain')})"
    if not why and not pp_ips:
        why = f"pipeprof's summary has no images/s (see {ctx.rel(case + '.pipeprof')})"
    if plain_ips is not None:
        ctx.plain[case] = plain_ips
    return Row(case, f"failed: {why}" if why else "ok", plain_ips, pp_ips, verdict, detail)


def py(ctx, script, *args):
    return [ctx.python, EXAMPLES / script, *args]


def case_mlp(batch, device):
    def run(ctx):
        cmd = py(ctx, "mlp_in_memory.py", "--batch-size", batch, "--device", device, *ctx.scale["mlp"].split())
        return pair(ctx, f"mlp-b{batch}-{device.replace('cuda', 'gpu')}", cmd, 60)

    return run


def case_cnn(workers):
    def run(ctx):
        cmd = py(ctx, "train_torchvision.py", "--data", folder(ctx, "photos"), "--workers", workers,
                 "--persistent", "--device", ctx.device, *ctx.scale["cnn"].split())
        return pair(ctx, f"cnn-w{workers}", cmd, 60)

    return run


def case_keras(model, backend):
    def run(ctx):
        data = ["--data", folder(ctx, "shapes")] if model == "cnn" else []
        cmd = py(ctx, "keras_rate.py", "--model", model, *data, *ctx.scale[f"keras_{model}"].split())
        env = {"KERAS_BACKEND": backend, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
        return pair(ctx, f"keras-{model}-{backend}", cmd, 90, env)

    return run


def advice_table(text):
    """--check-advice's table lines (header first), from the run's output."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("advice") and "predicted images/s" in line:
            table = []
            for row in lines[i:]:
                if not row.strip():
                    break
                table.append(row.rstrip())
            return table
    return []


def case_check_advice(ctx):
    """`pipeprof run --once --check-advice` on the CNN at 0 workers: every advice re-run, predicted
    beside measured."""
    cmd = py(ctx, "train_torchvision.py", "--data", folder(ctx, "photos"), "--workers", "0",
             "--device", ctx.device, *ctx.scale["cnn"].split())
    return check_advice(ctx, "cnn-w0-check-advice", "cnn-w0", cmd, ctx.scale["advice_steps"])


def case_mlp_check_advice(ctx):
    """`pipeprof run --once --check-advice` on the in-memory MLP at batch 32 on the GPU: the
    larger batch a tiny model's launches call for, predicted beside measured."""
    cmd = py(ctx, "mlp_in_memory.py", "--batch-size", "32", "--device", ctx.device, *ctx.scale["mlp"].split())
    return check_advice(ctx, "mlp-b32-gpu-check-advice", "mlp-b32-gpu", cmd, ctx.scale["mlp_advice_steps"])


def check_advice(ctx, case, base, cmd, steps):
    """One `--check-advice` case: the run, its table in the row and the notes; `base`: the case
    whose plain rate it sits beside."""
    proc, summary = pipeprof_run(ctx, case, cmd, 150, extra=["--check-advice", "--steps", steps])
    verdict, detail = verdict_of(summary)
    table = advice_table(proc.text)
    detail["advice_rows"] = max(len(table) - 1, 0)
    for k, row in enumerate(table[1:], 1):
        detail[f"advice{k}"] = re.sub(r"\s{2,}", " | ", row.strip())
    ctx.notes += [f"{case} (plain rate: {base}'s):"] + [f"  {t}" for t in table]
    why = proc.failure("the run under pipeprof", ctx.rel(case))
    if not why and not steady_rate(summary):
        why = f"pipeprof's summary has no images/s (see {ctx.rel(case)})"
    if not why and len(table) < 2:
        why = f"no --check-advice table in the output (see {ctx.rel(case)})"
    plain = ctx.plain.get(base)
    return Row(case, f"failed: {why}" if why else "ok", plain, steady_rate(summary), verdict, detail)


def case_overhead(ms):
    """`pipeprof run`'s cost at a step of about MS ms: plain and pipeprof runs of the same work,
    alternating, the program's own images/s compared (medians)."""

    def run(ctx):
        case, s = f"overhead-{ms}ms", ctx.scale["step"]
        base = py(ctx, "gpu_step.py", "--device", ctx.device, "--width", s["width"], "--batch-size", s["batch"])
        cal = ctx.run(f"{case}.calibrate", [*base, "--calibrate", ms], 45)
        found = re.search(r"repeats (\d+)", cal.text)
        if cal.failure("calibration", ctx.rel(case + ".calibrate")) or not found:
            why = cal.failure("calibration", ctx.rel(case + ".calibrate")) or "calibration printed no repeats"
            return Row(case, f"failed: {why}")
        cmd = [*base, "--repeats", found.group(1), "--steps", s["steps"][ms]]
        plain, under, why, summary = [], [], None, None
        for k in range(1, s["pairs"][ms] + 1):
            a = ctx.run(f"{case}.plain{k}", cmd, 45)
            b, summary = pipeprof_run(ctx, f"{case}.pipeprof{k}", cmd, 45)
            why = why or a.failure("a plain run", ctx.rel(f"{case}.plain{k}"))
            why = why or b.failure("a run under pipeprof", ctx.rel(f"{case}.pipeprof{k}"))
            plain.append(program_rate(a.text))
            under.append(program_rate(b.text))
        if not why and None in plain + under:
            why = f"a run printed no images/s (see {LOGS}/{case}.*.log)"
        verdict, detail = verdict_of(summary)
        detail.update(repeats=found.group(1), pairs=len(plain), plain=fmt_list(plain), under_pipeprof=fmt_list(under))
        p = statistics.median(plain) if None not in plain else None
        u = statistics.median(under) if None not in under else None
        if p and u:
            detail["overhead_pct"] = f"{100 * (p - u) / p:.1f}"
        detail["pipeprof_summary_ips"] = f"{(summary or {}).get('images_per_s') or 0:.1f}"
        return Row(case, f"failed: {why}" if why else "ok", p, u, verdict, detail)

    return run


def fmt_list(xs):
    return ",".join("-" if x is None else f"{x:.1f}" for x in xs)


def ensure_gpu_check(ctx):
    """scripts/gpu-check.sh with the carried binary, once: (Proc, its output folder)."""
    if ctx.gpu_check is None:
        out = ctx.logs / "gpu-check"
        budget = int(max(MIN_CASE_S, min(170, ctx.left() - 30)))
        cmd = ["bash", ROOT / "scripts" / "gpu-check.sh", "--out", out, "--data-dir", ctx.data, "--budget", budget,
               ctx.binary]
        ctx.gpu_check = (ctx.run("gpu-check", cmd, budget + 30), out)
    return ctx.gpu_check


def check_summary(ctx, name):
    """A gpu-check scenario's summary, or None."""
    return load_summary(ensure_gpu_check(ctx)[1] / f"{name}.summary.json")


def case_gpu_check(ctx):
    proc, out = ensure_gpu_check(ctx)
    runs = []
    if (out / "runs.tsv").exists():
        runs = [line.split("\t") for line in (out / "runs.tsv").read_text().splitlines() if line]
    ok = sum(1 for r in runs if len(r) > 2 and r[2] == "0")
    detail = {"scenarios_ok": f"{ok}/{len(runs)}", "table": f"{LOGS}/gpu-check/table.txt", "wall_s": f"{proc.wall:.0f}"}
    why = proc.failure("scripts/gpu-check.sh", ctx.rel("gpu-check"))
    if not why and ok < len(runs):
        why = f"{len(runs) - ok} of its {len(runs)} scenarios failed or were skipped (see {detail['table']})"
    if (out / "table.txt").exists():
        ctx.notes += ["scripts/gpu-check.sh:"] + [f"  {t}" for t in (out / "table.txt").read_text().splitlines()]
    return Row("own-gpu-check", f"failed: {why}" if why else "ok", verdict="-", detail=detail)


def torch_step_ms(ctx):
    """PyTorch's median step (ms) on the large CNN, batch 32, on cuda: benches/peer_train.py, the
    peer the cuda_step bench compares with (a warm-up round of 3 steps, then 30)."""
    cmd = [ctx.python, ROOT / "benches" / "peer_train.py", ROOT / "examples" / "cnn_large.toml", "2", "32",
           str(os.cpu_count() or 1), "cuda"]
    # A warm-up round of 3 steps, then 30; the end of its input ends it.
    proc = ctx.run("torch-step", cmd, 120, stdin_text="3\n30\n")
    medians = [line.split() for line in proc.text.splitlines() if re.fullmatch(r"[0-9. ]+", line.strip() or "x")]
    if proc.failure("benches/peer_train.py", ctx.rel("torch-step")) or not medians or len(medians[-1]) < 4:
        return None, proc.failure("benches/peer_train.py", ctx.rel("torch-step")) or "peer_train.py gave no step time"
    return float(medians[-1][3]), None


def case_cnn_step(ctx):
    """pipeprof's own 42.5 M CNN step on cuda (gpu-check's cnn-large-gpu*) beside PyTorch's on the
    same model, and what per-phase timing costs."""
    ips = {n: steady_rate(check_summary(ctx, n)) for n in
           ("cnn-large-gpu", "cnn-large-gpu-sync-step", "cnn-large-gpu-sync-phase")}
    s = check_summary(ctx, "cnn-large-gpu") or {}
    step = (s.get("split") or {}).get("mean_step_ms")
    torch_ms, why = torch_step_ms(ctx)
    detail = {"pipeprof_step_ms": "-" if not step else f"{step:.2f}",
              "torch_step_ms": "-" if torch_ms is None else f"{torch_ms:.2f}"}
    if step and torch_ms:
        detail["pipeprof_over_torch"] = f"{step / torch_ms:.2f}x (goal <= 1.5)"
    one = ips["cnn-large-gpu-sync-step"]
    # The default times each phase with CUDA events; PIPEPROF_GPU_SYNC=phase waits after each.
    for name, key in (("cnn-large-gpu", "timing_cost_events"), ("cnn-large-gpu-sync-phase", "timing_cost_sync_per_phase")):
        if one and ips[name]:
            detail[key] = f"{one / ips[name]:.3f}x (goal <= 1.02)"
    verdict, more = verdict_of(s)
    detail.update(more)
    if not why and not ips["cnn-large-gpu"]:
        why = f"gpu-check's cnn-large-gpu has no images/s (see {LOGS}/gpu-check/cnn-large-gpu.log)"
    plain = 32e3 / torch_ms if torch_ms else None
    return Row("own-cnn-step", f"failed: {why}" if why else "ok", plain, ips["cnn-large-gpu"], verdict, detail)


def transfer_gbps(summary):
    stages = {st.get("stage"): st for st in (summary or {}).get("stages", [])}
    tr = stages.get("transfer") or {}
    if tr.get("total_ms", 0) > 0 and tr.get("bytes", 0) > 0:
        return tr["bytes"] / (tr["total_ms"] / 1e3) / 1e9
    return None


def case_h2d(ctx):
    """One batch to the device: PyTorch pageable and pinned (gpu_step.py --h2d) beside pipeprof's
    copies in gpu-check's cnn-large-gpu (default), -pinned and -u8 runs (GB/s of the f32 batch)."""
    proc = ctx.run("h2d-torch", py(ctx, "gpu_step.py", "--h2d", "--device", "cuda"), 60)
    torch = {m.group(1): float(m.group(2)) for m in re.finditer(r"h2d (\w+): ([0-9.]+) GB/s", proc.text)}
    detail = {f"torch_{k}_gbps": f"{v:.2f}" for k, v in torch.items()}
    own = {}
    for name, key in (("cnn-large-gpu", "default"), ("cnn-large-gpu-pinned", "pinned"), ("cnn-large-gpu-u8", "u8")):
        own[key] = transfer_gbps(check_summary(ctx, name))
        detail[f"pipeprof_{key}_gbps"] = "-" if own[key] is None else f"{own[key]:.2f}"
    best = max((v for v in own.values() if v), default=None)
    if best and torch.get("pinned"):
        detail["best_over_torch_pinned"] = f"{100 * best / torch['pinned']:.0f}% (goal >= 80%)"
    why = proc.failure("gpu_step.py --h2d", ctx.rel("h2d-torch"))
    if not why and "pinned" not in torch:
        why = f"gpu_step.py --h2d printed no pinned rate (see {ctx.rel('h2d-torch')})"
    if not why and best is None:
        why = f"no transfer stage in gpu-check's cnn-large-gpu runs (see {LOGS}/gpu-check/)"
    return Row("own-h2d", f"failed: {why}" if why else "ok", verdict="-", detail=detail)


def case_workers_auto(ctx):
    """pipeprof's own loader with --workers auto (gpu-check's decode-auto) against 1 worker."""
    one, auto = check_summary(ctx, "decode-1worker"), check_summary(ctx, "decode-auto")
    settings = (auto or {}).get("settings") or {}
    verdict, detail = verdict_of(auto)
    detail.update(workers=settings.get("workers", "-"), cores=settings.get("cores", "-"),
                  changes=" > ".join(settings.get("auto_workers") or []) or "-")
    plain, pp = steady_rate(one), steady_rate(auto)
    why = None if plain and pp else f"gpu-check's decode-1worker/decode-auto did not finish (see {LOGS}/gpu-check/)"
    return Row("own-workers-auto", f"failed: {why}" if why else "ok", plain, pp, verdict, detail)


def case_cuda_step_bench(ctx):
    """The cuda_step bench, when a binary of it built here was carried (--bench)."""
    if ctx.bench is None:
        return Row("own-cuda-step-bench", "skipped: the cuda_step bench is a cargo bench and the GPU machine has no "
                   "Rust; no --bench binary was given (own-cnn-step and own-h2d measure the same)")
    env = {"PIPEPROF_BENCH_STEPS": "30", "PIPEPROF_PYTHON": ctx.python, "LD_LIBRARY_PATH": cuda_lib_path(ctx)}
    proc = ctx.run("cuda-step-bench", [ctx.bench], 180, env)
    one = re.search(r"step, one sync\s+([0-9.]+)", proc.text)
    torch = re.search(r"PyTorch step, sync/phase\s+([0-9.]+)", proc.text)
    detail = {m.group(1).strip(): m.group(2) for m in re.finditer(r"^\s+([a-zA-Z][^0-9\n]*?)\s+([0-9.]+ ?\S*)", proc.text, re.M)}
    why = proc.failure("the cuda_step bench", ctx.rel("cuda-step-bench"))
    if not why and not one:
        why = f"the bench printed no step time (see {ctx.rel('cuda-step-bench')})"
    plain = 32e3 / float(torch.group(1)) if torch else None
    return Row("own-cuda-step-bench", f"failed: {why}" if why else "ok", plain, 32e3 / float(one.group(1)) if one else None,
               "-", detail)


class CaseError(Exception):
    """A case could not run (its data, a tool): the message is the row's reason."""


def say(message):
    print(f"gpu-truth: {message}", file=sys.stderr, flush=True)


def unpacked(ctx, what, path):
    """The executable itself, or for NAME.xz the file decompressed (executable) into the work
    folder; a Usage error when it is no ELF file."""
    import lzma

    dest = path if path.suffix != ".xz" else ctx.work / path.stem
    if not dest.exists():
        try:
            with lzma.open(path) as src, open(dest, "wb") as out:
                shutil.copyfileobj(src, out)
        except (lzma.LZMAError, OSError) as e:
            raise Usage(f"{what} '{path}': cannot decompress it ({e})") from None
        dest.chmod(0o755)
    with open(dest, "rb") as f:
        if f.read(4) != b"\x7fELF":
            raise Usage(f"{what} '{path}': not a Linux executable (no ELF header)")
    return dest


def cuda_lib_path(ctx):
    """PyTorch's pip CUDA libraries (nvidia/cu13/lib) and the toolkit's, as gpu-check.sh finds them."""
    code = "import site; print('\\n'.join(site.getsitepackages() + [site.getusersitepackages()]))"
    found = subprocess.run([ctx.python, "-c", code], capture_output=True, text=True).stdout.split()
    dirs = [f"{d}/nvidia/cu13/lib" for d in found if Path(d, "nvidia", "cu13", "lib").is_dir()]
    dirs += ["/usr/local/cuda/lib64"] if Path("/usr/local/cuda/lib64").is_dir() else []
    return ":".join(dirs + [p for p in [os.environ.get("LD_LIBRARY_PATH")] if p])


def pip_target(ctx, wheel, site):
    proc = subprocess.run([ctx.python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-index",
                           "--no-deps", "--target", site, wheel], capture_output=True, text=True)
    if proc.returncode != 0:
        raise CaseError(f"pip could not install {wheel}: {(proc.stderr or proc.stdout).strip()[-400:]}")


def install(ctx):
    """The wheel (and each extra wheel whose package the interpreter lacks) into one folder on
    PYTHONPATH, its bin/ on PATH: how the GPU machine's venv takes the wheel (GPU.md)."""
    site = ctx.work / "site"
    pip_target(ctx, ctx.wheel, site)
    installed = []
    for whl in sorted(ctx.extra.glob("*.whl")) if ctx.extra else []:
        dist = whl.name.split("-")[0]
        probe = f"import importlib.metadata as m; m.version({dist!r})"
        if subprocess.run([ctx.python, "-c", probe], capture_output=True).returncode != 0:
            pip_target(ctx, whl, site)
            installed.append(whl.name)
    ctx.pipeprof = site / "bin" / "pipeprof"
    if not os.access(ctx.pipeprof, os.X_OK):
        raise CaseError(f"the wheel {ctx.wheel.name} installed no bin/pipeprof command")
    ctx.env["PYTHONPATH"] = os.pathsep.join([str(site)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    ctx.env["PATH"] = os.pathsep.join([str(site / "bin"), os.environ.get("PATH", "")])
    return installed


def folder(ctx, key):
    """A generated image folder (made once per data folder by the wheel's `pipeprof demo-data`)."""
    name, args = ctx.scale[key]
    path = ctx.data / name
    if not (path / ".done").exists():
        shutil.rmtree(path, ignore_errors=True)
        proc = ctx.run(f"data-{name}", [ctx.pipeprof, "demo-data", path, *args.split()], 120)
        why = proc.failure("pipeprof demo-data", ctx.rel(f"data-{name}"))
        if why:
            raise CaseError(why)
        (path / ".done").touch()
    return path


# Versions from the installed metadata: importing Keras would need a backend chosen first.
VERSIONS = """
import importlib.metadata as md, json, platform
v = {"python": platform.python_version()}
for m in ("torch", "torchvision", "jax", "jaxlib", "keras", "numpy", "pipeprof"):
    try:
        v[m] = md.version(m)
    except md.PackageNotFoundError:
        v[m] = "missing"
try:
    import torch
    v["torch_cuda"] = torch.cuda.is_available()
except Exception as e:
    v["torch_cuda"] = type(e).__name__
print(json.dumps(v))
"""


def first_line(cmd, env, otherwise):
    """A short query's first line of output, or why there is none (a header never stops the run)."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env or None, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{otherwise} ({type(e).__name__})"
    lines = p.stdout.strip().splitlines()
    return lines[0] if lines else f"{otherwise} ({p.stderr.strip()[-200:]})"


def header(ctx, installed):
    """The results file's `#` lines: when, where, with what, and what the columns mean."""
    gpu = "none (no nvidia-smi)"
    if shutil.which("nvidia-smi"):
        q = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_cap", "--format=csv,noheader"]
        gpu = first_line(q, {}, "nvidia-smi said nothing")
    versions = first_line([ctx.python, "-c", VERSIONS], ctx.env, "the versions could not be read")
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    bench = str(ctx.bench) if ctx.bench else "not run: a cargo bench, and the GPU machine has no Rust (no --bench)"
    return [
        f"# gpu-truth · {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} · mode "
        + ("cpu-only (every case on the CPU, tiny data, GPU cases skipped)" if ctx.cpu_only else "gpu")
        + f" · budget {ctx.budget}s",
        f"# host: {os.cpu_count()} cores, {mem:.0f} GiB · gpu: {gpu}",
        f"# python: {ctx.python} {versions}",
        f"# binary: {ctx.binary} ({ctx.binary.stat().st_size} bytes) · wheel: {ctx.wheel.name}"
        + f" · extra wheels installed: {', '.join(installed) or 'none'}",
        f"# cuda_step bench: {bench}",
        "# columns: plain_ips = the program's own images/s, run plain (own-* rows: PyTorch's, or pipeprof's",
        "#   1-worker run); pipeprof_ips = pipeprof's images/s of the run under `pipeprof run --once`",
        "#   (overhead-* rows: the program's own images/s under pipeprof; own-* rows: pipeprof's own loop);",
        "#   verdict = pipeprof's verdict line; status = ok | skipped: reason | failed: reason;",
        "#   detail = key=value; ... (logs of every run: gpu-truth-logs.tar.gz)",
    ]


def human_summary(ctx, rows):
    """The `#` lines after the rows: counts, a table to read, and the longer tables."""
    count = {k: sum(1 for r in rows if r.status.split(":")[0] == k) for k in ("ok", "skipped", "failed")}
    took = time.monotonic() - ctx.start
    lines = [f"# summary: {count['ok']} ok, {count['skipped']} skipped, {count['failed']} failed, in {took:.0f}s"]
    table = [["case", "plain", "pipeprof", "status", "verdict"]]
    table += [[r.case, *r.cells()[1:3], r.status[:60], (r.verdict or "-")[:90]] for r in rows]
    widths = [max(len(t[i]) for t in table) for i in range(4)]
    lines += ["#   " + "  ".join(c.ljust(w) for c, w in zip(t, widths + [0])).rstrip() for t in table]
    return lines + [f"# {n}" for n in ctx.notes]


# In the order they run: a case that finds less than MIN_CASE_S of the budget left is skipped,
# so the ones the issue's figures hang on come first. Each: (name, why it needs a GPU or None, fn).
CASES = [
    ("mlp-b32-cpu", None, case_mlp("32", "cpu")),
    ("mlp-b32-gpu", "needs a GPU: the MLP on cuda", case_mlp("32", "cuda")),
    ("mlp-b128-cpu", None, case_mlp("128", "cpu")),
    ("mlp-b128-gpu", "needs a GPU: the MLP on cuda", case_mlp("128", "cuda")),
    ("cnn-w0", None, case_cnn("0")),
    ("cnn-w4", None, case_cnn("4")),
    ("cnn-w8", None, case_cnn("8")),
    ("cnn-w16", None, case_cnn("16")),
    ("overhead-2ms", None, case_overhead(2)),
    ("overhead-40ms", None, case_overhead(40)),
    ("own-gpu-check", OWN_SKIP, case_gpu_check),
    ("own-cnn-step", OWN_SKIP, case_cnn_step),
    ("own-h2d", OWN_SKIP, case_h2d),
    ("own-workers-auto", OWN_SKIP, case_workers_auto),
    ("own-cuda-step-bench", OWN_SKIP, case_cuda_step_bench),
    ("keras-mlp-jax", None, case_keras("mlp", "jax")),
    ("keras-mlp-torch", None, case_keras("mlp", "torch")),
    ("keras-cnn-jax", None, case_keras("cnn", "jax")),
    ("keras-cnn-torch", None, case_keras("cnn", "torch")),
    ("cnn-w0-check-advice", None, case_check_advice),
    ("mlp-b32-gpu-check-advice", "needs a GPU: the MLP's batch advice on cuda", case_mlp_check_advice),
]


def run_case(ctx, name, gpu_reason, fn):
    if ctx.only is not None and name not in ctx.only:
        return Row(name, "skipped: not in --only")
    if ctx.cpu_only and gpu_reason:
        return Row(name, f"skipped: {gpu_reason} (--cpu-only)")
    if ctx.left() < MIN_CASE_S:
        return Row(name, f"skipped: the {ctx.budget}s budget was spent")
    say(f"{name} ({ctx.left():.0f}s of the budget left)")
    try:
        row = fn(ctx)
    except CaseError as e:
        row = Row(name, f"failed: {e}")
    except Exception as e:  # noqa: BLE001 - a bug in one case must not lose the others' rows
        row = Row(name, f"failed: {type(e).__name__}: {e}")
    say(f"{name}: {row.status}")
    return row


def pack_logs(ctx):
    """The logs folder as OUT/gpu-truth-logs.tar.gz (traces left out: large, and in no row)."""
    tar = ctx.out / f"{LOGS}.tar.gz"
    part = tar.with_name(tar.name + ".part")
    with tarfile.open(part, "w:gz") as t:
        t.add(ctx.logs, arcname=LOGS, filter=lambda i: None if i.name.endswith(".trace.json") else i)
    part.replace(tar)
    return tar


def rerun_line(ctx, rows):
    """The command that runs again only the cases that failed or found the budget spent."""
    again = [r.case for r in rows if r.status.startswith("failed") or "budget was spent" in r.status]
    if not again:
        return None
    a = ctx.args
    cmd = ["bash", "scripts/gpu-truth.sh", a.binary, a.wheel]
    cmd += ["--extra-wheels", a.extra_wheels] if a.extra_wheels else []
    cmd += ["--bench", a.bench] if a.bench else []
    cmd += ["--python", a.python] if a.python != "python3" else []
    cmd += ["--cpu-only"] if a.cpu_only else []
    return " ".join(cmd + ["--only", ",".join(again), "--budget", str(RERUN_BUDGET_S)])


def start(argv):
    """The run's context, its binary unpacked and the wheel installed; or an exit code."""
    try:
        ctx = Ctx(parse_args(argv))
    except Usage as e:
        print(f"gpu-truth: error: {e}", file=sys.stderr)
        return None, 2
    try:
        ctx.binary = unpacked(ctx, "binary", ctx.binary)
        if ctx.bench and (ctx.only is None or "own-cuda-step-bench" in ctx.only):
            ctx.bench = unpacked(ctx, "--bench", ctx.bench)
    except Usage as e:
        print(f"gpu-truth: error: {e}", file=sys.stderr)
        shutil.rmtree(ctx.work, ignore_errors=True)
        return None, 2
    ctx.out.mkdir(parents=True, exist_ok=True)
    ctx.logs.mkdir(parents=True)
    ctx.data.mkdir(parents=True, exist_ok=True)
    try:
        ctx.installed = install(ctx)
    except CaseError as e:
        print(f"gpu-truth: error: {e}", file=sys.stderr)
        shutil.rmtree(ctx.work, ignore_errors=True)
        return None, 1
    return ctx, 0


def main(argv):
    ctx, code = start(argv)
    if ctx is None:
        return code
    results = ctx.out / RESULTS
    with open(results, "w") as f:
        f.write("\n".join(header(ctx, ctx.installed) + ["\t".join(COLUMNS)]) + "\n")
    rows = []
    try:
        for name, gpu_reason, fn in CASES:
            rows.append(run_case(ctx, name, gpu_reason, fn))
            with open(results, "a") as f:
                f.write("\t".join(rows[-1].cells()) + "\n")
            pack_logs(ctx)
        summary = human_summary(ctx, rows)
        again = rerun_line(ctx, rows)
        summary += [f"# re-run (timeout_s {RERUN_BUDGET_S + 40}): {again}"] if again else []
        with open(results, "a") as f:
            f.write("\n".join(summary) + "\n")
        print("\n".join(line[2:] for line in summary), flush=True)
        say(f"results: {results} · logs: {pack_logs(ctx)}")
    finally:
        shutil.rmtree(ctx.work, ignore_errors=True)
    return 1 if any(r.status.startswith("failed") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
