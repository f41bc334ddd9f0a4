"""PIL, patched once for every loader under ``pipeprof run``: ``Image.open`` (``read``),
``ImageFile.load`` (``decode``), ``Image.convert`` (``decode`` where it decodes a file opened
lazily, the pixels' first use, else ``convert``: pixels already in memory, ``Image.fromarray``
of torchvision's MNIST and CIFAR, are never a decode) and ``Image.resize`` (``resize``, for
Keras's ``load_img``).

Who times a call is read from where the thread is in a loader's work (``_state.THREAD``, the
one thread-local the DataLoader fetcher and the Keras loaders share):

* inside a Keras loader (a ``PyDataset`` batch, ``load_img``: ``_keras_data``): ``open``,
  ``load`` (where the image still has tiles to decode) and ``resize`` (less the decode it set
  off) with the thread's wall, CPU and run-queue clocks, each its span in a batch, or added to
  ``load_img``'s parts; ``convert`` is no span of its own there (the ``load`` inside it is).
  A PIL call inside one timed so is its own.
* inside a DataLoader fetcher's samples (``_torch_fetch``): the outermost PIL call is a span
  (``read``, ``decode``, ``convert``; the Layer times its CPU), the calls inside it and inside a
  torchvision transform time nothing; ``resize`` is no span (torchvision's ``Resize`` is one).
* elsewhere: nothing (a thread-local read or two per call).

It never changes what PIL returns or raises.
"""

from __future__ import annotations

import time

import pipeprof
from pipeprof import _native, _state

_now = _native.now_ns
_cpu = time.thread_time_ns
_queue = _native.thread_queue_ns
_T = _state.THREAD


# ---------------------------------------------------------------- the Keras loaders' clocks


class Clock:
    """Wall, CPU and run-queue readings of the calling thread, and the differences."""

    __slots__ = ("wall", "cpu", "queue")

    def __init__(self):
        self.wall, self.cpu, self.queue = _now(), _cpu(), _queue()

    def since(self, c0):
        q = None if self.queue is None or c0.queue is None else max(0, self.queue - c0.queue)
        return [max(0, self.wall - c0.wall), max(0, self.cpu - c0.cpu), q]


def sub(a, b):
    """``a - b`` of two (wall, cpu, queue) readings, none below 0 (queue None where either is)."""
    return [max(0, a[0] - b[0]), max(0, a[1] - b[1]), None if a[2] is None or b[2] is None else max(0, a[2] - b[2])]


def add(a, b):
    """``a + b`` of two (wall, cpu, queue) readings (queue None where either is)."""
    return [a[0] + b[0], a[1] + b[1], None if a[2] is None or b[2] is None else a[2] + b[2]]


def record(stage, start, d):
    """A span of ``stage`` from ``start`` for ``d`` = (wall, cpu, queue), when it lasted."""
    if d[0] > 0:
        _native.record(stage, start, d[0], None, d[1], d[2])


def _keras_to():
    """Where a Keras loader takes this thread's PIL times: ``load_img``'s parts (a dict), its
    batch (True: each call a span), or None outside one."""
    acc = _T.img
    if acc is not None:
        return acc
    return True if _T.in_item else None


def _keras_done(stage, c0, d, to):
    if to is True:
        _T.item_covered = True
        record(stage, c0.wall, d)
    else:
        to[stage] = add(to[stage], d)


# ---------------------------------------------------------------- the DataLoader's spans


class Stage:
    """A loader-stage span inside a DataLoader fetcher's samples that does not nest: inside
    another one (a PIL call in a PIL call, in a torchvision transform, in a Keras loader) it
    times nothing."""

    __slots__ = ("stage", "span")

    def __init__(self, stage):
        self.stage = stage
        self.span = None

    def __enter__(self):
        d = _T.depth
        _T.depth = d + 1
        if d == 0 and _T.in_fetch:
            self.span = pipeprof.span(self.stage)
            self.span.__enter__()
            _T.fetch_covered = True
        return self

    def __exit__(self, *exc):
        _T.depth -= 1
        if self.span is not None:
            self.span.__exit__(*exc)
        return False


def _unloaded(img):
    """A lazily opened file not decoded yet: Pillow's ``tile`` lists what ``load`` will
    decode, and is empty once it has (and on an image made in memory)."""
    try:
        return bool(img.tile)
    except Exception:
        return False


# ---------------------------------------------------------------- the patches


def _wrapped(func, orig, name):
    func.__wrapped__ = orig
    func.__name__ = getattr(orig, "__name__", name)
    func.__doc__ = getattr(orig, "__doc__", None)
    func._pipeprof = True
    return func


def _open(orig, preinit=None):
    # PIL imports its format plugins in its first open (``Image.preinit``): an import, tens of
    # ms, not a read. Done before the first read's clock starts; PIL would do it there anyway.
    pending = [preinit]

    def open(*args, **kwargs):
        if pending[0] is not None:
            first, pending[0] = pending[0], None
            try:
                first()
            except Exception:
                pass  # PIL's own open tries again and says what is wrong
        to = _keras_to()
        if to is None or _T.pil_busy:
            with Stage("read"):
                return orig(*args, **kwargs)
        _T.pil_busy, c0 = True, Clock()
        try:
            return orig(*args, **kwargs)
        finally:
            _T.pil_busy = False
            _keras_done("read", c0, Clock().since(c0), to)

    return _wrapped(open, orig, "open")


def _load(orig):
    def load(self, *args, **kwargs):
        to = _keras_to()
        # An image already decoded has no tiles left: its load() is not a decode.
        if to is None or _T.pil_busy or not getattr(self, "tile", None):
            with Stage("decode"):
                return orig(self, *args, **kwargs)
        _T.pil_busy, c0 = True, Clock()
        try:
            return orig(self, *args, **kwargs)
        finally:
            _T.pil_busy = False
            d = Clock().since(c0)
            _T.decoded = add(_T.decoded, d)
            _keras_done("decode", c0, d, to)

    return _wrapped(load, orig, "load")


def _convert(orig):
    def convert(self, *args, **kwargs):
        with Stage("decode" if _unloaded(self) else "convert"):
            return orig(self, *args, **kwargs)

    return _wrapped(convert, orig, "convert")


def _resize(orig):
    def resize(self, *args, **kwargs):
        to = _keras_to()
        if to is None or _T.pil_busy:
            return orig(self, *args, **kwargs)
        before, c0 = _T.decoded, Clock()
        try:
            return orig(self, *args, **kwargs)
        finally:
            # A lazily opened image decodes inside resize: that part is decode.
            inner = sub(_T.decoded, before)
            _keras_done("resize", c0, sub(Clock().since(c0), inner), to)

    return _wrapped(resize, orig, "resize")


def _patch(owner, name, make):
    orig = getattr(owner, name)
    if not getattr(orig, "_pipeprof", False):
        setattr(owner, name, make(orig))


def install_image(image_mod):
    """``PIL.Image``'s ``open``, ``Image.convert`` and ``Image.resize`` (once)."""
    # Something inside a sample can time it now: the training thread times every batch.
    _native.fetch_inner()
    _patch(image_mod, "open", lambda orig: _open(orig, getattr(image_mod, "preinit", None)))
    _patch(image_mod.Image, "convert", _convert)
    _patch(image_mod.Image, "resize", _resize)


def install_imagefile(imagefile_mod):
    """``PIL.ImageFile.ImageFile.load`` (once)."""
    _native.fetch_inner()
    _patch(imagefile_mod.ImageFile, "load", _load)


def install():
    """Both, now (a Keras loader asks: it imports Pillow); ImportError without Pillow."""
    from PIL import Image, ImageFile

    install_image(Image)
    install_imagefile(ImageFile)
