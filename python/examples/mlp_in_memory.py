"""The seeds' tiny-model case: an MNIST-sized MLP (784-128-10) on an in-memory TensorDataset.

Plain PyTorch, no pipeprof in it: `pipeprof run -- python mlp_in_memory.py` profiles it as it
is. Random data of MNIST's shape, so it needs no download. On a GPU machine this model trains
slower on the GPU than on the CPU at batch 32: the per-step overhead dominates.
"""

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--samples", type=int, default=8192)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    xs = torch.rand(args.samples, 784)
    ys = torch.randint(0, 10, (args.samples,))
    loader = DataLoader(TensorDataset(xs, ys), batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
    dev = torch.device(args.device)
    net = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10)).to(dev)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    images, t0 = 0, time.perf_counter()
    for epoch in range(args.epochs):
        for x, y in loader:
            x, y = x.to(dev), y.to(dev)
            opt.zero_grad()
            loss = loss_fn(net(x), y)
            loss.backward()
            opt.step()
            images += len(x)
        print(f"epoch {epoch}: loss {loss.item():.4f}")
    dt = time.perf_counter() - t0
    print(f"{images} images in {dt:.2f} s: {images / dt:.0f} images/s")


if __name__ == "__main__":
    main()
