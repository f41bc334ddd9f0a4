"""TensorFlow's own host trace, read in short sampled windows: the wait for tf.data inside a
compiled step, and tf.data's stages, which Python never sees.

With the TensorFlow backend (Keras 3 or tf_keras) the step function takes its batch inside
the graph (``IteratorGetNext``), so ``fit`` has no Python-side wait to time. TensorFlow's
profiler (xprof's input-pipeline analyser) reads the same thing from its host trace: the
training thread's ``IteratorGetNext`` is the wait, each ``Iterator::…`` event a tf.data
stage. Here a profiler session (``_pywrap_profiler.ProfilerSession``, host tracer only: no
Python tracer, no device tracer) runs for a few steps at a time, every so often, and what it
returns (a ``tensorflow.profiler.Trace``: threads and their events, read by :func:`events`, a
minimal protobuf reader) becomes spans:

* ``wait``: each step's ``IteratorGetNext…`` op (its ``DoCompute``), in time order, one per
  step of the window; the step's ``compute`` span is its interval less that wait;
* tf.data stages by the op or dataset name (:func:`stage_of`): ``read`` (``ReadFile``,
  ``TFRecord``, ``FixedLengthRecord``, ``TextLine``), ``decode`` (``Decode…``), ``resize``
  (``Resize…``, ``Crop…``), ``augment`` (``Random…``, ``Stateless…``), ``collate``
  (``Batch``), ``fetch`` (``TensorSlice``: arrays already in memory; a ``Generator``'s batches are made in
  Python and timed there), each from the outermost such event on a tf.data thread (a
  ``DecodeImage`` around its ``DecodeImageV2Op::PNG`` is one decode). An op whose name says
  none of these (a map function's arithmetic) is not counted as any stage. These spans are
  recorded on a thread named ``tf.data (trace)``, not the training thread.

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
import sys
import threading
import time

import pipeprof
from pipeprof import _native

_now = _native.now_ns

#: Steps traced per window, and the steps between windows' starts. The first window opens at
#: the first step: its wait (the queue filling) and its compile are measured, not guessed,
#: and the run's training clock starts there.
WINDOW_STEPS = int(os.environ.get("PIPEPROF_TF_WINDOW_STEPS", "5"))
EVERY_STEPS = int(os.environ.get("PIPEPROF_TF_EVERY_STEPS", "100"))
FIRST_STEP = int(os.environ.get("PIPEPROF_TF_FIRST_STEP", "0"))

_STAGE_WORDS = (
    ("read", ("ReadFile", "TFRecord", "FixedLengthRecord", "TextLine", "FileIO")),
    ("decode", ("Decode", "decode")),
    # Before resize: a random crop or resized crop is augmentation.
    ("augment", ("Random", "random", "Stateless", "Flip", "flip", "Rotat", "rotat")),
    ("resize", ("Resize", "resize", "Crop", "crop")),
    ("collate", ("BatchV2", "::Batch", "PaddedBatch")),
    # Not "Generator" nor "FromTensor" (from_generator is made of them): a PyDataset's
    # batches are made in Python, where they are timed.
    ("fetch", ("TensorSlice",)),
)


def stage_of(name):
    """The loader stage a tf.data or op event's name stands for, or None."""
    for stage, words in _STAGE_WORDS:
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
    """(thread name, event name, start ns, duration ps) of each event on the host plane of a
    serialized ``XSpace`` (what ``export_to_tb`` writes: planes = 1; a plane's name = 2,
    lines = 3, event_metadata = 4; a line's name = 2, timestamp_ns = 3, events = 4; an event's
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
            lname, ts_ns, evs = "", 0, []
            for lf, v in _fields(line):
                if lf == 2:
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
                yield lname, names.get(mid, ""), ts_ns + off // 1000, dur


def events(trace):
    """(thread name, event name, start ps, duration ps) of each event of a serialized
    ``tensorflow.profiler.Trace`` (devices = 1, their resources = 3, trace_events = 4; an
    event's resource_id = 2, name = 3, timestamp_ps = 9, duration_ps = 10), start from the
    session's start."""
    mv = memoryview(trace)
    threads, raw = {}, []
    for f, v in _fields(mv):
        if f == 1:  # map<uint32, Device> entry
            for kf, dev in _fields(v):
                if kf != 2:
                    continue
                for df, res in _fields(dev):
                    if df != 3:  # map<uint32, Resource> entry
                        continue
                    rid, name = 0, ""
                    for ef, ev in _fields(res):
                        if ef == 1:
                            rid = ev
                        elif ef == 2:
                            for rf, rv in _fields(ev):
                                if rf == 1:
                                    name = _text(rv)
                    threads[rid] = name
        elif f == 4:
            raw.append(v)
    for v in raw:
        rid, name, ts, dur = 0, "", 0, 0
        for ef, ev in _fields(v):
            if ef == 2:
                rid = ev
            elif ef == 3:
                name = _text(ev)
            elif ef == 9:
                ts = ev
            elif ef == 10:
                dur = ev
        yield threads.get(rid, ""), name, ts, dur


def split(evs):
    """From a window's events (thread, name, start ns, duration ps): the waits (start ns,
    duration ps) in time order, and the tf.data stage events (stage, start ns, duration ps),
    outermost per thread, not counting waits."""
    waits, stages, by_thread = [], [], {}
    for thread, name, ts, dur in evs:
        if name.startswith("IteratorGetNext") and name.endswith("DoCompute"):
            waits.append((ts, dur))
        elif thread.startswith("tf_data"):
            stage = stage_of(name)
            if stage is not None:
                by_thread.setdefault(thread, []).append((ts, dur, stage))
    for evs_t in by_thread.values():
        evs_t.sort()
        end = -1
        for ts, dur, stage in evs_t:
            if ts < end:
                continue  # inside an event already counted
            stages.append((stage, ts, dur))
            end = ts + dur // 1000
    waits.sort()
    return waits, stages


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
        self.t0_real = 0
        self._mark = None
        self.wait_ns = self.step_ns = 0  # over the sampled steps

    def wants(self, step):
        # At or after the planned step: with steps_per_execution > 1 step numbers jump.
        return self.off is None and self.session is None and step >= self.next_at

    def open(self, step):
        t0 = _now()
        try:
            from tensorflow.python.profiler.internal import _pywrap_profiler

            session = _pywrap_profiler.ProfilerSession()
            self.t0, self.t0_real = _now(), time.time_ns()
            session.start(self.dump, {"host_tracer_level": 2, "python_tracer_level": 0, "device_tracer_level": 0})
        except Exception as e:  # another profiler running, a TensorFlow without it
            self.off = f"no TensorFlow trace window ({e!r}): the wait for tf.data is unknown"
            print(f"pipeprof: {self.off}", file=sys.stderr)
            return
        self.session, self.opened_at = session, step
        self.next_at = step + self.every
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
        return self.session is not None and step - self.opened_at >= self.steps

    def close(self):
        """Stops the window and records its spans; compute less the step's wait."""
        session, self.session = self.session, None
        if session is None:
            return
        t0 = _now()
        pending, self.pending = self.pending, []
        try:
            if self.dump:
                # The window kept as TensorFlow's profiler writes it (xprof reads the same).
                session.export_to_tb()
                newest = max(glob.glob(os.path.join(self.dump, "plugins", "profile", "*", "*.xplane.pb")), key=os.path.getmtime)
                with open(newest, "rb") as f:
                    evs = list(xspace_events(f.read()))
                # Written relative to the session's start (TensorFlow 2.21), or on the realtime clock.
                shift = self.t0 - self.t0_real if evs and min(e[2] for e in evs) > 10**17 else self.t0
                evs = [(th, n, ts + shift, d) for th, n, ts, d in evs]
            else:
                evs = [(th, n, self.t0 + ts // 1000, d) for th, n, ts, d in events(session.stop())]
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
                _native.record("wait", t, d, step)
                waited += d
            body = max(0, dur - waited)
            _native.record("compute", start + dur - body, body, step)
            window_wait += min(waited, dur)
            window_steps += dur
        self.wait_ns += window_wait
        self.step_ns += window_steps
        if self.dump and pending:
            # Beside the window's XSpace: pipeprof's own figures for the same steps.
            with open(os.path.join(os.path.dirname(newest), "pipeprof.json"), "w") as f:
                json.dump({"steps": len(pending), "wait_ms": window_wait / 1e6, "step_ms": window_steps / 1e6}, f)
        self.windows += 1
        self.sampled += len(pending)
        if stages:
            self._send(stages)
        self.cost_ns += _now() - t0
        self.report()

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
