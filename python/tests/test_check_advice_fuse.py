"""`pipeprof run --check-advice` on a torchvision ImageFolder script whose folder is on a slow FUSE
mount (slowfs.py: latency per open and per read, as a network drive): the verdict is storage and
names the mount, and the re-runs read the folder from a local copy and from the packed file
(pipeprof._redirect), each a row of the table with its cost on a line of its own; the copy is gone
after, and the mount's files are as they were."""

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import slowfs
from conftest import HANG_S, pipeprof_bin
from test_frameworks import env_for
from test_keras_tf import tf_python

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_torchvision.py"
COPY_ROW = "copy the folder to a local temporary folder"
PACK_ROW = "pipeprof pack --size 64, read by PackedImageFolder"


def fingerprint(root):
    """Every file under ``root``: its path, size, modification time and content hash."""
    out = []
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            st = os.stat(path)
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            out.append((os.path.relpath(path, root), st.st_size, st.st_mtime_ns, digest))
    return sorted(out)


def row(out, label):
    """The table's line for ``label`` (a row starts with its label)."""
    lines = [line for line in out.splitlines() if line.startswith(label)]
    assert len(lines) == 1, f"no single row {label!r} in:\n{out}"
    return lines[0]


def test_check_advice_reads_a_slow_mount_from_a_local_copy_and_from_the_pack(tmp_path):
    src, mnt, scratch = tmp_path / "src", tmp_path / "mnt", tmp_path / "tmp"
    scratch.mkdir()
    slow_demo(src)
    before = fingerprint(src)
    env = env_for(tmp_path)
    # The re-runs' private folder (the copy, the pack) is made here, to be looked at after.
    env["TMPDIR"] = str(scratch)
    cmd = [pipeprof_bin(), "run", "--once", "--no-gpu", "--check-advice", "--steps", "8", "--"]
    cmd += [sys.executable, EXAMPLE, "--data", mnt, "--epochs", "6"]
    with slowfs.mounted(src, mnt):
        p = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, env=env, timeout=6 * HANG_S, cwd=tmp_path)
        through_mount = fingerprint(mnt)
    assert p.returncode == 0, p.stderr + p.stdout
    out = p.stdout
    # Storage, on the FUSE mount the program named.
    assert "verdict: I/O (storage)" in out, out
    assert re.search(rf"^\s+data\s+{re.escape(str(mnt))} on fuse", out, re.M), out
    assert "data on a network/FUSE filesystem (fuse)" in out, out
    # The hook timed the loader's work fed at the program's end: the copy and the pack are
    # predicted from it, not a floor.
    assert "CPU work counted fed, as the program's own data measured at its end" in out, out
    # A row each, predicted and measured (not skipped, not failed): the hook really read the
    # copy and the pack.
    for label in (COPY_ROW, PACK_ROW):
        line = row(out, label)
        assert not re.search(r"skipped|failed", line), line
        # predicted images/s (a number, or a range where the model is off today's rate),
        # predicted ×, measured images/s, measured ×; no floor ("≥"). A × measured while other
        # programs held cores (the mount's daemon, a busy CI machine) is in brackets: measured.
        assert re.search(r"\s(\d+\.\d|\d+–\d+)\s+(\d+\.\d\d|\d+\.\d–\d+\.\d)×\s+\d+\.\d\s+\(?\d+\.\d\d×\)?", line), line
    # The copy's and the pack's cost, each on its own line, with when it pays.
    assert re.search(r"^the copy took \d+\.\d s: (worth it after \d+ epochs?|never worth it)", out, re.M), out
    assert re.search(r"^the pack took \d+\.\d s: (worth it after \d+ epochs?|never worth it)", out, re.M), out
    # The private folder, the copy and the pack in it, are gone; the mount's files untouched.
    assert not [x.name for x in scratch.iterdir() if x.name.startswith("pipeprof-check-run-")]
    assert fingerprint(src) == before
    assert through_mount == before
    assert not slowfs.is_mounted(mnt)


# The hook's redirect alone, in a plain Python process (no run): what each reader returns.
REDIRECT = """
import json, sys
from pipeprof import _redirect, _state
r, why, case = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
_state.CHECK.asked = {"redirect": r, "why_file": why}
_state.CHECK.redirect = _redirect.read(_state.CHECK.asked)
if case.startswith("keras"):
    import keras
    _redirect.patch_keras(keras)
    ds = keras.utils.image_dataset_from_directory(r["from"], batch_size=4, image_size=(64, 64), shuffle=False)
    paths = getattr(ds, "file_paths", None)
    print(json.dumps({"type": type(ds).__name__, "classes": list(ds.class_names), "paths": paths[:1] if paths else None}))
    sys.exit(0)
import torchvision.datasets.folder as F
_redirect.patch_torchvision(F)
from torchvision.datasets import ImageFolder
other = ImageFolder(sys.argv[4])
if case == "loader":
    ImageFolder(r["from"], loader=F.default_loader)  # the default, named: still packed
    ImageFolder(r["from"], loader=lambda p: F.pil_loader(p))
ds = ImageFolder(r["from"], transform=lambda im: im.size, target_transform=lambda t: -t)
print(json.dumps({"type": type(ds).__name__, "other": type(other).__name__, "classes": ds.classes,
                  "first": list(ds[0]), "root": getattr(ds, "root", None), "n": len(ds),
                  "redirected": _state.CHECK.redirected}))
"""


def redirect_run(tmp_path, case, kind, to, src, other, python=sys.executable):
    why = tmp_path / f"{case}.why"
    env = env_for(tmp_path)
    if case.startswith("keras"):
        env["KERAS_BACKEND"] = "tensorflow"
    r = {"from": str(src), "to": str(to), "as": kind}
    p = subprocess.run(
        [python, "-c", REDIRECT, __import__("json").dumps(r), str(why), case, str(other)],
        capture_output=True,
        text=True,
        env=env,
        timeout=HANG_S,
    )
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    return (__import__("json").loads(lines[-1]) if lines else None), (why.read_text() if why.exists() else None)


def test_the_redirect_reads_only_the_named_folder_from_the_copy_or_the_pack(tmp_path):
    src, other, copy, packed = tmp_path / "src", tmp_path / "other", tmp_path / "copy", tmp_path / "d.ppk"
    for d in (src, other, copy):
        made = subprocess.run(
            [pipeprof_bin(), "demo-data", d, "--classes", "2", "--per-class", "3", "--size", "80x80", "--format", "jpeg"],
            capture_output=True,
            timeout=HANG_S,
        )
        assert made.returncode == 0, made.stderr
    made = subprocess.run([pipeprof_bin(), "pack", src, packed, "--size", "32"], capture_output=True, timeout=HANG_S)
    assert made.returncode == 0, made.stderr

    got, why = redirect_run(tmp_path, "pack", "packed", packed, src, other)
    # ImageFolder(src) is the packed file, with the program's transforms; another folder is not.
    assert why is None
    assert got["type"] == "PackedImageFolder" and got["other"] == "ImageFolder", got
    assert got["classes"] == ["circle", "cross"] and got["n"] == 6
    assert got["first"] == [[32, 32], 0], "transform saw the packed PIL image, target_transform the label"
    assert got["redirected"]

    got, why = redirect_run(tmp_path, "copy", "folder", copy, src, other)
    assert why is None
    assert got["type"] == "ImageFolder" and got["root"] == str(copy) and got["first"] == [[80, 80], 0], got

    # A loader of the program's own: the packed file cannot stand for it; the row says why.
    got, why = redirect_run(tmp_path, "loader", "packed", packed, src, other)
    assert got is None and "loader" in why, (got, why)


def test_keras_image_dataset_from_directory_is_redirected_too(tmp_path):
    src, copy, packed = tmp_path / "src", tmp_path / "copy", tmp_path / "d.ppk"
    for d in (src, copy):
        made = subprocess.run(
            [pipeprof_bin(), "demo-data", d, "--classes", "2", "--per-class", "3", "--size", "80x80", "--format", "jpeg"],
            capture_output=True,
            timeout=HANG_S,
        )
        assert made.returncode == 0, made.stderr
    made = subprocess.run(
        [pipeprof_bin(), "pack", src, packed, "--size", "64", "--layout", "keras"], capture_output=True, timeout=HANG_S
    )
    assert made.returncode == 0, made.stderr
    # image_dataset_from_directory builds a tf.data.Dataset: TensorFlow's environment.
    tf = tf_python()
    got, why = redirect_run(tmp_path, "keras-copy", "folder", copy, src, src, tf)
    assert why is None and got["paths"][0].startswith(str(copy)), got
    # The folder gone: only the packed file can give its classes.
    shutil.rmtree(src)
    got, why = redirect_run(tmp_path, "keras-pack", "packed", packed, src, src, tf)
    assert why is None and got["classes"] == ["circle", "cross"], got


def slow_demo(src):
    """128 JPEGs of 250×250 in 2 classes (the slow mount's data set)."""
    made = subprocess.run(
        [pipeprof_bin(), "demo-data", src, "--classes", "2", "--per-class", "64", "--size", "250x250", "--format", "jpeg"],
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert made.returncode == 0, made.stderr


def check_advice_on(tmp_path, src, mnt, program, flags=("--steps", "8")):
    """`pipeprof run --once --check-advice FLAGS -- PROGRAM` with ``src`` served slowly at
    ``mnt``: (stdout, stderr); exit status 0, and nothing left in the re-runs' temp folder."""
    scratch = tmp_path / "tmp"
    scratch.mkdir(exist_ok=True)
    env = env_for(tmp_path)
    env["TMPDIR"] = str(scratch)
    cmd = [pipeprof_bin(), "run", "--once", "--no-gpu", "--check-advice", *flags, "--", *program]
    with slowfs.mounted(src, mnt):
        p = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, env=env, timeout=6 * HANG_S, cwd=tmp_path)
    assert p.returncode == 0, p.stderr + p.stdout
    assert not [x.name for x in scratch.iterdir() if x.name.startswith("pipeprof-check-run-")]
    return p.stdout, p.stderr


def test_a_class_folder_that_is_a_link_is_copied_and_the_rows_show_the_main_runs_counts(tmp_path):
    # One class folder is a link to a store outside the data folder (DVC, git-annex):
    # ImageFolder and `pipeprof pack` follow it, and so must the copy.
    src, store, mnt = tmp_path / "src", tmp_path / "store", tmp_path / "mnt"
    slow_demo(src)
    store.mkdir()
    shutil.move(src / "cross", store / "cross")
    os.symlink(store / "cross", src / "cross")
    out, _ = check_advice_on(tmp_path, src, mnt, [sys.executable, EXAMPLE, "--data", mnt, "--epochs", "6"])
    assert "verdict: I/O (storage)" in out, out
    for label, what in ((COPY_ROW, "the copy"), (PACK_ROW, "the pack")):
        line = row(out, label)
        # Measured on the same data: the main run's 128 images of 2 classes, read from it.
        assert not re.search(r"skipped|failed", line), line
        assert re.search(rf"\(128 images, 2 classes, as the main run; \d+ read from {what}\)$", line), line


# A training script whose data set is an ImageFolder of the folder argv[1] cached with pickle
# (argv[2]) on its first run and loaded back on the later ones, where it still opens the folder
# to look at its classes: a re-run redirects that ImageFolder, but trains on the pickled one,
# which reads the folder itself. It ends after argv[3] epochs of 4 steps (fewer than 40).
PICKLED = """
import os, pickle, sys
import torch
from torch import nn
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

root, cache, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
if os.path.exists(cache):
    assert datasets.ImageFolder(root).classes == ["circle", "cross"]
    with open(cache, "rb") as f:
        ds = pickle.load(f)
else:
    ds = datasets.ImageFolder(root, transform=transforms.Compose([transforms.Resize((64, 64)), transforms.ToTensor()]))
    with open(cache, "wb") as f:
        pickle.dump(ds, f)
loader = DataLoader(ds, batch_size=32, shuffle=True)
model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(epochs):
    for x, y in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
"""


def test_a_re_run_that_never_read_the_copy_or_the_pack_is_skipped_with_why(tmp_path):
    src, mnt, script = tmp_path / "src", tmp_path / "mnt", tmp_path / "pickled.py"
    slow_demo(src)
    script.write_text(PICKLED)
    # 6 epochs of 4 steps: the program ends before the re-run's 40 steps (no --steps given).
    out, _ = check_advice_on(tmp_path, src, mnt, [sys.executable, script, mnt, tmp_path / "cache.pkl", "6"], ())
    assert "verdict: I/O (storage)" in out, out
    for label, what in ((COPY_ROW, "the copy"), (PACK_ROW, "the pack")):
        line = row(out, label)
        # Never "measured 1.00×": the re-run read the slow folder, not the copy or the pack.
        assert f"skipped: the re-run read no image from {what}" in line, line
