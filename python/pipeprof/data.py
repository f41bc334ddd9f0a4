"""Read a file written by ``pipeprof pack`` (pure Python and NumPy; torch and PIL only when asked).

    pipeprof pack data/train data.ppk --size 224

    from pipeprof.data import PackedImageFolder
    train = PackedImageFolder("data.ppk", transform=transforms.Compose([...]))
    # in place of torchvision.datasets.ImageFolder("data/train", transform=...)

``classes``, ``class_to_idx``, ``samples``, ``targets`` and the order are those of
``torchvision.datasets.ImageFolder`` on the folder packed; an item is ``(PIL RGB image,
target)`` (a CHW uint8 tensor with ``as_tensor=True``), so the program's transforms still apply.
The file is opened once and kept open, and each image is read from it (``os.preadv``, never
memory-mapped) and checked against its CRC-32 as it is read: a file truncated or rewritten in
place since it was opened is a :class:`PackedFileError` naming it, never a crash (a map's
``SIGBUS``) or another file's pixels under this file's targets. A forked DataLoader worker
reads the very file the dataset read its index and targets from, even if another file has
taken its name since. A spawned worker (pickling carries the path and the file's identity, not
the open file) opens the path again and refuses it if it is not the same file any more.

Folder and file names that are not UTF-8 are kept exactly (the metadata's ``exact``):
``classes`` and the ``samples`` paths are what ``os.fsdecode`` gives, as ImageFolder's.

The readers do not look at the folder that was packed: a file packed before images were added,
removed or changed there still reads as it was packed (run ``pipeprof pack`` again after such
changes; ``pipeprof profile --data FILE`` does check).

The format is documented in docs/packed-format.md; :class:`PackedFile` is the reader.
"""

from __future__ import annotations

import json
import math
import operator
import os
import re
import struct
import warnings
import zlib

import numpy as np

from pipeprof._keras_backend import backend_of, keras_module

__all__ = ["PackedImageFolder", "PackedFile", "PackedFileError", "VERSION", "packed_dataset"]

#: The first 8 bytes of every packed file.
MAGIC = b"\x89PPK\r\n\x1a\n"
#: The format version this module reads.
VERSION = 2
#: Bytes of the fixed header; its last 4 are the CRC-32.
HEADER_LEN = 128
_CRC_AT = HEADER_LEN - 4
# version, height, width, channels, then count, fingerprint, pixels_off, labels_off, crcs_off,
# meta_off, meta_len, file_len, index_off: from byte 8.
_HEADER = struct.Struct("<4I9Q")
#: One per-image index entry: where its pixels start, its height and its width.
ENTRY = np.dtype([("offset", "<u8"), ("height", "<u4"), ("width", "<u4")])


class PackedFileError(ValueError):
    """A file that is not a readable packed file: the message names it, what is wrong, and the
    command that rebuilds it."""


#: The layout of a file whose metadata names none (written before layouts were recorded).
DEFAULT_LAYOUT = "imagefolder"


#: The metadata's ``format``.
FORMAT_NAME = "pipeprof-packed-images"
#: The deepest nesting of JSON arrays and objects the metadata may have (serde_json's limit, so
#: that this reader and pipeprof's refuse the same files).
MAX_DEPTH = 127
_LAYOUTS = ("imagefolder", "keras", "pipeprof")
#: Each ``size`` mode and the unsigned 32-bit fields it needs.
_SIZE_FIELDS = {"fixed": ("height", "width"), "shorter": ("shorter",), "as-stored": (), "common": ()}
_HEX = re.compile(r"(?:[0-9a-f]{2})*")


def _u32(v):
    return type(v) is int and 0 <= v <= 0xFFFFFFFF


def _strs(v):
    return isinstance(v, list) and all(type(s) is str for s in v)


def _size_ok(v):
    mode = v.get("mode") if isinstance(v, dict) else None
    return isinstance(mode, str) and mode in _SIZE_FIELDS and all(_u32(v.get(k)) for k in _SIZE_FIELDS[mode])


def _exact_ok(v, meta):
    """``exact`` (absent or null when every name is UTF-8): the names that are not, as their
    bytes' lowercase hex: ``source``, and ``classes`` / ``names`` as ``[index, hex]`` pairs,
    indices increasing, inside their list."""
    if v is None:
        return True
    source = v.get("source") if isinstance(v, dict) else 0
    if source is not None and not (type(source) is str and _HEX.fullmatch(source)):
        return False
    for key in ("classes", "names"):
        pairs, last = v.get(key, []), -1
        if not isinstance(pairs, list):
            return False
        for p in pairs:
            if not (isinstance(p, list) and len(p) == 2 and type(p[0]) is int and last < p[0] < len(meta[key])):
                return False
            if not (type(p[1]) is str and _HEX.fullmatch(p[1])):
                return False
            last = p[0]
    return True


#: (key, required, check) for each key the metadata may have (pipeprof's MetaJson).
_KEYS = (
    ("format", True, lambda v, m: v == FORMAT_NAME),
    ("source", True, lambda v, m: type(v) is str),
    ("model", False, lambda v, m: v is None or type(v) is str),
    ("layout", False, lambda v, m: type(v) is str and v in _LAYOUTS),
    ("size", True, lambda v, m: _size_ok(v)),
    ("resample", True, lambda v, m: type(v) is str),
    ("classes", True, lambda v, m: _strs(v)),
    ("names", True, lambda v, m: _strs(v)),
    ("skipped", True, lambda v, m: isinstance(v, list) and all(isinstance(p, list) and len(p) == 2 and _strs(p) for p in v)),
    ("exact", False, _exact_ok),
)


def _json_problem(v, depth=1):
    """Why parsed JSON ``v`` is not what pipeprof's reader (serde_json) parses: nested deeper
    than :data:`MAX_DEPTH`, a string with a lone surrogate (``\\udce9``: not UTF-8), a number
    out of a double's range; ``None`` when it is fine."""
    if isinstance(v, (dict, list)):
        if depth > MAX_DEPTH:
            return f"nested deeper than {MAX_DEPTH} levels"
        items = list(v) + list(v.values()) if isinstance(v, dict) else v
        if all(type(x) is str for x in items):
            return _json_problem("".join(items))
        return next((p for p in (_json_problem(x, depth + 1) for x in items) if p), None)
    if type(v) is str:
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            return "a string that is not UTF-8 (a lone surrogate escape)"
    elif type(v) in (int, float):
        try:
            if not math.isfinite(float(v)):
                return "a number out of range"
        except OverflowError:
            return "a number out of range"
    return None


def _no_constant(name):
    raise ValueError(f"{name} is not JSON")


def parse_meta(raw):
    """The metadata bytes ``raw`` parsed and checked as pipeprof's reader checks them; raises
    ``ValueError`` saying why not (the caller names the file)."""
    try:
        m = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except RecursionError:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as e:
        raise ValueError(f"not UTF-8 JSON: {e}") from None
    if not isinstance(m, dict):
        raise ValueError(f"a JSON {type(m).__name__}, not an object")
    why = _json_problem(m)
    if why:
        raise ValueError(why)
    for key, required, ok in _KEYS:
        if key not in m:
            if required:
                raise ValueError(f"no {key!r}")
        elif not ok(m[key], m):
            raise ValueError(f"{key!r} is not what this format keeps there")
    return m


def _exact(meta):
    """(source, classes, names) with the names ``exact`` keeps as ``os.fsdecode`` gives them."""
    exact = meta.get("exact") or {}
    lists = {}
    for key in ("classes", "names"):
        lists[key] = list(meta[key])
        for i, h in exact.get(key, []):
            lists[key][i] = os.fsdecode(bytes.fromhex(h))
    source = os.fsdecode(bytes.fromhex(exact["source"])) if exact.get("source") is not None else meta["source"]
    return source, lists["classes"], lists["names"]


class PackedFile:
    """One packed file: its header, labels, index and metadata read and checked (header CRC,
    and the metadata as pipeprof's own reader checks it) at open, the file kept open, each
    image read from it and checked against its CRC-32 when asked for.

    ``layout`` says whose folder rules chose the files, classes and order: ``"imagefolder"``
    (torchvision's, ``pipeprof pack``'s default), ``"keras"`` (``pipeprof pack --layout
    keras``: ``image_dataset_from_directory``'s) or ``"pipeprof"`` (``pipeprof cache``)."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self._load()

    @property
    def layout(self):
        return self.meta.get("layout", DEFAULT_LAYOUT)

    def command(self, layout=None):
        """The ``pipeprof pack`` command that packs this file's folder again, with ``layout``
        (default: the file's own)."""
        return self._command(getattr(self, "meta", None) or {}, layout)

    def _fail(self, what):
        return PackedFileError(f"{self.path}: {what}: rebuild it with `{self.rebuild}`")

    @property
    def rebuild(self):
        """The command that rebuilds this file (placeholders where the metadata is unknown)."""
        return self._command(getattr(self, "meta", None) or {}, None)

    def _command(self, meta, layout):
        layout = layout or meta.get("layout", DEFAULT_LAYOUT)
        size = meta.get("size") or {}
        h, w = size.get("height"), size.get("width")
        flag = {
            "fixed": lambda: f"--size {h}" if h == w else f"--size {w}x{h}",
            "shorter": lambda: f"--shorter {size.get('shorter')}",
            "as-stored": lambda: "--as-stored",
        }.get(size.get("mode"), lambda: "--size S")()
        tail = " --layout keras" if layout == "keras" else ""
        return f"pipeprof pack {meta.get('source', 'DIR')} {self.path} {flag}".rstrip() + tail

    def _load(self):
        f = open(self.path, "rb")
        try:
            self._read(f)
        except BaseException:
            f.close()
            raise
        # Kept open: every process reads the pixels of this file, whatever the path names later.
        self._file = f
        st = os.fstat(f.fileno())
        self._identity = (st.st_dev, st.st_ino, st.st_size, self._crc)

    def _read(self, f):
        """Reads and checks the header, labels, checksums, index and metadata of open file ``f``."""
        size = os.fstat(f.fileno()).st_size
        head = f.read(HEADER_LEN)
        if len(head) < 8 or head[:8] != MAGIC:
            raise PackedFileError(f"{self.path}: not a pipeprof packed file (no PPK magic bytes): make one with `pipeprof pack DIR {self.path} --size S`")
        if len(head) < HEADER_LEN:
            raise self._fail(f"damaged (truncated: {size} bytes, shorter than the {HEADER_LEN}-byte header)")
        (version, h, w, c, n, _fp, pixels_off, labels_off, crcs_off, meta_off, meta_len, file_len, index_off) = _HEADER.unpack_from(head, 8)
        if version != VERSION:
            older = "an older pipeprof (`pipeprof cache`)" if version < VERSION else "a newer pipeprof"
            raise self._fail(f"packed format version {version}, written by {older}; this reader reads version {VERSION}")
        if file_len != size:
            how = "truncated" if size < file_len else "longer than written"
            raise self._fail(f"damaged ({how}: {size} bytes, the header says {file_len})")
        sections = [("pixels", pixels_off, 0), ("labels", labels_off, 4 * n), ("checksums", crcs_off, 4 * n), ("index", index_off, ENTRY.itemsize * n), ("metadata", meta_off, meta_len)]
        parts = []
        for name, off, length in sections:
            if off < HEADER_LEN or off + length > size:
                raise self._fail(f"damaged (the {name} section lies outside the file)")
            f.seek(off)
            parts.append(f.read(length))
        if c not in (1, 3) or (h == 0) != (w == 0):
            raise self._fail(f"damaged (impossible image shape {h}×{w}×{c})")
        crc = zlib.crc32(head[:_CRC_AT] + b"\0\0\0\0")
        for p in parts:
            crc = zlib.crc32(p, crc)
        if crc != struct.unpack_from("<I", head, _CRC_AT)[0]:
            raise self._fail("damaged (header checksum mismatch)")
        self._crc, self._head = crc, head
        _, labels_b, crcs_b, index_b, meta_b = parts
        try:
            self.meta = parse_meta(meta_b)
        except ValueError as e:
            raise self._fail(f"damaged (unreadable metadata: {e})") from None
        self.labels = np.frombuffer(labels_b, dtype="<u4")
        self.crcs = np.frombuffer(crcs_b, dtype="<u4")
        self.index = np.frombuffer(index_b, dtype=ENTRY)
        self.source, self.classes, self.names = _exact(self.meta)
        self.channels, self.height, self.width = c, h, w
        self.pixels_off, self.pixels_end = pixels_off, labels_off
        self._check(n)

    def _check(self, n):
        """The index must describe images one after another inside the pixel section, each of
        the header's size when it has one."""
        if len(self.names) != n or (n and int(self.labels.max()) >= len(self.classes)):
            raise self._fail("damaged (the index does not match the metadata)")
        hs, ws = self.index["height"], self.index["width"]
        if self.height and n and (np.any(hs != self.height) or np.any(ws != self.width)):
            raise self._fail(f"damaged (an image's size in the index is not the header's {self.height}×{self.width})")
        lengths = hs.astype(np.uint64) * ws * self.channels
        ends = self.pixels_off + np.cumsum(lengths, dtype=np.uint64)
        starts = np.concatenate(([self.pixels_off], ends[:-1])).astype(np.uint64)
        if n and (np.any(self.index["offset"] != starts) or int(ends[-1]) > self.pixels_end or not lengths.all()):
            raise self._fail("damaged (the per-image index does not describe the pixels)")

    def __len__(self):
        return len(self.labels)

    def _changed(self, what="replaced or rewritten"):
        return PackedFileError(
            f"{self.path}: the file changed since it was opened ({what}): its index and "
            "targets no longer describe its pixels; open it again (re-create the dataset and the DataLoader)"
        )

    def _read_into(self, out, i, check=True):
        """Image ``i``'s pixels read into the C-contiguous uint8 array ``out`` (``os.preadv``
        on the file opened at load, so a forked worker reads that file too), checked against
        its CRC-32 unless ``check`` is false."""
        view, at, off = memoryview(out).cast("B"), 0, int(self.index[i]["offset"])
        while at < len(view):
            try:
                got = os.preadv(self._file.fileno(), [view[at:]], off + at)
            except OSError as e:
                raise self._changed(f"image {i} cannot be read: {e}") from None
            if got == 0:
                raise self._changed(f"truncated: image {i} lies past its end now")
            at += got
        if check and zlib.crc32(view) != int(self.crcs[i]):
            raise self._changed(f"rewritten in place: image {i} ({self.names[i]}) is not the image packed there")
        return out

    def close(self):
        """Closes the file: later reads fail."""
        self._file.close()

    def image(self, i):
        """Image ``i`` as a new (height, width, channels) uint8 array, read from the file and
        checked against its CRC-32 (:class:`PackedFileError` when the file changed since it was
        opened)."""
        e = self.index[i]
        return self._read_into(np.empty((int(e["height"]), int(e["width"]), self.channels), dtype=np.uint8), i)

    def verify(self):
        """Checks every image's pixels against its CRC-32 (reads the whole file); raises
        :class:`PackedFileError` naming the first that differs."""
        for i in range(len(self)):
            e = self.index[i]
            px = self._read_into(np.empty(int(e["height"]) * int(e["width"]) * self.channels, dtype=np.uint8), i, check=False)
            if zlib.crc32(px) != int(self.crcs[i]):
                raise self._fail(f"damaged (checksum mismatch in image {i} ({self.names[i]}))")

    def batch(self, indices):
        """Images ``indices`` stacked as (n, height, width, channels) uint8, each read and checked
        as :meth:`image`: every image must have the file's one size (``height`` and ``width``
        not 0)."""
        if not self.height:
            raise ValueError(f"{self.path}: the images differ in size: read them one by one, or resize them to one size")
        which = np.arange(len(self))[np.asarray(indices)]
        out = np.empty(which.shape + (self.height, self.width, self.channels), dtype=np.uint8)
        flat = out.reshape((-1, self.height, self.width, self.channels))
        for k, i in enumerate(which.ravel().tolist()):
            self._read_into(flat[k], i)
        return out

    def __getstate__(self):
        # The open file is not pickled: a spawned worker opens the path again, and the
        # identity tells it whether that is still the file read here.
        return {"path": self.path, "identity": self._identity}

    def __setstate__(self, state):
        self.path = state["path"]
        self._load()
        if "identity" in state and tuple(state["identity"]) != self._identity:
            self.close()
            raise self._changed()


class PackedImageFolder:
    """``torchvision.datasets.ImageFolder`` read from a file ``pipeprof pack`` wrote.

    ``transform`` takes the PIL RGB image (or, with ``as_tensor=True``, a CHW uint8 torch
    tensor), ``target_transform`` the class index, as ImageFolder's do. The images are stored
    at the size they were packed at (``pipeprof pack DIR OUT --size 224``): a ``Resize`` to
    that size in the transform has nothing left to do.
    """

    def __init__(self, path, transform=None, target_transform=None, as_tensor=False):
        self.file = PackedFile(path)
        if self.file.layout != DEFAULT_LAYOUT:
            warnings.warn(
                f"{self.file.path} was packed with --layout {self.file.layout}: its classes, files and order are "
                f"not torchvision ImageFolder's (Keras's skip hidden class folders and read only .bmp .gif .jpeg "
                f".jpg .png); for PyTorch, pack it with `{self.file.command('imagefolder')}`",
                stacklevel=2,
            )
        self.transform = transform
        self.target_transform = target_transform
        self.as_tensor = as_tensor
        self._cached = {}

    def _once(self, name, make):
        """An attribute made on first use and kept (not pickled: a worker makes its own)."""
        if name not in self._cached:
            self._cached[name] = make()
        return self._cached[name]

    @property
    def root(self):
        """The folder that was packed."""
        return self.file.source

    @property
    def classes(self):
        return self.file.classes

    @property
    def class_to_idx(self):
        return self._once("class_to_idx", lambda: {c: i for i, c in enumerate(self.file.classes)})

    @property
    def targets(self):
        return self._once("targets", lambda: self.file.labels.tolist())

    @property
    def samples(self):
        """(path, class index) per image, in ImageFolder's order; the paths name the packed
        folder's files (they need not exist any more)."""
        root = self.root
        return self._once("samples", lambda: [(os.path.join(root, n), t) for n, t in zip(self.file.names, self.targets)])

    @property
    def imgs(self):
        return self.samples

    def __len__(self):
        return len(self.file)

    def __getitem__(self, index):
        i = operator.index(index)
        n = len(self.file)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"index {index} out of range for {n} images")
        px = self.file.image(i)
        if px.shape[2] == 1:
            px = np.repeat(px, 3, axis=2)
        if self.as_tensor:
            import torch

            img = torch.from_numpy(np.ascontiguousarray(px.transpose(2, 0, 1)))
        else:
            from PIL import Image

            img = Image.fromarray(np.asarray(px))
        target = int(self.file.labels[i])
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return img, target

    def __getstate__(self):
        return {**self.__dict__, "_cached": {}}

    def __repr__(self):
        return f"PackedImageFolder({self.file.path!r}: {len(self)} images, {len(self.classes)} classes)"


# --- Keras: a packed file as image_dataset_from_directory's dataset ---------------------------
# For Keras programs (offered as pipeprof.keras.packed_dataset); Keras is imported only when
# asked for. Nothing here is timed or installed.

_LABEL_MODES = ("int", "categorical", "binary", None)


def packed_dataset(
    path,
    batch_size=32,
    image_size=None,
    shuffle=True,
    seed=None,
    label_mode="int",
    validation_split=None,
    subset=None,
    interpolation="bilinear",
    workers=1,
    use_multiprocessing=False,
    max_queue_size=10,
):
    """What ``keras.utils.image_dataset_from_directory(DIR, ...)`` returns, read from the file
    ``pipeprof pack DIR OUT --layout keras`` wrote: batches of float32 images (batch, height, width, 3) in
    0–255 and their labels (``label_mode`` "int": int32, "categorical": one-hot, "binary":
    float32 (batch, 1), None: images only), with ``class_names`` and ``file_paths``.

    On the TensorFlow backend a ``tf.data.Dataset``; on the others a ``keras.utils.PyDataset``
    (``workers``, ``use_multiprocessing``, ``max_queue_size`` are its). ``image_size=None``
    keeps the packed size (the file must hold one size); another size is resized to
    (``tf.image.resize`` / ``keras.ops.image.resize`` with ``interpolation``, as Keras does).
    ``validation_split`` and ``subset`` ("training", "validation", "both") split as Keras does:
    the same seed gives the same split of the same files. Shuffling reshuffles every epoch.

    The file must be packed with Keras's folder rules (``pipeprof pack DIR OUT --layout
    keras``); another layout is refused with :class:`pipeprof.data.PackedFileError`. The
    source folder is not looked at: re-pack after changing it.
    """
    if label_mode not in _LABEL_MODES:
        raise ValueError(f"label_mode must be one of {_LABEL_MODES}, got {label_mode!r}")
    f = PackedFile(path)
    if f.layout != "keras":
        f.close()
        raise PackedFileError(
            f"{f.path} was packed with the {f.layout} layout, not Keras's: image_dataset_from_directory "
            "skips hidden class folders, reads only .bmp .gif .jpeg .jpg .png and orders them its own way, "
            f"so the classes, labels and files would differ; re-pack it with `{f.command('keras')}`"
        )
    if label_mode == "binary" and len(f.classes) != 2:
        raise ValueError(f"label_mode='binary' needs 2 classes; {f.path} has {len(f.classes)}")
    if image_size is None and not f.height:
        raise ValueError(f"{f.path}: the images differ in size (packed with --shorter or --as-stored): pass image_size=(height, width)")
    size = tuple(int(v) for v in image_size) if image_size is not None else (f.height, f.width)
    parts, seed = _packed_split(len(f), shuffle, seed, validation_split, subset)
    keras = keras_module()
    make = _packed_tf if backend_of(keras) == "tensorflow" else _packed_py
    out = [
        make(keras, f, idx, batch_size, size, shuffle, seed, label_mode, interpolation, (workers, use_multiprocessing, max_queue_size))
        for idx in parts
    ]
    for d, idx in zip(out, parts):
        d.class_names = list(f.classes)
        d.file_paths = [os.path.join(f.meta.get("source", ""), f.names[i]) for i in idx]
    return out if subset == "both" else out[0]


def _packed_split(n, shuffle, seed, validation_split, subset):
    """The image indices of each subset asked for, and the seed used: Keras's order (one
    ``RandomState(seed).shuffle`` of the files when shuffling) and its split (the last
    ``int(validation_split * n)`` for validation)."""
    import numpy as np

    if subset not in ("training", "validation", "both", None):
        raise ValueError(f'subset must be "training", "validation", "both" or None, got {subset!r}')
    if validation_split and not 0 < validation_split < 1:
        raise ValueError(f"validation_split must be between 0 and 1, got {validation_split}")
    if bool(validation_split) != (subset is not None):
        raise ValueError("validation_split and subset go together: give both or neither")
    if validation_split and shuffle and seed is None:
        raise ValueError("with validation_split and shuffle, give a seed: the training and validation calls must shuffle alike")
    order = np.arange(n)
    if shuffle:
        if seed is None:
            seed = int(np.random.randint(1_000_000))
        np.random.RandomState(seed).shuffle(order)
    if not validation_split:
        return [order], seed
    val = int(validation_split * n)
    parts = {"training": order[: n - val], "validation": order[n - val :]}
    return ([parts["training"], parts["validation"]] if subset == "both" else [parts[subset]]), seed


def _packed_stored(f, idx):
    """float32 (len(idx), h, w, 3) images at the file's one size (a slice of the map)."""
    import numpy as np

    x = f.batch(idx).astype(np.float32)
    return np.repeat(x, 3, axis=3) if x.shape[3] == 1 else x


def _packed_one(f, i):
    """float32 (h, w, 3): image ``i`` at its own size."""
    import numpy as np

    x = f.image(int(i)).astype(np.float32)
    return np.repeat(x, 3, axis=2) if x.shape[2] == 1 else x


def _packed_tf(keras, f, idx, batch_size, size, shuffle, seed, label_mode, interpolation, _pydataset_args):
    """A tf.data pipeline: indices → (shuffle) → images read by NumPy in parallel calls (a
    batch at a time when the file holds one size), resized by ``tf.image.resize`` when the size
    asked for is another, labels gathered by TensorFlow → prefetch."""
    import numpy as np
    import tensorflow as tf

    labels = tf.constant(f.labels.astype(np.int32))
    n_classes = len(f.classes)

    def output(x, batch):
        if label_mode is None:
            return x
        y = tf.gather(labels, batch)
        if label_mode == "categorical":
            y = tf.one_hot(y, n_classes)
        elif label_mode == "binary":
            y = tf.cast(tf.expand_dims(y, -1), tf.float32)
        return x, y

    def resized(x):
        return x if tuple(x.shape[-3:-1]) == size else tf.image.resize(x, size, method=interpolation)

    def stored(batch):
        x = tf.numpy_function(lambda b: _packed_stored(f, b), [batch], tf.float32)
        return output(resized(tf.ensure_shape(x, [None, f.height, f.width, 3])), batch)

    def one(i):
        x = tf.numpy_function(lambda j: _packed_one(f, j), [i], tf.float32)
        return tf.image.resize(tf.ensure_shape(x, [None, None, 3]), size, method=interpolation), i

    ds = tf.data.Dataset.from_tensor_slices(np.asarray(idx, dtype=np.int64))
    if shuffle:
        ds = ds.shuffle(len(idx), seed=seed, reshuffle_each_iteration=True)
    if f.height:
        ds = ds.batch(batch_size).map(stored, num_parallel_calls=tf.data.AUTOTUNE)
    else:
        ds = ds.map(one, num_parallel_calls=tf.data.AUTOTUNE).batch(batch_size).map(output)
    return ds.prefetch(tf.data.AUTOTUNE)


def _packed_py(keras, f, idx, batch_size, size, shuffle, seed, label_mode, interpolation, pydataset_args):
    workers, use_multiprocessing, max_queue_size = pydataset_args
    cls = _packed_pydataset_class()
    return cls(f, idx, batch_size, size, shuffle, seed, label_mode, interpolation, workers=workers, use_multiprocessing=use_multiprocessing, max_queue_size=max_queue_size)


def _packed_pydataset_class():
    """``_PackedPyDataset``: made on first use (it subclasses Keras's PyDataset, and Keras is
    imported only when asked for); found by name when a worker unpickles it (``__getattr__``)."""
    cls = globals().get("_PackedPyDataset")
    if cls is not None:
        return cls
    import numpy as np

    keras = keras_module()

    class _PackedPyDataset(keras.utils.PyDataset):
        def __init__(self, file, indices, batch_size, size, shuffle, seed, label_mode, interpolation, **kwargs):
            super().__init__(**kwargs)
            self.file, self.batch_size, self.size = file, int(batch_size), tuple(size)
            self.shuffle, self.label_mode, self.interpolation = shuffle, label_mode, interpolation
            self._rng = np.random.default_rng(seed)
            self._order = np.array(indices)
            if shuffle:
                self._rng.shuffle(self._order)

        def __len__(self):
            return -(-len(self._order) // self.batch_size)

        def _images(self, idx):
            f, k = self.file, keras_module()
            if f.height and (f.height, f.width) == self.size:
                return _packed_stored(f, idx)
            if f.height:
                x = k.ops.image.resize(_packed_stored(f, idx), self.size, interpolation=self.interpolation)
            else:
                x = k.ops.stack([k.ops.image.resize(_packed_one(f, i), self.size, interpolation=self.interpolation) for i in idx])
            return np.asarray(k.ops.convert_to_numpy(x), dtype=np.float32)

        def __getitem__(self, b):
            if not 0 <= b < len(self):
                raise IndexError(f"batch {b} out of range for {len(self)} batches")
            idx = self._order[b * self.batch_size : (b + 1) * self.batch_size]
            x = self._images(idx)
            if self.label_mode is None:
                return x
            y = self.file.labels[idx].astype(np.int32)
            if self.label_mode == "categorical":
                y = np.eye(len(self.file.classes), dtype=np.float32)[y]
            elif self.label_mode == "binary":
                y = y.astype(np.float32)[:, None]
            return x, y

        def on_epoch_end(self):
            if self.shuffle:
                self._rng.shuffle(self._order)

    _PackedPyDataset.__module__ = __name__
    _PackedPyDataset.__qualname__ = "_PackedPyDataset"
    globals()["_PackedPyDataset"] = _PackedPyDataset
    return _PackedPyDataset


def __getattr__(name):
    # A spawned PyDataset worker unpickles `pipeprof.data._PackedPyDataset` by name.
    if name == "_PackedPyDataset":
        return _packed_pydataset_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
