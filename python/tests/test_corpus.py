"""The ground-truth corpus (python/corpus/): every script, written the way the common public
training scripts are, runs under `pipeprof run --once` as it runs alone: it exits 0, its final
metric line has the same metric names as without pipeprof, and the run's summary has a verdict.

Each runs on a small budget of its own arguments (one epoch, a few batches), so that the
program still reaches its final line. TensorFlow scripts run with the TensorFlow environment's
python (PIPEPROF_TF_PYTHON); a missing framework fails, never skips."""

import json
import re
import subprocess
import sys

import pytest
from conftest import HANG_S, REPO, corpus_env, count, pipeprof_bin, stage
from test_keras_tf import tf_python

CORPUS = REPO / "python" / "corpus"
SCRIPTS = sorted(p.stem for p in CORPUS.glob("[!_]*.py"))

# Each script's small budget, in its own arguments: one epoch, a few batches.
QUICK = {
    "mnist_in_memory": ["--epochs", "1", "--limit-batches", "20"],
    "imagenet_folder": ["--epochs", "1", "--limit-batches", "3", "-j", "1"],
    "dcgan": ["--niter", "1", "--limit-batches", "3", "--workers", "1"],
    "super_resolution": ["--nEpochs", "1", "--limit-batches", "3", "--threads", "1"],
    "timm_prefetcher": ["--epochs", "1", "--limit-batches", "3", "-j", "1"],
    "lightning_module": ["--epochs", "1", "--limit-batches", "3", "--num-workers", "1"],
    "keras_numpy_fit": ["--epochs", "1", "--steps-per-epoch", "3"],
    "keras_tfdata_map": ["--epochs", "1", "--steps-per-epoch", "2", "--blurs", "1"],
    "tf_image_data_generator": ["--epochs", "1", "--steps-per-epoch", "2"],
    "keras_pydataset_masks": ["--epochs", "1", "--steps-per-epoch", "2"],
    "accelerate_no_grad_eval": ["--epochs", "2"],
    "hf_datasets_imagefolder": ["--epochs", "1"],
    "cv2_albumentations_masks": ["--epochs", "1"],
    "keras_sequence_no_super": ["--epochs", "1", "--steps-per-epoch", "2"],
    "keras_one_step_epochs": ["--epochs", "2"],
    "tf_read_decode_map": ["--epochs", "1"],
    "tf_heavy_map_cpu": ["--epochs", "1", "--steps-per-epoch", "3", "--blurs", "2"],
    "fastai_datablock": ["--epochs", "1"],
}


def header(name):
    """The `# corpus: key=value ...` line of a script, as a dict."""
    first = (CORPUS / f"{name}.py").read_text().splitlines()[0]
    assert first.startswith("# corpus: "), f"{name}.py: the first line is not its corpus header: {first!r}"
    return dict(kv.split("=", 1) for kv in first.removeprefix("# corpus: ").split())


def interpreter(name):
    kind = header(name).get("python")
    assert kind in ("torch", "jax", "tf"), f"{name}.py: python={kind!r} is not torch, jax or tf"
    return tf_python() if kind == "tf" else sys.executable


def metric_names(line):
    """The words of a metric line, numbers (timings, values) left out."""
    return re.findall(r"[A-Za-z_][A-Za-z_@.]*", line)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """The environment of every run: the generated images, made once, in a folder of the test's."""
    # One thread for the frameworks' math: two cores, and the loader's workers beside it.
    threads = dict(OMP_NUM_THREADS="1", XLA_FLAGS="--xla_cpu_multi_thread_eigen=false", TF_CPP_MIN_LOG_LEVEL="2")
    make = "import _data; _data.image_folder(); _data.segmentation_folder()"
    return corpus_env(tmp_path_factory, sys.executable, make, threads)


def test_every_script_has_a_budget_and_a_header():
    assert len(SCRIPTS) >= 10, SCRIPTS
    assert sorted(QUICK) == SCRIPTS, "each corpus script needs its small budget in QUICK"
    for name in SCRIPTS:
        assert int(header(name).get("steps", "0")) > 0, f"{name}.py: no steps= in its header"
        interpreter(name)


def run(cmd, env, cwd):
    try:
        p = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, env=env, cwd=cwd, timeout=HANG_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"did not end in {HANG_S} s: {cmd}\n{e.stdout}\n{e.stderr}")
    return p


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_corpus_script_runs_under_pipeprof_as_it_runs_alone(name, env, tmp_path):
    cmd = [interpreter(name), CORPUS / f"{name}.py", *QUICK[name]]
    plain = run(cmd, env, tmp_path)
    assert plain.returncode == 0, f"{name} fails without pipeprof:\n{plain.stderr[-3000:]}"
    lines = [x for x in plain.stdout.splitlines() if x.strip()]
    assert lines and re.search(r"\d", lines[-1]), f"{name}: no final metric line:\n{plain.stdout}"
    final = metric_names(lines[-1])

    summary = tmp_path / "s.json"
    under = run([pipeprof_bin(), "run", "--once", "--no-gpu", "--summary", summary, "--", *cmd], env, tmp_path)
    assert under.returncode == 0, f"{name} fails under pipeprof:\n{under.stderr[-3000:]}"
    shapes = [metric_names(x) for x in under.stdout.splitlines()]
    assert final in shapes, f"{name}: its final line {lines[-1]!r} is missing under pipeprof:\n{under.stdout}"
    s = json.loads(summary.read_text())
    assert s.get("verdict") and s["verdict"].get("limiter"), f"{name}: no verdict in the summary: {s.get('verdict')}"
    assert s["steps"] > 0, f"{name}: pipeprof saw no training step"


def counted(stdout):
    """The script's own counters: its `counted: key=value ...` line, as numbers (a value of
    several, `epoch_s=3.1,2.9`, as a list of them)."""
    line = next((x for x in stdout.splitlines() if x.startswith("counted: ")), None)
    assert line, f"no counted: line in\n{stdout}"
    pairs = (kv.split("=") for kv in line.removeprefix("counted: ").split())
    return {k: [float(x) for x in v.split(",")] if "," in v else float(v) for k, v in pairs}


def check_epoch_times(c, s):
    """Each epoch's time in the summary is the script's own clock of it (`epoch_s`: from the top
    of its epoch loop, before the loader's iterator is made, to the end of its eval pass),
    within ±10%: the loader's start and the first batch's wait are the epoch's."""
    theirs = c["epoch_s"] if isinstance(c["epoch_s"], list) else [c["epoch_s"]]
    ours = [e["seconds"] for e in s["epochs"]]
    assert len(ours) == len(theirs), (ours, theirs)
    for o, t in zip(ours, theirs):
        assert abs(o - t) <= 0.1 * t, f"epoch seconds {ours} against the script's own {theirs}"


def test_accelerate_batches_training_steps_and_eval_are_the_scripts_own(env, tmp_path):
    # accelerate's DataLoaderShard: its batch size is its batch sampler's (the loader's own
    # batch_size is None), it reads one batch ahead, and the eval loop's no_grad() wraps the
    # forward only. Every number against the script's own counters.
    epochs = 2
    c, s = run_counted("accelerate_no_grad_eval", ["--epochs", epochs], env, tmp_path)
    assert s["settings"].get("batch_size") == c["batch_size"], s["settings"]
    # Training: the optimizer's steps and their images, the partial last batch and the batch
    # drawn ahead included; nothing of the eval loop.
    assert (s["steps"], s["images"]) == (c["train_steps"], c["train_images"]), (s["steps"], s["images"], c)
    assert len(s["epochs"]) == epochs, s["epochs"]
    assert [e["steps"] for e in s["epochs"]] == [c["train_steps"] / epochs] * epochs, s["epochs"]
    assert [e["images"] for e in s["epochs"]] == [c["train_images"] / epochs] * epochs, s["epochs"]
    # Eval apart: one validate span per eval batch, one compute per training step, and the
    # images evaluated counted in their epochs' rows.
    assert count(s, "validate") == c["eval_batches"], s["stages"]
    assert sum(e.get("val_images", 0) for e in s["epochs"]) == c["eval_images"], s["epochs"]
    assert count(s, "compute") == c["train_steps"], s["stages"]
    # Each training step's compute holds the body that trained on its batch (the read-ahead
    # moves no boundary): the median compute is at least the median body the script timed.
    assert stage(s, "compute")["p50_ms"] >= c["body_p50_ms"], (stage(s, "compute"), c)
    check_epoch_times(c, s)


def stage_names(s):
    return {x["stage"] for x in s["stages"]}


def run_counted(name, args, env, tmp_path):
    """The script under `pipeprof run --once`: its own counters and the run's summary."""
    summary = tmp_path / "s.json"
    cmd = [pipeprof_bin(), "run", "--once", "--no-gpu", "--summary", summary, "--"]
    p = run([*cmd, sys.executable, CORPUS / f"{name}.py", *args], env, tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    return counted(p.stdout), json.loads(summary.read_text())


def test_hf_datasets_rows_are_decoded_and_transformed_in_stages_by_kind(env, tmp_path):
    # 🤗 datasets: the Image feature decodes each row with PIL inside Dataset.__getitems__ (one
    # call for the batch), with_transform runs a torchvision Compose; the eval loop's no_grad()
    # wraps the forward only.
    c, s = run_counted("hf_datasets_imagefolder", ["--epochs", "2"], env, tmp_path)
    assert s["settings"].get("batch_size") == c["batch_size"], s["settings"]
    assert (s["steps"], s["images"]) == (c["train_steps"], c["train_images"]), (s["steps"], s["images"], c)
    assert count(s, "validate") == c["eval_batches"], s["stages"]
    assert sum(e.get("val_images", 0) for e in s["epochs"]) == c["eval_images"], s["epochs"]
    names = stage_names(s)
    assert {"read", "decode", "resize", "augment", "convert", "collate"} <= names, names
    # The samples' stages cover the batch: no fetch span of its own.
    assert "fetch" not in names, names
    check_epoch_times(c, s)


def test_cv2_and_albumentations_are_stages_by_kind(env, tmp_path):
    # cv2.imread/cvtColor in a custom Dataset, an albumentations Compose: decode, convert, and
    # each transform by kind (Resize; HorizontalFlip and RandomBrightnessContrast; Normalize and
    # ToTensorV2), not one fetch.
    c, s = run_counted("cv2_albumentations_masks", ["--epochs", "2"], env, tmp_path)
    assert s["settings"].get("batch_size") == c["batch_size"], s["settings"]
    assert (s["steps"], s["images"]) == (c["train_steps"], c["train_images"]), (s["steps"], s["images"], c)
    names = stage_names(s)
    assert {"decode", "resize", "augment", "convert", "collate"} <= names, names
    assert "fetch" not in names, names
    # Every batch's samples were timed: one collate per batch, a decode per picture and mask.
    assert count(s, "collate") == c["train_steps"], s["stages"]
    assert count(s, "decode") == 2 * c["train_images"], s["stages"]
    check_epoch_times(c, s)
