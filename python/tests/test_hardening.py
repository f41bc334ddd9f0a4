"""How a Python run ends or is reached: a diverging loss is data, not a broken stream;
`wait_for_clients` takes any timeout; over TCP only a viewer with the run's token gets in."""

import math
import subprocess

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
