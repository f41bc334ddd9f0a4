"""Read a file written by ``pipeprof pack`` (pure Python and NumPy; torch and PIL only when asked).

    pipeprof pack data/train data.ppk --size 224

    from pipeprof.data import PackedImageFolder
    train = PackedImageFolder("data.ppk", transform=transforms.Compose([...]))
    # in place of torchvision.datasets.ImageFolder("data/train", transform=...)

``classes``, ``class_to_idx``, ``samples``, ``targets`` and the order are those of
``torchvision.datasets.ImageFolder`` on the folder packed; an item is ``(PIL RGB image,
target)`` (a CHW uint8 tensor with ``as_tensor=True``), so the program's transforms still apply.
The file is opened once and kept open; its pixels are mapped (``numpy.memmap``) from that
open file on first use in each process: a forked DataLoader worker maps the very file the
dataset read its index and targets from, even if another file has taken its name since. A
spawned worker (pickling carries the path and the file's identity, not the map) opens the path
again and refuses it, with :class:`PackedFileError`, if it is not the same file any more.

The readers do not look at the folder that was packed: a file packed before images were added,
removed or changed there still reads as it was packed (run ``pipeprof pack`` again after such
changes; ``pipeprof profile --data FILE`` does check).

The format is documented in docs/packed-format.md; :class:`PackedFile` is the reader.
"""

from __future__ import annotations

import json
import operator
import os
import struct
import warnings
import zlib

import numpy as np

__all__ = ["PackedImageFolder", "PackedFile", "PackedFileError", "VERSION"]

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


class PackedFile:
    """One packed file: its header, labels, index and metadata read and checked (header CRC)
    at open, the file kept open, its pixels mapped from it on the first :meth:`image` in each
    process.

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
        # Kept open: every process maps the pixels of this file, whatever the path names later.
        self._file = f
        st = os.fstat(f.fileno())
        self._identity = (st.st_dev, st.st_ino, st.st_size, self._crc)
        self._map, self._pid = None, os.getpid()

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
        sections = [("labels", labels_off, 4 * n), ("checksums", crcs_off, 4 * n), ("index", index_off, ENTRY.itemsize * n), ("metadata", meta_off, meta_len)]
        parts = []
        for name, off, length in sections:
            if off < HEADER_LEN or off + length > size:
                raise self._fail(f"damaged (the {name} section lies outside the file)")
            f.seek(off)
            parts.append(f.read(length))
        crc = zlib.crc32(head[:_CRC_AT] + b"\0\0\0\0")
        for p in parts:
            crc = zlib.crc32(p, crc)
        if crc != struct.unpack_from("<I", head, _CRC_AT)[0]:
            raise self._fail("damaged (header checksum mismatch)")
        self._crc, self._head = crc, head
        labels_b, crcs_b, index_b, meta_b = parts
        try:
            self.meta = json.loads(meta_b.decode("utf-8"))
        except ValueError:
            raise self._fail("damaged (unreadable metadata)") from None
        self.labels = np.frombuffer(labels_b, dtype="<u4")
        self.crcs = np.frombuffer(crcs_b, dtype="<u4")
        self.index = np.frombuffer(index_b, dtype=ENTRY)
        self.classes = list(self.meta.get("classes", []))
        self.names = list(self.meta.get("names", []))
        self.channels, self.height, self.width = c, h, w
        self.pixels_off, self.pixels_end = pixels_off, labels_off
        self._check(n)

    def _check(self, n):
        """The index must describe images one after another inside the pixel section."""
        if len(self.names) != n or (n and int(self.labels.max()) >= len(self.classes)):
            raise self._fail("damaged (the index does not match the metadata)")
        lengths = self.index["height"].astype(np.uint64) * self.index["width"] * self.channels
        ends = self.pixels_off + np.cumsum(lengths, dtype=np.uint64)
        starts = np.concatenate(([self.pixels_off], ends[:-1])).astype(np.uint64)
        if n and (np.any(self.index["offset"] != starts) or int(ends[-1]) > self.pixels_end or not lengths.all()):
            raise self._fail("damaged (the per-image index does not describe the pixels)")

    def __len__(self):
        return len(self.labels)

    def _changed(self):
        return PackedFileError(
            f"{self.path}: the file changed since it was opened (replaced or rewritten): its index and "
            "targets no longer describe its pixels; open it again (re-create the dataset and the DataLoader)"
        )

    def _pixels(self):
        """The pixel section, mapped from the file opened at load, once per process: a forked
        worker maps the same file through the inherited descriptor, after checking that it was
        not rewritten in place (its length and header as read at open)."""
        if self._map is None or self._pid != os.getpid():
            fd = self._file.fileno()
            if self._pid != os.getpid() and (os.fstat(fd).st_size != self._identity[2] or os.pread(fd, HEADER_LEN, 0) != self._head):
                raise self._changed()
            length = self.pixels_end - self.pixels_off
            self._map = np.memmap(self._file, dtype=np.uint8, mode="r", offset=self.pixels_off, shape=(length,))
            self._pid = os.getpid()
        return self._map

    def close(self):
        """Closes the file (and drops the map): later reads fail."""
        self._map = None
        self._file.close()

    def image(self, i):
        """Image ``i`` as a read-only (height, width, channels) uint8 array (a view of the map)."""
        e = self.index[i]
        h, w = int(e["height"]), int(e["width"])
        start = int(e["offset"]) - self.pixels_off
        return self._pixels()[start : start + h * w * self.channels].reshape(h, w, self.channels)

    def verify(self):
        """Checks every image's pixels against its CRC-32 (reads the whole file); raises
        :class:`PackedFileError` naming the first that differs."""
        for i in range(len(self)):
            if zlib.crc32(self.image(i)) != int(self.crcs[i]):
                raise self._fail(f"damaged (checksum mismatch in image {i} ({self.names[i]}))")

    def batch(self, indices):
        """Images ``indices`` stacked as (n, height, width, channels) uint8: every image must
        have the file's one size (``height`` and ``width`` not 0)."""
        if not self.height:
            raise ValueError(f"{self.path}: the images differ in size: read them one by one, or resize them to one size")
        whole = self._pixels()[: len(self) * self.height * self.width * self.channels]
        return whole.reshape(len(self), self.height, self.width, self.channels)[np.asarray(indices)]

    def __getstate__(self):
        # Neither the map nor the open file is pickled: a spawned worker opens the path again,
        # and the identity tells it whether that is still the file read here.
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
        return self.file.meta.get("source", "")

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
