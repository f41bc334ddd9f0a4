"""Generated data for the corpus scripts: nothing is downloaded.

- ``image_folder()``: an ImageFolder (one sub-folder per class) of photo-like pictures: a noisy
  gradient background with a few filled shapes, JPEG and PNG, a few sizes. Written once into a
  cache folder and reused (``CORPUS_DATA``, else ``$XDG_CACHE_HOME/pipeprof-corpus``, else
  ``~/.cache/pipeprof-corpus``); deterministic, so every run of every script reads the same bytes.
- ``segmentation_folder()``: the same pictures as ``images/NAME.jpg`` with ``masks/NAME.png``
  beside them (the class of the shape under each pixel, 0 for the background), as the Oxford
  pets layout of Keras's segmentation example.
- ``mnist_like(n)``: uint8 28×28 digits-like images and their labels, in memory, as
  ``torchvision.datasets.MNIST`` holds them (one noisy, shifted stroke pattern per class).

A folder is built under a temporary name and renamed into place, so two scripts starting at
once never read half of one.
"""

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

CLASSES = ("circle", "square", "triangle", "cross")
# (width, height): the few sizes a scraped photo set has.
SIZES = ((160, 120), (200, 150), (240, 180), (180, 180))
VERSION = 1


def cache_root():
    env = os.environ.get("CORPUS_DATA")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pipeprof-corpus"


def _picture(rng, label, size):
    """An RGB picture (PIL) of class ``label`` and its mask (PIL, mode L)."""
    from PIL import Image, ImageDraw

    w, h = size
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
    base = rng.uniform(40, 200, size=3)
    tilt = rng.uniform(-0.5, 0.5, size=(2, 3))
    img = base + xs[..., None] * tilt[0] + ys[..., None] * tilt[1] + rng.normal(0, 18, size=(h, w, 3))
    pic = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")
    mask = Image.new("L", size, 0)
    draw, mdraw = ImageDraw.Draw(pic), ImageDraw.Draw(mask)
    for _ in range(int(rng.integers(1, 4))):
        r = int(rng.integers(min(w, h) // 8, min(w, h) // 3))
        cx, cy = int(rng.integers(r, w - r)), int(rng.integers(r, h - r))
        colour = tuple(int(c) for c in rng.integers(0, 256, size=3))
        box = (cx - r, cy - r, cx + r, cy + r)
        for d, fill in ((draw, colour), (mdraw, label + 1)):
            if CLASSES[label] == "circle":
                d.ellipse(box, fill=fill)
            elif CLASSES[label] == "square":
                d.rectangle(box, fill=fill)
            elif CLASSES[label] == "triangle":
                d.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=fill)
            else:
                d.rectangle((cx - r, cy - r // 4, cx + r, cy + r // 4), fill=fill)
                d.rectangle((cx - r // 4, cy - r, cx + r // 4, cy + r), fill=fill)
    return pic, mask


def _build(name, write):
    """``cache_root()/name``, made by ``write(tmp_folder)`` the first time."""
    root = cache_root()
    final = root / f"{name}-v{VERSION}"
    if final.is_dir():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    try:
        write(tmp)
        try:
            tmp.rename(final)
        except OSError:
            if not final.is_dir():  # not another process that won the race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def image_folder(per_class=96):
    """An ImageFolder of ``len(CLASSES) * per_class`` pictures, built once; its path."""

    def write(tmp):
        rng = np.random.default_rng(1234)
        for label, cls in enumerate(CLASSES):
            (tmp / cls).mkdir()
            for i in range(per_class):
                pic, _ = _picture(rng, label, SIZES[i % len(SIZES)])
                if i % 3 == 2:
                    pic.save(tmp / cls / f"{cls}_{i:04d}.png")
                else:
                    pic.save(tmp / cls / f"{cls}_{i:04d}.jpg", quality=90)

    return _build(f"images-{per_class}", write)


def segmentation_folder(count=128):
    """``images/`` (JPEG) and ``masks/`` (PNG, one class per pixel) of ``count`` pictures."""

    def write(tmp):
        rng = np.random.default_rng(4321)
        (tmp / "images").mkdir()
        (tmp / "masks").mkdir()
        for i in range(count):
            pic, mask = _picture(rng, i % len(CLASSES), SIZES[i % len(SIZES)])
            pic.save(tmp / "images" / f"pic_{i:04d}.jpg", quality=90)
            mask.save(tmp / "masks" / f"pic_{i:04d}.png")

    return _build(f"segmentation-{count}", write)


def mnist_like(n, seed=0):
    """(images uint8 [n, 28, 28], labels int64 [n]): ten classes, each a fixed stroke pattern
    shifted by up to 3 pixels, with noise."""
    rng = np.random.default_rng(seed)
    templates = np.zeros((10, 28, 28), np.float32)
    t_rng = np.random.default_rng(99)
    for k in range(10):
        for _ in range(3):  # three strokes per "digit"
            r0, c0 = t_rng.integers(6, 22, size=2)
            dr, dc = t_rng.integers(-1, 2, size=2)
            for s in range(8):
                r, c = np.clip(r0 + dr * s, 4, 23), np.clip(c0 + dc * s, 4, 23)
                templates[k, r - 1 : r + 2, c - 1 : c + 2] = 255.0
    labels = rng.integers(0, 10, size=n)
    images = templates[labels]
    shifts = rng.integers(-3, 4, size=(n, 2))
    for sr in range(-3, 4):
        for sc in range(-3, 4):
            sel = (shifts[:, 0] == sr) & (shifts[:, 1] == sc)
            images[sel] = np.roll(images[sel], (sr, sc), axis=(1, 2))
    images += rng.normal(0, 30, size=images.shape).astype(np.float32)
    return np.clip(images, 0, 255).astype(np.uint8), labels.astype(np.int64)
