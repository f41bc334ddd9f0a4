"""Keras: a callback that profiles ``model.fit``.

    import pipeprof, pipeprof.keras
    pipeprof.init(program="train", settings={"batch_size": 64})
    model.fit(data, epochs=5, callbacks=[pipeprof.keras.callback(batch_size=64)])

Keras gives no hook around fetching a batch, so the stages are read from the batch
callbacks: ``wait`` is the time from the end of one batch to the beginning of the next
(where fit fetches the next batch from your generator or dataset), ``compute`` is the time
from batch begin to batch end (the train step). Each batch end is a step record with the
loss Keras reports (its running mean over the epoch) and, when ``accuracy`` is logged,
correct = accuracy × batch size.

Keras (``keras``, else ``tensorflow.keras``) is imported when the callback is made.
"""

from __future__ import annotations

import importlib

import pipeprof


def _keras():
    for name in ("keras", "tensorflow.keras"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError("pipeprof.keras needs keras (pip install keras) or tensorflow")


class _Hooks:
    """The callback's logic, independent of the Keras base class."""

    def _pp_setup(self, batch_size):
        self._pp_batch_size = int(batch_size or 0)
        self._pp_step = 0
        self._pp_epoch = 0
        self._pp_wait = None
        self._pp_compute = None

    def _pp_close(self, attr):
        sp = getattr(self, attr)
        if sp is not None:
            sp.__exit__(None, None, None)
            setattr(self, attr, None)

    def _pp_open(self, attr, stage):
        sp = pipeprof.span(stage, step=self._pp_step)
        sp.__enter__()
        setattr(self, attr, sp)

    def on_epoch_begin(self, epoch, logs=None):
        self._pp_epoch = int(epoch)
        # The first batch of an epoch is fetched after this: that wait counts too.
        self._pp_close("_pp_wait")
        self._pp_open("_pp_wait", "wait")

    def on_train_batch_begin(self, batch, logs=None):
        self._pp_close("_pp_wait")
        self._pp_open("_pp_compute", "compute")

    def on_train_batch_end(self, batch, logs=None):
        self._pp_close("_pp_compute")
        logs = logs or {}
        images = int(logs.get("size", self._pp_batch_size) or 0)
        acc = logs.get("accuracy", logs.get("acc"))
        correct = int(round(float(acc) * images)) if acc is not None else 0
        pipeprof.step(
            self._pp_step,
            epoch=self._pp_epoch,
            images=images,
            loss=float(logs.get("loss", 0.0)),
            correct=correct,
        )
        self._pp_step += 1
        self._pp_open("_pp_wait", "wait")

    def on_epoch_end(self, epoch, logs=None):
        # After the last batch fit validates or ends: not waiting for a training batch.
        self._pp_close("_pp_wait")

    def on_train_end(self, logs=None):
        self._pp_close("_pp_wait")
        self._pp_close("_pp_compute")
        pipeprof.flush()


def callback(batch_size=None):
    """A ``keras.callbacks.Callback`` recording wait, compute and step records."""
    base = _keras().callbacks.Callback

    class PipeprofCallback(_Hooks, base):
        def __init__(self):
            base.__init__(self)
            self._pp_setup(batch_size)

    return PipeprofCallback()
