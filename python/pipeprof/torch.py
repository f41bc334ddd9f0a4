"""PyTorch: wrap a DataLoader so every step is profiled.

    import pipeprof, pipeprof.torch
    pipeprof.init(program="train", settings={"batch_size": 64, "workers": 8, "device": "cuda"})
    loader = pipeprof.torch.profile(DataLoader(ds, batch_size=64, num_workers=8), device="cuda")
    for xs, ys in loader:            # wait: next(); transfer: .to(device); compute: your body
        loss = train_step(xs, ys)
        loader.report(loss=loss.item())

torch is imported only to synchronise CUDA when asked (``sync=True``); this module works
with anything that iterates like a DataLoader and holds objects with ``.to(device)``.
"""

from __future__ import annotations

import pipeprof


class NameWorker:
    """A DataLoader ``worker_init_fn`` that names each worker ``loader-<id>`` in the viewer,
    then calls the loader's own ``worker_init_fn``. A class, not a closure, so that spawned
    workers can unpickle it."""

    def __init__(self, inner=None):
        self.inner = inner

    def __call__(self, worker_id):
        pipeprof.name_process(f"loader-{worker_id}", worker=worker_id)
        if self.inner is not None:
            self.inner(worker_id)


def _to_device(batch, device, non_blocking):
    if hasattr(batch, "to"):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        return {k: _to_device(v, device, non_blocking) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        moved = [_to_device(v, device, non_blocking) for v in batch]
        return type(batch)(moved) if not hasattr(batch, "_fields") else type(batch)(*moved)
    return batch


def _first_leaf(batch):
    """The first tensor (or value) of a batch: through tuples, lists and dicts."""
    first = batch
    while isinstance(first, (list, tuple)) and first:
        first = first[0]
    if isinstance(first, dict) and first:
        first = next(iter(first.values()))
    return first


def _batch_size(batch):
    first = _first_leaf(batch)
    shape = getattr(first, "shape", None)
    if shape is not None and len(shape) > 0:
        return int(shape[0])
    try:
        return len(first)
    except TypeError:
        return 0


def _read(obj, name):
    """``obj.name``, or None when reading it fails in any way: a loader's or data set's
    attribute may be the program's property, and what raises there must not fail the run."""
    try:
        return getattr(obj, name, None)
    except Exception:
        return None


def _length(obj):
    """``len(obj)``, or None when it has none or it fails."""
    try:
        n = len(obj)
    except Exception:
        return None
    return n if isinstance(n, int) else None


def _texts(values, most):
    """``[str(v) for v in values]`` for a list or tuple of at most ``most``, else None (also
    when any ``str`` fails)."""
    if not isinstance(values, (list, tuple)):
        return None
    try:
        if len(values) > most:
            return None
        return [str(v) for v in values]
    except Exception:
        return None


def loader_settings(loader, device=None):
    """A DataLoader's arguments as pipeprof run settings (the viewer names them in advice);
    only what the loader has: a stand-in without ``batch_size`` says nothing of it. Each
    attribute, ``len`` and ``str`` of the program's objects is read at most once, and one
    that fails is left unknown."""
    settings = {"framework": "pytorch"}
    workers = _read(loader, "num_workers")
    if isinstance(workers, int):
        settings["workers"] = workers
    batch = _read(loader, "batch_size")
    if batch is None:
        # A loader given its own batch sampler (accelerate's prepare() passes one): its size.
        batch = _read(_read(loader, "batch_sampler"), "batch_size")
    if isinstance(batch, int) and not isinstance(batch, bool) and batch > 0:
        settings["batch_size"] = batch
    for key in ("pin_memory", "persistent_workers"):
        v = _read(loader, key)
        if isinstance(v, bool):
            settings[key] = v
    factor = _read(loader, "prefetch_factor")
    if isinstance(workers, int) and workers > 0 and isinstance(factor, int):
        settings["prefetch_factor"] = factor
        settings["prefetch"] = factor * workers
    if device is not None:
        settings["device"] = str(device)
    ds = _read(loader, "dataset")
    images = _length(ds)
    if images is not None:
        settings["images"] = images
    root = _read(ds, "root")
    if root is not None:
        root = _texts([root], 1)
        if root is not None:
            settings["data"] = root[0]
    classes = _texts(_read(ds, "classes"), 10000)
    if classes is not None:
        settings["classes"] = classes
    if _is_folder_reader(ds):
        settings["folder_dataset"] = True
        resize = _leading_resize(_read(ds, "transform"))
        if resize is not None:
            settings["leading_resize"] = resize
    return settings


def _is_folder_reader(ds):
    """Whether ``ds`` is torchvision's ``ImageFolder``/``DatasetFolder`` as
    ``PackedImageFolder`` replaces it: the default loader (PIL, RGB), the image extensions,
    the class listing and file walk of the library's own (a subclass that overrides them, a
    custom ``loader`` or ``is_valid_file``, is the program's own reader). torchvision is only
    looked at when the program imported it."""
    import sys

    folder = sys.modules.get("torchvision.datasets.folder")
    if folder is None:
        return False
    try:
        base = folder.DatasetFolder
        return (
            isinstance(ds, base)
            and _read(ds, "loader") is folder.default_loader
            and tuple(_read(ds, "extensions") or ()) == tuple(folder.IMG_EXTENSIONS)
            and type(ds).find_classes is base.find_classes
            and type(ds).make_dataset is base.make_dataset
        )
    except Exception:
        return False


def _leading_resize(transform):
    """The bilinear ``Resize`` a torchvision transform (or its ``Compose``) begins with, as the
    run's ``leading_resize`` setting: ``{"shorter": S}`` for ``Resize(S)``, ``{"exact":
    {"height": H, "width": W}}`` for ``Resize((H, W))``; None for anything else (a crop first,
    another interpolation, a ``max_size``)."""
    first = transform
    if type(first).__name__ == "Compose":
        steps = _read(first, "transforms")
        if not isinstance(steps, (list, tuple)) or not steps:
            return None
        first = steps[0]
    if type(first).__name__ != "Resize" or not type(first).__module__.startswith("torchvision.transforms"):
        return None
    interpolation = _read(first, "interpolation")
    mode = getattr(interpolation, "value", interpolation)
    if mode not in ("bilinear", 2) or _read(first, "max_size") is not None or _read(first, "antialias") is False:
        return None
    size = _read(first, "size")
    if isinstance(size, int) and not isinstance(size, bool):
        size = [size]
    if not isinstance(size, (list, tuple)) or not all(isinstance(v, int) and v > 0 for v in size):
        return None
    if len(size) == 1:
        return {"shorter": size[0]}
    if len(size) == 2:
        return {"exact": {"height": size[0], "width": size[1]}}
    return None


class ProfiledLoader:
    """Iterates like the wrapped loader; times ``wait`` (the ``next()`` call), ``transfer``
    (moving the batch to ``device``) and ``compute`` (your loop body, until the next
    ``next()``), and reports a step record after each batch."""

    def __init__(self, loader, device=None, non_blocking=False, sync=False, start_step=0):
        self.loader = loader
        self.device = device
        self.non_blocking = non_blocking
        self.sync = sync
        self.step = start_step
        self.epoch = -1
        self._loss = 0.0
        self._correct = 0
        if getattr(loader, "num_workers", 0) and hasattr(loader, "worker_init_fn"):
            if not isinstance(loader.worker_init_fn, NameWorker):
                loader.worker_init_fn = NameWorker(loader.worker_init_fn)
        try:
            # Under `pipeprof run` the DataLoader is timed here only, not twice.
            loader._pipeprof_manual = True
        except (AttributeError, TypeError):
            pass
        if hasattr(loader, "num_workers"):
            # The viewer names DataLoader arguments in its advice (these are the loader's
            # own, so they replace what pipeprof.init(settings=...) said of the same keys).
            pipeprof.settings(**loader_settings(loader, device))

    def __len__(self):
        return len(self.loader)

    def __getattr__(self, name):
        # Everything else is the loader's: `.dataset`, `.sampler.set_epoch(e)`, `.batch_size`,
        # `.num_workers`. Only called for names this wrapper does not have itself.
        if name == "loader":
            raise AttributeError(name)
        return getattr(self.loader, name)

    def report(self, loss=None, correct=None):
        """The current step's loss and correct predictions, for its step record."""
        if loss is not None:
            self._loss = float(loss)
        if correct is not None:
            self._correct = int(correct)

    def _synchronize(self):
        if self.sync and self.device is not None and str(self.device).startswith("cuda"):
            import torch

            torch.cuda.synchronize()

    def __iter__(self):
        self.epoch += 1
        it = iter(self.loader)
        while True:
            with pipeprof.span("wait", step=self.step):
                try:
                    batch = next(it)
                except StopIteration:
                    return
            if self.device is not None:
                with pipeprof.span("transfer", step=self.step):
                    batch = _to_device(batch, self.device, self.non_blocking)
                    self._synchronize()
            self._loss, self._correct = 0.0, 0
            try:
                with pipeprof.span("compute", step=self.step):
                    yield batch
                    # CUDA runs asynchronously: without a sync the body's kernels would be
                    # charged to the next wait.
                    self._synchronize()
            finally:
                # Also when the loop leaves with `break` (the generator is closed at the
                # yield): the last step happened and is reported.
                pipeprof.step(
                    self.step,
                    epoch=self.epoch,
                    images=_batch_size(batch),
                    loss=self._loss,
                    correct=self._correct,
                )
                self.step += 1


def profile(loader, device=None, non_blocking=False, sync=False, start_step=0):
    """Wraps ``loader`` (a ``torch.utils.data.DataLoader`` or any iterable of batches)."""
    return ProfiledLoader(loader, device=device, non_blocking=non_blocking, sync=sync, start_step=start_step)
