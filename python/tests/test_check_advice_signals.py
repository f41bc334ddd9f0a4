"""The ways out of `pipeprof run --check-advice` while it copies the slow folder, packs it or
re-runs the program (issue 52 M3): the first Ctrl-C or SIGTERM stops the copy, the pack or the
re-run, prints the rows so far and exits 130 / 143; a second Ctrl-C exits at once; SIGKILL
leaves no process behind (the children die with pipeprof), and the private folder it left is
removed by the next `--check-advice`. After each, nothing of the run is left in the temp folder
or the process table."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import slowfs
from conftest import HANG_S, pipeprof_bin
from test_check_advice_fuse import COPY_ROW, EXAMPLE, PACK_ROW, slow_demo
from test_frameworks import env_for

# The example script, with Ctrl-C ignored (a program that saves a checkpoint for ever): only
# pipeprof's own deadline, or a second Ctrl-C, ends a re-run of it.
DEAF = f"""
import runpy, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
sys.argv = [{str(EXAMPLE)!r}] + sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def ours(tmp_path):
    """Processes whose command line names ``tmp_path`` (the runs, the program, `pipeprof
    pack`), but the slow mount's server."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(tmp_path) in cmd and "slowfs.py" not in cmd:
            found.append(f"{d.name}: {cmd}")
    return found


def leftovers(scratch):
    return sorted(x.name for x in scratch.iterdir() if x.name.startswith("pipeprof-check-run-"))


def until(what, check, proc, deadline_s=HANG_S):
    """Polls ``check()`` until it is true (a hang guard, not a timing): fails if ``proc``
    (pipeprof) ended first."""
    end = time.monotonic() + deadline_s
    while not check():
        assert proc.poll() is None, f"pipeprof ended before {what}: {proc.returncode}"
        assert time.monotonic() < end, f"no {what} in {deadline_s} s"
        time.sleep(0.02)


class Lines:
    """pipeprof's progress lines (its stderr), read on a thread as they come."""

    def __init__(self, proc):
        import threading

        self.lines = []
        self.thread = threading.Thread(target=lambda: self.lines.extend(iter(proc.stderr.readline, "")), daemon=True)
        self.thread.start()

    def has(self, text):
        return any(text in line for line in list(self.lines))


def start(tmp_path, mnt, program):
    scratch = tmp_path / "tmp"
    env = env_for(tmp_path)
    env["TMPDIR"] = str(scratch)
    cmd = [pipeprof_bin(), "run", "--once", "--no-gpu", "--check-advice", "--steps", "30", "--", *program]
    cmd += ["--data", mnt, "--epochs", "4"]
    proc = subprocess.Popen(
        list(map(str, cmd)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path
    )
    return proc, Lines(proc)


def ignores_ctrl_c(tmp_path):
    """Whether the re-run's program (DEAF) runs with SIGINT ignored (it may be starting still:
    an interrupt then would end it before it ignores them)."""
    for c in ours(tmp_path):
        pid, cmd = c.split(": ", 1)
        if cmd.startswith(sys.executable + " ") and "deaf.py" in cmd:
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            ign = [line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:")]
            if ign and int(ign[0], 16) & (1 << (signal.SIGINT - 1)):
                return True
    return False


def during(tmp_path, proc, lines, phase):
    """Waits until the check-advice run is in ``phase``: the copy being made, `pipeprof pack`
    running, or the program re-run."""
    scratch = tmp_path / "tmp"
    if phase == "copy":
        until("the copy", lambda: any(scratch.glob("pipeprof-check-run-*/data-copy/*/*")), proc)
    elif phase == "pack":
        until("the pack", lambda: lines.has("pipeprof pack") and any(" pack " in c for c in ours(tmp_path)), proc)
    else:
        # The program itself running (the main run's ended before the first re-run began).
        program = sys.executable + " "
        until(
            "a re-run",
            lambda: lines.has("run 1/") and any(c.split(": ", 1)[1].startswith(program) for c in ours(tmp_path)),
            proc,
        )


def ended(proc, lines):
    out = proc.stdout.read()
    proc.wait(timeout=HANG_S)
    lines.thread.join(timeout=HANG_S)
    return proc.returncode, out, "".join(lines.lines)


def gone(tmp_path):
    """Nothing of the run left in the process table (polled: a child told by its parent's death
    takes a moment to end), nor in the temp folder."""
    end = time.monotonic() + HANG_S
    while ours(tmp_path):
        assert time.monotonic() < end, f"left running: {ours(tmp_path)}"
        time.sleep(0.05)


def test_interrupts_during_the_copy_the_pack_and_a_re_run_stop_it_and_leave_nothing(tmp_path):
    src, mnt, scratch = tmp_path / "src", tmp_path / "mnt", tmp_path / "tmp"
    slow_demo(src)
    scratch.mkdir()
    with slowfs.mounted(src, mnt, open_ms=20):
        rows = {"copy": COPY_ROW, "pack": PACK_ROW, "re-run": "as run (no change)"}
        for phase, sig, code in (("copy", signal.SIGINT, 130), ("pack", signal.SIGTERM, 143), ("re-run", signal.SIGINT, 130)):
            proc, lines = start(tmp_path, mnt, [sys.executable, EXAMPLE])
            during(tmp_path, proc, lines, phase)
            proc.send_signal(sig)
            rc, out, err = ended(proc, lines)
            assert rc == code, f"{phase}: {rc}\n{out}\n{err}"
            # The rows so far (at least the table's head), and why the rest are not there.
            assert "advice  " in out and "check-advice: interrupted" in err, f"{phase}:\n{out}\n{err}"
            # Stopped where it was: the interrupted copy, pack or re-run is no row of the table.
            assert not [x for x in out.splitlines() if x.startswith(rows[phase])], f"{phase}:\n{out}"
            assert leftovers(scratch) == [], phase
            gone(tmp_path)


def test_a_second_interrupt_exits_at_once_and_a_kill_leaves_nothing_running(tmp_path):
    src, mnt, scratch, deaf = tmp_path / "src", tmp_path / "mnt", tmp_path / "tmp", tmp_path / "deaf.py"
    slow_demo(src)
    scratch.mkdir()
    deaf.write_text(DEAF)
    with slowfs.mounted(src, mnt, open_ms=20):
        # A re-run of a program deaf to Ctrl-C: the second Ctrl-C (after the first's grace)
        # ends pipeprof at once, its children with it.
        proc, lines = start(tmp_path, mnt, [sys.executable, deaf])
        during(tmp_path, proc, lines, "re-run")
        until("the re-run's program deaf to Ctrl-C", lambda: ignores_ctrl_c(tmp_path), proc)
        proc.send_signal(signal.SIGINT)
        while proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass
        rc, out, err = ended(proc, lines)
        assert rc == 130 and "second interrupt: exiting now" in err, f"{rc}\n{out}\n{err}"
        assert leftovers(scratch) == []
        gone(tmp_path)

        # SIGKILL during a re-run: its children end with it; its folder stays ...
        proc, lines = start(tmp_path, mnt, [sys.executable, EXAMPLE])
        during(tmp_path, proc, lines, "re-run")
        proc.kill()
        killed = proc.pid
        ended(proc, lines)
        gone(tmp_path)
        left = leftovers(scratch)
        assert len(left) == 1 and f"-{proc.pid}-" in left[0], left
        # ... until the next --check-advice, which removes it (the pid is dead) and says so.
        proc, lines = start(tmp_path, mnt, [sys.executable, EXAMPLE])
        until("the sweep", lambda: lines.has("run 1/"), proc)
        proc.send_signal(signal.SIGTERM)
        rc, out, err = ended(proc, lines)
        assert f"removed {scratch / left[0]}, left by a --check-advice (pid {killed}) that was killed" in err, err
        assert rc == 143 and leftovers(scratch) == [], f"{rc}\n{err}"
        gone(tmp_path)
