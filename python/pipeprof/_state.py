"""What pipeprof's hooks share in one process, in one place: objects with typed attributes (no
dict of string keys), in a module that imports nothing of pipeprof's. Every hook module imports
it and it imports none of them, so no hook module needs another one for its state.

* ``RUN``: this process's part in the run (set by ``_auto.start``).
* ``TORCH``: the PyTorch hooks (``_torch_loop``, ``_torch_fetch``): the training loop, what its
  sampled steps put in place, and the hooks beside torch's own functions (the hook-cost bench
  swaps them).
* ``CHECK``: a ``--check-advice`` re-run (``_override``).
* ``KERAS``: the Keras loaders' patches (``_keras_data``).
* ``THREAD``: where the calling thread is in a loader's work, shared by the DataLoader fetcher,
  the Keras loaders and the one PIL patch (``_pil``).
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any


class Run:
    """This process's part in the run."""

    __slots__ = ("main",)

    def __init__(self) -> None:
        #: The run's main program (a rank's, in a distributed run), not one of its workers.
        self.main: bool = False


class Torch:
    """The PyTorch hooks' state."""

    __slots__ = (
        "loop",
        "settings_sent",
        "device",
        "train_loader",
        "backward",
        "optimizer",
        "next_hook",
        "next_orig",
        "fetch_hook",
        "fetch_orig",
    )

    def __init__(self) -> None:
        #: The steps' state and hot path (a ``_native.Loop``), once ``_torch_loop.install`` made it.
        self.loop: Any = None
        #: The DataLoader's settings were sent (once a run).
        self.settings_sent: bool = False
        #: The loss's device, once seen.
        self.device: str | None = None
        #: The training loader (a weak reference): the first iterated with autograd on.
        self.train_loader: weakref.ref | None = None
        #: What the loop puts in place on its sampled steps and takes out after them (see
        #: ``_native.Loop.set_hooks``): a ``_native.BackwardHook``, and a list of
        #: ``_native.OptimizerHook``; None while their modules are not imported.
        self.backward: Any = None
        self.optimizer: list | None = None
        #: ``_BaseDataLoaderIter.__next__`` and ``_MapDatasetFetcher.fetch``: the hook and torch's
        #: own (the hook-cost bench swaps them); None until installed.
        self.next_hook: Any = None
        self.next_orig: Any = None
        self.fetch_hook: Any = None
        self.fetch_orig: Any = None


class Check:
    """A ``--check-advice`` re-run: what ``PIPEPROF_CHECK`` asked, and the steps taken."""

    __slots__ = ("asked", "steps", "done", "redirect", "redirected")

    def __init__(self) -> None:
        #: The re-run's JSON object (the loader arguments to set, ``steps``), or None.
        self.asked: dict | None = None
        #: Where the image folder the diagnosis named is read from instead: ``{"from": folder,
        #: "to": a local copy or a packed file, "as": "folder" | "packed"}``, or None.
        self.redirect: dict | None = None
        #: Whether the program has opened that folder through a reader the hook redirects.
        self.redirected: bool = False
        #: Training steps after which the program is stopped (None: not stopped).
        self.steps: int | None = None
        #: Training steps handed out so far.
        self.done: int = 0


class Keras:
    """The Keras loaders' patches."""

    __slots__ = ("patched", "lock", "next_worker", "folder")

    def __init__(self) -> None:
        #: Modules whose patch is in (each once).
        self.patched: set[str] = set()
        #: The first folder ``image_dataset_from_directory`` read: the run's ``data``.
        self.folder: str | None = None
        #: The pool threads numbered so far (``loader-N``), under ``lock``.
        self.lock = threading.Lock()
        self.next_worker: int = 0


class Thread(threading.local):
    """Where the calling thread is in a loader's work (class attributes: each thread starts
    from these). Shared by the DataLoader fetcher (``_torch_fetch``), the Keras loaders
    (``_keras_data``) and the PIL patch (``_pil``), so that one never times what another
    already does."""

    #: Nesting of loader-stage spans (PIL, torchvision): only the outermost is timed. A Keras
    #: batch or ``load_img`` counts as one: PIL's spans of the DataLoader kind stay quiet inside.
    depth: int = 0
    #: Inside a DataLoader fetcher's samples, and whether a PIL or torchvision span covered them.
    in_fetch: bool = False
    fetch_covered: bool = False
    #: Inside a Keras batch (a PyDataset item), and whether a named stage covered it.
    in_item: bool = False
    item_covered: bool = False
    #: Inside Keras's ``load_img``: its parts so far ([wall, cpu, queue] by stage), else None.
    img: dict | None = None
    #: A PIL call timed the Keras way is running: PIL's calls inside it are its own.
    pil_busy: bool = False
    #: This thread's Keras-side decode so far (wall, cpu, queue): a resize less the decode it set off.
    decoded: tuple | list = (0, 0, 0)
    #: This thread (or process) was named as a Keras pool worker, or found to be none.
    named: bool = False

    def forget(self) -> None:
        """Back to where a thread starts."""
        self.__dict__.clear()


RUN = Run()
TORCH = Torch()
CHECK = Check()
KERAS = Keras()
THREAD = Thread()

# A forked child (a DataLoader or Keras pool worker) starts from the forking thread's state:
# it is not that thread.
os.register_at_fork(after_in_child=THREAD.forget)
