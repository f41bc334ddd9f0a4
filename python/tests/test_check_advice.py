"""`pipeprof run --check-advice`: the user's own PyTorch script run again with each piece of
advice applied through the start-up hook (pipeprof._override), on real torchvision."""

import json
import re
import subprocess
import sys
import textwrap

from conftest import HANG_S, pipeprof_bin, verdict_errors
from test_frameworks import env_for

# Prints what the DataLoader was built with, then counts the training batches it takes.
PROBE = """
    import sys
    import torch
    from torch.utils.data import DataLoader, TensorDataset, BatchSampler, SequentialSampler

    ds = TensorDataset(torch.randn(400, 4), torch.zeros(400, dtype=torch.long))
    loader = DataLoader(ds, 10, shuffle=False, num_workers=1, persistent_workers=False)
    fixed = DataLoader(ds, batch_sampler=BatchSampler(SequentialSampler(ds), 3, False))
    print("loader", loader.num_workers, loader.persistent_workers, loader.prefetch_factor, loader.pin_memory, loader.batch_size)
    with torch.no_grad():  # a look at a batch, no training step
        print("fixed", fixed.batch_size, len(next(iter(fixed))[0]))
    model = torch.nn.Linear(4, 2)
    steps = 0
    for epoch in range(3):
        for xs, ys in loader:
            model(xs).sum().backward()
            steps += 1
    print("done:", steps, "steps")
"""


def run_checked(tmp_path, cmd, check=None):
    """`pipeprof run` of CMD with PIPEPROF_CHECK set to CHECK (unset when None), as check-advice
    re-runs it: (stdout, summary)."""
    env = env_for(tmp_path)
    env.pop("PIPEPROF_CHECK", None)
    if check is not None:
        env["PIPEPROF_CHECK"] = json.dumps(check)
    s = tmp_path / "s.json"
    p = subprocess.run(
        [pipeprof_bin(), "run", "--once", "--no-gpu", "--summary", str(s), "--", *map(str, cmd)],
        capture_output=True,
        text=True,
        env=env,
        timeout=HANG_S,
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr + p.stdout
    return p.stdout, json.loads(s.read_text())


def run_probe(tmp_path, check=None):
    script = tmp_path / "probe.py"
    script.write_text(textwrap.dedent(PROBE))
    return run_checked(tmp_path, [sys.executable, script], check)


def test_the_hook_sets_the_loader_arguments_and_stops_after_the_steps(tmp_path):
    knobs = {"num_workers": 2, "persistent_workers": True, "prefetch_factor": 3, "pin_memory": True, "batch_size": 5}
    out, s = run_probe(tmp_path, dict(knobs, steps=7))
    assert "loader 2 True 3 True 5" in out, out
    # A batch sampler sets its own batches: batch_size is left alone there.
    assert "fixed None 3" in out, out
    assert "done:" not in out, "the program went on past its 7 steps:\n" + out
    assert s["steps"] == 7, s["steps"]
    assert s["settings"]["workers"] == 2 and s["settings"]["pin_memory"] is True, s["settings"]


def test_without_the_check_the_program_runs_as_written(tmp_path):
    out, s = run_probe(tmp_path)
    assert "loader 1 False 2 False 10" in out, out
    assert "fixed None 3" in out, out
    assert "done: 120 steps" in out, out
    assert s["steps"] == 120 and s["settings"]["workers"] == 1, s["settings"]


def test_a_loader_left_without_workers_drops_the_arguments_only_workers_take(tmp_path):
    # The baseline sets nothing; a check that sets only the batch keeps the program's workers.
    out, _ = run_probe(tmp_path, {"batch_size": 20, "steps": 4})
    assert "loader 1 False 2 False 20" in out, out
    from pipeprof import _override

    args = {"num_workers": 2, "persistent_workers": True, "prefetch_factor": 4, "batch_size": 8, "batch_sampler": None}
    assert _override.apply(args, {"num_workers": 0})["persistent_workers"] is False
    assert args["prefetch_factor"] is None


# A PyTorch script whose samples come from a slow drive: each waits 4 ms off-CPU (a network
# mount's latency), then is built. Its loader is blocked, not short of cores, so the workers
# advice comes whatever else holds the machine's cores. (The torchvision ImageFolder run, whose
# advice depends on the cores free, is docs/predictions-and-calibration.md's calibration.)
SLOW_SAMPLES = """
    import time
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Dataset

    class Remote(Dataset):
        def __len__(self):
            return 240
        def __getitem__(self, i):
            time.sleep(0.004)
            return torch.full((3, 16, 16), float(i % 4)), i % 4

    torch.set_num_threads(1)
    loader = DataLoader(Remote(), batch_size=8, shuffle=True, num_workers=0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for xs, ys in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(xs), ys).backward()
        opt.step()
"""


def test_check_advice_re_runs_a_real_pytorch_script_with_each_loader_change(tmp_path):
    script = tmp_path / "slow_samples.py"
    script.write_text(textwrap.dedent(SLOW_SAMPLES))
    cmd = [
        pipeprof_bin(), "run", "--once", "--no-gpu", "--check-advice", "--steps", "10", "--json", "--",
        sys.executable, str(script),
    ]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, env=env_for(tmp_path), timeout=4 * HANG_S, cwd=tmp_path)
    assert p.returncode == 0, p.stderr + p.stdout
    # --json: stdout is the document alone; the report and the table go to stderr.
    doc = json.loads(p.stdout)
    assert verdict_errors(doc) == [], verdict_errors(doc)
    out = p.stderr
    assert "running the program again" in out, out
    # No --summary: the run's own copy lives in a private folder removed after the re-runs,
    # so no line points at it.
    assert "summary written to" not in p.stderr + out, p.stderr
    table = out[out.index("advice  ") :].splitlines()
    assert "predicted ×" in table[0] and "measured images/s" in table[0], out
    # The rows: up to the blank line under the table (the notes and warnings follow it).
    rows = []
    for line in table[1:]:
        if not line.strip():
            break
        rows.append(line)
    assert rows[0].startswith("as run (no change)"), out
    # A loader blocked on its samples with no workers: the workers advice is re-run.
    workers = [r for r in rows if r.startswith("DataLoader(..., num_workers=")]
    assert workers, out
    for r in rows:
        assert "failed" not in r, out
        # A × measured while other programs held cores is in brackets: still a measurement.
        nums = re.findall(r"(\d+\.\d)\s+\(?(\d+\.\d\d)×\)?\s*$", r)
        assert nums and float(nums[0][0]) > 0, f"no measured images/s in {r!r}:\n{out}"
    # The document says what the table says: the workers advice measured, the same ×.
    checked = [a for a in doc["advice"] if a["change"]["kind"] == "workers"]
    assert checked and checked[0]["measured"]["status"] == "measured", doc["advice"]
    times = re.findall(r"(\d+\.\d\d)×\)?\s*$", workers[0])
    assert f"{checked[0]['measured']['speedup']:.2f}" == times[0], (workers[0], checked[0])
    assert checked[0]["command"] in workers[0], (workers[0], checked[0])


def test_check_advice_refuses_a_program_whose_input_is_a_pipe(tmp_path):
    p = subprocess.run(
        [pipeprof_bin(), "run", "--once", "--no-gpu", "--check-advice", "--", sys.executable, "-c", "pass"],
        input="data the program would read once",
        capture_output=True,
        text=True,
        env=env_for(tmp_path),
        timeout=HANG_S,
        cwd=tmp_path,
    )
    assert p.returncode != 0
    assert "standard input here is a pipe" in p.stderr, p.stderr


def test_the_hook_sets_keras_pydataset_workers_and_stops_fit_after_the_steps(tmp_path):
    from test_frameworks import KERAS

    out, summary = run_checked(tmp_path, [sys.executable, KERAS, "--epochs", "2"], {"num_workers": 2, "steps": 4})
    # The script asks for no workers and 2 epochs of 7 batches: the hook gave it 2, and 4 steps.
    assert summary["settings"]["workers"] == 2, summary["settings"]
    assert summary["steps"] == 4, summary["steps"]
    assert "Epoch 2/2" not in out, out
