"""Keras on TensorFlow against the script's own clock and counters: the corpus scripts
(python/corpus/) that time each epoch and training step themselves (their `TimeHistory`
callback, `--clock FILE`) run under `pipeprof run --once --summary`, and every number pipeprof
reports of them is checked against what the script measured in the same run: training steps,
images an epoch, each epoch's time (Keras's epoch begin to end, ±10%), the mean step time with
the first step (the compile) left out (±10%), the accuracy shown only where the model has one,
the loader's thread rows. TensorFlow runs from its own environment (PIPEPROF_TF_PYTHON);
without it these tests fail, they never skip."""

import json
import re
import subprocess

import pytest
from conftest import HANG_S, REPO, corpus_env, count, pipeprof_bin
from test_keras_tf import tf_python

CORPUS = REPO / "python" / "corpus"
TOLERANCE = 0.10


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """The runs' environment: the generated data in a folder of the tests', one thread for
    TensorFlow's math (two cores)."""
    threads = dict(OMP_NUM_THREADS="1", TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2")
    make = "import _data; _data.image_folder(); _data.segmentation_folder()"
    return corpus_env(tmp_path_factory, tf_python(), make, threads, KERAS_BACKEND="tensorflow")


def profiled(name, env, tmp_path, *args):
    """`pipeprof run --once --summary S -- python CORPUS/name.py --clock C ARGS`: (summary,
    the script's own clock, the report)."""
    summary, clock = tmp_path / "s.json", tmp_path / "clock.json"
    cmd = [pipeprof_bin(), "run", "--once", "--no-gpu", "--summary", summary, "--", tf_python(), CORPUS / f"{name}.py", "--clock", clock, *args]
    try:
        p = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, env=env, cwd=tmp_path, timeout=3 * HANG_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"did not end: {cmd}\n{e.stdout}\n{e.stderr}")
    assert p.returncode == 0, p.stderr[-3000:] + p.stdout[-3000:]
    return json.loads(summary.read_text()), json.loads(clock.read_text()), p.stdout + p.stderr


def near(got, truth, what):
    assert truth > 0 and abs(got - truth) <= TOLERANCE * truth, f"{what}: pipeprof {got:.4f}, the script's own {truth:.4f}"


def assert_steps_and_epochs(s, clock, epochs):
    """Steps, images an epoch and each epoch's time as the script counted and timed them."""
    assert s["steps"] == clock["steps"], (s["steps"], clock["steps"])
    rows = s["epochs"]
    assert len(rows) == epochs == len(clock["epoch_s"]), (rows, clock["epoch_s"])
    assert [e["images"] for e in rows] == [clock["images_per_epoch"]] * epochs, rows
    for e, truth in zip(rows, clock["epoch_s"]):
        near(e["seconds"], truth, f"epoch {e['epoch']}'s time")


def assert_step_time(s, clock):
    """The mean step time, the first step (tracing and compiling the step function) left out
    as a one-off, against the script's own mean of the others."""
    split = s["split"]
    assert split.get("startup_compute_ms") is not None, split
    rest = clock["step_s"][1:]
    near(split["mean_step_ms"], 1000 * sum(rest) / len(rest), "mean step time")


def test_one_step_epochs_have_keras_epoch_and_step_times(env, tmp_path):
    # Six epochs of one step each (307 training images, batches of 512): each epoch's only
    # step record is its end, and a trace window holds one step.
    s, clock, out = profiled("keras_one_step_epochs", env, tmp_path, "--epochs", "6")
    assert_steps_and_epochs(s, clock, 6)
    assert_step_time(s, clock)
    # Every step has its time: the windows' (wait and compute) or apportioned by their share.
    assert count(s, "compute") == s["steps"] and count(s, "wait") == s["steps"], s["stages"]
    # The model has an accuracy metric (named "acc"): shown.
    assert not s["settings"].get("no_accuracy"), s["settings"]


def test_a_tf_data_read_decode_resize_map_has_its_steps_epochs_and_stages(env, tmp_path):
    # 128 PNG files in batches of 16: 8 steps an epoch.
    s, clock, out = profiled("tf_read_decode_map", env, tmp_path, "--epochs", "3")
    assert_steps_and_epochs(s, clock, 3)
    assert_step_time(s, clock)
    for name in ("read", "decode", "resize"):
        assert count(s, name) > 0, (name, s["stages"])


def test_a_sequence_without_super_init_is_one_loader_row_and_shows_no_accuracy(env, tmp_path):
    # 112 training pairs in batches of 16: 7 steps an epoch, each batch read in tf.data's
    # threads (no workers), where Python makes a new thread object for every call.
    s, clock, out = profiled("keras_sequence_no_super", env, tmp_path, "--epochs", "2")
    assert_steps_and_epochs(s, clock, 2)
    assert s["settings"]["workers"] == 0, s["settings"]
    rows = s["loader_threads"]
    names = [t["name"] for t in rows]
    assert names.count("tf.data (PyDataset)") == 1 and "other threads" not in names, rows
    row = next(t for t in rows if t["name"] == "tf.data (PyDataset)")
    # Each batch: 16 images and 16 masks, each read, decoded and resized. One start per
    # thread of tf.data's that ran batches (a few), not one per batch.
    batches = row["spans"] // (3 * 2 * 16)
    assert batches >= 2 * 7 and row["starts"] <= batches // 2, row
    # Every loader span of the run is on a named row: tf.data's, or the training thread's
    # (Keras reads a batch or two there to learn the shapes).
    loaded = sum(count(s, n) for n in ("read", "decode", "resize"))
    assert sum(t["spans"] for t in rows if t["name"] != "tf.data (trace)") == loaded, (rows, s["stages"])
    # Compiled without an accuracy metric: no accuracy, not 0%.
    assert s["settings"].get("no_accuracy") is True, s["settings"]
    table = out[out.index("accuracy") :]
    assert re.search(r"^1\s+7\s+112\s+[0-9.]+\s+-\s", table, re.M), table[:600]
    assert "0.0%" not in table.split("\n\n")[0], table[:600]
