#!/usr/bin/env python3
"""The Pillow peer for `cargo bench --bench loader`: the classic Python loader, one process.

read file -> PIL decode -> convert("RGB") -> resize 150x150 bilinear (antialiased, as
torchvision's Resize on PIL input) -> float32 CHW in [0, 1] (as ToTensor) -> batches of 32
(np.stack). One warm-up pass, then one timed pass; prints "images_per_cpu_s images_per_s".
Needs: pip install pillow numpy
"""
import io
import os
import sys
import time

import numpy as np
from PIL import Image

EXTS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
SIZE, BATCH = 150, 32


def files(root):
    out = []
    for c in sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith(".")):
        for dp, _, fns in os.walk(os.path.join(root, c)):
            out += [os.path.join(dp, f) for f in sorted(fns) if f.lower().endswith(EXTS)]
    return out


def load(path):
    with open(path, "rb") as f:
        im = Image.open(io.BytesIO(f.read()))
    im = im.convert("RGB").resize((SIZE, SIZE), Image.BILINEAR)
    return (np.asarray(im, dtype=np.float32) * (1.0 / 255.0)).transpose(2, 0, 1)


def one_pass(paths):
    # process_time: the process's CPU clock (user + system, ns resolution), the clock the Rust
    # side reads; os.times() counts in 10 ms ticks, ±4% on a 0.25 s pass.
    c0 = time.process_time()
    t0 = time.perf_counter()
    n = 0
    for k in range(0, len(paths), BATCH):
        n += len(np.stack([load(p) for p in paths[k:k + BATCH]]))
    wall = time.perf_counter() - t0
    return n / (time.process_time() - c0), n / wall


if __name__ == "__main__":
    paths = files(sys.argv[1])
    one_pass(paths)
    cpu, wall = one_pass(paths)
    print(cpu, wall)
