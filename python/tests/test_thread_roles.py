"""A loader worker's role is given where it is named (`worker=`), never read from its name: it
crosses from a worker process and from a pool thread into the run, and the trace keeps it."""

import json

ROLES = """
    import multiprocessing as mp
    import threading
    import pipeprof

    def process_worker(k):
        pipeprof.name_process(f"loader-{k}", worker=k)
        for i in range(5):
            with pipeprof.span("decode", sample=i):
                pass

    def pool_worker():
        pipeprof.name_thread("fetcher", worker=7)
        with pipeprof.span("decode", sample=0):
            pass

    def named_like_a_worker():
        pipeprof.name_thread("loader-9")
        with pipeprof.span("decode", sample=0):
            pass

    if __name__ == "__main__":
        addr = pipeprof.init(program="pytest-roles", settings={"workers": 1}, sample=False)
        print("attach:", addr, flush=True)
        pipeprof.wait_for_clients(1)
        p = mp.get_context("fork").Process(target=process_worker, args=(2,), name="w")
        p.start()
        p.join()
        assert p.exitcode == 0
        for f in (pool_worker, named_like_a_worker):
            t = threading.Thread(target=f)
            t.start()
            t.join()
        with pipeprof.span("wait", step=0):
            pass
        pipeprof.step(0, images=1)
        pipeprof.finish(workers_timeout=60)
"""


def test_a_workers_role_crosses_into_the_run_and_its_trace(scenario):
    run = scenario(ROLES)
    trace = run.tmp / "t.json"
    s, _, err = run.attach("--trace", str(trace))
    assert "run ended" in err, err
    events = json.loads(trace.read_text())["traceEvents"]
    roles = {e["args"]["name"]: e["args"].get("role") for e in events if e.get("name") == "thread_name"}
    process = [n for n in roles if n.startswith("loader-2 (pid ")]
    assert len(process) == 1, roles
    assert roles[process[0]] == {"loader": {"worker": 2, "generation": 0}}, roles
    assert roles["fetcher"] == {"loader": {"worker": 7, "generation": 0}}, roles
    # A name is only a name: no role is made up from it.
    assert roles["loader-9"] is None, roles
    assert roles["MainThread"] is None, roles
    code, _, err = run.wait()
    assert code == 0, err
