"""The training thread of a PyTorch program under ``pipeprof run``: its steps.

What it patches, once (``install``): ``DataLoader.__iter__`` and
``_BaseDataLoaderIter.__next__`` (Python classes of ``torch.utils.data``), and the module
function ``torch.autograd.backward`` (which ``Tensor.backward`` calls by name); and it
registers torch's own global optimizer step hooks (``register_optimizer_step_pre_hook`` /
``post_hook``) to time the ``optimizer`` step, the part of compute that does not grow with the
batch, and count the model's parameters. Nothing of
``torch.Tensor`` is replaced: ``__torch_function__`` subclasses (``UninitializedParameter``
of lazy modules among them) and ``torch.compile`` see the methods they would see without
pipeprof.

The ``backward()`` and optimizer hooks are in place only on sampled steps (each pass's first
training step, every ``LOSS_EVERY``-th after it, and its last where the DataLoader's iterator
says its length; every step under DDP): the ``next()`` that opens a sampled step puts them in
(``_native.Loop``), the next one takes them out, and in between the program calls torch's own
``torch.autograd.backward`` and ``Optimizer.step`` with no hook registered. Once the program
calls ``torch.compile`` they stay in place (what it compiles is guarded on them).

``__next__`` is the extension's own method (``_native.next_method``), not a Python function:
one call, no Python frame, and none of pipeprof's under torch's ``__next__`` (CPython 3.11
and 3.12 allocate a thread's frames in 16 KB chunks and free one as soon as its first frame
returns: a call that crosses a chunk's end costs a ``mmap`` and ``munmap`` each time, and one
frame more could move a program's calls across one).

A step is the time between two batches handed to the training thread: ``wait`` (the
``next()`` call), then ``compute`` (the loop body, until the next ``next()``), then a step
record with the batch's images and, where it was seen, the loss. The loss is the tensor
``backward()`` ran on, read at the step's end when it is a plain tensor: on the sampled steps
on the CPU, at most once a second on a GPU (the read waits for the device); other steps say
"not measured" (``-``), never 0, and an epoch's loss is the mean of those read. The
``optimizer`` span is the sampled steps' (its mean is what the diagnosis reads). Host→device
copies are not timed apart (that would need ``Tensor.to`` replaced): they are part of
``compute``, and the run's settings say so (``transfer_unmeasured``).

Steps are counted once per loop iteration: in ``for a, b in zip(loader_a, loader_b)`` the
iterator that opened the step leads, and a batch of another iterator made before the step
began is part of the same step (its wait is added to the step's), once: that iterator's second
batch in the step is a loop of its own. An epoch is one pass over the first DataLoader
iterated with autograd on; a new iterator of it starts a new epoch only when the last one ran
out or gave more than one batch (``next(iter(loader))`` every step is one epoch, not one per
step). A batch taken with autograd off is a validation step. fastai's ``DataLoader`` makes
torch's iterators itself, not through ``DataLoader.__iter__``: ``_fastai`` says each one it
makes to :func:`began`, as ``__iter__`` does (its hooks are registered once this module's are).

A training step is one whose body trained: ``backward()`` ran or the optimizer stepped (between
the sampled steps ``torch.autograd.backward`` is torch's own behind ``_native.BackwardMark``,
one call into the extension that marks the open step). Once the program has trained, a step
with no such mark that entered ``torch.no_grad()`` or ``torch.inference_mode()`` is evaluation
(its own rows, as a batch taken with autograd off is): 🤗's and accelerate's eval loops put
``no_grad`` around the forward pass only, not around the ``next()`` (``install_grad_mode``). A
batch taken and left by ``break``, or collected to train on later, is a training step, as the
steps of a program that never trains are.

A loader that reads one batch ahead (accelerate's ``DataLoaderShard``, Lightning's fetcher, a
prefetcher: ``next()`` twice before the first batch is trained on) does not move the steps:
an iterator's first step with no mark is held until the next one says. When that one trains,
the two are one step (its wait is both draws, what the training thread waited for its first
batch; its images the first batch's), each later step counts the images of the batch drawn
the step before, and the batch drawn last, trained on after the iterator ran out, is a step of
its own from that ``next()`` on (``python/src/torch_loop/steps.rs``: ``Loop::finish``).

Cost per step on the training thread: one call into the extension per ``next()`` (and per
batch made, ``_torch_fetch``), where the step's bookkeeping lives (``python/src/torch_loop/``:
on a 1 ms step every Python frame and attribute costs microseconds with caches torch's kernels
left cold), and the ``backward()`` and optimizer hooks, one Python frame each, on one step in
``LOSS_EVERY``; ``python/benches/hook_cost.py`` measures each hook's cost in µs.
"""

from __future__ import annotations

import sys
import weakref

import pipeprof
from pipeprof import _fastai, _hooks, _native, _state, _torch_fetch
from pipeprof._hooks import warn as _warn
from pipeprof.torch import _first_leaf

_now = _native.now_ns

#: Steps between two sampled steps (each pass's first and last are too): their loss is read (an
#: epoch's loss is the mean of those read, the others say "not measured"; on a GPU at most once
#: a second, each read waits for the device) and their optimizer step timed.
LOSS_EVERY = _native.LOSS_EVERY

#: The hooks' state: the loop (a ``_native.Loop``), what its sampled steps put in place, the
#: training loader, and the hooks beside torch's own functions (the hook-cost bench swaps them).
_TORCH = _state.TORCH


def _give_hooks():
    loop = _TORCH.loop
    if loop is not None:
        loop.set_hooks(_TORCH.backward, _TORCH.optimizer)


def _input_of(batch):
    """[channels, height, width] of an image batch (N, C, H, W), else None."""
    shape = getattr(_first_leaf(batch), "shape", None)
    if shape is None or len(shape) != 4:
        return None
    return [int(shape[1]), int(shape[2]), int(shape[3])]


def _first_batch(batch):
    """The first training batch: the model's input shape, and the batch size where no loader
    setting said it (a loader that is no DataLoader, or one whose size its sampler holds): what
    the batch holds, its first tensor's leading dimension."""
    try:
        shape = _input_of(batch)
    except Exception:
        # A batch of the program's own objects whose shape cannot be read: input unknown.
        shape = None
    if shape is not None:
        pipeprof.settings(input=shape)
    if _BATCH_SIZE_SENT[0]:
        return
    try:
        from pipeprof.torch import _batch_size

        n = _batch_size(batch)
    except Exception:
        return
    if isinstance(n, int) and n > 0:
        _BATCH_SIZE_SENT[0] = True
        pipeprof.settings(batch_size=n)


#: Whether a batch size went into the run's settings (the loader's own, or the first batch's).
_BATCH_SIZE_SENT = [False]


def _device(device):
    _TORCH.device = device
    pipeprof.settings(device=device)


def close():
    """Ends the training thread's open step: its compute span and step record."""
    loop = _TORCH.loop
    if loop is not None:
        loop.close()


def finish():
    """At the program's exit: the open step, and a batch's timings no step took."""
    close()
    _torch_fetch.flush_batch()


def _send_settings(loader, read=None):
    """The training loader's settings, once a run: ``read(loader, device)`` where the loader
    is no torch DataLoader (fastai's, ``_fastai``), else ``pipeprof.torch.loader_settings``."""
    if _TORCH.settings_sent:
        return
    _TORCH.settings_sent = True
    if read is None:
        from pipeprof.torch import loader_settings as read

    settings = read(loader, device=_TORCH.device)
    if "batch_size" in settings:
        _BATCH_SIZE_SENT[0] = True
    # The loop body's correct predictions are not seen without an edit: no accuracy column.
    settings["no_accuracy"] = True
    settings["transfer_unmeasured"] = True
    try:
        # On the CPU these threads hold the cores the loader's workers would use.
        import torch

        settings["compute_threads"] = int(torch.get_num_threads())
    except Exception:
        pass
    pipeprof.settings(**settings)
    if settings.get("folder_dataset"):
        from pipeprof import _cold

        _cold.remember(loader.dataset, close)


def _is_train_loader(loader):
    ref = _TORCH.train_loader
    return ref is not None and ref() is loader


def began(loader, it, read=None, begun=None):
    """``loader`` made the iterator ``it`` (``DataLoader.__iter__``; fastai's loader makes
    torch's iterator itself, ``_fastai``): the training loader's pass and its settings
    (``read``: see :func:`_send_settings`). ``begun``: when the loader was asked for ``it``,
    before its workers started: a new training pass's epoch starts then, as the program's own
    clock of it does (the time to start the workers and wait for the first batch is the
    epoch's). Returns ``it``."""
    loop = _TORCH.loop
    if begun is None:
        begun = _now()
    # What the program's own classes do when read or set (a property that raises, a
    # __setattr__ that refuses) is theirs: whatever fails here leaves the value unknown.
    try:
        it._pipeprof_t = begun
    except Exception:
        pass
    try:
        manual = bool(getattr(loader, "_pipeprof_manual", False))
    except Exception:
        manual = False
    if manual:
        # Wrapped with pipeprof.torch.profile: timed there, not twice.
        try:
            it._pipeprof_manual = True
        except Exception:
            pass
        return it
    if loop is None or not _grad_enabled[0]():
        return it
    try:
        if _TORCH.train_loader is None:
            _TORCH.train_loader = weakref.ref(loader)
        train = _is_train_loader(loader)
    except TypeError:
        # A loader that takes no weak reference: none is the training loader.
        train = False
    if train:
        try:
            loop.train_pass(it, begun)
        except Exception:
            # An iterator that takes no weak reference: its passes are not told apart.
            pass
        try:
            _send_settings(loader, read)
        except Exception as e:
            _warn("the DataLoader's settings", e)
    return it


#: ``torch.is_grad_enabled``, once ``install`` ran.
_grad_enabled = [lambda: True]


def install(dataloader_mod):
    import torch

    DataLoader = dataloader_mod.DataLoader
    Base = dataloader_mod._BaseDataLoaderIter
    orig_iter = DataLoader.__iter__
    orig_next = Base.__next__
    _grad_enabled[0] = torch.is_grad_enabled
    loop = _TORCH.loop = _native.Loop(torch=torch, on_first_batch=_first_batch, on_device=_device, distributed=_distributed)
    _give_hooks()

    def __iter__(self):
        begun = _now()
        return began(self, orig_iter(self), begun=begun)

    # `loop.begin`, torch's `__next__`, then `loop.took` or `loop.failed`: a method of the
    # extension, so that no frame of ours sits under torch's (see `hooked_next` in
    # python/src/torch_loop/: where the frames fall decides what CPython allocates).
    __next__ = _native.next_method(Base, orig_next, loop)
    _TORCH.next_hook, _TORCH.next_orig = __next__, orig_next

    __iter__.__wrapped__ = orig_iter
    # Set on an iterator of a loader wrapped with pipeprof.torch.profile; read every batch.
    Base._pipeprof_manual = False
    DataLoader.__iter__ = __iter__
    Base.__next__ = __next__

    orig_del = getattr(dataloader_mod._MultiProcessingDataLoaderIter, "__del__", None)
    if orig_del is not None:

        def __del__(self):
            # A `break` out of the loop drops the iterator: its last step ends here.
            loop.close_if_leader(self)
            orig_del(self)

        dataloader_mod._MultiProcessingDataLoaderIter.__del__ = __del__

    # fastai's DataLoader makes torch's iterators itself, not through DataLoader.__iter__.
    _hooks.when_imported(_fastai.hooks(began, PLAIN_LOSS))


#: Tensor subclasses that hold a plain tensor's data and add methods only (fastai's
#: ``TensorBase``, registered by ``_fastai``): their loss is read as the plain tensor they hold
#: (the extension reads a loss that is exactly ``torch.Tensor``, no subclass of the program's).
PLAIN_LOSS = set()


def _plain(tensors):
    """The loss ``backward()`` ran on, as a plain tensor where its class is in ``PLAIN_LOSS``."""
    if type(tensors) in PLAIN_LOSS:
        try:
            return tensors.as_subclass(sys.modules["torch"].Tensor)
        except Exception:
            return tensors
    return tensors


def install_backward(autograd_mod):
    """``torch.autograd.backward``: the step's loss (and its device), and under DDP the time
    the gradients' all-reduce keeps ``backward()`` waiting."""
    orig = autograd_mod.backward

    def backward(tensors, *args, **kwargs):
        loop = _TORCH.loop
        # The loss and its device; a step number when the program is one rank of several.
        step = None if loop is None else loop.backward(_plain(tensors))
        if step is None:
            return orig(tensors, *args, **kwargs)
        # Under DDP the gradients' all-reduce runs inside backward(), which returns once the
        # last bucket is reduced: a rank that waits for a slower one waits here.
        t0 = _now()
        try:
            return orig(tensors, *args, **kwargs)
        finally:
            try:
                _native.record("backward", t0, _now() - t0, step)
            except Exception as e:
                _warn("backward", e)

    backward.__wrapped__ = orig
    backward.__doc__ = orig.__doc__
    # A program that imports the function by name holds the hook: off the sampled steps it
    # does nothing but call torch's.
    autograd_mod.backward = backward
    # Between the sampled steps torch's own, behind a mark that says the step trains: a step
    # with no backward() (and no optimizer step) is evaluation.
    mark = _native.BackwardMark(orig)
    _TORCH.backward = _native.BackwardHook(module=autograd_mod, orig=mark, hook=backward)
    _give_hooks()


def _entering(orig):
    def __enter__(self):
        _native.saw_no_grad()
        return orig(self)

    __enter__.__wrapped__ = orig
    __enter__.__doc__ = orig.__doc__
    __enter__._pipeprof = True
    return __enter__


def install_grad_mode(grad_mode_mod):
    """``no_grad.__enter__`` and ``inference_mode.__enter__``: the open step entered one (one
    call into the extension), and a step with no ``backward()`` or optimizer step that did is
    evaluation (🤗's and accelerate's eval loops wrap the forward pass only, not the
    ``next()``). torch's own, called as it was."""
    for name in ("no_grad", "inference_mode"):
        cls = getattr(grad_mode_mod, name, None)
        orig = getattr(cls, "__enter__", None)
        if orig is None or getattr(orig, "_pipeprof", False):
            continue
        cls.__enter__ = _entering(orig)


def install_compile(torch_mod):
    """``torch.compile``: once the program calls it, the sampled steps' hooks stay in place
    (see ``_native.Loop.keep_hooks``): what it compiles is guarded on them, and hooks that come
    and go would compile the program's step again. It is torch's own, called as it was."""
    import functools

    orig = getattr(torch_mod, "compile", None)
    if orig is None or hasattr(orig, "__wrapped__"):
        return

    @functools.wraps(orig)
    def compile(*args, **kwargs):
        loop = _TORCH.loop
        if loop is not None:
            loop.keep_hooks()
        return orig(*args, **kwargs)

    torch_mod.compile = compile


def _distributed():
    """Whether this process is one rank of several in an initialised process group: None while
    there is none yet (asked again later), else its answer for good."""
    try:
        import torch.distributed as dist

        if not dist.is_available():
            return False
        if not dist.is_initialized():
            return None
        return dist.get_world_size() > 1
    except Exception:
        return False


def _compiling_first():
    """``torch.compiler.is_compiling()``, found at its first use: the optimizer module is
    imported inside ``import torch``, before ``torch.compiler`` exists."""
    global _compiling
    f = getattr(getattr(sys.modules.get("torch"), "compiler", None), "is_compiling", None)
    if f is None:
        # torch is still importing: nothing is being compiled yet.
        return False
    _compiling = f
    return f()


_compiling = _compiling_first


def install_optim(optimizer_mod):
    """The optimizer step, through torch's global step hooks (no method replaced); skipped
    while ``torch.compile`` traces, so a compiled step sees no call of ours."""

    # Whether a pre-hook timed a step that no post-hook ended yet: the post-hook then costs
    # no call into torch to ask whether it is being compiled (a traced post-hook finds it
    # False: the pre-hook skipped). A hint only: the step's clock is the thread's own.
    pending = [False]

    def pre(opt, args, kwargs):
        loop = _TORCH.loop
        if loop is not None and not _compiling():
            pending[0] = True
            loop.optimizer_pre()

    def post(opt, args, kwargs):
        if not pending[0]:
            return
        pending[0] = False
        if not _TORCH.loop.optimizer_post():
            return
        # The first step timed: the model's size, once.
        try:
            n = sum(p.numel() for g in opt.param_groups for p in g["params"])
            pipeprof.settings(params=int(n))
        except Exception as e:
            _warn("the parameter count", e)

    handles = [
        (optimizer_mod.register_optimizer_step_pre_hook(pre), pre),
        (optimizer_mod.register_optimizer_step_post_hook(post), post),
    ]
    try:
        # Torch's hook dict and key of each (a handle's own fields): the loop deletes the entry
        # after a sampled step and puts it back before the next, with no handle made each time.
        _TORCH.optimizer = [_native.OptimizerHook(hooks=h.hooks_dict_ref(), key=h.id, hook=f) for h, f in handles]
    except AttributeError:
        # A torch whose handles hold them otherwise: the hooks stay in place on every step.
        _TORCH.optimizer = []
    _give_hooks()
