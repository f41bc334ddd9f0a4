"""Keras's Python-side loaders, on every backend: what ``pipeprof run`` times inside a
``PyDataset`` (a ``keras.utils.Sequence`` in tf.keras 2) and an ``ImageDataGenerator``.

Patched, once, when Keras (``keras`` or ``tf_keras``) is imported, in every process of the run
(so in a spawned worker too):

* each ``__getitem__`` of the data set's class, from the adapter Keras wraps a
  ``PyDataset``/``Sequence`` in (``PyDatasetAdapter``, ``KerasSequenceAdapter``), wherever
  Keras calls it: on the training thread (no workers), in the pool's threads or in its forked
  processes; in a spawned process (whose class is its module's own) the pool's
  ``get_index`` is timed instead. A pool worker is named ``loader-N`` before its first span,
  as DataLoader workers are. A batch inside which none of the stages below ran is one
  ``fetch`` span (arrays in memory, a format pipeprof does not know): never called decoding.
* ``load_img`` (what ``flow_from_directory`` calls per image) is three spans: ``decode``
  (PIL's ``ImageFile.load``, the pixels), ``resize`` (PIL's ``Image.resize`` less any decode
  it set off) and ``read`` (the rest: opening the file, reading its bytes, the header).
* ``ImageDataGenerator.apply_transform`` is ``augment``.

Each span carries the thread's CPU time and run-queue wait, like the DataLoader workers' ones.
PIL is :mod:`pipeprof._pil`'s (one patch for every loader), which times the Keras way inside
the batches and ``load_img`` calls marked here (``_state.THREAD``).
What it never does: change the data set object Keras is given, the batches, their order,
the worker count or the start method.
Nothing here raises into the script: a patch that fails leaves that part untimed, with a line.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.dummy
import os
import threading

import pipeprof
from pipeprof import _hooks, _pil, _state
from pipeprof._pil import Clock, record, sub

#: Where this thread is in a loader's work (shared with ``_pil`` and ``_torch_fetch``).
_T = _state.THREAD
_KERAS = _state.KERAS


class _Covered:
    """Marks the enclosing item as covered by named stages (and a DataLoader's samples it is
    inside of), and keeps PIL's spans of the DataLoader kind quiet inside (they would time the
    same work twice)."""

    __slots__ = ()

    def __enter__(self):
        _T.item_covered = True
        _T.depth += 1
        if _T.in_fetch:
            _T.fetch_covered = True
        return self

    def __exit__(self, *exc):
        _T.depth -= 1
        return False


# ---------------------------------------------------------------- load_img


def _timed_load_img(orig):
    """``load_img`` as three spans: ``decode`` and ``resize`` (PIL's, added up by ``_pil``) and
    ``read``, the rest."""

    def load_img(*args, **kwargs):
        if _T.img is not None:
            return orig(*args, **kwargs)
        acc = {"read": [0, 0, 0], "decode": [0, 0, 0], "resize": [0, 0, 0]}
        _T.img = acc
        with _Covered():
            c0 = Clock()
            try:
                return orig(*args, **kwargs)
            finally:
                _T.img = None
                # read: all but decode and resize (opening the file, its bytes, the header).
                total = Clock().since(c0)
                read = sub(sub(total, acc["decode"]), acc["resize"])
                start = c0.wall
                for stage, d in (("read", read), ("decode", acc["decode"]), ("resize", acc["resize"])):
                    record(stage, start, d)
                    start += d[0]

    load_img.__wrapped__ = orig
    load_img.__name__ = "load_img"
    return load_img


def patch_image_utils(mod):
    """``load_img`` of ``keras.src.utils.image_utils`` or ``tf_keras.src.utils.image_utils``."""
    if getattr(mod.load_img, "__wrapped__", None) is not None:
        return
    _pil.install()
    mod.load_img = _timed_load_img(mod.load_img)


def patch_dataset_dir(mod):
    """``image_dataset_from_directory`` (Keras 3's ``keras.src.utils.image_dataset_utils``,
    tf.keras 2's ``tf_keras.src.utils.image_dataset``): the first folder it reads is the run's
    ``data`` setting (the ``tf.data.Dataset`` it returns, mapped, says nothing of it), so the
    storage advice can name it. Patched before ``keras.utils`` binds the name."""
    orig = getattr(mod, "image_dataset_from_directory", None)
    if orig is None or getattr(orig, "__wrapped__", None) is not None:
        return

    def image_dataset_from_directory(directory, *args, **kwargs):
        if _KERAS.folder is None:
            try:
                _KERAS.folder = os.fsdecode(directory)
                pipeprof.settings(data=_KERAS.folder)
            except Exception as e:
                _hooks.warn("image_dataset_from_directory's folder", e)
        return orig(directory, *args, **kwargs)

    image_dataset_from_directory.__wrapped__ = orig
    mod.image_dataset_from_directory = image_dataset_from_directory


def patch_image_generator(mod):
    """``ImageDataGenerator.apply_transform`` (the random transforms) as ``augment``."""
    Gen = mod.ImageDataGenerator
    orig = Gen.apply_transform
    if getattr(orig, "__wrapped__", None) is not None:
        return

    def apply_transform(self, x, transform_parameters):
        with _Covered():
            c0 = Clock()
            try:
                return orig(self, x, transform_parameters)
            finally:
                record("augment", c0.wall, Clock().since(c0))

    apply_transform.__wrapped__ = orig
    Gen.apply_transform = apply_transform


# ---------------------------------------------------------------- PyDataset / Sequence


def _name_worker(ds):
    """A pool worker is ``loader-N``, N its place in the pool: Keras starts a pool per epoch,
    and processes (threads) are numbered on across pools, so N is that number modulo the
    data set's workers where it says. tf.data's own threads (a PyDataset without workers on
    TensorFlow) are ``tf.data (PyDataset)``."""
    if _T.named:
        return
    _T.named = True
    workers = getattr(ds, "workers", None)
    if isinstance(threading.current_thread(), multiprocessing.dummy.DummyProcess):
        with _KERAS.lock:
            n = _KERAS.next_worker
            _KERAS.next_worker = n + 1
    elif multiprocessing.parent_process() is not None:
        ident = multiprocessing.current_process()._identity
        n = ident[-1] - 1 if ident else 0
    elif isinstance(threading.current_thread(), threading._DummyThread):
        # A thread Python did not start: tf.data's, running a PyDataset's generator
        # (TensorFlow backend, no workers). Python forgets such a thread (its thread-local,
        # its thread object) each time TensorFlow's call into it returns: named once per OS
        # thread, or each batch would name it again, a new thread to pipeprof each time.
        tid = threading.get_native_id()
        with _KERAS.lock:
            if tid in _TF_NAMED:
                return
            if len(_TF_NAMED) < _TF_NAMED_MAX:
                _TF_NAMED.add(tid)
        pipeprof.name_thread("tf.data (PyDataset)")
        return
    else:
        return
    if isinstance(workers, int) and workers > 0:
        n %= workers
    if multiprocessing.parent_process() is not None:
        pipeprof.name_process(f"loader-{n}", worker=n)
    else:
        pipeprof.name_thread(f"loader-{n}", worker=n)


#: tf.data's threads (OS ids) named ``tf.data (PyDataset)`` in this process, at most
#: ``_TF_NAMED_MAX``: TensorFlow's thread pools are small and live as long as the program.
_TF_NAMED = set()
_TF_NAMED_MAX = 4096


def _item(get, ds, i):
    """``get(ds, i)`` timed as one batch of a PyDataset (nested calls time nothing)."""
    if _T.in_item:
        return get(ds, i)
    _name_worker(ds)
    _T.in_item, _T.item_covered = True, False
    # PIL's spans of the DataLoader kind stay quiet: the Keras ones time the same calls.
    _T.depth += 1
    c0 = Clock()
    try:
        return get(ds, i)
    finally:
        _T.in_item = False
        _T.depth -= 1
        if not _T.item_covered:
            # Nothing recognised inside: the batch was taken as it is.
            record("fetch", c0.wall, Clock().since(c0))
        pipeprof.flush()


def _timed_getitem(orig):
    def __getitem__(self, i):
        return _item(orig, self, i)

    __getitem__.__wrapped__ = orig
    return __getitem__


def _time_class(ds):
    """Times ``__getitem__`` of the data set's class (once per class): wherever Keras calls it,
    the training thread, a pool thread or a forked pool process."""
    cls = type(ds)
    get = getattr(cls, "__getitem__", None)
    if get is None or getattr(get, "__wrapped__", None) is not None:
        return
    try:
        cls.__getitem__ = _timed_getitem(get)
    except (TypeError, AttributeError) as e:  # a class that cannot be changed
        _hooks.warn(f"{cls.__name__}.__getitem__", e)


def _patch_pil_if_there():
    try:
        _pil.install()
    except ImportError:
        pass  # no Pillow: nothing of it to time


def _timed_adapter_init(orig):
    def __init__(self, x, *args, **kwargs):
        _time_class(x)
        orig(self, x, *args, **kwargs)

    __init__.__wrapped__ = orig
    return __init__


def patch_adapter(cls):
    _patch_pil_if_there()
    if getattr(cls.__init__, "__wrapped__", None) is None:
        cls.__init__ = _timed_adapter_init(cls.__init__)


def patch_get_index(mod):
    """The function Keras's pool runs per batch, ``get_index(uid, i)``: a spawned worker has
    the data set's class as its module defines it (untimed), so the batch is timed here."""
    orig = mod.get_index
    if getattr(orig, "__wrapped__", None) is not None:
        return

    def get_index(uid, i):
        ds = getattr(mod, "_SHARED_SEQUENCES", {}).get(uid)
        return _item(lambda _, j: orig(uid, j), ds, i)

    get_index.__wrapped__ = orig
    # Pickled by reference to the pool's processes: the same name in the same module.
    get_index.__module__, get_index.__qualname__, get_index.__name__ = orig.__module__, orig.__qualname__, orig.__name__
    mod.get_index = get_index


# ---------------------------------------------------------------- entry


_KERAS3 = {
    "keras.src.utils.image_utils": patch_image_utils,
    "keras.src.utils.image_dataset_utils": patch_dataset_dir,
    "keras.src.legacy.preprocessing.image": patch_image_generator,
    "keras.src.trainers.data_adapters.py_dataset_adapter": lambda m: (patch_adapter(m.PyDatasetAdapter), patch_get_index(m)),
}
_TF_KERAS = {
    "tf_keras.src.utils.image_utils": patch_image_utils,
    "tf_keras.src.utils.image_dataset": patch_dataset_dir,
    "tf_keras.src.preprocessing.image": patch_image_generator,
    "tf_keras.src.engine.data_adapter": lambda m: patch_adapter(m.KerasSequenceAdapter),
    "tf_keras.src.utils.data_utils": patch_get_index,
}


def hooks(top):
    """The patches for Keras 3 (``top`` = ``keras``) or tf.keras 2 (``tf_keras``), by the
    module each applies to (for ``_hooks.when_imported``: now, or when it is imported)."""
    targets = _TF_KERAS if top == "tf_keras" else _KERAS3
    return {name: _once(name, fn) for name, fn in targets.items()}


def _once(name, fn):
    def hook(mod):
        if name in _KERAS.patched:
            return
        _KERAS.patched.add(name)
        fn(mod)

    return hook
