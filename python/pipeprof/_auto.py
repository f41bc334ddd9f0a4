"""Profiling with no edit to the script: what ``pipeprof run -- python train.py`` loads.

The start-up hook (``_bootstrap/sitecustomize.py``) calls :func:`start` in every Python
process of the run. Importing :mod:`pipeprof` has already connected the process to the run.
Then, when (and only if) the script imports them, each framework module gets its patches,
one module of pipeprof per concern, each saying what it patches and what it never touches:

* :mod:`pipeprof._torch_loop`: the training thread's steps (``DataLoader`` iteration and
  ``torch.autograd.backward``, optimizer step hooks, and ``torch.compile`` to know it is used;
  nothing of ``torch.Tensor``).
* :mod:`pipeprof._torch_fetch`: how a batch is made, in each DataLoader worker or on the
  training thread (``fetch``, ``collate``, PIL ``read``/``decode``, torchvision
  ``resize``/``augment``).
* Keras (3, or tf.keras 2 = ``tf_keras``): ``Model.fit`` gets :func:`pipeprof.keras.callback`
  (unless it has one); :mod:`pipeprof._keras_data` times its loaders.

Nothing here raises into the script: a hook that fails turns itself off with a message.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.util
import sys

import pipeprof
from pipeprof import _torch_fetch, _torch_loop

#: The training thread's counters (step, epoch, device), shared with the other hooks.
_STATE = _torch_loop._STATE


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


# ---------------------------------------------------------------- keras


def _patch_keras(model_mod):
    """``Model.fit`` of Keras 3 (``keras.src.models.model``) or tf.keras 2
    (``tf_keras.src.engine.training``) gets the pipeprof callback, unless the script passed
    one. Hooked on those modules, not on the package: TensorFlow probes ``keras`` and
    ``tf_keras`` with ``importlib.util.find_spec`` before importing them, and a hook on the
    package would be spent on the probe."""
    Model = model_mod.Model
    if getattr(Model.fit, "_pipeprof", False):
        return
    top = model_mod.__name__.split(".")[0]
    orig_fit = Model.fit

    def fit(self, *args, **kwargs):
        from pipeprof import keras as pk

        try:
            callbacks = list(kwargs.get("callbacks") or [])
            if not any(isinstance(c, pk.Hooks) for c in callbacks):
                data = args[0] if args else kwargs.get("x")
                batch_size = kwargs.get("batch_size", args[2] if len(args) > 2 else None)
                keras = sys.modules[top]  # imported whole by the time fit runs
                callbacks.append(pk.callback(batch_size=batch_size, data=data, keras=keras, fit_kwargs=kwargs))
            kwargs["callbacks"] = callbacks
        except Exception as e:
            _warn("this fit", e)
        return orig_fit(self, *args, **kwargs)

    fit._pipeprof = True
    Model.fit = fit
    # Its loaders (PyDataset/Sequence items, ImageDataGenerator's load_img and transforms),
    # timed in whichever thread or process runs them, once their modules are imported.
    from pipeprof import _keras_data

    _when_imported(_keras_data.hooks(top))


# ---------------------------------------------------------------- start


def start():
    """Hooks this process (the run's main process, or one of its workers)."""
    if pipeprof.role() == "off":
        return
    _STATE["main"] = pipeprof.is_main()
    if _STATE["main"]:
        pipeprof.fail_on_uncaught_exception()
        atexit.register(_torch_loop.finish)
    _when_imported(
        {
            "torch.utils.data.dataloader": _torch_loop.install,
            "torch.autograd": _torch_loop.install_backward,
            "torch.optim.optimizer": _torch_loop.install_optim,
            "torch": _torch_loop.install_compile,
            "torch.utils.data._utils.fetch": _torch_fetch.install_fetch,
            "PIL.Image": _torch_fetch.install_pil,
            "PIL.ImageFile": _torch_fetch.install_pil_imagefile,
            "torchvision.transforms.transforms": _torch_fetch.install_transforms,
            "torchvision.transforms.v2._container": _torch_fetch.install_transforms_v2,
            "keras.src.models.model": _patch_keras,
            "tf_keras.src.engine.training": _patch_keras,
            "pipeprof": lambda m: importlib.import_module("pipeprof._override").install(m),
        }
    )


__all__ = ["start"]
