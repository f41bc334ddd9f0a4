"""A training loop whose step takes a set time on the device: what `pipeprof run` costs per step.

Plain PyTorch, nothing of pipeprof in it. Batches come from an in-memory TensorDataset through a
DataLoader (so `pipeprof run`'s hooks see every step: the loader, backward, the optimizer), and
each step applies one Linear layer REPEATS times, so its length is set by REPEATS, not by data:

    python gpu_step.py --calibrate 2 --device cuda          # prints "repeats R" for a ≈2 ms step
    python gpu_step.py --repeats R --steps 300 --device cuda
    pipeprof run --once -- python gpu_step.py --repeats R --steps 300 --device cuda

The same REPEATS given to the plain run and the run under pipeprof make the same work, so their
images/s differ only by what pipeprof costs. `--h2d` instead times one batch of the large CNN's
input (32×3×150×150 f32, 8.6 MB) copied to the device from pageable and from pinned memory:
PyTorch's host→device figures beside pipeprof's own.
"""

import argparse
import statistics
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def make(args, dev):
    torch.manual_seed(0)
    layer = nn.Linear(args.width, args.width).to(dev)
    head = nn.Linear(args.width, 10).to(dev)
    opt = torch.optim.SGD(list(layer.parameters()) + list(head.parameters()), lr=1e-4)
    return layer, head, opt


def step(layer, head, opt, xs, ys, repeats):
    opt.zero_grad()
    h = xs
    for _ in range(repeats):
        h = torch.tanh(layer(h))
    loss = nn.functional.cross_entropy(head(h), ys)
    loss.backward()
    opt.step()
    return loss


def calibrate(args, dev):
    """REPEATS for a step of about --calibrate ms: the median of a few timed steps at 8 repeats."""
    layer, head, opt = make(args, dev)
    xs = torch.rand(args.batch_size, args.width, device=dev)
    ys = torch.randint(0, 10, (args.batch_size,), device=dev)
    probe = 8
    for _ in range(3):
        step(layer, head, opt, xs, ys, probe)
    sync(dev)
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        step(layer, head, opt, xs, ys, probe)
        sync(dev)
        times.append(time.perf_counter() - t0)
    per_repeat = statistics.median(times) * 1e3 / probe
    print(f"repeats {max(1, round(args.calibrate / per_repeat))}", flush=True)


def train(args, dev):
    layer, head, opt = make(args, dev)
    n = args.batch_size * 16
    data = TensorDataset(torch.rand(n, args.width), torch.randint(0, 10, (n,)))
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, drop_last=True)
    steps, images, t0 = 0, 0, None
    while steps < args.steps:
        for xs, ys in loader:
            xs, ys = xs.to(dev), ys.to(dev)
            loss = step(layer, head, opt, xs, ys, args.repeats)
            steps += 1
            if t0 is None:
                sync(dev)
                t0 = time.perf_counter()  # from the end of the first step: start-up left out
            else:
                images += len(ys)
            if steps >= args.steps:
                break
    loss.item()
    took = time.perf_counter() - t0
    rate = images / took if took > 0 else 0.0
    print(f"done: {steps} steps of {args.repeats} repeats, {rate:.1f} images/s after the first step", flush=True)


def h2d(dev):
    batch = torch.rand(32, 3, 150, 150)
    pinned = batch.pin_memory() if dev.type == "cuda" else batch
    for name, src in (("pageable", batch), ("pinned", pinned)):
        times = []
        for _ in range(30):
            sync(dev)
            t0 = time.perf_counter()
            src.to(dev, non_blocking=name == "pinned")
            sync(dev)
            times.append(time.perf_counter() - t0)
        secs = statistics.median(times)
        print(f"h2d {name}: {batch.numel() * 4 / secs / 1e9:.2f} GB/s ({secs * 1e3:.3f} ms)", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--repeats", type=int, default=8)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--calibrate", type=float, default=0.0, help="print REPEATS for a step of this many ms")
    p.add_argument("--h2d", action="store_true", help="time one 8.6 MB batch to the device, pageable and pinned")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    if args.h2d:
        h2d(dev)
    elif args.calibrate > 0:
        calibrate(args, dev)
    else:
        train(args, dev)


if __name__ == "__main__":
    main()
