"""Keras: profile ``model.fit`` (Keras 3 on JAX, PyTorch and TensorFlow; tf.keras 2 = tf_keras).

    import pipeprof, pipeprof.keras
    pipeprof.init(program="train", settings={"batch_size": 64})
    model.fit(data, epochs=5, callbacks=[pipeprof.keras.callback(batch_size=64)])

Under ``pipeprof run`` the callback is added to every ``fit`` on its own.

What is measured, and how:

* ``wait``: the time ``fit`` spends taking the next batch from your data (a NumPy array, a
  ``PyDataset``, a generator). pipeprof wraps the batch iterator of each epoch. With the
  TensorFlow backend (and tf_keras) batches are taken inside the compiled step (tf.data), so
  Python sees no wait: ``pipeprof._tf`` reads it, and tf.data's stages, from TensorFlow's own
  host trace in short windows (5 steps every 100 from the first; ``PIPEPROF_TF_TRACE=0``
  turns it off);
  steps outside a window have no wait span.
* ``fetch``: a batch sliced from arrays in memory (JAX, PyTorch), inside its wait: taking
  rows from memory is not decoding (the loader then has no workers: ``workers=0``).
* ``compute``: from one batch's start to the next one's, less that batch's wait. On
  TensorFlow every step's time is the one Keras's batch hooks bound (begin to the next
  begin); the trace windows apportion it: a step a window covered has the wait TensorFlow
  traced in it, each other step the share of waiting the windows measured over their steps
  (the run's first step, the compile and the queue filling, left out of that share). Before
  any window measured a share (or with ``PIPEPROF_TF_TRACE=0``) a step's split is unknown:
  no span, never "compute". The first step (the compile) is compute, reported apart.
* epochs: each epoch's time runs from Keras's ``on_epoch_begin`` to its ``on_epoch_end``
  (its validation pass included, as Keras's own bar counts it): two marks on the epoch's
  clock (validation records with no images), so an epoch of one step has its time.
* accuracy: a model compiled without an accuracy metric says so (``no_accuracy``): its
  accuracy is shown as ``-``, not 0%.
* validation: each validation batch is one ``validate`` span, never counted as wait.
* each step's images are counted from the batch itself: the batches the iterator hands out
  (JAX, PyTorch) or, where the step takes its batch inside the compiled function
  (TensorFlow), the sample count Keras's own loss tracker adds up from each batch's first
  dimension; a short last batch counts what it holds. Its loss and correct predictions come
  from the change in Keras's running means (``loss`` and ``accuracy`` are means over the
  epoch's samples so far), so the epoch table shows the same numbers Keras prints.
* ``steps_per_execution=k``: one callback interval runs k steps; each is a step record (the
  interval's images, loss and correct predictions shared out), one compute span covers them.

Each training iteration is one step whatever hooks fire: on the PyTorch backend Keras feeds
``fit`` through a ``torch.utils.data.DataLoader``, which ``pipeprof run``'s DataLoader hook
would count too; the DataLoaders Keras iterates are marked as timed here
(``_pipeprof_manual``, the mark ``pipeprof.torch.profile`` sets), so that hook steps aside and
the Keras hook, which knows validation from training, counts the step.

The callback keeps Keras's asynchronous batch-end dispatch on (``async_safe``): the training
loop never waits for it, and Ctrl-C interrupts ``fit`` as it does without pipeprof. (On
TensorFlow, Keras runs batch ends on the training thread anyway.)

Keras (``keras``, else ``tensorflow.keras``) is imported when the callback is made, unless the
caller hands the module (tf_keras).
"""

from __future__ import annotations

import importlib
import os
import sys
import threading

import pipeprof
from pipeprof import _native
from pipeprof._keras_backend import backend_of as _backend_of
from pipeprof._keras_backend import fit_settings
from pipeprof._keras_backend import keras_module as _keras
from pipeprof._keras_backend import rows
# The reader of a file `pipeprof pack --layout keras` wrote, offered here to Keras users.
from pipeprof.data import packed_dataset  # noqa: F401
from pipeprof.torch import _first_leaf

_now = _native.now_ns


def _batch_size(data):
    """Samples in a batch: the rows of its first array (0 when it has none)."""
    return rows(_first_leaf(data))


class _Feed:
    """What the batch iterators saw, shared by the iterators (training thread) and the
    callback (whose batch-end hooks run on Keras's executor thread)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.mode = "train"
        self.sizes = {"train": [], "test": []}
        self.active = None


_FEED = _Feed()

#: Keras's adapters for data already in memory: taking a batch is slicing (``fetch``).
_IN_MEMORY = ("ArrayDataAdapter",)


class _Fetch:
    """Times ``next()`` on one epoch's batch iterator as ``wait`` (training only) and records
    each batch's size. ``in_memory``: the batch is sliced from arrays, a ``fetch`` inside the
    wait (on the training thread: no workers)."""

    def __init__(self, it, in_memory=False):
        self.it = iter(it)
        self.in_memory = in_memory

    def __iter__(self):
        return self

    def __next__(self):
        mode = _FEED.mode
        active = _FEED.active
        if mode == "train" and active is not None:
            op = active._pp_open
            step = op[1] if op else None
            t0 = _now()
            try:
                with pipeprof.span("wait", step=step):
                    if self.in_memory:
                        with pipeprof.span("fetch", step=step):
                            data = next(self.it)
                    else:
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


def _timed_by_keras(loader):
    """Iterates a torch DataLoader that Keras feeds ``fit`` from with ``pipeprof run``'s
    DataLoader hook stepping aside (its ``_pipeprof_manual`` mark): the step is counted here.
    The mark is taken off the loader again once its iterator exists (the iterator keeps it),
    so a user's own DataLoader handed to ``fit`` is profiled as usual in the user's own loop."""
    had = loader.__dict__.get("_pipeprof_manual", _MISSING) if hasattr(loader, "__dict__") else _MISSING
    try:
        loader._pipeprof_manual = True
    except AttributeError:
        return iter(loader)
    try:
        it = iter(loader)
    finally:
        if had is _MISSING:
            try:
                del loader._pipeprof_manual
            except AttributeError:
                pass
        else:
            loader._pipeprof_manual = had
    try:
        it._pipeprof_manual = True
    except AttributeError:
        pass
    return it


_MISSING = object()


def _is_torch_loader(obj):
    torch_data = sys.modules.get("torch.utils.data")
    return torch_data is not None and isinstance(obj, torch_data.DataLoader)


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
        in_memory = type(getattr(self, "data_adapter", None)).__name__ in _IN_MEMORY

        def get_iterator():
            it = get()
            if _is_torch_loader(it):
                # pipeprof run's DataLoader hooks time its fetch (and collate) themselves.
                return _Fetch(_timed_by_keras(it), False)
            return _Fetch(it, in_memory)

        self._get_iterator = get_iterator

    EpochIterator.__init__ = __init__


def _sample_counter(model):
    """A function returning how many samples the step function has taken this epoch (or this
    evaluation), from the Mean that Keras's loss is averaged by: each step adds its batch's
    first dimension to the Mean's ``count`` (Keras 3: ``model._loss_tracker``; tf_keras:
    ``model.compiled_loss._total_loss_mean``). None when the model has neither."""
    tracker = getattr(model, "_loss_tracker", None)
    if tracker is None:
        tracker = getattr(getattr(model, "compiled_loss", None), "_total_loss_mean", None)
    count = getattr(tracker, "count", None)
    if count is None:
        return None

    def read():
        try:
            return float(count.numpy())
        except Exception:
            return None

    return read


class Hooks:
    """The callback's logic, independent of the Keras base class."""

    #: Keras may run the batch-end hooks on its executor thread: the loop never waits.
    async_safe = True

    def _pp_setup(self, batch_size, data=None, in_graph=False, fit_kwargs=None):
        self._pp_batch_size = int(batch_size or 0)
        self._pp_batch_given = bool(batch_size)
        self._pp_data = data
        self._pp_fit_kwargs = dict(fit_kwargs or {})
        # TensorFlow (Keras 3's backend or tf_keras): the step function takes its batch
        # inside the graph; images come from the loss tracker's sample count.
        self._pp_in_graph = bool(in_graph)
        self._pp_counter = None
        # TensorFlow's host trace in sampled windows: the wait inside the compiled step.
        self._pp_sampler = None
        self._pp_counted = {"train": 0.0, "test": 0.0}
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
        self._pp_epoch_t0 = None
        # TensorFlow: the fit's first training step (the compile), and the steps outside any
        # window waiting for a measured share of waiting to apportion them.
        self._pp_first = None
        self._pp_unsplit = []
        self._pp_acc_known = None

    # -- the training thread (sync hooks)

    def _pp_per_call(self):
        """Steps one step-function call runs (``steps_per_execution``)."""
        model = getattr(self, "model", None)
        k = getattr(model, "steps_per_execution", None)
        if k is None:
            k = getattr(model, "_steps_per_execution", None)
        try:
            k = int(k.numpy()) if hasattr(k, "numpy") else int(k)
        except (TypeError, ValueError):
            k = 1
        return max(1, k)

    def on_train_begin(self, logs=None):
        _FEED.active = self
        if self._pp_in_graph and self._pp_counter is None:
            self._pp_counter = _sample_counter(getattr(self, "model", None))
        if self._pp_in_graph and self._pp_sampler is None and os.environ.get("PIPEPROF_TF_TRACE", "1") != "0":
            from pipeprof import _tf

            self._pp_sampler = _tf.Sampler()
        self._pp_k = self._pp_per_call()
        if not self._pp_settings_sent:
            self._pp_settings_sent = True
            pipeprof.settings(**fit_settings(self, self._pp_data, self._pp_batch_size, self._pp_fit_kwargs))

    def _pp_reset(self, kind):
        # Keras has flushed the batch ends of the epoch (or pass) before: nothing is in flight.
        with _FEED.lock:
            _FEED.sizes[kind].clear()
        with self._pp_lock:
            self._pp_pending[kind].clear()
            self._pp_next[kind] = 0
            self._pp_mean[kind] = (0, 0.0, 0.0)
            self._pp_counted[kind] = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self._pp_epoch_t0 = _now()
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
            sampler = self._pp_sampler
            if sampler is not None and sampler.is_open():
                # Its wait inside the graph is in the window's trace: cut when it closes.
                sampler.pending.append((step, end - body, body))
            elif self._pp_in_graph and step != self._pp_first:
                # TensorFlow, outside a window: the step's wait for tf.data is inside its
                # interval, apportioned by the share the windows measured, once the next window
                # has closed (or training ended): the share of every window up to it, not only
                # the first's, whose steps took the batches made ahead during the compile.
                self._pp_unsplit.append((step, end - body, body))
                if len(self._pp_unsplit) > _UNSPLIT_MAX:
                    self._pp_apportion()
            else:
                # (The run's first step on TensorFlow: the compile, reported apart.)
                _native.record("compute", end - body, body, step)
        else:
            _native.record("validate", t0, max(0, end - t0), step)

    def _pp_apportion(self, final=False):
        """Records the steps outside the windows, each as a wait and a compute span: its time
        (Keras's) split by the share of waiting the windows measured. Without a share yet they
        wait for one (at most a bounded number); at the end of training, still without one,
        their split is unknown: no span."""
        sampler = self._pp_sampler
        share = sampler.share() if sampler is not None else None
        if share is None:
            if final or len(self._pp_unsplit) > _UNSPLIT_MAX:
                self._pp_unsplit.clear()
            return
        for step, start, dur in self._pp_unsplit:
            waited = int(dur * share)
            _native.record("wait", start, waited, step)
            _native.record("compute", start + waited, dur - waited, step)
        self._pp_unsplit.clear()

    def on_train_batch_begin(self, batch, logs=None):
        now = _now()
        self._pp_close(now)
        step = self._pp_epoch_base + int(batch)
        if self._pp_first is None:
            self._pp_first = step
        sampler = self._pp_sampler
        if sampler is not None:
            sampler.startup_step = self._pp_first
            if sampler.full(step):
                sampler.close(step)
                self._pp_apportion()
            if sampler.wants(step):
                sampler.open(step)
            sampler.step_begin(step, marks=getattr(self, "_pp_keras", "keras") != "tf_keras")
            now = _now()  # the window's own cost is not the step's
        self._pp_open = ("train", step, now, _WAIT.total)
        self._pp_step = max(self._pp_step, step + 1)

    def _pp_close_window(self):
        if self._pp_sampler is not None and self._pp_sampler.is_open():
            self._pp_sampler.close(self._pp_step)
            self._pp_apportion()

    def on_test_begin(self, logs=None):
        self._pp_close()
        self._pp_close_window()
        _FEED.mode = "test"
        self._pp_reset("test")

    def on_test_batch_begin(self, batch, logs=None):
        now = _now()
        self._pp_close(now)
        self._pp_open = ("test", self._pp_step, now, 0)

    def on_test_end(self, logs=None):
        self._pp_close()
        self._pp_drain("test")
        _FEED.mode = "train"

    def on_epoch_end(self, epoch, logs=None):
        end = _now()  # before the window's closing: pipeprof's own cost is not the epoch's
        self._pp_close(end)
        self._pp_close_window()
        self._pp_drain("train")
        t0, self._pp_epoch_t0 = self._pp_epoch_t0, None
        if t0 is not None:
            # The epoch's clock, from Keras's begin to its end (validation included): marks,
            # validation records with no images.
            for t in (t0, end):
                _native.step(self._pp_step, self._pp_epoch, 0, None, 0, 0, True, t)

    def on_train_end(self, logs=None):
        self._pp_close()
        self._pp_close_window()
        self._pp_apportion(final=True)
        self._pp_drain("train")
        if self._pp_sampler is not None:
            print(self._pp_sampler.summary(), file=sys.stderr)
        _FEED.active = None
        pipeprof.flush()

    # -- batch ends: possibly on Keras's executor thread

    def _pp_batch_end(self, kind, batch, logs):
        logs = dict(logs or {})
        if self._pp_counter is not None:
            # On TensorFlow batch ends run on the training thread, right after the step
            # function: the count is this batch's.
            counted = self._pp_counter()
            if counted is not None:
                logs["_pp_counted"] = counted
        with self._pp_lock:
            pending = self._pp_pending[kind]
            pending[int(batch)] = logs
            # A call runs k steps: batch ends arrive at step k-1, 2k-1, ... (a short last
            # call is taken when the epoch or pass ends).
            while self._pp_next[kind] + self._pp_k - 1 in pending:
                self._pp_take(kind, self._pp_next[kind] + self._pp_k - 1)

    def _pp_drain(self, kind):
        """Takes the batch ends still waiting for an earlier one (a short last call)."""
        with self._pp_lock:
            pending = self._pp_pending[kind]
            for end in sorted(pending):
                if end >= self._pp_next[kind]:
                    self._pp_take(kind, end)
            pending.clear()

    def _pp_take(self, kind, end):
        logs = self._pp_pending[kind].pop(end)
        first = self._pp_next[kind]
        last = self._pp_step_records(kind, first, end, logs)
        self._pp_next[kind] = end + 1
        if kind == "train":
            # The next epoch's steps are numbered on from this one's.
            self._pp_step = max(self._pp_step, self._pp_epoch_base + last + 1)

    def _pp_step_records(self, kind, first, end, logs):
        """Step records for the call whose batch end is ``end`` (steps ``first``..``end``, or
        fewer: Keras 3 names the end of a short last call as if it were full); returns the
        last step's index."""
        k = end - first + 1
        counted = logs.pop("_pp_counted", None)
        if counted is not None:
            total = max(0, int(round(counted - self._pp_counted[kind])))
            self._pp_counted[kind] = counted
            if kind == "train" and total and not self._pp_batch_given and -(-total // k) > self._pp_batch_size:
                # tf.data, a PyDataset: the largest batch says the batch size (a short last
                # batch may come first).
                self._pp_batch_size = -(-total // k)
                pipeprof.settings(batch_size=self._pp_batch_size)
            if self._pp_batch_size:
                k = max(1, min(k, -(-total // self._pp_batch_size)))
            # One call of k steps: its samples shared out, the first steps taking the rest.
            share, extra = divmod(total, k)
            sizes = [share + (1 if i < extra else 0) for i in range(k)]
        else:
            with _FEED.lock:
                seen = _FEED.sizes[kind]
                # The batch this end belongs to was fetched before its step ran.
                if first < len(seen):
                    k = max(1, min(k, len(seen) - first))
                sizes = [seen[b] if b < len(seen) else self._pp_batch_size for b in range(first, first + k)]
        steps = range(first, first + k)
        images = sum(sizes)
        n0, loss0, acc0 = self._pp_mean[kind]
        n1 = n0 + images
        loss_mean = _number(logs.get("loss"))
        acc_mean = _number(_accuracy(logs))
        if kind == "train" and self._pp_acc_known is None:
            self._pp_acc_known = acc_mean is not None
            if acc_mean is None:
                # A model compiled without an accuracy metric: none shown, not 0%.
                pipeprof.settings(no_accuracy=True)
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
        left = correct
        for i, (b, n) in enumerate(zip(steps, sizes)):
            c = left if i == len(sizes) - 1 else (correct * n // images if images else 0)
            left -= c
            pipeprof.step(
                self._pp_epoch_base + b,
                epoch=self._pp_epoch,
                images=n,
                loss=loss,
                correct=c,
                validation=kind == "test",
            )
        return first + k - 1

    def on_train_batch_end(self, batch, logs=None):
        sampler = self._pp_sampler
        if self._pp_in_graph:
            # TensorFlow: the step is Keras's, batch begin to batch end (the loop between
            # steps is tf.data's, inside the next step).
            self._pp_close(_now())
        if sampler is not None:
            sampler.step_end()
        self._pp_batch_end("train", batch, logs)
        if sampler is not None and sampler.full(self._pp_step):
            # Closed here, between two steps: its cost is in neither.
            sampler.close(self._pp_step)
            self._pp_apportion()

    def on_test_batch_end(self, batch, logs=None):
        self._pp_batch_end("test", batch, logs)


#: Steps outside the trace windows kept waiting for a measured share of waiting, at most.
_UNSPLIT_MAX = 100_000

#: The names Keras logs a model's accuracy under, the most usual first (``metrics=["accuracy"]``
#: logs ``accuracy``; a metric object its own name, ``sparse_categorical_accuracy``).
_ACCURACY = ("accuracy", "acc", "sparse_categorical_accuracy", "categorical_accuracy", "binary_accuracy")


def _accuracy(logs):
    """The running accuracy in a batch end's logs, or None when the model logs none."""
    for name in _ACCURACY:
        if logs.get(name) is not None:
            return logs[name]
    for name, v in logs.items():
        if name.endswith("_accuracy") and not name.startswith("val_") and "top_k" not in name:
            return v
    return logs.get("compile_metrics")


class _WaitTotal:
    """Nanoseconds the training thread has spent in ``wait`` so far (read by the compute cut)."""

    def __init__(self):
        self.total = 0


_WAIT = _WaitTotal()


def pipeprof_wait_since(before):
    return _WAIT.total - before


def _number(v):
    if v is None:
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def callback(batch_size=None, data=None, keras=None, fit_kwargs=None):
    """A ``keras.callbacks.Callback`` recording wait, compute, validation and step records.
    ``data``: what is passed to ``fit`` (a ``PyDataset`` tells its workers). ``keras``: the
    Keras module the model is from (``keras`` or ``tf_keras``; default: ``keras``)."""
    keras = keras or _keras()
    base = keras.callbacks.Callback
    backend = _backend_of(keras)
    if keras.__name__.split(".")[0] == "keras":
        try:
            wrap_epoch_iterators_once(keras)
        except Exception as e:
            print(f"pipeprof: Keras batch waits are not timed ({e!r})")

    class PipeprofCallback(Hooks, base):
        def __init__(self):
            base.__init__(self)
            self._pp_backend = backend
            self._pp_keras = keras.__name__.split(".")[0]
            self._pp_setup(batch_size, data, in_graph=backend == "tensorflow", fit_kwargs=fit_kwargs)

    return PipeprofCallback()


_WRAPPED = []


def wrap_epoch_iterators_once(keras):
    if _WRAPPED:
        return
    _WRAPPED.append(True)
    mod = importlib.import_module("keras.src.trainers.epoch_iterator")
    wrap_epoch_iterators(mod, keras.backend.backend())
