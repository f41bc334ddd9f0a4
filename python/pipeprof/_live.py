"""The one line a profiled cell (or ``with pipeprof.profile():`` block) shows while it runs:
step, images/s and what limits the run now, updated in place at most once a second.

Its numbers are the collector's own: the helper ``pipeprof attach`` serves its latest snapshot
and verdict as OpenMetrics text (``--metrics-listen``, loopback), read here once a second. In
a notebook the line is one output updated through its display id (no output is added per
update); on a terminal it is rewritten with ``\\r``; elsewhere (a log, a pipe) nothing is shown.
"""

from __future__ import annotations

import re
import sys
import threading
import urllib.request

from pipeprof._report import limiter_name

#: Seconds between two updates of the line (and two reads of the helper's metrics).
EVERY_S = 1.0

#: A series: its name, its labels (a quoted value may hold a brace), its value.
_SERIES = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{((?:[^}"]|"(?:[^"\\]|\\.)*")*)\})?\s+(\S+)')
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')

#: The rank label of the whole run's series: a run of one process, or all ranks of several.
_WHOLE_RUN = ("0", "all")


def parse_metrics(text):
    """The whole run's numbers from ``/metrics`` text: ``steps``, ``images_per_second`` and
    ``limiter`` (the label whose ``pipeprof_limiter`` series is 1), each where present."""
    out = {}
    for line in text.splitlines():
        m = _SERIES.match(line)
        if m is None:
            continue
        name, labels, value = m.group(1), dict(_LABEL.findall(m.group(2) or "")), m.group(3)
        if labels.get("rank", "0") not in _WHOLE_RUN:
            continue
        try:
            v = float(value)
        except ValueError:
            continue
        if name == "pipeprof_steps_total":
            out["steps"] = int(v)
        elif name == "pipeprof_images_per_second":
            out["images_per_second"] = v
        elif name == "pipeprof_limiter" and v == 1.0 and "limiter" in labels:
            out["limiter"] = labels["limiter"]
    return out


def _snake(name):
    """``NotEnoughData`` → ``not_enough_data``: the summary's names as the metrics' labels."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def line(numbers):
    """The line's text for :func:`parse_metrics`'s numbers."""
    limiter = numbers.get("limiter", "not_enough_data").replace("_", " ")
    return (
        f"pipeprof: step {numbers.get('steps', 0)} · {numbers.get('images_per_second', 0.0):.1f} images/s"
        f" · limited by: {limiter}"
    )


class _Console:
    """The line on a terminal: rewritten in place with ``\\r``."""

    def __init__(self, stream):
        self.stream, self.width = stream, 0

    def show(self, text):
        self.width = max(self.width, len(text))
        self.stream.write("\r" + text.ljust(self.width))
        self.stream.flush()

    def close(self):
        if self.width:
            self.stream.write("\n")
            self.stream.flush()


class _Notebook:
    """The line in a notebook: one output, updated through its display id."""

    def __init__(self):
        from IPython.display import display

        self.handle = display({"text/plain": "pipeprof: starting"}, raw=True, display_id=True)

    def show(self, text):
        self.handle.update({"text/plain": text}, raw=True)

    def close(self):
        pass


def sink():
    """Where the line goes here: a notebook's output, a terminal, or nowhere (None)."""
    shell = sys.modules.get("IPython") and _kernel_shell()
    if shell:
        return _Notebook()
    stream = sys.stderr
    if stream is not None and hasattr(stream, "isatty") and stream.isatty():
        return _Console(stream)
    return None


def _kernel_shell():
    """Whether this is a Jupyter kernel (whose outputs a display id can update)."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except Exception:
        return False
    return shell is not None and getattr(shell, "kernel", None) is not None


class Live:
    """Reads ``url`` and shows the line every :data:`EVERY_S` until :meth:`stop`."""

    def __init__(self, url, shown):
        self.url, self.shown = url, shown
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="pipeprof-live", daemon=True)
        self.thread.start()

    def _read(self):
        try:
            with urllib.request.urlopen(self.url, timeout=EVERY_S) as r:
                return parse_metrics(r.read().decode("utf-8", "replace"))
        except (OSError, ValueError):
            return None  # the helper between two snapshots, or gone: the next read tells

    def _run(self):
        while not self.stopped.wait(EVERY_S):
            numbers = self._read()
            if numbers is not None and not self.stopped.is_set():
                try:
                    self.shown.show(line(numbers))
                except Exception:
                    return  # an output that cannot be updated: the line stays as it was

    def stop(self):
        """Stops updating (the helper's metrics end with the run)."""
        self.stopped.set()
        self.thread.join()

    def close(self, summary=None):
        """The line's last text, from the run's ``summary`` when there is one."""
        try:
            if summary is not None:
                numbers = {
                    "steps": summary.get("steps") or 0,
                    "images_per_second": summary.get("images_per_s") or 0.0,
                    "limiter": _snake(limiter_name(summary.get("verdict")) or "NotEnoughData"),
                }
                self.shown.show(line(numbers) + " (the run's report follows)")
            self.shown.close()
        except Exception:
            pass
