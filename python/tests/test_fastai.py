"""fastai under `pipeprof run`, checked against the corpus script's own counters
(python/corpus/fastai_datablock.py: a `DataBlock` → `TfmdDL`, `vision_learner`, `learn.fit`).

fastai's DataLoader is no torch DataLoader: it makes torch's iterator itself over a stand-in
that holds its real worker count, builds each batch in its own generator (PIL opens and
decodes in `PILImage.create`, then `Resize` and `ToTensor` per item), steps an optimizer of its
own and returns its loss as a `TensorBase`. Every number the report shows of it is checked
here: the batch size, the training steps and images, the epochs, the loader's workers, the
stages, the loss, the validation batches, the program's CPU and memory. fastai missing fails,
never skips (scripts/test.sh installs it)."""

import json
import math
import sys

from conftest import count, pipeprof_bin
from test_corpus import (  # noqa: F401 (env: the fixture)
    CORPUS,
    check_epoch_times,
    counted,
    env,
    run,
    run_counted,
    stage_names,
)


def check_numbers(c, s, epochs):
    """What every run of the script must show, against its own counters."""
    assert s["settings"].get("batch_size") == c["batch_size"], s["settings"]
    assert s["settings"].get("workers") == c["num_workers"], s["settings"]
    # Training: the optimizer's steps and their images; nothing of the validation pass.
    assert (s["steps"], s["images"]) == (c["train_steps"], c["train_images"]), (s["steps"], s["images"], c)
    assert [(e["steps"], e["images"]) for e in s["epochs"]] == [
        (c["train_steps"] / epochs, c["train_images"] / epochs)
    ] * epochs, s["epochs"]
    # Each epoch's time is the script's own (fastai's before_epoch to after_epoch).
    check_epoch_times(c, s)
    # Validation (under no_grad): its own rows, one per batch.
    assert count(s, "validate") == c["valid_batches"], s["stages"]
    assert count(s, "compute") == c["train_steps"], s["stages"]
    # fastai's loss (a TensorBase) is read: each epoch's is a number within the range of the
    # losses the script saw, not "-".
    for e in s["epochs"]:
        assert not e.get("no_loss") and math.isfinite(e["loss"]), s["epochs"]
        assert c["loss_min"] - 1e-3 <= e["loss"] <= c["loss_max"] + 1e-3, (e, c)
    # The items are opened, decoded, resized and converted, then collated once a batch.
    names = stage_names(s)
    assert {"read", "decode", "resize", "convert", "collate"} <= names, names
    assert "fetch" not in names, names
    batches = c["train_steps"] + c["valid_batches"]
    assert count(s, "collate") == batches, s["stages"]
    # The machine figures are the program's: CPU within the cores, memory the script's own
    # (its main process alone holds more than pipeprof's), not pipeprof's.
    m = s["machine"]
    assert 0 < m["process_cpu_peak_pct"] <= m["cores"] * 100, m
    assert m["rss_peak_bytes"] >= 0.8 * c["maxrss_mb"] * 2**20, (m["rss_peak_bytes"], c["maxrss_mb"])
    assert m["rss_peak_bytes"] > 10 * m["host_rss_peak_bytes"], m


def test_fastai_workers_batches_stages_and_loss_are_the_scripts_own(env, tmp_path):  # noqa: F811
    epochs = 2
    args = ["--epochs", epochs, "--num-workers", 2]
    c, s = run_counted("fastai_datablock", args, env, tmp_path)
    check_numbers(c, s, epochs)
    # The patches change nothing the program computes: seeded, its losses and its final line
    # are those of the same script run without pipeprof.
    plain = run([sys.executable, CORPUS / "fastai_datablock.py", *args], env, tmp_path)
    assert plain.returncode == 0, plain.stderr[-3000:]
    alone = counted(plain.stdout)
    assert (alone["loss_min"], alone["loss_max"]) == (c["loss_min"], c["loss_max"]), (alone, c)
    # Each worker process made batches: its spans, under its own name.
    workers = {t["name"] for t in s["loader_threads"] if t["spans"] > 0}
    assert workers == {"loader-0", "loader-1"}, s["loader_threads"]
    # The optimizer is fastai's own: its step is timed, and the model's size read from it.
    assert count(s, "optimizer") == c["train_steps"], s["stages"]
    assert s["settings"].get("params", 0) > 0, s["settings"]


def test_fastai_without_workers_decodes_on_the_training_thread(env, tmp_path):  # noqa: F811
    epochs = 1
    c, s = run_counted("fastai_datablock", ["--epochs", epochs, "--num-workers", 0], env, tmp_path)
    check_numbers(c, s, epochs)
    # No worker process: the items are made on the training thread, inside its next().
    assert not [t for t in s["loader_threads"] if t["name"].startswith("loader-")], s["loader_threads"]


def test_a_check_advice_rerun_sets_the_fastai_loaders_arguments_and_stops_after_its_steps(env, tmp_path):  # noqa: F811
    # What `--check-advice` asks of a re-run (PIPEPROF_CHECK): fastai's loader is no torch
    # DataLoader, yet its workers and batch size are the re-run's, and the program stops after
    # the steps asked (the look at one batch before training is none of them).
    e = dict(env, PIPEPROF_CHECK=json.dumps({"num_workers": 0, "batch_size": 8, "steps": 3}))
    summary = tmp_path / "s.json"
    cmd = [pipeprof_bin(), "run", "--once", "--no-gpu", "--summary", summary, "--"]
    script = [sys.executable, CORPUS / "fastai_datablock.py", "--epochs", 2, "--num-workers", 2]
    p = run([*cmd, *script], e, tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    # The program's own look at a batch says what its loader was built with.
    assert "a batch: images (8, 3, 64, 64)" in p.stdout, p.stdout
    s = json.loads(summary.read_text())
    assert (s["settings"].get("workers"), s["settings"].get("batch_size")) == (0, 8), s["settings"]
    assert (s["steps"], s["images"]) == (3, 24), (s["steps"], s["images"])
    assert not [t for t in s["loader_threads"] if t["name"].startswith("loader-")], s["loader_threads"]
