"""scripts/gpu-truth.sh's CPU half (issue 56): its argument checks, its results file, and every
case run with --cpu-only on tiny data, the GPU-only ones skipped with the reason. The GPU half
runs on a GPU machine only (the script's header says how); this is what CI can prove of it.

It runs with this checkout's wheel (target/wheels/pipeprof-*.whl, as scripts/build-wheel.sh
leaves it) and release binary, and this environment's Python as the cases' interpreter."""

import importlib.util
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu-truth.sh"
# A hang guard, not a timing: the whole --cpu-only run on 2 cores takes about a minute.
HANG_S = 900
# No case may be skipped for time here: the budget is a guard, not a timing.
BUDGET = "3600"


def driver():
    """scripts/gpu_truth.py as a module: its CASES, read_results and rerun_line."""
    spec = importlib.util.spec_from_file_location("gpu_truth", REPO / "scripts" / "gpu_truth.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def built():
    """(the release binary, the wheel): this checkout's, or the test fails saying how to build them."""
    binary = REPO / "target" / "release" / "pipeprof"
    if not binary.exists():
        pytest.fail(f"{binary} missing: build it with `cargo build --release` (scripts/test.sh does)")
    wheels = sorted((REPO / "target" / "wheels").glob("pipeprof-*.whl"))
    if len(wheels) != 1:
        pytest.fail(f"target/wheels holds {len(wheels)} pipeprof-*.whl, expected one: run scripts/build-wheel.sh")
    return binary, wheels[0]


def gpu_truth(*args, timeout=HANG_S):
    try:
        return subprocess.run(["bash", str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"scripts/gpu-truth.sh did not end: {e}")


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """One --cpu-only run of every case: (process, `#` lines, rows by case, output folder)."""
    binary, wheel = built()
    tmp = tmp_path_factory.mktemp("gpu-truth")
    out = tmp / "out"
    p = gpu_truth(binary, wheel, "--cpu-only", "--python", sys.executable, "--out", out, "--data-dir", tmp / "data",
                  "--budget", BUDGET)
    if not (out / "gpu-truth.tsv").exists():
        pytest.fail(f"no results file (exit {p.returncode}):\n{p.stdout}\n{p.stderr}")
    comments, rows = driver().read_results(out / "gpu-truth.tsv")
    return p, comments, {r["case"]: r for r in rows}, out


@pytest.mark.parametrize(
    "args, says",
    [
        (["{tmp}/nothing", "{wheel}"], "binary '{tmp}/nothing': no such file"),
        (["{tmp}", "{wheel}"], "binary '{tmp}': is a folder, not a file"),
        (["{tmp}/script.xz", "{wheel}"], "binary '{tmp}/script.xz': cannot decompress it"),
        (["{tmp}/script", "{wheel}"], "binary '{tmp}/script': not a Linux executable (no ELF header)"),
        (["{binary}", "{tmp}/nothing.whl"], "wheel '{tmp}/nothing.whl': no such file"),
        (["{binary}", "{tmp}/script"], "wheel '{tmp}/script': not a pipeprof wheel"),
        (["{binary}", "{tmp}/pipeprof-0-py3-none-any.whl"], "wheel '{tmp}/pipeprof-0-py3-none-any.whl': not a wheel"),
        (["{binary}", "{wheel}", "--only", "mlp-b32-cpu,gpu-magic"], "--only: unknown case(s) gpu-magic"),
        (["{binary}", "{wheel}", "--budget", "0"], "--budget 0: give a number of seconds above 0"),
        (["{binary}", "{wheel}", "--python", "{tmp}/no-python"], "--python '{tmp}/no-python': not found"),
        (["{binary}", "{wheel}", "--extra-wheels", "{tmp}/none"], "--extra-wheels '{tmp}/none': no such folder"),
        (["{binary}", "{wheel}", "--frobnicate"], "unknown option: --frobnicate"),
        (["{binary}"], "the following arguments are required: wheel"),
        (["--prepare", "now"], "--prepare takes no other argument"),
    ],
)
def test_a_wrong_argument_exits_2_naming_the_file_and_why(tmp_path, args, says):
    binary, wheel = built()
    (tmp_path / "script").write_text("#!/bin/sh\n")
    (tmp_path / "script").chmod(0o755)
    (tmp_path / "script.xz").write_bytes(b"not xz at all")
    (tmp_path / "pipeprof-0-py3-none-any.whl").write_bytes(b"not a zip")
    fill = dict(tmp=tmp_path, binary=binary, wheel=wheel)
    out = tmp_path / "out"
    p = gpu_truth(*[a.format(**fill) for a in args], "--out", out)
    assert p.returncode == 2, p
    assert f"gpu-truth: error: {says.format(**fill)}" in p.stderr, p.stderr
    assert not out.exists(), "a refused run must write nothing"


def test_cpu_only_lists_every_case_once_in_order_with_a_status(cpu_run):
    p, comments, rows, _ = cpu_run
    assert list(rows) == [name for name, _, _ in driver().CASES], rows.keys()
    for case, row in rows.items():
        assert row["status"] == "ok" or row["status"].startswith(("skipped: ", "failed: ")), row
    assert comments[0].startswith("# gpu-truth · ") and "mode cpu-only" in comments[0], comments[0]
    assert not any(line.startswith("# re-run") for line in comments), "nothing failed: no re-run is offered"
    assert p.returncode == 0, p.stderr[-4000:]


def test_cpu_only_skips_each_gpu_case_saying_why(cpu_run):
    _, _, rows, _ = cpu_run
    gpu_only = {name: why for name, why, _ in driver().CASES if why}
    assert {"mlp-b32-gpu", "own-gpu-check", "own-cnn-step", "own-h2d"} <= set(gpu_only)
    for case, why in gpu_only.items():
        assert rows[case]["status"] == f"skipped: {why} (--cpu-only)", rows[case]
        assert why.startswith("needs a GPU"), why


def test_cpu_only_measures_every_cpu_case_plain_and_under_pipeprof(cpu_run):
    _, comments, rows, _ = cpu_run
    cpu_cases = [name for name, why, _ in driver().CASES if not why]
    assert len(cpu_cases) == 13, cpu_cases
    for case in cpu_cases:
        row = rows[case]
        assert row["status"] == "ok", row
        assert float(row["plain_ips"]) > 0 and float(row["pipeprof_ips"]) > 0, row
        assert row["verdict"] != "-", row
    summary = next(line for line in comments if line.startswith("# summary: "))
    assert summary.startswith("# summary: 13 ok, 8 skipped, 0 failed"), summary


def test_cpu_only_rows_carry_what_each_case_compares(cpu_run):
    _, comments, rows, _ = cpu_run
    assert "limiter=" in rows["cnn-w4"]["detail"] and "wall_s=" in rows["cnn-w4"]["detail"], rows["cnn-w4"]
    overhead = driver().read_details(rows["overhead-2ms"])
    assert int(overhead["repeats"]) >= 1 and overhead["pairs"] == "1", overhead
    assert "overhead_pct" in overhead, overhead
    advice = driver().read_details(rows["cnn-w0-check-advice"])
    assert int(advice["advice_rows"]) >= 1, advice
    assert rows["cnn-w0-check-advice"]["plain_ips"] == rows["cnn-w0"]["plain_ips"]
    assert any("predicted images/s" in line for line in comments), "the --check-advice table is in the summary"


def test_cpu_only_brings_back_two_files_the_logs_of_every_run_inside(cpu_run):
    _, _, rows, out = cpu_run
    assert sorted(f.name for f in out.iterdir()) == ["gpu-truth-logs.tar.gz", "gpu-truth.tsv"]
    with tarfile.open(out / "gpu-truth-logs.tar.gz") as t:
        names = set(t.getnames())
    for case in ("mlp-b32-cpu", "cnn-w16", "keras-cnn-torch"):
        assert {f"gpu-truth-logs/{case}.plain.log", f"gpu-truth-logs/{case}.pipeprof.log"} <= names, names
    assert "gpu-truth-logs/cnn-w0-check-advice.log" in names, names


def test_a_spent_budget_skips_the_rest_and_offers_the_re_run(tmp_path):
    binary, wheel = built()
    out = tmp_path / "out"
    # 1 s is below the 15 s a case needs to start, however fast the machine.
    p = gpu_truth(binary, wheel, "--cpu-only", "--python", sys.executable, "--out", out, "--data-dir", tmp_path / "d",
                  "--budget", "1", "--only", "mlp-b32-cpu,cnn-w0,own-h2d")
    mod = driver()
    _, rows = mod.read_results(out / "gpu-truth.tsv")
    status = {r["case"]: r["status"] for r in rows}
    assert status["mlp-b32-cpu"] == status["cnn-w0"] == "skipped: the 1s budget was spent", status
    assert status["own-h2d"].startswith("skipped: needs a GPU"), status
    assert status["keras-mlp-jax"] == "skipped: not in --only", status
    again = p.stdout.strip().splitlines()[-1]
    assert again.startswith("re-run (timeout_s 240): bash scripts/gpu-truth.sh "), p.stdout
    args = mod.parse_args(again.split("bash scripts/gpu-truth.sh ", 1)[1].split())
    assert args.only == "mlp-b32-cpu,cnn-w0" and args.budget == mod.RERUN_BUDGET_S and args.cpu_only, args
    assert (args.binary, args.wheel) == (str(binary), str(wheel)), args
    assert p.returncode == 0, p.stderr


def test_results_file_round_trips_and_refuses_other_columns(tmp_path):
    mod = driver()
    detail = {"limiter": "Cpu", "note": "a\nb", "advice1": "pack | 4.04× | (32 images; 24 from the pack)"}
    row = mod.Row("cnn-w4", "ok", 655.04, 640.0, "CPU preprocessing\tHIGH", detail)
    path = tmp_path / "r.tsv"
    path.write_text("# a header\n" + "\t".join(mod.COLUMNS) + "\n" + "\t".join(row.cells()) + "\n# summary\n")
    comments, rows = mod.read_results(path)
    assert comments == ["# a header", "# summary"]
    assert rows == [dict(case="cnn-w4", plain_ips="655.0", pipeprof_ips="640.0", verdict="CPU preprocessing HIGH",
                         status="ok", detail="limiter=Cpu; note=a b; advice1=pack | 4.04× | (32 images, 24 from the pack)")]
    assert mod.read_details(rows[0]) == {"limiter": "Cpu", "note": "a b", "advice1": "pack | 4.04× | (32 images, 24 from the pack)"}
    path.write_text("case\tips\n")
    with pytest.raises(ValueError, match="columns"):
        mod.read_results(path)
