"""How a Python run ends or is reached: a diverging loss is data, not a broken stream;
`wait_for_clients` takes any timeout; over TCP only a viewer with the run's token gets in; a
neighbour who made the runtime folder first does not stop a profile; a process forked from a
worker ends on its own SIGTERM, never its parent."""

import math
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from conftest import HANG_S, pipeprof_bin

DIVERGING = """
    import pipeprof

    addr = pipeprof.init(program="diverging", settings={"batch_size": 4}, sample=False)
    print("attach:", addr, flush=True)
    # No deadline: must wait, not panic.
    assert pipeprof.wait_for_clients(1, timeout=float("inf"))
    for step, loss in enumerate([2.0, 1.5, 1e39, float("nan"), 0.5, float("-inf")]):
        with pipeprof.span("compute", step=step):
            pass
        pipeprof.step(step, images=4, loss=loss, correct=1)
    pipeprof.finish()
"""


def test_an_inf_or_nan_loss_arrives_and_the_report_says_training_diverged(scenario):
    run = scenario(DIVERGING)
    s, out, err = run.attach()
    assert "run ended" in err and "bad data" not in err, err
    assert s["steps"] == 6, s
    # 1e39 overflows f32: inf from step 2; NaN from step 3.
    assert s["diverged"] == {"first_nan": 3, "first_inf": 2}, s["diverged"]
    assert s["last_loss"] == "-inf"
    assert math.isnan(float(s["epochs"][0]["loss"]))
    assert "loss is NaN from step 3 (inf at 2): training diverged" in out, out
    assert run.wait()[0] == 0


NO_DEADLINES = """
    import pipeprof

    addr = pipeprof.init(program="timeouts", sample=False)
    # Nobody attaches: NaN and negative timeouts do not wait, a huge one is not a crash.
    assert pipeprof.wait_for_clients(1, timeout=float("nan")) is False
    assert pipeprof.wait_for_clients(1, timeout=-5) is False
    print("attach:", addr, flush=True)
    assert pipeprof.wait_for_clients(1, timeout=1e300)
    pipeprof.finish()
"""


def test_wait_for_clients_takes_nan_negative_and_huge_timeouts(scenario):
    run = scenario(NO_DEADLINES)
    s, _, err = run.attach()
    assert "run ended" in err, err
    code, out, err = run.wait()
    assert code == 0, err


OVER_TCP = """
    import os
    import pipeprof

    addr = pipeprof.init(program="tcp", listen="127.0.0.1:0", sample=False)
    print("attach:", addr, flush=True)
    print("token:", os.environ["PIPEPROF_TOKEN"], flush=True)
    assert pipeprof.wait_for_clients(1, timeout=float("inf"))
    pipeprof.step(0, images=4, loss=1.0)
    pipeprof.finish()
"""


def test_over_tcp_a_viewer_without_the_runs_token_is_refused(scenario):
    run = scenario(OVER_TCP)
    token = run.proc.stdout.readline().strip().removeprefix("token: ")
    assert len(token) == 32, token
    env = {k: v for k, v in run.env.items() if k != "PIPEPROF_TOKEN"}
    cmd = [pipeprof_bin(), "attach", run.address, "--once"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=HANG_S)
    assert p.returncode == 1 and "token" in p.stderr, p.stderr
    run.env["PIPEPROF_TOKEN"] = token
    s, _, err = run.attach()
    assert s["steps"] == 1, err
    assert run.wait()[0] == 0


# ---- A neighbour on the same machine (a second uid, played by root with setpriv) ----

#: The uid and gid of the second user of the machine in these tests (no account needed).
NEIGHBOUR = "4242"


def as_neighbour(*cmd):
    """``cmd`` run as a second user of the machine; needs root and setpriv (util-linux): fails
    without them, never skips."""
    assert os.geteuid() == 0, "run as root: a second uid (setpriv) plays the neighbour"
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) plays the neighbour: install it"
    return subprocess.run(
        [setpriv, "--reuid", NEIGHBOUR, "--regid", NEIGHBOUR, "--clear-groups", "--", *cmd],
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )


@pytest.fixture
def shared_tmp():
    """A temp folder shared as /tmp is (mode 1777), where the neighbour can reach it."""
    d = tempfile.mkdtemp(prefix="pp-shared-", dir="/tmp")
    os.chmod(d, 0o1777)
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


PROFILED = """
    import os, pipeprof
    from pipeprof import _native

    with pipeprof.profile(live=False, no_gpu=True) as p:
        print("address", os.environ[_native.PARENT_ENV], flush=True)
        pipeprof.step(0, images=4, loss=1.0)
    print("steps", p.report().summary["steps"], flush=True)
"""


def test_a_profile_runs_when_a_neighbour_made_the_runtime_folder_first(tmp_path, shared_tmp):
    # Issue 52 L2: `pipeprof.profile()` / `%%pipeprof` stopped with "not a private folder …
    # remove it" when another user had made `pipeprof-<uid>` in the temp folder first.
    squat = shared_tmp / f"pipeprof-{os.getuid()}"
    made = as_neighbour("mkdir", "-m", "0777", str(squat))
    assert made.returncode == 0, made.stderr
    script = tmp_path / "profiled.py"
    script.write_text(textwrap.dedent(PROFILED))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPEPROF_") and k != "XDG_RUNTIME_DIR"}
    env["TMPDIR"] = str(shared_tmp)
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=HANG_S)
    assert p.returncode == 0, p.stderr
    assert "steps 1" in p.stdout, p.stdout + p.stderr
    address = Path(p.stdout.split("address ", 1)[1].split()[0])
    folder = address.parent
    # Its socket was in a folder of ours, private, not the neighbour's; the folder stays.
    assert folder.parent == shared_tmp and folder != squat, address
    st = folder.lstat()
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700, st


FORKED_FROM_A_WORKER = """
    import os, signal
    from pipeprof import _native

    # A pool worker of a run: its SIGTERM handler installed (native, see python/src/term.rs).
    assert _native.flush_on_term()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        # A process it forks that never connects (its connect failed, or it is no worker). It
        # lets go of the test's pipes: their end is the worker's.
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.write(ready_w, b"x")
        while True:
            signal.pause()
    print("grandchild", pid, flush=True)
    assert os.read(ready_r, 1) == b"x"
    os.kill(pid, signal.SIGTERM)
    _, status = os.waitpid(pid, 0)
    print("grandchild ended by signal", os.WTERMSIG(status) if os.WIFSIGNALED(status) else None, flush=True)
"""


def test_sigterm_to_a_process_forked_from_a_worker_ends_it_and_not_the_worker(tmp_path):
    # Issue 52 L3: the grandchild inherited the worker's handler and pipe: its SIGTERM woke the
    # worker's thread, which ended the worker, while the grandchild went on.
    script = tmp_path / "forked.py"
    script.write_text(textwrap.dedent(FORKED_FROM_A_WORKER))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPEPROF_")}
    cmd = [sys.executable, str(script)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        out, err = proc.communicate(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    grandchild = int(out.split("grandchild ", 1)[1].split()[0]) if "grandchild " in out else None
    try:
        assert proc.returncode == 0, (proc.returncode, out, err)
        assert f"grandchild ended by signal {signal.SIGTERM.value}" in out, out + err
    finally:
        if grandchild is not None:
            try:
                os.kill(grandchild, signal.SIGKILL)
            except ProcessLookupError:
                pass
