"""Reader throughput, paired in one process: torchvision's ImageFolder on the image folder
against pipeprof.data.PackedImageFolder on the file `pipeprof pack` made of it, the same
transform on both, round after round in a new random order each round (the machine's load
drifts over both alike).

    pipeprof pack DIR data.ppk --size 64
    python python/benches/packed_reader.py DIR data.ppk [--size 64] [--rounds 15] [--per-round 400]

Arms: `imagefolder` (open, decode, Resize((S, S)), ToTensor), `packed` (the same transform on
the packed PIL image), `packed as_tensor` (the CHW uint8 tensor, Resize((S, S)) and
ConvertImageDtype: no PIL at all). Prints each arm's median images/s over the rounds and the
median of each round's ratio to `imagefolder`.
"""

import argparse
import random
import statistics
import time

import torch
from torchvision import datasets, transforms

from pipeprof.data import PackedImageFolder


def main():
    p = argparse.ArgumentParser()
    p.add_argument("folder")
    p.add_argument("packed")
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--per-round", type=int, default=400)
    args = p.parse_args()
    torch.set_num_threads(1)
    s = args.size
    pil = transforms.Compose([transforms.Resize((s, s)), transforms.ToTensor()])
    tensor = transforms.Compose([transforms.Resize((s, s), antialias=True), transforms.ConvertImageDtype(torch.float32)])
    arms = {
        "imagefolder": datasets.ImageFolder(args.folder, transform=pil),
        "packed": PackedImageFolder(args.packed, transform=pil),
        "packed as_tensor": PackedImageFolder(args.packed, transform=tensor, as_tensor=True),
    }
    n = len(arms["imagefolder"])
    assert n == len(arms["packed"]), "the packed file is not of this folder"
    rng = random.Random(0)
    rates = {k: [] for k in arms}
    for _ in range(args.rounds):
        order = list(arms)
        rng.shuffle(order)
        idx = [rng.randrange(n) for _ in range(args.per_round)]
        for k in order:
            ds = arms[k]
            t0 = time.perf_counter()
            for i in idx:
                ds[i]
            rates[k].append(len(idx) / (time.perf_counter() - t0))
    base = rates["imagefolder"]
    for k, r in rates.items():
        ratio = statistics.median(a / b for a, b in zip(r, base))
        q = statistics.quantiles(r, n=4)
        print(f"{k:18} {statistics.median(r):8.0f} images/s (quartiles {q[0]:.0f}–{q[2]:.0f})  ×{ratio:.2f} against imagefolder")


if __name__ == "__main__":
    main()
