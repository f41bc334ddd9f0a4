"""A plain torchvision ImageFolder training script, with nothing of pipeprof in it.

    python train_torchvision.py --data ./imgs --workers 2 --epochs 1
    pipeprof run -- python train_torchvision.py --data ./imgs --workers 2

The kind of script people ask "why is my GPU idle?" about: read JPEG/PNG files with Pillow
in DataLoader workers, resize, train a small CNN.
"""

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader
from torchvision import datasets, transforms


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: whole epochs)")
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--persistent", action="store_true")
    p.add_argument("--context", choices=["fork", "spawn", "forkserver"], default=None)
    p.add_argument("--threads", type=int, default=0)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    tf = transforms.Compose(
        [
            transforms.Resize((args.size, args.size)),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
        ]
    )
    ds = datasets.ImageFolder(args.data, transform=tf)
    loader = DataLoader(
        ds,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        persistent_workers=args.persistent and args.workers > 0,
        multiprocessing_context=args.context if args.workers > 0 else None,
    )
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(32 * 16, len(ds.classes)),
    ).to(args.device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    step, images, t0 = 0, 0, None
    for epoch in range(args.epochs):
        for xs, ys in loader:
            if t0 is None:
                t0 = time.perf_counter()  # from the first batch: start-up left out
            else:
                images += len(ys)
            xs, ys = xs.to(args.device), ys.to(args.device)
            opt.zero_grad()
            loss = loss_fn(model(xs), ys)
            loss.backward()
            opt.step()
            step += 1
            if step % 10 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)
            if args.steps and step >= args.steps:
                break
        if args.steps and step >= args.steps:
            break
    took = time.perf_counter() - t0 if t0 is not None else 0.0
    print(f"done: {step} steps, {images / took if took > 0 else 0.0:.1f} images/s after the first batch")


if __name__ == "__main__":
    main()
