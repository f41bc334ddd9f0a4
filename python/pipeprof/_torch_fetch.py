"""How a PyTorch DataLoader makes a batch, under ``pipeprof run``: in each worker process, or
on the training thread itself with ``num_workers=0``.

What it patches, once each: ``_MapDatasetFetcher.fetch`` (the samples of one batch, then
``collate_fn``) and the ``Compose`` of torchvision's transforms (v1 and v2). PIL is
:mod:`pipeprof._pil`'s, which times PIL inside the samples the fetcher marks (``_state.THREAD``).

Spans: ``read`` (``Image.open``; with torchvision's ``pil_loader``, the file's ``open`` too: on
a network drive the open is a round trip of its own), ``decode`` (PIL's ``load``/``convert``), and each transform
of a ``Compose`` by what its class does (:func:`stage_of_name`): ``resize`` (resizes and
crops), ``augment`` (random transforms), ``convert`` (``ToTensor``, ``Normalize``: the same
pixels as the tensor the model takes), ``transform`` (a class pipeprof does not know, named in
the run's ``transforms`` setting), each per sample with the thread's CPU and run-queue time. A batch whose samples none of those covered
(tensors already in memory, a format of its own) is one ``fetch`` span for the whole batch:
indexing an in-memory tensor costs microseconds, and timing every sample would cost more than
the sample. ``collate`` times ``collate_fn`` once per batch. A data set with ``__getitems__``
(one call for the batch, 🤗 ``datasets``' ``Dataset``) is timed the same way: what decodes and
transforms inside it (its ``Image`` feature's PIL decode, a ``with_transform`` Compose, cv2,
albumentations) is its stages; with none, one ``fetch`` span, collate included. On the training thread
(``num_workers=0``) one batch in ``MAIN_TIMED_EVERY`` is timed: see there.
"""

from __future__ import annotations

import os
import time

import pipeprof
from pipeprof import _native, _pil, _state

_now = _native.now_ns
_thread_time = time.thread_time_ns
_queue = _native.thread_queue_ns
_fetched = _native.fetched
#: Where this thread is in a loader's work (shared with ``_pil`` and ``_keras_data``).
_T = _state.THREAD

# A forked worker starts from the forking thread's state: it is not that thread (the extension
# asks anew whether the process is a worker, and counts its batches anew; ``_state`` forgets
# the Python side).
os.register_at_fork(after_in_child=_native.forget_thread_state)

def _since(a, b):
    """A clock's advance from reading ``a`` to ``b``; None where either was not read."""
    return None if a is None or b is None else max(0, b - a)


def _queued(q0):
    """The thread's run-queue wait since ``q0`` (a ``_queue()`` reading), or None when the
    kernel does not say: the off-CPU part of a span spent waiting for a core, not blocked."""
    return _since(q0, _queue())


def _name_worker():
    """Whether this process is a DataLoader worker (torch's worker info is the process's), and
    names a worker process; asked once a process, by the extension."""
    try:
        from torch.utils.data import get_worker_info

        info = get_worker_info()
    except Exception:
        info = None
    if info is not None:
        pipeprof.name_process(f"loader-{info.id}", worker=info.id)
    return info is not None


#: On the training thread (``num_workers=0``) one batch in this many is timed (``fetch`` and
#: ``collate``), and one in ``MAIN_CLOCKS_EVERY`` (a multiple) also reads the thread's CPU and
#: run-queue clocks (system calls, ≈ 1 µs each). What the diagnosis reads of them is per batch
#: (their means, their on-CPU and core-wait shares), which a sample of batches gives; the wait
#: they are part of is every step's. Timing every batch would cost the training thread more
#: than the samples of an in-memory data set cost (``python/benches/hook_cost.py``). A worker
#: times, and reads the clocks of, every batch; a batch whose samples are timed inside (PIL,
#: torchvision) is always timed.
MAIN_TIMED_EVERY = 4
MAIN_CLOCKS_EVERY = 32


#: Sends the timings of a batch the training thread made and held for a step that did not
#: take it (see ``_native.fetched``).
flush_batch = _native.flush_fetched


#: A hook that times inside a sample (PIL, torchvision) is installed: the extension times every
#: batch from then on, and tells ``_fetch_clocked`` (``inner``). Until then nothing inside a
#: sample can time it, and the training thread's batches skip the bookkeeping.
_inner = _native.fetch_inner


def _samples(self, index, getitems=None):
    """The fetcher's samples (``getitems(index)`` for a data set that makes a batch's in one
    call), and whether a PIL, torchvision, cv2 or albumentations span inside timed them."""
    _T.in_fetch, _T.fetch_covered = True, False
    try:
        if getitems is not None:
            return getitems(index), _T.fetch_covered
        ds = self.dataset
        return [ds[idx] for idx in index], _T.fetch_covered
    finally:
        _T.in_fetch = False


def _fetch_clocked(orig, self, index, worker, clocks, inner):
    """A timed batch: its fetch and collate, the thread's clocks around them when ``clocks``,
    and the spans inside its samples when ``inner`` (a PIL or torchvision hook is installed).
    Sent now by a worker, held for the step on the training thread."""
    # The clocks at the fetch's start, the collate's start and the end (``_native.Batch``).
    batch = _native.Batch(clocks)
    getitems = getattr(self.dataset, "__getitems__", None)
    if getitems and not inner:
        out = orig(self, index)
    else:
        # torch's fetch, step by step: the samples (a batch's in one call where the data set
        # has ``__getitems__``: 🤗 datasets decodes and transforms a batch so), then collate.
        data, covered = _samples(self, index, getitems or None) if inner else ([self.dataset[i] for i in index], False)
        # Where spans inside the samples timed them, the batch has no fetch span of its own.
        batch.collate(covered)
        out = self.collate_fn(data)
    batch.end()
    if worker:
        _native.batch_spans(batch)
        pipeprof.flush()
    else:
        # Inside the training loop's next(): held for its step, sent with it.
        _fetched(batch)
    return out


def install_fetch(fetch_mod):
    """``_MapDatasetFetcher.fetch``: the extension's own method (``_native.fetch_method``, no
    frame of ours under torch's, see ``_torch_loop``): with automatic batching, a worker times
    every batch (``_fetch_clocked``), the training thread 1 in ``MAIN_TIMED_EVERY`` (every one
    once a PIL or torchvision hook is installed), the others are torch's own ``fetch``."""
    Map = fetch_mod._MapDatasetFetcher
    orig = Map.fetch
    fetch = _native.fetch_method(
        base=Map,
        orig=orig,
        clocked=_fetch_clocked,
        is_worker=_name_worker,
        timed_every=MAIN_TIMED_EVERY,
        clocks_every=MAIN_CLOCKS_EVERY,
    )
    _state.TORCH.fetch_hook, _state.TORCH.fetch_orig = fetch, orig
    Map.fetch = fetch


#: torchvision's transforms (v1 and v2) by class name: what each does to a sample, so a
#: stage is named for the work and never guessed from its place in the ``Compose``.
#: Crops and resizes are ``resize`` (a random crop's cost is its resize, not its dice);
#: conversions to the tensor the model takes, at the same size, are ``convert``.
_KNOWN_STAGES = {
    "resize": (
        "Resize", "CenterCrop", "FiveCrop", "TenCrop", "Pad", "RandomResizedCrop", "RandomCrop",
        "RandomResize", "RandomShortestSize", "RandomIoUCrop", "ScaleJitter", "RandomZoomOut",
        "CenterCropOrPad", "SanitizeBoundingBoxes",
    ),
    "convert": (
        "ToTensor", "PILToTensor", "ToImage", "ToImageTensor", "ToImagePIL", "ToPILImage",
        "ToPureTensor", "ToDtype", "ConvertImageDtype", "ConvertDtype", "Normalize", "Grayscale",
        "ConvertBoundingBoxFormat", "ClampBoundingBoxes",
    ),
    "augment": (
        "ColorJitter", "GaussianBlur", "GaussianNoise", "AutoAugment", "RandAugment",
        "TrivialAugmentWide", "AugMix", "ElasticTransform", "RandomApply", "RandomChoice",
        "RandomOrder", "LinearTransformation", "JPEG",
    ),
}
_STAGE_OF_NAME = {name: stage for stage, names in _KNOWN_STAGES.items() for name in names}

#: Stage of each transform class met so far (one lookup per transform call).
_STAGE_OF_TYPE = {}
#: Class names timed as ``transform`` in this process: the run's ``transforms`` setting.
_UNKNOWN = set()


def stage_of_name(name):
    """The loader stage a transform class name stands for: a known torchvision class's,
    else ``augment`` for a ``Random…`` one, else None (the program's own code)."""
    stage = _STAGE_OF_NAME.get(name)
    if stage is None and name.startswith("Random"):
        stage = "augment"
    return stage


def _stage_of(transform):
    t = type(transform)
    stage = _STAGE_OF_TYPE.get(t)
    if stage is None:
        name = getattr(t, "__name__", "?")
        stage = stage_of_name(name) or "transform"
        _STAGE_OF_TYPE[t] = stage
        if stage == "transform" and name not in _UNKNOWN and len(_UNKNOWN) < 64:
            # Said once per new class: the report names what the ``transform`` stage ran.
            _UNKNOWN.add(name)
            try:
                pipeprof.settings(transforms=sorted(_UNKNOWN))
            except Exception:
                pass  # a name unsent is a name unshown: never the program's error
    return stage


#: The stages a ``Compose`` sends, in the order their spans are laid out.
_TRANSFORM_STAGES = ("resize", "augment", "convert", "transform")


class _Transforms:
    """Times a Compose's transforms one by one and sends one span per stage for the sample
    (``resize``, ``augment``, ``convert``, ``transform``: see :func:`stage_of_name`), with the
    thread's CPU time, instead of one span per transform."""

    __slots__ = ("on", "t0", "wall", "cpu", "queue")

    def __init__(self):
        self.on = _T.depth == 0 and _T.in_fetch
        self.t0 = _now()
        self.wall = dict.fromkeys(_TRANSFORM_STAGES, 0)
        self.cpu = dict.fromkeys(_TRANSFORM_STAGES, 0)
        self.queue = dict.fromkeys(_TRANSFORM_STAGES, 0)

    def run(self, t, *inputs):
        if not self.on:
            return t(*inputs)
        stage = _stage_of(t)
        w0, c0, q0 = _now(), _thread_time(), _queue()
        _T.depth += 1
        try:
            return t(*inputs)
        finally:
            _T.depth -= 1
            self.wall[stage] += _now() - w0
            self.cpu[stage] += _thread_time() - c0
            q = _queued(q0)
            # One transform the kernel would not time leaves the stage's wait unmeasured.
            self.queue[stage] = None if q is None or self.queue[stage] is None else self.queue[stage] + q

    def done(self):
        if not self.on:
            return
        _T.fetch_covered = True
        start = self.t0
        for stage in _TRANSFORM_STAGES:
            if self.wall[stage]:
                _native.record(stage, start, self.wall[stage], None, self.cpu[stage], self.queue[stage])
                start += self.wall[stage]


def install_transforms(mod):
    _inner()
    Compose = mod.Compose

    def __call__(self, img):
        tt = _Transforms()
        try:
            for t in self.transforms:
                img = tt.run(t, img)
        finally:
            tt.done()
        return img

    Compose.__call__ = __call__


def install_transforms_v2(mod):
    _inner()
    Compose = mod.Compose

    def forward(self, *inputs):
        needs_unpacking = len(inputs) > 1
        tt = _Transforms()
        try:
            for t in self.transforms:
                outputs = tt.run(t, *inputs)
                inputs = outputs if needs_unpacking else (outputs,)
        finally:
            tt.done()
        return outputs

    Compose.forward = forward


def install_folder(folder_mod):
    """torchvision's ``pil_loader`` (what ``ImageFolder`` reads with): the same calls, with the
    file's ``open`` inside the ``read`` span as ``Image.open`` of a path has it, so the time a
    slow drive takes to open each file is the read's, not unaccounted for."""
    orig = folder_mod.pil_loader
    if getattr(orig, "_pipeprof", False):
        return

    def pil_loader(path):
        from PIL import Image

        with _pil.Stage("read"):
            f = open(path, "rb")
            try:
                img = Image.open(f)
            except BaseException:
                f.close()
                raise
        with f:
            return img.convert("RGB")

    pil_loader.__wrapped__ = orig
    pil_loader._pipeprof = True
    folder_mod.pil_loader = pil_loader
