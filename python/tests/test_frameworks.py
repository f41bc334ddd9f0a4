"""Real PyTorch, torchvision, Keras (JAX backend) under `pipeprof run`: unmodified scripts,
DataLoader workers (fork, spawn, persistent), a worker's exception, `break`, Ctrl-C, Keras
fit with validation and a multiprocessing PyDataset. scripts/test.sh installs the
frameworks into the test environment; without them these tests fail (they never skip)."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest
from conftest import HANG_S, REPO, count, pipeprof_bin, stage, verdict_errors

EXAMPLES = REPO / "python" / "examples"
TORCHVISION = EXAMPLES / "train_torchvision.py"
KERAS = EXAMPLES / "train_keras.py"


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """A small ImageFolder: 3 classes × 16 images, JPEG and PNG, 48×48."""
    from PIL import Image

    root = tmp_path_factory.mktemp("imgs")
    for c, colour in enumerate([(200, 30, 30), (30, 200, 30), (30, 30, 200)]):
        d = root / f"class{c}"
        d.mkdir()
        for i in range(16):
            img = Image.new("RGB", (48, 48), colour)
            img.putpixel((i, i), (255, 255, 255))
            img.save(d / f"{i}.{'jpg' if i % 2 else 'png'}")
    return root


def env_for(tmp_path):
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env = dict(os.environ, XDG_RUNTIME_DIR=str(runtime), PYTHONUNBUFFERED="1", KERAS_BACKEND="jax")
    for k in ("PIPEPROF_PARENT", "PIPEPROF_PARENT_PID", "PIPEPROF_MAIN_PID", "PIPEPROF_LISTEN"):
        env.pop(k, None)
    # One thread for the frameworks' math: on a 2-core machine spinning threads swing step times.
    env.update(OMP_NUM_THREADS="1", XLA_FLAGS="--xla_cpu_multi_thread_eigen=false")
    return env


def run(tmp_path, *cmd, check=True):
    """`pipeprof run --once --summary S -- CMD`: (exit code, summary or None, stdout, stderr)."""
    s = tmp_path / "s.json"
    if s.exists():
        s.unlink()
    p = subprocess.run(
        [pipeprof_bin(), "run", "--once", "--no-gpu", "--summary", str(s), "--", *map(str, cmd)],
        capture_output=True,
        text=True,
        env=env_for(tmp_path),
        timeout=HANG_S,
        cwd=tmp_path,
    )
    if check:
        assert p.returncode == 0, p.stderr + p.stdout
    summary = json.loads(s.read_text()) if s.exists() else None
    return p.returncode, summary, p.stdout, p.stderr


def test_run_json_prints_the_verdict_alone_on_stdout(tmp_path, images):
    """`pipeprof run --once --json`: stdout is one document that holds against the schema and
    says what the summary's verdict says; the script's own output and the report go to stderr."""
    s = tmp_path / "s.json"
    cmd = [pipeprof_bin(), "run", "--once", "--no-gpu", "--json", "--summary", str(s), "--",
           sys.executable, str(TORCHVISION), "--data", str(images), "--batch-size", "8"]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, env=env_for(tmp_path), timeout=HANG_S, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert verdict_errors(doc) == [], verdict_errors(doc)
    assert "done: " in p.stderr and "done: " not in p.stdout, "the script's stdout goes to stderr"
    assert "verdict: " in p.stderr, p.stderr
    saved = json.loads(s.read_text())
    assert doc["headline"] == saved["verdict"]["headline"]
    assert [e["text"] for e in doc["evidence"]] == saved["verdict"]["evidence"]
    assert doc["numbers"]["batch_size"] == 8 == saved["settings"]["batch_size"]
    assert doc["status"] == "verdict" and doc["limiter"] in ("io", "preprocess", "compute", "overhead", "balanced", "contention", "transfer")
    # The advice as data: each has its typed change and the code to copy.
    for a in doc["advice"]:
        assert a["change"]["kind"] and a["predicted"]["kind"] in ("point", "range", "floor", "not_predicted"), a


def loader_cpu_ns(s):
    return sum(x["total_ms"] * 1e6 * (x["on_cpu"] or 0) for x in s["stages"] if x["stage"] in ("read", "decode", "resize", "augment"))


@pytest.mark.parametrize(
    "extra",
    [[], ["--workers", "2"], ["--workers", "2", "--context", "spawn", "--persistent", "--epochs", "2"]],
    ids=["no-workers", "fork-2", "spawn-2-persistent"],
)
def test_unmodified_torchvision_script_is_profiled(tmp_path, images, extra):
    code, s, out, err = run(tmp_path, sys.executable, TORCHVISION, "--data", images, "--batch-size", "8", *extra)
    epochs = 2 if "--epochs" in extra else 1
    assert "done: " in out, "the script ran as without pipeprof"
    st = s["settings"]
    assert st["framework"] == "pytorch" and st["batch_size"] == 8 and st["images"] == 48, st
    assert st["workers"] == (2 if "--workers" in extra else 0)
    assert st["persistent_workers"] == ("--persistent" in extra)
    assert st["input"] == [3, 64, 64] and st["data"] == str(images)
    assert s["steps"] == 6 * epochs and s["images"] == 48 * epochs, s
    # Every sample was read, decoded and resized in the loader: 48 per epoch.
    for name in ("read", "decode", "resize", "augment"):
        assert count(s, name) == 48 * epochs, (name, s["stages"])
        # Each stage's off-CPU time splits into waiting for a core and blocked, measured.
        assert stage(s, name)["core_wait"] is not None, (name, s["stages"])
    assert count(s, "compute") == 6 * epochs
    assert count(s, "wait") >= 6 * epochs
    assert s["epochs"][0]["loss"] > 0 and s["settings"].get("no_accuracy") is True
    if "--workers" in extra:
        names = sorted(t["name"].split(" ")[0] for t in s["loader_threads"])
        assert names == ["loader-0", "loader-1"], s["loader_threads"]
        # The workers' CPU is the run's own, not "other programs".
        assert s["machine"]["process_cpu_ns"] >= loader_cpu_ns(s), s["machine"]
    # Advice speaks PyTorch, never a pipeprof flag the script does not have.
    for a in (s["verdict"] or {}).get("advice", []):
        assert not (a["command"] or "").startswith("--"), a


def test_break_out_of_the_loop_keeps_the_last_step(tmp_path, images):
    _, s, out, _ = run(tmp_path, sys.executable, TORCHVISION, "--data", images, "--batch-size", "8", "--workers", "2", "--steps", "3")
    assert "done: 3 steps" in out
    assert s["steps"] == 3 and count(s, "compute") == 3, s["stages"]


SLEEPY = """
    import time
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Remote(Dataset):
        # Samples fetched from somewhere slow: the thread sleeps, it does not compute.
        def __len__(self):
            return 16
        def __getitem__(self, i):
            time.sleep(0.03)
            return torch.zeros(3, 8, 8), 0

    for xs, ys in DataLoader(Remote(), batch_size=4, num_workers=1):
        (xs.sum() * 2).item()
"""


def test_a_sample_that_sleeps_is_blocked_not_waiting_for_a_core(tmp_path):
    # Neither PIL nor torchvision inside: the batch's samples are timed as one fetch, with the
    # thread's CPU and run-queue clocks, so its off-CPU time is measured as blocked, not guessed.
    script = tmp_path / "sleepy.py"
    script.write_text(textwrap.dedent(SLEEPY))
    _, s, _, _ = run(tmp_path, sys.executable, script)
    assert count(s, "decode") == 0, s["stages"]
    d = stage(s, "fetch")
    assert d["count"] == 4, s["stages"]
    assert d["on_cpu"] is not None and d["core_wait"] is not None, d
    blocked = 1.0 - d["on_cpu"] - d["core_wait"]
    assert blocked > d["core_wait"] and blocked > d["on_cpu"], d


IN_THREAD = """
    import torch
    from torch.utils.data import DataLoader, Dataset, TensorDataset

    class Batched(Dataset):
        # One call for the batch's samples: a fetch, its collate inside.
        def __len__(self):
            return 24
        def __getitems__(self, idx):
            return [(torch.zeros(4), 0) for _ in idx]

    net = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    plain = DataLoader(TensorDataset(torch.rand(40, 4), torch.zeros(40, dtype=torch.long)), batch_size=4)
    for epoch in range(2):
        for (x, y), (b, _) in zip(plain, DataLoader(Batched(), batch_size=4)):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x + b), y).backward()
            opt.step()
"""


def test_batches_made_on_the_training_thread_are_timed_with_their_step(tmp_path):
    # num_workers=0: a batch's fetch and collate are sent with the step that took it, in one
    # call; one batch in MAIN_TIMED_EVERY is timed, the clocks are read on a sample of those.
    from pipeprof._torch_fetch import MAIN_CLOCKS_EVERY, MAIN_TIMED_EVERY
    from pipeprof._torch_loop import LOSS_EVERY

    script = tmp_path / "in_thread.py"
    script.write_text(textwrap.dedent(IN_THREAD))
    _, s, _, _ = run(tmp_path, sys.executable, script)
    # zip stops at the shorter loader (6 batches) after taking the longer one's 7th: a batch
    # taken is a step, 7 an epoch, 6 of them trained.
    steps = 2 * 7
    assert s["steps"] == steps, s["steps"]
    # Each loader's `next()` is a wait of the step (the zipped one's 6 too). The optimizer is
    # timed on the sampled steps that train: each pass's first, every LOSS_EVERY-th, and its
    # last (the 7th, which does not train).
    sampled = [i for i in range(6) if i % LOSS_EVERY == 0]
    for name, n in [("wait", 2 * (7 + 6)), ("compute", steps), ("optimizer", 2 * len(sampled))]:
        assert count(s, name) == n, (name, s["stages"])
    # The batches in the order they are made: each epoch a plain one, then a `__getitems__`
    # one (its collate inside its fetch), ..., the plain loader's 7th. The n-th batch made in
    # the process is timed when n is a multiple of MAIN_TIMED_EVERY.
    made = (["plain", "getitems"] * 6 + ["plain"]) * 2
    timed = made[::MAIN_TIMED_EVERY]
    assert MAIN_CLOCKS_EVERY % MAIN_TIMED_EVERY == 0
    assert 0 < len(timed) < len(made)
    assert count(s, "fetch") == len(timed), s["stages"]
    assert count(s, "collate") == timed.count("plain"), s["stages"]
    f = stage(s, "fetch")
    # The first batch reads the clocks.
    assert f["on_cpu"] is not None, f


COMPILE_CHECK = """
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from pipeprof import _torch_loop

    net = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for x, y in DataLoader(TensorDataset(torch.rand(8, 4), torch.zeros(8, dtype=torch.long)), batch_size=4):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    print("asks torch.compiler:", _torch_loop._compiling is torch.compiler.is_compiling)
"""


def test_the_optimizer_hooks_ask_torch_whether_it_compiles(tmp_path):
    # The optimizer module is imported inside `import torch`, before torch.compiler exists:
    # the hooks find torch's question at their first step (a stand-in answering "no" would
    # let torch.compile trace into them).
    script = tmp_path / "compile_check.py"
    script.write_text(textwrap.dedent(COMPILE_CHECK))
    _, s, out, _ = run(tmp_path, sys.executable, script)
    assert "asks torch.compiler: True" in out, out
    # Two steps, one pass: both sampled (its first and its last), both timed.
    assert count(s, "optimizer") == 2, s["stages"]


FAILING = """
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Broken(Dataset):
        def __len__(self):
            return 64
        def __getitem__(self, i):
            if i == 37:
                raise ValueError(f"label file for sample {i} is corrupt")
            return torch.zeros(3, 8, 8), 0

    for xs, ys in DataLoader(Broken(), batch_size=8, num_workers=2):
        (xs.sum() * 2).item()
"""


def test_a_worker_exception_fails_the_run(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text(textwrap.dedent(FAILING))
    code, s, out, err = run(tmp_path, sys.executable, script, check=False)
    assert code == 1, err
    assert "ValueError" in s["failed"] and "label file for sample 37 is corrupt" in s["failed"], s["failed"]
    assert "exited with status 1" in s["failed"]
    assert "RUN FAILED" in err and "RUN FAILED" in out


def start(tmp_path, *cmd):
    return subprocess.Popen(
        [pipeprof_bin(), "run", "--once", "--no-gpu", "--summary", str(tmp_path / "s.json"), "--", *map(str, cmd)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env_for(tmp_path),
        cwd=tmp_path,
        start_new_session=True,
    )


def interrupt(p, to_group, started):
    """Waits for the line `started` matches, sends SIGINT, returns (code, stdout, stderr)."""
    seen = []
    for line in p.stdout:
        seen.append(line)
        if re.search(started, line):
            break
    else:
        pytest.fail("the script never started:\n" + "".join(seen) + p.stderr.read())
    if to_group:
        os.killpg(p.pid, signal.SIGINT)
    else:
        p.send_signal(signal.SIGINT)
    try:
        out, err = p.communicate(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail("pipeprof run did not end after Ctrl-C")
    return p.returncode, "".join(seen) + out, err


@pytest.mark.parametrize("to_group", [False, True], ids=["to-pid", "to-group"])
def test_ctrl_c_stops_a_torch_run_and_the_report_is_written(tmp_path, images, to_group):
    p = start(tmp_path, sys.executable, TORCHVISION, "--data", images, "--batch-size", "8", "--workers", "2", "--epochs", "1000")
    code, out, err = interrupt(p, to_group, r"step 10 ")
    assert code == 130, err
    assert "was interrupted" in err and "── pipeprof report" in out
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["steps"] >= 10 and "failed" not in s, s.get("failed")


def keras_history(out):
    """Keras's own per-epoch figures, as its verbose=2 lines print them."""
    # Keras prints an exact 0 as 0.0000e+00.
    num = r"([0-9.]+(?:e[-+][0-9]+)?)"
    rows = re.findall(rf"accuracy: {num} - loss: {num} - val_accuracy: {num} - val_loss: {num}", out)
    return [tuple(float(x) for x in r) for r in rows]


@pytest.mark.parametrize("workers", [0, 2], ids=["in-process", "multiprocessing-2"])
def test_keras_fit_with_validation_matches_keras_numbers(tmp_path, workers):
    code, s, out, err = run(
        tmp_path, sys.executable, KERAS, "--epochs", "2", "--images", "100", "--batch-size", "32", "--workers", str(workers)
    )
    history = keras_history(out)
    assert len(history) == 2, out
    assert s["settings"]["framework"] == "keras" and s["settings"]["batch_size"] == 32
    assert s["settings"]["input"] == [3, 32, 32]
    if workers:
        assert s["settings"]["workers"] == 2
    assert s["steps"] == 8
    if workers == 0:
        # 100 images a epoch in batches of 32: the last batch holds 4, and counts 4.
        assert [e["images"] for e in s["epochs"]] == [100, 100]
    # (A multiprocessing PyDataset may hand Keras one batch twice and skip another within an
    # epoch: Keras's own accuracy is over what it got, 128 or 72 images, and so is pipeprof's;
    # the figures below agree either way.)
    for e, (acc, loss, val_acc, val_loss) in zip(s["epochs"], history):
        assert abs(e["accuracy"] - acc) < 6e-4, (e, acc)
        assert abs(e["loss"] - loss) < 1e-3, (e, loss)
        assert abs(e["val_accuracy"] - val_acc) < 6e-4 and abs(e["val_loss"] - val_loss) < 1e-3, (e, val_acc, val_loss)
    # Validation is its own stage, never a wait; each training batch waited once.
    # The validation set (25 images) is one batch an epoch.
    assert count(s, "validate") == 2 and count(s, "compute") == 8 and count(s, "wait") == 8, s["stages"]
    assert stage(s, "wait")["total_ms"] < stage(s, "validate")["total_ms"] + stage(s, "compute")["total_ms"]


SPANS_IN_WORKERS = """
    import os, sys
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import keras, numpy as np, pipeprof

    LOG = sys.argv[1]

    class Data(keras.utils.PyDataset):
        def __len__(self):
            return 12
        def __getitem__(self, i):
            with pipeprof.span("decode", sample=i):
                xs = np.full((8, 4), i % 3, dtype="float32")
            # One line per call, whichever process made it.
            with open(LOG, "a") as f:
                f.write(f"{os.getpid()}\\n")
            return xs, np.full((8,), i % 3)

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    model.fit(Data(workers=2, use_multiprocessing=True), epochs=2, verbose=0)
    print("fit done", flush=True)
"""


def test_spans_made_in_keras_pool_workers_all_arrive(tmp_path):
    script, log = tmp_path / "spans.py", tmp_path / "calls.log"
    script.write_text(textwrap.dedent(SPANS_IN_WORKERS))
    code, s, out, err = run(tmp_path, sys.executable, script, log)
    calls = log.read_text().split()
    assert len(calls) >= 24 and len(set(calls)) >= 2, calls
    assert count(s, "decode") == len(calls), (count(s, "decode"), len(calls), err)


TERMINATED_IN_C = """
    import hashlib, multiprocessing as mp, signal, pipeprof

    def child(ready, disposition):
        with pipeprof.span("decode", sample=0):
            pass
        pipeprof.flush()
        disposition.put(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
        ready.set()
        # One C call of many minutes: a Python-level handler would wait for it to return.
        hashlib.pbkdf2_hmac("sha256", b"x", b"salt", 10**9)

    if __name__ == "__main__":
        ctx = mp.get_context("fork")
        ready, disposition = ctx.Event(), ctx.Queue()
        p = ctx.Process(target=child, args=(ready, disposition))
        p.start()
        dfl = disposition.get(timeout=60)
        ready.wait(60)
        p.terminate()
        p.join(60)  # a hang guard: the call alone runs for many minutes
        print("child exit", p.exitcode, "default disposition", dfl, flush=True)
        if p.exitcode is None:
            p.kill()
"""


def test_a_worker_in_a_long_c_call_ends_on_terminate_and_its_spans_arrive(tmp_path):
    # Issue 41 M6: the worker keeps SIG_DFL as Python sees it, dies of SIGTERM at once (not
    # when the C call returns), and what it sent before reaches the run.
    script = tmp_path / "term.py"
    script.write_text(textwrap.dedent(TERMINATED_IN_C))
    code, s, out, err = run(tmp_path, sys.executable, script)
    assert f"child exit {-signal.SIGTERM} default disposition True" in out, out + err
    assert count(s, "decode") == 1, (s["stages"], err)


def test_ctrl_c_stops_keras_fit(tmp_path):
    p = start(tmp_path, sys.executable, KERAS, "--epochs", "10000", "--images", "64", "--workers", "2")
    code, out, err = interrupt(p, True, r"Epoch 2/")
    # Keras's multiprocessing shutdown can hang after a Ctrl-C, with or without pipeprof (a
    # worker blocked writing a result nobody reads): then pipeprof ends the group after
    # --stop-timeout, says so, and the run is still an interruption with its report.
    escalated = "has not ended 30 s after the interrupt" in err
    assert code in ((143, 137) if escalated else (130, 1)), err
    assert "── pipeprof report" in out
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["steps"] >= 2 and "failed" not in s
