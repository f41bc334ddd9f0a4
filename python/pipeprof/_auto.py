"""Profiling with no edit to the script: what ``pipeprof run -- python train.py`` loads.

The start-up hook (``_bootstrap/sitecustomize.py``) calls :func:`start` in every Python
process of the run. Importing :mod:`pipeprof` has already connected the process to the run.
Then, when (and only if) the script imports them:

* ``torch.utils.data``: each batch a DataLoader iterator hands out is one step. The training
  thread gets ``wait`` (the ``next()`` call), ``transfer`` (``Tensor.to``/``.cuda`` to a
  device inside the loop body), ``compute`` (the rest of the loop body) and a step record
  (images from the batch; the loss when ``loss.backward()`` ran on a CPU tensor or the script
  called ``loss.item()``). A batch taken with autograd off (``torch.no_grad()``) is a
  validation step. Each DataLoader worker process times every sample: ``read`` (PIL
  ``Image.open``), ``decode`` (PIL ``load``/``convert``), ``resize``/``augment`` (each
  torchvision transform of a ``Compose``, ``Random*`` ones as augment); a sample that none of
  those cover is one ``decode`` span. The DataLoader's arguments become the run's settings.
* ``keras``: ``Model.fit`` gets :func:`pipeprof.keras.callback` (unless it has one).

Nothing here raises into the script: a hook that fails turns itself off with a message.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.util
import os
import sys
import threading
import time

import pipeprof
from pipeprof import _native
from pipeprof.torch import _batch_size, _first_leaf

_now = _native.now_ns
_thread_time = time.thread_time_ns
_queue = _native.thread_queue_ns


def _queued(q0):
    """The thread's run-queue wait since ``q0`` (a ``_queue()`` reading), or None when the
    kernel does not say: the off-CPU part of a span spent waiting for a core, not blocked."""
    q1 = _queue()
    return None if q0 is None or q1 is None else max(0, q1 - q0)
_T = threading.local()

#: Global step counter of this process (steps are numbered across loaders and epochs).
_STATE = {"step": 0, "epoch": -1, "settings_sent": False, "device": None, "main": False}

#: Transforms that are random (augmentation) by name; the others reshape pixels (resize).
_AUGMENT_WORDS = ("Random", "ColorJitter", "Augment", "AugMix", "GaussianBlur", "Elastic", "Jitter")


def _warn(what, e):
    print(f"pipeprof: {what} is not profiled ({e!r}); the program goes on", file=sys.stderr)


# ---------------------------------------------------------------- post-import hooks


class _Finder(importlib.abc.MetaPathFinder):
    """Runs a patch right after a watched module is executed, whoever imports it."""

    def __init__(self, hooks):
        self.hooks = hooks

    def find_spec(self, name, path, target=None):
        if name not in self.hooks:
            return None
        hook = self.hooks.pop(name)
        # The real spec, from the finders after this one.
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module):
            run(module)
            try:
                hook(module)
            except Exception as e:  # a framework version we do not know
                _warn(name, e)

        loader.exec_module = exec_module
        return spec


def _when_imported(hooks):
    """Calls ``hooks[name](module)`` once ``name`` is imported (now, if it already is)."""
    pending = {}
    for name, hook in hooks.items():
        mod = sys.modules.get(name)
        if mod is not None:
            try:
                hook(mod)
            except Exception as e:
                _warn(name, e)
        else:
            pending[name] = hook
    if pending:
        sys.meta_path.insert(0, _Finder(pending))


# ---------------------------------------------------------------- the training thread


class _Open:
    """The step whose batch the training thread holds now."""

    __slots__ = ("step", "epoch", "t_call", "t_body", "images", "validation", "transfer_ns", "transfer_start", "loss_t", "loss")

    def __init__(self, step, epoch, t_call, t_body, images, validation):
        self.step, self.epoch = step, epoch
        self.t_call, self.t_body = t_call, t_body
        self.images, self.validation = images, validation
        self.transfer_ns, self.transfer_start = 0, None
        self.loss_t, self.loss = None, None


def _input_of(batch):
    """[channels, height, width] of an image batch (N, C, H, W), else None."""
    shape = getattr(_first_leaf(batch), "shape", None)
    if shape is None or len(shape) != 4:
        return None
    return [int(shape[1]), int(shape[2]), int(shape[3])]


def _close(end_ns=None):
    """Ends the training thread's open step: its transfer, compute and step record."""
    st = getattr(_T, "open", None)
    if st is None:
        return
    _T.open = None
    end = _now() if end_ns is None else end_ns
    loss = st.loss
    if loss is None and st.loss_t is not None:
        try:
            if st.loss_t.device.type == "cpu":
                loss = float(st.loss_t.detach())
        except Exception:
            loss = None
    try:
        if st.validation:
            _native.record("validate", st.t_call, max(0, end - st.t_call), st.step)
        else:
            if st.transfer_ns:
                _native.record("transfer", st.transfer_start, st.transfer_ns, st.step)
            body = max(0, end - st.t_body - st.transfer_ns)
            _native.record("compute", end - body, body, st.step)
        pipeprof.step(
            st.step,
            epoch=max(st.epoch, 0),
            images=st.images,
            loss=0.0 if loss is None else loss,
            validation=st.validation,
        )
    except Exception as e:
        _warn("a step", e)


def _send_settings(loader):
    if _STATE["settings_sent"]:
        return
    _STATE["settings_sent"] = True
    from pipeprof.torch import loader_settings

    settings = loader_settings(loader, device=_STATE["device"] or "cpu")
    # The loop body's correct predictions are not seen without an edit: no accuracy column.
    settings["no_accuracy"] = True
    pipeprof.settings(**settings)


def _device_of(args, kwargs):
    """The device a ``Tensor.to(...)`` call moves to, when it is not the CPU (else None)."""
    import torch

    dev = kwargs.get("device")
    if dev is None and args:
        a = args[0]
        if isinstance(a, torch.Tensor):
            dev = a.device
        elif isinstance(a, (str, torch.device, int)) and not isinstance(a, bool):
            dev = a
    if dev is None:
        return None
    try:
        dev = torch.device(dev)
    except Exception:
        return None
    return None if dev.type == "cpu" else str(dev)


def _patch_torch_data(dataloader_mod):
    import torch

    DataLoader = dataloader_mod.DataLoader
    Base = dataloader_mod._BaseDataLoaderIter

    orig_iter = DataLoader.__iter__

    def __iter__(self):
        it = orig_iter(self)
        if getattr(self, "_pipeprof_manual", False):
            # Wrapped with pipeprof.torch.profile: timed there, not twice.
            try:
                it._pipeprof_manual = True
            except AttributeError:
                pass
            return it
        if torch.is_grad_enabled():
            _close()
            _STATE["epoch"] += 1
            _send_settings(self)
        return it

    DataLoader.__iter__ = __iter__

    orig_next = Base.__next__

    def __next__(self):
        if getattr(self, "_pipeprof_manual", False):
            return orig_next(self)
        t_call = _now()
        _close(t_call)
        validation = not torch.is_grad_enabled()
        step = _STATE["step"]
        if validation:
            batch = orig_next(self)
        else:
            with pipeprof.span("wait", step=step):
                batch = orig_next(self)
        _STATE["step"] = step + 1
        if not validation and not _STATE.get("input_sent"):
            _STATE["input_sent"] = True
            shape = _input_of(batch)
            if shape is not None:
                pipeprof.settings(input=shape)
        _T.open = _Open(step, _STATE["epoch"], t_call, _now(), _batch_size(batch), validation)
        return batch

    Base.__next__ = __next__

    orig_del = getattr(dataloader_mod._MultiProcessingDataLoaderIter, "__del__", None)

    if orig_del is not None:

        def __del__(self):
            # A `break` out of the loop drops the iterator: its last step ends here.
            st = getattr(_T, "open", None)
            if st is not None:
                _close()
            orig_del(self)

        dataloader_mod._MultiProcessingDataLoaderIter.__del__ = __del__



def _patch_tensor(torch_mod):
    Tensor = torch_mod.Tensor
    orig_to, orig_cuda, orig_backward, orig_item = Tensor.to, Tensor.cuda, Tensor.backward, Tensor.item

    def to(self, *args, **kwargs):
        st = getattr(_T, "open", None)
        if st is None or st.validation:
            return orig_to(self, *args, **kwargs)
        dev = _device_of(args, kwargs)
        if dev is None:
            return orig_to(self, *args, **kwargs)
        t0 = _now()
        out = orig_to(self, *args, **kwargs)
        _moved(st, t0, dev)
        return out

    def cuda(self, *args, **kwargs):
        st = getattr(_T, "open", None)
        if st is None or st.validation:
            return orig_cuda(self, *args, **kwargs)
        t0 = _now()
        out = orig_cuda(self, *args, **kwargs)
        _moved(st, t0, str(out.device))
        return out

    def backward(self, *args, **kwargs):
        st = getattr(_T, "open", None)
        if st is not None and st.loss_t is None and self.dim() == 0:
            st.loss_t = self
        if st is None or st.validation or not _distributed(torch_mod):
            return orig_backward(self, *args, **kwargs)
        # Under DDP the gradients' all-reduce runs inside backward(), which returns once the
        # last bucket is reduced: a rank that waits for a slower one waits here.
        t0 = _now()
        try:
            return orig_backward(self, *args, **kwargs)
        finally:
            try:
                _native.record("backward", t0, _now() - t0, st.step)
            except Exception as e:
                _warn("backward", e)

    def item(self):
        v = orig_item(self)
        st = getattr(_T, "open", None)
        if st is not None and self is st.loss_t:
            st.loss = float(v)
        return v

    Tensor.to, Tensor.cuda, Tensor.backward, Tensor.item = to, cuda, backward, item


def _distributed(torch_mod):
    """Whether this process is one rank of several in an initialised process group."""
    try:
        dist = torch_mod.distributed
        return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    except Exception:
        return False


def _moved(st, t0, dev):
    t1 = _now()
    if st.transfer_start is None:
        st.transfer_start = t0
    st.transfer_ns += t1 - t0
    if _STATE["device"] != dev:
        _STATE["device"] = dev
        pipeprof.settings(device=dev)


# ---------------------------------------------------------------- loader workers


def _depth():
    return getattr(_T, "depth", 0)


class _Stage:
    """A loader-stage span that does not nest: inside another one it times nothing."""

    __slots__ = ("stage", "span")

    def __init__(self, stage):
        self.stage = stage
        self.span = None

    def __enter__(self):
        d = _depth()
        _T.depth = d + 1
        if d == 0 and getattr(_T, "in_fetch", False):
            self.span = pipeprof.span(self.stage)
            self.span.__enter__()
            _T.covered = True
        return self

    def __exit__(self, *exc):
        _T.depth = _depth() - 1
        if self.span is not None:
            self.span.__exit__(*exc)
        return False


def _timed(stage, func):
    def timed(*args, **kwargs):
        with _Stage(stage):
            return func(*args, **kwargs)

    timed.__wrapped__ = func
    timed.__name__ = getattr(func, "__name__", "timed")
    return timed


def _name_worker():
    if getattr(_T, "named", False):
        return
    _T.named = True
    try:
        from torch.utils.data import get_worker_info

        info = get_worker_info()
    except Exception:
        info = None
    if info is not None:
        pipeprof.name_process(f"loader-{info.id}")


def _patch_fetch(fetch_mod):
    Map = fetch_mod._MapDatasetFetcher
    orig = Map.fetch

    def fetch(self, possibly_batched_index):
        getitems = getattr(self.dataset, "__getitems__", None)
        if not self.auto_collation or getitems:
            return orig(self, possibly_batched_index)
        _name_worker()
        data = []
        for idx in possibly_batched_index:
            _T.in_fetch, _T.covered = True, False
            t0, c0, q0 = _now(), _thread_time(), _queue()
            try:
                data.append(self.dataset[idx])
            finally:
                _T.in_fetch = False
            if not _T.covered:
                # Nothing inside was PIL or a torchvision transform: the sample as a whole.
                _native.record("decode", t0, _now() - t0, None, _thread_time() - c0, _queued(q0))
        out = self.collate_fn(data)
        pipeprof.flush()
        return out

    Map.fetch = fetch


def _patch_pil(image_mod):
    image_mod.open = _timed("read", image_mod.open)
    image_mod.Image.convert = _timed("decode", image_mod.Image.convert)


def _patch_pil_imagefile(imagefile_mod):
    imagefile_mod.ImageFile.load = _timed("decode", imagefile_mod.ImageFile.load)


def _stage_of(transform):
    name = type(transform).__name__
    return "augment" if any(w in name for w in _AUGMENT_WORDS) else "resize"


class _Transforms:
    """Times a Compose's transforms one by one and sends one span per stage for the sample
    (``resize``: deterministic reshaping, ``augment``: random transforms), with the thread's
    CPU time, instead of one span per transform."""

    __slots__ = ("on", "t0", "wall", "cpu", "queue")

    def __init__(self):
        self.on = _depth() == 0 and getattr(_T, "in_fetch", False)
        self.t0 = _now()
        self.wall = {"resize": 0, "augment": 0}
        self.cpu = {"resize": 0, "augment": 0}
        self.queue = {"resize": 0, "augment": 0}

    def run(self, t, *inputs):
        if not self.on:
            return t(*inputs)
        stage = _stage_of(t)
        w0, c0, q0 = _now(), _thread_time(), _queue()
        _T.depth = _depth() + 1
        try:
            return t(*inputs)
        finally:
            _T.depth = _depth() - 1
            self.wall[stage] += _now() - w0
            self.cpu[stage] += _thread_time() - c0
            q = _queued(q0)
            # One transform the kernel would not time leaves the stage's wait unmeasured.
            self.queue[stage] = None if q is None or self.queue[stage] is None else self.queue[stage] + q

    def done(self):
        if not self.on:
            return
        _T.covered = True
        start = self.t0
        for stage in ("resize", "augment"):
            if self.wall[stage]:
                _native.record(stage, start, self.wall[stage], None, self.cpu[stage], self.queue[stage])
                start += self.wall[stage]


def _patch_transforms(mod):
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


def _patch_transforms_v2(mod):
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


# ---------------------------------------------------------------- keras


def _patch_keras(keras_mod):
    Model = keras_mod.Model
    orig_fit = Model.fit

    def fit(self, *args, **kwargs):
        from pipeprof import keras as pk

        callbacks = list(kwargs.get("callbacks") or [])
        if not any(isinstance(c, pk.Hooks) for c in callbacks):
            data = args[0] if args else kwargs.get("x")
            callbacks.append(pk.callback(batch_size=kwargs.get("batch_size"), data=data))
        kwargs["callbacks"] = callbacks
        return orig_fit(self, *args, **kwargs)

    Model.fit = fit


# ---------------------------------------------------------------- start


def start():
    """Hooks this process (the run's main process, or one of its workers)."""
    if pipeprof.role() == "off":
        return
    _STATE["main"] = pipeprof.is_main()
    if _STATE["main"]:
        pipeprof.fail_on_uncaught_exception()
        atexit.register(_close)
    _when_imported(
        {
            "torch.utils.data.dataloader": _patch_torch_data,
            "torch.utils.data._utils.fetch": _patch_fetch,
            "torch": _patch_tensor,
            "PIL.Image": _patch_pil,
            "PIL.ImageFile": _patch_pil_imagefile,
            "torchvision.transforms.transforms": _patch_transforms,
            "torchvision.transforms.v2._container": _patch_transforms_v2,
            "keras": _patch_keras,
            "pipeprof": lambda m: importlib.import_module("pipeprof._override").install(m),
        }
    )


__all__ = ["start"]
