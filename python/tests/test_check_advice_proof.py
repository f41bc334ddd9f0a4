"""A `--check-advice` re-run that reads the folder from a copy or a pack proves it did
(issue 52 M1): the hook counts every image read from the copy or the pack, in each process that
reads one (a file per pid in the re-run's ``reads_dir``), and a program that never opened the
folder through the redirected reader says so in ``why_file`` at its own exit, also when it ends
before the re-run's steps. Run as check-advice runs a re-run: ``pipeprof run --once`` with
``PIPEPROF_CHECK`` set."""

import json
import subprocess
import sys
import textwrap

import pytest
from conftest import HANG_S, pipeprof_bin
from test_check_advice import run_checked

# A short training script (3 steps, fewer than the re-run's 40) over the folder argv[1], read
# as argv[2] says: torchvision's ImageFolder, a Dataset class of its own with a `root`, or an
# ImageFolder loaded back from a pickle made earlier (the folder opened once more only to look
# at its classes); argv[3] workers, argv[4] their start method.
SHORT = """
    import glob, os, pickle, sys
    import torch
    from PIL import Image
    from torch.utils.data import DataLoader, Dataset
    from torchvision import datasets, transforms

    root, how, workers, start = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    tf = transforms.Compose([transforms.Resize((16, 16)), transforms.ToTensor()])

    class Mine(Dataset):
        def __init__(self, root):
            self.root = root
            self.files = sorted(glob.glob(os.path.join(root, "*", "*.jpg")))
            self.classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
        def __len__(self):
            return len(self.files)
        def __getitem__(self, i):
            f = self.files[i]
            return tf(Image.open(f).convert("RGB")), self.classes.index(os.path.basename(os.path.dirname(f)))

    def main():
        if how == "own":
            ds = Mine(root)
        elif how == "pickled":
            datasets.ImageFolder(root)  # its classes looked at; the data set is the cached one
            with open(sys.argv[5], "rb") as f:
                ds = pickle.load(f)
        else:
            ds = datasets.ImageFolder(root, transform=tf)
        loader = DataLoader(ds, batch_size=4, shuffle=True, num_workers=workers,
                            multiprocessing_context=start if workers else None)
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 2))
        for i, (x, y) in enumerate(loader):
            if i == 3:
                break
            torch.nn.functional.cross_entropy(model(x), y).backward()
        print("trained", type(ds).__name__)

    if __name__ == "__main__":  # a spawned worker imports this file again
        main()
"""


def demo(folder, per_class=6):
    made = subprocess.run(
        [pipeprof_bin(), "demo-data", folder, "--classes", "2", "--per-class", str(per_class), "--size", "40x40",
         "--format", "jpeg"],
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr


def reads(folder):
    """The counts the hook wrote, a file per process: {pid: images read}."""
    return {p.name: int(p.read_text()) for p in folder.iterdir()}


def re_run(tmp_path, how, kind, to, workers=0, start="fork", steps=40):
    """The SHORT script re-run as check-advice runs it: redirected from src to ``to`` (a copy
    folder or a pack), returning (stdout, why or None, {pid: images read})."""
    src = tmp_path / "src"
    why, counts = tmp_path / f"{how}-{kind}-{workers}.why", tmp_path / f"{how}-{kind}-{workers}.reads"
    counts.mkdir()
    script = tmp_path / "short.py"
    script.write_text(textwrap.dedent(SHORT))
    check = {
        "steps": steps,
        "redirect": {"from": str(src), "to": str(to), "as": kind},
        "why_file": str(why),
        "reads_dir": str(counts),
    }
    cmd = [sys.executable, script, src, how, workers, start, tmp_path / "cache.pkl"]
    out, _ = run_checked(tmp_path, cmd, check)
    return out, (why.read_text() if why.exists() else None), reads(counts)


@pytest.fixture
def folders(tmp_path):
    """src (12 images, 2 classes), its copy, its pack, and the pickle a program cached of src."""
    src, copy, packed = tmp_path / "src", tmp_path / "copy", tmp_path / "d.ppk"
    demo(src)
    demo(copy)
    made = subprocess.run([pipeprof_bin(), "pack", src, packed, "--size", "16"], capture_output=True, timeout=HANG_S)
    assert made.returncode == 0, made.stderr
    pickled = subprocess.run(
        [sys.executable, "-c", "import pickle, sys; from torchvision import datasets, transforms as T; "
         "tf = T.Compose([T.Resize((16, 16)), T.ToTensor()]); "
         "pickle.dump(datasets.ImageFolder(sys.argv[1], transform=tf), open(sys.argv[2], 'wb'))", src,
         tmp_path / "cache.pkl"],
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )  # fmt: skip
    assert pickled.returncode == 0, pickled.stderr
    return copy, packed


def test_a_program_that_ends_before_its_steps_without_opening_the_folder_says_so(tmp_path, folders):
    copy, packed = folders
    for kind, to in (("folder", copy), ("packed", packed)):
        out, why, counted = re_run(tmp_path, "own", kind, to)
        # The program ran to its own end (3 steps of the re-run's 40) on its own reader.
        assert "trained Mine" in out, out
        assert why is not None and "did not open" in why and "nothing was redirected" in why, why
        assert sum(counted.values()) == 0, counted


def test_a_program_that_opened_the_folder_but_trained_on_a_pickle_read_nothing_redirected(tmp_path, folders):
    copy, packed = folders
    for kind, to in (("folder", copy), ("packed", packed)):
        out, why, counted = re_run(tmp_path, "pickled", kind, to)
        assert "trained ImageFolder" in out, out
        # The redirect was made (ImageFolder(src) was built from the copy or the pack) ...
        assert why is None, why
        # ... and no image was read from it: check-advice's row is skipped, not measured.
        assert sum(counted.values()) == 0, counted


@pytest.mark.parametrize(
    "kind,workers,start", [("folder", 0, "fork"), ("folder", 2, "fork"), ("packed", 2, "spawn"), ("packed", 0, "fork")]
)
def test_every_image_read_from_the_copy_or_the_pack_is_counted_in_the_process_that_read_it(
    tmp_path, folders, kind, workers, start
):
    copy, packed = folders
    out, why, counted = re_run(tmp_path, "folder", kind, copy if kind == "folder" else packed, workers, start)
    assert why is None and ("trained ImageFolder" if kind == "folder" else "trained PackedImageFolder") in out, out
    # The whole epoch: 3 batches of 4 (the program stops at its 3rd).
    assert sum(counted.values()) == 12, counted
    # Read in the workers when there are some (a file each), else in the program's process.
    assert len(counted) == max(1, workers), counted


# Keras's folder reader redirected in a plain TensorFlow process, as a re-run's hook does:
# the images of the batches taken are counted (a tf.data map), the classes kept.
KERAS_COUNTED = """
import json, sys
from pipeprof import _redirect, _state
r, counts = json.loads(sys.argv[1]), sys.argv[2]
_state.CHECK.asked = {"redirect": r, "why_file": counts + ".why", "reads_dir": counts}
_state.CHECK.redirect = _redirect.read(_state.CHECK.asked)
import keras
_redirect.patch_keras(keras)
ds = keras.utils.image_dataset_from_directory(r["from"], batch_size=4, image_size=(16, 16), shuffle=False)
taken = [int(x.shape[0]) for x, _ in ds.take(2)]
print(json.dumps({"classes": list(ds.class_names), "taken": taken}))
"""


def test_keras_batches_read_from_the_copy_or_the_pack_are_counted(tmp_path):
    from test_keras_tf import tf_python

    src, copy, packed = tmp_path / "src", tmp_path / "copy", tmp_path / "k.ppk"
    demo(src)
    demo(copy)
    made = subprocess.run(
        [pipeprof_bin(), "pack", src, packed, "--size", "16", "--layout", "keras"], capture_output=True, timeout=HANG_S
    )
    assert made.returncode == 0, made.stderr
    env = dict(__import__("test_frameworks").env_for(tmp_path), KERAS_BACKEND="tensorflow")
    for kind, to in (("folder", copy), ("packed", packed)):
        counts = tmp_path / f"{kind}.reads"
        counts.mkdir()
        r = {"from": str(src), "to": str(to), "as": kind}
        p = subprocess.run(
            [tf_python(), "-c", KERAS_COUNTED, json.dumps(r), str(counts)],
            capture_output=True,
            text=True,
            env=env,
            timeout=HANG_S,
        )
        assert p.returncode == 0, p.stderr
        got = json.loads(p.stdout.strip().splitlines()[-1])
        assert got == {"classes": ["circle", "cross"], "taken": [4, 4]}, got
        assert sum(reads(counts).values()) == 8, (kind, reads(counts))
