"""``with pipeprof.profile() as p: ...``: ``pipeprof run``'s profile of a stretch of code in
this process, with no edit to it; what ``%%pipeprof`` runs a notebook cell in.

Two processes, as in ``pipeprof run``, with the roles the other way round:

* this process (the notebook's kernel) serves the run (``pipeprof._native.init``, the probes
  crate's attach server and its CPU/GPU samplers) and has ``pipeprof run``'s hooks armed for the
  stretch only (:mod:`pipeprof._arming`). Its DataLoader workers, forked or spawned, connect to
  it as a ``pipeprof run`` program's do (the run's address is in their environment);
* a helper process, the real ``pipeprof attach ADDR --once`` command, collects the events,
  diagnoses and writes the summary: the collector, the diagnosis and the text report are the
  command's, not a copy in the extension; it also serves its latest snapshot and verdict on a
  loopback port (``--metrics-listen``), which the live line reads (:mod:`pipeprof._live`).

The helper is in a session of its own: a notebook's interrupt (SIGINT to the kernel's process
group) reaches the cell, not the helper, which sees the run end when the stretch ends. The
stretch's end (normal, an exception, an interrupt) ends the run (``pipeprof.finish``); the
helper then writes the summary and exits, and the report is read from it. An exception marks
the run failed with its text (``pipeprof._native.failed``) and goes on as without pipeprof.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading

from pipeprof import _arming, _live, _native
from pipeprof._report import Report, command

#: The helper has this long to connect, and to finish after the run ended; a hang guard.
HELPER_S = 60.0
#: How long the run waits for its workers' last spans at the end (``pipeprof.finish``'s).
WORKERS_S = 1.0

_LAST = [None]


def last():
    """The report of the last profiled cell or block in this process, or None."""
    return _LAST[0]


class _Helper:
    """The ``pipeprof attach`` process collecting the run, its output read as it comes."""

    def __init__(self, address, summary, trace):
        cmd = command()
        if cmd is None:
            raise RuntimeError(
                "pipeprof: the pipeprof command is not installed with this Python package: "
                "install the wheel (pip install pipeprof) to profile a cell"
            )
        argv = [cmd, "attach", address, "--once", "--summary", summary, "--metrics-listen", "127.0.0.1:0"]
        if trace:
            argv += ["--trace", str(trace)]
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        self.out, self.err = [], []
        self.metrics = None
        self.said = threading.Event()
        self.readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for t in self.readers:
            t.start()

    def _read(self, stream, into):
        for text in stream:
            into.append(text)
            if into is self.err and "metrics on http://" in text:
                self.metrics = text.split("metrics on ", 1)[1].strip()
                self.said.set()
        if into is self.err:
            self.said.set()

    def attached(self):
        """Waits until the helper is attached to the run; raises with its words if it ends first."""
        waited = 0.0
        while not _native.wait_for_clients(1, 0.1):
            waited += 0.1
            if self.proc.poll() is not None or waited > HELPER_S:
                self.kill()
                raise RuntimeError(f"pipeprof: the collector did not attach: {''.join(self.err).strip()}")
        # Its metrics address is said before it attaches.
        self.said.wait(HELPER_S)

    def end(self):
        """The text report, once the helper has written the summary and ended."""
        try:
            code = self.proc.wait(HELPER_S)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError("pipeprof: the collector did not end after the run did") from None
        for t in self.readers:
            t.join()
        if code != 0:
            raise RuntimeError(f"pipeprof: the collector failed: {''.join(self.err).strip()}")
        return "".join(self.out)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _failure(kind, value, tb):
    """The failure's text, as an uncaught exception's under ``pipeprof run`` reads."""
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = ""
    if tb is not None:
        where = f" (in {os.path.basename(tb.tb_frame.f_code.co_filename)}, line {tb.tb_lineno})"
    return f"{kind.__name__}: {value}{where}"


def _cores():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class _Environment:
    """The run's address in this process's environment, for its workers (forked ones read
    it, spawned ones also get ``pipeprof run``'s start-up hook on ``PYTHONPATH``); put back
    as it was after."""

    def __init__(self, address):
        boot = os.path.join(os.path.dirname(os.path.abspath(_arming.__file__)), "_bootstrap")
        path = os.environ.get("PYTHONPATH")
        pid = str(os.getpid())
        wanted = {
            _native.PARENT_ENV: address,
            _native.PARENT_PID_ENV: pid,
            _native.MAIN_PID_ENV: pid,
            "PYTHONPATH": boot + (os.pathsep + path if path else ""),
        }
        self.before = {k: os.environ.get(k) for k in wanted}
        os.environ.update(wanted)

    def restore(self):
        for k, v in self.before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Profile:
    """A profiled stretch of code (see the module's doc); :meth:`report` once it ended.

    ``summary`` / ``trace``: also write the summary JSON / the Chrome trace there (as
    ``pipeprof run --summary/--trace``); ``html``: the HTML report there; ``no_gpu``: leave the
    GPU unsampled; ``program``: the run's name in the report (default: the script's);
    ``live``: the updating line (default: in a notebook, or on a terminal).
    """

    def __init__(self, summary=None, trace=None, no_gpu=False, html=None, program=None, live=None, hz=5.0):
        self.summary_path, self.trace, self.html = summary, trace, html
        self.no_gpu, self.live, self.hz = no_gpu, live, hz
        self.program = program or os.path.basename(sys.argv[0] or "") or "python"
        self.result = None

    def __enter__(self):
        if _native.role() != "off":
            raise RuntimeError(
                "pipeprof: this process is profiled already (pipeprof.init, pipeprof run, or a profile "
                "not ended): one run at a time"
            )
        self._tmp = tempfile.mkdtemp(prefix="pipeprof-profile-")
        self._summary = str(self.summary_path or os.path.join(self._tmp, "summary.json"))
        self._helper = self._env = self._armed = self._line = None
        try:
            settings = json.dumps({"cores": _cores()})
            address = _native.init(self.program, settings, None, True, self.hz, gpu=not self.no_gpu, gpu_tree=True)
            self._helper = _Helper(address, self._summary, self.trace)
            self._helper.attached()
            self._env = _Environment(address)
            self._armed = _arming.Armed()
            self._line = self._start_line()
        except BaseException:
            self._undo()
            raise
        return self

    def _start_line(self):
        if self.live is False or self._helper.metrics is None:
            return None
        shown = _live.sink()
        return None if shown is None else _live.Live(self._helper.metrics, shown)

    def __exit__(self, kind, value, tb):
        interrupted = kind is not None and issubclass(kind, KeyboardInterrupt)
        error = value if kind is not None and not interrupted else None
        try:
            self.result = self._end(error, _failure(kind, value, tb) if error is not None else None, interrupted)
        finally:
            if self._line is not None:
                self._line.close(self.result.summary if self.result is not None else None)
            self._undo()
        _LAST[0] = self.result
        if self.html and not self.result.save_html(self.html):
            print(f"pipeprof: {self.html} not written: this pipeprof command writes no HTML report", file=sys.stderr)
        return False

    def _end(self, error, why, interrupted):
        if self._line is not None:
            self._line.stop()
        self._armed.finish_loop()
        if why is not None:
            _native.failed(why)
        _native.finish(WORKERS_S)
        text = self._helper.end()
        with open(self._summary, encoding="utf-8") as f:
            summary = json.load(f)
        return Report(summary, text, error=error, interrupted=interrupted)

    def _undo(self):
        """Whatever the stretch set up, taken down: on every way out."""
        if self._armed is not None:
            self._armed.disarm()
        if self._env is not None:
            self._env.restore()
        if _native.role() != "off":
            _native.finish(0.0)
        if self._helper is not None:
            self._helper.kill()
        shutil.rmtree(self._tmp, ignore_errors=True)

    def report(self):
        """The run's :class:`~pipeprof._report.Report` (after the ``with`` block)."""
        if self.result is None:
            raise RuntimeError("pipeprof: the profile has not ended yet: call report() after the with block")
        return self.result
