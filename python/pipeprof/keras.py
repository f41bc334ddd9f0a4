"""Keras: profile ``model.fit`` (JAX, PyTorch and TensorFlow backends).

    import pipeprof, pipeprof.keras
    pipeprof.init(program="train", settings={"batch_size": 64})
    model.fit(data, epochs=5, callbacks=[pipeprof.keras.callback(batch_size=64)])

Under ``pipeprof run`` the callback is added to every ``fit`` on its own.

What is measured, and how:

* ``wait``: the time ``fit`` spends taking the next batch from your data (a NumPy array, a
  ``PyDataset``, a generator). pipeprof wraps the batch iterator of each epoch. With the
  TensorFlow backend batches are taken inside the compiled step (tf.data), so there is no
  separate wait: the step time includes it.
* ``compute``: from one batch's start to the next one's, less that batch's wait.
* validation: each validation batch is one ``validate`` span, never counted as wait.
* each step's images are counted from the batch itself (a short last batch counts what it
  holds); its loss and correct predictions come from the change in Keras's running means
  (``loss`` and ``accuracy`` are means over the epoch's samples so far), so the epoch table
  shows the same numbers Keras prints.

The callback keeps Keras's asynchronous batch-end dispatch on (``async_safe``): the training
loop never waits for it, and Ctrl-C interrupts ``fit`` as it does without pipeprof.

Keras (``keras``, else ``tensorflow.keras``) is imported when the callback is made.
"""

from __future__ import annotations

import importlib
import threading

import pipeprof
from pipeprof import _native
from pipeprof.torch import _first_leaf

_now = _native.now_ns


def _keras():
    for name in ("keras", "tensorflow.keras"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError("pipeprof.keras needs keras (pip install keras) or tensorflow")


def _batch_size(data):
    """Samples in a batch: the rows of its first array (0 when it has none)."""
    return _length(_first_leaf(data))


class _Feed:
    """What the batch iterators saw, shared by the iterators (training thread) and the
    callback (whose batch-end hooks run on Keras's executor thread)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.mode = "train"
        self.sizes = {"train": [], "test": []}
        self.active = None


_FEED = _Feed()


class _Fetch:
    """Times ``next()`` on one epoch's batch iterator as ``wait`` (training only) and records
    each batch's size."""

    def __init__(self, it):
        self.it = iter(it)

    def __iter__(self):
        return self

    def __next__(self):
        mode = _FEED.mode
        active = _FEED.active
        if mode == "train" and active is not None:
            op = active._pp_open
            t0 = _now()
            try:
                with pipeprof.span("wait", step=op[1] if op else None):
                    data = next(self.it)
            finally:
                _WAIT.total += _now() - t0
        else:
            data = next(self.it)
        n = _batch_size(data)
        with _FEED.lock:
            _FEED.sizes[mode].append(n)
        if mode == "train" and active is not None and n > active._pp_batch_size:
            # fit(PyDataset) has no batch_size argument: the batches tell.
            active._pp_batch_size = n
            settings = {"batch_size": n}
            shape = getattr(data[0] if isinstance(data, (list, tuple)) and data else data, "shape", None)
            if shape is not None and len(shape) == 4:
                # Keras images are (N, H, W, C).
                settings["input"] = [int(shape[3]), int(shape[1]), int(shape[2])]
            pipeprof.settings(**settings)
        return data

    def __getattr__(self, name):
        return getattr(self.it, name)


def wrap_epoch_iterators(epoch_iterator_mod, backend_name):
    """Wraps each Keras ``EpochIterator``'s batch iterator in a :class:`_Fetch` (not for the
    TensorFlow backend, whose iterator is consumed inside the compiled step)."""
    if backend_name == "tensorflow":
        return
    EpochIterator = epoch_iterator_mod.EpochIterator
    orig_init = EpochIterator.__init__

    def __init__(self, *args, **kwargs):
        orig_init(self, *args, **kwargs)
        get = self._get_iterator
        self._get_iterator = lambda: _Fetch(get())

    EpochIterator.__init__ = __init__


class Hooks:
    """The callback's logic, independent of the Keras base class."""

    #: Keras may run the batch-end hooks on its executor thread: the loop never waits.
    async_safe = True

    def _pp_setup(self, batch_size, data=None):
        self._pp_batch_size = int(batch_size or 0)
        self._pp_data = data
        self._pp_step = 0
        self._pp_epoch = 0
        self._pp_open = None  # (kind, step, t_begin, fetched before) of the batch in flight
        self._pp_mean = {"train": (0, 0.0, 0.0), "test": (0, 0.0, 0.0)}
        # Keras may run batch ends on several executor threads, in any order: they are
        # taken in batch order, one at a time (each needs the running means before it).
        self._pp_lock = threading.Lock()
        self._pp_pending = {"train": {}, "test": {}}
        self._pp_next = {"train": 0, "test": 0}
        self._pp_epoch_base = 0
        self._pp_settings_sent = False

    # -- the training thread (sync hooks)

    def on_train_begin(self, logs=None):
        _FEED.active = self
        if not self._pp_settings_sent:
            self._pp_settings_sent = True
            settings = {"framework": "keras", "device": _device(), "no_accuracy": False}
            if self._pp_batch_size:
                settings["batch_size"] = self._pp_batch_size
            # A PyDataset says how many workers load it, and how.
            workers = getattr(self._pp_data, "workers", None)
            if isinstance(workers, int):
                settings["workers"] = workers
            n = _length(self._pp_data)
            if n:
                settings["images"] = n
            pipeprof.settings(**settings)

    def _pp_reset(self, kind):
        # Keras has flushed the batch ends of the epoch (or pass) before: nothing is in flight.
        with _FEED.lock:
            _FEED.sizes[kind].clear()
        with self._pp_lock:
            self._pp_pending[kind].clear()
            self._pp_next[kind] = 0
            self._pp_mean[kind] = (0, 0.0, 0.0)

    def on_epoch_begin(self, epoch, logs=None):
        self._pp_epoch = int(epoch)
        self._pp_epoch_base = self._pp_step
        self._pp_reset("train")

    def _pp_close(self, end=None):
        op = self._pp_open
        if op is None:
            return
        self._pp_open = None
        kind, step, t0, wait_before = op
        end = _now() if end is None else end
        if kind == "train":
            waited = pipeprof_wait_since(wait_before)
            body = max(0, end - t0 - waited)
            _native.record("compute", end - body, body, step)
        else:
            _native.record("validate", t0, max(0, end - t0), step)

    def on_train_batch_begin(self, batch, logs=None):
        now = _now()
        self._pp_close(now)
        self._pp_open = ("train", self._pp_step, now, _WAIT.total)
        self._pp_step += 1

    def on_test_begin(self, logs=None):
        self._pp_close()
        _FEED.mode = "test"
        self._pp_reset("test")

    def on_test_batch_begin(self, batch, logs=None):
        now = _now()
        self._pp_close(now)
        self._pp_open = ("test", self._pp_step, now, 0)

    def on_test_end(self, logs=None):
        self._pp_close()
        _FEED.mode = "train"

    def on_epoch_end(self, epoch, logs=None):
        self._pp_close()

    def on_train_end(self, logs=None):
        self._pp_close()
        _FEED.active = None
        pipeprof.flush()

    # -- batch ends: possibly on Keras's executor thread

    def _pp_batch_end(self, kind, batch, logs):
        with self._pp_lock:
            self._pp_pending[kind][int(batch)] = dict(logs or {})
            while self._pp_next[kind] in self._pp_pending[kind]:
                b = self._pp_next[kind]
                self._pp_step_record(kind, b, self._pp_pending[kind].pop(b))
                self._pp_next[kind] = b + 1

    def _pp_step_record(self, kind, b, logs):
        with _FEED.lock:
            sizes = _FEED.sizes[kind]
            # The batch this end belongs to was fetched before its step ran.
            images = sizes[b] if b < len(sizes) else self._pp_batch_size
        n0, loss0, acc0 = self._pp_mean[kind]
        n1 = n0 + images
        loss_mean = _number(logs.get("loss"))
        acc_mean = _number(logs.get("accuracy", logs.get("acc", logs.get("compile_metrics"))))
        # Keras logs running means over the epoch's samples: the batch's own values are the
        # change in the sums.
        loss = (loss_mean * n1 - loss0 * n0) / images if (loss_mean is not None and images) else 0.0
        correct = 0
        if acc_mean is not None and images:
            correct = max(0, min(images, int(round(acc_mean * n1 - acc0 * n0))))
        self._pp_mean[kind] = (
            n1,
            loss_mean if loss_mean is not None else loss0,
            acc_mean if acc_mean is not None else acc0,
        )
        pipeprof.step(
            self._pp_epoch_base + b,
            epoch=self._pp_epoch,
            images=images,
            loss=loss,
            correct=correct,
            validation=kind == "test",
        )

    def on_train_batch_end(self, batch, logs=None):
        self._pp_batch_end("train", batch, logs)

    def on_test_batch_end(self, batch, logs=None):
        self._pp_batch_end("test", batch, logs)


class _WaitTotal:
    """Nanoseconds the training thread has spent in ``wait`` so far (read by the compute cut)."""

    def __init__(self):
        self.total = 0


_WAIT = _WaitTotal()


def pipeprof_wait_since(before):
    return _WAIT.total - before


def _device():
    """Where Keras computes: "cpu", or the accelerator its backend found."""
    try:
        from keras import backend

        name = backend.backend()
        if name == "jax":
            import jax

            return jax.default_backend()
        if name == "torch":
            import torch

            return "cuda" if torch.cuda.is_available() else "cpu"
        if name == "tensorflow":
            import tensorflow as tf

            return "gpu" if tf.config.list_logical_devices("GPU") else "cpu"
        return name
    except Exception:
        return ""


def _length(data):
    """Rows of an array (a fit() input, a batch's first array), when it says; else 0."""
    shape = getattr(data, "shape", None)
    if shape is not None and len(shape) > 0:
        try:
            return int(shape[0])
        except (TypeError, ValueError):
            return 0
    return 0


def _number(v):
    if v is None:
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def callback(batch_size=None, data=None):
    """A ``keras.callbacks.Callback`` recording wait, compute, validation and step records.
    ``data``: what is passed to ``fit`` (a ``PyDataset`` tells its workers)."""
    keras = _keras()
    base = keras.callbacks.Callback
    try:
        wrap_epoch_iterators_once(keras)
    except Exception as e:
        print(f"pipeprof: Keras batch waits are not timed ({e!r})")

    class PipeprofCallback(Hooks, base):
        def __init__(self):
            base.__init__(self)
            self._pp_setup(batch_size, data)

    return PipeprofCallback()


_WRAPPED = []


def wrap_epoch_iterators_once(keras):
    if _WRAPPED:
        return
    _WRAPPED.append(True)
    mod = importlib.import_module("keras.src.trainers.epoch_iterator")
    wrap_epoch_iterators(mod, keras.backend.backend())
