# corpus: python=torch steps=12
"""A segmentation Dataset of the common public kind: `cv2.imread` for the picture (BGR, then
`cv2.cvtColor` to RGB) and its mask, an albumentations `Compose` (Resize, HorizontalFlip,
RandomBrightnessContrast, Normalize, ToTensorV2) applied to both, a DataLoader, a small fully
convolutional net trained with a per-pixel cross entropy on the CPU. The images and masks are
generated (corpus/_data.py) unless --data names a folder with images/ and masks/. The script
counts its own training steps and images, and prints them last.

    python cv2_albumentations_masks.py --epochs 2
"""

import argparse
import os
import time

import _data
import albumentations as A
import cv2
import torch
from albumentations.pytorch import ToTensorV2
from torch import nn
from torch.utils.data import DataLoader, Dataset


class MasksDataset(Dataset):
    def __init__(self, root, names, transform=None):
        self.images = [os.path.join(root, "images", n + ".jpg") for n in names]
        self.masks = [os.path.join(root, "masks", n + ".png") for n in names]
        self.transform = transform

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        image = cv2.imread(self.images[i])
        image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
        mask = cv2.imread(self.masks[i], cv2.IMREAD_UNCHANGED)
        if self.transform is not None:
            augmented = self.transform(image=image, mask=mask)
            image, mask = augmented["image"], augmented["mask"]
        return image, mask.long()


def net(classes):
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, classes, 1),
    )


def main():
    p = argparse.ArgumentParser(description="cv2 + albumentations segmentation")
    p.add_argument("--data", default=None)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--count", type=int, default=60)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args()
    torch.manual_seed(args.seed)
    cv2.setNumThreads(0)

    root = args.data or _data.segmentation_folder()
    names = sorted(os.path.splitext(n)[0] for n in os.listdir(os.path.join(root, "images")))[: args.count]
    transform = A.Compose(
        [
            A.Resize(args.size, args.size),
            A.HorizontalFlip(p=0.5),
            A.RandomBrightnessContrast(p=0.5),
            A.Normalize(mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25)),
            ToTensorV2(),
        ]
    )
    loader = DataLoader(
        MasksDataset(root, names, transform), batch_size=args.batch_size, shuffle=True, num_workers=args.num_workers
    )
    model = net(len(_data.CLASSES) + 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    train_steps = train_images = 0
    epoch_s = []
    for epoch in range(args.epochs):
        epoch_t0 = time.perf_counter()  # the epoch: its training pass (no eval pass)
        model.train()
        total = 0.0
        for images, masks in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(images), masks)
            loss.backward()
            optimizer.step()
            total += loss.item()
            train_steps += 1
            train_images += len(images)
        epoch_s.append(time.perf_counter() - epoch_t0)
        print(f"epoch {epoch}: loss {total / len(loader):.4f}")
    print(
        f"counted: train_steps={train_steps} train_images={train_images} batch_size={args.batch_size} "
        f"epoch_s={','.join(f'{s:.3f}' for s in epoch_s)}"
    )
    print(f"loss {total / len(loader):.4f} after {args.epochs} epochs")


if __name__ == "__main__":
    main()
