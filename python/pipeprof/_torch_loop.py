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

A step is the time between two batches handed to the training thread: ``wait`` (the
``next()`` call), then ``compute`` (the loop body, until the next ``next()``), then a step
record with the batch's images and, where it was seen, the loss. The loss is the tensor
``backward()`` ran on, read at the step's end when it is a plain tensor: on the CPU every 8th
step and each epoch's first, on a GPU at most once a second (the read waits for the device);
other steps say "not measured" (``-``), never 0, and an epoch's loss is the mean of those
read. Host→device copies are not timed apart (that would need ``Tensor.to`` replaced): they
are part of ``compute``, and the run's settings say so (``transfer_unmeasured``).

Steps are counted once per loop iteration: in ``for a, b in zip(loader_a, loader_b)`` the
iterator that opened the step leads, and another iterator's batch taken before the step did
any ``backward`` is part of the same step (its wait is added to the step's). An epoch is one
pass over the first DataLoader iterated with autograd on; a new iterator of it starts a new
epoch only when the last one ran out or gave more than one batch (``next(iter(loader))`` every
step is one epoch, not one per step). A batch taken with autograd off is a validation step.

Cost per step on the training thread: a few clock reads and one call into the extension with
the whole step (its spans, the batch's fetch and collate made on this thread, the step record):
``python/benches/hook_cost.py`` measures each hook's cost in µs.
"""

from __future__ import annotations

import threading
import weakref

import pipeprof
from pipeprof import _native, _torch_fetch
from pipeprof.torch import _batch_size, _first_leaf

_now = _native.now_ns


class _Thread(threading.local):
    #: The step whose batch this thread holds now (an ``_Open``), or None.
    open = None


_T = _Thread()
#: The fetch hook's thread state: the loop holds a batch made inside its ``next()`` there.
_F = _torch_fetch._T

#: Seconds between two reads of a loss that lives on a GPU (each read waits for the device).
GPU_LOSS_EVERY_NS = 1_000_000_000
#: Steps between two reads of a loss on the CPU (a read is a call through torch's dispatcher:
#: microseconds on a 1 ms step), and the first step of each epoch: the epoch's loss is the mean
#: of the steps read, the others say "not measured".
LOSS_EVERY = 8

_STATE = {
    "step": 0,
    "epoch": -1,
    "settings_sent": False,
    "input_sent": False,
    "device": None,
    # The training loader (a weak reference) and its current iterator's bookkeeping.
    "train_loader": None,
    "train_iter": None,
    "last_gpu_loss_ns": 0,
    # The next step whose loss is read, and the epoch of the last one read.
    "loss_step": 0,
    "loss_epoch": None,
}


def _warn(what, e):
    from pipeprof._auto import _warn as warn

    warn(what, e)


class _Open:
    """The step whose batch the training thread holds now."""

    __slots__ = (
        "step", "epoch", "t_call", "t_body", "images", "validation", "leader", "backward", "loss_t", "opt_t0", "opt",
        "batch",
    )

    def __init__(self, step, epoch, t_call, t_body, images, validation, leader):
        self.step, self.epoch = step, epoch
        self.t_call, self.t_body = t_call, t_body
        self.images, self.validation = images, validation
        # The iterator that opened the step, by id: holding it would delay its workers' end.
        self.leader = leader
        self.backward = False
        self.loss_t = None
        self.opt_t0 = None
        # The optimizer step (start, duration), and the batch's timings when this thread made
        # it (see _native.batch_spans): sent with the step, in one call.
        self.opt = None
        self.batch = None


def _input_of(batch):
    """[channels, height, width] of an image batch (N, C, H, W), else None."""
    shape = getattr(_first_leaf(batch), "shape", None)
    if shape is None or len(shape) != 4:
        return None
    return [int(shape[1]), int(shape[2]), int(shape[3])]


def _loss_of(st, end, last):
    """The step's loss as a float, or None when it was not seen, is not read this step (an
    epoch's last step always is), or is not cheap to read."""
    t = st.loss_t
    if t is None or (not last and st.step < _STATE["loss_step"] and st.epoch == _STATE["loss_epoch"]):
        return None
    # Only a plain tensor: reading a subclass would run its __torch_function__, which the
    # program never asked for.
    if type(t) is not _TENSOR[0] or t.numel() != 1:
        return None
    if not t.is_cpu:
        if end - _STATE["last_gpu_loss_ns"] < GPU_LOSS_EVERY_NS:
            return None
        _STATE["last_gpu_loss_ns"] = end
    _STATE["loss_step"], _STATE["loss_epoch"] = st.step + LOSS_EVERY, st.epoch
    try:
        return t.item()
    except Exception:
        return None


def close(end_ns=None, last=True):
    """Ends the training thread's open step: its compute span and step record. ``last``: no
    step of the same pass follows (its loss is read whatever the sampling)."""
    st = _T.open
    if st is None:
        return
    _T.open = None
    end = _now() if end_ns is None else end_ns
    try:
        loss = _loss_of(st, end, last)
        _native.loop_step(
            st.step, max(st.epoch, 0), st.images, loss, st.validation, st.t_call, st.t_body, end, st.opt, st.batch
        )
    except Exception as e:
        _warn("a step", e)


def finish():
    """At the program's exit: the open step, and a batch's timings no step took."""
    close()
    _torch_fetch.flush_batch()


def _send_settings(loader):
    if _STATE["settings_sent"]:
        return
    _STATE["settings_sent"] = True
    from pipeprof.torch import loader_settings

    settings = loader_settings(loader, device=_STATE["device"])
    # The loop body's correct predictions are not seen without an edit: no accuracy column.
    settings["no_accuracy"] = True
    settings["transfer_unmeasured"] = True
    pipeprof.settings(**settings)


def _is_train_loader(loader):
    ref = _STATE["train_loader"]
    return ref is not None and ref() is loader


#: ``torch.Tensor``, once torch is imported (the loss is read only from a plain tensor).
_TENSOR = [None]


def install(dataloader_mod):
    import torch

    _TENSOR[0] = torch.Tensor
    DataLoader = dataloader_mod.DataLoader
    Base = dataloader_mod._BaseDataLoaderIter
    orig_iter = DataLoader.__iter__
    orig_next = Base.__next__
    is_grad_enabled = torch.is_grad_enabled

    def __iter__(self):
        it = orig_iter(self)
        try:
            it._pipeprof_t = _now()
        except AttributeError:
            pass
        if getattr(self, "_pipeprof_manual", False):
            # Wrapped with pipeprof.torch.profile: timed there, not twice.
            try:
                it._pipeprof_manual = True
            except AttributeError:
                pass
            return it
        if not is_grad_enabled():
            return it
        if _STATE["train_loader"] is None:
            _STATE["train_loader"] = weakref.ref(self)
        if _is_train_loader(self):
            prev = _STATE["train_iter"]
            # A new pass: the last iterator ran out, or was left after several batches (a
            # `break`). One batch taken from a fresh iterator every step is not an epoch.
            if prev is None or prev[1] or prev[2] > 1:
                close()
                _STATE["epoch"] += 1
            _STATE["train_iter"] = [weakref.ref(it), False, 0]
            _send_settings(self)
        return it

    def __next__(self):
        if self._pipeprof_manual:
            return orig_next(self)
        t_call = _now()
        st = _T.open
        validation = not is_grad_enabled()
        # Another loader's batch in the same loop iteration (zip): part of the open step. Its
        # iterator was made before the step began (a fresh `iter(loader)` each step is not).
        joins = (
            st is not None
            and st.leader != id(self)
            and not st.backward
            and st.validation == validation
            and getattr(self, "_pipeprof_t", t_call) < st.t_call
        )
        # The open step ends at this call, but is sent once the call is over: a loader that ran
        # out makes it the pass's last step.
        # A batch made on this thread (num_workers=0) is timed for this step, not sent apart.
        _F.defer = True
        try:
            batch = orig_next(self)
        except StopIteration:
            if not joins:
                close(t_call)
            ti = _STATE["train_iter"]
            if ti is not None and ti[0]() is self:
                ti[1] = True
            raise
        except BaseException:
            if not joins:
                close(t_call)
            # The batch made before the failure is sent, not lost.
            _torch_fetch.flush_batch()
            raise
        finally:
            _F.defer = False
        if not joins:
            close(t_call, last=False)
        t_body = _now()
        made = _F.batch
        _F.batch = None
        if joins:
            st.t_body = t_body
            if not validation:
                _native.record("wait", t_call, t_body - t_call, st.step)
            if made is not None:
                _native.batch_spans(made)
            return batch
        step = _STATE["step"]
        _STATE["step"] = step + 1
        if not validation:
            ti = _STATE["train_iter"]
            if ti is not None and ti[0]() is self:
                ti[2] += 1
            if not _STATE["input_sent"]:
                _STATE["input_sent"] = True
                shape = _input_of(batch)
                if shape is not None:
                    pipeprof.settings(input=shape)
        st = _T.open = _Open(step, _STATE["epoch"], t_call, t_body, _batch_size(batch), validation, id(self))
        st.batch = made
        return batch

    __iter__.__wrapped__ = orig_iter
    __next__.__wrapped__ = orig_next
    # Set on an iterator of a loader wrapped with pipeprof.torch.profile; read every batch.
    Base._pipeprof_manual = False
    DataLoader.__iter__ = __iter__
    Base.__next__ = __next__

    orig_del = getattr(dataloader_mod._MultiProcessingDataLoaderIter, "__del__", None)
    if orig_del is not None:

        def __del__(self):
            # A `break` out of the loop drops the iterator: its last step ends here.
            st = _T.open
            if st is not None and st.leader == id(self):
                close()
            orig_del(self)

        dataloader_mod._MultiProcessingDataLoaderIter.__del__ = __del__


def install_backward(autograd_mod):
    """``torch.autograd.backward``: the step's loss (and its device), and under DDP the time
    the gradients' all-reduce keeps ``backward()`` waiting."""
    orig = autograd_mod.backward

    def backward(tensors, *args, **kwargs):
        st = _T.open
        if st is None or st.validation:
            return orig(tensors, *args, **kwargs)
        first = not st.backward
        st.backward = True
        if first and st.loss_t is None:
            t = tensors[0] if isinstance(tensors, (list, tuple)) and tensors else tensors
            st.loss_t = t
            dev = getattr(t, "device", None)
            if dev is not None and _STATE["device"] is None:
                _STATE["device"] = str(dev)
                pipeprof.settings(device=_STATE["device"])
        if not _distributed():
            return orig(tensors, *args, **kwargs)
        # Under DDP the gradients' all-reduce runs inside backward(), which returns once the
        # last bucket is reduced: a rank that waits for a slower one waits here.
        t0 = _now()
        try:
            return orig(tensors, *args, **kwargs)
        finally:
            try:
                _native.record("backward", t0, _now() - t0, st.step)
            except Exception as e:
                _warn("backward", e)

    backward.__wrapped__ = orig
    backward.__doc__ = orig.__doc__
    autograd_mod.backward = backward


_DIST = {"mod": None, "ranks": None}


def _distributed():
    """Whether this process is one rank of several in an initialised process group (its size
    is read once the group exists: one cheap check per step before that)."""
    if _DIST["ranks"] is not None:
        return _DIST["ranks"] > 1
    try:
        dist = _DIST["mod"]
        if dist is None:
            import torch.distributed as dist

            _DIST["mod"] = dist
            if not dist.is_available():
                _DIST["ranks"] = 1
                return False
        if not dist.is_initialized():
            return False
        _DIST["ranks"] = dist.get_world_size()
        return _DIST["ranks"] > 1
    except Exception:
        return False


def install_optim(optimizer_mod):
    """The optimizer step, through torch's global step hooks (no method replaced); skipped
    while ``torch.compile`` traces, so a compiled step sees no call of ours."""
    import torch

    compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)
    sent = {"params": False}

    def pre(opt, args, kwargs):
        st = _T.open
        if st is not None and not st.validation and not compiling():
            st.opt_t0 = _now()

    def post(opt, args, kwargs):
        st = _T.open
        if st is None or st.opt_t0 is None:
            return
        t0, st.opt_t0 = st.opt_t0, None
        st.opt = (t0, _now() - t0)
        if not sent["params"]:
            sent["params"] = True
            try:
                n = sum(p.numel() for g in opt.param_groups for p in g["params"])
                pipeprof.settings(params=int(n))
            except Exception as e:
                _warn("the parameter count", e)

    # Their handles: python/benches/hook_cost.py removes and adds them back.
    _OPT_HOOKS[:] = [
        optimizer_mod.register_optimizer_step_pre_hook(pre),
        optimizer_mod.register_optimizer_step_post_hook(post),
        pre,
        post,
    ]


_OPT_HOOKS = []
