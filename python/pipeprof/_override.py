"""`pipeprof run --check-advice`'s re-runs: loader arguments set, the program stopped after N steps.

What it patches, only when ``PIPEPROF_CHECK`` is set (by a re-run; never in a plain run, where
``install`` returns at once and nothing is patched):

- ``torch.utils.data.DataLoader.__init__``: the arguments named in ``PIPEPROF_CHECK``
  (``num_workers``, ``persistent_workers``, ``prefetch_factor``, ``pin_memory``,
  ``batch_size``) replace the program's, on every DataLoader the program builds. Arguments only
  a loader with workers takes (``persistent_workers``, ``prefetch_factor``) are left out when it
  has none; ``batch_size`` is left alone where the program gives a ``batch_sampler``.
- ``_BaseDataLoaderIter.__next__``: asked for a training batch (gradients on) after ``steps``
  of them, it raises ``SystemExit(0)``: the program ends there, its ``atexit`` handlers run
  (the last step is recorded) and its workers are shut down as on any exit.
- Keras: ``PyDataset.__init__`` gets ``workers`` and ``use_multiprocessing=True`` from
  ``num_workers``; ``Model.fit`` gets a callback that raises ``SystemExit(0)`` before the
  batch after ``steps``.

- Where the re-run names a ``redirect``: the image folder read from a local copy or a packed
  file (:mod:`pipeprof._redirect`, which says what it patches); whether the program took it is
  checked when its steps are done and, for a program that ends sooner, at its exit.

It never changes the program's code paths otherwise: a loader whose arguments do not bind is
built as the program asked (and fails as it would).
"""

import atexit
import inspect
import json
import os
import sys

from pipeprof import _hooks, _native, _redirect, _state

#: Set by ``pipeprof run --check-advice`` for its re-runs (the name is the extension's).
ENV = _native.CHECK_ENV
KNOBS = ("num_workers", "persistent_workers", "prefetch_factor", "pin_memory", "batch_size")

_CHECK = _state.CHECK


def _read():
    """The arguments and steps of this re-run, or None (a plain run, or a value we cannot read)."""
    raw = os.environ.get(ENV)
    if not raw:
        return None
    try:
        v = json.loads(raw)
    except ValueError as e:
        print(f"pipeprof: {ENV} is not JSON ({e}): running unchanged", file=sys.stderr)
        return None
    if not isinstance(v, dict):
        return None
    return v


def apply(arguments, knobs):
    """Sets ``knobs`` in a DataLoader's bound ``arguments`` (a dict, changed in place)."""
    for name in ("num_workers", "pin_memory"):
        if name in knobs:
            arguments[name] = knobs[name]
    workers = arguments.get("num_workers", 0) or 0
    for name in ("persistent_workers", "prefetch_factor"):
        if name in knobs and workers > 0:
            arguments[name] = knobs[name]
        elif workers == 0 and name == "persistent_workers" and arguments.get(name):
            # A loader without workers refuses persistent ones.
            arguments[name] = False
        elif workers == 0 and name == "prefetch_factor" and arguments.get(name) is not None:
            arguments[name] = None
    if "batch_size" in knobs and arguments.get("batch_sampler") is None and arguments.get("batch_size", 1) is not None:
        arguments["batch_size"] = knobs["batch_size"]
    return arguments


def _stop_if_done():
    """Ends the program when it asks for a training batch after its ``steps``."""
    steps = _CHECK.steps
    if steps is not None and _CHECK.done >= steps:
        _redirect.check_used()
        print(f"pipeprof: check-advice re-run: stopped after {steps} steps", file=sys.stderr)
        raise SystemExit(0)


def _patch_torch(data_mod):
    import torch

    from torch.utils.data import dataloader as dl

    knobs = {k: v for k, v in (_CHECK.asked or {}).items() if k in KNOBS}
    DataLoader = dl.DataLoader
    orig_init = DataLoader.__init__
    sig = inspect.signature(orig_init)

    def __init__(self, *args, **kwargs):
        if knobs:
            try:
                bound = sig.bind(self, *args, **kwargs)
            except TypeError:
                return orig_init(self, *args, **kwargs)
            bound.apply_defaults()
            apply(bound.arguments, knobs)
            return orig_init(*bound.args, **bound.kwargs)
        return orig_init(self, *args, **kwargs)

    DataLoader.__init__ = __init__

    Base = dl._BaseDataLoaderIter
    orig_next = Base.__next__

    def __next__(self):
        counted = torch.is_grad_enabled() and not getattr(self, "_pipeprof_manual", False)
        if counted:
            _stop_if_done()
        batch = orig_next(self)
        if counted:
            # Counted once handed out: an epoch's end (StopIteration) is no step.
            _CHECK.done += 1
        return batch

    Base.__next__ = __next__


def _patch_keras(keras_mod):
    _redirect.patch_keras(keras_mod)
    knobs = _CHECK.asked or {}
    workers = knobs.get("num_workers")
    PyDataset = getattr(getattr(keras_mod, "utils", None), "PyDataset", None)
    if workers is not None and PyDataset is not None:
        orig_init = PyDataset.__init__

        def __init__(self, *args, **kwargs):
            kwargs["workers"] = workers
            kwargs["use_multiprocessing"] = workers > 1
            return orig_init(self, *args, **kwargs)

        PyDataset.__init__ = __init__

    Model = keras_mod.Model
    orig_fit = Model.fit

    class _Stop(keras_mod.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            _stop_if_done()
            _CHECK.done += 1

    def fit(self, *args, **kwargs):
        kwargs["callbacks"] = list(kwargs.get("callbacks") or []) + [_Stop()]
        return orig_fit(self, *args, **kwargs)

    Model.fit = fit


def install():
    """Arms the patches in a re-run's main process; nothing in a plain run or a worker."""
    v = _read()
    if v is None or not _state.RUN.main:
        return
    _CHECK.asked = v
    steps = v.get("steps")
    _CHECK.steps = steps if isinstance(steps, int) and steps > 0 else None
    _CHECK.redirect = _redirect.read(v)
    if _CHECK.redirect is not None:
        # A program that ends before its steps (a short script) is checked at its exit too.
        atexit.register(_redirect.check_used_at_exit)
    _hooks.when_imported(
        {
            "torch.utils.data": _patch_torch,
            "torchvision.datasets.folder": _redirect.patch_torchvision,
            "keras": _patch_keras,
        }
    )
