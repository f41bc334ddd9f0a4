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
measurement of something else. So does a program that never opens the folder through these.
"""

import inspect
import os
import sys

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


def check_used():
    """Called when the re-run's steps are done: a redirect the program never took is no
    measurement of it."""
    r = _CHECK.redirect
    if r is not None and not _CHECK.redirected:
        skip(
            f"the program did not open {r['from']} through ImageFolder/DatasetFolder, image_dataset_from_directory "
            "or flow_from_directory: nothing was redirected"
        )


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
    return PackedImageFolder(r["to"], transform=a.get("transform"), target_transform=a.get("target_transform"))


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
                return orig_init(*b.args, **b.kwargs)
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
    return pk.packed_dataset(r["to"], **{k: a[k] for k in keep if k in a})


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
            return orig(*b.args, **b.kwargs)

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
        return orig_flow(*b.args, **b.kwargs)

    Gen.flow_from_directory = flow_from_directory
