"""The wheel as a user installs it: the `pipeprof` command beside the environment's Python,
every subcommand, with no Rust toolchain on PATH; `python -m pipeprof`; settings that do
not all read."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HANG_S


def installed():
    p = Path(sys.executable).parent / "pipeprof"
    if not p.exists():
        pytest.fail(f"{p} missing: install the wheel into this environment (scripts/test.sh does: scripts/build-wheel.sh)")
    return p


def no_cargo_env(tmp_path):
    # Only the environment's scripts and the system's: no ~/.cargo/bin.
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    return dict(os.environ, PATH=f"{Path(sys.executable).parent}:/usr/bin:/bin", XDG_RUNTIME_DIR=str(runtime))


def test_the_wheel_carries_the_command_with_every_subcommand(tmp_path):
    env = no_cargo_env(tmp_path)
    assert subprocess.run(["which", "cargo"], env=env, capture_output=True).returncode != 0
    helptext = subprocess.run(["pipeprof", "--help"], env=env, capture_output=True, text=True, check=True).stdout
    for sub in ("profile", "run", "attach", "report", "demo-data", "cache"):
        assert f"\n  {sub} " in helptext, helptext
    listed = subprocess.run(["pipeprof", "attach", "--list"], env=env, capture_output=True, text=True, check=True)
    assert "no instrumented runs" in listed.stdout
    via_python = subprocess.run([sys.executable, "-m", "pipeprof", "--version"], env=env, capture_output=True, text=True)
    assert via_python.returncode == 0 and via_python.stdout.startswith("pipeprof "), via_python


def test_one_bad_setting_leaves_the_others(scenario):
    run = scenario(
        """
        import pipeprof
        addr = pipeprof.init(program="bad-settings", settings={"input": "3x150x150", "batch_size": 32, "workers": 3}, sample=False)
        print("attach:", addr, flush=True)
        pipeprof.wait_for_clients(1)
        pipeprof.settings(framework="pytorch", pin_memory=False)
        for k in range(3):
            with pipeprof.span("wait", step=k):
                pass
            with pipeprof.span("compute", step=k):
                pass
            pipeprof.step(k, images=32)
        pipeprof.finish()
        """
    )
    s, out, err = run.attach()
    st = s["settings"]
    assert (st["batch_size"], st["workers"], st["framework"], st["pin_memory"]) == (32, 3, "pytorch", False), st
    assert len(st["unreadable"]) == 1 and st["unreadable"][0].startswith("input"), st
    assert "does not read, left out: input" in err
    assert run.wait()[0] == 0


def test_the_command_runs_an_installed_python_with_no_edit(tmp_path):
    env = no_cargo_env(tmp_path)
    script = tmp_path / "plain.py"
    script.write_text("import pipeprof\nprint('role', pipeprof.role(), pipeprof.is_main())\n")
    p = subprocess.run(
        ["pipeprof", "run", "--once", "--no-gpu", "--summary", str(tmp_path / "s.json"), "--", sys.executable, str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert p.returncode == 0, p.stderr
    # The start-up hook connected the script to the run as its main program.
    assert "role worker True" in p.stdout, p.stdout + p.stderr
    assert json.loads((tmp_path / "s.json").read_text())["settings"]["model"] == "plain.py"


def test_an_exception_that_ends_an_attached_program_fails_the_run(scenario):
    run = scenario(
        """
        import pipeprof
        addr = pipeprof.init(program="crashes", sample=False)
        print("attach:", addr, flush=True)
        pipeprof.wait_for_clients(1)
        for k in range(3):
            with pipeprof.span("compute", step=k):
                pass
            pipeprof.step(k, images=4)
        raise RuntimeError("CUDA out of memory (a stand-in)")
        """
    )
    s, out, err = run.attach()
    assert s["failed"].startswith("RuntimeError: CUDA out of memory (a stand-in) (in scenario.py, line 10)"), s.get("failed")
    assert "RUN FAILED" in out
    code, _, perr = run.wait()
    assert code == 1 and "RuntimeError" in perr


def test_pip_install_from_a_clone_builds_the_module_and_the_command(tmp_path):
    # The README's from-source install: `pip install ./python` in a fresh clone with a Rust
    # toolchain and nothing built in it (issue 44: the metadata step wanted the git-ignored
    # data folder that only a build makes, so a test run in the tree the test command had
    # already built in passed where a user's clone failed). The clone shares this tree's
    # cargo target folder (CARGO_TARGET_DIR): only the build outputs, never its sources or
    # its python/pipeprof.data. Built as a wheel (the same build pip install runs) so this
    # environment is left as is.
    import shutil
    import zipfile

    from conftest import REPO

    assert shutil.which("cargo"), "this test builds from source: it needs cargo on PATH (scripts/test.sh has it)"
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=HANG_S)
    assert not (clone / "python" / "pipeprof.data").exists()
    out = tmp_path / "wheels"
    env = dict(os.environ, CARGO_TARGET_DIR=str(REPO / "target"))
    # maturin also leaves its wheel in the target folder's wheels/, where this tree's own wheel
    # is (test_gpu_truth wants exactly one there): what the clone's build adds is removed.
    ours = REPO / "target" / "wheels"
    before = set(ours.glob("*.whl"))
    try:
        p = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-w", str(out), "./python"],
            capture_output=True,
            text=True,
            cwd=clone,
            env=env,
            timeout=1800,  # a hang guard: a cold build compiles the crates
        )
    finally:
        for left in set(ours.glob("*.whl")) - before:
            left.unlink()
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    (wheel,) = out.glob("pipeprof-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.endswith(".data/scripts/pipeprof") for n in names), names
    assert any(n.startswith("pipeprof/_native") for n in names), names
    assert "pipeprof/_torch_loop.py" in names and "pipeprof/_bootstrap/sitecustomize.py" in names, names
    assert not any(n.startswith("build_backend") for n in names), names
