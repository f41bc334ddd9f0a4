"""The PyTorch DataLoader wrapper driven by a stand-in for torch (the wrapper needs only
iteration and ``.to``): its stages and steps arrive through attach. The real frameworks are
tested in test_frameworks.py."""

import json

from conftest import count

TORCH = """
    import json, sys, types
    import pipeprof, pipeprof.torch

    syncs = []
    fake_torch = types.ModuleType("torch")
    fake_torch.cuda = types.SimpleNamespace(synchronize=lambda: syncs.append(1))
    sys.modules["torch"] = fake_torch  # what `import torch` finds inside the wrapper

    class Tensor:
        def __init__(self, shape, device="cpu"):
            self.shape, self.device = shape, device
        def to(self, device, non_blocking=False):
            return Tensor(self.shape, device)

    inits = []
    class Loader:
        # What the wrapper uses of a DataLoader: iteration, len, num_workers, worker_init_fn.
        num_workers = 2
        def __init__(self):
            self.worker_init_fn = inits.append
        def __iter__(self):
            return iter([(Tensor((4, 3, 8, 8)), Tensor((4,))) for _ in range(5)])
        def __len__(self):
            return 5

    addr = pipeprof.init(program="pytest-torch", settings={"batch_size": 4}, sample=False)
    print("attach:", addr, flush=True)
    pipeprof.wait_for_clients(1)
    loader = pipeprof.torch.profile(Loader(), device="cuda:0", sync=True)
    devices = []
    for epoch in range(2):
        for xs, ys in loader:
            devices.append((xs.device, ys.device))
            loader.report(loss=0.5, correct=3)
    loader.loader.worker_init_fn(3)      # what a worker process runs first
    checks = {
        "devices": sorted(set(devices)),
        "syncs": len(syncs),
        "inner_init_called": inits,
        "process_name": pipeprof._process_name,
        "len": len(loader),
        # The loader's own attributes through the wrapper.
        "num_workers": loader.num_workers,
        "wrapped_init": type(loader.worker_init_fn).__name__,
    }
    pipeprof.finish()
    print(json.dumps(checks), flush=True)
"""


def test_dataloader_wrapper_times_wait_transfer_compute_and_reports_steps(scenario):
    run = scenario(TORCH)
    s, out, err = run.attach()
    assert s["steps"] == 10 and s["images"] == 40, s
    # One wait per batch plus the one that found each epoch's end.
    assert count(s, "wait") == 12 and count(s, "transfer") == 10 and count(s, "compute") == 10
    assert [e["epoch"] for e in s["epochs"]] == [1, 2]
    assert s["last_loss"] == 0.5 and s["epochs"][0]["accuracy"] == 0.75
    code, out, err = run.wait()
    assert code == 0, err
    checks = json.loads(out.strip().splitlines()[-1])
    assert checks["devices"] == [["cuda:0", "cuda:0"]]
    assert checks["syncs"] == 20, "after each transfer and each step's compute"
    assert checks["inner_init_called"] == [3] and checks["process_name"] == "loader-3"
    assert checks["len"] == 5
    assert checks["num_workers"] == 2 and checks["wrapped_init"] == "NameWorker"
