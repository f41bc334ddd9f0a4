"""Spans and steps made in Python arrive through `pipeprof attach`, with their fields,
thread CPU time and thread names; bad input is refused with a reason."""

import json
import threading

import pytest

import pipeprof
from conftest import count, stage

LOOP = """
    import threading
    import pipeprof

    addr = pipeprof.init(program="pytest-loop", settings={"workers": 2, "batch_size": 4}, sample=False)
    print("attach:", addr, flush=True)
    pipeprof.wait_for_clients(1)

    def burn(n):
        x = 0
        for i in range(n):
            x ^= i * 31
        return x

    @pipeprof.span("augment")
    def augment(x):
        return burn(x)

    def loader(k):
        pipeprof.name_thread(f"loader-{k}")
        for i in range(12):
            with pipeprof.span("read", sample=i):
                burn(2000)
            with pipeprof.span("decode", sample=i, bytes=100):
                burn(20000)
            augment(500)

    threads = [threading.Thread(target=loader, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for step in range(6):
        with pipeprof.span("wait", step=step):
            pass
        with pipeprof.span("compute", step=step):
            with pipeprof.span("forward", step=step):
                burn(1000)
        pipeprof.step(step, epoch=step // 3, images=4, loss=2.0 - step * 0.1, correct=step)
    pipeprof.finish()
"""


def test_spans_and_steps_arrive_through_attach(scenario):
    run = scenario(LOOP)
    s, out, err = run.attach()
    assert "run ended" in err, err
    assert "verdict:" in out, out
    assert s["steps"] == 6 and s["images"] == 24
    assert s["settings"]["batch_size"] == 4 and s["settings"]["model"] == "pytest-loop"
    for name, n in {"read": 24, "decode": 24, "augment": 24, "wait": 6, "compute": 6, "forward": 6}.items():
        assert count(s, name) == n, (name, s["stages"])
    assert stage(s, "decode")["bytes"] == 2400
    # Loader stages carry the thread's CPU time (busy loops: mostly on CPU); compute's
    # CPU runs elsewhere in a real framework, so it is not measured, as in Rust.
    assert stage(s, "decode")["on_cpu"] is not None and stage(s, "decode")["on_cpu"] > 0
    assert stage(s, "compute")["on_cpu"] is None
    assert len(s["epochs"]) == 2
    names = set(s["threads"].values())
    assert {"loader-0", "loader-1", "MainThread"} <= names, names
    assert run.wait()[0] == 0


def test_decorator_keeps_the_function_and_its_exceptions():
    @pipeprof.span("decode", sample=3)
    def decode(x):
        """Doc."""
        if x < 0:
            raise KeyError(x)
        return x * 2

    assert decode(21) == 42
    assert decode.__name__ == "decode" and decode.__doc__ == "Doc."
    with pytest.raises(KeyError):
        decode(-1)
    # A context manager too, and the exception passes through it.
    with pytest.raises(ZeroDivisionError):
        with pipeprof.span("read"):
            1 / 0


def test_bad_input_is_refused_with_a_reason():
    with pytest.raises(ValueError, match='unknown stage "dcode"; stages are read, fetch, decode'):
        pipeprof.span("dcode")
    with pytest.raises(OverflowError):
        pipeprof.span("read", sample=-1)
    sp = pipeprof.span("read")
    with sp:
        with pytest.raises(RuntimeError, match="already open"):
            sp.__enter__()
    with pytest.raises(ValueError, match="settings are not JSON"):
        pipeprof._native.init("x", "{not json")
    with pytest.raises(RuntimeError, match="call pipeprof.init"):
        pipeprof.wait_for_clients(1, timeout=0)
    assert pipeprof.role() == "off"
    assert pipeprof.STAGES[:8] == ("read", "fetch", "decode", "resize", "augment", "convert", "transform", "collate")


def test_spans_before_init_cost_nothing_and_go_nowhere():
    for i in range(100):
        with pipeprof.span("decode", sample=i):
            pass
    pipeprof.step(0, images=1, loss=float("nan"))
    assert pipeprof.dropped() == 0 and pipeprof.address() is None
