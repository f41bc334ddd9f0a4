"""Worker processes (fork and spawn) send their spans into the parent's run; one that
dies or stops does not stall the parent."""

import pytest

from conftest import count

WORKERS = """
    import multiprocessing as mp
    import sys
    import pipeprof

    def burn(n):
        x = 0
        for i in range(n):
            x ^= i * 31
        return x

    def work(k, n):
        for i in range(n):
            with pipeprof.span("read", sample=i):
                burn(1000)
            with pipeprof.span("decode", sample=i):
                burn(30000)

    if __name__ == "__main__":
        ctx = mp.get_context(sys.argv[1])
        addr = pipeprof.init(program="pytest-workers", settings={"workers": 2}, sample=False)
        print("attach:", addr, flush=True)
        pipeprof.wait_for_clients(1)
        ps = [ctx.Process(target=work, args=(k, 25), name=f"loader-{k}") for k in range(2)]
        for p in ps:
            p.start()
        for p in ps:
            p.join()
        assert [p.exitcode for p in ps] == [0, 0]
        with pipeprof.span("wait", step=0):
            pass
        with pipeprof.span("compute", step=0):
            pass
        pipeprof.step(0, images=50)
        pipeprof.finish(workers_timeout=60)
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_worker_process_spans_arrive_per_worker(scenario, method):
    run = scenario(WORKERS, args=[method])
    s, out, err = run.attach()
    assert "run ended" in err, err
    assert count(s, "decode") == 50 and count(s, "read") == 50, s["stages"]
    names = sorted(s["threads"].values())
    workers = [n for n in names if n.startswith("loader-")]
    assert len(workers) == 2 and all(" (pid " in n for n in workers), names
    # Per worker (one row each, named for the worker), with its on/off-CPU split.
    per = {w["name"]: w for w in s["loader_threads"]}
    assert sorted(per) == ["loader-0", "loader-1"], per
    for w in per:
        assert per[w]["spans"] == 50, per
        assert per[w]["on_cpu"] is not None and 0 < per[w]["on_cpu"] <= 1, per
    code, _, err = run.wait()
    assert code == 0, err


DYING = """
    import multiprocessing as mp
    import os
    import signal
    import pipeprof

    def die(ready):
        for i in range(10):
            with pipeprof.span("decode", sample=i):
                pass
        pipeprof.flush()
        ready.set()
        os.kill(os.getpid(), signal.SIGKILL)

    def stop(ready):
        with pipeprof.span("decode", sample=99):
            pass
        pipeprof.flush()
        ready.set()
        # Alive, connected and silent for ever: the parent must not wait for it.
        os.kill(os.getpid(), signal.SIGSTOP)

    if __name__ == "__main__":
        ctx = mp.get_context("fork")
        addr = pipeprof.init(program="pytest-dying", sample=False)
        print("attach:", addr, flush=True)
        pipeprof.wait_for_clients(1)
        ready = [ctx.Event(), ctx.Event()]
        dead = ctx.Process(target=die, args=(ready[0],), name="loader-dies")
        stopped = ctx.Process(target=stop, args=(ready[1],), name="loader-stops")
        dead.start()
        stopped.start()
        for r in ready:
            r.wait()
        dead.join()
        assert dead.exitcode == -signal.SIGKILL
        for step in range(5):
            with pipeprof.span("wait", step=step):
                pass
            with pipeprof.span("compute", step=step):
                pass
            pipeprof.step(step, images=1)
        pipeprof.finish(workers_timeout=0.2)
        print("finished", flush=True)
        stopped.kill()
        stopped.join()
"""


def test_a_dead_or_stopped_worker_does_not_stall_the_parent(scenario):
    run = scenario(DYING)
    s, out, err = run.attach()
    assert "run ended" in err, err
    assert s["steps"] == 5 and count(s, "compute") == 5
    assert count(s, "decode") <= 11
    code, out, err = run.wait()
    assert code == 0 and "finished" in out, err
