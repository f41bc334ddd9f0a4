"""Profiling with no edit to the script: what ``pipeprof run -- python train.py`` loads.

The start-up hook (``_bootstrap/sitecustomize.py``) calls :func:`start` in every Python
process of the run. Importing :mod:`pipeprof` has already connected the process to the run.
Then, when (and only if) the script imports them, each framework module gets its patches
(:mod:`pipeprof._hooks` runs them as each module is imported), one module of pipeprof per
concern, each saying what it patches and what it never touches:

* :mod:`pipeprof._torch_loop`: the training thread's steps (``DataLoader`` iteration and
  ``torch.autograd.backward``, optimizer step hooks, ``no_grad``/``inference_mode`` entered,
  and ``torch.compile`` to know it is used; nothing of ``torch.Tensor``).
* :mod:`pipeprof._torch_fetch`: how a batch is made, in each DataLoader worker or on the
  training thread (``fetch``, ``collate``, torchvision ``resize``/``augment``).
* :mod:`pipeprof._pil`: PIL's ``read``/``decode``, for the DataLoader and Keras's loaders alike.
* :mod:`pipeprof._cv2`: cv2's ``imread``/``imdecode``/``resize``/``cvtColor`` and
  albumentations' transforms by kind, inside a DataLoader's samples.
* Keras (3, or tf.keras 2 = ``tf_keras``): ``Model.fit`` gets :func:`pipeprof.keras.callback`
  (unless it has one); :mod:`pipeprof._keras_data` times its loaders.
* :mod:`pipeprof._override`: a ``--check-advice`` re-run's loader arguments and steps.

The state they share is :mod:`pipeprof._state`'s. Nothing here raises into the script: a hook
that fails turns itself off with a message.
"""

from __future__ import annotations

import atexit
import sys

import pipeprof
from pipeprof import _cv2, _hooks, _override, _pil, _state, _torch_fetch, _torch_loop

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
            _hooks.warn("this fit", e)
        return orig_fit(self, *args, **kwargs)

    fit._pipeprof = True
    Model.fit = fit
    # Its loaders (PyDataset/Sequence items, ImageDataGenerator's load_img and transforms),
    # timed in whichever thread or process runs them, once their modules are imported.
    from pipeprof import _keras_data

    _hooks.when_imported(_keras_data.hooks(top))


# ---------------------------------------------------------------- start


def start():
    """Hooks this process (the run's main process, or one of its workers)."""
    if pipeprof.role() == "off":
        return
    _state.RUN.main = pipeprof.is_main()
    if _state.RUN.main:
        pipeprof.fail_on_uncaught_exception()
        atexit.register(_torch_loop.finish)
    _hooks.when_imported(
        {
            "torch.utils.data.dataloader": _torch_loop.install,
            "torch.autograd": _torch_loop.install_backward,
            "torch.autograd.grad_mode": _torch_loop.install_grad_mode,
            "torch.optim.optimizer": _torch_loop.install_optim,
            "torch": _torch_loop.install_compile,
            "torch.utils.data._utils.fetch": _torch_fetch.install_fetch,
            "PIL.Image": _pil.install_image,
            "PIL.ImageFile": _pil.install_imagefile,
            "torchvision.transforms.transforms": _torch_fetch.install_transforms,
            "torchvision.transforms.v2._container": _torch_fetch.install_transforms_v2,
            "torchvision.datasets.folder": _torch_fetch.install_folder,
            "cv2": _cv2.install_cv2,
            "albumentations.core.transforms_interface": _cv2.install_albumentations,
            "keras.src.models.model": _patch_keras,
            "tf_keras.src.engine.training": _patch_keras,
        }
    )
    try:
        _override.install()
    except Exception as e:
        _hooks.warn("this --check-advice re-run", e)


__all__ = ["start"]
