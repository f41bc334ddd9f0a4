"""At the end of a run whose images came from slow storage: what the program's own loader
work costs fed, against what it cost between the slow reads, sent as the run's ``cold_cpu``
setting.

A loader that waits on every read does its CPU work cold: while it waits, the machine's
other work (the mount's own daemon, other programs) refills its caches, and its core runs an
idle duty cycle. What the run measured is that cold cost; a local copy or a packed file, which
take the waits away, get the fed one. The run cannot show the ratio (every image it timed was
cold), so it is measured here, on the program's own data set and transform:

* a few images of the data set, spread over it, are read from where the program read them,
  timing how long each read was blocked (wall less CPU): on a local disk or the page cache
  that is well under :data:`SLOW_READ_MS`, and nothing more is done;
* each image is decoded as the folder reader does (PIL, RGB) and passed through the data set's
  ``transform`` right after its read: the cold cost (``cold_ms``);
* then all of them back to back, a few rounds, the last ones timed: the fed cost of a copy's
  loader (``fed_ms``);
* and the transform alone, back to back, on each image as ``pipeprof pack`` stores it (at the
  transform's leading ``Resize``, else as decoded): the packed file's loader (``packed_ms``).

Each by the thread's CPU clock, per image. Only for torchvision's folder reader
(``ImageFolder``/``DatasetFolder`` with the default loader) iterated in the run's main
process, in a plain run (never in a ``--check-advice`` re-run), at a clean exit (not after an
exception, nor after ``sys.exit`` with a status other than 0, as a program that caught Ctrl-C
ends; not in a notebook, whose stretch ends before), after the open training step is closed
and before pipeprof's own exit handler sends the run's end. Photos over :data:`LARGE_PIXELS`
are timed on :data:`LARGE_PAIRS` images.

It reads only images the program read: those of the batches its loader drew from the data set
after the first step (the indices the loader's sampler gave, kept in the main process, whose
workers then read them; at most :data:`KEPT`), and decodes them and calls its transform on
them: a random transform draws from generators the program has finished with. The reads stop
at :data:`BUDGET_S` of the exit's time (on a slow drive each is a round trip), with at least
:data:`MIN_PAIRS` images timed or no figure. Anything that fails, Ctrl-C during it included,
leaves the run without the setting (its copy and pack advice then say they are a floor).
"""

from __future__ import annotations

import atexit
import io
import sys
import time

import pipeprof
from pipeprof import _state

#: Images timed (one more is read first, to see whether the storage is slow, and not timed).
PAIRS = 16
#: A read blocked this long or more (ms, the first image's) is slow storage.
SLOW_READ_MS = 1.0
#: Rounds back to back; the last is timed.
ROUNDS = 3
#: An image of more pixels than this is timed on only LARGE_PAIRS images.
LARGE_PIXELS = 4_000_000
LARGE_PAIRS = 4
#: The exit's reads stop after this much wall time (s): the timing is bounded however slow the
#: drive (the figures are CPU clocks; the wall time is the reads' waits).
BUDGET_S = 0.5
#: Fewer images timed than this within the budget: no figure.
MIN_PAIRS = 4
#: Indices of images the program's loader drew that are kept (the first ones after the step
#: that armed the timing).
KEPT = 4096

_SEEN = []
#: Indices the program's loader drew from the data set being timed, in the main process.
_DRAWN = []
#: The status the program asked ``sys.exit`` for, once it did.
_EXIT = []


def remember(ds, close_step=None):
    """Times ``ds`` (a torchvision folder reader) at exit; the first one only, main process,
    plain runs only. ``close_step`` ends the training loop's open step first (the caller's:
    this module imports no hook module). From here on the indices the loader draws from
    ``ds`` are kept (:func:`_keep_drawn`), and the status ``sys.exit`` is asked for."""
    if _SEEN or _state.CHECK.asked is not None or not pipeprof.is_main():
        return
    _SEEN.append((ds, close_step))
    _keep_drawn(ds)
    _keep_exit_status()
    atexit.register(_at_exit)


def _keep_drawn(ds):
    """Keeps in :data:`_DRAWN` the indices of ``ds`` that a DataLoader's iterator draws from its
    sampler (in the main process, with or without workers: the images then read)."""
    try:
        from torch.utils.data import dataloader as dl
    except ImportError:
        return
    Base = dl._BaseDataLoaderIter
    orig = getattr(Base, "_next_index", None)
    if orig is None or getattr(orig, "_pipeprof_cold", False):
        return

    def _next_index(self):
        index = orig(self)
        if len(_DRAWN) < KEPT and _SEEN and getattr(self, "_dataset", None) is _SEEN[0][0]:
            _DRAWN.extend(index if isinstance(index, (list, tuple)) else [index])
        return index

    _next_index._pipeprof_cold = True
    Base._next_index = _next_index


def _keep_exit_status():
    """``sys.exit``, the same, with the status it was asked for kept in :data:`_EXIT` (a program
    that caught Ctrl-C and exits 130, one that failed and exits 1)."""
    orig = sys.exit

    def exit(status=None):
        _EXIT.append(status)
        return orig(status)

    exit.__wrapped__ = orig
    exit.__doc__ = orig.__doc__
    sys.exit = exit


def clean_exit():
    """Whether the program is ending well: no exception left unhandled (Python keeps it as
    ``sys.last_value``), and ``sys.exit`` not asked for a status other than 0."""
    if getattr(sys, "last_value", None) is not None:
        return False
    return not _EXIT or _EXIT[-1] in (None, 0)


def _at_exit():
    # A notebook's stretch put _SEEN back as it found it (empty); a program that ended on an
    # exception, or exited with an error or after Ctrl-C, is not kept waiting.
    if not _SEEN or not clean_exit():
        return
    ds, close_step = _SEEN[0]
    try:
        # The training step still open ends here, not after the timing.
        if close_step is not None:
            close_step()
        figures = measure(ds, drawn=list(_DRAWN))
        if figures is not None:
            pipeprof.settings(cold_cpu=figures)
    except BaseException:
        return


def _picks(samples, n, drawn=None):
    """Up to ``n`` paths spread evenly over ``samples`` (``(path, class)`` pairs), only of the
    indices in ``drawn`` (the images the program read) when given, each once."""
    if drawn is not None:
        seen, kept = set(), []
        for i in drawn:
            if isinstance(i, int) and 0 <= i < len(samples) and i not in seen:
                seen.add(i)
                kept.append(samples[i])
        samples = kept
    step = max(1, len(samples) // max(1, n))
    return [s[0] for s in samples[::step][:n]]


def _read(path):
    """The file's bytes and how long reading them was blocked, ns (wall less CPU)."""
    w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
    with open(path, "rb") as f:
        data = f.read()
    return data, max(0, (time.perf_counter_ns() - w0) - (time.thread_time_ns() - c0))


def _packed(img, transform):
    """``img`` as ``pipeprof pack`` stores it for ``transform``: through its leading ``Resize``
    (the pack's size), else as decoded."""
    from pipeprof.torch import _leading_resize

    if _leading_resize(transform) is None:
        return img
    return transform.transforms[0](img) if type(transform).__name__ == "Compose" else transform(img)


def _per_image_ms(ns, n):
    return round(ns / max(1, n) / 1e6, 4)


def measure(ds, pairs=PAIRS, slow_read_ms=SLOW_READ_MS, rounds=ROUNDS, drawn=None, budget_s=BUDGET_S):
    """``{"after_wait_ms", "images", "cold_ms", "fed_ms", "packed_ms"}`` for ``ds``, or None:
    fewer than two images, reads faster than ``slow_read_ms``, fewer than :data:`MIN_PAIRS`
    read within ``budget_s``, a cost not measured. ``drawn``: the indices the program read
    (None: any image of ``ds``)."""
    from PIL import Image

    samples = getattr(ds, "samples", None)
    if not isinstance(samples, list) or len(samples) < 2:
        return None
    paths = _picks(samples, pairs + 1, drawn)
    if len(paths) < 2:
        return None
    deadline = time.monotonic() + budget_s
    transform = getattr(ds, "transform", None)

    def decode(data):
        return Image.open(io.BytesIO(data)).convert("RGB")

    def work(data):
        img = decode(data)
        return img if transform is None else transform(img)

    first, blocked = _read(paths[0])
    if blocked / 1e6 < slow_read_ms:
        return None
    img = decode(first)
    if img.width * img.height > LARGE_PIXELS:
        # Photos of many megapixels: fewer of them (each decode is tens of ms).
        paths = paths[: LARGE_PAIRS + 1]
    work(first)  # pages the code in: not timed
    read, cold = [], 0
    for path in paths[1:]:
        if time.monotonic() > deadline:
            break
        data, b = _read(path)
        t0 = time.thread_time_ns()
        work(data)
        cold += time.thread_time_ns() - t0
        read.append((data, b))
    if len(read) < min(MIN_PAIRS, len(paths) - 1):
        # The drive is too slow for the exit's budget: no figure rather than a long exit.
        return None
    wait_ms = sum(b for _, b in read) / max(1, len(read)) / 1e6
    if wait_ms < slow_read_ms:
        # The rest came from the page cache: no cold read to compare with.
        return None
    blobs = [d for d, _ in read]
    fed = _back_to_back(work, blobs, rounds)
    packed = None
    if transform is not None:
        stored = [_packed(decode(d), transform) for d in blobs]
        packed = _back_to_back(transform, stored, rounds)
    n = len(blobs)
    if fed <= 0 or cold <= 0:
        return None
    out = {
        "after_wait_ms": round(wait_ms, 3),
        "images": n,
        "cold_ms": _per_image_ms(cold, n),
        "fed_ms": _per_image_ms(fed, n),
    }
    if packed:
        out["packed_ms"] = _per_image_ms(packed, n)
    return out


def _back_to_back(fn, items, rounds):
    """CPU ns of ``fn`` over ``items`` back to back, the last round of ``rounds`` (the first
    ones warm the caches and the core)."""
    spent = 0
    for _ in range(rounds):
        t0 = time.thread_time_ns()
        for x in items:
            fn(x)
        spent = time.thread_time_ns() - t0
    return spent
