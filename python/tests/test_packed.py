"""`pipeprof pack` and its readers: pipeprof.data.PackedImageFolder against torchvision's
ImageFolder and PIL, in DataLoader workers (fork and spawn); pipeprof.keras.packed_dataset on
JAX (a PyDataset) and on TensorFlow (a tf.data.Dataset, against image_dataset_from_directory);
damaged files; and the NumPy-only reader of docs/packed-format.md, run as written there."""

import ast
import json
import os
import pickle
import re
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import numpy as np
import pytest
from conftest import HANG_S, REPO, pipeprof_bin
from PIL import Image

import torch
import torchvision
from torch.utils.data import DataLoader

from pipeprof.data import PackedFile, PackedFileError, PackedImageFolder

DOC = REPO / "docs" / "packed-format.md"


def picture(path, w, h, seed, mode="RGB", fmt=None):
    """A photo-like image: smooth gradients plus noise, so that resizing and JPEG both matter."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)), ((x + y) * 127 // max(w + h - 2, 1))], axis=2)
    px = np.clip(base + rng.integers(-40, 40, size=(h, w, 3)), 0, 255).astype(np.uint8)
    img = Image.fromarray(px).convert(mode)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, format=fmt)


def odd_folder(root):
    """Names and layouts where a naive scan differs from ImageFolder's: a hidden class, hidden
    files, nested folders whose path order is not their string order, upper-case extensions,
    spaces and non-ASCII names, a GIF and a text file (not images to ImageFolder), grayscale
    and RGBA PNGs, sizes from 17×9 to 90×64."""
    files = {
        ".hidden_cls/a.png": (20, 30),
        "Bee/.h.jpg": (33, 21),
        "Bee/a b.JPEG": (90, 64),
        "Bee/x.PNG": (17, 9),
        "Bee/z.jpg": (64, 48),
        "Bee/sub/b.png": (40, 40),
        "Bee/sub-x/a.jpeg": (25, 50),
        "Bee/sub/c/a.bmp": (31, 29),
        "ant/1.png": (48, 36),
        "ant/gray.png": (36, 48),
        "ant/rgba.png": (30, 30),
        "zebra/é ü.jpg": (70, 52),
        "zebra/z.tif": (22, 44),
    }
    for i, (name, (w, h)) in enumerate(files.items()):
        mode = {"ant/gray.png": "L", "ant/rgba.png": "RGBA"}.get(name, "RGB")
        fmt = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".bmp": "BMP", ".tif": "TIFF"}[Path(name.lower()).suffix]
        picture(root / name, w, h, i, mode, fmt)
    picture(root / "Bee/anim.gif", 10, 10, 99, fmt="GIF")
    (root / "Bee/notes.txt").write_text("not an image")
    return root


def pack(src, out, *flags):
    p = subprocess.run([pipeprof_bin(), "pack", str(src), str(out), *flags], capture_output=True, text=True, timeout=HANG_S)
    assert p.returncode == 0, p.stderr
    return p


@pytest.fixture(scope="module")
def odd(tmp_path_factory):
    return odd_folder(tmp_path_factory.mktemp("odd") / "imgs")


@pytest.fixture(scope="module")
def packed(odd, tmp_path_factory):
    out = tmp_path_factory.mktemp("packed") / "data.ppk"
    pack(odd, out, "--size", "32")
    return out


def rel(paths, root):
    return [os.path.relpath(p, root) for p in paths]


def test_classes_targets_and_order_are_imagefolders(odd, packed):
    ref = torchvision.datasets.ImageFolder(str(odd))
    ds = PackedImageFolder(packed)
    assert ds.classes == ref.classes and ds.classes[0] == ".hidden_cls"
    assert ds.class_to_idx == ref.class_to_idx
    assert ds.targets == ref.targets
    assert [t for _, t in ds.samples] == [t for _, t in ref.samples]
    assert rel([p for p, _ in ds.samples], ds.root) == rel([p for p, _ in ref.samples], str(odd))
    assert ds.root == os.path.realpath(odd)
    assert len(ds) == len(ref) == 13
    # The acceptance line: `python -c 'from pipeprof.data import PackedImageFolder as P; print(len(P("data.ppk")))'`.
    p = subprocess.run([sys.executable, "-c", 'from pipeprof.data import PackedImageFolder as P; print(len(P("data.ppk")))'], cwd=packed.parent, capture_output=True, text=True, timeout=HANG_S)
    assert p.stdout.strip() == "13", p.stderr


@pytest.mark.parametrize(
    "flags, resize",
    [
        # (pack flags, torchvision transform doing the same to a PIL image: Resize uses PIL's
        # Image.BILINEAR on PIL images, the filter pack uses)
        (["--size", "32"], lambda img: img.resize((32, 32), Image.BILINEAR)),
        (["--size", "40x24"], lambda img: img.resize((40, 24), Image.BILINEAR)),
        (["--shorter", "20"], torchvision.transforms.Resize(20, interpolation=torchvision.transforms.InterpolationMode.BILINEAR)),
        (["--as-stored"], lambda img: img),
    ],
)
def test_pixels_are_pils_decode_and_resize_within_2(odd, tmp_path, flags, resize):
    out = tmp_path / "x.ppk"
    pack(odd, out, *flags)
    ds = PackedImageFolder(out)
    ref = torchvision.datasets.ImageFolder(str(odd), transform=resize)
    worst = []
    for i in range(len(ds)):
        got, want = np.asarray(ds[i][0]), np.asarray(ref[i][0])
        assert ds[i][0].mode == "RGB"
        assert got.shape == want.shape, (i, flags)
        worst.append(int(np.abs(got.astype(int) - want.astype(int)).max()))
    assert max(worst) <= 2, (flags, worst)
    # Not vacuous: another filter is further off than the tolerance on these images.
    if flags[0] == "--size":
        w, h = ds[1][0].size
        nearest = np.asarray(Image.open(ref.samples[1][0]).convert("RGB").resize((w, h), Image.NEAREST))
        assert np.abs(nearest.astype(int) - np.asarray(ds[1][0]).astype(int)).max() > 2


def test_as_tensor_is_chw_uint8_and_the_transforms_apply(packed):
    plain = PackedImageFolder(packed)
    t = PackedImageFolder(packed, as_tensor=True)
    x, y = t[4]
    assert x.dtype == torch.uint8 and tuple(x.shape) == (3, 32, 32) and y == plain.targets[4]
    assert torch.equal(x, torch.from_numpy(np.asarray(plain[4][0]).transpose(2, 0, 1).copy()))
    f = PackedImageFolder(packed, transform=torchvision.transforms.ToTensor(), target_transform=lambda c: c + 100)
    x, y = f[-1]
    assert x.dtype == torch.float32 and float(x.max()) <= 1.0 and y == plain.targets[-1] + 100
    with pytest.raises(IndexError):
        plain[len(plain)]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_see_every_sample_once(packed, context):
    ds = PackedImageFolder(packed, as_tensor=True)
    ds[0]  # the parent reads the file first: a forked worker reads through the same descriptor
    # Pickled (spawn), the file is its path: the copy opens its own.
    assert pickle.loads(pickle.dumps(ds.file)).__dict__.keys() >= {"path", "meta"}
    assert ds.file.__getstate__()["path"] == str(packed) and ds.file.__getstate__().keys() == {"path", "identity"}
    copy = pickle.loads(pickle.dumps(ds)).file
    assert copy._file.fileno() != ds.file._file.fileno() and copy._identity == ds.file._identity
    loader = DataLoader(ds, batch_size=3, num_workers=2, multiprocessing_context=context, shuffle=False)
    xs, ys = zip(*loader)
    xs, ys = torch.cat(xs), torch.cat(ys)
    assert len(xs) == len(ds)
    want = torch.stack([ds[i][0] for i in range(len(ds))])
    assert torch.equal(xs, want)
    assert ys.tolist() == ds.targets


def damaged_cases(packed):
    """(what the message must say, the file's bytes)."""
    good = packed.read_bytes()
    u64 = lambda at: int.from_bytes(good[at : at + 8], "little")  # noqa: E731
    n, lab, crc, meta, meta_len, idx = u64(24), u64(48), u64(56), u64(64), u64(72), u64(88)
    # Metadata that is not JSON, under a header CRC that matches it: the parse catches it.
    bad = bytearray(good)
    bad[meta] = ord("X")
    body = b"".join(bytes(bad[o : o + k]) for o, k in [(lab, 4 * n), (crc, 4 * n), (idx, 16 * n), (meta, meta_len)])
    bad[124:128] = struct.pack("<I", zlib.crc32(bytes(bad[:124]) + bytes(4) + body))
    return {
        "truncated": good[: len(good) // 2],
        "header checksum mismatch": good[:-1] + bytes([good[-1] ^ 1]),
        "version 1": good[:8] + (1).to_bytes(4, "little") + good[12:],
        "version 3": good[:8] + (3).to_bytes(4, "little") + good[12:],
        "not a pipeprof packed file": b"hello, not packed at all",
        "shorter than the 128-byte header": good[:40],
        "unreadable metadata": bytes(bad),
    }


def test_a_damaged_missing_or_other_version_file_is_refused_naming_it(packed, tmp_path):
    for why, data in damaged_cases(packed).items():
        path = tmp_path / f"bad {why[:9]}.ppk"
        path.write_bytes(data)
        with pytest.raises(PackedFileError) as e:
            PackedImageFolder(path)
        msg = str(e.value)
        assert str(path) in msg and why in msg, msg
        assert "pipeprof pack" in msg, msg
    with pytest.raises(FileNotFoundError) as e:
        PackedImageFolder(tmp_path / "missing.ppk")
    assert "missing.ppk" in str(e.value)
    # One pixel byte flipped: the header is intact, verify() finds the image by name.
    good = bytearray(packed.read_bytes())
    good[4096 + 5 * 32 * 32 * 3 + 7] ^= 1
    flipped = tmp_path / "flipped.ppk"
    flipped.write_bytes(bytes(good))
    f = PackedFile(flipped)
    with pytest.raises(PackedFileError, match=r"flipped\.ppk.*checksum mismatch in image 5 \(" + re.escape(f.names[5])):
        f.verify()
    PackedFile(packed).verify()


def doc_example():
    """The Python block after the `reader-example` marker in docs/packed-format.md."""
    text = DOC.read_text()
    at = text.index("<!-- reader-example -->")
    m = re.search(r"```python\n(.*?)```", text[at:], re.S)
    assert m, "docs/packed-format.md lost its reader example"
    return m.group(1)


def test_the_docs_numpy_reader_runs_and_reads_what_the_package_reads(odd, tmp_path):
    code = doc_example()
    imports = {a.name.split(".")[0] for n in ast.walk(ast.parse(code)) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    assert imports <= {"json", "struct", "sys", "zlib", "numpy"}, imports
    for flags in (["--size", "24"], ["--shorter", "16"]):
        out = tmp_path / f"{flags[0][2:]}.ppk"
        pack(odd, out, *flags)
        p = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, timeout=HANG_S)
        assert p.returncode == 0, p.stderr
        ds = PackedImageFolder(out)
        last = np.asarray(ds[len(ds) - 1][0])
        want = f"{len(ds)} {ds.classes} {last.shape} {ds.targets[-1]} {os.path.relpath(ds.samples[-1][0], ds.root)}"
        assert p.stdout.strip() == want
    # It refuses a damaged file.
    bad = tmp_path / "bad.ppk"
    data = out.read_bytes()
    bad.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    p = subprocess.run([sys.executable, "-c", code, str(bad)], capture_output=True, text=True, timeout=HANG_S)
    assert p.returncode != 0 and "damaged" in p.stderr


def keras_env(backend):
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS="1")
    for k in ("PIPEPROF_PARENT", "PIPEPROF_PARENT_PID", "PIPEPROF_MAIN_PID", "PIPEPROF_LISTEN"):
        env.pop(k, None)
    return env


def run_script(python, backend, code, *args):
    p = subprocess.run([python, "-c", textwrap.dedent(code), *map(str, args)], capture_output=True, text=True, env=keras_env(backend), timeout=HANG_S)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    """A folder Keras and torchvision index alike (JPEG and PNG, no hidden names), its images
    all 40×40, packed as stored with Keras's layout."""
    root = tmp_path_factory.mktemp("shapes")
    subprocess.run([pipeprof_bin(), "demo-data", str(root / "imgs"), "--classes", "3", "--per-class", "10", "--size", "40x40"], check=True, capture_output=True, timeout=HANG_S)
    pack(root / "imgs", root / "data.ppk", "--layout", "keras")
    return root / "imgs", root / "data.ppk"


KERAS_CHECK = """
    import json, sys
    import numpy as np
    import keras
    import pipeprof.keras as pk
    path = sys.argv[1]
    out = {}
    d = pk.packed_dataset(path, batch_size=7, shuffle=False)
    out["type"] = type(d).__module__ + "." + type(d).__name__
    out["class_names"] = d.class_names
    out["file_paths"] = d.file_paths
    batches = list(d) if not hasattr(d, "__getitem__") else [d[i] for i in range(len(d))]
    out["shapes"] = [list(np.shape(x)) for x, _ in batches]
    out["dtypes"] = sorted({str(np.asarray(x).dtype) for x, _ in batches} | {str(np.asarray(y).dtype) for _, y in batches})
    out["labels"] = [int(v) for _, y in batches for v in np.asarray(y)]
    out["first"] = np.asarray(batches[0][0])[0, :2, :2].tolist()
    s = pk.packed_dataset(path, batch_size=4, seed=3)
    epochs = []
    for _ in range(2):
        it = list(s) if not hasattr(s, "__getitem__") else [s[i] for i in range(len(s))]
        epochs.append([int(v) for _, y in it for v in np.asarray(y)])
        if hasattr(s, "on_epoch_end"):
            s.on_epoch_end()
    out["epochs"] = epochs
    tr, va = pk.packed_dataset(path, validation_split=0.2, subset="both", seed=11)
    out["split"] = [tr.file_paths, va.file_paths]
    r = pk.packed_dataset(path, batch_size=5, image_size=(24, 32), label_mode="categorical", shuffle=False)
    x, y = next(iter(r)) if not hasattr(r, "__getitem__") else r[0]
    out["resized"] = [list(np.shape(x)), list(np.shape(y))]
    m = keras.Sequential([keras.Input((40, 40, 3)), keras.layers.Rescaling(1 / 255), keras.layers.Flatten(), keras.layers.Dense(3)])
    m.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    out["fit_steps"] = len(m.fit(d, epochs=1, verbose=0).history["loss"])
    print(json.dumps(out))
"""


def check_keras(out, shapes):
    imgs, path = shapes
    ref = torchvision.datasets.ImageFolder(str(imgs))
    assert out["class_names"] == ref.classes
    assert rel(out["file_paths"], os.path.realpath(imgs)) == rel([p for p, _ in ref.samples], str(imgs))
    assert out["shapes"] == [[7, 40, 40, 3]] * 4 + [[2, 40, 40, 3]]
    assert out["labels"] == ref.targets
    first = np.asarray(Image.open(ref.samples[0][0]).convert("RGB"), dtype=np.float32)[:2, :2]
    assert np.abs(np.asarray(out["first"]) - first).max() <= 2, "images are 0–255 float pixels, as stored"
    # Shuffled: each epoch every sample once, in another order.
    a, b = out["epochs"]
    assert sorted(a) == sorted(b) == sorted(ref.targets) and a != b
    train, val = out["split"]
    assert len(val) == int(0.2 * len(ref)) and len(train) + len(val) == len(ref) and not set(train) & set(val)
    assert out["resized"] == [[5, 24, 32, 3], [5, 3]]
    assert out["fit_steps"] == 1


def test_keras_reader_on_jax_is_a_pydataset(shapes):
    out = run_script(sys.executable, "jax", KERAS_CHECK, shapes[1])
    assert out["type"].endswith("._PackedPyDataset")
    assert out["dtypes"] == ["float32", "int32"]
    check_keras(out, shapes)


def tf_python():
    p = Path(os.environ.get("PIPEPROF_TF_PYTHON", REPO / "target" / "tfvenv" / "bin" / "python"))
    if not p.exists():
        pytest.fail(f"{p} missing: scripts/test.sh makes the TensorFlow environment (or set PIPEPROF_TF_PYTHON)")
    return str(p)


TF_VS_KERAS = """
    import json, sys
    import numpy as np
    import keras
    import pipeprof.keras as pk
    path, folder = sys.argv[1], sys.argv[2]
    out = {}
    for name, make in [("packed", lambda **k: pk.packed_dataset(path, **k)), ("keras", lambda **k: keras.utils.image_dataset_from_directory(folder, image_size=(40, 40), **k))]:
        tr = make(validation_split=0.3, subset="training", seed=5, batch_size=8)
        d = make(shuffle=False, batch_size=8)
        x, y = next(iter(d))
        out[name] = {"train": tr.file_paths, "files": d.file_paths[:8], "class_names": d.class_names, "spec": [str(s) for s in d.element_spec], "labels": [int(v) for _, y in d for v in y.numpy()], "first": x.numpy().tolist()}
    print(json.dumps(out))
"""


def test_keras_reader_on_tensorflow_is_what_image_dataset_from_directory_gives(shapes):
    out = run_script(tf_python(), "tensorflow", KERAS_CHECK, shapes[1])
    assert "tensorflow" in out["type"] and "Dataset" in out["type"]
    assert out["dtypes"] == ["float32", "int32"]
    check_keras(out, shapes)
    both = run_script(tf_python(), "tensorflow", TF_VS_KERAS, shapes[1], shapes[0])
    p, k = both["packed"], both["keras"]
    assert p["class_names"] == k["class_names"] and p["labels"] == k["labels"]
    assert p["spec"] == k["spec"], "the same element types and shapes"
    assert rel(p["train"], os.path.realpath(shapes[0])) == rel(k["train"], str(shapes[0])), "the same seed splits alike"
    # The same pixels for the PNGs; TensorFlow decodes JPEGs with libjpeg's fast integer IDCT
    # (PIL, and pack, the accurate one), so those are a few levels apart.
    png = [i for i, f in enumerate(p["files"]) if f.endswith(".png")]
    assert png and np.array_equal(np.asarray(p["first"])[png], np.asarray(k["first"])[png])


def two_packs(tmp_path):
    """Two packed files of 6 images each, 8×8, whose pixels and targets differ."""
    out = []
    for k, classes in enumerate([("x", "y"), ("p", "q", "r")]):
        src = tmp_path / f"src{k}"
        for i in range(6):
            d = src / classes[i % len(classes)]
            d.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (8, 8), (40 * i + k, 255 - 30 * i, 100 * k)).save(d / f"{i}.png")
        pack(src, tmp_path / f"{k}.ppk", "--size", "8")
        out.append(tmp_path / f"{k}.ppk")
    return out


def test_a_forked_worker_reads_the_file_opened_even_after_it_was_replaced(tmp_path):
    a, b = two_packs(tmp_path)
    keep = tmp_path / "a-copy.ppk"
    keep.write_bytes(a.read_bytes())
    want = PackedImageFolder(keep, as_tensor=True)
    ds = PackedImageFolder(a, as_tensor=True)
    os.replace(b, a)
    loader = DataLoader(ds, batch_size=6, num_workers=1, multiprocessing_context="fork", shuffle=False)
    [(x, y)] = list(loader)
    assert y.tolist() == ds.targets == want.targets
    assert torch.equal(x, torch.stack([want[i][0] for i in range(len(want))])), "the pixels of the file the targets came from"


def test_a_spawned_worker_refuses_a_file_replaced_since_it_was_opened(tmp_path, capfd):
    a, b = two_packs(tmp_path)
    ds = PackedImageFolder(a, as_tensor=True)
    os.replace(b, a)
    with pytest.raises(PackedFileError, match=r"0\.ppk: the file changed since it was opened"):
        pickle.loads(pickle.dumps(ds))
    loader = DataLoader(ds, batch_size=6, num_workers=1, multiprocessing_context="spawn", shuffle=False)
    with pytest.raises((RuntimeError, PackedFileError)) as e:
        list(loader)
    # The worker's error reaches the parent, or its stderr when it died unpickling the dataset.
    assert "changed since it was opened" in str(e.value) + capfd.readouterr().err
    # Unchanged, a spawned copy is the same file.
    c = PackedImageFolder(a)
    assert pickle.loads(pickle.dumps(c)).targets == c.targets


def test_keras_reader_refuses_a_file_packed_with_imagefolders_layout_and_torch_warns_on_keras(tmp_path, packed):
    import pipeprof.keras as pk

    with pytest.raises(PackedFileError) as e:
        pk.packed_dataset(packed)
    msg = str(e.value)
    assert str(packed) in msg and "imagefolder layout" in msg and f"pipeprof pack {PackedFile(packed).meta['source']} {packed} --size 32 --layout keras" in msg, msg
    out = tmp_path / "k.ppk"
    pack(REPRO_LIKE(tmp_path / "d"), out, "--size", "8", "--layout", "keras")
    with pytest.warns(UserWarning, match=r"k\.ppk was packed with --layout keras.*--size 8`"):
        ds = PackedImageFolder(out)
    assert ds.classes == ["cat", "dog"]


def REPRO_LIKE(root):
    """The reviewer's folder and more: an empty Jupyter checkpoints folder, a GIF (Keras reads
    it, ImageFolder does not), a WebP and a TIFF (the other way round), hidden files and
    nested folders inside a class, upper-case extensions."""
    (root / ".ipynb_checkpoints").mkdir(parents=True)
    files = ["cat/a.png", "cat/b.jpg", "cat/.c.png", "cat/sub/x.JPEG", "cat/sub-x/y.bmp", "dog/c.png", "dog/d.gif", "dog/e.webp", "dog/f.tif", "dog/G.PNG"]
    for i, name in enumerate(files):
        fmt = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG", ".bmp": "BMP", ".gif": "GIF", ".webp": "WEBP", ".tif": "TIFF"}[Path(name.lower()).suffix]
        picture(root / name, 12, 10, i, fmt=fmt)
    return root


KERAS_INDEX = """
    import json, sys
    import numpy as np
    from keras.src.utils import dataset_utils, image_dataset_utils
    import pipeprof.keras as pk
    path, folder = sys.argv[1], sys.argv[2]
    out = {}
    for shuffle in (False, True):
        paths, labels, classes = dataset_utils.index_directory(folder, "inferred", formats=image_dataset_utils.ALLOWLIST_FORMATS, shuffle=shuffle, seed=7, verbose=False)
        d = pk.packed_dataset(path, shuffle=shuffle, seed=7, batch_size=100)
        x, y = d[0]
        out[shuffle] = {"keras": [classes, paths, labels.tolist()], "packed": [d.class_names, d.file_paths, np.asarray(y).tolist() if not shuffle else None]}
    print(json.dumps(out))
"""


def test_keras_layout_is_keras_index_directorys_classes_labels_and_order(tmp_path):
    folder = REPRO_LIKE(tmp_path / "d")
    out = tmp_path / "k.ppk"
    pack(folder, out, "--size", "8", "--layout", "keras")
    got = run_script(sys.executable, "jax", KERAS_INDEX, out, folder)
    real = os.path.realpath(folder)
    for shuffle in ("false", "true"):
        (k_classes, k_paths, k_labels), (p_classes, p_paths, p_labels) = got[shuffle]["keras"], got[shuffle]["packed"]
        assert p_classes == k_classes == ["cat", "dog"]
        assert rel(p_paths, real) == rel(k_paths, str(folder)), shuffle
        if p_labels is not None:
            assert p_labels == k_labels
    assert "dog/d.gif" in rel(got["false"]["packed"][1], real) and not any(p.endswith((".webp", ".tif")) for p in got["false"]["packed"][1])
    assert got["false"]["keras"][2] == [0] * 5 + [1] * 3


TF_REPRO = """
    import json, sys
    import numpy as np
    import keras
    import pipeprof.keras as pk
    path, folder = sys.argv[1], sys.argv[2]
    out = {}
    for name, make in [("packed", lambda **k: pk.packed_dataset(path, **k)), ("keras", lambda **k: keras.utils.image_dataset_from_directory(folder, image_size=(8, 8), **k))]:
        d = make(shuffle=False, batch_size=100)
        s = make(seed=3, batch_size=100)
        out[name] = {"class_names": d.class_names, "files": d.file_paths, "labels": [int(v) for _, y in d for v in y.numpy()], "shuffled": s.file_paths}
    print(json.dumps(out))
"""


def test_keras_layout_is_image_dataset_from_directorys_on_the_reviewers_folder():
    import tempfile

    with tempfile.TemporaryDirectory() as t:
        folder = REPRO_LIKE(Path(t) / "d")
        out = Path(t) / "k.ppk"
        pack(folder, out, "--size", "8", "--layout", "keras")
        both = run_script(tf_python(), "tensorflow", TF_REPRO, out, folder)
        p, k = both["packed"], both["keras"]
        assert p["class_names"] == k["class_names"] == ["cat", "dog"]
        assert p["labels"] == k["labels"] == [0] * 5 + [1] * 3
        real = os.path.realpath(folder)
        assert rel(p["files"], real) == rel(k["files"], str(folder))
        assert rel(p["shuffled"], real) == rel(k["shuffled"], str(folder)), "the same seed, the same order"


def same_size_packs(tmp_path):
    """Two packed files of the same folder layout and length, whose pixels differ."""
    out = []
    for k in range(2):
        src = tmp_path / f"same{k}"
        for i in range(6):
            d = src / "xy"[i % 2]
            d.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (8, 8), (40 * i + 100 * k, 255 - 30 * i, 7)).save(d / f"{i}.png")
        pack(src, tmp_path / f"same{k}.ppk", "--size", "8")
        out.append(tmp_path / f"same{k}.ppk")
    assert out[0].stat().st_size == out[1].stat().st_size
    return out


CHANGED = r"the file changed since it was opened"


def test_a_file_rewritten_in_place_with_the_same_size_is_an_error_not_other_pixels(tmp_path):
    a, b = same_size_packs(tmp_path)
    ds = PackedImageFolder(a, as_tensor=True)
    first = ds[0][0]
    inode = a.stat().st_ino
    a.write_bytes(b.read_bytes())  # as `cp b a`: the same file, its bytes replaced
    assert a.stat().st_ino == inode
    for read in (lambda: ds[0], lambda: ds.file.image(5), lambda: ds.file.batch([1, 2])):
        with pytest.raises(PackedFileError, match=re.escape(str(a)) + ".*" + CHANGED):
            read()
    assert first.shape == (3, 8, 8)


TRUNCATE = """
import os, sys, torch
from torch.utils.data import DataLoader
from pipeprof.data import PackedImageFolder, PackedFileError
path, workers = sys.argv[1], int(sys.argv[2])
ds = PackedImageFolder(path, as_tensor=True)
it = iter(DataLoader(ds, batch_size=1, num_workers=workers, multiprocessing_context="fork" if workers else None))
next(it)  # read from the file (a worker has opened or mapped it), then:
os.truncate(path, 4096 + 8 * 8 * 3 * 2)  # as `truncate` or a `cp` that has not finished
try:
    list(it)  # images 3 to 5 are asked for after the truncation
except Exception as e:
    print(type(e).__name__, e)
"""


@pytest.mark.parametrize("workers", [0, 1])
def test_a_file_truncated_in_place_is_an_error_naming_it_not_a_bus_error(tmp_path, workers):
    a, _ = same_size_packs(tmp_path)
    p = subprocess.run([sys.executable, "-c", TRUNCATE, str(a), str(workers)], capture_output=True, text=True, timeout=HANG_S)
    assert p.returncode == 0, f"killed by signal {-p.returncode}?\n{p.stderr[-2000:]}"
    assert str(a) in p.stdout and CHANGED in p.stdout, p.stdout + p.stderr[-2000:]
    assert "shared memory" not in p.stdout + p.stderr


def non_utf8_folder(root):
    """Class and file names that are not UTF-8 (bytes Python's os.fsdecode makes lone
    surrogates of), beside UTF-8 ones: their bytes' order is not Python's str order."""
    broot = os.fsencode(root)
    names = [b"caf\xe9/\xff.png", b"caf\xe9/a.png", b"caf\xe9/\xc3\xa9.png", b"caf\xe9/\x80.png", b"cafe/b.png", b"caf\xc3\xa9/c.png", b"\xee\x80\x80/d.png", b"\xf5x/e.png"]
    for i, n in enumerate(names):
        path = os.path.join(broot, n)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        Image.new("RGB", (4 + i, 5), (30 * i, 255 - 20 * i, 9 * i)).save(os.fsdecode(path), format="PNG")
    return root


def test_names_that_are_not_utf8_give_imagefolders_classes_paths_and_order(tmp_path):
    src = non_utf8_folder(tmp_path / "src")
    out = tmp_path / "n.ppk"
    pack(src, out, "--as-stored")
    ref = torchvision.datasets.ImageFolder(str(src))
    ds = PackedImageFolder(out)
    assert "caf\udce9" in ref.classes
    assert ds.classes == ref.classes and ds.class_to_idx == ref.class_to_idx
    assert ds.targets == ref.targets
    assert rel([p for p, _ in ds.samples], ds.root) == rel([p for p, _ in ref.samples], str(src))
    for i in range(len(ref)):
        assert np.array_equal(np.asarray(ds[i][0]), np.asarray(ref[i][0])), f"image {i}: {ref.samples[i][0]!r}"
