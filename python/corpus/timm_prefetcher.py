# corpus: python=torch steps=24
"""A timm-style training loader: PIL transforms that end in a uint8 array (no ToTensor), a
`fast_collate` into one uint8 batch, a DataLoader with persistent workers, pin_memory and
drop_last, wrapped in a prefetcher that moves each batch to the device one ahead and normalizes
it there (on a CUDA side stream where there is one), as timm's create_loader(use_prefetcher=True)
builds it. The folder is generated (corpus/_data.py) unless --data names one.

    python timm_prefetcher.py -j 4 --epochs 8
"""

import argparse
from contextlib import suppress
from functools import partial

import _data
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

IMAGENET_DEFAULT_MEAN = (0.485, 0.456, 0.406)
IMAGENET_DEFAULT_STD = (0.229, 0.224, 0.225)


class ToNumpy:
    """A PIL image as a uint8 CHW array: normalizing is the prefetcher's, on the device."""

    def __call__(self, pil_img):
        np_img = np.array(pil_img, dtype=np.uint8)
        if np_img.ndim < 3:
            np_img = np.expand_dims(np_img, axis=-1)
        return np.rollaxis(np_img, 2)  # HWC to CHW


def fast_collate(batch):
    """uint8 arrays into one uint8 tensor, without a float copy per sample."""
    batch_size = len(batch)
    targets = torch.tensor([b[1] for b in batch], dtype=torch.int64)
    tensor = torch.zeros((batch_size, *batch[0][0].shape), dtype=torch.uint8)
    for i in range(batch_size):
        tensor[i] += torch.from_numpy(batch[i][0])
    return tensor, targets


class PrefetchLoader:
    def __init__(self, loader, mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD, device=torch.device("cpu")):
        self.loader = loader
        self.device = device
        self.mean = torch.tensor([x * 255 for x in mean], device=device).view(1, 3, 1, 1)
        self.std = torch.tensor([x * 255 for x in std], device=device).view(1, 3, 1, 1)
        self.is_cuda = torch.cuda.is_available() and device.type == "cuda"

    def __iter__(self):
        first = True
        if self.is_cuda:
            stream = torch.cuda.Stream()
            stream_context = partial(torch.cuda.stream, stream=stream)
        else:
            stream = None
            stream_context = suppress
        for next_input, next_target in self.loader:
            with stream_context():
                next_input = next_input.to(device=self.device, non_blocking=True)
                next_target = next_target.to(device=self.device, non_blocking=True)
                next_input = next_input.float().sub_(self.mean).div_(self.std)
            if not first:
                yield input, target  # noqa: F821 (set on the previous turn)
            else:
                first = False
            if stream is not None:
                torch.cuda.current_stream().wait_stream(stream)
            input = next_input
            target = next_target
        yield input, target

    def __len__(self):
        return len(self.loader)

    @property
    def dataset(self):
        return self.loader.dataset


def create_loader(dataset, batch_size, num_workers, device, img_size):
    dataset.transform = transforms.Compose(
        [
            transforms.RandomResizedCrop(img_size, scale=(0.08, 1.0), interpolation=transforms.InterpolationMode.BILINEAR),
            transforms.RandomHorizontalFlip(),
            transforms.ColorJitter(0.4, 0.4, 0.4),
            ToNumpy(),
        ]
    )
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=True,
        num_workers=num_workers,
        collate_fn=fast_collate,
        pin_memory=True,
        drop_last=True,
        persistent_workers=num_workers > 0,
    )
    return PrefetchLoader(loader, device=device)


def main():
    p = argparse.ArgumentParser(description="timm-style training")
    p.add_argument("--data", default=None, help="an ImageFolder (default: generated)")
    p.add_argument("-j", "--workers", type=int, default=4)
    p.add_argument("-b", "--batch-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--img-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--log-interval", type=int, default=5)
    p.add_argument("--limit-batches", type=int, default=0, help="stop each epoch after N batches (0: all)")
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    dataset = datasets.ImageFolder(args.data or str(_data.image_folder()))
    loader = create_loader(dataset, args.batch_size, args.workers, device, args.img_size)
    model = nn.Sequential(
        nn.Conv2d(3, 24, 3, 2, 1),
        nn.BatchNorm2d(24),
        nn.ReLU(inplace=True),
        nn.Conv2d(24, 48, 3, 2, 1),
        nn.BatchNorm2d(48),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(48, len(dataset.classes)),
    ).to(device)
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, nesterov=True)
    for epoch in range(args.epochs):
        model.train()
        last_idx = len(loader) - 1
        losses = []
        for batch_idx, (input, target) in enumerate(loader):
            output = model(input)
            loss = loss_fn(output, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if batch_idx == last_idx or batch_idx % args.log_interval == 0:
                print(f"Train: {epoch} [{batch_idx:>4d}/{len(loader)}]  Loss: {losses[-1]:#.3g} ({np.mean(losses):#.3g})")
            if args.limit_batches and batch_idx + 1 >= args.limit_batches:
                break
    print(f"*** Final train loss: {np.mean(losses):.4f} (epochs {args.epochs})")


if __name__ == "__main__":
    main()
