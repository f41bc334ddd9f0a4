"""What a profiled cell (or ``with pipeprof.profile():`` block) gives back: the run's summary
with its verdict, shown as the HTML report in a notebook and as the text report elsewhere.

Both renderings are the ``pipeprof`` command's (``pipeprof report``): nothing is laid out here
but the fallback below, the text report in a ``<pre>``, for a command that writes no HTML.
"""

from __future__ import annotations

import html
import json
import os
import subprocess
import tempfile


def command():
    """The ``pipeprof`` command the wheel installed beside this Python (``python -m pipeprof``
    finds it the same way), or None."""
    from pipeprof.__main__ import _command

    return _command()


#: Said above the report of a run an interrupt stopped.
INTERRUPTED = "pipeprof: interrupted: the report covers what ran"


def limiter_name(verdict):
    """The limiter's name in a summary's verdict (a variant with data, ``{"NotEnoughData":
    {...}}``, is its name), or None."""
    limiter = (verdict or {}).get("limiter")
    if isinstance(limiter, dict):
        return next(iter(limiter), None)
    return limiter


class Report:
    """One profiled run.

    ``summary``: the summary JSON as a dict (what ``--summary`` writes, ``pipeprof report``
    reads); ``verdict``: its verdict (limiter, headline, evidence, advice) or None when the run
    was too short to judge; ``advice``: the verdict's advice, each with its predicted gain;
    ``text``: the plain-text report, ``pipeprof report``'s; ``error``: the exception that
    ended the run (re-raised after the report), else None; ``interrupted``: the run was
    stopped by an interrupt (the report covers what ran).
    """

    def __init__(self, summary, text, error=None, interrupted=False):
        self.summary = summary
        self.text = text
        self.error = error
        self.interrupted = interrupted
        self._html = None

    @property
    def verdict(self):
        return self.summary.get("verdict")

    @property
    def advice(self):
        return list((self.verdict or {}).get("advice") or [])

    @property
    def limiter(self):
        """The verdict's limiter (``"Preprocess"``, ``"Overhead"``, ``"NotEnoughData"``…),
        or None."""
        return limiter_name(self.verdict)

    def __repr__(self):
        return (INTERRUPTED + "\n" if self.interrupted else "") + self.text

    def _repr_html_(self):
        if self._html is None:
            said = f"<p><b>{html.escape(INTERRUPTED)}</b></p>" if self.interrupted else ""
            self._html = said + _inline(self.summary, self.text)
        return self._html

    def save_html(self, path):
        """Writes the report as one self-contained HTML file (``pipeprof report --html``);
        returns whether the command could (an older one writes no HTML)."""
        return _write_html(self.summary, path) is None


def _report(summary, *options):
    """``pipeprof report SUMMARY OPTIONS``: (its stdout, None), or (None, why not)."""
    cmd = command()
    if cmd is None:
        return None, "the pipeprof command is not installed with this package"
    with tempfile.TemporaryDirectory(prefix="pipeprof-report-") as tmp:
        src = os.path.join(tmp, "summary.json")
        with open(src, "w") as f:
            json.dump(summary, f)
        p = subprocess.run([cmd, "report", src, *map(str, options)], capture_output=True, text=True)
    if p.returncode != 0:
        return None, p.stderr.strip() or f"pipeprof report exited with {p.returncode}"
    return p.stdout, None


def _write_html(summary, path):
    """``pipeprof report SUMMARY --html PATH``: None when written, else why not."""
    return _report(summary, "--html", path)[1]


def _inline(summary, text):
    """The report for a notebook's output: the command's HTML fragment (one element carrying
    its own style); from a command without one, its HTML page in a frame of its own (the page's
    styles stay inside), or the text report in a ``<pre>`` where it writes no HTML at all."""
    fragment, _ = _report(summary, "--html-fragment", "-")
    if fragment is not None:
        return fragment
    with tempfile.TemporaryDirectory(prefix="pipeprof-report-") as tmp:
        out = os.path.join(tmp, "report.html")
        if _write_html(summary, out) is None:
            with open(out, encoding="utf-8") as f:
                page = f.read()
            return (
                '<iframe style="width:100%;height:900px;border:0" sandbox="" srcdoc="'
                + html.escape(page, quote=True)
                + '"></iframe>'
            )
    return f'<pre class="pipeprof-report">{html.escape(text)}</pre>'
