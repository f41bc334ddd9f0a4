"""`pipeprof run --check-advice`'s data re-runs: the image folder the diagnosis named read from a
local copy, or from the file ``pipeprof pack`` made of it, with no edit to the program.

What it patches, only in a re-run whose ``PIPEPROF_CHECK`` names a ``redirect`` (``from``: the
folder, ``to``: the copy or the packed file, ``as``: ``"folder"`` or ``"packed"``), and only
where the program names that folder (compared by real path; every other folder is read as
asked):

- torchvision ``DatasetFolder.__init__`` (so ``ImageFolder`` too): a copy is read in place of
  the folder; a packed file: ``ImageFolder(folder, transform=..., target_transform=...)`` is a
  :class:`pipeprof.data.PackedImageFolder` (same classes, order, PIL RGB images, the program's
  transforms), made in ``DatasetFolder.__new__``.
- Keras ``utils.image_dataset_from_directory``: a copy, or :func:`pipeprof.keras.packed_dataset`
  with the same batch size, image size, shuffling, seed, labels, split.
- Keras ``ImageDataGenerator.flow_from_directory``: a copy (a packed file has no equivalent of
  the generator's per-image transforms).

A call the packed reader cannot honour as written (its own ``loader`` or ``is_valid_file``, a
subclass, ``class_names``, a colour mode other than RGB, ...) ends the re-run with the reason,
written to the ``why_file`` the re-run names: check-advice shows the row as skipped, never as a
measurement of something else. So does a program that never opens the folder through these,
whether it ends at the re-run's steps or sooner (:func:`check_used` runs at its exit too).

Every image read from the copy or the pack is counted, in whichever process reads it (the main
process, a forked or spawned DataLoader worker): each process keeps its count in a file of its
own (named by its pid) in the ``reads_dir`` the re-run names, which check-advice adds up after
the re-run. A row is a measurement only where that count is not zero: the re-run proved it read
the copy or the pack (a program that opened the folder but trained on a dataset loaded back from
a pickle reads none). The count wraps the reader the program's dataset calls per image (the
folder reader's ``loader``, the packed reader's ``transform``) in a picklable :class:`Counted`;
a Keras ``tf.data`` pipeline gets a ``map`` that counts each batch's images.
"""

import inspect
import os
import sys
import threading

from pipeprof import _state

_CHECK = _state.CHECK


def read(asked):
    """The redirect ``asked`` (``PIPEPROF_CHECK``'s object) names, or None."""
    r = (asked or {}).get("redirect")
    if isinstance(r, dict) and all(isinstance(r.get(k), str) for k in ("from", "to", "as")):
        if r["as"] in ("folder", "packed"):
            return r
    return None


def is_folder(root, folder):
    """Whether the program's ``root`` is ``folder`` (by real path; not a path: no)."""
    try:
        return os.path.realpath(os.path.expanduser(os.fspath(root))) == os.path.realpath(folder)
    except TypeError:
        return False


def skip(why):
    """Ends the re-run: the redirect cannot be made as the program asked. Check-advice reads
    ``why`` from the re-run's ``why_file`` and shows the row as skipped."""
    path = (_CHECK.asked or {}).get("why_file")
    if isinstance(path, str):
        with open(path, "w") as f:
            f.write(why)
    print(f"pipeprof: check-advice re-run: skipped: {why}", file=sys.stderr)
    raise SystemExit(0)


def _unused_why():
    """Why the re-run measured nothing of the redirect: the program never opened the folder
    through a reader the hook redirects; None where it did (or there is no redirect)."""
    r = _CHECK.redirect
    if r is None or _CHECK.redirected:
        return None
    return (
        f"the program did not open {r['from']} through ImageFolder/DatasetFolder, image_dataset_from_directory "
        "or flow_from_directory: nothing was redirected"
    )


def check_used():
    """Called when the re-run's steps are done: a redirect the program never took is no
    measurement of it."""
    why = _unused_why()
    if why is not None:
        skip(why)


def check_used_at_exit():
    """The same check at the program's own exit (it ended before the re-run's steps): the
    reason is written for check-advice, and the exit goes on as the program's."""
    why = _unused_why()
    path = (_CHECK.asked or {}).get("why_file")
    if why is None or not isinstance(path, str):
        return
    try:
        # Not over a reason already written (skip() wrote why it stopped the program).
        if not os.path.exists(path):
            with open(path, "w") as f:
                f.write(why)
    except OSError:
        pass


# ---------------------------------------------------------------- the reads counted

_READS = {"pid": None, "fd": None, "n": 0}
_READS_LOCK = threading.Lock()


def _after_fork():
    """A forked child (a DataLoader worker) starts its own count, with a lock no thread of the
    parent can have held across the fork."""
    global _READS_LOCK
    _READS_LOCK = threading.Lock()
    _READS.update(pid=None, fd=None, n=0)


os.register_at_fork(after_in_child=_after_fork)


def note(where, n=1):
    """Counts ``n`` images read from the copy or the pack in this process: its total is kept in
    ``where/<pid>`` (rewritten in place, so a process killed after a read has still told)."""
    with _READS_LOCK:
        pid = os.getpid()
        if _READS["pid"] != pid:
            # A new process (a forked worker inherits the parent's state): a file of its own.
            _READS.update(pid=pid, fd=None, n=0)
            try:
                _READS["fd"] = os.open(os.path.join(where, str(pid)), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            except OSError:
                return
        if _READS["fd"] is None:
            return
        _READS["n"] += n
        try:
            os.pwrite(_READS["fd"], f"{_READS['n']}\n".encode(), 0)
        except OSError:
            pass


def reads_dir():
    """The folder where this re-run's reads are counted, or None (then nothing is counted and
    check-advice measures nothing)."""
    where = (_CHECK.asked or {}).get("reads_dir")
    return where if isinstance(where, str) else None


class Counted:
    """A reader the dataset calls once per image (a folder reader's ``loader``, a packed
    reader's ``transform``; ``None``: the image as it is), counted with :func:`note`. Picklable,
    so that a spawned worker counts too; other attributes are the wrapped reader's."""

    def __init__(self, fn, where):
        self.fn = fn
        self.where = where

    def __call__(self, x):
        note(self.where)
        return x if self.fn is None else self.fn(x)

    def __getattr__(self, name):
        fn = self.__dict__.get("fn")
        if name.startswith("__") or fn is None:
            raise AttributeError(name)
        return getattr(fn, name)

    def __repr__(self):
        return repr(self.fn)


def _counted_tf(ds, where):
    """A ``tf.data.Dataset`` of batches (or a list of them, ``subset="both"``) with each
    batch's images counted as it is taken; its ``class_names`` and ``file_paths`` kept."""
    if isinstance(ds, (list, tuple)):
        return type(ds)(_counted_tf(d, where) for d in ds)
    if where is None or not hasattr(ds, "map"):
        return ds
    import tensorflow as tf

    def seen(n):
        note(where, int(n))
        return n

    def count(*xs):
        first = tf.nest.flatten(xs)[0]
        n = tf.py_function(seen, [tf.shape(first)[0]], tf.int32)
        with tf.control_dependencies([n]):
            xs = tf.nest.map_structure(tf.identity, xs)
        return xs[0] if len(xs) == 1 else xs

    out = ds.map(count)
    for name in ("class_names", "file_paths"):
        if hasattr(ds, name):
            setattr(out, name, getattr(ds, name))
    return out


def _bind(fn, *args, **kwargs):
    """``fn``'s arguments bound with their defaults, or None where they do not bind."""
    try:
        b = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError:
        return None
    b.apply_defaults()
    return b


# ---------------------------------------------------------------- torchvision


def _packed_folder(cls, folder_mod, r, args, kwargs):
    """The PackedImageFolder that stands for ``cls(*args, **kwargs)``, or a skip."""
    ImageFolder = folder_mod.ImageFolder
    if cls is not ImageFolder:
        skip(
            f"{cls.__name__}({r['from']!r}, ...) is not torchvision's ImageFolder itself: the packed file holds "
            "what ImageFolder reads, not what this class reads"
        )
    b = _bind(ImageFolder.__init__, None, *args, **kwargs)
    if b is None:
        return None
    a = b.arguments
    if a.get("loader") is not folder_mod.default_loader:
        skip("ImageFolder(..., loader=...) reads with its own loader: the packed file holds RGB pixels as PIL decodes them")
    if a.get("is_valid_file") is not None:
        skip("ImageFolder(..., is_valid_file=...) chooses its own files: the packed file holds every image of the folder")
    from pipeprof.data import PackedImageFolder

    _CHECK.redirected = True
    transform = a.get("transform")
    if reads_dir() is not None:
        transform = Counted(transform, reads_dir())
    return PackedImageFolder(r["to"], transform=transform, target_transform=a.get("target_transform"))


def patch_torchvision(folder_mod):
    """``torchvision.datasets.folder``: the redirect, when the re-run names one."""
    r = _CHECK.redirect
    if r is None:
        return
    DatasetFolder = folder_mod.DatasetFolder
    if r["as"] == "folder":
        orig_init = DatasetFolder.__init__

        def __init__(self, *args, **kwargs):
            b = _bind(orig_init, self, *args, **kwargs)
            if b is not None and is_folder(b.arguments.get("root"), r["from"]):
                b.arguments["root"] = r["to"]
                _CHECK.redirected = True
                orig_init(*b.args, **b.kwargs)
                if reads_dir() is not None and callable(getattr(self, "loader", None)):
                    self.loader = Counted(self.loader, reads_dir())
                return None
            return orig_init(self, *args, **kwargs)

        DatasetFolder.__init__ = __init__
        return
    orig_new = DatasetFolder.__new__

    def __new__(cls, *args, **kwargs):
        root = args[0] if args else kwargs.get("root")
        if is_folder(root, r["from"]):
            made = _packed_folder(cls, folder_mod, r, args, kwargs)
            if made is not None:
                # Not an instance of cls: Python calls no __init__ on it.
                return made
        return orig_new(cls) if orig_new is object.__new__ else orig_new(cls, *args, **kwargs)

    DatasetFolder.__new__ = __new__


# ---------------------------------------------------------------- keras


def _packed_dataset(r, a):
    """``pipeprof.keras.packed_dataset`` for ``image_dataset_from_directory``'s bound
    arguments ``a``, or a skip."""
    refused = [
        ("labels", "inferred", "labels other than the folder's (labels=...)"),
        ("class_names", None, "class_names=..."),
        ("color_mode", "rgb", "color_mode other than 'rgb'"),
        ("crop_to_aspect_ratio", False, "crop_to_aspect_ratio=True"),
        ("pad_to_aspect_ratio", False, "pad_to_aspect_ratio=True"),
    ]
    for name, ok, words in refused:
        if name in a and a[name] != ok:
            skip(f"image_dataset_from_directory(..., {words}): pipeprof.keras.packed_dataset reads the folder's own classes as RGB")
    from pipeprof import keras as pk

    keep = ("batch_size", "image_size", "shuffle", "seed", "label_mode", "validation_split", "subset", "interpolation")
    _CHECK.redirected = True
    return _counted_tf(pk.packed_dataset(r["to"], **{k: a[k] for k in keep if k in a}), reads_dir())


def patch_keras(keras_mod):
    """Keras's directory readers: the redirect, when the re-run names one."""
    r = _CHECK.redirect
    if r is None:
        return
    utils = getattr(keras_mod, "utils", None)
    orig = getattr(utils, "image_dataset_from_directory", None)
    if orig is not None:

        def image_dataset_from_directory(*args, **kwargs):
            b = _bind(orig, *args, **kwargs)
            if b is None or not is_folder(b.arguments.get("directory"), r["from"]):
                return orig(*args, **kwargs)
            if r["as"] == "packed":
                return _packed_dataset(r, b.arguments)
            b.arguments["directory"] = r["to"]
            _CHECK.redirected = True
            return _counted_tf(orig(*b.args, **b.kwargs), reads_dir())

        for mod in (utils, getattr(keras_mod, "preprocessing", None)):
            if getattr(mod, "image_dataset_from_directory", None) is orig:
                mod.image_dataset_from_directory = image_dataset_from_directory
    image = getattr(getattr(keras_mod, "preprocessing", None), "image", None)
    Gen = getattr(image, "ImageDataGenerator", None)
    if Gen is None:
        return
    orig_flow = Gen.flow_from_directory

    def flow_from_directory(self, *args, **kwargs):
        b = _bind(orig_flow, self, *args, **kwargs)
        if b is None or not is_folder(b.arguments.get("directory"), r["from"]):
            return orig_flow(self, *args, **kwargs)
        if r["as"] == "packed":
            skip(
                "ImageDataGenerator.flow_from_directory applies the generator's own transforms to each image: "
                "pipeprof.keras.packed_dataset has no equivalent (use image_dataset_from_directory to compare)"
            )
        b.arguments["directory"] = r["to"]
        _CHECK.redirected = True
        it = orig_flow(*b.args, **b.kwargs)
        where, batches = reads_dir(), getattr(it, "_get_batches_of_transformed_samples", None)
        if where is not None and batches is not None:

            def counted(index_array):
                note(where, len(index_array))
                return batches(index_array)

            # Called as self._get_batches_of_transformed_samples(...): the instance's own.
            it._get_batches_of_transformed_samples = counted
        return it

    Gen.flow_from_directory = flow_from_directory
