"""pipeprof for Python: let ``pipeprof attach`` watch your training loop live.

Three calls, like the Rust probes crate::

    import pipeprof
    pipeprof.init(program="train", settings={"batch_size": 32, "workers": 4})
    with pipeprof.span("decode", sample=i):      # also @pipeprof.span("decode")
        ...
    pipeprof.step(step=k, epoch=e, images=32, loss=0.7, correct=20)

Spans are timed by the probes crate's tracing Layer (thread CPU time included for the
loader stages and ``transfer``) and served by its attach server. Worker processes, forked
or spawned (``multiprocessing``, PyTorch ``DataLoader`` workers), send their spans to the
parent's server on their own: nothing to call in the worker.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import sys
import threading

from . import _native
from ._native import Span, dropped, flush, now_ns, stages

__all__ = [
    "init",
    "span",
    "step",
    "settings",
    "failed",
    "is_main",
    "fail_on_uncaught_exception",
    "finish",
    "flush",
    "now_ns",
    "name_process",
    "name_thread",
    "address",
    "role",
    "clients",
    "workers",
    "wait_for_clients",
    "dropped",
    "stages",
    "STAGES",
    "profile",
    "last",
]

# The environment names are the extension's (declared once, in the probes crate's `env`).
#: The parent's attach address, inherited by worker processes.
ADDRESS_ENV = _native.PARENT_ENV
# The token a TCP run's viewers and workers must send (set by the run itself).
TOKEN_ENV = _native.TOKEN_ENV
#: The parent's pid: a process with the address but another pid is a worker.
PARENT_PID_ENV = _native.PARENT_PID_ENV
#: Under ``pipeprof run``: the pid of the run's first Python process (its main program).
MAIN_PID_ENV = _native.MAIN_PID_ENV
#: In a distributed run (``torchrun``): ``RANK:pid`` of this rank's first Python process, the
#: rank's program; its DataLoader workers inherit it and are its workers.
RANK_MAIN_ENV = _native.RANK_MAIN_ENV

#: Stage names a span may have, in pipeline order.
STAGES = tuple(stages())

#: ``span("decode", sample=i)``: a context manager, and a decorator when called on a function.
span = Span

_process_name = None


def _c_getenv(name):
    """The C environment's value (what the native module set), which os.environ does not see."""
    import ctypes

    getenv = ctypes.CDLL(None).getenv
    getenv.restype = ctypes.c_char_p
    value = getenv(name.encode())
    return value.decode() if value else None


def init(program=None, settings=None, *, listen=None, sample=True, hz=5.0):
    """Starts serving ``pipeprof attach`` from this process; returns the address.

    ``settings`` is shown by the viewer (keys it knows: ``model``, ``data``, ``images``,
    ``workers``, ``batch_size``, ``device``, ``cores``, ``input``). ``listen="127.0.0.1:7070"``
    serves TCP instead of a Unix socket. ``sample=False`` turns the host/GPU samplers off.

    In a worker process of an instrumented run this does nothing and returns None: the
    worker already sends to its parent.
    """
    if _worker_of_a_run():
        _connect_worker()
        return None
    if program is None:
        program = os.path.basename(sys.argv[0] or "") or "python"
    text = json.dumps(settings or {}, default=str)
    addr = _native.init(program, text, listen, sample, hz)
    # Over TCP the run's token was put in the C environment for worker processes; copy it
    # into os.environ too, which a `subprocess` given `env=dict(os.environ)` reads.
    token = _c_getenv(TOKEN_ENV)
    if token:
        os.environ[TOKEN_ENV] = token
    os.environ[ADDRESS_ENV] = addr
    os.environ[PARENT_PID_ENV] = str(os.getpid())
    os.environ[MAIN_PID_ENV] = str(os.getpid())
    atexit.register(finish)
    fail_on_uncaught_exception()
    return addr


def profile(summary=None, *, trace=None, no_gpu=False, html=None, program=None, live=None):
    """``with pipeprof.profile() as p: ...``, then ``p.report()``: the block profiled as
    ``pipeprof run`` profiles a program (its hooks armed for the block only), the report's
    verdict, advice and summary JSON in the result. What ``%%pipeprof`` runs a notebook cell
    in (see ``pipeprof._profile``)."""
    from pipeprof._profile import Profile

    return Profile(summary=summary, trace=trace, no_gpu=no_gpu, html=html, program=program, live=live)


def last():
    """The report of the last ``%%pipeprof`` cell or ``pipeprof.profile()`` block, or None."""
    from pipeprof._profile import last

    return last()


def load_ipython_extension(ipython):
    """``%load_ext pipeprof``: the ``%%pipeprof`` cell magic (IPython is imported only here)."""
    from pipeprof.notebook import load_ipython_extension as load

    load(ipython)


def step(step, *, epoch=0, images=0, loss=0.0, correct=0, queued=0, validation=False):
    """Reports one finished training step (``validation=True`` for a validation batch);
    ``loss=None`` when the step's loss is not known (the report shows ``-``, not 0)."""
    _native.step(step, epoch, images, None if loss is None else float(loss), correct, queued, validation)


def settings(**values):
    """Sends run settings learned while running (``batch_size=64, workers=4, device="cuda"``):
    the viewer merges them key by key; a value that does not read is listed, the others kept."""
    _native.settings(json.dumps(values, default=str))


def failed(why):
    """Marks the run failed, with why (an uncaught exception does this under ``pipeprof run``)."""
    _native.failed(str(why))


def fail_on_uncaught_exception():
    """Marks the run failed when an exception ends the program (``init`` and ``pipeprof run``
    do this): the summary gets ``failed`` with the exception and where it was raised.
    Ctrl-C (KeyboardInterrupt) is an interruption, not a failure."""
    if getattr(sys.excepthook, "_pipeprof", False):
        return
    prev = sys.excepthook

    def interrupted(e):
        # A KeyboardInterrupt anywhere in the chain: cleanup after Ctrl-C may raise again
        # (a DataLoader's pipe broken during its shutdown), and that is still an interruption.
        seen = set()
        while e is not None and id(e) not in seen:
            if isinstance(e, KeyboardInterrupt):
                return True
            seen.add(id(e))
            e = e.__cause__ or e.__context__
        return False

    def hook(kind, value, tb):
        if not issubclass(kind, KeyboardInterrupt) and not interrupted(value):
            last = tb
            while last is not None and last.tb_next is not None:
                last = last.tb_next
            where = ""
            if last is not None:
                code = last.tb_frame.f_code
                where = f" (in {os.path.basename(code.co_filename)}, line {last.tb_lineno})"
            try:
                failed(f"{kind.__name__}: {value}{where}")
            except Exception:
                pass
        prev(kind, value, tb)

    hook._pipeprof = True
    sys.excepthook = hook


def is_main():
    """Whether this process is the run's main program (not one of its workers): in a
    distributed run, each rank's program is."""
    return (
        _native.role() == "parent"
        or os.environ.get(MAIN_PID_ENV) == str(os.getpid())
        or _rank_main() == f"{_rank()}:{os.getpid()}"
    )


def _rank():
    """This process's rank from its launcher's environment (``RANK`` with ``WORLD_SIZE``), or None.
    The rank itself travels to the run in the process's hello (read there from the same
    variables)."""
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is None or world is None or not rank.strip().isdigit():
        return None
    return rank.strip()


def _rank_main():
    """``RANK:pid`` of this rank's program: the first process of the rank claims it."""
    rank = _rank()
    if rank is None:
        return None
    mine = os.environ.get(RANK_MAIN_ENV, "")
    if mine.split(":")[0] != rank:
        os.environ[RANK_MAIN_ENV] = mine = f"{rank}:{os.getpid()}"
    return mine


def finish(workers_timeout=1.0):
    """Ends this process's part: viewers see "run ended"; a worker sends what it buffered.

    The parent first gives its connected workers up to ``workers_timeout`` seconds to
    deliver their last spans. Called at exit on its own; safe to call twice.
    """
    _native.finish(workers_timeout)


def address():
    """Where ``pipeprof attach`` connects (a socket path or HOST:PORT), or None."""
    return _native.address()


def role():
    """``"parent"`` (serving), ``"worker"`` (sending to a parent) or ``"off"``."""
    return _native.role()


def clients():
    """Viewers attached now."""
    return _native.clients()


def workers():
    """Worker processes connected now."""
    return _native.workers()


def wait_for_clients(n=1, timeout=None):
    """Waits until ``n`` viewers are attached (or ``timeout`` seconds pass); True if they are."""
    return _native.wait_for_clients(n, timeout)


def name_thread(name):
    """Names the calling thread in the viewer (default: its Python thread name)."""
    _flush_at_thread_end()
    _native.name_thread(str(name))


def name_process(name):
    """Names this worker process in the viewer (default: its multiprocessing name).

    Threads that already made spans keep their names; call it before the first span.
    """
    global _process_name
    _process_name = str(name)


_THREAD = threading.local()


def _flush_at_thread_end():
    # Freed while CPython clears the ending thread's state, before join() returns.
    if getattr(_THREAD, "flusher", None) is None:
        _THREAD.flusher = _native.ThreadFlusher()


def _thread_name():
    # Called once per thread, at its first span.
    _flush_at_thread_end()
    t = threading.current_thread().name
    if _native.role() != "worker":
        return t
    proc = _process_name
    if proc is None:
        mp = sys.modules.get("multiprocessing")
        proc = mp.current_process().name if mp is not None else "worker"
    rank = _rank()
    if rank is not None:
        # A distributed run: each rank's program and its loader workers say whose they are.
        proc = f"rank {rank}" if is_main() else f"{proc} of rank {rank}"
    label = f"{proc} (pid {os.getpid()})"
    return label if t == "MainThread" else f"{label} {t}"


def _decorate(sp, func):
    stage, step_, sample, nbytes = sp.stage, sp.step, sp.sample, sp.bytes

    @functools.wraps(func)
    def timed(*args, **kwargs):
        with Span(stage, step=step_, sample=sample, bytes=nbytes):
            return func(*args, **kwargs)

    return timed


def _worker_of_a_run():
    addr = os.environ.get(ADDRESS_ENV)
    parent = os.environ.get(PARENT_PID_ENV)
    return bool(addr) and parent != str(os.getpid())


def _program_label():
    """How this process is named in the run: its script for the run's main program (the first
    Python process under ``pipeprof run``, which claims the role), else ``worker``."""
    main = os.environ.get(MAIN_PID_ENV)
    if main is None:
        os.environ[MAIN_PID_ENV] = main = str(os.getpid())
    rank = _rank()
    if rank is not None:
        # Under a launcher (torchrun), each rank's first process is that rank's program.
        if _rank_main() != f"{rank}:{os.getpid()}":
            return "worker"
    elif main != str(os.getpid()):
        return "worker"
    argv = getattr(sys, "argv", None) or [""]
    if argv[0] in ("-m", "-c", ""):
        return "python"
    return os.path.basename(argv[0])


def _connect_worker(after_fork=False):
    # After a fork the role is inherited ("parent", or "worker" in a grandchild): connect anew.
    if _native.role() == "worker" and not after_fork:
        return
    try:
        _native.connect_worker(os.environ.get(ADDRESS_ENV, ""), _program_label())
    except RuntimeError as e:
        # The parent may be gone: the worker's own work goes on, unprofiled.
        print(f"pipeprof: {e}; this worker's spans are not recorded", file=sys.stderr)
        return
    _finish_at_exit()
    if not is_main():
        _flush_on_sigterm()


def _flush_on_sigterm():
    """A pool worker is ended with SIGTERM (``multiprocessing.Pool.terminate``, Keras's
    multiprocessing ``PyDataset``): what it sent reaches the run first, then it dies of the
    signal as before. The handler is native (the extension's ``flush_on_term``): it acts even
    while the worker is inside one long C call, and ``signal.getsignal`` is unchanged."""
    _native.flush_on_term()


class _ExitHookOwner:
    """multiprocessing keeps after-fork hooks only while their owner object lives."""


_EXIT_HOOK_OWNER = _ExitHookOwner()


def _finish_at_exit():
    atexit.register(finish)
    if sys.modules.get("multiprocessing") is None:
        return
    from multiprocessing import util

    # multiprocessing children leave through os._exit(), past atexit; finalizers with an
    # exit priority still run (this one last). Process._bootstrap clears the finalizers
    # before running the target, then runs the after-fork hooks: register again there.
    util.Finalize(None, finish, exitpriority=-100)
    util.register_after_fork(_EXIT_HOOK_OWNER, lambda _: util.Finalize(None, finish, exitpriority=-100))


def _after_fork_in_child():
    global _process_name
    _process_name = None
    if _native.role() != "off" or _worker_of_a_run():
        _connect_worker(after_fork=True)


os.register_at_fork(after_in_child=_after_fork_in_child)

# A spawned worker (multiprocessing "spawn"/"forkserver", a DataLoader with that context)
# imports this module fresh: it connects to the parent named in its environment.
if _worker_of_a_run():
    _connect_worker()
