"""TensorFlow's own host trace, read in short sampled windows: the wait for tf.data inside a
compiled step, and tf.data's stages, which Python never sees.

With the TensorFlow backend (Keras 3 or tf_keras) the step function takes its batch inside
the graph (``IteratorGetNext``), so ``fit`` has no Python-side wait to time. TensorFlow's
profiler (xprof's input-pipeline analyser) reads the same thing from its host trace: the
training thread's ``IteratorGetNext`` is the wait, each ``Iterator::…`` event a tf.data
stage. Here a profiler session (``_pywrap_profiler.ProfilerSession``, host tracer only: no
Python tracer, no device tracer) runs for a few steps at a time, every so often, and the
``XSpace`` it writes (threads and their events, read by :func:`xspace_events`, a minimal
protobuf reader; its op events are named ``scope/node:Type``) becomes spans:

* ``wait``: each step's ``IteratorGetNext…`` op (its ``DoCompute``), in time order, one per
  step of the window; the step's ``compute`` span is its interval less that wait;
* the loader's stages, from the events on tf.data's threads (and inside an ``Iterator::``
  event on any other), each event's *self* time (its duration less the events inside it) to
  the stage of its nearest named event, as xprof's input-pipeline analyser counts each
  iterator's self time (:func:`split`). Named (:func:`stage_of`) are:

  - a function's run (``ExecutorState::Process``: a ``map``'s function, the loader
    ``image_dataset_from_directory`` maps over its files): ``transform``, its own work. A map's
    iterator (``Iterator::…::ParallelMapV2``, ``…::Map``, ``…::MapAndBatch``) is not: on the
    consumer's side it is the wait for those runs, which tf.data's threadpool does;
  - ops inside it by their name or scope: ``read`` (``ReadFile``), ``decode`` (``Decode…``,
    ``ParseExample``), ``augment`` (``random…``, ``Stateless…``, flips, Keras's random layers,
    ``ImageProjectiveTransform``, ``adjust_…``), ``resize`` (``Resize…``, ``…crop``: Keras's
    ``Resizing`` and ``CenterCrop``), ``convert`` (what is named a conversion: Keras's
    ``Rescaling`` and ``Normalization`` layers, ``convert_image_dtype``,
    ``per_image_standardization``). A bare ``Cast``, ``Mul`` or ``truediv`` says nothing of
    what it is for: it is the function's own arithmetic, ``transform``, as is a blur;
  - iterators by their own name: ``read`` (``TFRecord``, ``FixedLengthRecord``, ``TextLine``),
    ``collate`` (``Batch…``), ``fetch`` (``TensorSlice``: arrays already in memory);
  - ops that run Python (``PyFunc``, ``EagerPyFunc``: a ``Generator``'s or PyDataset's
    batches, ``tf.py_function``) and all inside them are no stage: timed in Python where
    pipeprof sees it.

  An event inside one of its own stage adds to it (a ``DecodeImage`` around its
  ``DecodeImageV2Op::PNG`` is one decode). These spans are recorded on a thread named
  ``tf.data (trace)``, not the training thread.

Each window's cost is measured (the session's start and stop, and the parse, on the training
thread) and sent as the run's ``tf_trace`` settings: windows taken, steps covered, and the
milliseconds they cost. A step outside the windows has no wait span: the split is known for
the sampled steps only, and a run with no window says nothing of it (never "compute").
"""

from __future__ import annotations

import glob
import json
import os
import queue
import shutil
import sys
import tempfile
import threading
import time

import pipeprof
from pipeprof import _native

_now = _native.now_ns

#: Steps traced per window, and the steps between windows' starts. The first window opens at
#: the first step: its wait (the queue filling) and its compile are measured, not guessed,
#: and the run's training clock starts there. Its other steps take batches the compile gave
#: tf.data time to make ahead (a heavy map keeps up there, and nowhere after), so the next
#: windows come early: ``2 × WINDOW_STEPS`` steps after the first, then twice as far each
#: time, up to ``EVERY_STEPS`` (steps 0, 10, 30, 70, 150, 250, …): a short run is sampled
#: past its start-up, a long one every ``EVERY_STEPS`` steps as before.
WINDOW_STEPS = int(os.environ.get("PIPEPROF_TF_WINDOW_STEPS", "5"))
EVERY_STEPS = int(os.environ.get("PIPEPROF_TF_EVERY_STEPS", "100"))
FIRST_STEP = int(os.environ.get("PIPEPROF_TF_FIRST_STEP", "0"))

#: Op and scope words, first match wins: matched against an op's full name in the XSpace
#: (``scope/node:Type``, so a Keras layer's ops carry the layer's name: ``random_flip/SelectV2:
#: SelectV2``, ``rescaling/mul:Mul``) or its type alone (the Trace proto's names).
_OP_WORDS = (
    ("read", ("ReadFile", "FileIO")),
    ("decode", ("Decode", "decode", "ParseExample", "ParseSingleExample", "ParseSequenceExample")),
    # Before resize: a random crop or resized crop is augmentation. The ops only image
    # augmentation uses count whatever their scope (a flip is a ReverseV2, Keras's random
    # rotation, zoom, translation and shear an ImageProjectiveTransform).
    ("augment", ("Random", "random", "Stateless", "Flip", "flip", "Rotat", "rotat", "ReverseV2", "ImageProjectiveTransform", "Adjust", "adjust_")),
    ("resize", ("Resize", "resize", "Crop", "crop")),
    # Only what is named a conversion (Keras's Rescaling and Normalization layers,
    # tf.image.convert_image_dtype and per_image_standardization): a bare Cast, Mul or
    # truediv is the map function's own arithmetic, ``transform``.
    ("convert", ("rescaling", "normalization", "convert_image", "per_image_standardization")),
)

#: tf.data iterators by their own name (the last of ``Iterator::Root::…::BatchV2``). A map's
#: iterator is none of these: on the consumer's side it is the wait for the function's results,
#: which run elsewhere as ``ExecutorState::Process`` (see :func:`split`).
_ITERATORS = {
    "TFRecord": "read",
    "FixedLengthRecord": "read",
    "FixedLengthRecordV2": "read",
    "TextLine": "read",
    "Batch": "collate",
    "BatchV2": "collate",
    "PaddedBatch": "collate",
    "PaddedBatchV2": "collate",
    "ParallelBatch": "collate",
    # Not "Generator" nor "FromTensor" (from_generator is made of them): a PyDataset's
    # batches are made in Python, where they are timed.
    "TensorSlice": "fetch",
}

#: One run of a function by tf.data's executor (a map's function, the loader
#: image_dataset_from_directory maps over the files): its work less the named ops inside.
FUNCTION = "ExecutorState::Process"

#: Ops that run Python (a PyDataset's or generator's batches, ``tf.py_function``): what they
#: do is timed in Python where pipeprof sees it, so neither they nor anything inside them
#: counts from the trace.
_PYTHON_OPS = ("PyFunc", "EagerPyFunc", "NumpyFunction")
_PYTHON = "python"


def _iterator(name):
    """``Iterator::Root::Prefetch::ForeverRepeat[0]::BatchV2`` → ``BatchV2``."""
    last = name.rsplit("::", 1)[-1]
    return last.split("[", 1)[0]


def _is_op(name):
    """An op's event in the XSpace (``node:Type``), not one of tf.data's or the executor's own
    (``Iterator::…``, ``ExecutorState::Process``, ``PrefetchProduce``, ``MemoryAllocation``)."""
    return ":" in name and "::" not in name


def stage_of(name):
    """The loader stage a tf.data event's name stands for (an op, an iterator, a function's
    run), or None: a map function's run is ``transform``, an op inside it keeps its own stage."""
    label = _label(name)
    return None if label == _PYTHON else label


def _label(name):
    if name == FUNCTION:
        return "transform"
    if name.startswith("Iterator::"):
        return _ITERATORS.get(_iterator(name))
    if name.rsplit(":", 1)[-1] in _PYTHON_OPS:
        return _PYTHON
    for stage, words in _OP_WORDS:
        if any(w in name for w in words):
            return stage
    return None


# ---------------------------------------------------------------- a minimal Trace reader


def _varint(b, i):
    shift = result = 0
    while True:
        c = b[i]
        i += 1
        result |= (c & 0x7F) << shift
        if c < 0x80:
            return result, i
        shift += 7


def _fields(b):
    """(field number, value) of a protobuf message: ints for varints, memoryviews for
    length-delimited and fixed-size fields."""
    i, n = 0, len(b)
    while i < n:
        key, i = _varint(b, i)
        f, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(b, i)
            yield f, v
        elif wt == 2:
            ln, i = _varint(b, i)
            if i + ln > n:
                raise ValueError(f"trace: field {f} runs past the end ({i + ln} > {n})")
            yield f, b[i : i + ln]
            i += ln
        elif wt == 1:
            yield f, b[i : i + 8]
            i += 8
        elif wt == 5:
            yield f, b[i : i + 4]
            i += 4
        else:
            raise ValueError(f"trace: wire type {wt} at byte {i}")


def _text(b):
    return bytes(b).decode("utf-8", "replace")


def xspace_events(space):
    """(thread, event name, start ns, duration ps) of each event on the host plane of a
    serialized ``XSpace`` (what ``export_to_tb`` writes: planes = 1; a plane's name = 2,
    lines = 3, event_metadata = 4; a line's id = 1, name = 2, timestamp_ns = 3, events = 4;
    the thread is ``name/id``: tf.data's threads share a name; an event's
    metadata_id = 1, offset_ps = 2, duration_ps = 3), start as written (from the session's
    start, or on the realtime clock)."""
    for f, plane in _fields(memoryview(space)):
        if f != 1:
            continue
        pname, names, lines = "", {}, []
        for pf, v in _fields(plane):
            if pf == 2:
                pname = _text(v)
            elif pf == 3:
                lines.append(v)
            elif pf == 4:
                key, meta = 0, b""
                for ef, ev in _fields(v):
                    if ef == 1:
                        key = ev
                    elif ef == 2:
                        meta = ev
                for mf, mv in _fields(meta):
                    if mf == 2:
                        names[key] = _text(mv)
        if pname != "/host:CPU":
            continue
        for line in lines:
            lid, lname, ts_ns, evs = 0, "", 0, []
            for lf, v in _fields(line):
                if lf == 1:
                    lid = v
                elif lf == 2:
                    lname = _text(v)
                elif lf == 3:
                    ts_ns = v
                elif lf == 4:
                    evs.append(v)
            for ev in evs:
                mid = off = dur = 0
                for xf, v in _fields(ev):
                    if xf == 1:
                        mid = v
                    elif xf == 2:
                        off = v
                    elif xf == 3:
                        dur = v
                yield f"{lname}/{lid}", names.get(mid, ""), ts_ns + off // 1000, dur


def _xplane_pb2():
    """TensorFlow's own XSpace message class (compiled: many times faster than
    :func:`xspace_events` on a window of a busy tf.data pipeline), or None."""
    try:
        from tensorflow.tsl.profiler.protobuf import xplane_pb2

        return xplane_pb2
    except Exception:
        return None


def host_events(space):
    """:func:`xspace_events`, read with TensorFlow's compiled XSpace class where it has one
    and it reads the window."""
    pb = _xplane_pb2()
    try:
        x = pb.XSpace.FromString(space) if pb is not None else None
    except Exception:
        # Its strict reading refuses what TensorFlow writes at times (a name that is not
        # UTF-8): the minimal reader replaces such bytes.
        x = None
    if x is None:
        yield from xspace_events(space)
        return
    for plane in x.planes:
        if plane.name != "/host:CPU":
            continue
        names = {k: m.name for k, m in plane.event_metadata.items()}
        for line in plane.lines:
            thread, ts_ns = f"{line.name}/{line.id}", line.timestamp_ns
            for ev in line.events:
                yield thread, names.get(ev.metadata_id, ""), ts_ns + ev.offset_ps // 1000, ev.duration_ps


def split(evs):
    """From a window's events (thread, name, start ns, duration ps): the waits (start ns,
    duration ps) in time order, and the loader's stage spans (stage, start ns, duration ps)
    in time order, by :func:`_thread_spans` on each thread."""
    waits, by_thread = [], {}
    for thread, name, ts, dur in evs:
        if name.startswith("IteratorGetNext") and name.endswith("DoCompute"):
            waits.append((ts, dur))
        by_thread.setdefault(thread, []).append((ts, -dur, name))
    stages = []
    for thread, evs_t in by_thread.items():
        evs_t.sort()
        stages.extend(_thread_spans(thread.startswith("tf_data"), evs_t))
    waits.sort()
    stages.sort(key=lambda s: s[1])
    return waits, stages


def _thread_spans(loader, evs):
    """One thread's events (start ns, -duration ps, name), in that order, nest (a thread's
    trace events do): each event's self time (its duration less its children's) goes to its
    nearest labelled ancestor-or-self, its *owner*, and each owner is one span of its stage,
    as xprof's input-pipeline analyser counts each iterator's self time. An event is labelled
    only on the loader's side (a tf.data thread, or inside an ``Iterator::`` event: not the
    training step's own functions). One span per stage per outermost event (a function's run:
    its ``random_flip`` ops are one augment span, a ``DecodeImage`` around its
    ``DecodeImageV2Op::PNG`` one decode), so a span is one run's work: one element's for a map
    before ``batch``, one batch's for a map after it. Python ops and all under them are no
    span (timed in Python)."""
    owners = []  # [stage, start ns, self ps]
    stack = []  # (end ps, owner index or None, on the loader's side)
    index, root = {}, 0  # (outermost event, stage) -> owner
    for ts, neg, name in evs:
        start, dur = ts * 1000, -neg
        while stack and stack[-1][0] <= start:
            stack.pop()
        if not stack:
            root += 1
        end = start + dur
        parent_owner, inside = (stack[-1][1], stack[-1][2]) if stack else (None, False)
        if stack:
            end = min(end, stack[-1][0])  # clipped: a child ends with its parent
        side = loader or inside or name.startswith("Iterator::")
        owner = parent_owner
        label = _label(name) if side else None
        if label is None and parent_owner is None and loader and _is_op(name):
            # An op whose function's run the window cut (it began before the window or ended
            # after it): still that function's work.
            label = "transform"
        above = owners[parent_owner][0] if parent_owner is not None else None
        if label is not None and above != _PYTHON and label != above:
            owner = index.get((root, label))
            if owner is None:
                owners.append([label, ts, 0])
                owner = index[(root, label)] = len(owners) - 1
        if owner != parent_owner:
            owners[owner][2] += end - start
            if parent_owner is not None:
                owners[parent_owner][2] -= end - start
        stack.append((end, owner, side))
    return [(stage, ts, ps) for stage, ts, ps in owners if stage != _PYTHON and ps > 0]


# ---------------------------------------------------------------- the windows


class Sampler:
    """Opens a host-trace window every ``every`` steps for ``steps`` steps, on the training
    thread (Keras calls the TensorFlow backend's batch hooks there), and turns what it saw into
    spans. The Keras callback hands it each training step's compute while a window is open."""

    def __init__(self, steps=WINDOW_STEPS, every=EVERY_STEPS, first=FIRST_STEP):
        self.steps, self.every, self.first = max(1, steps), max(1, every), max(0, first)
        self.session = None
        self.next_at = self.first
        self.t0 = 0
        self.opened_at = None
        self.pending = []  # (step, start ns, duration ns) of compute in the open window
        self.windows = 0
        self.sampled = 0
        self.cost_ns = 0
        self.off = None  # why no window can be taken
        self._thread = None
        # PIPEPROF_TF_XSPACE_DIR: each window also written where TensorBoard's profile plugin
        # (xprof) reads it, to compare its input analysis with pipeprof's on the same steps.
        self.dump = os.environ.get("PIPEPROF_TF_XSPACE_DIR", "")
        self.logdir = self.dump
        self.t0_real = 0
        self._mark = None
        self.wait_ns = self.step_ns = 0  # over the sampled steps
        # The same less the run's first step (the compile and the queue filling): the share
        # of waiting that apportions the steps outside the windows.
        self.startup_step = None
        self.steady_wait_ns = self.steady_step_ns = 0
        # Steps the current window's group still has to cover: a window an epoch's end cut
        # short goes on at the next step (an epoch of one step has a window of one).
        self.left = 0
        self.group_at = 0
        self.gap = 2 * self.steps  # to the next group's start; doubles up to ``every``
        self.group_next = self.first

    def wants(self, step):
        # At or after the planned step: with steps_per_execution > 1 step numbers jump.
        return self.off is None and self.session is None and step >= self.next_at

    def open(self, step):
        t0 = _now()
        try:
            from tensorflow.python.profiler.internal import _pywrap_profiler

            session = _pywrap_profiler.ProfilerSession()
            # The window is read from the XSpace TensorFlow writes (its op events carry their
            # scopes: a Keras layer's name); a folder of pipeprof's own unless kept for xprof.
            self.logdir = self.dump or tempfile.mkdtemp(prefix="pipeprof-tf-")
            self.t0, self.t0_real = _now(), time.time_ns()
            session.start(self.logdir, {"host_tracer_level": 2, "python_tracer_level": 0, "device_tracer_level": 0})
        except Exception as e:  # another profiler running, a TensorFlow without it
            self.off = f"no TensorFlow trace window ({e!r}): the wait for tf.data is unknown"
            print(f"pipeprof: {self.off}", file=sys.stderr)
            return
        self.session, self.opened_at = session, step
        if self.left <= 0:
            self.left, self.group_at = self.steps, step
            self.group_next = self.group_at + min(self.every, self.gap)
            self.gap *= 2
        self.next_at = self.group_next
        self.cost_ns += _now() - t0

    def step_begin(self, step, marks):
        """With the windows kept for xprof, marks the step in the trace as tf.keras 2 does
        (``marks``: Keras 3, which marks none): xprof finds no step without them."""
        if self.session is None or not self.dump or not marks:
            return
        try:
            import tensorflow as tf

            self._mark = tf.profiler.experimental.Trace("train", step_num=step, _r=1)
            self._mark.__enter__()
        except Exception:
            self._mark = None

    def step_end(self):
        mark, self._mark = self._mark, None
        if mark is not None:
            mark.__exit__(None, None, None)

    def is_open(self):
        return self.session is not None

    def full(self, step):
        """Whether the window has seen its steps, at the start of ``step``."""
        return self.session is not None and step - self.opened_at >= self.left

    def share(self):
        """The share of their time the sampled steps (the run's first left out) waited for
        data, or None before a window measured one."""
        return self.steady_wait_ns / self.steady_step_ns if self.steady_step_ns else None

    def close(self, upto=None):
        """Stops the window and records its spans; compute less the step's wait. ``upto``: the
        first step after the window (with ``steps_per_execution`` a call runs several)."""
        session, self.session = self.session, None
        if session is None:
            return
        t0 = _now()
        pending, self.pending = self.pending, []
        try:
            newest, evs = self._window_events(session)
            waits, stages = split(evs)
        except Exception as e:
            self.off = f"TensorFlow's trace could not be read ({e!r}): the wait for tf.data is unknown"
            print(f"pipeprof: {self.off}", file=sys.stderr)
            for step, start, dur in pending:
                _native.record("compute", start, dur, step)
            return
        # A step's wait is the first IteratorGetNext after its start (steps_per_execution > 1
        # runs several: they add up).
        pending.sort()
        by_step = {}
        for t, dur in waits:
            owner = None
            for step, start, _ in pending:
                if start <= t:
                    owner = step
            if owner is not None:
                by_step.setdefault(owner, []).append((t, dur // 1000))
        window_wait = window_steps = 0
        for step, start, dur in pending:
            waited = 0
            for t, d in by_step.get(step, []):
                # The run's first step traces and compiles its function before it asks for its
                # batch: its wait (the queue filling, beside the compile) is put at the step's
                # start, where the run's training clock starts, so the clock holds the compile
                # that the rate leaves out as a one-off (else it was left out twice).
                _native.record("wait", min(t, start + waited) if step == self.startup_step else t, d, step)
                waited += d
            body = max(0, dur - waited)
            _native.record("compute", start + dur - body, body, step)
            window_wait += min(waited, dur)
            window_steps += dur
            if step != self.startup_step:
                self.steady_wait_ns += min(waited, dur)
                self.steady_step_ns += dur
        self.wait_ns += window_wait
        self.step_ns += window_steps
        if self.dump and pending and newest is not None:
            # Beside the window's XSpace: pipeprof's own figures for the same steps.
            with open(os.path.join(os.path.dirname(newest), "pipeprof.json"), "w") as f:
                json.dump({"steps": len(pending), "wait_ms": window_wait / 1e6, "step_ms": window_steps / 1e6}, f)
        self.windows += 1
        self.sampled += len(pending)
        if pending:
            # Cut short (an epoch ended, a validation pass began): the rest from the next step.
            upto = pending[-1][0] + 1 if upto is None else upto
            self.left -= upto - self.opened_at
            if self.left > 0:
                self.next_at = upto
        if stages:
            self._send(stages)
        self.cost_ns += _now() - t0
        self.report()

    def _window_events(self, session):
        """Stops the window: the XSpace file TensorFlow wrote (None when it wrote none) and its
        host events, on pipeprof's clock. pipeprof's own folder goes once read. (The bytes
        ``stop()`` returns are not that file: tf.data's and the ops' events are not in them.)"""
        newest, space = None, b""
        try:
            session.export_to_tb()
            found = glob.glob(os.path.join(self.logdir, "plugins", "profile", "*", "*.xplane.pb"))
            newest = max(found, key=os.path.getmtime) if found else None
            if newest is not None:
                with open(newest, "rb") as f:
                    space = f.read()
        finally:
            if not self.dump:
                shutil.rmtree(self.logdir, ignore_errors=True)
        evs = list(host_events(space)) if space else []
        # Written relative to the session's start (TensorFlow 2.21), or on the realtime clock.
        shift = self.t0 - self.t0_real if evs and min(e[2] for e in evs) > 10**17 else self.t0
        return newest, [(th, n, ts + shift, d) for th, n, ts, d in evs]

    def _send(self, stages):
        """Records the window's tf.data spans on one thread of their own (not the training
        thread's: they ran in tf.data's), the same thread for every window."""
        if self._thread is None:
            self._jobs = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._sender, name="tf.data (trace)", daemon=True)
            self._thread.start()
        done = threading.Event()
        self._jobs.put((stages, done))
        done.wait()

    def _sender(self):
        pipeprof.name_thread("tf.data (trace)")
        while True:
            stages, done = self._jobs.get()
            try:
                for stage, ts, dur in stages:
                    _native.record(stage, ts, dur // 1000, None)
                pipeprof.flush()
            finally:
                done.set()

    def report(self):
        pipeprof.settings(tf_trace={"windows": self.windows, "sampled_steps": self.sampled, "cost_ms": self.cost_ns / 1e6})

    def summary(self):
        """One line for the end of fit: what the windows covered and cost."""
        if self.off is not None:
            return f"pipeprof: {self.off}"
        if not self.windows:
            return "pipeprof: no TensorFlow trace window was taken (the run ended first): the wait for tf.data is unknown"
        share = 100 * self.wait_ns / self.step_ns if self.step_ns else 0.0
        return (
            f"pipeprof: TensorFlow trace: {self.windows} window(s), {self.sampled} steps sampled "
            f"(waiting for data {share:.1f}% of their time), "
            f"{self.cost_ns / 1e6:.1f} ms spent opening, stopping and reading them"
        )
