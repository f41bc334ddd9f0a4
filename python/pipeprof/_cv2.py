"""OpenCV and albumentations inside a DataLoader's samples, under ``pipeprof run``: a custom
Dataset that reads with ``cv2.imread`` and transforms with an albumentations ``Compose`` has
the stages a PIL and torchvision one has, not one ``fetch``.

What it patches, once each, when the program imports them:

* ``cv2.imread`` and ``cv2.imdecode`` (``decode``: the file read and its pixels decoded, one
  call), ``cv2.resize`` (``resize``) and ``cv2.cvtColor`` (``convert``), as attributes of the
  ``cv2`` package (what ``cv2.imread(...)`` looks up);
* ``BasicTransform.__call__`` of albumentations (every transform's), by what its class does
  (:func:`stage_of_transform`): crops and resizes ``resize``, ``Normalize``/``ToTensorV2``/
  ``ToFloat`` ``convert``, the rest (flips, rotations, colour, blur, noise) ``augment``.

Each is a span only inside a DataLoader fetcher's samples and not inside another span of a
loader stage (``_pil.Stage``: a ``cv2.resize`` inside albumentations' ``Resize`` is that
transform's); elsewhere a thread-local read or two per call. What they return or raise is
unchanged.
"""

from __future__ import annotations

from pipeprof import _native
from pipeprof._pil import Stage
from pipeprof._torch_fetch import stage_of_name

#: cv2's functions and the stage each is.
_CV2 = {"imread": "decode", "imdecode": "decode", "resize": "resize", "cvtColor": "convert"}

#: albumentations' class names beyond torchvision's (``_torch_fetch.stage_of_name``).
_ALBU = {
    "resize": (
        "LongestMaxSize", "SmallestMaxSize", "RandomScale", "Crop", "CropAndPad", "PadIfNeeded",
        "RandomSizedCrop", "RandomSizedBBoxSafeCrop", "BBoxSafeRandomCrop", "CropNonEmptyMaskIfExists",
        "RandomCropFromBorders", "AtLeastOneBBoxRandomCrop", "RandomCropNearBBox",
    ),
    "convert": ("ToTensorV2", "ToFloat", "FromFloat", "ToGray", "ToRGB"),
}
_ALBU_STAGE = {name: stage for stage, names in _ALBU.items() for name in names}
_STAGE_OF_TYPE = {}


def stage_of_transform(cls):
    """The loader stage of an albumentations transform class: a crop or resize ``resize``, a
    conversion ``convert``, any other ``augment`` (albumentations' transforms are)."""
    stage = _STAGE_OF_TYPE.get(cls)
    if stage is None:
        name = getattr(cls, "__name__", "?")
        stage = _ALBU_STAGE.get(name) or stage_of_name(name) or "augment"
        _STAGE_OF_TYPE[cls] = stage
    return stage


def _timed(orig, stage):
    def timed(*args, **kwargs):
        with Stage(stage):
            return orig(*args, **kwargs)

    timed.__wrapped__ = orig
    timed.__name__ = getattr(orig, "__name__", stage)
    timed.__doc__ = getattr(orig, "__doc__", None)
    timed._pipeprof = True
    return timed


def install_cv2(cv2_mod):
    """``cv2.imread``, ``imdecode``, ``resize``, ``cvtColor`` (once)."""
    _native.fetch_inner()
    for name, stage in _CV2.items():
        orig = getattr(cv2_mod, name, None)
        if orig is not None and not getattr(orig, "_pipeprof", False):
            setattr(cv2_mod, name, _timed(orig, stage))


def install_albumentations(mod):
    """``BasicTransform.__call__`` of ``albumentations.core.transforms_interface`` (once)."""
    _native.fetch_inner()
    Basic = mod.BasicTransform
    orig = Basic.__call__
    if getattr(orig, "_pipeprof", False):
        return

    def __call__(self, *args, **kwargs):
        with Stage(stage_of_transform(type(self))):
            return orig(self, *args, **kwargs)

    __call__.__wrapped__ = orig
    __call__._pipeprof = True
    Basic.__call__ = __call__
