"""fastai under ``pipeprof run``: its ``DataLoader`` (a ``TfmdDL`` from a ``DataBlock``), its
item transforms, its optimizer and its loss, seen as the PyTorch hooks see a torch loop.

fastai's ``DataLoader`` is no ``torch.utils.data.DataLoader``: its ``__iter__`` makes torch's
iterator itself (``_SingleProcessDataLoaderIter`` or ``_MultiProcessingDataLoaderIter``, from
the module's ``_loaders``) over a ``_FakeLoader`` that holds the real settings (its
``num_workers``; the loader's own is 1 in the main process), and each batch is made by the
loader's ``create_batches`` generator (``do_item`` per item: ``PILImage.create`` opens and
decodes, then the item transforms; ``do_batch``: ``fa_collate``), in a worker process or on the
training thread, not by torch's map-style fetcher. So, once each module is imported:

* ``fastai.data.load``: ``_loaders`` make torch's iterator and then say so to the training loop
  (``_torch_loop.began``: the training loader's passes and its settings, read from the fastai
  loader: ``bs``, the ``_FakeLoader``'s workers); ``DataLoader.create_batches`` times each
  batch (``_native.Batch``: sent by a worker at once, held for its step on the training
  thread) with PIL's ``read``/``decode`` inside its items (``_pil``), and ``do_batch`` is its
  ``collate``. ``DataLoader.one_batch`` (``show_batch``, ``unet_learner``'s image size,
  ``learn.summary()``) is a look at a batch, not a step: its iterator and batch are not timed.
  In a ``--check-advice`` re-run, the loader arguments it sets (``PIPEPROF_CHECK``, read by
  ``_override``) are set on each fastai loader as it is made; its steps stop the program as
  any torch iterator's do (``one_batch``'s counts none).
* ``fasttransform.transform`` (``fastcore.transform`` before fastai 2.8): ``Transform._call``
  of an item transform inside a batch is a span by what its class does (``Resize``: resize,
  ``ToTensor``: convert, ``RandomResizedCrop``: resize, flips: augment; see
  ``_torch_fetch.stage_of_name``); a transform of another class (``Categorize``, a function
  wrapped as a ``Transform`` such as ``PILImage.create``) times nothing itself, so the PIL
  calls inside it are their own spans.
* ``fastai.optimizer``: ``Optimizer.step`` (fastai's own, no ``torch.optim.Optimizer``: torch's
  step hooks never see it) is the step's ``optimizer`` span, and the model's size.
* ``fastai.torch_core``: ``TensorBase`` (what fastai's losses are) is read as a plain tensor
  when ``backward()`` runs on it (``_torch_loop.PLAIN_LOSS``).

The validation pass (``Learner.validate``, and each epoch's) runs under ``torch.no_grad()``:
its batches are the loop's ``validate`` steps, as any batch drawn with autograd off. Nothing
here changes what fastai returns or raises.
"""

from __future__ import annotations

import os
import threading

import pipeprof
from pipeprof import _native, _override, _pil, _state, _torch_fetch

_now = _native.now_ns

_T = _state.THREAD
_TORCH = _state.TORCH

#: fastai's transform classes that torchvision's names do not cover, by what they do.
_FASTAI_STAGES = {
    "CropPad": "resize",
    "RatioResize": "resize",
    "RandomResizedCropGPU": "resize",
    "FlipItem": "augment",
    "DihedralItem": "augment",
    "IntToFloatTensor": "convert",
}

#: The stage of each transform class met so far, None for one that times nothing itself.
_STAGE_OF_TYPE = {}


def stage_of(cls):
    """The loader stage a fastai transform class stands for, else None."""
    try:
        return _STAGE_OF_TYPE[cls]
    except KeyError:
        pass
    name = getattr(cls, "__name__", "")
    stage = _FASTAI_STAGES.get(name) or _torch_fetch.stage_of_name(name)
    _STAGE_OF_TYPE[cls] = stage
    return stage


class _Local(threading.local):
    #: The batch this thread is making (a ``_native.Batch``) until its collate starts.
    batch = None
    #: Inside ``DataLoader.one_batch`` (a look at a batch: ``show_batch``, ``unet_learner``'s
    #: image size, ``learn.summary()``): no step, no batch timed.
    peek = 0


_LOCAL = _Local()
#: Whether this process is a DataLoader worker: None until asked (once a process).
_WORKER = [None]
os.register_at_fork(after_in_child=lambda: _WORKER.__setitem__(0, None))


def _in_worker():
    if _WORKER[0] is None:
        # Names the process `loader-N` when it is one.
        _WORKER[0] = bool(_torch_fetch._name_worker())
    return _WORKER[0]


# ---------------------------------------------------------------- the loader


def settings(loader, device=None):
    """A fastai loader's settings: its ``_FakeLoader``'s (workers, pin_memory, prefetch), its
    batch size ``bs`` and its item count ``n``."""
    from pipeprof.torch import _read, loader_settings

    s = loader_settings(_read(loader, "fake_l"), device=device)
    bs, n = _read(loader, "bs"), _read(loader, "n")
    if isinstance(bs, int) and not isinstance(bs, bool) and bs > 0:
        s["batch_size"] = bs
    if isinstance(n, int) and not isinstance(n, bool) and n > 0:
        s["images"] = n
    return s


def _made_by(cls, began):
    """fastai's ``_loaders`` entry ``cls``: torch's iterator over the ``_FakeLoader``, then
    ``began`` (``_torch_loop``) told that the fastai loader made it."""

    def make(fake_loader):
        begun = _now()  # before the workers start: the epoch's clock starts here
        it = cls(fake_loader)
        if _LOCAL.peek:
            # The training loop's next() leaves an iterator so marked alone (as one wrapped
            # with pipeprof.torch.profile): a look at one batch is no step of the program's.
            try:
                it._pipeprof_manual = True
            except Exception:
                pass
            return it
        loader = getattr(fake_loader, "d", None)
        if loader is not None:
            began(loader, it, settings, begun)
        return it

    make.__wrapped__ = cls
    make._pipeprof = True
    return make


def _create_batches(orig):
    def create_batches(self, samps):
        batches = orig(self, samps)
        if _LOCAL.peek:
            yield from batches
            return
        worker = _in_worker()
        try:
            while True:
                batch = _LOCAL.batch = _native.Batch(True)
                _T.in_fetch, _T.fetch_covered = True, False
                try:
                    out = next(batches)
                except StopIteration:
                    return
                finally:
                    _T.in_fetch, _LOCAL.batch = False, None
                batch.end()
                if worker:
                    _native.batch_spans(batch)
                    pipeprof.flush()
                else:
                    # Inside the training loop's next(): held for its step, sent with it.
                    _torch_fetch._fetched(batch)
                yield out
        finally:
            batches.close()

    create_batches.__wrapped__ = orig
    create_batches._pipeprof = True
    return create_batches


def _do_batch(orig):
    def do_batch(self, b):
        batch = _LOCAL.batch
        if batch is not None:
            # The items are made: the collate starts (a batch made outside create_batches,
            # TfmdDL's first look at its types, is not timed).
            _LOCAL.batch, _T.in_fetch = None, False
            batch.collate(_T.fetch_covered)
        return orig(self, b)

    do_batch.__wrapped__ = orig
    do_batch._pipeprof = True
    return do_batch


def _one_batch(orig):
    def one_batch(self):
        _LOCAL.peek += 1
        try:
            return orig(self)
        finally:
            _LOCAL.peek -= 1

    one_batch.__wrapped__ = orig
    one_batch._pipeprof = True
    one_batch.__doc__ = orig.__doc__
    return one_batch


def apply(loader, knobs):
    """A ``--check-advice`` re-run's loader arguments (``_override.KNOBS``) set on a fastai
    loader just made: they live in its ``_FakeLoader`` (workers, pinned memory, persistent
    workers, prefetch) and its ``bs``. Arguments only a loader with workers takes are left out
    when it has none, as ``_override.apply`` does for torch's."""
    fake = loader.fake_l
    if "num_workers" in knobs:
        fake.num_workers = knobs["num_workers"]
    if "pin_memory" in knobs:
        fake.pin_memory = loader.pin_memory = knobs["pin_memory"]
    workers = fake.num_workers or 0
    if "persistent_workers" in knobs and workers > 0:
        fake.persistent_workers = knobs["persistent_workers"]
    elif workers == 0:
        fake.persistent_workers = False
    if "prefetch_factor" in knobs and workers > 0:
        fake.prefetch_factor = knobs["prefetch_factor"]
    if "batch_size" in knobs and loader.bs is not None:
        loader.bs = knobs["batch_size"]


def _checked_init(orig, knobs):
    def __init__(self, *args, **kwargs):
        orig(self, *args, **kwargs)
        apply(self, knobs)

    __init__.__wrapped__ = orig
    __init__._pipeprof = True
    return __init__


def install_load(load_mod, began):
    """``fastai.data.load``: its ``_loaders``, ``DataLoader.create_batches``, ``do_batch`` and
    ``one_batch``; and in a ``--check-advice`` re-run that sets loader arguments, its
    ``__init__`` (fastai's loader is no torch ``DataLoader``: ``_override`` does not see it)."""
    DataLoader = load_mod.DataLoader
    if getattr(DataLoader.create_batches, "_pipeprof", False):
        return
    load_mod._loaders = tuple(_made_by(cls, began) for cls in load_mod._loaders)
    DataLoader.create_batches = _create_batches(DataLoader.create_batches)
    DataLoader.do_batch = _do_batch(DataLoader.do_batch)
    DataLoader.one_batch = _one_batch(DataLoader.one_batch)
    knobs = {k: v for k, v in (_state.CHECK.asked or {}).items() if k in _override.KNOBS}
    if knobs and _state.RUN.main:
        DataLoader.__init__ = _checked_init(DataLoader.__init__, knobs)


# ---------------------------------------------------------------- item transforms


def install_transform(transform_mod):
    """``Transform._call`` (fasttransform, or fastcore before fastai 2.8): an item transform
    inside a batch is a span of its stage."""
    Transform = transform_mod.Transform
    orig = Transform._call
    if getattr(orig, "_pipeprof", False):
        return

    def _call(self, fn, *args, split_idx=None, **kwargs):
        if _T.in_fetch and not _T.depth and fn == "encodes":
            stage = stage_of(type(self))
            own = getattr(self, "split_idx", None)
            # A transform of the other split (a train-only augmentation on a validation item)
            # returns its input untouched: no span.
            if stage is not None and (own is None or own == split_idx):
                with _pil.Stage(stage):
                    return orig(self, fn, *args, split_idx=split_idx, **kwargs)
        return orig(self, fn, *args, split_idx=split_idx, **kwargs)

    _call.__wrapped__ = orig
    _call._pipeprof = True
    Transform._call = _call


# ---------------------------------------------------------------- optimizer and loss


def install_optimizer(optimizer_mod):
    """fastai's ``Optimizer.step``: the step's ``optimizer`` span (torch's step hooks see only
    ``torch.optim`` optimizers), and the model's size the first time."""
    Optimizer = optimizer_mod.Optimizer
    orig = Optimizer.step
    if getattr(orig, "_pipeprof", False):
        return

    def step(self, *args, **kwargs):
        loop = _TORCH.loop
        if loop is None:
            return orig(self, *args, **kwargs)
        loop.optimizer_pre()
        try:
            return orig(self, *args, **kwargs)
        finally:
            if loop.optimizer_post():
                try:
                    n = sum(p.numel() for group in self.param_lists for p in group)
                    pipeprof.settings(params=int(n))
                except Exception:
                    pass  # a size unread is a size unshown: never the program's error

    step.__wrapped__ = orig
    step._pipeprof = True
    step.__doc__ = orig.__doc__
    Optimizer.step = step


def hooks(began, plain_loss):
    """What to patch as each fastai module is imported (``_torch_loop`` registers it with
    ``_hooks.when_imported`` once torch's DataLoader is hooked): ``began`` is
    ``_torch_loop.began``, ``plain_loss`` its ``PLAIN_LOSS``."""
    return {
        "fastai.data.load": lambda m: install_load(m, began),
        "fasttransform.transform": install_transform,
        "fastcore.transform": install_transform,
        "fastai.optimizer": install_optimizer,
        "fastai.torch_core": lambda m: plain_loss.add(m.TensorBase),
    }


__all__ = ["hooks", "settings", "stage_of"]
