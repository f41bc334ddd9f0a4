"""``%load_ext pipeprof`` and ``%%pipeprof`` as notebook users meet them: real notebooks run
headless by nbclient in a real Jupyter kernel (ipykernel), on real PyTorch and Keras (JAX).

Each notebook saves the framework functions pipeprof's hooks replace before loading the
extension, and checks after each profiled cell that they are torch's (Keras's, PIL's) own
again and that no function of pipeprof's is left in any of their modules or classes; the
test reads those checks, the cells' outputs and the reports' summaries. scripts/test.sh
installs ipykernel and nbclient; without them these tests fail (they never skip)."""

import asyncio
import html
import inspect
import json
import os
import subprocess
import sys

import nbformat
import pytest
from conftest import HANG_S, count, pipeprof_bin
from nbclient import NotebookClient

#: A notebook cell's stdout line the test reads: the cell's checks as JSON.
CHECKED = "pipeprof-test-check "

#: Run after each profiled cell: what pipeprof left in the kernel.
CHECK = """
import json as _json, os as _os, sys as _sys, types as _types

def _pipeprof_left():
    # Every function of a pipeprof module, or method made by its extension, still in a
    # framework module or class, or in one of the notebook's classes.
    left = []
    for _name, _mod in list(_sys.modules.items()):
        if _mod is None or _name.partition(".")[0] not in ("torch", "torchvision", "PIL", "keras", "__main__"):
            continue
        _spaces = [(_name, vars(_mod))]
        _spaces += [(f"{_name}.{_k}", vars(_v)) for _k, _v in list(vars(_mod).items()) if issubclass(type(_v), type)]
        for _where, _ns in _spaces:
            for _k, _v in list(_ns.items()):
                if type(_v) is _types.FunctionType and str(_v.__globals__.get("__name__")).startswith("pipeprof"):
                    left.append(f"{_where}.{_k}")
                elif type(_v) is _types.MethodDescriptorType and "pipeprof" in (_v.__doc__ or ""):
                    left.append(f"{_where}.{_k}")
    return sorted(set(left))

print(PIPEPROF_TEST_CHECK + _json.dumps({
    "left": [w for w in _pipeprof_left() if not w.startswith("__main__._pipeprof_left")],
    "originals": sorted(k for k, (owner, name, f) in ORIGINALS.items() if getattr(owner, name) is not f),
    "role": pipeprof.role(),
    "env": sorted(k for k in _os.environ if k.startswith("PIPEPROF_")),
    "pythonpath": _os.environ.get("PYTHONPATH"),
    "meta_path": [type(f).__module__ for f in _sys.meta_path if type(f).__module__.startswith("pipeprof")],
    "excepthook": _sys.excepthook == EXCEPTHOOK,
    "last": {"steps": pipeprof.last().summary["steps"], "interrupted": pipeprof.last().interrupted},
}), flush=True)
"""

#: The first cell's common part: what the checks compare with, saved before the extension loads.
START = """
import os, sys
import pipeprof
PIPEPROF_TEST_CHECK = {checked!r}
EXCEPTHOOK = sys.excepthook
BEFORE = {{"pythonpath": os.environ.get("PYTHONPATH")}}
print(PIPEPROF_TEST_CHECK + __import__("json").dumps({{"before": BEFORE}}), flush=True)
"""

TORCH_START = """
import torch
from torch import nn
from torch.utils.data import DataLoader
import torch.utils.data._utils.fetch as fetch
import torch.optim.optimizer as optimizer
import PIL.Image, PIL.ImageFile
from torchvision import datasets, transforms
torch.set_num_threads(1)
ORIGINALS = {
    "DataLoader.__iter__": (DataLoader, "__iter__", DataLoader.__iter__),
    "_BaseDataLoaderIter.__next__": (torch.utils.data.dataloader._BaseDataLoaderIter, "__next__",
                                     torch.utils.data.dataloader._BaseDataLoaderIter.__next__),
    "_MapDatasetFetcher.fetch": (fetch._MapDatasetFetcher, "fetch", fetch._MapDatasetFetcher.fetch),
    "torch.autograd.backward": (torch.autograd, "backward", torch.autograd.backward),
    "torch.compile": (torch, "compile", torch.compile),
    "PIL.Image.open": (PIL.Image, "open", PIL.Image.open),
    "PIL.Image.Image.convert": (PIL.Image.Image, "convert", PIL.Image.Image.convert),
    "PIL.ImageFile.ImageFile.load": (PIL.ImageFile.ImageFile, "load", PIL.ImageFile.ImageFile.load),
    "Compose.__call__": (transforms.Compose, "__call__", transforms.Compose.__call__),
}
OPTIMIZER_HOOKS = (dict(optimizer._global_optimizer_pre_hooks), dict(optimizer._global_optimizer_post_hooks))
"""

TORCH_MODEL = """
# Decode and resize on the training thread (num_workers=0), a small CNN: the loader limits.
tf = transforms.Compose([transforms.Resize((32, 32)), transforms.ToTensor()])
ds = datasets.ImageFolder({data!r}, transform=tf)
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(128, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.01)

def train(epochs, stop_mark=None):
    loader = DataLoader(ds, batch_size=8, shuffle=True)
    step = 0
    for epoch in range(epochs):
        for xs, ys in loader:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(xs), ys)
            loss.backward()
            opt.step()
            step += 1
            if step == stop_mark:
                print("pipeprof-test: training", flush=True)
"""

TORCH_AFTER = """
print(PIPEPROF_TEST_CHECK + __import__("json").dumps({"optimizer_hooks": [
    dict(optimizer._global_optimizer_pre_hooks) == OPTIMIZER_HOOKS[0],
    dict(optimizer._global_optimizer_post_hooks) == OPTIMIZER_HOOKS[1]]}), flush=True)
"""

KERAS_START = """
import numpy as np
import keras
from keras.src.trainers import epoch_iterator
ORIGINALS = {
    "Model.fit": (keras.Model, "fit", keras.Model.fit),
    "EpochIterator.__init__": (epoch_iterator.EpochIterator, "__init__", epoch_iterator.EpochIterator.__init__),
}
"""

KERAS_MODEL = """
# The TensorFlow quick-start MLP, on NumPy arrays in memory (random "digits", no download).
rng = np.random.default_rng(0)
ys = rng.integers(0, 10, 2048)
xs = (rng.random((2048, 784)) * 0.5 + ys[:, None] / 20.0).astype("float32")
model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(128, activation="relu"),
                          keras.layers.Dense(10, activation="softmax")])
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])

class Digits(keras.utils.PyDataset):
    # The notebook's own data set class: pipeprof times its __getitem__ while a cell runs.
    def __len__(self):
        return 16
    def __getitem__(self, i):
        return xs[i * 32:(i + 1) * 32], ys[i * 32:(i + 1) * 32]

ORIGINALS["Digits.__getitem__"] = (Digits, "__getitem__", Digits.__getitem__)
"""


class Client(NotebookClient):
    """nbclient's client, interrupting the kernel (as Jupyter's interrupt button does: SIGINT
    to the kernel's process group) when a cell prints ``interrupt_on``: the cell is then
    known to be inside its training loop, with no time guessed."""

    interrupt_on = None

    def output(self, outs, msg, display_id, cell_index):
        text = msg["content"].get("text", "") if msg["msg_type"] == "stream" else ""
        if self.interrupt_on and self.interrupt_on in text:
            self.interrupt_on = None
            sent = self.km.interrupt_kernel()
            if inspect.isawaitable(sent):
                asyncio.ensure_future(sent)
        return super().output(outs, msg, display_id, cell_index)


def kernel_env(tmp_path, **extra):
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env = dict(os.environ, XDG_RUNTIME_DIR=str(runtime), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **extra)
    for k in [k for k in env if k.startswith("PIPEPROF_")]:
        del env[k]
    # One thread for XLA's math: on a 2-core machine spinning threads swing step times.
    env["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false"
    return env


def execute(tmp_path, cells, env, interrupt_on=None):
    """Runs the cells in a new kernel; the executed notebook."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    client = Client(nb, timeout=HANG_S, kernel_name="python3", allow_errors=True, resources={"metadata": {"path": str(tmp_path)}})
    client.interrupt_on = interrupt_on
    client.execute(env=env)
    return nb


def checks(cell):
    """The JSON objects a cell printed on its check line."""
    lines = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream").splitlines()
    return [json.loads(line[len(CHECKED):]) for line in lines if line.startswith(CHECKED)]


def errors(cell):
    return [o for o in cell.outputs if o.output_type == "error"]


def report_outputs(cell):
    """The cell's report outputs (text/html): its result, or the one shown before its error."""
    return [o for o in cell.outputs if o.output_type in ("execute_result", "display_data") and "text/html" in o.data]


def live_lines(cell):
    return [o for o in cell.outputs if o.output_type == "display_data" and "text/html" not in o.data]


def assert_profiled_cell(cell, summary, *, error=None):
    """One report output (HTML, with its text form) and one live line, however long the cell
    ran: the line was updated in place, never added to."""
    assert [e.ename for e in errors(cell)] == ([error] if error else []), cell.outputs
    reports = report_outputs(cell)
    assert len(reports) == 1, cell.outputs
    page = html.unescape(html.unescape(reports[0].data["text/html"]))
    assert summary["verdict"]["headline"] in page, page[:2000]
    # The HTML report's own fragment, its charts drawn as SVG: not the <pre> fallback.
    assert 'class="pipeprof"' in page and "<svg" in page, page[:2000]
    assert "── pipeprof report" in reports[0].data["text/plain"][:200], reports[0].data["text/plain"][:200]
    lines = live_lines(cell)
    assert len(lines) == 1, cell.outputs
    # The line's last text is the run's own numbers.
    assert lines[0].data["text/plain"].startswith(f"pipeprof: step {summary['steps']} ·"), lines[0].data


def assert_hooks_off(check, before):
    assert check["left"] == [], check["left"]
    assert check["originals"] == [], check["originals"]
    assert check["role"] == "off"
    assert check["env"] == []
    assert check["pythonpath"] == before["pythonpath"]
    # No post-import finder of pipeprof's left (the frameworks add their own).
    assert check["meta_path"] == []
    assert check["excepthook"] is True


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """An ImageFolder: 3 classes × 32 JPEG images of noise, 256×256 (decoding each costs
    more than the small CNN's step on it)."""
    from PIL import Image

    root = tmp_path_factory.mktemp("imgs")
    for c in range(3):
        d = root / f"class{c}"
        d.mkdir()
        for i in range(32):
            Image.effect_noise((256, 256), 40 + i + 8 * c).convert("RGB").save(d / f"{i}.jpg", quality=90)
    return root


def test_pytorch_notebook_run_twice_then_interrupted(tmp_path, images):
    s = [tmp_path / f"s{i}.json" for i in range(3)]
    cells = [
        START.format(checked=CHECKED) + TORCH_START + "\n%load_ext pipeprof",
        TORCH_MODEL.format(data=str(images)),
        f"%%pipeprof --no-gpu --summary {s[0]}\ntrain(2)",
        CHECK + TORCH_AFTER,
        f"%%pipeprof --no-gpu --summary {s[1]}\ntrain(1)",
        CHECK,
        f"%%pipeprof --no-gpu --summary {s[2]}\ntrain(10**6, stop_mark=8)",
        CHECK + TORCH_AFTER,
    ]
    nb = execute(tmp_path, cells, kernel_env(tmp_path), interrupt_on="pipeprof-test: training")
    for i in (0, 1, 3, 5, 7):
        assert errors(nb.cells[i]) == [], nb.cells[i].outputs
    before = checks(nb.cells[0])[0]["before"]
    first, second, stopped = (json.loads(p.read_text()) for p in s)

    # Twice: each report is its own run's (96 images an epoch, 12 steps of 8).
    for summary, epochs in ((first, 2), (second, 1)):
        assert summary["steps"] == 12 * epochs and summary["images"] == 96 * epochs, summary["steps"]
        assert summary["settings"]["framework"] == "pytorch" and summary["settings"]["batch_size"] == 8
        assert summary["settings"]["workers"] == 0
        for stage in ("read", "decode", "resize", "convert"):
            assert count(summary, stage) == 96 * epochs, (stage, summary["stages"])
        assert count(summary, "compute") == 12 * epochs
        # Decoding and resizing on the training thread limit it.
        assert summary["verdict"]["limiter"] == "Preprocess", summary["verdict"]
        assert [t["name"] for t in summary["loader_threads"]] == ["MainThread"], summary["loader_threads"]
    assert_profiled_cell(nb.cells[2], first)
    assert_profiled_cell(nb.cells[4], second)
    after_first, after_second = checks(nb.cells[3]), checks(nb.cells[5])
    assert_hooks_off(after_first[0], before)
    assert after_first[1]["optimizer_hooks"] == [True, True]
    assert_hooks_off(after_second[0], before)
    assert (after_first[0]["last"]["steps"], after_second[0]["last"]["steps"]) == (24, 12)

    # Interrupted: the report of what ran, the hooks off, the KeyboardInterrupt raised.
    assert_profiled_cell(nb.cells[6], stopped, error="KeyboardInterrupt")
    assert report_outputs(nb.cells[6])[0].data["text/plain"].startswith("pipeprof: interrupted: the report covers what ran")
    assert stopped["steps"] >= 8 and count(stopped, "decode") >= 8 * 8, stopped["steps"]
    assert stopped.get("failed") is None, stopped["failed"]
    after_stop = checks(nb.cells[7])
    assert_hooks_off(after_stop[0], before)
    assert after_stop[0]["last"] == {"steps": stopped["steps"], "interrupted": True}
    assert after_stop[1]["optimizer_hooks"] == [True, True]

    # The text form is `pipeprof report SUMMARY`'s.
    text = subprocess.run([pipeprof_bin(), "report", str(s[1])], capture_output=True, text=True, check=True).stdout
    assert report_outputs(nb.cells[4])[0].data["text/plain"].rstrip("\n") == text.rstrip("\n")


def test_keras_notebook_twice_and_a_failing_cell(tmp_path):
    s = [tmp_path / f"s{i}.json" for i in range(3)]
    cells = [
        START.format(checked=CHECKED) + KERAS_START + "\n%load_ext pipeprof",
        KERAS_MODEL,
        f"%%pipeprof --no-gpu --summary {s[0]}\nmodel.fit(xs, ys, batch_size=32, epochs=2, verbose=0)",
        CHECK,
        f"%%pipeprof --no-gpu --summary {s[1]}\nmodel.fit(Digits(), epochs=1, verbose=0)\nraise ValueError('the cell failed here')",
        CHECK,
    ]
    nb = execute(tmp_path, cells, kernel_env(tmp_path, KERAS_BACKEND="jax"))
    for i in (0, 1, 3, 5):
        assert errors(nb.cells[i]) == [], nb.cells[i].outputs
    before = checks(nb.cells[0])[0]["before"]
    arrays, failed = (json.loads(p.read_text()) for p in s[:2])

    # The quick-start MLP: 2048 samples, 64 steps of 32 an epoch, sliced from memory.
    assert arrays["steps"] == 128 and arrays["images"] == 4096, arrays["steps"]
    assert arrays["settings"]["framework"] == "keras" and arrays["settings"]["batch_size"] == 32
    assert count(arrays, "fetch") == 128 and count(arrays, "wait") == 128 and count(arrays, "compute") == 128
    # A tiny model on arrays in memory: the fixed cost of each step, not the data.
    assert arrays["verdict"]["limiter"] == "Overhead", arrays["verdict"]
    assert arrays.get("failed") is None
    assert_profiled_cell(nb.cells[2], arrays)
    assert_hooks_off(checks(nb.cells[3])[0], before)

    # The second run is its own (16 batches of the notebook's PyDataset, each a fetch), and the
    # cell's exception is the run's failure, then raised as without pipeprof.
    assert failed["steps"] == 16 and count(failed, "fetch") == 16, failed["stages"]
    assert failed["failed"].startswith("ValueError: the cell failed here"), failed["failed"]
    err = errors(nb.cells[4])
    assert err and err[0].evalue == "the cell failed here"
    assert_profiled_cell(nb.cells[4], failed, error="ValueError")
    after = checks(nb.cells[5])[0]
    assert_hooks_off(after, before)
    assert after["last"] == {"steps": 16, "interrupted": False}


def test_a_profiled_stretch_puts_cv2_and_albumentations_back_as_they_were():
    # The cv2/albumentations hooks (_cv2) are in place inside `pipeprof.profile()` (a cell's
    # stretch) and gone after it: their packages are among _arming's frameworks.
    code = """
import cv2, albumentations as A, pipeprof
before = (cv2.imread, cv2.resize, A.BasicTransform.__call__)
with pipeprof.profile(live=False, no_gpu=True):
    inside = (cv2.imread, cv2.resize, A.BasicTransform.__call__)
after = (cv2.imread, cv2.resize, A.BasicTransform.__call__)
print([a is not b for a, b in zip(inside, before)], [a is b for a, b in zip(after, before)])
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().splitlines()[-1] == "[True, True, True] [True, True, True]", p.stdout + p.stderr


def test_import_pipeprof_imports_no_ipython():
    code = "import sys, pipeprof; print('IPython' in sys.modules, 'pipeprof.notebook' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


@pytest.mark.parametrize(
    "text, numbers",
    [
        (
            '# TYPE pipeprof_steps counter\npipeprof_steps_total{program="notebook",rank="0"} 12\n'
            'pipeprof_images_per_second{program="notebook",rank="0"} 345.5\n'
            'pipeprof_limiter{program="notebook",rank="0",limiter="io"} 0\n'
            'pipeprof_limiter{program="notebook",rank="0",limiter="preprocess"} 1\n# EOF\n',
            {"steps": 12, "images_per_second": 345.5, "limiter": "preprocess"},
        ),
        # A distributed run: the whole run's series ("all"), not a rank's.
        (
            'pipeprof_steps_total{program="p",rank="1"} 5\npipeprof_steps_total{program="p",rank="all"} 9\n'
            'pipeprof_limiter{program="p",rank="1",limiter="io"} 1\npipeprof_limiter{program="p",rank="all",limiter="overhead"} 1\n',
            {"steps": 9, "limiter": "overhead"},
        ),
        # A program name with a brace or quote in it, a value that does not read: left out.
        ('pipeprof_steps_total{program="a}\\"b",rank="0"} 3\npipeprof_images_per_second{rank="0"} NaNx\n', {"steps": 3}),
        ("", {}),
    ],
)
def test_the_live_line_reads_the_whole_runs_numbers(text, numbers):
    from pipeprof import _live

    assert _live.parse_metrics(text) == numbers


def test_the_live_line_says_step_rate_and_limiter():
    from pipeprof import _live

    got = _live.line({"steps": 12, "images_per_second": 345.54, "limiter": "not_enough_data"})
    assert got == "pipeprof: step 12 · 345.5 images/s · limited by: not enough data"
